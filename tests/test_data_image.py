"""Input preparation: alpha, the RGB fallbacks (rembg gate, GrabCut), recentring, white compositing,
bad inputs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from microdreamer.data import image as data_image
from microdreamer.data.image import ImageConfig, prepare_image, recenter
from microdreamer.errors import InputError

SAMPLES = Path(__file__).parents[1] / ".." / "shared" / "samples" / "images"


def _rgba_rect(h=120, w=160, box=(20, 50, 50, 90), color=(200, 40, 10)) -> np.ndarray:
    """uint8 RGBA: an opaque rectangle rows box[0]:box[1], columns box[2]:box[3], transparent elsewhere."""
    img = np.zeros((h, w, 4), np.uint8)
    y0, y1, x0, x1 = box
    img[y0:y1, x0:x1, :3] = color
    img[y0:y1, x0:x1, 3] = 255
    return img


def _bbox(mask: np.ndarray, thr: float = 0.5) -> tuple[int, int, int, int]:
    ys, xs = np.nonzero(mask > thr)
    return ys.min(), ys.max() + 1, xs.min(), xs.max() + 1


@pytest.mark.parametrize("size,fraction", [(256, 0.8), (64, 0.5), (97, 1.0)])
def test_rgba_is_recentred_and_scaled_to_the_fraction(tmp_path, size, fraction):
    img = _rgba_rect()  # 30 x 40 object, off-centre
    Image.fromarray(img, "RGBA").save(tmp_path / "in.png")
    p = prepare_image(tmp_path / "in.png", ImageConfig(size=size, object_fraction=fraction))
    assert p.method == "alpha"
    assert p.rgb.shape == (3, size, size) and p.mask.shape == (1, size, size)
    y0, y1, x0, x1 = _bbox(p.mask[0].numpy())
    long_side = fraction * size
    # resampling blurs the edge by about a pixel: the half-alpha box is within 1.5 px of the target
    assert abs((x1 - x0) - long_side) <= 1.5
    assert abs((y1 - y0) - long_side * 30 / 40) <= 1.5
    assert abs((x0 + x1) / 2 - size / 2) <= 1.0 and abs((y0 + y1) / 2 - size / 2) <= 1.0
    rgb = p.rgb.numpy()
    inside = rgb[:, (y0 + y1) // 2, (x0 + x1) // 2]
    np.testing.assert_allclose(inside, np.array([200, 40, 10]) / 255, atol=1e-5)  # opaque: colour kept
    np.testing.assert_allclose(rgb[:, 0, 0], 1.0, atol=0)  # background: white


def test_compositing_on_white_is_premultiplied():
    """A half-transparent black square composites to 0.5 grey; no dark fringe from resampling."""
    rgb = np.zeros((40, 40, 3), np.float32)
    alpha = np.zeros((40, 40), np.float32)
    alpha[10:30, 10:30] = 0.5
    out, a = recenter(rgb, alpha, ImageConfig(size=40, object_fraction=0.5))
    np.testing.assert_allclose(out[20, 20], 0.5, atol=1e-6)
    np.testing.assert_allclose(
        out, np.broadcast_to(1.0 - a[..., None], out.shape), atol=1e-6
    )  # black: 1 - alpha
    assert out.min() >= 0.5 - 1e-6  # nothing darker than the object itself (no halo)


def test_recenter_off_keeps_the_framing():
    img = _rgba_rect(64, 64, (0, 32, 0, 32)).astype(np.float32) / 255
    out, a = recenter(img[..., :3], img[..., 3], ImageConfig(size=32, recenter=False))
    assert a[:14, :14].min() > 0.99 and a[18:, 18:].max() < 0.01  # bilinear blurs the edge by ~2 px


def _disc_on_noise(seed=0, h=96, w=96, r=26):
    g = np.random.default_rng(seed)
    img = (0.45 + 0.08 * g.standard_normal((h, w, 3))).clip(0, 1)  # grey noisy background
    yy, xx = np.mgrid[0:h, 0:w]
    disc = np.hypot(yy - h / 2 - 4, xx - w / 2 + 6) < r
    img[disc] = np.array([0.85, 0.15, 0.1]) + 0.03 * g.standard_normal((int(disc.sum()), 3))
    return (img.clip(0, 1) * 255).astype(np.uint8), disc


def test_grabcut_finds_a_distinct_object():
    pytest.importorskip("cv2", reason="GrabCut needs opencv-python-headless")
    img, disc = _disc_on_noise()
    mask = data_image.mask_grabcut(img.astype(np.float32) / 255) > 0.5
    iou = (mask & disc).sum() / (mask | disc).sum()
    assert iou > 0.9  # measured 1.0 on seeds 0-5 of these synthetic discs


def test_rgb_input_falls_back_to_grabcut_when_rembg_is_not_usable(tmp_path, monkeypatch):
    pytest.importorskip("cv2", reason="GrabCut needs opencv-python-headless")
    monkeypatch.setattr(data_image, "rembg_usable", lambda model="u2net": False)
    img, _ = _disc_on_noise(1)
    Image.fromarray(img, "RGB").save(tmp_path / "in.jpg", quality=95)
    p = prepare_image(tmp_path / "in.jpg", ImageConfig(size=64))
    assert p.method == "grabcut"
    y0, y1, x0, x1 = _bbox(p.mask[0].numpy())
    assert abs((x1 - x0) - 0.8 * 64) <= 2.0 and abs((y1 - y0) - 0.8 * 64) <= 2.0  # a disc: square box
    # a fully opaque RGBA file is treated like RGB (its alpha says nothing)
    opaque = np.concatenate([img, np.full(img.shape[:2] + (1,), 255, np.uint8)], -1)
    assert prepare_image(opaque, ImageConfig(size=64)).method == "grabcut"


def test_rembg_is_used_only_when_installed_with_its_model_on_disk(tmp_path, monkeypatch):
    monkeypatch.setenv("U2NET_HOME", str(tmp_path))
    assert data_image.rembg_model_path("u2net") == tmp_path / "u2net.onnx"
    assert not data_image.rembg_usable("u2net")  # no model file: never used (nothing is downloaded)
    img, _ = _disc_on_noise(2)
    with pytest.raises(InputError, match="not on disk") as err:
        prepare_image(img, ImageConfig(size=32, background="rembg"))
    assert "\n" not in str(err.value)


def test_no_background_remover_is_one_line_error(monkeypatch):
    monkeypatch.setattr(data_image, "rembg_usable", lambda model="u2net": False)
    monkeypatch.setattr(data_image.importlib.util, "find_spec", lambda name: None)
    img, _ = _disc_on_noise(3)
    with pytest.raises(InputError, match="RGBA") as err:
        prepare_image(img, ImageConfig(size=32))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("case", ["missing", "not_an_image", "empty_alpha", "alpha_method_on_opaque"])
def test_bad_inputs_are_one_line_input_errors(tmp_path, case):
    cfg = ImageConfig(size=32)
    if case == "missing":
        src, expect = tmp_path / "nope.png", "no such image file"
    elif case == "not_an_image":
        src = tmp_path / "x.png"
        src.write_text("hello")
        expect = "cannot read the image"
    elif case == "empty_alpha":
        src = tmp_path / "clear.png"
        Image.fromarray(np.zeros((16, 16, 4), np.uint8), "RGBA").save(src)
        expect = "mask is empty"
    else:
        src = tmp_path / "rgb.png"
        Image.fromarray(np.full((16, 16, 3), 128, np.uint8), "RGB").save(src)
        cfg = ImageConfig(size=32, background="alpha")
        expect = "no transparency"
    with pytest.raises(InputError, match=expect) as err:
        prepare_image(src, cfg)
    assert "\n" not in str(err.value)


def test_palette_and_grey_alpha_images_use_their_transparency(tmp_path):
    img = _rgba_rect(40, 40, (10, 30, 5, 25))
    la = Image.fromarray(img, "RGBA").convert("LA")
    la.save(tmp_path / "la.png")
    assert prepare_image(tmp_path / "la.png", ImageConfig(size=32)).method == "alpha"
    pal = Image.fromarray(img[..., :3], "RGB").convert("P")
    pal.info["transparency"] = 0  # palette entry of the black background
    pal.save(tmp_path / "p.png", transparency=0)
    assert prepare_image(tmp_path / "p.png", ImageConfig(size=32)).method == "alpha"


def test_sample_rgba_images():
    if not SAMPLES.is_dir():
        pytest.skip(f"sample images not found at {SAMPLES} (shared/samples is not beside the repo)")
    for name in ("ghost_rgba.png", "teapot_rgba.png"):
        p = prepare_image(SAMPLES / name)
        assert p.method == "alpha" and p.rgb.shape == (3, 256, 256)
        y0, y1, x0, x1 = _bbox(p.mask[0].numpy(), 0.5 / 255)
        assert max(y1 - y0, x1 - x0) == pytest.approx(0.8 * 256, abs=2)
        # round trip through straight RGBA: composite again on white gives the same image
        rgba = p.rgba_uint8().astype(np.float32) / 255
        again = rgba[..., :3] * rgba[..., 3:] + (1 - rgba[..., 3:])
        np.testing.assert_allclose(again, p.rgb.permute(1, 2, 0).numpy(), atol=2.5 / 255)  # 8-bit rounding


def test_grabcut_is_said_and_the_cut_out_saved(tmp_path, monkeypatch, caplog):
    """An RGB input's GrabCut mask is announced (a warning: it is a rough cut), and the prepared view
    saves as an RGBA PNG whose alpha is the mask the model is given."""
    pytest.importorskip("cv2", reason="GrabCut needs opencv-python-headless")
    monkeypatch.setattr(data_image, "rembg_usable", lambda model="u2net": False)
    img, _ = _disc_on_noise(1)
    Image.fromarray(img, "RGB").save(tmp_path / "in.png")
    with caplog.at_level("WARNING", logger="microdreamer.data.image"):
        p = prepare_image(tmp_path / "in.png", ImageConfig(size=64))
    assert any("GrabCut" in r.getMessage() and r.levelname == "WARNING" for r in caplog.records)
    saved = np.asarray(Image.open(p.save(tmp_path / "input_rgba.png")))
    assert saved.shape == (64, 64, 4)
    np.testing.assert_allclose(saved[..., 3] / 255.0, p.mask[0].numpy(), atol=0.5 / 255 + 1e-6)
    caplog.clear()
    with caplog.at_level("WARNING", logger="microdreamer.data.image"):
        prepare_image(_rgba_rect(), ImageConfig(size=64))  # its own alpha: nothing to warn about
    assert not caplog.records
