"""The forward-only C++ CPU rasteriser (render backend "cpp") against the PyTorch rasteriser (its reference).

Both run float32 with the same rules and the same projection, colours and depth order (the cpp backend
takes those from PyTorch), so they differ only by float32 rounding: the exponent's terms and the
per-pixel sums are added in another order, and the exponential is another ~1-ulp implementation.
Tolerance on rgb and alpha: 1e-5 absolute. Each output is a sum of at most a few hundred terms
``w_i c_i`` with ``sum w_i <= 1`` and ``|c_i| <= ~3``; a 1-ulp difference in an exponent ``|e| <= 6``
changes an alpha by ~5e-7 relative, and the running transmittance and sums add ~1e-7 per term, so
the expected worst case is a few 1e-6 (measured: at most 1.3e-6 on these inputs). A rule applied
differently (a skipped Gaussian, an early or late stop, a wrong order) changes a pixel by at least
~1e-4 (the stop) and typically 1/255 or more, far above the tolerance. (A value that lands within
rounding of a threshold could flip a decision legitimately; none does on these seeds.) Depth is the
ED sum divided by alpha: compared with 1e-5 times the largest depth.
"""

from __future__ import annotations

import pytest
import torch

from microdreamer.cameras import orbit_cameras
from microdreamer.kernels import cpu
from microdreamer.render import render
from microdreamer.render.gaussians import resolve_backend
from microdreamer.splat import Splat
from microdreamer.synthetic import near_far_cameras, random_sh_splat

pytestmark = pytest.mark.skipif(
    not cpu.available(), reason="no C++ compiler: the cpp backend cannot be built"
)

ATOL = 1e-5  # rgb and alpha (see the module docstring)
DEPTH_RTOL = 1e-5  # depth, relative to the largest depth in the images


def assert_same_render(ref, out) -> None:
    assert out.rgb.shape == ref.rgb.shape and out.alpha.shape == ref.alpha.shape
    torch.testing.assert_close(out.rgb, ref.rgb, atol=ATOL, rtol=0)
    torch.testing.assert_close(out.alpha, ref.alpha, atol=ATOL, rtol=0)
    assert (out.depth is None) == (ref.depth is None)
    if ref.depth is not None:
        scale = max(1.0, float(ref.depth.abs().max()))
        torch.testing.assert_close(out.depth, ref.depth, atol=DEPTH_RTOL * scale, rtol=0)
    assert torch.equal(out.radii, ref.radii)


def render_both(splat, cams, tile_size=None, **kw):
    with torch.no_grad():
        ref = render(splat, cams, backend="torch", **kw)
        out = render(splat, cams, backend="cpp", tile_size=tile_size, **kw)
    return ref, out


def opaque_stack(n: int = 12) -> Splat:
    """N large, nearly opaque Gaussians stacked along the view axis: T falls below 1e-4 (the stop) and
    alphas hit the 0.999 clamp."""
    z = torch.linspace(-0.4, 0.4, n)
    means = torch.stack([0.02 * torch.sin(3 * z), 0.02 * torch.cos(5 * z), z], -1)
    op = torch.full((n,), 0.9995)
    op[::3] = 0.97
    colors = torch.rand(n, 3, generator=torch.Generator().manual_seed(1))
    quats = torch.tensor([[1.0, 0.0, 0.0, 0.0]]).expand(n, 4)
    return Splat.from_activated(means, torch.full((n, 3), 0.12), quats, op, colors)


# ------------------------------------------------------------------ forward against the torch backend
@pytest.mark.parametrize(
    "n, sh_degree, size",
    [
        (0, 0, (16, 16)),
        (1, 0, (16, 16)),
        (7, 3, (37, 29)),
        (300, 0, (24, 40)),
        (300, 3, (33, 17)),
        (3000, 0, (64, 48)),
        (3000, 3, (61, 47)),
    ],
)
@pytest.mark.parametrize("depth", [True, False])
def test_cpp_matches_torch(n, sh_degree, size, depth):
    # near_far_cameras: four cameras, the last at 0.45 from the origin, inside the splat's cube, so
    # Gaussians lie behind it, beside it (off screen) and at its near plane
    splat = random_sh_splat(n, seed=n + 11 * sh_degree, sh_degree=sh_degree)
    cams = near_far_cameras(*size, n=4)
    bg = torch.tensor([[0.2, 0.5, 0.9], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [0.3, 0.0, 0.7]])
    ref, out = render_both(splat, cams, background=bg, depth=depth)
    assert_same_render(ref, out)


@pytest.mark.parametrize("tile_size", [1, 5, 8, 13, 16, 32])
def test_cpp_tile_sizes_match_torch(tile_size):
    # the image does not depend on the tile size; odd sizes leave partial tiles on both edges
    splat = random_sh_splat(500, seed=5, sh_degree=1, log_scale=-2.0)
    cams = near_far_cameras(45, 35, n=3)
    ref, out = render_both(splat, cams, tile_size=tile_size, background=(1.0, 1.0, 1.0))
    assert_same_render(ref, out)


def test_cpp_spread_out_splat_with_many_culled():
    # spread 3 around cameras at distance ~2: many Gaussians behind the cameras or off screen
    splat = random_sh_splat(2000, seed=9, sh_degree=0, spread=3.0, log_scale=-2.0)
    cams = near_far_cameras(50, 40, n=4)
    ref, out = render_both(splat, cams, background=(0.1, 0.2, 0.3))
    assert (ref.radii == 0).any() and (ref.radii > 0).any()
    assert_same_render(ref, out)


