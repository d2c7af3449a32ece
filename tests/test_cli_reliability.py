"""Issue 43 (reliability round 3), one test per class of failure, through the command line: exit status,
the one ``error:`` line, and a snapshot of the folder before and after.

1. lost user files (a batch input named ``..png``; a batch into an existing ``OUT/<stem>/``);
2. reads and writes outside the folders given (an OBJ's ``mtllib`` / ``map_Kd``, a ``file_path`` of
   ``transforms.json``, by ``..``, an absolute name or a symlink);
3. one output folder mixing two runs (a run's lock; an earlier run's files replaced as one);
5. tracebacks instead of one line (a full disk, an output parent that is a file, decompression bombs in
   a mesh's texture, float32 overflow, integer flags, Ray addresses, long names, a closed stdout, argparse);
6. work before the last check (view --serve, profile, a batch's summary.json, a folder named x.glb, sizes);
7. signals (a second Ctrl-C during the clean-up, SIGHUP, a killed run's temporaries).

No test here kills its subject on a timer: subprocesses run to their end.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from microdreamer.cli import main
from microdreamer.splat import write_ply
from microdreamer.synthetic import make_synthetic_object

SRC = str(Path(__file__).resolve().parents[1] / "src")
FAST = ("--resolution", 16, "--texture", "none", "--device", "cpu")


def run_cli(*args):
    return main([str(a) for a in args])


def _snapshot(root):
    out = {}
    for p in sorted(Path(root).rglob("*")):
        out[str(p.relative_to(root))] = "dir" if p.is_dir() else p.read_bytes()
    return out


def _fails_cleanly(root, capsys, args, *fragments, rc=2):
    """The CLI exits ``rc`` with one ``error:`` line (the last of stderr) holding ``fragments``, no
    traceback, and nothing under ``root`` created or changed."""
    before = _snapshot(root)
    code = run_cli(*args)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == rc, err
    errors = [line for line in err if line.startswith("error:")]
    assert len(errors) == 1 and err[-1] == errors[0], err
    assert "Traceback" not in "\n".join(err)
    for frag in fragments:
        assert frag in errors[0], errors[0]
    assert _snapshot(root) == before
    return errors[0]


def _splat(folder, name="s.ply", seed=2):
    folder.mkdir(parents=True, exist_ok=True)
    write_ply(make_synthetic_object(400, seed=seed, scale_fraction=0.04), folder / name)
    return folder / name


def _png(path, size=(24, 24)):
    from PIL import Image

    Image.new("RGBA", size, (200, 100, 50, 255)).save(path, format="PNG")
    return path


def _dead_pid() -> int:
    """The id of a process that has ended (a killed run's)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _subprocess(script: str, *args, cwd=None):
    """Run ``script`` (python -c) with this tree first on the path; no timeout (CI's limit bounds it)."""
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-c", script, *map(str, args)], capture_output=True, text=True,
                          env=env, cwd=cwd)  # fmt: skip


# ------------------------------------------------------------------------------------ 1. lost user files
class _FakeGenerate:
    """generate's batch without a model: setup does nothing, each image writes the job's files."""

    @staticmethod
    def install(monkeypatch):
        from microdreamer.jobs import batch, generate

        def setup(self):
            self._config, self._prior, self._device = self.config, None, "cpu"
            return {}

        def fake(image, out, cfg, **kwargs):
            out = Path(out)
            out.mkdir(parents=True, exist_ok=True)
            for name in batch.GenerateJob.FILES:
                (out / name).write_text(f"{Path(image).name}: {name}")
            return {"num_gaussians": 1, "mesh_faces": 1, "stages": {}, "seconds_after_load": 0.0}

        monkeypatch.setattr(batch.GenerateJob, "setup", setup)
        monkeypatch.setattr(generate, "generate", fake)


