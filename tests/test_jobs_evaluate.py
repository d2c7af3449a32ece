"""``microdreamer evaluate`` (jobs/evaluate.py): upstream's renders (normalised mesh, 8 azimuths from +z,
white background), many assets in one call with a JSON each and a summary, 1.0 for a render scored
against itself, and one-line errors that leave nothing written. A tiny random CLIP stands in for bigG."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("transformers", reason="CLIP similarity needs transformers")

from microdreamer.config import EvaluateConfig  # noqa: E402
from microdreamer.jobs.evaluate import clip_views, evaluate, normalised_mesh  # noqa: E402
from microdreamer.mesh import Mesh, save_mesh  # noqa: E402
from microdreamer.metrics_clip import ClipImageEncoder, save_random_clip  # noqa: E402
from microdreamer.synthetic import sphere_mesh  # noqa: E402

S = 64


def _front_back_sphere(offset=(0.0, 0.0, 0.0), scale: float = 1.0) -> Mesh:
    """A sphere red where z > 0 (the front, seen from azimuth 0), blue behind, green where x > 0.4."""
    base = sphere_mesh(3)
    v = np.asarray(base.vertices, np.float32)
    colors = np.where(v[:, 2:3] > 0, [[0.9, 0.1, 0.1]], [[0.1, 0.1, 0.9]]).astype(np.float32)
    colors[v[:, 0] > 0.4] = [0.1, 0.9, 0.1]
    return Mesh(v * scale + np.asarray(offset, np.float32), base.faces, colors)


@pytest.fixture(scope="module")
def clip_folder(tmp_path_factory):
    return save_random_clip(tmp_path_factory.mktemp("clip") / "tiny", seed=1)


@pytest.fixture(scope="module")
def encoder(clip_folder):
    return ClipImageEncoder.from_pretrained(clip_folder)


def test_renders_are_upstreams_views_of_the_normalised_mesh():
    cfg = EvaluateConfig(size=S)
    views = clip_views(_front_back_sphere(), cfg)
    assert views.shape == (8, S, S, 3) and views.dtype == np.uint8
    assert views[:, 0, 0].tolist() == [[255, 255, 255]] * 8  # white background
    centre = views[:, S // 2, S // 2].astype(int)
    assert centre[0].argmax() == 0 and centre[4].argmax() == 2  # azimuth 0 from +z (red), 180 from -z
    assert centre[2].argmax() == 1  # azimuth 90 looks from +x (green)
    # the mesh is normalised by its bounding box: moved and scaled, the renders are the same
    moved = clip_views(_front_back_sphere(offset=(3.0, -1.0, 2.0), scale=7.0), cfg)
    assert np.abs(moved.astype(int) - views.astype(int)).max() <= 1
    v = normalised_mesh(_front_back_sphere(offset=(3.0, -1.0, 2.0), scale=7.0), 0.9).vertices
    np.testing.assert_allclose((v.max(0) - v.min(0)).max(), 1.8, rtol=1e-6)
    np.testing.assert_allclose((v.max(0) + v.min(0)) / 2, 0.0, atol=1e-6)


def test_evaluate_scores_many_assets_in_one_call(tmp_path, encoder):
    """Two job folders (their inputs read from timings.json) and a mesh file with an explicit image, one
    model: a JSON and a sheet per asset and a summary; a render given as the input image scores 1.0 in
    its own view."""
    from PIL import Image

    from microdreamer.jobs.evaluate import resolve_assets

    cfg = EvaluateConfig(size=S)
    front = clip_views(_front_back_sphere(), cfg)[0]
    Image.fromarray(front).save(tmp_path / "front.png")
    Image.fromarray(np.full((40, 40, 3), 90, np.uint8)).save(tmp_path / "grey.png")
    for name, scale in (("sphere", 1.0), ("job", 0.5)):
        (tmp_path / name).mkdir()
        save_mesh(_front_back_sphere(scale=scale), tmp_path / name / "mesh.glb")
        (tmp_path / name / "timings.json").write_text(json.dumps({"image": str(tmp_path / "front.png")}))
    mesh_file = save_mesh(_front_back_sphere(), tmp_path / "loose.glb")

    out = tmp_path / "eval"
    summary = evaluate([tmp_path / "sphere", tmp_path / "job"], [], out, cfg, device="cpu", encoder=encoder)
    assert sorted(p.name for p in out.iterdir()) == ["job.json", "job.png", "sphere.json", "sphere.png",
                                                      "summary.json"]  # fmt: skip
    on_disk = json.loads((out / "summary.json").read_text())
    assert on_disk["count"] == 2 and [a["name"] for a in on_disk["assets"]] == ["sphere", "job"]
    per = [json.loads((out / f"{n}.json").read_text()) for n in ("sphere", "job")]
    for p in per:
        assert len(p["per_view"]) == 8 and p["azimuths_deg"][:3] == [0.0, 45.0, 90.0]
        assert p["clip_similarity"] == pytest.approx(np.mean(p["per_view"]), abs=1e-7)
        assert p["image"] == str(tmp_path / "front.png") and p["colours"] == "vertex colours"
    assert on_disk["mean"] == pytest.approx(np.mean([p["clip_similarity"] for p in per]), abs=1e-7)
    assert summary["mean"] == on_disk["mean"]
    # the input image is this very render: 1 up to float32 rounding (it is embedded alone, the views in a
    # batch of 8: measured 3e-6)
    assert abs(per[0]["per_view"][0] - 1.0) < 1e-5
    assert max(per[0]["per_view"][1:]) < 1.0 - 1e-4
    assert Image.open(out / "sphere.png").size == (4 * S, 2 * S)
    # an explicit image wins over the recorded one; one image per asset pairs in order
    pairs = resolve_assets([tmp_path / "sphere", mesh_file], [tmp_path / "grey.png", tmp_path / "front.png"])
    assert [(a.name, a.image_path.name) for a in pairs] == [("sphere", "grey.png"), ("loose", "front.png")]


def test_cli_evaluate_with_a_model_folder(tmp_path, clip_folder, capsys):
    from PIL import Image

    from microdreamer import cli

    mesh_file = save_mesh(_front_back_sphere(), tmp_path / "a.glb")
    Image.fromarray(np.full((40, 40, 3), 200, np.uint8)).save(tmp_path / "in.png")
    args = ["evaluate", str(mesh_file), str(mesh_file), "--image", str(tmp_path / "in.png"), "-o",
            str(tmp_path / "out"), "--model", str(clip_folder), "--size", "32", "--views", "4", "--device", "cpu"]  # fmt: skip
    assert cli.main(args) == 0
    printed = capsys.readouterr().out
    assert "a_2" in printed and "mean of 2" in printed  # one name per asset
    one = json.loads((tmp_path / "out" / "a.json").read_text())
    assert len(one["per_view"]) == 4 and one["settings"]["size"] == 32 and one["model"] == str(clip_folder)


@pytest.mark.parametrize("case", ["missing_asset", "folder_without_mesh", "image_count", "no_image",
                                  "not_a_mesh", "missing_model"])  # fmt: skip
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, case, capsys, clip_folder):
    from PIL import Image

    from microdreamer import cli

    mesh_file = save_mesh(_front_back_sphere(), tmp_path / "a.glb")
    Image.fromarray(np.full((40, 40, 3), 200, np.uint8)).save(tmp_path / "in.png")
    (tmp_path / "empty").mkdir()
    (tmp_path / "notes.txt").write_text("x")
    assets, images, model = [str(mesh_file)], ["--image", str(tmp_path / "in.png")], str(clip_folder)
    if case == "missing_asset":
        assets = [str(tmp_path / "nope.glb")]
    elif case == "folder_without_mesh":
        assets = [str(tmp_path / "empty")]
    elif case == "image_count":
        assets, images = [str(mesh_file)] * 3, images * 2
    elif case == "no_image":
        images = []
    elif case == "not_a_mesh":
        assets = [str(tmp_path / "notes.txt")]
    else:
        model = str(tmp_path / "no-model")
    out = tmp_path / "out"
    code = cli.main(["evaluate", *assets, *images, "-o", str(out), "--model", model, "--size", "32",
                     "--device", "cpu"])  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("error: ") and "\n" not in err, err
    assert not out.exists()
