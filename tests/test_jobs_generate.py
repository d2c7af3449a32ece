"""``microdreamer generate`` (jobs/generate.py) and its stage 2 (texture/refine.py ``refine_with_prior``):
upstream's defaults pinned, stage 2 lowering the texture's error to the prior's refined images, the input
view's anchor, generate end to end with and without stage 2 on a tiny random model, ``--no-refine``."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import torch

from microdreamer.config import (
    ExportConfig,
    FieldConfig,
    GenerateConfig,
    ImageConfig,
    ReconstructJobConfig,
    SIRConfig,
    Stage2Config,
    TrainConfig,
    Zero123Config,
)
from microdreamer.mesh import Mesh
from microdreamer.priors import GroundTruthPrior, OrbitViews, Prior, Reference
from microdreamer.synthetic import position_colored_sphere

pytest.importorskip("xatlas", reason="the texture stage needs xatlas")

S = 64  # the tiny model's image side


# --------------------------------------------------------------------------------------------- defaults
def test_generate_meshes_at_upstreams_iso_level():
    """image_sai.yaml's density_thresh 0.2; mesh and reconstruct share one setting, the level chosen from
    the splat ("auto", DreamGaussian's 1.0 in upstream mode)."""
    assert GenerateConfig().export.mesh.threshold == 0.2
    assert ReconstructJobConfig().export.mesh.threshold == "auto"
    assert ExportConfig().mesh.threshold == "auto"


def test_generate_texture_default_is_upstreams_1024_bake_capped_at_50k_faces():
    tex = GenerateConfig().export.texture
    assert (tex.mode, tex.size, tex.max_faces, tex.chart_iterations) == ("bake", 1024, 50_000, 0)


def test_stage2_is_on_by_default_with_upstreams_main2_settings():
    s2 = GenerateConfig().refine
    assert s2.enabled and s2.iterations == 1  # iters_refine
    assert (s2.views, s2.size, s2.elevation_deg) == (8, 512, 0.0)  # batch_size, render_resolution, ver
    assert (s2.strength, s2.ddim_steps, s2.guidance_scale, s2.eta) == (0.8, 50, 2.0, 0.0)
    assert (s2.steps, s2.lr, s2.lambda_views, s2.lambda_ref, s2.ref_min_cos) == (30, 0.2, 1.0, 1.0, 0.5)
    rc = s2.texture_refine(seed=4)
    assert (rc.steps, rc.lr, rc.views, rc.batch, rc.size, rc.seed) == (30, 0.2, 8, 8, 512, 4)
    assert (rc.cache_targets, rc.parametrization, rc.normalize) == (True, "logit", "image")


def test_stage2_config_rejects_bad_values():
    from microdreamer.errors import ConfigError

    for bad in ({"strength": 1.5}, {"views": 0}, {"lr": 0.0}, {"elevation_deg": 95.0}, {"ddim_steps": 0}):
        with pytest.raises(ConfigError):
            Stage2Config(**bad)


# ----------------------------------------------------------------------------------------- stage 2
def _textured_sphere(texture_size: int = 64, grey: int = 128) -> Mesh:
    from microdreamer.texture import unwrap

    gt = position_colored_sphere(3)
    layout = unwrap(Mesh(gt.vertices, gt.faces), max_faces=None, texture_size=texture_size)
    return layout.with_texture(np.full((texture_size, texture_size, 3), grey, np.uint8))


class _Recording(Prior):
    """Delegates to a prior and keeps every stage-2 call's views and refined images."""

    def __init__(self, prior: Prior) -> None:
        self.prior, self.calls = prior, []
        self.device = getattr(prior, "device", torch.device("cpu"))

    def refine(self, images, views, t_stop, generator=None):
        return self.prior.refine(images, views, t_stop, generator)

    def strength_refine(self, images, views, strength=0.8, generator=None, **settings):
        out = self.prior.strength_refine(images, views, strength, generator, **settings)
        self.calls.append((views, images.clone(), out.clone()))
        return out


@pytest.fixture(scope="module")
def tiny_prior():
    pytest.importorskip("diffusers", reason="the Zero123 prior needs diffusers")
    from microdreamer.priors.factory import build_random_zero123
    from microdreamer.priors.zero123 import Zero123Prior

    prior = Zero123Prior(build_random_zero123("tiny", seed=3), Zero123Config(image_size=S))
    g = torch.Generator().manual_seed(0)
    prior.set_reference(Reference(torch.rand(3, S, S, generator=g), torch.ones(1, S, S)), g)  # seeded latent
    return prior


def _mse_to(mesh: Mesh, views: OrbitViews, targets: torch.Tensor) -> float:
    """MSE of ``mesh``'s renders from ``views`` to ``targets`` [C, 3, H, W] on the covered pixels."""
    from microdreamer.render.mesh import render_mesh

    H, W = targets.shape[-2:]
    out = render_mesh(mesh, views.cameras(49.1, W, H))
    err = ((out.rgb - targets.permute(0, 2, 3, 1)) ** 2).sum(-1, keepdim=True) * out.alpha
    return float(err.sum() / (3 * out.alpha.sum()))


@pytest.mark.parametrize("lambda_ref", [0.0, 1.0])
def test_stage2_lowers_the_textures_mse_to_the_priors_refined_images(tiny_prior, lambda_ref):
    """One iteration: the prior refines the 8 renders once (10 UNet calls of batch 2 x 8), 30 Adam steps
    later the texture is closer to those images. With the input view's anchor (lambda_ref 1, a random
    input image here, so the anchor pulls elsewhere on the front) the gain is smaller, still a gain."""
    from microdreamer.texture.refine import refine_with_prior

    prior = _Recording(tiny_prior)
    start = _textured_sphere()
    calls0 = tiny_prior.unet.calls
    cfg = Stage2Config(size=S, lambda_ref=lambda_ref)
    mesh, stats = refine_with_prior(start, prior, tiny_prior.reference, cfg, seed=2)
    assert tiny_prior.unet.calls - calls0 == 10  # the last 10 steps of a 50-step grid, guided
    (views, renders, targets), = prior.calls  # fmt: skip
    assert renders.shape == targets.shape == (8, 3, S, S)
    np.testing.assert_allclose(np.diff(views.azimuth_deg.numpy()), 45.0, atol=1e-4)
    assert -180.0 <= float(views.azimuth_deg[0]) < -135.0
    # the prior gets the views' angles back from their cameras (float32 round trip)
    np.testing.assert_allclose(views.elevation_deg.numpy(), 0.0, atol=1e-4)
    np.testing.assert_allclose(views.radius.numpy(), 2.0, atol=1e-5)
    before, after = _mse_to(start, views, targets), _mse_to(mesh, views, targets)
    assert after < (0.8 if lambda_ref == 0 else 0.97) * before, (before, after)
    np.testing.assert_array_equal(mesh.vertices, start.vertices)  # geometry fixed
    np.testing.assert_array_equal(mesh.uv, start.uv)
    h = stats["history"][0]
    assert h["loss_last"] < h["loss_first"]
    assert set(stats["seconds"]) == {"render", "diffusion", "optimise", "total"}


def test_stage2_anchor_pulls_the_input_view_to_the_input_image():
    """With no novel-view term (lambda_views 0) only the input view's MSE is minimised: its render moves
    to the input image on the pixels facing the camera."""
    from microdreamer.render.mesh import render_mesh
    from microdreamer.texture.refine import refine_with_prior

    gt = position_colored_sphere(3)
    cams = OrbitViews([0.0], [0.0], [2.0]).cameras(49.1, S, S)
    want = render_mesh(gt, cams)
    reference = Reference(want.rgb[0].permute(2, 0, 1), want.alpha[0].permute(2, 0, 1))
    start = _textured_sphere()
    prior = GroundTruthPrior(lambda v: torch.zeros(len(v), 3, S, S))  # ignored: lambda_views = 0
    cfg = Stage2Config(size=S, lambda_views=0.0, steps=60)
    mesh, _ = refine_with_prior(start, prior, reference, cfg)
    m = want.alpha

    def err(x: Mesh) -> float:
        return float(((render_mesh(x, cams).rgb - want.rgb) ** 2 * m).sum() / (3 * m.sum()))

    assert err(mesh) < 0.2 * err(start)


# -------------------------------------------------------------------------------- generate (tiny)
def _input(tmp_path):
    from PIL import Image

    # an RGBA input made here: an orange disc with soft edges, off-centre
    yy, xx = np.mgrid[0:96, 0:128]
    a = np.clip(20.0 - np.hypot(yy - 40, xx - 50), 0, 1)
    img = np.zeros((96, 128, 4), np.uint8)
    img[..., 0], img[..., 1], img[..., 2], img[..., 3] = 230, 120, 30, (a * 255).astype(np.uint8)
    Image.fromarray(img, "RGBA").save(tmp_path / "in.png")
    return tmp_path / "in.png"


def _small_config() -> GenerateConfig:
    train = TrainConfig(num_pts=300, backend="torch", densify_start_iter=0, densify_end_iter=0,
                        densify_interval=20, position_lr_max_steps=60)  # fmt: skip
    cfg = GenerateConfig(
        image=ImageConfig(size=S),
        prior=Zero123Config(image_size=S),
        sir=SIRConfig(
            iterations=2, views=2, init_steps=3, recon_steps=3, image_size=S, white_check_size=S, train=train
        ),  # fmt: skip
        refine=Stage2Config(size=32, steps=5),
        views_size=32,
    )
    tex = cfg.export.texture  # the default textured export, small
    tex = replace(tex, size=32, bake=replace(tex.bake, views=replace(tex.bake.views, size=32)))
    return replace(cfg, export=replace(cfg.export, field=FieldConfig(resolution=32), texture=tex))


def test_generate_with_and_without_stage2(tmp_path):
    """Stage 2 changes only the mesh's texture: splat.ply and views.png are the same bytes with and without
    it, the mesh has the same vertices, faces and UVs, its texture differs; timings.json records stage 2
    as its own stage."""
    pytest.importorskip("diffusers", reason="generate needs diffusers")
    from microdreamer.jobs.generate import generate
    from microdreamer.mesh.load import load_textured_mesh
    from microdreamer.splat import read_ply

    image = _input(tmp_path)
    cfg = _small_config()
    on = generate(image, tmp_path / "on", cfg, random_weights="tiny", device="cpu")
    off = generate(image, tmp_path / "off", replace(cfg, refine=replace(cfg.refine, enabled=False)),
                   random_weights="tiny", device="cpu")  # fmt: skip
    for out in (tmp_path / "on", tmp_path / "off"):
        assert sorted(p.name for p in out.iterdir()) == [
            "input_rgba.png", "mesh.glb", "splat.ply", "timings.json", "views.png"
        ]  # fmt: skip
    for name in ("input_rgba.png", "splat.ply", "views.png"):
        assert (tmp_path / "on" / name).read_bytes() == (tmp_path / "off" / name).read_bytes(), name
    a, b = load_textured_mesh(tmp_path / "on" / "mesh.glb"), load_textured_mesh(tmp_path / "off" / "mesh.glb")
    np.testing.assert_array_equal(a.vertices, b.vertices)
    np.testing.assert_array_equal(a.faces, b.faces)
    np.testing.assert_array_equal(a.uv, b.uv)
    assert not np.array_equal(a.texture, b.texture)

    t_on = json.loads((tmp_path / "on" / "timings.json").read_text())
    t_off = json.loads((tmp_path / "off" / "timings.json").read_text())
    assert set(t_on["stages"]) == {"diffusion", "reconstruction", "mesh", "refine", "other"}
    assert t_on["stages"]["refine"] > 0 and t_off["stages"]["refine"] == 0.0
    assert t_on["refine"]["enabled"] and not t_off["refine"]["enabled"]
    assert t_on["refine"]["views"] == 8 and len(t_on["refine"]["history"]) == 1
    assert set(t_on["background_seconds"]) == {"export_splat", "views_png"}  # written in a thread
    assert t_on["texture"]["mode"] == "bake" and t_on["texture"]["size"] == 32
    assert t_on["random_weights"] == "tiny" and t_on["mask_method"] == "alpha"
    # SIR: 20 guided steps from noise, then t2 901 <- t1 501: 8 inversion + 19 guided; stage 2: 10 guided
    assert t_off["prior_stats"]["unet_calls"] == 20 + 8 + 19
    assert t_on["prior_stats"]["unet_calls"] == 20 + 8 + 19 + 10
    assert len(read_ply(tmp_path / "on" / "splat.ply")) == on["num_gaussians"] == off["num_gaussians"] > 0
    assert on["mesh_faces"] == off["mesh_faces"] > 0
    # the prepared input beside the outputs: 64^2 RGBA, its alpha the mask the model saw
    from PIL import Image

    rgba = np.asarray(Image.open(tmp_path / "on" / "input_rgba.png"))
    assert rgba.shape == (S, S, 4) and t_on["input_rgba"] == "input_rgba.png"
    assert rgba[..., 3].max() == 255 and rgba[0, 0, 3] == 0
    # the command line's cost model counts the SIR's calls (its time-left estimate and CPU note use it)
    from microdreamer.cli import _sir_weights

    weights, guided, uncond = _sir_weights(cfg)
    assert (guided, uncond) == (20 + 19, 8) and len(weights) == 2


def test_generate_command_reports_progress_and_keeps_stderr_quiet(tmp_path, capsys, caplog):
    """``microdreamer generate`` off a terminal (captured stderr): log lines per SIR iteration with the
    time left, the mask method, the mesh and texture stages; the random-weights warning once; none of
    the libraries' notices (diffusers' empty float32 list, transformers' torchvision fallback)."""
    pytest.importorskip("diffusers", reason="generate needs diffusers")
    import yaml

    from microdreamer.cli import main
    from microdreamer.config import to_dict

    image = _input(tmp_path)
    (tmp_path / "small.yaml").write_text(yaml.safe_dump(to_dict(_small_config())))
    argv = ["generate", str(image), "-o", str(tmp_path / "out"), "--random-weights", "tiny",
            "--config", str(tmp_path / "small.yaml"), "--device", "cpu"]  # fmt: skip
    assert main(argv) == 0
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert "SIR iterations: started" in err
    assert any(line.startswith("SIR iterations: 1/2 (50%) after") and "left" in line for line in lines), err
    assert any(line.startswith("SIR iterations: 2/2 (100%) after") for line in lines), err
    assert "input: the object's mask from the image's alpha channel" in err
    assert "UV unwrap" in err and "baking from" in err and "filling" in err and "writing" in err
    assert "stage 2: the texture refined against the prior's refinement of 8 renders" in err  # not silent
    # the random-weights warning once: the job's log record (pytest's log capture holds it here; the
    # command line's handler prints it), no second copy printed by the command line
    assert sum("RANDOM WEIGHTS" in r.getMessage() for r in caplog.records) == 1
    assert "RANDOM WEIGHTS" not in err and "random weights" not in err.lower(), err
    assert "kept in float32" not in err and "torchvision" not in err, err
    assert "note: generate on the CPU" not in err  # tiny weights: no slow-CPU estimate


def test_generate_on_the_cpu_with_full_weights_says_how_long():
    pytest.importorskip("diffusers", reason="the DDIM grid comes from diffusers")
    from microdreamer.cli import _cpu_estimate

    note = _cpu_estimate(GenerateConfig(), None)  # real (full-size) weights
    # upstream's 352 UNet calls (tests/test_priors_ddim.py): 20 + 237 guided, 95 inversion (unconditional)
    assert note.startswith("note: generate on the CPU") and "257 guided and 95 unconditional" in note
    assert "min" in note and note == _cpu_estimate(GenerateConfig(), "full")
    assert _cpu_estimate(GenerateConfig(), "tiny") is None


def test_cli_no_refine_turns_stage2_off(tmp_path, monkeypatch):
    """``--no-refine`` reaches generate() as ``refine.enabled = False``; without it stage 2 is on."""
    import microdreamer.jobs.generate as job
    from microdreamer import cli

    seen = []

    def fake_generate(image, out, cfg, **kw):
        seen.append(cfg)
        return {"stages": {}, "seconds_after_load": 0.0}

    monkeypatch.setattr(job, "generate", fake_generate)
    (tmp_path / "in.png").write_bytes(b"")  # the CLI checks that the image exists before importing the job
    base = ["generate", str(tmp_path / "in.png"), "-o", str(tmp_path / "o"), "--device", "cpu"]
    assert cli.main(base) == 0 and cli.main([*base, "--no-refine"]) == 0
    assert [c.refine.enabled for c in seen] == [True, False]
    assert seen[1] == replace(seen[0], refine=replace(seen[0].refine, enabled=False))


@pytest.mark.cuda
def test_stage2_on_cuda_after_warmup_captures_no_new_graph_and_is_deterministic():
    """On the GPU (float32, CUDA graphs): the warm-up with stage 2's batch captures every graph stage 2
    replays, one seed gives one texture (up to atomics), and it gets closer to the prior's refined images."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from microdreamer.priors.factory import build_random_zero123
    from microdreamer.priors.zero123 import Zero123Prior
    from microdreamer.texture.refine import refine_with_prior

    tiny = Zero123Prior(
        build_random_zero123("tiny", seed=3), Zero123Config(image_size=S, dtype="float32"), "cuda"
    )
    g = torch.Generator().manual_seed(0)
    reference = Reference(torch.rand(3, S, S, generator=g), torch.ones(1, S, S))
    tiny.set_reference(reference)
    tiny.warmup(6, extra_views=(8,))
    graphs = len(tiny.unet.graphs)
    assert graphs == 3  # batches 12, 6 (SIR) and 16 (stage 2)
    prior = _Recording(tiny)
    start = _textured_sphere()
    cfg = Stage2Config(size=S, lambda_ref=0.0)
    a, _ = refine_with_prior(start, prior, reference, cfg, device="cuda", seed=2)
    b, _ = refine_with_prior(start, prior, reference, cfg, device="cuda", seed=2)
    assert len(tiny.unet.graphs) == graphs
    # one seed, one texture: up to the order of the float atomics of the texture's gradient (CUDA's
    # index_add), which can flip a rounding to uint8
    diff = np.abs(a.texture.astype(int) - b.texture.astype(int))
    assert diff.max() <= 1 and (diff > 0).mean() < 0.01
    views, _, targets = prior.calls[0]
    assert _mse_to(a, views, targets.cpu()) < 0.8 * _mse_to(start, views, targets.cpu())


# ------------------------------------------------------------------------------------------------ start-up
def test_device_initialisation_is_a_no_op_off_cuda():
    from microdreamer.jobs.generate import initialise_device

    assert initialise_device(torch.device("cpu")) is None


@pytest.mark.cuda
def test_device_initialisation_draws_no_random_numbers():
    """The background CUDA initialisation (context, cuBLAS, cuDNN, attention) leaves the device's random
    state as it found it: a seeded generation gives the same noise with or without it."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from microdreamer.jobs.generate import initialise_device

    device = torch.device("cuda")
    state = torch.cuda.get_rng_state(device)
    thread = initialise_device(device)
    thread.join()
    assert torch.equal(torch.cuda.get_rng_state(device), state)