def test_batch_input_named_dot_dot_png_never_replaces_out(tmp_path, capsys, monkeypatch):
    _FakeGenerate.install(monkeypatch)
    images = tmp_path / "in"
    images.mkdir()
    _png(images / "a.png")
    _png(images / "..png")
    out = tmp_path / "out"
    out.mkdir()
    (out / "mine.txt").write_text("the user's file")
    _fails_cleanly(tmp_path, capsys, ["generate", images / "a.png", images / "..png", "-o", out, "--random-weights",
                                      "tiny"], "..png", "rename the file")  # fmt: skip


def test_batch_keeps_the_users_files_in_an_existing_stem_folder(tmp_path, capsys, monkeypatch):
    _FakeGenerate.install(monkeypatch)
    images = tmp_path / "in"
    images.mkdir()
    _png(images / "a.png")
    _png(images / "b.png")
    out = tmp_path / "out"
    (out / "a").mkdir(parents=True)
    (out / "a" / "notes.txt").write_text("kept")
    (out / "a" / "profile.json").write_text("an earlier run's")  # the job's own name: replaced
    assert run_cli("generate", images, "-o", out, "--random-weights", "tiny", "--overwrite") == 0
    assert (out / "a" / "notes.txt").read_text() == "kept"
    assert not (out / "a" / "profile.json").exists()  # no mix of this run's files with an earlier run's
    assert (out / "a" / "splat.ply").read_text() == "a.png: splat.ply"
    assert sorted(p.name for p in out.iterdir()) == ["a", "b", "summary.json"]  # no temporaries, no lock


# ------------------------------------------------------------------------ 2. reads and writes outside
def _obj(folder, mtllib="m.mtl", texture="t.png"):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "m.obj").write_text(
        f"mtllib {mtllib}\nv 0 0 0\nv 1 0 0\nv 0 1 0\nvt 0 0\nvt 1 0\nvt 0 1\nusemtl a\nf 1/1 2/2 3/3\n"
    )
    (folder / "m.mtl").write_text(f"newmtl a\nmap_Kd {texture}\n")
    _png(folder / "t.png", (8, 8))
    return folder / "m.obj"


@pytest.mark.parametrize(
    ("mtllib", "texture"),
    [
        ("../../secret.mtl", "t.png"),
        ("m.mtl", "../../secret.png"),
        ("m.mtl", "/etc/hostname"),
        ("LINK", "t.png"),
    ],
)
def test_view_refuses_an_obj_naming_files_outside_its_folder(tmp_path, capsys, mtllib, texture):
    work = tmp_path / "work"
    mesh = _obj(work / "a" / "b", mtllib, texture)
    (tmp_path / "secret.mtl").write_text("newmtl a\n")
    _png(tmp_path / "secret.png", (8, 8))
    if mtllib == "LINK":  # a symlink beside the OBJ that points out of its folder
        (mesh.parent / "LINK").symlink_to(tmp_path / "secret.mtl")
    _fails_cleanly(tmp_path, capsys, ["view", mesh, "-o", work / "viewer"], "outside its folder" if not
                   texture.startswith("/") else "absolute path")  # fmt: skip


def _dataset(folder, file_path):
    folder.mkdir(parents=True, exist_ok=True)
    frames = []
    for i in range(2):
        _png(folder / f"r_{i}.png", (16, 16))
        m = np.eye(4)
        m[2, 3] = 3.0
        frames.append({"file_path": f"r_{i}.png", "transform_matrix": m.tolist()})
    frames[1]["file_path"] = file_path
    (folder / "transforms.json").write_text(json.dumps({"camera_angle_x": 0.8, "frames": frames}))
    return folder


@pytest.mark.parametrize("file_path", ["../outside.png", "SECRET_ABS", "sub/../../outside.png", "link.png"])
def test_reconstruct_refuses_a_file_path_outside_the_dataset(tmp_path, capsys, file_path):
    _png(tmp_path / "outside.png", (16, 16))
    if file_path == "SECRET_ABS":
        file_path = str(tmp_path / "outside.png")
    data = _dataset(tmp_path / "data", file_path)
    if file_path == "link.png":
        (data / "link.png").symlink_to(tmp_path / "outside.png")
    fragment = "absolute path" if file_path.startswith("/") else "outside its folder"
    _fails_cleanly(tmp_path, capsys, ["reconstruct", data, "-o", tmp_path / "out", "--iters", 1, "--no-mesh",
                                      "--device", "cpu"], fragment, "transforms.json")  # fmt: skip