def test_cpp_transmittance_stop_and_alpha_clamp():
    splat = opaque_stack()
    cams = orbit_cameras([0.0, 0.0, 30.0], [0.0, 180.0, 45.0], radius=2.0, width=21, height=19)
    ref, out = render_both(splat, cams, background=(0.0, 1.0, 0.0))
    assert (1 - ref.alpha).min() < 1e-3  # the stop really fires
    assert_same_render(ref, out)


def test_cpp_real_image_size_with_threads():
    # bake-like: 512^2, several cameras split over threads and row bands
    splat = random_sh_splat(3000, seed=2, sh_degree=0, log_scale=-3.0)
    cams = orbit_cameras([-20.0, 0.0, 20.0], [0.0, 120.0, 240.0], radius=2.0, width=512, height=512)
    ref, out = render_both(splat, cams, background=(1.0, 1.0, 1.0), depth=False)
    assert_same_render(ref, out)


# ------------------------------------------------------------------ backend choice
def test_auto_picks_cpp_without_gradients_and_torch_with_them():
    cpu_dev = torch.device("cpu")
    assert resolve_backend("auto", cpu_dev) == "torch"  # default: the renders need gradients
    expected = "cpp" if cpu.usable() else "torch"
    assert resolve_backend("auto", cpu_dev, needs_grad=False) == expected
    splat = random_sh_splat(40, seed=1)
    for t in splat.tensors().values():
        t.requires_grad_(True)
    cams = near_far_cameras(20, 16, n=2)
    out = render(splat, cams, backend="auto")  # grad mode on, parameters require grad: torch
    out.rgb.sum().backward()
    assert splat.means.grad is not None and splat.means.grad.abs().sum() > 0
    with torch.no_grad():
        ref = render(splat, cams, backend="torch")
        auto = render(splat, cams, backend="auto")
    assert_same_render(ref, auto)


def test_cpp_refuses_gradients_float64_and_other_devices():
    splat = random_sh_splat(10, seed=4)
    cams = near_far_cameras(16, 16, n=1)
    splat.means.requires_grad_(True)
    with pytest.raises(ValueError, match="forward only"):
        render(splat, cams, backend="cpp")
    with torch.no_grad():  # grad mode off: fine
        render(splat, cams, backend="cpp")
    with pytest.raises(ValueError, match="float32"), torch.no_grad():
        render(random_sh_splat(10, seed=4, dtype=torch.float64), cams, backend="cpp")
    with torch.no_grad():  # auto renders a float64 splat with torch
        out = render(random_sh_splat(10, seed=4, dtype=torch.float64), cams, backend="auto")
    assert out.rgb.dtype == torch.float64
    with pytest.raises(ValueError, match="CPU"):
        resolve_backend("cpp", torch.device("cuda"), needs_grad=False)


def test_rasterize_checks_its_inputs():
    c, n = 2, 5
    args = dict(
        means2d=torch.zeros(c, n, 2),
        conics=torch.zeros(c, n, 3),
        radii=torch.zeros(c, n, 2, dtype=torch.int32),
        log_opacities=torch.zeros(n),
        order=torch.arange(n).repeat(c, 1),
        feats=torch.zeros(n, 3),
        width=8,
        height=8,
    )
    feats, alpha = cpu.rasterize(**args)
    assert feats.shape == (c, 8, 8, 3) and alpha.shape == (c, 8, 8, 1) and alpha.abs().max() == 0
    with pytest.raises(ValueError, match="float32"):
        cpu.rasterize(**{**args, "conics": torch.zeros(c, n, 3, dtype=torch.float64)})
    with pytest.raises(ValueError, match="shape"):
        cpu.rasterize(**{**args, "radii": torch.zeros(c, n, 3, dtype=torch.int32)})
    with pytest.raises(ValueError, match="contiguous"):
        cpu.rasterize(**{**args, "means2d": torch.zeros(c, 2, n).transpose(1, 2)})
    with pytest.raises(ValueError, match="order"):
        cpu.rasterize(**{**args, "order": torch.full((c, n), n)})
    with pytest.raises(ValueError, match="tile_size"):
        cpu.rasterize(**args, tile_size=33)


@pytest.mark.parametrize("workers", [2, 3, 8])
def test_rasterize_parts_on_threads_match_one_thread(workers):
    # cameras and bands of tile rows on threads: every tile's list and sums are the same, bit for bit
    from microdreamer.render import _torch_raster as tr

    splat = random_sh_splat(800, seed=6, sh_degree=0, log_scale=-2.0)
    cams = near_far_cameras(70, 53, n=2)
    with torch.no_grad():
        op = splat.opacities()
        proj = tr.project(splat.means, splat.covariances(), op, cams.viewmats, cams.Ks, 70, 53)
        order = torch.sort(proj.depths, dim=1, stable=True).indices
        args = (proj.means2d, proj.conics, proj.radii, torch.log(op), order, splat.colors(), 70, 53)
        one = cpu.rasterize(*args, workers=1)
        many = cpu.rasterize(*args, workers=workers)
    assert torch.equal(one[0], many[0]) and torch.equal(one[1], many[1])
