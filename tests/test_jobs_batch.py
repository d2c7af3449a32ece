"""Batches (jobs/batch.py and the CLI's batch shape): inputs and outputs planned, a failing input reported
and skipped, summary.json and the table, existing outputs skipped, and the Ray workers: the same files
as the single-process batch, a worker killed mid-task retried on a restarted worker."""

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from microdreamer.cli import main
from microdreamer.errors import InputError
from microdreamer.jobs import batch

PRESET = Path(__file__).resolve().parents[1] / "src" / "microdreamer" / "presets" / "tiny.yaml"
TINY = ["--random-weights", "tiny", "--device", "cpu", "--config", PRESET]


def run_cli(*args):
    return main([str(a) for a in args])


def _disc(path, size=(96, 128), centre=(40, 50), radius=20.0, rgb=(230, 120, 30)):
    """An RGBA PNG of a soft-edged disc (an object on a transparent background)."""
    from PIL import Image

    yy, xx = np.mgrid[0 : size[0], 0 : size[1]]
    a = np.clip(radius - np.hypot(yy - centre[0], xx - centre[1]), 0, 1)
    img = np.zeros((*size, 4), np.uint8)
    img[..., :3] = rgb
    img[..., 3] = (a * 255).astype(np.uint8)
    Image.fromarray(img, "RGBA").save(path)
    return path


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """Three inputs in a folder: two discs and b.png, which is not an image."""
    folder = tmp_path_factory.mktemp("images")
    _disc(folder / "a.png")
    (folder / "b.png").write_text("not an image")
    _disc(folder / "c.png", size=(80, 80), centre=(44, 36), radius=18.0, rgb=(40, 200, 60))
    (folder / "notes.txt").write_text("not an input: wrong suffix")
    return folder


@pytest.fixture(scope="module")
def local_batch(images, tmp_path_factory):
    """The single-process batch of ``images`` through the CLI: (exit status, output folder, stdout)."""
    pytest.importorskip("diffusers", reason="generate needs diffusers")
    out = tmp_path_factory.mktemp("batch") / "out"
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = run_cli("generate", images, "-o", out, *TINY)
    return rc, out, buf.getvalue()


# ------------------------------------------------------------------------------------------ planning
def test_inputs_from_files_and_folders(tmp_path):
    for name in ("b.png", "a.PNG", ".hidden.png", "x.txt"):
        (tmp_path / name).write_bytes(b"")
    (tmp_path / "sub").mkdir()
    found = batch.collect_inputs(
        [tmp_path, tmp_path / "b.png", tmp_path / "missing.jpg"], batch.IMAGE_SUFFIXES, "image"
    )
    # the folder's images sorted, hidden and other suffixes left out; b.png once; a missing file kept
    assert [p.name for p in found] == ["a.PNG", "b.png", "missing.jpg"]
    with pytest.raises(InputError, match="holds no image"):
        batch.collect_inputs([tmp_path / "sub"], batch.IMAGE_SUFFIXES, "image")


def test_plan_names_outputs_by_stem_and_refuses_collisions(tmp_path):
    job = batch.MeshJob()
    items = batch.plan([Path("x/a.ply"), Path("y/b.ply")], tmp_path / "out", job)
    assert [(i.name, i.output) for i in items] == [
        ("a", tmp_path / "out/a.glb"),
        ("b", tmp_path / "out/b.glb"),
    ]
    assert batch.plan([Path("a.png")], tmp_path, batch.GenerateJob())[0].output == tmp_path / "a"
    with pytest.raises(InputError, match="both would write"):
        batch.plan([Path("x/a.ply"), Path("y/a.ply")], tmp_path, job)
    (tmp_path / "file").write_text("")
    with pytest.raises(InputError, match="not a folder"):
        batch.plan([Path("a.ply")], tmp_path / "file", job)


def test_job_pickles_without_what_setup_built():
    import pickle

    job = batch.MeshJob(device="cpu")
    job._device = object()  # what setup builds stays in the process
    clone = pickle.loads(pickle.dumps(job))
    assert clone == batch.MeshJob(device="cpu") and not hasattr(clone, "_device")