# ------------------------------------------------------------------------------- 3. one run per folder
def test_a_second_run_into_a_folder_being_written_is_refused(tmp_path, capsys):
    data = _dataset(tmp_path / "data", "r_1.png")
    out = tmp_path / "out"
    sleeper = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        (tmp_path / ".out.lock").write_text(f"{sleeper.pid}\n")  # a live run holds out
        _fails_cleanly(tmp_path, capsys, ["reconstruct", data, "-o", out, "--iters", 1, "--no-mesh", "--device",
                                          "cpu"], "another microdreamer run", str(sleeper.pid))  # fmt: skip
    finally:
        sleeper.communicate(b"")


def test_a_run_replaces_an_earlier_runs_files_as_one_and_keeps_the_users(tmp_path):
    from microdreamer.io_utils import staged_folder

    out = tmp_path / "out"
    with staged_folder(out, owned=("a.txt", "profile.json")) as stage:
        stage.mkdir()
        (stage / "a.txt").write_text("run 1")
        (stage / "profile.json").write_text("run 1")
    (out / "user.txt").write_text("the user's")
    with staged_folder(out, owned=("a.txt", "profile.json")) as stage:
        stage.mkdir()
        (stage / "a.txt").write_text("run 2")
    assert _snapshot(tmp_path) == {"out": "dir", "out/a.txt": b"run 2", "out/user.txt": b"the user's"}
    before = _snapshot(tmp_path)
    with pytest.raises(RuntimeError), staged_folder(out, owned=("a.txt",)) as stage:  # a failed run
        stage.mkdir()
        (stage / "a.txt").write_text("run 3")
        raise RuntimeError("the job failed")
    assert _snapshot(tmp_path) == before


# ------------------------------------------------------------------------------------ 5. one line each
def test_a_full_disk_is_one_line_and_leaves_nothing(tmp_path, capsys, monkeypatch):
    src = _splat(tmp_path)

    def full(self, data):
        raise OSError(errno.ENOSPC, "No space left on device")  # as write() says it: no file named

    monkeypatch.setattr(Path, "write_bytes", full)
    _fails_cleanly(tmp_path, capsys, ["mesh", src, "-o", tmp_path / "m.glb", *FAST], "m.glb",
                   "No space left on device", "free space")  # fmt: skip


def test_a_full_disk_in_a_staged_job_is_one_line(tmp_path, capsys, monkeypatch):
    data = _dataset(tmp_path / "data", "r_1.png")
    import microdreamer.jobs.reconstruct as rec

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(rec, "write_ply", full, raising=False)
    monkeypatch.setattr(rec, "reconstruct_dataset", full)
    _fails_cleanly(tmp_path, capsys, ["reconstruct", data, "-o", tmp_path / "x" / "out", "--iters", 1, "--no-mesh",
                                      "--device", "cpu"], "out", "No space left on device")  # fmt: skip


@pytest.mark.parametrize(
    "command",
    [
        ["render-views", "MESH", "-o", "FILE/ds"],
        ["view", "MESH", "-o", "FILE/v"],
        ["evaluate", "MESH", "--image", "IMG", "-o", "FILE/e"],
        ["profile", "scaling", "SPLAT", "-o", "FILE/p", "--resolutions", "8", "--device", "cpu"],
        ["mesh", "SPLAT", "SPLAT2", "-o", "FILE/b/"],
    ],
)
def test_an_output_below_a_file_is_one_line_before_any_work(tmp_path, capsys, command):
    mesh = _obj(tmp_path / "m")
    splat, splat2 = _splat(tmp_path), _splat(tmp_path, "t.ply", 3)
    (tmp_path / "file").write_text("a file, not a folder")
    names = {"MESH": mesh, "SPLAT": splat, "SPLAT2": splat2, "IMG": tmp_path / "m" / "t.png"}
    args = [str(names.get(a, a)).replace("FILE", str(tmp_path / "file")) for a in command]
    _fails_cleanly(tmp_path, capsys, args, "is a file, not a folder")


