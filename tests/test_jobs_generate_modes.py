"""generate's three modes: image (Zero123), text (MVDream) and image+text (ImageDream), end to end on the
CPU with tiny random models; the mode follows the inputs, and each MVDream-family mode starts from its preset."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from PIL import Image

from microdreamer.cli import main
from microdreamer.config import DDIMConfig, ExportConfig, FieldConfig, SIRConfig, TextureConfig, TrainConfig
from microdreamer.errors import InputError
from microdreamer.jobs.generate import default_config, generate, generation_mode

SIZE = 64


def test_mode_follows_the_inputs():
    assert generation_mode("a.png", None) == "image"
    assert generation_mode(None, "a ghost") == "text"
    assert generation_mode("a.png", "a ghost") == "image+text"
    with pytest.raises(InputError, match="nothing to generate from"):
        generation_mode(None, None)


def test_mode_presets_are_upstreams_schedules():
    text, both, image = default_config("text"), default_config("image+text"), default_config("image")
    assert (text.sir.iterations, text.sir.views, text.sir.radius, text.sir.init_steps) == (31, 4, 2.5, 50)
    assert text.sir.elevation_range == (-10.0, 10.0) and text.mvdream.ddim.num_inference_steps == 50
    assert (
        both.sir.iterations,
        both.imagedream.ddim.num_inference_steps,
        both.imagedream.guidance_scale,
    ) == (31, 10, 2.0)
    assert both.sir.lambda_ref_rgb == both.sir.lambda_ref_mask == 0.0  # ImageDream: no reference-view loss
    assert image.sir.iterations == 21 and image.prior.model == "ashawkey/stable-zero123-diffusers"


def _tiny(cfg):
    sir = SIRConfig(iterations=2, views=4, init_steps=3, recon_steps=2, image_size=SIZE, white_check_size=SIZE,
                    radius=cfg.sir.radius, elevation_range=cfg.sir.elevation_range, lambda_ref_rgb=cfg.sir.lambda_ref_rgb,
                    lambda_ref_mask=cfg.sir.lambda_ref_mask, train=TrainConfig(num_pts=300, backend="torch",
                    densify_end_iter=0))  # fmt: skip
    ddim = DDIMConfig(num_inference_steps=10)
    export = ExportConfig(field=FieldConfig(resolution=32), texture=TextureConfig(mode="none"))
    export = replace(export, mesh=replace(export.mesh, threshold=0.05))
    return replace(cfg, image=replace(cfg.image, size=SIZE), sir=sir, export=export, views_size=32,
                   mvdream=replace(cfg.mvdream, image_size=SIZE, ddim=ddim),
                   imagedream=replace(cfg.imagedream, image_size=SIZE, ddim=ddim))  # fmt: skip


def _disc(path):
    yy, xx = np.mgrid[0:80, 0:80]
    a = np.clip(24.0 - np.hypot(yy - 40, xx - 40), 0, 1)
    img = np.zeros((80, 80, 4), np.uint8)
    img[..., 0], img[..., 1], img[..., 3] = 200, 90, (a * 255).astype(np.uint8)
    Image.fromarray(img, "RGBA").save(path)
    return path


@pytest.mark.parametrize("mode", ["text", "image+text"])
def test_mvdream_family_end_to_end(tmp_path, mode):
    image = _disc(tmp_path / "in.png") if mode == "image+text" else None
    cfg = _tiny(default_config(mode))
    out = tmp_path / "out"
    res = generate(image, out, cfg, random_weights="tiny", device="cpu", prompt="a red disc")
    timings = json.loads((out / "timings.json").read_text())
    assert timings["mode"] == mode and timings["prompt"] == "a red disc"
    assert timings["prior_stats"]["unet_calls"] > 0 and res["num_gaussians"] > 0
    files = ["mesh.glb", "splat.ply", "timings.json", "views.png"]
    assert sorted(p.name for p in out.iterdir()) == sorted(files + (["input_rgba.png"] if image else []))


def test_text_to_3d_from_the_command_line(tmp_path, capsys):
    preset = tmp_path / "tiny.yaml"
    preset.write_text(
        "image: {size: 64}\nmvdream: {image_size: 64, ddim: {num_inference_steps: 10}}\n"
        "sir: {iterations: 1, views: 4, init_steps: 3, recon_steps: 2, image_size: 64, white_check_size: 64,\n"
        "      radius: 2.5, lambda_ref_rgb: 0.0, lambda_ref_mask: 0.0, train: {num_pts: 300, backend: torch}}\n"
        "export: {field: {resolution: 32}, mesh: {threshold: 0.05}, texture: {mode: none}}\nviews_size: 32\n"
    )
    code = main(["generate", "--prompt", "a ghost", "-o", str(tmp_path / "o"), "--random-weights", "tiny",
                 "--device", "cpu", "--config", str(preset)])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    assert json.loads((tmp_path / "o" / "timings.json").read_text())["mode"] == "text"


def test_no_image_and_no_prompt_is_one_line(tmp_path, capsys):
    assert main(["generate", "-o", str(tmp_path / "o")]) == 2
    assert (
        capsys.readouterr().err.strip()
        == "error: nothing to generate from: give an input image, a --prompt, or both"
    )
