"""The Zero123 prior: model save/load through the real loader, missing models, camera embeddings, the
DDIM round trip, and refine() on a tiny random model (CPU)."""

from __future__ import annotations

import math
import os
import sys

import numpy as np
import pytest
import torch

pytest.importorskip(
    "diffusers", reason="the Zero123 prior needs diffusers (pip install microdreamer[generate])"
)
pytest.importorskip("transformers", reason="the Zero123 prior needs transformers")

from microdreamer.errors import InputError  # noqa: E402
from microdreamer.priors import OrbitViews, Reference  # noqa: E402
from microdreamer.priors.ddim import DDIMConfig, DDIMRoundTrip  # noqa: E402
from microdreamer.priors.factory import build_random_zero123, save_zero123  # noqa: E402
from microdreamer.priors.zero123 import (  # noqa: E402
    Zero123Config,
    Zero123Prior,
    camera_embedding,
    load_components,
    resolve_model_path,
)

SIZE = 64  # tiny model: 64^2 images, 8^2 latents


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    """A tiny random Zero123 saved in the diffusers layout."""
    folder = tmp_path_factory.mktemp("zero123") / "tiny"
    save_zero123(build_random_zero123("tiny", seed=3), folder)
    return folder


@pytest.fixture(scope="module")
def tiny_prior(tiny_folder):
    prior = Zero123Prior.from_pretrained(Zero123Config(model=str(tiny_folder), image_size=SIZE))
    g = torch.Generator().manual_seed(0)
    rgb = torch.rand(3, SIZE, SIZE, generator=g)
    prior.set_reference(Reference(rgb, torch.ones(1, SIZE, SIZE), elevation_deg=-10.0))
    return prior


def _views(c: int = 2) -> OrbitViews:
    return OrbitViews(torch.linspace(-20, 20, c), torch.linspace(30, 300, c), 2.0)


# --------------------------------------------------------------------------------------- save / load
def test_tiny_model_saved_and_loaded_through_the_real_loader(tiny_folder):
    built = build_random_zero123("tiny", seed=3)
    loaded = load_components(resolve_model_path(tiny_folder))
    for a, b in zip(built.modules(), loaded.modules(), strict=True):
        sa, sb = a.state_dict(), b.state_dict()
        assert sa.keys() == sb.keys()
        for k in sa:
            assert torch.equal(sa[k], sb[k]), k  # safetensors round trip is bit-exact
    assert loaded.camera_embedding == "stable-zero123"
    assert loaded.camera_projection.in_features == loaded.camera_projection.out_features + 4
    assert loaded.unet.config.in_channels == 8
    # same inputs, same outputs (the networks are the same functions)
    g = torch.Generator().manual_seed(1)
    x, ctx = torch.randn(2, 8, 8, 8, generator=g), torch.randn(2, 1, 32, generator=g)
    t = torch.tensor([500.0, 500.0])
    with torch.no_grad():
        assert torch.equal(
            built.unet(x, t, encoder_hidden_states=ctx).sample,
            loaded.unet(x, t, encoder_hidden_states=ctx).sample,
        )
    # the processor's settings survive
    assert loaded.feature_extractor.crop_size == {"height": 32, "width": 32}


def _upstream_zero123_module():
    """A stand-in for the ``zero123`` module upstream imports its pipeline from (DreamGaussian's
    ``zero123.py``): ``CLIPCameraProjection(embedding_dim=768, additional_embeddings=4)``, a ModelMixin
    holding ``proj`` = Linear(D + 4, D); ``Zero123Pipeline``, a DiffusionPipeline of vae, image_encoder, unet,
    scheduler, safety_checker (optional), feature_extractor, clip_camera_projection; and the name
    ``ModelMixin``, which the real module imports and diffusers' loader looks up in it."""
    import types

    from diffusers import ConfigMixin, DiffusionPipeline, ModelMixin
    from diffusers.configuration_utils import register_to_config

    class CLIPCameraProjection(ModelMixin, ConfigMixin):
        @register_to_config
        def __init__(self, embedding_dim: int = 768, additional_embeddings: int = 4):
            super().__init__()
            self.proj = torch.nn.Linear(embedding_dim + additional_embeddings, embedding_dim)

    class Zero123Pipeline(DiffusionPipeline):
        _optional_components = ["safety_checker"]

        def __init__(self, vae, image_encoder, unet, scheduler, safety_checker, feature_extractor,
                     clip_camera_projection, requires_safety_checker: bool = True):  # fmt: skip
            super().__init__()
            self.register_modules(vae=vae, image_encoder=image_encoder, unet=unet, scheduler=scheduler,
                                  safety_checker=safety_checker, feature_extractor=feature_extractor,
                                  clip_camera_projection=clip_camera_projection)  # fmt: skip
            self.register_to_config(requires_safety_checker=requires_safety_checker)

    module = types.ModuleType("zero123")
    for cls in (CLIPCameraProjection, Zero123Pipeline):
        cls.__module__ = "zero123"
        setattr(module, cls.__name__, cls)
    module.ModelMixin = ModelMixin
    return module