# ---------------------------------------------------------------------------------- generate, local
def test_generate_batch_skips_a_failing_image_and_exits_1(local_batch):
    rc, out, printed = local_batch
    assert rc == 1
    assert sorted(p.name for p in out.iterdir()) == ["a", "c", "summary.json"]  # no b/, no temporary folder
    for name in ("a", "c"):
        assert sorted(p.name for p in (out / name).iterdir()) == sorted(batch.GenerateJob.FILES)
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["inputs"], summary["ok"], summary["failed"], summary["skipped"]) == (3, 2, 1, 0)
    assert [f["input"].endswith("b.png") for f in summary["failures"]] == [True]
    assert "cannot read the image" in summary["failures"][0]["error"]
    from microdreamer.splat import read_ply

    by_name = {i["name"]: i for i in summary["items"]}
    for name in ("a", "c"):
        assert by_name[name]["num_gaussians"] == len(read_ply(out / name / "splat.ply")) > 0
        assert by_name[name]["seconds"] > 0 and by_name[name]["details"]["mesh_faces"] > 0
    assert summary["setup_seconds"][0].keys() >= {"load_model", "warmup"} and summary["engine"] == "local"
    table = printed.splitlines()
    assert table[0].split()[:4] == ["input", "status", "seconds", "Gaussians"]
    assert [line.split()[:2] for line in table[1:4]] == [["a", "ok"], ["b", "failed"], ["c", "ok"]]
    assert "2 ok, 1 failed, 0 skipped of 3" in printed


def test_batch_outputs_equal_single_image_runs(local_batch, images, tmp_path):
    """An image's outputs do not depend on its place in the batch: c (third, after a) matches a
    single-image call, which keeps writing into -o itself."""
    _, out, _ = local_batch
    single = tmp_path / "single"
    assert run_cli("generate", images / "c.png", "-o", single, *TINY) == 0
    assert sorted(p.name for p in single.iterdir()) == sorted(batch.GenerateJob.FILES)
    assert (single / "splat.ply").read_bytes() == (out / "c" / "splat.ply").read_bytes()


def test_generate_batch_loads_the_model_given_by_model(local_batch, images, tmp_path):
    """--model reaches the batch's job: the tiny random model saved in the diffusers layout and loaded
    back gives the random-weights batch's splat byte for byte; a missing folder is named in the error."""
    from microdreamer.priors.factory import build_random_zero123, save_zero123

    _, out, _ = local_batch
    folder = save_zero123(build_random_zero123("tiny", seed=0), tmp_path / "zero123-tiny")
    inputs = tmp_path / "in"
    inputs.mkdir()
    for name in ("a.png", "c.png"):
        (inputs / name).write_bytes((images / name).read_bytes())
    tiny_from_disk = ["--model", folder, "--device", "cpu", "--config", PRESET]
    assert run_cli("generate", inputs, "-o", tmp_path / "out", *tiny_from_disk) == 0
    assert (tmp_path / "out" / "c" / "splat.ply").read_bytes() == (out / "c" / "splat.ply").read_bytes()
    missing = tmp_path / "no-such-model"
    assert run_cli("generate", inputs, "-o", tmp_path / "out2", "--model", missing, "--device", "cpu",
                   "--config", PRESET) != 0  # fmt: skip


def test_existing_outputs_are_skipped_unless_overwrite(local_batch, images, tmp_path, capsys):
    _, out, _ = local_batch
    again = tmp_path / "again"
    for name in ("a.png", "c.png"):
        (again / "in").mkdir(parents=True, exist_ok=True)
        (again / "in" / name).write_bytes((images / name).read_bytes())
    (again / "out").mkdir()
    for name in ("a", "c"):  # outputs from before
        (again / "out" / name).mkdir()
        for f in batch.GenerateJob.FILES:
            (again / "out" / name / f).write_bytes((out / name / f).read_bytes())
    stamp = (again / "out" / "a" / "splat.ply").stat().st_mtime_ns
    assert run_cli("generate", again / "in", "-o", again / "out", *TINY) == 0
    summary = json.loads((again / "out" / "summary.json").read_text())
    assert (summary["skipped"], summary["ok"], summary["setup_seconds"]) == (2, 0, [])  # nothing loaded
    assert (again / "out" / "a" / "splat.ply").stat().st_mtime_ns == stamp
    assert "0 ok, 0 failed, 2 skipped of 2" in capsys.readouterr().out


# ------------------------------------------------------------------------------------- bad batch input
def test_workers_without_ray_is_one_line(images, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    assert run_cli("generate", images, "-o", tmp_path / "out", "--workers", 2, *TINY) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == "error: " + batch.RAY_MISSING.format(flag="--workers")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "args, message",
    [
        (["one.png", "--workers", "2"], "--workers: runs batches"),
        (["one.png", "--ray-address", "auto"], "--ray-address: runs batches"),
    ],
)
def test_distributed_flags_need_a_batch(tmp_path, capsys, args, message):
    _disc(tmp_path / "one.png")
    args = [tmp_path / args[0], *args[1:]]
    assert run_cli("generate", *args, "-o", tmp_path / "out", *TINY) == 2
    assert message in capsys.readouterr().err and not (tmp_path / "out").exists()


# --------------------------------------------------------------------------------------- mesh batches
def _splats(folder, n=2):
    from microdreamer.splat import write_ply
    from microdreamer.synthetic import make_synthetic_object

    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        write_ply(make_synthetic_object(800, seed=10 + i, scale_fraction=0.04), folder / f"s{i}.ply")
    return folder