def test_a_texture_that_is_a_decompression_bomb_is_one_line(tmp_path, capsys, monkeypatch):
    from PIL import Image

    mesh = _obj(tmp_path / "m")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 10)  # the 8x8 texture is a "bomb" (over twice the limit)
    _fails_cleanly(tmp_path, capsys, ["render-views", mesh, "--texture", mesh.parent / "t.png", "-o", tmp_path / "d",
                                      "--size", 16, "--views", 8, "--held-out", 1, "--device", "cpu"], "t.png", "decompression bomb")  # fmt: skip


@pytest.mark.parametrize(
    ("edit", "fragment"),
    [({"fl_x": 1e39}, "fl_x"), ({"frame0": 1e300}, "transform_matrix")],
)
def test_camera_values_past_float32_are_one_line(tmp_path, capsys, edit, fragment):
    data = _dataset(tmp_path / "data", "r_1.png")
    meta = json.loads((data / "transforms.json").read_text())
    if "frame0" in edit:
        meta["frames"][0]["transform_matrix"][0][3] = edit["frame0"]
    else:
        del meta["camera_angle_x"]
        meta.update(edit)
    (data / "transforms.json").write_text(json.dumps(meta))
    _fails_cleanly(tmp_path, capsys, ["reconstruct", data, "-o", tmp_path / "out", "--iters", 1, "--no-mesh",
                                      "--device", "cpu"], fragment)  # fmt: skip


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["render-views", "MESH", "-o", "OUT", "--seed", -1], "--seed -1"),
        (["render-views", "MESH", "-o", "OUT", "--seed", 2**64], "0 to 4294967295"),
        (["view", "MESH", "--port", 70000], "0 to 65535"),
        (["mesh", "SPLAT", "SPLAT", "-o", "OUT/", "--workers", 0], "--workers"),
        (["render-views", "MESH", "-o", "OUT", "--views", 1000000], "at most 10,000"),
        (["reconstruct", "DIR", "-o", "OUT", "--iters", 1000000000], "at most 1,000,000"),
        (["mesh"], "microdreamer mesh"),  # argparse's own error: the same one line
        (["frobnicate"], "invalid choice"),
    ],
)
def test_integer_flags_and_argparse_errors_are_one_line(tmp_path, capsys, args, fragment):
    mesh, splat = _obj(tmp_path / "m"), _splat(tmp_path)
    names = {"MESH": mesh, "SPLAT": splat, "OUT": tmp_path / "out", "OUT/": f"{tmp_path / 'out'}/",
             "DIR": tmp_path / "m"}  # fmt: skip
    before = _snapshot(tmp_path)
    try:
        code = run_cli(*[names.get(a, a) if isinstance(a, str) else a for a in args])
    except SystemExit as e:  # argparse exits from parse_args
        code = e.code
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error:") and fragment in err[0], err
    assert _snapshot(tmp_path) == before


def test_ray_address_garbage_and_no_cluster_are_one_line_and_bounded(tmp_path, capsys, monkeypatch):
    pytest.importorskip("ray", reason="the Ray flags need ray")
    from microdreamer.jobs import batch

    a, b = _splat(tmp_path), _splat(tmp_path, "t.ply", 3)
    _fails_cleanly(tmp_path, capsys, ["mesh", a, b, "-o", f"{tmp_path / 'o'}/", "--ray-address", "no such thing",
                                      *FAST], "not an address")  # fmt: skip
    with socket.socket() as s:  # a port that nothing listens on: refused at once
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setattr(batch, "RAY_CONNECT_S", 2.0)
    _fails_cleanly(tmp_path, capsys, ["mesh", a, b, "-o", f"{tmp_path / 'o'}/", "--ray-address",
                                      f"127.0.0.1:{port}", *FAST], "cannot reach it")  # fmt: skip