def test_saved_folder_loads_with_diffusers_own_pipeline_loader(tiny_folder, monkeypatch):
    """Upstream loads ``Zero123Pipeline.from_pretrained(model_key)`` (guidance/zero123_utils.py L26-30):
    diffusers resolves each (library, class) of model_index.json. Our saved folder names no microdreamer
    class, and every component comes back with the weights saved."""
    import json

    index = json.loads((tiny_folder / "model_index.json").read_text())
    assert "microdreamer" not in json.dumps(index).lower()
    assert index["clip_camera_projection"] == ["zero123", "CLIPCameraProjection"]
    module = _upstream_zero123_module()
    monkeypatch.setitem(sys.modules, "zero123", module)
    pipe = module.Zero123Pipeline.from_pretrained(tiny_folder)
    built = build_random_zero123("tiny", seed=3)
    assert pipe.safety_checker is None and type(pipe.scheduler).__name__ == "DDIMScheduler"
    assert torch.equal(pipe.clip_camera_projection.proj.weight, built.camera_projection.weight)
    assert torch.equal(pipe.clip_camera_projection.proj.bias, built.camera_projection.bias)
    for name in ("unet", "vae", "image_encoder"):
        a, b = getattr(pipe, name).state_dict(), getattr(built, name).state_dict()
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name
    assert pipe.feature_extractor.crop_size == {"height": 32, "width": 32}
    # and our loader still reads the camera embedding the folder declares
    assert load_components(tiny_folder).camera_embedding == "stable-zero123"


def test_repo_id_is_found_in_a_local_hf_cache_without_network(tiny_folder, tmp_path, monkeypatch):
    """Lay the folder out as a Hugging Face cache snapshot and load it by repo id, offline."""
    import shutil

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--someone--zero123-tiny"
    shutil.copytree(tiny_folder, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    path = resolve_model_path("someone/zero123-tiny", cache_dir=tmp_path / "hub")
    assert path == repo / "snapshots" / commit
    prior = Zero123Prior.from_pretrained(Zero123Config(model="someone/zero123-tiny", image_size=SIZE,
                                                       hf_cache_dir=str(tmp_path / "hub")))  # fmt: skip
    assert prior.kind == "stable-zero123"  # declared by the folder's model_index.json
    assert prior.dtype == torch.float32  # fp32 on the CPU


@pytest.mark.parametrize("case", ["no_folder", "repo_not_cached", "incomplete_folder"])
def test_missing_model_is_one_line_input_error(case, tmp_path, tiny_folder):
    if case == "no_folder":
        model, expect = str(tmp_path / "nothing-here"), "no such folder"
    elif case == "repo_not_cached":
        model, expect = "ashawkey/stable-zero123-diffusers", "not in the local Hugging Face cache"
    else:
        import shutil

        model = str(tmp_path / "partial")
        shutil.copytree(tiny_folder, model)
        shutil.rmtree(os.path.join(model, "vae"))
        expect = "lacks vae/"
    with pytest.raises(InputError) as err:
        resolve_model_path(model, cache_dir=tmp_path / "empty-cache")
    msg = str(err.value)
    assert "\n" not in msg and expect in msg and model in msg
    if case == "repo_not_cached":
        assert str(tmp_path / "empty-cache") in msg and "--model PATH" in msg  # where to put it


# ------------------------------------------------------------------------------------ camera embeddings
# ------------------------------------------------------------------------------- CLIP input, VAE latents
def test_clip_input_is_truncated_to_8_bits_as_to_pil_image():
    """Upstream hands CLIP ``TF.to_pil_image(x)`` (guidance/zero123_utils.py L59; imagedream_utils.py L53):
    float * 255 cast to uint8, a truncation (0.5 -> 127, 0.999 -> 254; rounding would give 128, 255)."""
    from microdreamer.priors.zero123 import to_8bit

    x = torch.tensor([0.0, 0.5, 0.999, 1.0, 0.2, 0.0039]).reshape(1, 3, 1, 2)
    got = np.asarray(to_8bit(x)[0]).transpose(2, 0, 1).reshape(-1)
    assert got.tolist() == [0, 127, 254, 255, 51, 0]
    g = torch.Generator().manual_seed(0)
    y = torch.rand(2, 3, 16, 16, generator=g)
    want = (y.numpy() * 255).astype("uint8")  # numpy's float -> uint8 cast truncates too
    for img, w in zip(to_8bit(y), want, strict=True):
        assert (np.asarray(img) == w.transpose(1, 2, 0)).all()


@pytest.mark.parametrize("processor_class", ["CLIPImageProcessorPil", "CLIPImageProcessor"])
def test_clip_pixels_are_the_pil_processors_whatever_processor_class_is_given(processor_class):
    """transformers 5: ``CLIPImageProcessor`` is torchvision-backed where torchvision is installed (the PIL
    one otherwise). clip_pixels takes only its settings and computes with the PIL-backed processor, upstream's
    (transformers 4's), so both classes give the same pixel values, bit for bit."""
    import transformers

    from microdreamer.priors.zero123 import clip_pixels, to_8bit

    settings = {"size": {"shortest_edge": 224}, "crop_size": {"height": 224, "width": 224}}
    processor = getattr(transformers, processor_class)(**settings)
    images = torch.rand(2, 3, 256, 256, generator=torch.Generator().manual_seed(1))
    want = transformers.CLIPImageProcessorPil(**settings)(images=to_8bit(images), return_tensors="pt")
    got = clip_pixels(images, processor)
    assert got.shape == (2, 3, 224, 224) and torch.equal(got, want.pixel_values)


def test_vae_latents_are_the_posteriors_seeded_sample_or_its_mode(tiny_prior):
    """Upstream's ``encode_imgs`` (guidance/zero123_utils.py L242-254, mode=False) samples the posterior:
    diffusers' ``latent_dist.sample(generator)``, scaled; ``latents="mode"`` gives its mean."""
    from microdreamer.priors.zero123 import LatentCodec

    images = torch.rand(3, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(5))
    vae = tiny_prior.nets.vae
    with torch.no_grad():
        dist = vae.encode(images * 2 - 1).latent_dist
        want = dist.sample(torch.Generator().manual_seed(7)) * vae.config.scaling_factor
        got = tiny_prior.encode(images, torch.Generator().manual_seed(7))
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)  # float32, the same draws
        assert torch.equal(got, tiny_prior.encode(images, torch.Generator().manual_seed(7)))
        mode = LatentCodec(vae, torch.float32, SIZE, False, "mode").encode(images)
        torch.testing.assert_close(mode, dist.mode() * vae.config.scaling_factor, rtol=1e-6, atol=1e-6)
        assert (got - mode).abs().max() > 1e-3
    with pytest.raises(ValueError, match="latents"):
        LatentCodec(vae, torch.float32, SIZE, False, "mean")


