"""CLIP image similarity (metrics_clip.py) on a tiny random CLIP saved and reloaded in the transformers
format: 1 for an image against itself, symmetric, bounded, upstream's embedding, upstream's uint8
conversions, and one-line errors for missing models."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("transformers", reason="CLIP similarity needs transformers")

from microdreamer.errors import InputError  # noqa: E402
from microdreamer.metrics_clip import (  # noqa: E402
    ClipImageEncoder,
    read_image_on_white,
    resolve_clip_path,
    save_random_clip,
    upstream_uint8,
)


@pytest.fixture(scope="module")
def clip_folder(tmp_path_factory):
    return save_random_clip(tmp_path_factory.mktemp("clip") / "tiny", seed=1)


@pytest.fixture(scope="module")
def encoder(clip_folder):
    return ClipImageEncoder.from_pretrained(clip_folder)


def _images(n: int, seed: int, shape=(48, 40, 3)) -> list[np.ndarray]:
    g = np.random.default_rng(seed)
    return [g.integers(0, 256, shape, dtype=np.uint8) for _ in range(n)]


def test_an_image_against_itself_is_one(encoder):
    for img in _images(4, seed=2):
        assert abs(float(encoder.similarity(img, [img])[0]) - 1.0) < 1e-6


def test_similarity_is_symmetric_and_bounded_on_random_inputs(encoder):
    imgs = _images(6, seed=3) + [np.zeros((30, 30, 3), np.uint8), np.full((64, 20, 3), 255, np.uint8)]
    sims = torch.stack([encoder.similarity(a, imgs) for a in imgs])  # [8, 8]
    torch.testing.assert_close(sims, sims.T, rtol=0, atol=1e-6)
    assert sims.abs().max() <= 1.0 + 1e-6
    off = sims[~torch.eye(len(imgs), dtype=torch.bool)]
    assert off.max() < 1.0 - 1e-4  # different images are not scored as one (the test can fail)


def test_embedding_is_upstreams_get_image_features_normalised(encoder, clip_folder):
    """``clip_sim.py``: ``CLIPModel.get_image_features`` of the processor's pixels, divided by its norm,
    one image at a time; ours runs batches through the vision tower and the projection."""
    from transformers import CLIPImageProcessor, CLIPModel

    model = CLIPModel.from_pretrained(clip_folder).eval()
    processor = CLIPImageProcessor.from_pretrained(clip_folder)
    imgs = _images(5, seed=4)
    want = []
    with torch.no_grad():
        for img in imgs:
            out = model.get_image_features(
                pixel_values=processor(images=img, return_tensors="pt").pixel_values
            )
            feats = out if isinstance(out, torch.Tensor) else out.pooler_output
            want.append(feats / feats.norm(dim=-1, keepdim=True))
    got = encoder.embed(imgs, batch=2)
    torch.testing.assert_close(got, torch.cat(want), rtol=1e-5, atol=1e-6)  # batching: float32 rounding
    sims = encoder.similarity(imgs[0], imgs)
    torch.testing.assert_close(sims, (torch.cat(want) @ want[0][0]), rtol=1e-5, atol=1e-6)


def test_the_saved_model_reloads_as_the_same_function(clip_folder, tmp_path, encoder):
    again = ClipImageEncoder.from_pretrained(save_random_clip(tmp_path / "again", seed=1))
    imgs = _images(3, seed=5)
    assert torch.equal(again.embed(imgs), encoder.embed(imgs))
    other = ClipImageEncoder.from_pretrained(save_random_clip(tmp_path / "other", seed=2))
    assert not torch.equal(other.embed(imgs), encoder.embed(imgs))
    assert not hasattr(encoder.model, "text_model")  # the text tower is dropped


def test_uint8_conversions_are_upstreams(tmp_path):
    from PIL import Image

    assert upstream_uint8(np.array([[[0.999, 0.5, 1.0]]], np.float32)).tolist() == [
        [[254, 127, 255]]
    ]  # truncated
    rgba = np.array([[[200, 100, 0, 255], [200, 100, 0, 0], [200, 100, 0, 128]]], np.uint8)
    Image.fromarray(rgba, "RGBA").save(tmp_path / "a.png")
    got = read_image_on_white(tmp_path / "a.png")
    a = np.float32(128) / np.float32(255)
    x = np.array([200, 100, 0], np.float32) / np.float32(255)
    half = ((x * a + (np.float32(1) - a)) * np.float32(255)).astype(np.uint8)
    assert got.tolist() == [[[200, 100, 0], [255, 255, 255], half.tolist()]]
    Image.fromarray(rgba[..., :3], "RGB").save(tmp_path / "b.png")
    assert read_image_on_white(tmp_path / "b.png").tolist() == rgba[..., :3].tolist()  # no alpha: as is
    (tmp_path / "c.png").write_text("not an image")
    with pytest.raises(InputError, match="cannot read"):
        read_image_on_white(tmp_path / "c.png")


def test_missing_models_are_one_line_errors(tmp_path, clip_folder, monkeypatch):
    import shutil

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(InputError) as e:
        resolve_clip_path("laion/CLIP-ViT-bigG-14-laion2B-39B-b160k", cache_dir=tmp_path / "empty-cache")
    assert "not in the local Hugging Face cache" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(InputError, match="no such folder"):
        resolve_clip_path(tmp_path / "nowhere")
    broken = tmp_path / "broken"
    shutil.copytree(clip_folder, broken)
    (broken / "preprocessor_config.json").unlink()
    with pytest.raises(InputError, match="lacks preprocessor_config.json"):
        resolve_clip_path(broken)


def test_a_repo_id_is_found_in_a_local_hf_cache(tmp_path, clip_folder, monkeypatch):
    """Lay the folder out as a Hugging Face cache snapshot and load it by repo id, offline."""
    import shutil

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    repo = tmp_path / "cache" / "models--org--tiny-clip"
    snap = repo / "snapshots" / ("0" * 40)
    shutil.copytree(clip_folder, snap)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    assert resolve_clip_path("org/tiny-clip", cache_dir=tmp_path / "cache") == snap
