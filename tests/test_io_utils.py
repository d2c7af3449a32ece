"""Inputs and outputs checked before any work, staged job folders, atomic writes, free memory."""

from __future__ import annotations

import errno
import os

import pytest

from microdreamer import io_utils
from microdreamer.errors import InputError
from microdreamer.io_utils import (
    atomic_path,
    check_companions,
    check_input,
    check_memory,
    check_output_folder,
    check_output_path,
    made_parents,
    staged_folder,
    textured_obj_companions,
)


def _tree(root):
    """Every path under ``root`` with its size and content (a snapshot to compare)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for d in dirnames:
            out[os.path.relpath(os.path.join(dirpath, d), root)] = "dir"
        for f in filenames:
            p = os.path.join(dirpath, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, root)] = fh.read()
    return out


def _one_line(excinfo, *fragments):
    msg = str(excinfo.value)
    assert "\n" not in msg
    for f in fragments:
        assert f in msg, msg


def test_check_input(tmp_path):
    (tmp_path / "f.ply").write_bytes(b"x")
    assert check_input(tmp_path / "f.ply", "file", "splat") == tmp_path / "f.ply"
    assert check_input(tmp_path, "folder", "dataset") == tmp_path
    with pytest.raises(InputError) as e:
        check_input(tmp_path / "none.ply", "file", "splat")
    _one_line(e, "none.ply", "file not found")
    with pytest.raises(InputError) as e:
        check_input(tmp_path, "file", "mesh")
    _one_line(e, "is a folder, not a mesh file")
    with pytest.raises(InputError) as e:
        check_input(tmp_path / "f.ply", "folder", "dataset")
    _one_line(e, "is a file, not a dataset folder")


@pytest.mark.parametrize(
    "target, fragment",
    [
        ("/proc/out.ply", "cannot write in /proc"),
        ("/sys/out.glb", "cannot write in /sys"),
        ("{tmp}/file.txt/out.ply", "is a file, not a folder"),
        ("{tmp}/file.txt/deeper/out.ply", "is a file, not a folder"),
        ("{tmp}/out.stl", "unsupported mesh format '.stl'"),
        ("{tmp}", "unsupported mesh format"),
        ("{tmp}/dir.ply", "is a folder"),
        ("{tmp}/missing/out.ply", "does not exist"),
    ],
)
def test_check_output_path_refuses(tmp_path, target, fragment):
    (tmp_path / "file.txt").write_text("keep")
    (tmp_path / "dir.ply").mkdir()
    before = _tree(tmp_path)
    with pytest.raises(InputError) as e:
        check_output_path(target.format(tmp=tmp_path), (".glb", ".obj", ".ply"), "mesh")
    _one_line(e, fragment)
    assert _tree(tmp_path) == before


def test_check_output_path_allows_missing_parents_when_asked(tmp_path):
    out = tmp_path / "new" / "sub" / "m.glb"
    assert check_output_path(out, (".glb",), "mesh", create_parents=True) == out
    assert not (tmp_path / "new").exists()  # nothing created: not even the probe's folder


def test_output_equal_to_an_input(tmp_path):
    src = tmp_path / "s.ply"
    src.write_bytes(b"splat")
    os.link(src, tmp_path / "hard.ply")
    os.symlink(src, tmp_path / "soft.ply")
    for out in (src, tmp_path / "hard.ply", tmp_path / "soft.ply", tmp_path / "." / "s.ply"):
        with pytest.raises(InputError) as e:
            check_output_path(out, (".ply",), "mesh", inputs=[src])
        _one_line(e, "is the input", "choose another output path")
    assert src.read_bytes() == b"splat"


def test_check_output_folder(tmp_path):
    (tmp_path / "img.png").write_bytes(b"png")
    with pytest.raises(InputError) as e:
        check_output_folder(tmp_path / "img.png", ("views.png",))
    _one_line(e, "not a folder")
    with pytest.raises(InputError) as e:  # generate's views.png would replace its own input image
        check_output_folder(tmp_path, ("views.png", "img.png"), inputs=[tmp_path / "img.png"])
    _one_line(e, "is the input")
    assert check_output_folder(tmp_path / "a" / "b", ("x",)) == tmp_path / "a" / "b"
    assert not (tmp_path / "a").exists()


def test_companions_of_a_textured_obj(tmp_path):
    out = tmp_path / "photo.obj"
    companions, ours = textured_obj_companions(out)
    assert [p.name for p in companions] == ["photo.mtl", "photo.png"]
    check_companions(out, companions, ours)  # none exists
    (tmp_path / "photo.png").write_bytes(b"the user's photo")
    with pytest.raises(InputError) as e:
        check_companions(out, companions, ours)
    _one_line(e, "also writes photo.mtl, photo.png", "photo.png already exists")
    # a previous microdreamer output (its MTL names its PNG) may be replaced
    (tmp_path / "photo.mtl").write_text("# microdreamer\nnewmtl material0\nmap_Kd photo.png\n")
    check_companions(out, companions, ours)
    (tmp_path / "photo.mtl").write_text("newmtl mine\nmap_Kd photo.png\n")  # someone else's material
    with pytest.raises(InputError):
        check_companions(out, companions, ours)


def test_made_parents_removes_what_it_made_on_failure(tmp_path):
    (tmp_path / "keep").mkdir()
    with pytest.raises(RuntimeError), made_parents(tmp_path / "keep" / "new" / "sub"):
        assert (tmp_path / "keep" / "new" / "sub").is_dir()
        raise RuntimeError("later failure")
    assert _tree(tmp_path) == {"keep": "dir"}
    with made_parents(tmp_path / "keep" / "new" / "sub") as d:
        (d / "f").write_text("ok")
    assert (tmp_path / "keep" / "new" / "sub" / "f").read_text() == "ok"


def test_staged_folder_commits_only_on_success(tmp_path):
    final = tmp_path / "parent" / "out"
    with pytest.raises(RuntimeError), staged_folder(final) as stage:
        stage.mkdir()
        (stage / "splat.ply").write_text("half")
        raise RuntimeError("mesh step failed")
    assert _tree(tmp_path) == {}
    # an existing folder with earlier outputs: a failure changes nothing
    final.mkdir(parents=True)
    (final / "splat.ply").write_text("old")
    (final / "notes.txt").write_text("user")
    before = _tree(tmp_path)
    with pytest.raises(RuntimeError), staged_folder(final) as stage:
        stage.mkdir()
        (stage / "splat.ply").write_text("new")
        raise RuntimeError("fail")
    assert _tree(tmp_path) == before
    with staged_folder(final) as stage:
        stage.mkdir()
        (stage / "splat.ply").write_text("new")
        (stage / "views").mkdir()
        (stage / "views" / "a.png").write_text("a")
    assert (final / "splat.ply").read_text() == "new" and (final / "notes.txt").read_text() == "user"
    assert (final / "views" / "a.png").read_text() == "a"
    assert sorted(p.name for p in (tmp_path / "parent").iterdir()) == ["out"]  # no stage left


def test_atomic_path_turns_write_errors_into_one_line(tmp_path):
    target = tmp_path / "m.glb"
    with pytest.raises(InputError) as e, atomic_path(target) as tmp:
        tmp.write_bytes(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp))
    _one_line(e, "m.glb", "No space left on device")
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(OSError) as e2, atomic_path(target):  # other files' errors are not ours to rename
        raise OSError(errno.ENOSPC, "No space left on device", "/elsewhere/x")
    assert not isinstance(e2.value, InputError)


def test_check_memory(monkeypatch):
    monkeypatch.setattr(io_utils, "free_host_memory", lambda: 2 << 30)
    check_memory(1 << 30, "a thing", "use less")
    with pytest.raises(InputError) as e:
        check_memory(3 << 30, "a thing", "use less")
    _one_line(e, "a thing needs about 3.0 GB but 2.0 GB are free; use less")


def test_free_host_memory_is_positive():
    assert io_utils.free_host_memory() > 0
