"""Cropping a splat (microdreamer.crop): ``--crop auto`` finds the object of a scene built here (an object on
a ground plate, floaters far out) and meshes it alone on a finer grid; an explicit box crops exactly; bad
boxes are one line."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from microdreamer.config import ExportConfig, FieldConfig, MeshConfig, TextureConfig
from microdreamer.crop import CropBox, auto_box, parse_crop
from microdreamer.errors import InputError
from microdreamer.formats.common import SplatArrays
from microdreamer.splat import Splat

SRC = Path(__file__).resolve().parents[1] / "src"
#: the object: a ball of this radius standing on the plate (its lowest point a little above it)
BALL_CENTER = np.array([0.3, 0.45, -0.2])
BALL_RADIUS = 0.3
PLATE_TOP = 0.02


def scene(seed: int = 0) -> SplatArrays:
    """An object on a ground plate with floaters far out, +y up: a ball of 3000 Gaussians (radius 0.3,
    standing 0.13 above the plate), a 4 x 4 plate of 6000 flat Gaussians (y in [-0.02, 0.02]) and 40
    floaters 20-40 units away."""
    rng = np.random.default_rng(seed)
    d = rng.normal(size=(3000, 3))
    ball = BALL_CENTER + BALL_RADIUS * d / np.linalg.norm(d, axis=1, keepdims=True) * rng.uniform(
        0.7, 1.0, (3000, 1)
    )
    plate = np.stack(
        [rng.uniform(-2, 2, 6000), rng.uniform(-PLATE_TOP, PLATE_TOP, 6000), rng.uniform(-2, 2, 6000)], -1
    )
    f = rng.normal(size=(40, 3))
    floaters = f / np.linalg.norm(f, axis=1, keepdims=True) * rng.uniform(20, 40, (40, 1))
    means = np.concatenate([ball, plate, floaters]).astype(np.float32)
    n = len(means)
    log_scales = np.full((n, 3), np.log(0.03), np.float32)
    log_scales[3000:9000, 1] = np.log(0.005)  # the plate's Gaussians are flat
    q = np.zeros((n, 4), np.float32)
    q[:, 0] = 1
    return SplatArrays(means=means, sh_dc=np.zeros((n, 3), np.float32), sh_rest=np.zeros((n, 0, 3), np.float32),
                       opacity_logits=np.full(n, 4.0, np.float32), log_scales=log_scales, quats=q)  # fmt: skip


def _config(crop: str | None, resolution: int = 48) -> ExportConfig:
    return ExportConfig(field=FieldConfig(resolution=resolution), mesh=MeshConfig(threshold="auto", carve=0),
                        texture=TextureConfig(mode="none"), crop=crop)  # fmt: skip


def test_auto_finds_the_object():
    a = scene()
    box = auto_box(a.means, 1 / (1 + np.exp(-a.opacity_logits)))
    lo, hi = np.array(box.lo), np.array(box.hi)
    ball_lo, ball_hi = BALL_CENTER - BALL_RADIUS, BALL_CENTER + BALL_RADIUS
    assert (lo <= ball_lo + 0.02).all() and (hi >= ball_hi - 0.02).all(), box  # the whole object
    assert lo[1] > PLATE_TOP and (lo >= ball_lo - 0.1).all() and (hi <= ball_hi + 0.1).all(), (
        box
    )  # nothing else
    assert "ground" in box.how and "far out" in box.how, box.how


def test_auto_crop_meshes_the_object_alone_on_a_finer_grid(tmp_path):
    from microdreamer.crop import crop_splat, resolve_crop
    from microdreamer.field import resolve_resolution
    from microdreamer.jobs.export import export_mesh, prepare_field

    splat = Splat.from_arrays(scene())
    said = []
    result = export_mesh(splat, tmp_path / "m.ply", _config("auto"), torch.device("cpu"), stage=said.append)
    v = result.mesh.vertices
    assert any(s.startswith("crop: ") and "auto: the main object" in s for s in said), said
    assert v[:, 1].min() > PLATE_TOP, "the ground was meshed"
    assert np.linalg.norm(v - BALL_CENTER, axis=1).max() < BALL_RADIUS + 0.1, "something besides the object"
    assert np.ptp(v, axis=0).min() > 1.5 * BALL_RADIUS  # the object itself is there
    # the voxel: the grid spans the crop, against the whole scene's grid
    cfg = _config(None).field
    box = resolve_crop(splat, "auto")
    cropped = crop_splat(splat, box)
    fine = prepare_field(cropped, resolve_resolution(cropped, cfg))[1].spacing
    coarse = prepare_field(splat, resolve_resolution(splat, cfg))[1].spacing
    assert fine < coarse / 20, (fine, coarse)


def test_explicit_box_crops_exactly(tmp_path):
    from microdreamer.jobs.export import export_mesh

    splat = Splat.from_arrays(scene())
    spec = "0.1,0.3,-0.45,0.65,0.9,0.05"  # through the ball: its left and lower parts cut off
    box = parse_crop(spec)
    result = export_mesh(splat, tmp_path / "m.ply", _config(spec), torch.device("cpu"))
    v = result.mesh.vertices
    assert (v >= np.array(box.lo, np.float32)).all() and (v <= np.array(box.hi, np.float32)).all()
    # the cut faces lie on the box: vertices reach its lower x and y faces
    assert abs(v[:, 0].min() - box.lo[0]) < 1e-6 and abs(v[:, 1].min() - box.lo[1]) < 1e-6


@pytest.mark.parametrize(
    "spec, match",
    [
        ("1,2,3", "six numbers"),
        ("0,0,0,1,nan,1", "six numbers"),
        ("0,0,0,1,-1,1", "must be above"),
        ("x", "six"),
    ],
)
def test_bad_boxes_refused(spec, match):
    with pytest.raises(InputError, match=match):
        parse_crop(spec)
    with pytest.raises(InputError, match=match):
        dataclasses.replace(_config(None), crop=spec).validate()


def test_box_with_no_gaussian_refused():
    from microdreamer.crop import crop_splat

    with pytest.raises(InputError, match="no Gaussian lies in the crop box"):
        crop_splat(Splat.from_arrays(scene()), CropBox((100, 100, 100), (101, 101, 101)))


def test_cli_mesh_and_render_print_the_box(tmp_path):
    from microdreamer.formats import write_splat

    write_splat(scene(), tmp_path / "scene.spz")
    env = dict(os.environ, PYTHONPATH=str(SRC))
    for args in (["mesh", "scene.spz", "-o", "m.glb", "--texture", "none", "--resolution", "48", "--crop", "auto"],
                 ["render", "scene.spz", "-o", "v.png", "--size", "32", "--crop", "auto"]):  # fmt: skip
        run = subprocess.run([sys.executable, "-m", "microdreamer.cli", *args, "--device", "cpu"], cwd=tmp_path,
                             env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
        assert run.returncode == 0, run.stderr
        said = run.stdout + run.stderr  # mesh says it among its stage lines (stderr), render on stdout
        assert "crop: " in said and "auto: the main object" in said, said
    run = subprocess.run([sys.executable, "-m", "microdreamer.cli", "view", "scene.spz", "-o", "site", "--crop", "auto"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert run.returncode == 0 and "auto: the main object" in run.stdout, run.stdout + run.stderr
    from microdreamer.formats import read_splat_arrays

    shown = [read_splat_arrays(p) for p in (tmp_path / "site").rglob("*.ply")]
    assert len(shown) == 1 and 2900 < len(shown[0]) < 3100  # the ball's 3000 Gaussians, about
    run = subprocess.run([sys.executable, "-m", "microdreamer.cli", "mesh", "scene.spz", "-o", "x.glb", "--crop", "1,2"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert (
        run.returncode == 2 and run.stderr.startswith("error: ") and len(run.stderr.strip().splitlines()) == 1
    )
    assert not (tmp_path / "x.glb").exists()