def test_stage2_renders_shrink_with_plain_bilinear_as_upstream(tiny_prior):
    """Upstream's ``refine`` (guidance/zero123_utils.py L93-94): ``F.interpolate(pred_rgb, (256, 256),
    mode='bilinear', align_corners=False)``, no antialiasing."""
    big = torch.rand(2, 3, 2 * SIZE, 2 * SIZE, generator=torch.Generator().manual_seed(6))
    want = torch.nn.functional.interpolate(big, (SIZE, SIZE), mode="bilinear", align_corners=False)
    assert torch.equal(tiny_prior.codec.resize(big), want)


def test_camera_embeddings_match_hand_computed_values():
    ref = Reference(
        torch.ones(3, 4, 4), torch.ones(1, 4, 4), elevation_deg=-10.0, azimuth_deg=0.0, radius=2.0
    )
    views = OrbitViews([10.0, -20.0], [90.0, 180.0], [2.0, 2.5])
    stable = camera_embedding(views, ref, "stable-zero123")
    xl = camera_embedding(views, ref, "zero123-xl")
    d_el = [math.radians(20.0), math.radians(-10.0)]
    expect_common = torch.tensor([[d_el[0], 1.0, 0.0], [d_el[1], 0.0, -1.0]])
    # float32 trigonometry of exact angles: within 1e-6
    torch.testing.assert_close(stable[:, :3], expect_common, atol=1e-6, rtol=0)
    torch.testing.assert_close(xl[:, :3], expect_common, atol=1e-6, rtol=0)
    torch.testing.assert_close(stable[:, 3], torch.full((2,), math.radians(80.0)), atol=1e-6, rtol=0)
    torch.testing.assert_close(xl[:, 3], torch.tensor([0.0, 0.5]), atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="unknown camera embedding"):
        camera_embedding(views, ref, "zero123-plus")


def test_camera_embedding_kind_auto_follows_the_model_name():
    comps = build_random_zero123("tiny")
    comps.camera_embedding = None  # as a folder without our model_index entry
    assert Zero123Prior(comps, Zero123Config(model="x/zero123-xl-diffusers")).kind == "zero123-xl"
    assert Zero123Prior(comps, Zero123Config(model="x/stable-zero123-diffusers")).kind == "stable-zero123"
    assert Zero123Prior(comps, Zero123Config(model="x/y", camera_embedding="zero123-xl")).kind == "zero123-xl"


