"""Score-based iterative reconstruction: schedule, views, convergence with the ground-truth prior, a
tiny Zero123 run, the final prune, and generate() end to end on a tiny random model (CPU)."""

from __future__ import annotations

import json
from dataclasses import replace

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
def test_t_stop_schedule_is_pure_noise_then_linear_from_t_start_to_t_end():
    cfg = SIRConfig()
    t = [t_stop_schedule(k, cfg) for k in range(cfg.iterations)]
    assert t[0] == 1.0 and t[1] == pytest.approx(0.9) and t[-1] == pytest.approx(0.2)
    steps = np.diff(t[1:])
    np.testing.assert_allclose(steps, -0.7 / 18, rtol=1e-12)  # linear over iterations 1..19


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

    def set_reference(self, reference):
        self.inner.set_reference(reference)

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
    assert [c[2] for c in prior.calls] == [1.0, 0.9]
    assert prior.calls[0][0] is None and prior.calls[1][0] == (
        2,
        3,
        size,
        size,
    )  # renders of the 2nd iteration
    for _, n, _, out in prior.calls:
        assert n == 2 and out.shape == (2, 3, size, size)
        assert torch.isfinite(out).all() and out.min() >= 0 and out.max() <= 1
    assert result.prior_stats["unet_calls"] == 20 + 7 + 18  # noise: 20; t2 851 <- t1 501: 7 + 18
    for t in result.splat.tensors().values():
        assert torch.isfinite(t).all()


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


# ------------------------------------------------------------------------------------ generate (tiny)
def _disc_image(path) -> None:
    """An RGBA input made here: an orange disc with soft edges, off-centre."""
    from PIL import Image

    yy, xx = np.mgrid[0:96, 0:128]
    a = np.clip(20.0 - np.hypot(yy - 40, xx - 50), 0, 1)
    img = np.zeros((96, 128, 4), np.uint8)
    img[..., 0], img[..., 1], img[..., 2], img[..., 3] = 230, 120, 30, (a * 255).astype(np.uint8)
    Image.fromarray(img, "RGBA").save(path)


def _small_generate_config():
    """generate's settings shrunk for the CPU: 64^2, 2 iterations of 2 views, a 32^3 field, 32^2 texture."""
    from microdreamer.data.image import ImageConfig
    from microdreamer.field import FieldConfig
    from microdreamer.jobs.generate import GenerateConfig
    from microdreamer.priors.zero123 import Zero123Config

    size = 64
    cfg = GenerateConfig(
        image=ImageConfig(size=size),
        prior=Zero123Config(image_size=size),
        sir=SIRConfig(
            iterations=2,
            views=2,
            init_steps=3,
            recon_steps=3,
            image_size=size,
            white_check_size=size,
            train=_small_train(num_pts=300, densify_end_iter=0),
        ),  # fmt: skip
        views_size=32,
    )
    tex = cfg.export.texture  # the default textured export, small
    tex = replace(tex, size=32, bake=replace(tex.bake, views=replace(tex.bake.views, size=32)))
    return replace(cfg, export=replace(cfg.export, field=FieldConfig(resolution=32), texture=tex))