def test_a_legal_output_name_of_250_bytes_writes(tmp_path, capsys):
    src = _splat(tmp_path)
    out = tmp_path / ("n" * 251 + ".glb")  # 255 bytes: its temporary's name is shortened to fit
    assert run_cli("mesh", src, "-o", out, *FAST) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([out.name, "s.ply"])
    _fails_cleanly(
        tmp_path, capsys, ["mesh", src, "-o", tmp_path / ("n" * 256 + ".glb"), *FAST], "shorter name"
    )


def test_a_closed_stdout_is_one_line_not_a_traceback(tmp_path):
    src = _splat(tmp_path)
    script = "import sys\nfrom microdreamer.cli import main\nsys.exit(main(sys.argv[1:]))\n"
    env = {**os.environ, "PYTHONPATH": SRC}
    proc = subprocess.Popen([sys.executable, "-c", script, "mesh", str(src), "-o", str(tmp_path / "m.glb"),
                             *map(str, FAST)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)  # fmt: skip
    proc.stdout.close()  # the reader went away (| head -0)
    err = proc.stderr.read().decode()
    assert proc.wait() == 1, err
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith("error: standard output"), err


# ---------------------------------------------------------------------- 6. work before the last check
def test_view_serve_on_a_taken_port_builds_nothing(tmp_path, capsys):
    mesh = _obj(tmp_path / "m")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        _fails_cleanly(tmp_path, capsys, ["view", mesh, "-o", tmp_path / "v", "--serve", "--port", port],
                       "cannot listen")  # fmt: skip


def test_profile_refusing_every_resolution_leaves_no_folder(tmp_path, capsys):
    src = _splat(tmp_path)
    _fails_cleanly(tmp_path, capsys, ["profile", "scaling", src, "-o", tmp_path / "p", "--resolutions", "4096",
                                      "--device", "cpu"], "no grid resolution")  # fmt: skip


def test_a_batch_whose_summary_is_a_folder_writes_nothing(tmp_path, capsys):
    a, b = _splat(tmp_path / "in"), _splat(tmp_path / "in", "t.ply", 3)
    (tmp_path / "out" / "summary.json").mkdir(parents=True)
    _fails_cleanly(tmp_path, capsys, ["mesh", a, b, "-o", f"{tmp_path / 'out'}/", *FAST], "summary.json")


def test_a_folder_named_like_the_mesh_is_not_a_batch(tmp_path, capsys):
    src = _splat(tmp_path)
    (tmp_path / "x.glb").mkdir()
    _fails_cleanly(tmp_path, capsys, ["mesh", src, "-o", tmp_path / "x.glb", *FAST], "is a folder")


@pytest.mark.parametrize(
    ("yaml", "fragment"),
    [("views_size: 50000\n", "views_size"), ("sir:\n  iterations: 1000000000\n", "iterations"),
     ("sir:\n  seed: 18446744073709551616\n", "seed")],
)  # fmt: skip
def test_sizes_in_a_preset_are_weighed_before_any_work(tmp_path, capsys, yaml, fragment):
    (tmp_path / "p.yaml").write_text(yaml)
    _fails_cleanly(tmp_path, capsys, ["generate", "--prompt", "a cat", "-o", tmp_path / "out", "--config",
                                      tmp_path / "p.yaml", "--random-weights", "tiny"], fragment)  # fmt: skip


def test_a_large_yaml_is_refused_before_parsing(tmp_path, capsys):
    (tmp_path / "big.yaml").write_text("a: [" + "1, " * 5_000_000 + "1]\n")  # 15 MB
    _fails_cleanly(tmp_path, capsys, ["mesh", _splat(tmp_path), "-o", tmp_path / "m.glb", "--config",
                                      tmp_path / "big.yaml"], "KB")  # fmt: skip


# --------------------------------------------------------------------------------------------- 7. signals
_SIGNAL_SCRIPT = """
import os, signal, sys, pathlib
from microdreamer import io_utils
from microdreamer.cli import main
first, second = getattr(signal, sys.argv[1]), sys.argv[2]
orig_write, orig_remove = pathlib.Path.write_bytes, io_utils._remove
def write_then_signal(self, data):
    n = orig_write(self, data)
    os.kill(os.getpid(), first)  # the run ends here, its temporary written
    return n
def remove_under_fire(path):
    if second != "none" and ".tmp-" in path.name:
        os.kill(os.getpid(), getattr(signal, second))  # a second signal in the middle of the clean-up
    return orig_remove(path)
pathlib.Path.write_bytes = write_then_signal
io_utils._remove = remove_under_fire
sys.exit(main(sys.argv[3:]))
"""


@pytest.mark.parametrize(
    ("first", "second", "rc"),
    [("SIGINT", "SIGINT", 130), ("SIGINT", "none", 130), ("SIGHUP", "none", 129), ("SIGQUIT", "SIGINT", 130),
     ("SIGTERM", "SIGTERM", 143)],
)  # fmt: skip
def test_a_signal_and_a_second_during_the_clean_up_leave_nothing(tmp_path, first, second, rc):
    src = _splat(tmp_path)
    proc = _subprocess(_SIGNAL_SCRIPT, first, second, "mesh", src, "-o", tmp_path / "new" / "m.glb", *FAST)
    assert proc.returncode == rc, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] in ("error: interrupted", "error: terminated"), proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.ply"]  # no temporary, no folder made