# ------------------------------------------------------------------------------------------------ DDIM
@pytest.mark.parametrize("spacing, offset", [("leading", 1), ("leading", 0), ("trailing", 0)])
@pytest.mark.parametrize("train_steps", [1000, 999, 7])
def test_ddim_grid_is_diffusers_grid(spacing, offset, train_steps):
    """grid_timesteps computes diffusers' DDIMScheduler / DDIMInverseScheduler grids without diffusers, for
    every step count (odd ones included: trailing spacing rounds float multiples of T / steps)."""
    from diffusers import DDIMInverseScheduler, DDIMScheduler

    from microdreamer.priors.ddim import grid_timesteps

    for steps in range(1, min(train_steps, 120) + 1):
        cfg = DDIMConfig(num_train_timesteps=train_steps, num_inference_steps=steps, timestep_spacing=spacing,
                         steps_offset=offset)  # fmt: skip
        for inverse, cls in ((False, DDIMScheduler), (True, DDIMInverseScheduler)):
            scheduler = cls(**cfg.scheduler_kwargs())
            scheduler.set_timesteps(steps)
            assert grid_timesteps(cfg, inverse) == [int(t) for t in scheduler.timesteps], (steps, inverse)


def test_ddim_schedule_is_microdreamers():
    dd = DDIMRoundTrip()
    assert dd.timesteps == list(range(951, 0, -50))  # leading spacing, steps_offset 1, 20 steps
    assert dd.scheduler.config.beta_schedule == "scaled_linear" and not dd.scheduler.config.clip_sample
    assert dd.plan(1.0, 0.6) == (None, 951)  # pure noise from the top of the grid
    assert dd.plan(0.9, 0.6) == (501, 851)  # t2 <= 900; t1: inverse grid [int(0.851 * 20 * 0.6) = 10]
    assert dd.plan(0.2, 0.6) == (51, 151)  # t1: inverse grid [int(0.151 * 20 * 0.6) = 1]
    assert dd.plan(0.0005, 0.6) == (None, None)  # below the grid: nothing to do


def test_ddim_inversion_is_the_exact_inverse_for_a_fixed_noise_prediction():
    """With one noise prediction used in both directions the DDIM steps invert each other exactly."""
    dd = DDIMRoundTrip()
    g = torch.Generator().manual_seed(7)
    xa, eps = torch.randn(3, 4, 8, 8, generator=g), torch.randn(3, 4, 8, 8, generator=g)
    xb = dd.invert(xa, 101, 951, lambda x, t: eps)
    back = dd.denoise(xb, 951, lambda x, t: eps, eta=0.0, t_to=101)
    # 17 float32 steps each way: relative error ~1e-6 (measured 6e-7)
    assert ((back - xa).norm() / xa.norm()).item() < 1e-5


def test_ddim_inversion_then_denoising_with_the_unconditional_prediction_returns_the_start(tiny_prior):
    """Invert t1 = 301 -> t2 = 501 with the tiny model's unconditional prediction, denoise back (eta 0).

    Inversion evaluates the network at the lower noise level of each step, denoising at the higher one,
    so the round trip is exact only up to the change of the prediction over one step: a first-order
    error in the step size. On the tiny random model it is 1.6-1.8e-2 (relative) on a 20-step grid and
    five times smaller on a 100-step grid; we assert < 3e-2, and at least a 3x reduction.
    """
    eps = tiny_prior._eps_unconditional(2, tiny_prior.nets.camera_projection.out_features)
    errors = []
    for steps in (20, 100):
        dd = DDIMRoundTrip(DDIMConfig(num_inference_steps=steps))
        g = torch.Generator().manual_seed(11)
        xa = dd.add_noise(torch.randn(2, 4, 8, 8, generator=g), 301, g)
        back = dd.denoise(dd.invert(xa, 301, 501, eps), 501, eps, eta=0.0, t_to=301)
        errors.append(((back - xa).norm() / xa.norm()).item())
    assert errors[0] < 3e-2
    assert errors[1] < errors[0] / 3