MESH_FLAGS = ["--resolution", 24, "--texture", "none", "--device", "cpu"]


def test_mesh_batch_one_file_per_splat(tmp_path, capsys):
    src = _splats(tmp_path / "in")
    (src / "broken.ply").write_text("ply\nnonsense")
    assert run_cli("mesh", src, "-o", tmp_path / "out", *MESH_FLAGS) == 1
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["s0.glb", "s1.glb", "summary.json"]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["job"] == "mesh" and (summary["ok"], summary["failed"]) == (2, 1)
    assert summary["failures"][0]["input"].endswith("broken.ply")
    assert {i["name"]: i["num_gaussians"] for i in summary["items"]} == {"broken": None, "s0": 800, "s1": 800}
    # the same splat alone keeps today's command shape and gives the same file
    assert run_cli("mesh", src / "s1.ply", "-o", tmp_path / "single.glb", *MESH_FLAGS) == 0
    assert (tmp_path / "single.glb").read_bytes() == (tmp_path / "out" / "s1.glb").read_bytes()
    capsys.readouterr()
    assert run_cli("mesh", src / "s0.ply", src / "s1.ply", "-o", tmp_path / "m.glb", *MESH_FLAGS) == 2
    assert "give an output folder" in capsys.readouterr().err and not (tmp_path / "m.glb").exists()


# ------------------------------------------------------------------------------------------------ Ray
@dataclass
class DieOnce(batch.MeshJob):
    """A mesh job whose process dies (os._exit) in the middle of ``victim``'s task the first time."""

    victim: str = ""
    marker: str = ""

    def run(self, item):
        if item.name == self.victim and not os.path.exists(self.marker):
            Path(self.marker).write_text(str(os.getpid()))
            os._exit(1)
        return super().run(item)


def test_ray_workers_retry_a_killed_task_and_match_the_local_batch(tmp_path):
    """Two CPU workers on a local Ray cluster: s1's worker dies mid-task, Ray restarts it and retries
    the task once; every mesh is byte-identical to the single-process batch's."""
    ray = pytest.importorskip("ray", reason="the Ray test needs ray (pip install -e '.[distributed]')")
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # DieOnce lives in this test file
    src = _splats(tmp_path / "in", n=3)
    from microdreamer.config import ExportConfig, FieldConfig, TextureConfig

    cfg = ExportConfig(field=FieldConfig(resolution=24), texture=TextureConfig(mode="none"))
    items = batch.plan(
        batch.collect_inputs([src], batch.SPLAT_SUFFIXES, "splat"), tmp_path / "local", batch.MeshJob()
    )
    local = batch.run_local(batch.MeshJob(cfg, "cpu"), items)
    assert [r.status for r in local.results] == ["ok"] * 3

    marker = tmp_path / "killed.pid"
    job = DieOnce(cfg, "cpu", victim="s1", marker=str(marker))
    remote_items = batch.plan([i.input for i in items], tmp_path / "ray", job)
    seen = []
    report = batch.run_ray(
        job, remote_items, workers=2, report=lambda r, done, n: seen.append((r.name, done))
    )
    assert [r.status for r in report.results] == ["ok"] * 3, [r.error for r in report.results]
    assert report.engine == "ray" and report.workers == 2 and len(seen) == 3
    assert marker.exists()  # the kill happened...
    assert report.results[1].worker.split("@")[0] != marker.read_text()  # ...and a new process redid it
    for a, b in zip(local.results, report.results, strict=True):
        assert Path(a.output).read_bytes() == Path(b.output).read_bytes()
    assert not ray.is_initialized()  # the local cluster it started is stopped


@pytest.mark.slow
def test_generate_on_two_ray_workers_gives_the_local_batch_files(local_batch, images, tmp_path, capsys):
    """`--workers 2` (a local Ray cluster, CPU workers): the same files as the single-process batch,
    byte-identical splats, the same failure and exit status. Slow: each worker imports torch and
    diffusers and builds the model (~40 s on a 2-core machine)."""
    pytest.importorskip("ray", reason="the Ray test needs ray (pip install -e '.[distributed]')")
    _, out, _ = local_batch
    ray_out = tmp_path / "ray"
    assert run_cli("generate", images, "-o", ray_out, "--workers", 2, *TINY) == 1
    assert sorted(p.name for p in ray_out.iterdir()) == ["a", "c", "summary.json"]
    for name in ("a", "c"):
        assert (ray_out / name / "splat.ply").read_bytes() == (out / name / "splat.ply").read_bytes()
    summary = json.loads((ray_out / "summary.json").read_text())
    assert summary["engine"] == "ray" and summary["workers"] == 2
    assert [f["input"].endswith("b.png") for f in summary["failures"]] == [True]