def test_generate_end_to_end_with_tiny_random_weights(tmp_path):
    pytest.importorskip("diffusers", reason="generate needs diffusers")
    from PIL import Image

    from microdreamer.jobs.generate import generate
    from microdreamer.splat import read_ply

    _disc_image(tmp_path / "in.png")
    cfg = _small_generate_config()
    out = tmp_path / "out"
    res = generate(tmp_path / "in.png", out, cfg, random_weights="tiny", device="cpu")
    assert sorted(p.name for p in out.iterdir()) == [
        "input_rgba.png", "mesh.glb", "splat.ply", "timings.json", "views.png"
    ]  # fmt: skip
    timings = json.loads((out / "timings.json").read_text())
    assert set(timings["stages"]) == {"diffusion", "reconstruction", "mesh", "other"}
    assert set(timings["background_seconds"]) == {"export_splat", "views_png"}  # written in a thread
    assert timings["texture"]["mode"] == "bake" and timings["texture"]["size"] == 32
    assert all(v >= 0 for v in timings["stages"].values())
    assert timings["random_weights"] == "tiny" and timings["mask_method"] == "alpha"
    assert timings["prior_stats"]["unet_calls"] == 20 + 25
    # the command line's cost model counts the same calls (its time-left estimate and CPU note use it)
    from microdreamer.cli import _sir_weights

    weights, guided, uncond = _sir_weights(cfg)
    assert (guided, uncond) == (20 + 18, 7) and len(weights) == 2
    assert len(read_ply(out / "splat.ply")) == res["num_gaussians"] > 0
    assert Image.open(out / "views.png").size == (4 * 32, 2 * 32)  # 8 azimuths, 4 x 2
    assert res["mesh_faces"] > 0
    # the prepared input beside the outputs: 64^2 RGBA, its alpha the mask the model saw
    rgba = np.asarray(Image.open(out / "input_rgba.png"))
    assert rgba.shape == (64, 64, 4) and timings["input_rgba"] == "input_rgba.png"
    assert rgba[..., 3].max() == 255 and rgba[0, 0, 3] == 0


def test_generate_command_reports_progress_and_keeps_stderr_quiet(tmp_path, capsys, caplog):
    """``microdreamer generate`` off a terminal (captured stderr): log lines per SIR iteration with the
    time left, the mask method, the mesh and texture stages; the random-weights warning once; none of
    the libraries' notices (diffusers' empty float32 list, transformers' torchvision fallback)."""
    pytest.importorskip("diffusers", reason="generate needs diffusers")
    import yaml

    from microdreamer.cli import main
    from microdreamer.config import to_dict

    _disc_image(tmp_path / "in.png")
    (tmp_path / "small.yaml").write_text(yaml.safe_dump(to_dict(_small_generate_config())))
    argv = ["generate", str(tmp_path / "in.png"), "-o", str(tmp_path / "out"), "--random-weights", "tiny",
            "--config", str(tmp_path / "small.yaml"), "--device", "cpu"]  # fmt: skip
    assert main(argv) == 0
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert "SIR iterations: started" in err
    assert any(line.startswith("SIR iterations: 1/2 (50%) after") and "left" in line for line in lines), err
    assert any(line.startswith("SIR iterations: 2/2 (100%) after") for line in lines), err
    assert "input: the object's mask from the image's alpha channel" in err
    assert "UV unwrap" in err and "baking from" in err and "filling" in err and "writing" in err
    # the random-weights warning once: the job's log record (pytest's log capture holds it here; the
    # command line's handler prints it), no second copy printed by the command line
    assert sum("RANDOM WEIGHTS" in r.getMessage() for r in caplog.records) == 1
    assert "RANDOM WEIGHTS" not in err and "random weights" not in err.lower(), err
    assert "kept in float32" not in err and "torchvision" not in err, err
    assert "note: generate on the CPU" not in err  # tiny weights: no slow-CPU estimate


def test_generate_texture_default_is_a_capped_512_bake():
    from microdreamer.jobs.generate import GenerateConfig

    tex = GenerateConfig().export.texture
    assert (tex.mode, tex.size, tex.max_faces, tex.chart_iterations) == ("bake", 512, 10_000, 0)


def test_generate_on_the_cpu_with_full_weights_says_how_long():
    pytest.importorskip("diffusers", reason="the DDIM grid comes from diffusers")
    from microdreamer.cli import _cpu_estimate
    from microdreamer.jobs.generate import GenerateConfig

    note = _cpu_estimate(GenerateConfig(), None)  # real (full-size) weights
    assert note.startswith("note: generate on the CPU") and "237 guided and 83 unconditional" in note
    assert "min" in note and note == _cpu_estimate(GenerateConfig(), "full")
    assert _cpu_estimate(GenerateConfig(), "tiny") is None