def test_a_signal_during_a_staged_job_leaves_no_staging_folder(tmp_path):
    data = _dataset(tmp_path / "data", "r_1.png")
    script = _SIGNAL_SCRIPT.replace("pathlib.Path.write_bytes = write_then_signal\n", "").replace(
        "sys.exit(main", "import microdreamer.jobs.reconstruct as r\n"
        "def boom(*a, **k):\n    os.kill(os.getpid(), first)\n"
        "r.reconstruct_dataset = boom\nsys.exit(main"
    )  # fmt: skip
    proc = _subprocess(script, "SIGHUP", "SIGINT", "reconstruct", data, "-o", tmp_path / "out", "--no-mesh",
                       "--iters", 1, "--device", "cpu")  # fmt: skip
    assert proc.returncode == 130, proc.stderr  # the second signal's status: it came last
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data"]


def test_temporaries_of_a_killed_run_are_removed_by_the_next_and_reported(tmp_path, capsys, caplog):
    src = _splat(tmp_path)
    pid = _dead_pid()
    (tmp_path / f".m.tmp-{pid}.glb").write_bytes(b"half a mesh")  # atomic_path's, killed mid-write
    (tmp_path / f".out.tmp-{pid}").mkdir()  # a staged folder's, killed mid-job
    (tmp_path / f".out.tmp-{pid}" / "splat.ply").write_bytes(b"half")
    (tmp_path / ".out.lock").write_text(f"{pid}\n")  # and its lock
    (tmp_path / ".other.tmp-1.glb").write_bytes(b"not ours to judge")  # another target's: left alone
    assert run_cli("mesh", src, "-o", tmp_path / "m.glb", *FAST) == 0
    err = capsys.readouterr().err + caplog.text  # the warnings: on stderr, or in pytest's log capture
    assert f".m.tmp-{pid}.glb, left by a run that was killed (process {pid})" in err
    data = _dataset(tmp_path / "data", "r_1.png")
    assert (
        run_cli("reconstruct", data, "-o", tmp_path / "out", "--iters", 2, "--no-mesh", "--device", "cpu")
        == 0
    )
    err = capsys.readouterr().err + caplog.text
    assert f"removed the lock of a run that was killed (process {pid})" in err
    assert f".out.tmp-{pid}, left by a run that was killed" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == [".other.tmp-1.glb", "data", "m.glb", "out", "s.ply"]
