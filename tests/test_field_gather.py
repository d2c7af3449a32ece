"""The exact field of a scene's tile (microdreamer.field.gather): the PyTorch reference against the C++
kernel on the CPU, the CUDA gather against the reference on a GPU, and the order each sums in."""

from __future__ import annotations

import pytest
import torch

from microdreamer.field.gather import brick_lists, field_gather, field_gather_channels, field_gather_reference


def gaussians(n: int, r: int, seed: int, reach: float = 4.0):
    """N seeded Gaussians in voxel units over an R^3 grid (centres partly outside it), boxes of
    ``reach`` voxels around the centres: (means, transforms, opacities, box, axis)."""
    g = torch.Generator().manual_seed(seed)
    means = torch.rand(n, 3, generator=g, dtype=torch.float64) * (r + 2) - 1
    transforms = torch.randn(n, 3, 3, generator=g, dtype=torch.float64) * 0.5
    opacities = torch.rand(n, generator=g)
    box = torch.stack([torch.ceil(means - reach).long(), torch.floor(means + reach).long()], -1)
    return means, transforms, opacities, box, torch.arange(r, dtype=torch.float64)


#: the C++ kernel's exp is the C library's expf, the reference's the float64 exp rounded once: a term may
#: differ by an ulp, a voxel's sum (opacities <= 1, tens of terms) by a few float32 ulps of its magnitude
ATOL = 2e-6


@pytest.mark.parametrize(("n", "r"), [(0, 9), (1, 1), (1, 9), (37, 13), (300, 21), (257, 33)])
def test_reference_matches_the_cpp_kernel(n, r):
    means, transforms, opacities, box, axis = gaussians(n, r, seed=n + r)
    cpp = field_gather(means, transforms, opacities, box, axis, 9.0, torch.zeros(r, r, r), backend="cpp")
    ref = field_gather_reference(means, transforms, opacities, box, axis, 9.0, torch.zeros(r, r, r))
    assert torch.allclose(ref, cpp, rtol=4e-7, atol=ATOL)
    assert torch.equal(ref > 0, cpp > 0)  # the same terms pass the cutoff (q is the same float64 number)


@pytest.mark.parametrize(
    ("n", "r", "c"), [(0, 9, 4), (1, 1, 4), (1, 9, 1), (37, 13, 3), (300, 21, 4), (257, 33, 2)]
)
def test_channels_are_one_gather_a_weight(n, r, c):
    """C weights a Gaussian in one pass (the colour field's channels and weight): each grid is, to the
    bit, the C++ kernel's gather with that column as the opacities, added to what ``out`` held; the
    reference backend's channels match them within the kernels' tolerance."""
    means, transforms, _, box, axis = gaussians(n, r, seed=n + r + c)
    weights = torch.rand(n, c, generator=torch.Generator().manual_seed(7))
    base = torch.rand(c, r, r, r, generator=torch.Generator().manual_seed(8))
    together = field_gather_channels(means, transforms, weights, box, axis, 9.0, base.clone(), backend="cpp")
    ref = field_gather_channels(means, transforms, weights, box, axis, 9.0, base.clone(), backend="torch")
    for k in range(c):
        alone = field_gather(means, transforms, weights[:, k].contiguous(), box, axis, 9.0, base[k].clone(),
                             backend="cpp")  # fmt: skip
        assert torch.equal(together[k], alone)
        assert torch.allclose(ref[k], alone, rtol=4e-7, atol=ATOL)
    with pytest.raises(ValueError, match=r"weights must be \[N, C\] and out \[C, R, R, R\]"):
        field_gather_channels(means, transforms, weights, box, axis, 9.0, torch.zeros(c + 1, r, r, r))


def test_reference_adds_into_out_in_chunks():
    """``out`` is added to, and chunks of Gaussians (max_pairs) change no bit: each voxel's terms stay in
    Gaussian order."""
    means, transforms, opacities, box, axis = gaussians(200, 17, seed=3)
    base = torch.rand(17, 17, 17, generator=torch.Generator().manual_seed(1))
    whole = field_gather_reference(means, transforms, opacities, box, axis, 9.0, base.clone())
    small = field_gather_reference(means, transforms, opacities, box, axis, 9.0, base.clone(), max_pairs=97)
    assert torch.equal(whole, small)
    assert bool((whole >= base).all()) and bool((whole > base).any())


def test_brick_lists_hold_every_touching_gaussian_in_order():
    means, transforms, opacities, box, axis = gaussians(120, 21, seed=5)
    start, order = brick_lists(box, 21)
    b = 3  # ceil(21 / 8)
    assert start.shape == (b**3 + 1,) and int(start[-1]) == order.numel()
    lo, hi = box[..., 0].clamp_min(0), box[..., 1].clamp_max(20)
    for t in range(b**3):
        brick = torch.tensor([t // (b * b), (t // b) % b, t % b])
        touch = ((lo <= brick * 8 + 7) & (hi >= brick * 8) & (hi >= lo)).all(-1)
        assert torch.equal(order[start[t] : start[t + 1]].long(), torch.nonzero(touch).flatten())


def test_unknown_backend_is_refused():
    means, transforms, opacities, box, axis = gaussians(3, 5, seed=0)
    with pytest.raises(ValueError, match="unknown field backend"):
        field_gather(means, transforms, opacities, box, axis, 9.0, torch.zeros(5, 5, 5), backend="metal")


@pytest.mark.cuda
@pytest.mark.parametrize(("n", "r"), [(0, 9), (1, 1), (1, 9), (37, 13), (300, 21), (257, 33), (3000, 65)])
def test_cuda_gather_matches_the_reference(n, r):
    means, transforms, opacities, box, axis = gaussians(n, r, seed=n + r)
    ref = field_gather_reference(means, transforms, opacities, box, axis, 9.0, torch.zeros(r, r, r))
    cpp = field_gather(means, transforms, opacities, box, axis, 9.0, torch.zeros(r, r, r), backend="cpp")
    cu = [t.cuda() for t in (means, transforms, opacities, box, axis)]
    out = field_gather(*cu, 9.0, torch.zeros(r, r, r, device="cuda"), backend="cuda").cpu()
    again = field_gather(*cu, 9.0, torch.zeros(r, r, r, device="cuda"), backend="cuda").cpu()
    assert torch.equal(out, again)  # a gather in list order: no atomics, the same bits every run
    # the same q and the same exponential (float64 rounded once), summed in the same order: only the GPU's
    # float64 exp (< 1 ulp of float64) could round a term differently, rarely
    assert torch.allclose(out, ref, rtol=0, atol=1e-7)
    assert torch.allclose(out, cpp, rtol=4e-7, atol=ATOL)
