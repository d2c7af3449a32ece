"""The `microdreamer mesh` and `demo` commands end to end: real splats, the DreamGaussian reference
mesh, and every bad input (one line, non-zero exit, no output file)."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import trimesh

from conftest import sample
from microdreamer.cli import main
from microdreamer.metrics import surface_distances
from microdreamer.splat import read_ply, write_ply
from microdreamer.synthetic import make_synthetic_object


def run_cli(*args):
    return main([str(a) for a in args])


def load(path):
    return trimesh.load(path, force="mesh", process=False)


def test_dreamgaussian_reference_mesh_within_one_voxel(tmp_path):
    """Upstream mode reproduces the mesh DreamGaussian extracted from the same Gaussians: symmetric
    mean surface distance under one voxel (2/128 of the normalised cube, in splat units)."""
    splat_path = sample("splats/dg_creative_tmp_8.8k.ply")
    ref = load(sample("meshes/dreamgaussian_reference/creative_tmp/tmp_mesh.glb"))
    out = tmp_path / "creative.glb"
    args = ("--mode", "upstream", "--resolution", 128, "--threshold", 1, "--texture", "none")
    assert run_cli("mesh", splat_path, "-o", out, *args) == 0
    means = read_ply(splat_path).means
    voxel = 2 / 128 * float((means.amax(0) - means.amin(0)).amax()) / 1.8
    d_ours_ref, d_ref_ours = surface_distances(load(out), ref, n=50_000)
    msd = 0.5 * (d_ours_ref.mean() + d_ref_ours.mean())
    assert msd < voxel, (msd, voxel)  # measured: 0.0026 vs voxel 0.0117 (0.22 voxel)


@pytest.mark.parametrize(
    "name",
    ["dg_creative_tmp_8.8k.ply", "dg_ghost_amd_17k.ply", "supersplat_fruit_drops_4.7k_sh3.ply",
     "pc_guitar_91k_sh0.decoded.ply"],
)  # fmt: skip
def test_every_sample_splat_converts(tmp_path, name, capsys):
    out = tmp_path / "m.ply"
    assert run_cli("mesh", sample(f"splats/{name}"), "-o", out, "--resolution", 96, "--texture", "none") == 0
    mesh = load(out)
    assert len(mesh.faces) > 100
    printed = capsys.readouterr().out
    assert "Gaussians:" in printed and "faces" in printed and "seconds:" in printed


@pytest.mark.parametrize("suffix", [".glb", ".obj", ".ply"])
def test_output_formats_and_coordinates(tmp_path, suffix):
    """The mesh comes back in the splat's own coordinates: shift the splat, the mesh shifts too."""
    splat = make_synthetic_object(3000, seed=1, scale_fraction=0.02)
    splat.means += torch.tensor([5.0, -2.0, 1.0])
    write_ply(splat, tmp_path / "s.ply")
    out = tmp_path / f"m{suffix}"
    assert (
        run_cli(
            "mesh", tmp_path / "s.ply", "-o", out, "--resolution", 48, "--decimate", 2000, "--texture", "none"
        )
        == 0
    )
    mesh = load(out)
    assert len(mesh.faces) <= 2200
    centre = mesh.bounds.mean(0)
    assert np.allclose(centre, [5.0, -2.0, 1.0], atol=0.05)
    assert mesh.volume > 0  # outward faces


@pytest.mark.parametrize("mode", ["bake", "field"])
def test_textured_mesh(tmp_path, mode, capsys):
    """The default mesh export carries a texture baked from the splat (small sizes to stay fast)."""
    splat = make_synthetic_object(2000, seed=4, scale_fraction=0.03)
    write_ply(splat, tmp_path / "s.ply")
    out = tmp_path / "m.glb"
    assert run_cli("mesh", tmp_path / "s.ply", "-o", out, "--resolution", 40, "--texture", mode,
                   "--texture-size", 64, "--decimate", 3000) == 0  # fmt: skip
    scene = trimesh.load(out, process=False)
    geom = next(iter(scene.geometry.values())) if isinstance(scene, trimesh.Scene) else scene
    assert geom.visual.uv is not None and geom.visual.material.baseColorTexture.size == (64, 64)
    assert f"{mode} texture 64^2" in capsys.readouterr().out


def test_render_turntable_command(tmp_path, capsys):
    splat = make_synthetic_object(1500, seed=5, scale_fraction=0.03)
    write_ply(splat, tmp_path / "s.ply")
    assert run_cli("render", tmp_path / "s.ply", "-o", tmp_path / "sheet.png", "--size", 64) == 0
    from PIL import Image

    assert Image.open(tmp_path / "sheet.png").size[0] > 64
    assert run_cli("render", tmp_path / "s.ply", "-o", tmp_path / "t.gif", "--size", 32, "--frames", 6) == 0
    rc = run_cli("render", tmp_path / "s.ply", "-o", tmp_path / "t.bmp")
    assert rc == 2 and "error:" in capsys.readouterr().err and not (tmp_path / "t.bmp").exists()