def test_unconditional_branch_zeroes_context_and_reference_latent(tiny_prior):
    """Guidance scale 0 gives the unconditional prediction, and that is the network on zeroed context
    and a zeroed reference latent; scale 1 gives the conditional one."""
    views = _views(2)
    ctx = tiny_prior.context(views)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 4, 8, 8, generator=g)
    unet = tiny_prior.nets.unet
    t = torch.full((2,), 301.0)
    with torch.no_grad():
        uncond = unet(
            torch.cat([x, torch.zeros_like(x)], 1), t, encoder_hidden_states=torch.zeros_like(ctx)
        ).sample
        ref = tiny_prior.reference_latent.expand(2, -1, -1, -1)
        cond = unet(torch.cat([x, ref], 1), t, encoder_hidden_states=ctx).sample
        saved = tiny_prior.config.guidance_scale
        try:
            tiny_prior.config.guidance_scale = 0.0
            got0 = tiny_prior._eps_guided(ctx)(x, 301)
            tiny_prior.config.guidance_scale = 1.0
            got1 = tiny_prior._eps_guided(ctx)(x, 301)
        finally:
            tiny_prior.config.guidance_scale = saved
        got_u = tiny_prior._eps_unconditional(2, ctx.shape[-1])(x, 301)
    # batched (2C) vs separate (C) calls: float32 rounding only
    torch.testing.assert_close(got0, uncond, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_u, uncond, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got1, cond, atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------------------------------------- refine
def test_refine_gives_targets_of_the_right_shape_and_range(tiny_prior):
    views = _views(2)
    g = torch.Generator().manual_seed(0)
    calls0 = tiny_prior.unet.calls
    first = tiny_prior.refine(None, views, 1.0, generator=g)
    assert tiny_prior.unet.calls - calls0 == 20  # pure noise: every grid step, guided
    assert first.shape == (2, 3, SIZE, SIZE) and first.dtype == torch.float32
    assert torch.isfinite(first).all() and first.min() >= 0 and first.max() <= 1
    renders = torch.rand(2, 3, SIZE, SIZE, generator=g)
    calls0 = tiny_prior.unet.calls
    out = tiny_prior.refine(renders, views, 0.5, generator=torch.Generator().manual_seed(1))
    # t2 = 451, t1 = 251 (<= 0.6 * 500): 4 inversion steps + 10 denoising steps
    assert tiny_prior.unet.calls - calls0 == 14
    assert out.shape == (2, 3, SIZE, SIZE) and torch.isfinite(out).all() and out.min() >= 0 and out.max() <= 1
    again = tiny_prior.refine(renders, views, 0.5, generator=torch.Generator().manual_seed(1))
    assert torch.equal(out, again)  # one seed, one result
    # other render sizes are resized in and out
    small = tiny_prior.refine(renders[:, :, ::2, ::2], views, 0.3, generator=torch.Generator().manual_seed(2))
    assert small.shape == (2, 3, SIZE // 2, SIZE // 2)
    # t_stop below the grid: nothing to refine, the renders come back
    assert torch.equal(tiny_prior.refine(renders, views, 1e-4), renders)


def test_strength_start_is_upstreams_index_into_the_descending_grid():
    """MicroDreamer's stage 2: ``timesteps[int(steps * strength)]``; 0.8 of 50 steps starts at 181."""
    dd = DDIMRoundTrip(DDIMConfig(num_inference_steps=50))
    assert dd.timesteps[:2] == [981, 961] and dd.timesteps[-1] == 1
    assert dd.strength_start(0.8) == 181 == dd.timesteps[40]
    assert dd.strength_start(0.0) == 981  # the whole grid
    assert dd.strength_start(0.97) == 21 and dd.strength_start(0.99) == 1  # int(48.5), int(49.5)
    assert dd.strength_start(1.0) is None  # nothing left
    assert DDIMRoundTrip().strength_start(0.8) == 151  # SIR's 20-step grid: index 16
    with pytest.raises(ValueError, match="strength"):
        dd.strength_start(1.5)


def test_strength_refine_is_upstreams_loop_on_diffusers_scheduler(tiny_prior):
    """Against the loop of MicroDreamer's ``Zero123.refine`` written on diffusers' DDIMScheduler (50
    steps, ``add_noise`` at ``timesteps[40]``, then ``step`` through ``timesteps[40:]``, eta 0) with the
    prior's guided prediction at scale 2: the same latents to the last bit, 10 UNet calls of batch 2C."""
    from diffusers import DDIMScheduler

    views = _views(3)
    g = torch.Generator().manual_seed(8)
    renders = torch.rand(3, 3, SIZE, SIZE, generator=g)
    sched = DDIMScheduler(**DDIMConfig().scheduler_kwargs())
    sched.set_timesteps(50)
    with torch.no_grad():
        gen = torch.Generator().manual_seed(4)
        lat = tiny_prior.encode(renders, gen)  # the posterior's sample: the generator's first draw
        noise = torch.randn(lat.shape, generator=gen)
        x = sched.add_noise(lat, noise, sched.timesteps[40:41])
        eps = tiny_prior._eps_guided(tiny_prior.context(views), 2.0)
        for t in sched.timesteps[40:]:
            x = sched.step(eps(x, int(t)), t, x).prev_sample
        want = tiny_prior.decode(x)
    calls0, samples0 = tiny_prior.unet.calls, tiny_prior.unet.samples
    got = tiny_prior.strength_refine(renders, views, 0.8, torch.Generator().manual_seed(4))
    assert (tiny_prior.unet.calls - calls0, tiny_prior.unet.samples - samples0) == (10, 10 * 2 * 3)
    assert torch.equal(got, want)
    assert got.shape == renders.shape and got.min() >= 0 and got.max() <= 1
    # the guidance scale is used; SIR's config (scale 3, 20 steps) is not touched
    other = tiny_prior.strength_refine(
        renders, views, 0.8, torch.Generator().manual_seed(4), guidance_scale=3.0
    )
    assert not torch.equal(other, got)
    assert tiny_prior.config.guidance_scale == 3.0 and tiny_prior.ddim.timesteps[0] == 951
    # other sizes are resized in and out; strength 1 leaves nothing to denoise
    small = tiny_prior.strength_refine(renders[:, :, ::2, ::2], views, 0.8, torch.Generator().manual_seed(4))
    assert small.shape == (3, 3, SIZE // 2, SIZE // 2)
    assert torch.equal(tiny_prior.strength_refine(renders, views, 1.0), renders)


def test_refine_before_set_reference_is_an_error():
    prior = Zero123Prior(build_random_zero123("tiny"), Zero123Config(image_size=SIZE))
    with pytest.raises(RuntimeError, match="set_reference"):
        prior.refine(None, _views(1), 1.0)


def test_full_architecture_matches_stable_zero123():
    """The full-size factory's settings (constructing it would take ~1 GiB; check the numbers)."""
    from microdreamer.priors.factory import architecture

    a = architecture("full")
    assert a["unet"]["block_out_channels"] == [320, 640, 1280, 1280]
    assert a["unet"]["in_channels"] == 8 and a["unet"]["cross_attention_dim"] == 768
    assert a["vae"]["block_out_channels"] == [128, 256, 512, 512] and a["vae"]["scaling_factor"] == 0.18215
    assert (a["clip"]["hidden_size"], a["clip"]["num_hidden_layers"], a["clip"]["patch_size"]) == (
        1024,
        24,
        14,
    )
    assert a["clip"]["projection_dim"] == 768 == a["context_dim"]


# ------------------------------------------------------------------------------ cross-attention shortcut
def _attn_layers(unet, suffix: str):
    return [m for n, m in unet.named_modules() if n.endswith(suffix)]


@pytest.mark.parametrize("residual, rescale", [(False, 1.0), (True, 2.0)])
@pytest.mark.parametrize("batch, seq", [(1, 1), (3, 17), (2, 64)])
def test_single_token_cross_attention_matches_sdpa(batch, seq, residual, rescale):
    """One context token: the shortcut (value projection broadcast) equals diffusers' SDPA processor
    on fresh random weights and inputs, with and without a residual connection and output rescale."""
    from diffusers.models.attention_processor import Attention, AttnProcessor2_0

    from microdreamer.priors.zero123 import SingleTokenCrossAttention

    torch.manual_seed(11)
    attn = Attention(
        24, cross_attention_dim=16, heads=3, dim_head=8, residual_connection=residual,
        rescale_output_factor=rescale,
    ).eval()  # fmt: skip
    g = torch.Generator().manual_seed(batch * 100 + seq)
    x = torch.randn(batch, seq, 24, generator=g)
    ctx = torch.randn(batch, 1, 16, generator=g) * 3
    with torch.no_grad():
        want = AttnProcessor2_0()(attn, x, ctx)
        got = SingleTokenCrossAttention()(attn, x, ctx)
    assert got.shape == want.shape == (batch, seq, 24)
    # float32: the same products in another summation order (a [B, 1] GEMM instead of [B, seq])
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_single_token_cross_attention_falls_back_for_several_tokens_or_a_mask():
    from diffusers.models.attention_processor import Attention, AttnProcessor2_0

    from microdreamer.priors.zero123 import SingleTokenCrossAttention

    torch.manual_seed(12)
    attn = Attention(24, cross_attention_dim=16, heads=3, dim_head=8).eval()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 10, 24, generator=g)
    with torch.no_grad():
        ctx = torch.randn(2, 4, 16, generator=g)
        assert torch.equal(SingleTokenCrossAttention()(attn, x, ctx), AttnProcessor2_0()(attn, x, ctx))
        ctx1 = ctx[:, :1]
        mask = torch.zeros(2, 1, dtype=torch.float32)  # an additive mask: goes the general way
        assert torch.equal(
            SingleTokenCrossAttention()(attn, x, ctx1, mask), AttnProcessor2_0()(attn, x, ctx1, mask)
        )
    self_attn = Attention(24, heads=3, dim_head=8).eval()  # no context: self-attention, the general way
    with torch.no_grad():
        assert torch.equal(SingleTokenCrossAttention()(self_attn, x), AttnProcessor2_0()(self_attn, x))


def test_unet_with_the_shortcut_matches_the_unet_without(tiny_folder):
    """The whole tiny UNet, cross-attention shortcut on vs off (Zero123's [B, 1, D] context), and
    the prior switches its layers both ways."""
    comps = build_random_zero123("tiny", seed=4)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(3, 8, 8, 8, generator=g)
    ctx = torch.randn(3, 1, 32, generator=g)
    t = torch.full((3,), 451.0)
    off = Zero123Prior(comps, Zero123Config(image_size=SIZE, single_token_cross_attention=False))
    assert all(type(m.processor).__name__ == "AttnProcessor2_0" for m in _attn_layers(comps.unet, "attn2"))
    with torch.no_grad():
        want = off.nets.unet(x, t, encoder_hidden_states=ctx).sample
    on = Zero123Prior(comps, Zero123Config(image_size=SIZE))
    assert all(
        type(m.processor).__name__ == "SingleTokenCrossAttention" for m in _attn_layers(comps.unet, "attn2")
    )
    assert all(type(m.processor).__name__ == "AttnProcessor2_0" for m in _attn_layers(comps.unet, "attn1"))
    with torch.no_grad():
        got = on.nets.unet(x, t, encoder_hidden_states=ctx).sample
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)  # float32 summation order only


@pytest.mark.cuda
def test_prior_layouts_and_shortcut_agree_on_cuda():
    """On the GPU: channels-last and the cross-attention shortcut give the UNet's and the VAE's
    outputs of the plain NCHW / SDPA configuration, and switching back restores NCHW weights."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    comps = build_random_zero123("tiny", seed=5)
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(4, 8, 8, 8, device="cuda", generator=g)
    ctx = torch.randn(4, 1, 32, device="cuda", generator=g)
    imgs = torch.rand(4, 3, SIZE, SIZE, device="cuda", generator=g)
    outs = {}
    for name, kw in {
        "plain": dict(channels_last=False, single_token_cross_attention=False),
        "fast": dict(channels_last=True, vae_channels_last=True, single_token_cross_attention=True),
        "back": dict(channels_last=False, single_token_cross_attention=False),
    }.items():
        prior = Zero123Prior(
            comps, Zero123Config(image_size=SIZE, dtype="float32", cuda_graphs=False, **kw), "cuda"
        )
        conv = prior.nets.unet.conv_in.weight
        assert conv.is_contiguous(
            memory_format=torch.channels_last if kw["channels_last"] else torch.contiguous_format
        )
        with torch.no_grad():
            eps = prior.unet(x, 451, ctx)
            # the posterior's sample from the same seeded noise in every configuration
            lat = prior.encode(imgs, torch.Generator(device="cuda").manual_seed(1))
            outs[name] = (eps, lat, prior.decode(lat))
    # TF32 convolutions and matmuls (PyTorch's default on Ampere+ for cuDNN) in other algorithms
    for a, b in zip(outs["fast"], outs["plain"], strict=True):
        torch.testing.assert_close(a, b, atol=5e-3, rtol=5e-3)
    for a, b in zip(outs["back"], outs["plain"], strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)


# ------------------------------------------------------------------------------------------ warm start
@pytest.mark.parametrize("variant", ["fp32", "fp16_file", "renamed_keys"])
def test_direct_loader_matches_diffusers_from_pretrained(tiny_folder, tmp_path, variant, caplog):
    """The UNet and VAE built on the meta device and given the safetensors tensors equal diffusers'
    from_pretrained; a float16 file is read for float16; keys that differ fall back to diffusers."""
    import logging
    import shutil

    from diffusers import AutoencoderKL, UNet2DConditionModel
    from safetensors.torch import load_file, save_file

    from microdreamer.priors.zero123 import WEIGHTS, load_diffusers_model

    folder = tmp_path / "vae"
    shutil.copytree(tiny_folder / "vae", folder)
    dtype = torch.float32
    if variant == "fp16_file":  # a half-precision variant beside the full one: fp16 loads read it
        state = load_file(str(folder / f"{WEIGHTS}.safetensors"))
        save_file({k: v.half() for k, v in state.items()}, str(folder / f"{WEIGHTS}.fp16.safetensors"))
        dtype = torch.float16
    if variant == "renamed_keys":  # diffusers' deprecated VAE attention names (query/key/value/proj_attn)
        state = load_file(str(folder / f"{WEIGHTS}.safetensors"))
        renamed = {k.replace(".to_q.", ".query.").replace(".to_k.", ".key.").replace(".to_v.", ".value.")
                   .replace(".to_out.0.", ".proj_attn."): v for k, v in state.items()}  # fmt: skip
        assert renamed.keys() != state.keys()
        save_file(renamed, str(folder / f"{WEIGHTS}.safetensors"))
    with caplog.at_level(logging.INFO, logger="microdreamer.priors.zero123"):
        direct = load_diffusers_model(AutoencoderKL, folder, "cpu", dtype)
    assert ("loading through diffusers" in caplog.text) == (variant == "renamed_keys")
    reference = AutoencoderKL.from_pretrained(folder, torch_dtype=dtype, local_files_only=True)
    if variant == "fp16_file":  # diffusers reads the full file and casts: the same values
        reference = AutoencoderKL.from_pretrained(tiny_folder / "vae", torch_dtype=dtype)
    a, b = direct.state_dict(), reference.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == dtype and torch.equal(a[k], b[k]), k
    assert not direct.training and all(not t.is_meta for t in direct.state_dict().values())
    unet = load_diffusers_model(UNet2DConditionModel, tiny_folder / "unet", "cpu", torch.float32)
    ref_unet = UNet2DConditionModel.from_pretrained(tiny_folder / "unet", local_files_only=True)
    g = torch.Generator().manual_seed(2)
    x, ctx, t = (
        torch.randn(2, 8, 8, 8, generator=g),
        torch.randn(2, 1, 32, generator=g),
        torch.tensor([9.0, 9.0]),
    )
    with torch.no_grad():
        assert torch.equal(
            unet(x, t, encoder_hidden_states=ctx).sample, ref_unet(x, t, encoder_hidden_states=ctx).sample
        )


@pytest.mark.parametrize("iterations", [1, 2])
def test_warmup_captures_only_what_the_run_replays(tiny_folder, monkeypatch, iterations):
    """The signatures (shapes, strides, dtypes) the warm-up would capture are exactly those the SIR
    run calls its graphed networks with: one iteration never encodes renders nor inverts."""
    from microdreamer.config import SIRConfig, TrainConfig
    from microdreamer.priors import zero123
    from microdreamer.sir import run_sir

    seen: list = []
    plain = zero123._GraphedCall.__call__

    def recording(self, *args):
        seen.append((self.name, tuple((tuple(a.shape), a.stride(), a.dtype) for a in args)))
        return plain(self, *args)

    monkeypatch.setattr(zero123._GraphedCall, "__call__", recording)
    prior = Zero123Prior.from_pretrained(Zero123Config(model=str(tiny_folder), image_size=SIZE))
    views = 2
    for fn, args in prior.warmup_calls(views, from_renders=iterations > 1):
        fn(*args)
    warm, seen[:] = set(seen), []
    cfg = SIRConfig(iterations=iterations, views=views, init_steps=1, recon_steps=1, image_size=SIZE,
                    white_check_size=SIZE, white_prune=False,
                    train=TrainConfig(num_pts=50, backend="torch", densify_end_iter=0))  # fmt: skip
    g = torch.Generator().manual_seed(0)
    ref = Reference(torch.rand(3, SIZE, SIZE, generator=g), torch.ones(1, SIZE, SIZE))
    run_sir(prior, ref, cfg, "cpu")
    assert warm == set(seen)
    names = {name for name, _ in warm}
    assert names == ({"UNet", "VAE decoder", "VAE encoder"} if iterations > 1 else {"UNet", "VAE decoder"})
    assert len({key for name, key in warm if name == "UNet"}) == (2 if iterations > 1 else 1)


def test_building_and_moving_models_logs_no_library_notices():
    """diffusers logs "modules ... should be kept in float32: []" on every .to() given a dtype argument
    (even None, even the same dtype); building and moving the components must log none of those, and
    the CLIP image processor must be one that needs no torchvision fallback warning."""
    import importlib.util
    import logging

    from microdreamer.priors.factory import build_random_zero123
    from microdreamer.priors.zero123 import clip_image_processor_class

    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    log = logging.getLogger("diffusers.models.modeling_utils")
    handler = Keep(level=logging.DEBUG)
    log.addHandler(handler)
    try:
        comps = build_random_zero123("tiny", 0, torch.device("cpu"), torch.float32)
        comps.to("cpu", torch.float32)  # same dtype
        comps.to("cpu", torch.float64)  # a real cast: diffusers' notice lists no module ([])
    finally:
        log.removeHandler(handler)
    assert [r.getMessage() for r in records if "float32" in r.getMessage()] == []
    assert next(comps.unet.parameters()).dtype == torch.float64
    if importlib.util.find_spec("torchvision") is None:
        assert clip_image_processor_class().__name__.endswith("Pil")
