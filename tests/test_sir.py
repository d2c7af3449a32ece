"""Score-based iterative reconstruction: schedule, views, convergence with the ground-truth prior, a
tiny Zero123 run and the final prune (CPU). generate() end to end: tests/test_jobs_generate.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from microdreamer.metrics import psnr
from microdreamer.priors import (
    GroundTruthPrior,
    OrbitViews,
    Prior,
    Reference,
    even_orbit_views,
)
from microdreamer.render import render
from microdreamer.sir import SIRConfig, prune_white_floaters, run_sir, splat_view_renderer, t_stop_schedule
from microdreamer.splat import Splat
from microdreamer.train import TrainConfig, random_ball_splat

S = 32  # image side of the CPU tests


def _blobs(n: int = 60, seed: int = 1) -> Splat:
    """A ground-truth object: n opaque coloured Gaussians in a 0.6-wide cube."""
    g = torch.Generator().manual_seed(seed)
    means = (torch.rand(n, 3, generator=g) - 0.5) * 0.6
    quats = torch.tensor([[1.0, 0.0, 0.0, 0.0]]).repeat(n, 1)
    return Splat.from_activated(
        means, torch.full((n, 3), 0.08), quats, torch.full((n,), 0.9), torch.rand(n, 3, generator=g)
    )


def _reference(gt: Splat, size: int = S) -> Reference:
    cams = OrbitViews([0.0], [0.0], [2.0]).cameras(49.1, size, size)
    out = render(gt, cams, backend="torch")
    return Reference(out.rgb[0].permute(2, 0, 1), out.alpha[0].permute(2, 0, 1), 0.0)


def _small_train(**kw) -> TrainConfig:
    base = dict(num_pts=300, backend="torch", densify_start_iter=0, densify_end_iter=30, densify_interval=20,
                position_lr_max_steps=60)  # fmt: skip
    base.update(kw)
    return TrainConfig(**base)


# --------------------------------------------------------------------------------------- schedule, views
def test_t_stop_schedule_is_pure_noise_then_upstreams_t2_on_the_priors_grid():
    """MicroDreamer's t2 / T (the list itself: tests/test_priors_ddim.py): 1, then 0.901 (main.py L112-121:
    ``int(20 * (1 - 0.9))`` is 1) down to 0.201, on the 20-step grid; on a 10-step grid the same t_start,
    t_end land on that grid's timesteps."""
    from microdreamer.priors.ddim import DDIMConfig

    cfg = SIRConfig()
    t = [t_stop_schedule(k, cfg) for k in range(cfg.iterations)]
    assert len(t) == 21 and t[0] == 1.0 and t[1] == 0.901 and t[-1] == 0.201
    assert all(round(x * 1000) % 50 == 1 for x in t[1:]) and t[1:] == sorted(t[1:], reverse=True)
    coarse = [t_stop_schedule(k, cfg, DDIMConfig(num_inference_steps=10)) for k in range(1, cfg.iterations)]
    assert coarse[0] == 0.901 and coarse[-1] == 0.201 and all(round(x * 1000) % 100 == 1 for x in coarse)


@pytest.mark.parametrize("ref_el", [0.0, -40.0, 60.0])
@pytest.mark.parametrize("count", [1, 6, 7])
def test_even_orbit_views(count, ref_el):
    g = torch.Generator().manual_seed(count)
    v = even_orbit_views(count, ref_el, (-30.0, 30.0), 2.0, g)
    assert len(v) == count
    step = 360.0 / count
    assert -180.0 <= float(v.azimuth_deg[0]) < -180.0 + step
    np.testing.assert_allclose(np.diff(v.azimuth_deg.numpy()), step, atol=1e-4)  # float32 angles
    lo = max(min(-30.0, -30.0 - ref_el), -80.0 - ref_el)
    hi = min(max(30.0, 30.0 - ref_el), 80.0 - ref_el)
    off = v.elevation_deg - ref_el
    assert (off >= lo - 1e-4).all() and (off <= hi + 1e-4).all()
    assert (v.elevation_deg.abs() <= 80.0 + 1e-4).all()
    assert torch.equal(v.radius, torch.full((count,), 2.0))


# -------------------------------------------------------------------------------- ground-truth prior
def test_orbit_views_from_cameras_inverts_cameras():
    g = torch.Generator().manual_seed(3)
    views = OrbitViews(-80 + 160 * torch.rand(16, generator=g), -179 + 358 * torch.rand(16, generator=g),
                       1.0 + 2.0 * torch.rand(16, generator=g))  # fmt: skip
    back = OrbitViews.from_cameras(views.cameras(49.1, 32, 32))
    # float32 camera matrices: angles to ~1e-4 degrees, radii to ~1e-6
    np.testing.assert_allclose(back.elevation_deg.numpy(), views.elevation_deg.numpy(), atol=2e-3)
    np.testing.assert_allclose(back.azimuth_deg.numpy(), views.azimuth_deg.numpy(), atol=2e-3)
    np.testing.assert_allclose(back.radius.numpy(), views.radius.numpy(), rtol=1e-5)