def test_demo(tmp_path, capsys):
    """The end-to-end default, shrunk: object -> views -> splat -> mesh, metrics printed."""
    out = tmp_path / "demo"
    assert run_cli("demo", "-o", out, "--iters", 30, "--size", 32, "--resolution", 48) == 0
    for name in (
        "object.ply",
        "views/transforms.json",
        "splat.ply",
        "mesh.glb",
        "mesh_views.png",
        "metrics.json",
    ):
        assert (out / name).exists(), name
    printed = capsys.readouterr().out
    assert "PSNR" in printed and "Chamfer-L1" in printed and str(out / "mesh.glb") in printed


# --------------------------------------------------------------------------- bad input
def _bad_input(tmp_path, capsys, args, *fragments):
    out = tmp_path / "out" / "m.glb"
    rc = run_cli(*args, "-o", out)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert len(err) == 1 and err[0].startswith("error: "), err
    for frag in fragments:
        assert frag in err[0], err[0]
    assert not out.exists()
    leftovers = list((tmp_path / "out").glob("*")) if (tmp_path / "out").exists() else []
    assert leftovers == []
    return err[0]


def _ply(path, header_props, rows, count=None, fmt="binary_little_endian"):
    count = len(rows) if count is None else count
    head = f"ply\nformat {fmt} 1.0\nelement vertex {count}\n" + "".join(
        f"property float {p}\n" for p in header_props
    )
    path.write_bytes((head + "end_header\n").encode() + np.asarray(rows, "<f4").tobytes())
    return path


PROPS = ["x", "y", "z", "f_dc_0", "f_dc_1", "f_dc_2", "opacity", "scale_0", "scale_1", "scale_2",
         "rot_0", "rot_1", "rot_2", "rot_3"]  # fmt: skip


def _rows(n=4):
    rows = np.random.default_rng(0).standard_normal((n, len(PROPS))).astype(np.float32)
    rows[:, 7:10] = -3.0
    rows[:, 6] = 3.0
    return rows


def test_bad_missing_file(tmp_path, capsys):
    _bad_input(tmp_path, capsys, ["mesh", tmp_path / "missing.ply"], "missing.ply", "file not found")


def test_bad_not_a_ply(tmp_path, capsys):
    (tmp_path / "a.ply").write_text("hello")
    _bad_input(tmp_path, capsys, ["mesh", tmp_path / "a.ply"], "not a PLY file")


def test_bad_missing_properties(tmp_path, capsys):
    p = _ply(tmp_path / "p.ply", PROPS[:-1], _rows()[:, :-1])
    _bad_input(tmp_path, capsys, ["mesh", p], "missing required PLY properties rot_3")


def test_bad_truncated(tmp_path, capsys):
    p = _ply(tmp_path / "p.ply", PROPS, _rows(4), count=6)
    _bad_input(tmp_path, capsys, ["mesh", p], "truncated", "declares 6", "holds 4")


def test_bad_non_finite(tmp_path, capsys):
    rows = _rows(5)
    rows[0, 0] = np.nan
    rows[3, 8] = np.inf
    p = _ply(tmp_path / "p.ply", PROPS, rows)
    _bad_input(tmp_path, capsys, ["mesh", p], "2 non-finite values")


def test_zero_quaternion_is_dropped_with_a_warning(tmp_path, capsys, caplog):
    """Policy (splat.py): a Gaussian with no orientation is dropped, named in a warning; the rest mesh."""
    rows = _rows(5)
    rows[2, 10:14] = 0
    p = _ply(tmp_path / "p.ply", PROPS, rows)
    assert run_cli("mesh", p, "-o", tmp_path / "m.ply", "--resolution", 16, "--texture", "none",
                   "--threshold", 0.01) == 0  # fmt: skip
    assert "dropped 1 of 5 Gaussians" in caplog.text and "#2" in caplog.text
    assert "Gaussians: 4 read" in capsys.readouterr().out


def test_bad_empty_splat(tmp_path, capsys):
    p = _ply(tmp_path / "p.ply", PROPS, np.zeros((0, len(PROPS)), np.float32))
    _bad_input(tmp_path, capsys, ["mesh", p], "empty (0 Gaussians)")


def test_bad_unreadable_format(tmp_path, capsys):
    p = tmp_path / "p.ply"
    p.write_bytes(b"ply\nformat binary_middle_endian 1.0\nelement vertex 1\nproperty float x\nend_header\n")
    _bad_input(tmp_path, capsys, ["mesh", p], "unsupported PLY format")


