"""Metrics against hand-computable cases and independent references (skimage SSIM, brute-force NN)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from microdreamer.metrics import (
    chamfer_l1,
    fscore,
    mesh_metrics,
    psnr,
    sample_surface,
    ssim,
    surface_distances,
)


def _images(seed: int, shape=(2, 24, 31, 3)) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    a = torch.rand(shape, generator=g)
    b = (a + 0.1 * torch.randn(shape, generator=g)).clamp(0, 1)
    return a, b


def test_psnr_identical_is_inf_and_ssim_is_one():
    a, _ = _images(0)
    assert torch.isinf(psnr(a, a)).all()
    # SSIM of an image with itself is 1 up to float64 rounding of the ratio of equal terms
    torch.testing.assert_close(ssim(a, a), torch.ones(2), atol=1e-6, rtol=0)


@pytest.mark.parametrize("shift", [0.01, 0.1, 0.25])
def test_psnr_known_constant_shift(shift):
    a = torch.full((3, 8, 9, 3), 0.5)
    b = a + shift
    # MSE = shift^2 exactly -> PSNR = -20 log10(shift); float32 rounding of a + shift gives ~1e-4 dB
    expect = torch.full((3,), -10 * math.log10(shift**2))
    torch.testing.assert_close(psnr(a, b), expect, atol=1e-3, rtol=0)


def test_psnr_mask_uses_only_masked_pixels():
    a = torch.zeros(1, 4, 4, 3)
    b = torch.zeros(1, 4, 4, 3)
    b[0, :2] = 0.1  # error in the top half only
    b[0, 2:] = 0.5
    mask = torch.zeros(1, 4, 4, dtype=torch.bool)
    mask[0, :2] = True
    torch.testing.assert_close(psnr(a, b, mask), torch.tensor([20.0]), atol=1e-4, rtol=0)
    torch.testing.assert_close(psnr(a, b, mask[..., None]), torch.tensor([20.0]), atol=1e-4, rtol=0)


@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("shape", [(24, 31), (11, 11), (64, 40)])
def test_ssim_matches_skimage(seed, shape):
    from skimage.metrics import structural_similarity

    a, b = _images(seed, (2, *shape, 3))
    got = ssim(a, b)
    for i in range(2):
        ref = structural_similarity(
            a[i].double().numpy(),
            b[i].double().numpy(),
            gaussian_weights=True,
            sigma=1.5,
            use_sample_covariance=False,
            data_range=1.0,
            channel_axis=-1,
        )
        # both compute in float64 with the same 11-tap window; ours is returned as float32
        assert abs(float(got[i]) - ref) < 1e-6


def test_ssim_lower_for_noisier_image():
    a, b = _images(3)
    c = (a + 0.3 * (b - a)).clamp(0, 1)  # closer to a than b is
    assert (ssim(a, c) > ssim(a, b)).all()


# --------------------------------------------------------------------------------------------
# meshes


def _sphere(radius: float = 1.0, subdivisions: int = 5):
    import trimesh

    s = trimesh.creation.icosphere(subdivisions=subdivisions, radius=radius)
    return np.asarray(s.vertices), np.asarray(s.faces)


def test_sample_surface_is_area_weighted_and_on_surface():
    # two triangles in the z=0 plane with areas 0.5 and 1.5 (ratio 1:3)
    v = np.array([[0, 0, 0], [1, 0, 0], [0, 1, 0], [2, 0, 0], [5, 0, 0], [2, 1, 0]], dtype=np.float64)
    f = np.array([[0, 1, 2], [3, 4, 5]])
    p = sample_surface(v, f, 40_000, seed=0)
    assert p.shape == (40_000, 3)
    np.testing.assert_array_equal(p[:, 2], 0.0)
    in_first = (p[:, 0] >= 0) & (p[:, 1] >= 0) & (p[:, 0] + p[:, 1] <= 1 + 1e-12)
    in_second = (p[:, 0] >= 2) & (p[:, 1] >= 0) & ((p[:, 0] - 2) / 3 + p[:, 1] <= 1 + 1e-12)
    assert (in_first | in_second).all()
    # expected fraction 0.25; binomial std = sqrt(0.25 * 0.75 / 40000) = 0.0022 -> 4.5 sigma
    assert abs(in_first.mean() - 0.25) < 0.01
    # uniform inside a triangle: the mean is the centroid (std of the mean ~ 0.2 / sqrt(10000))
    np.testing.assert_allclose(p[in_first, :2].mean(axis=0), [1 / 3, 1 / 3], atol=0.01)
    # same seed, same points
    np.testing.assert_array_equal(p, sample_surface(v, f, 40_000, seed=0))


def test_surface_distances_match_brute_force():
    rng = np.random.default_rng(4)
    a = (rng.normal(size=(30, 3)), rng.integers(0, 30, size=(40, 3)))
    b = (rng.normal(size=(25, 3)) + 0.3, rng.integers(0, 25, size=(20, 3)))
    d_ab, d_ba = surface_distances(a, b, n=700, seed=5)
    pa = sample_surface(*a, 700, seed=5)
    pb = sample_surface(*b, 700, seed=6)
    dist = np.linalg.norm(pa[:, None] - pb[None], axis=-1)  # all pairs
    np.testing.assert_allclose(d_ab, dist.min(axis=1), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(d_ba, dist.min(axis=0), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(chamfer_l1(a, b, n=700, seed=5), 0.5 * (d_ab.mean() + d_ba.mean()))


def test_sphere_vs_larger_sphere():
    small, big = _sphere(1.0), _sphere(1.1)
    cd = chamfer_l1(small, big, n=100_000)
    # true surface distance is 0.1 everywhere (the icosphere's facets sit at most 3e-4 inside the
    # sphere at subdivision 5, scaled 1.1x on the big one: +-3e-5); the sampling spacing
    # sqrt(4 pi / 1e5) = 0.011 adds at most ~0.5 * 0.011^2 / 0.1 ~ 6e-4 to each nearest distance
    assert abs(cd - 0.1) < 2e-3, cd
    assert fscore(small, big, tau=0.05, n=20_000).fscore == 0.0
    f = fscore(small, big, tau=0.15, n=20_000)
    assert (f.precision, f.recall, f.fscore) == (1.0, 1.0, 1.0)
    # identical meshes (independent samples): distance of the order of the spacing sqrt(4 pi / 2e4)
    assert chamfer_l1(small, small, n=20_000) < 0.025
    m = mesh_metrics(small, big, n=20_000, tau_fractions=(0.01, 0.1))
    assert m["fscore@0.01"] == 0.0 and m["fscore@0.1"] == 1.0  # diag = 2.2 * sqrt(3) ~ 3.8
    assert abs(m["gt_bbox_diagonal"] - 2.2 * math.sqrt(3)) < 0.01
    assert abs(m["chamfer_l1_rel"] - m["chamfer_l1"] / m["gt_bbox_diagonal"]) < 1e-12


def test_mesh_like_inputs_accepted():
    import trimesh

    v, f = _sphere(1.0, 2)
    tm = trimesh.Trimesh(v, f, process=False)
    as_tensors = (torch.as_tensor(v), torch.as_tensor(f))
    assert chamfer_l1(tm, as_tensors, n=1000) == chamfer_l1((v, f), (v, f), n=1000)


def test_sample_surface_rejects_degenerate_mesh():
    v = np.zeros((3, 3))
    with pytest.raises(ValueError, match="positive area"):
        sample_surface(v, np.array([[0, 1, 2]]), 10)