def test_sir_with_the_ground_truth_prior_drives_the_splat_to_the_targets():
    """Targets = the true views: SIR is plain multi-view reconstruction and must converge.

    Held-out PSNR of the random initial ball is ~20 dB (mostly white background); after 5 x 10 steps on
    3 views + the reference at 32^2 it is 26.8-27.5 dB (seeds 0-2). Floor: 24.5 dB and a 4 dB rise.
    """
    gt = _blobs()
    truth = splat_view_renderer(gt, size=S, backend="torch")
    cfg = SIRConfig(iterations=5, views=3, init_steps=10, recon_steps=10, image_size=S, white_check_size=S,
                    train=_small_train())  # fmt: skip
    held_out = OrbitViews([10.0, -20.0, 25.0], [45.0, 200.0, 300.0], 2.0)

    def score(splat: Splat) -> float:
        out = render(splat, held_out.cameras(49.1, S, S), backend="torch").rgb
        return psnr(out, truth(held_out).permute(0, 2, 3, 1)).mean().item()

    init = random_ball_splat(300, seed=0)
    before = score(init)
    result = run_sir(GroundTruthPrior(truth), _reference(gt), cfg, "cpu", initial=init)
    after = score(result.splat)
    assert after > 24.5 and after > before + 4.0, (before, after)
    assert [h["t_stop"] for h in result.history][0] == 1.0
    assert result.history[-1]["loss"] < result.history[0]["loss"]
    assert {"diffusion", "reconstruction", "render", "prune"} <= set(result.seconds)


class _Recording(Prior):
    """Wraps a prior and keeps what it was given and what it returned."""

    def __init__(self, inner: Prior) -> None:
        self.inner, self.calls = inner, []

    def set_reference(self, reference, generator=None):
        self.inner.set_reference(reference, generator)

    def ddim_grid(self):
        return self.inner.ddim_grid()

    def refine(self, images, views, t_stop, generator=None):
        out = self.inner.refine(images, views, t_stop, generator)
        self.calls.append((None if images is None else images.shape, len(views), t_stop, out))
        return out

    def stats(self):
        return self.inner.stats()


def test_sir_with_a_tiny_zero123_gives_targets_of_the_right_shape_and_range():
    pytest.importorskip("diffusers", reason="the Zero123 prior needs diffusers")
    from microdreamer.priors.factory import build_random_zero123
    from microdreamer.priors.zero123 import Zero123Config, Zero123Prior

    size = 64
    prior = _Recording(Zero123Prior(build_random_zero123("tiny", seed=0), Zero123Config(image_size=size)))
    cfg = SIRConfig(iterations=2, views=2, init_steps=2, recon_steps=2, image_size=size, white_check_size=size,
                    train=_small_train(num_pts=200))  # fmt: skip
    result = run_sir(prior, _reference(_blobs(), size), cfg, "cpu")
    assert [c[2] for c in prior.calls] == [1.0, 0.901]
    assert prior.calls[0][0] is None and prior.calls[1][0] == (
        2,
        3,
        size,
        size,
    )  # renders of the 2nd iteration
    for _, n, _, out in prior.calls:
        assert n == 2 and out.shape == (2, 3, size, size)
        assert torch.isfinite(out).all() and out.min() >= 0 and out.max() <= 1
    assert result.prior_stats["unet_calls"] == 20 + 8 + 19  # noise: 20; t2 901 <- t1 501: 8 + 19
    for t in result.splat.tensors().values():
        assert torch.isfinite(t).all()


def test_default_sir_makes_upstreams_21_prior_calls_and_352_unet_calls():
    """MicroDreamer's image-to-3D (configs/image_sai.yaml L88-91: total_steps 21, denoise_steps 20; main.py
    L724 ``train(total_steps)``), counted in a tiny CPU run with the default schedule: 21 refinements (the
    first from noise), t2 / T = upstream's t2 list / 1000, 352 UNet calls."""
    pytest.importorskip("diffusers", reason="the Zero123 prior needs diffusers")
    from microdreamer.priors.factory import build_random_zero123
    from microdreamer.priors.zero123 import Zero123Config, Zero123Prior

    size = 64
    prior = _Recording(Zero123Prior(build_random_zero123("tiny", seed=0), Zero123Config(image_size=size)))
    cfg = SIRConfig(views=2, init_steps=1, recon_steps=1, image_size=size, white_check_size=size,
                    white_prune=False, train=_small_train(num_pts=100))  # fmt: skip
    result = run_sir(prior, _reference(_blobs(), size), cfg, "cpu")
    t2 = [901, 851, 801, 751, 751, 701, 651, 651, 601, 551, 501, 501, 451, 401, 401, 351, 301, 301, 251, 201]
    assert len(prior.calls) == 21 and [c[2] for c in prior.calls] == [1.0] + [t / 1000 for t in t2]
    assert result.prior_stats["unet_calls"] == 352


# ---------------------------------------------------------------------------------------- final prune
def test_prune_white_floaters_removes_only_large_visible_over_white_gaussians():
    gt = _blobs(20)
    white = 1.2  # raw colour 0.5 + C0 * sh_dc above 1 in every channel
    quat = torch.tensor([[1.0, 0.0, 0.0, 0.0]])
    extra = Splat(
        means=torch.tensor([[0.0, 0.7, 0.0], [0.0, -0.7, 0.0], [0.7, 0.0, 0.0]]),
        sh_dc=torch.tensor([[white] * 3, [white] * 3, [0.2, 0.9, 0.2]]).sub(0.5).div(0.28209479177387814),
        sh_rest=torch.zeros(3, 0, 3),
        opacity_logits=torch.full((3,), 3.0),
        log_scales=torch.log(torch.tensor([[0.1] * 3, [0.005] * 3, [0.1] * 3])),  # large, small, large
        quats=quat.repeat(3, 1),
    )
    splat = Splat(**{k: torch.cat([getattr(gt, k), getattr(extra, k)]) for k in gt.tensors()})
    cfg = SIRConfig(white_check_size=64)
    kept, n = prune_white_floaters(splat, cfg, backend="torch")
    assert n == 1  # the large white one; the small white one and the large green one stay
    assert len(kept) == len(splat) - 1
    assert not any(torch.allclose(m, torch.tensor([0.0, 0.7, 0.0])) for m in kept.means)