def test_bad_threshold_never_reached(tmp_path, capsys):
    write_ply(make_synthetic_object(500, seed=2), tmp_path / "s.ply")
    _bad_input(
        tmp_path,
        capsys,
        ["mesh", tmp_path / "s.ply", "--threshold", 1e6, "--resolution", 24],
        "never reaches the iso-level",
        "lower --threshold",
    )


def test_bad_everything_transparent(tmp_path, capsys):
    s = make_synthetic_object(50, seed=3)
    s.opacity_logits[:] = -12.0
    write_ply(s, tmp_path / "s.ply")
    _bad_input(tmp_path, capsys, ["mesh", tmp_path / "s.ply", "--resolution", 16], "no Gaussian has opacity")


def test_bad_output_suffix(tmp_path, capsys):
    write_ply(make_synthetic_object(50, seed=3), tmp_path / "s.ply")
    rc = run_cli("mesh", tmp_path / "s.ply", "-o", tmp_path / "m.stl")
    err = capsys.readouterr().err
    assert rc == 2 and "unsupported mesh format '.stl'" in err
    assert not (tmp_path / "m.stl").exists()


def test_bad_device(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    write_ply(make_synthetic_object(50, seed=3), tmp_path / "s.ply")
    _bad_input(tmp_path, capsys, ["mesh", tmp_path / "s.ply", "--device", "cuda"], "no CUDA device")


def test_console_script_exit_code(tmp_path):
    """The installed entry point: a non-zero exit and one line on stderr, no traceback."""
    proc = subprocess.run(
        [sys.executable, "-m", "microdreamer.cli", "mesh", str(tmp_path / "nope.ply"), "-o", str(tmp_path / "x.glb")],
        capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"error: {tmp_path / 'nope.ply'}: file not found; give the path of a 3DGS .ply splat"
    ]


def test_render_views_command(tmp_path, capsys):
    import json

    mesh = trimesh.creation.icosphere(subdivisions=2, radius=0.4)
    mesh.visual.vertex_colors = np.tile([200, 30, 30, 255], (len(mesh.vertices), 1))
    mesh.export(tmp_path / "ball.ply")
    out = tmp_path / "views"
    assert (
        run_cli("render-views", tmp_path / "ball.ply", "-o", out, "--views", 5, "--held-out", 2, "--size", 32)
        == 0
    )
    frames = json.loads((out / "transforms.json").read_text())["frames"]
    assert len(frames) == 7 and sum(bool(f.get("held_out")) for f in frames) == 2
    assert "transforms.json" in capsys.readouterr().out


def test_render_views_bad_mesh(tmp_path, capsys):
    rc = run_cli("render-views", tmp_path / "none.obj", "-o", tmp_path / "v")
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "none.obj" in err[0]
    assert not (tmp_path / "v").exists()


# ---------------------------------------------------------------------------------------------------
# one source for the flags, their defaults, the help and the README


def test_readme_synopsis_is_the_parser_s():
    from microdreamer.cli import synopsis

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert synopsis() in readme, "README's command-line block differs from microdreamer.cli.synopsis()"


def test_help_defaults_come_from_the_job_configs(capsys):
    from microdreamer.cli import BY_NAME, build_parser
    from microdreamer.config import get_path

    parser = build_parser()
    for cmd in BY_NAME.values():
        with pytest.raises(SystemExit):
            parser.parse_args([cmd.name, "--help"])
        text = "".join(capsys.readouterr().out.split())  # argparse wraps lines, at hyphens too
        for flag in cmd.flags:
            value = get_path(cmd.job(), flag.path)
            assert f"(default{'none' if value is None else value})" in text, (cmd.name, flag.name)
    # reconstruct and demo mesh at 0.2, mesh at DreamGaussian's 1.0: the defaults shown follow each job
    assert get_path(BY_NAME["demo"].job(), "export.mesh.threshold") == 0.2
    assert get_path(BY_NAME["mesh"].job(), "mesh.threshold") == 1.0


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.startswith("microdreamer 0.1.0")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--threshold", "nan"], "--threshold nan: must be a finite number"),
        (["--resolution", "1"], "--resolution 1: must be between 2 and 2048"),
        (["--texture-size", "8"], "--texture-size 8: must be between 16 and 16384 texels"),
        (["--decimate", "2"], "--decimate 2: must be at least 4 faces, or none"),
    ],
)
def test_flag_values_checked_by_their_config_field(tmp_path, capsys, argv, message):
    assert main(["mesh", str(tmp_path / "none.ply"), "-o", str(tmp_path / "out.glb"), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: {message}" and list(tmp_path.iterdir()) == []
