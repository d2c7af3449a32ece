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
        f"error: {tmp_path / 'nope.ply'}: file not found; give the path of a splat (.ply, .spz, .sog, .splat, "
        ".ksplat, .glb, .gltf)"
    ]


READ_PROBE = """
import builtins, os, sys
target, seen, real_open = os.path.realpath(sys.argv[1]), [], builtins.open
def spy(file, *a, **k):
    if isinstance(file, (str, os.PathLike)) and os.path.realpath(file) == target:
        seen.append(sorted(m for m in ("torch", "microdreamer.splat") if m in sys.modules))
    return real_open(file, *a, **k)
builtins.open = spy
from microdreamer.cli import main
rc = main(sys.argv[2:])
print("modules at the first read:", seen[0] if seen else None, "exit", rc)
"""


@pytest.mark.parametrize(
    "command, output, flags",
    [
        ("mesh", "m.glb", ["--resolution", "16", "--texture", "none"]),
        ("render", "views.png", ["--size", "32"]),
    ],
)
def test_splat_input_is_read_before_torch_is_imported(tmp_path, command, output, flags):
    """Start-up: ``mesh`` and ``render`` open a splat with NumPy before torch (about a second to import)
    is loaded, so the input's first byte comes within a fraction of a second. A fresh interpreter spies
    on open() and records what was imported at the input's first open; no time is asserted."""
    src = _splat_file(tmp_path)
    out = tmp_path / output
    args = [command, str(src), "-o", str(out), *flags, "--device", "cpu"]
    proc = subprocess.run([sys.executable, "-c", READ_PROBE, str(src), *args], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "modules at the first read: [] exit 0"
    assert out.stat().st_size > 0


GENERATE_READ_PROBE = """
import builtins, os, sys
target, real_open = os.path.realpath(sys.argv[1]), builtins.open
def spy(file, *a, **k):
    if isinstance(file, (str, os.PathLike)) and os.path.realpath(file) == target:
        heavy = ("diffusers", "transformers", "torch._dynamo")
        print("modules at the first read:", sorted(m for m in heavy if m in sys.modules), flush=True)
        raise SystemExit(0)
    return real_open(file, *a, **k)
builtins.open = spy
from microdreamer.cli import main
main(sys.argv[2:])
print("the input was never read")
"""


def test_generate_reads_its_input_before_the_model_libraries_are_imported(tmp_path):
    """Start-up: ``generate`` opens its image before diffusers and transformers (seconds of imports, with
    torch._dynamo) are loaded, so a bad input fails fast and the input's first byte comes early. A fresh
    interpreter spies on open(), records what was imported at the image's first open and stops there."""
    image = sample("images/ghost_rgba.png")
    args = [
        "generate",
        str(image),
        "-o",
        str(tmp_path / "out"),
        "--random-weights",
        "tiny",
        "--device",
        "cpu",
    ]
    proc = subprocess.run([sys.executable, "-c", GENERATE_READ_PROBE, str(image), *args],
                          capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "modules at the first read: []"


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
    # demo meshes at 0.2, mesh and reconstruct at the level chosen from the splat: the defaults shown
    # follow each job
    assert get_path(BY_NAME["demo"].job(), "export.mesh.threshold") == 0.2
    assert get_path(BY_NAME["mesh"].job(), "mesh.threshold") == "auto"
    assert get_path(BY_NAME["reconstruct"].job(), "export.mesh.threshold") == "auto"


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
        (["--max-faces", "2"], "--max-faces 2: must be at least 4 faces, or none"),
    ],
)
def test_flag_values_checked_by_their_config_field(tmp_path, capsys, argv, message):
    assert main(["mesh", str(tmp_path / "none.ply"), "-o", str(tmp_path / "out.glb"), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: {message}" and list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------------------------------
# profile reports and the viewer from the command line


def test_mesh_profile_writes_the_report(tmp_path, capsys):
    import json

    write_ply(make_synthetic_object(400, seed=4), tmp_path / "s.ply")
    out = tmp_path / "m.glb"
    assert main(["mesh", str(tmp_path / "s.ply"), "-o", str(out), "--resolution", "24", "--texture", "none",
                 "--profile", "--device", "cpu"]) == 0  # fmt: skip
    report = json.loads((tmp_path / "m.profile.json").read_text())
    assert {"start-up", "read", "field", "mesh", "export"} <= set(report["seconds"])
    total = report["total"]
    assert abs(total - sum(report["seconds"].values())) < 1e-9
    field = report["amdahl"]["field"]
    assert abs(field["speedup"] - total / (total - report["seconds"]["field"])) < 1e-9
    assert (tmp_path / "m.profile.png").stat().st_size > 1000 and "profile:" in capsys.readouterr().out


def test_textured_mesh_profile_splits_the_texture_stage_into_its_parts(tmp_path):
    import json

    from microdreamer.cli import texture_parts

    write_ply(make_synthetic_object(400, seed=4), tmp_path / "s.ply")
    out = tmp_path / "m.glb"
    assert main(["mesh", str(tmp_path / "s.ply"), "-o", str(out), "--resolution", "24", "--texture", "field",
                 "--texture-size", "64", "--profile", "--device", "cpu"]) == 0  # fmt: skip
    seconds = json.loads((tmp_path / "m.profile.json").read_text())["seconds"]
    assert "texture" not in seconds and {"texture: unwrap", "texture: other"} <= set(seconds)
    # the parts and the rest add up to the stage; a stage without parts is left whole
    split = texture_parts({"field": 1.0, "texture": 5.0}, {"seconds": {"unwrap": 2.0, "fill": 0.5}})
    assert split == {"field": 1.0, "texture: unwrap": 2.0, "texture: fill": 0.5, "texture: other": 2.5}
    assert texture_parts({"texture": 5.0}, {}) == {"texture": 5.0}


def test_profile_scaling_runs_each_resolution(tmp_path):
    import json

    write_ply(make_synthetic_object(400, seed=4), tmp_path / "s.ply")
    assert main(["profile", "scaling", str(tmp_path / "s.ply"), "-o", str(tmp_path / "p"), "--resolutions",
                 "16,24", "--texture", "none", "--device", "cpu", "--config", str(_iso_preset(tmp_path))]) == 0  # fmt: skip
    rows = json.loads((tmp_path / "p" / "scaling.json").read_text())["rows"]
    assert [r["resolution"] for r in rows] == [16, 24] and all(r["seconds"]["field"] > 0 for r in rows)
    assert (tmp_path / "p" / "scaling.png").exists()


def test_profile_scaling_bad_resolutions(tmp_path, capsys):
    assert main(["profile", "scaling", str(tmp_path / "s.ply"), "--resolutions", "big"]) == 2
    assert capsys.readouterr().err.strip().startswith("error: --resolutions big:")


def test_view_builds_a_folder(tmp_path, capsys):
    write_ply(make_synthetic_object(300, seed=5), tmp_path / "s.ply")
    assert main(["view", str(tmp_path / "s.ply"), "-o", str(tmp_path / "v")]) == 0
    assert (tmp_path / "v" / "index.html").exists() and "viewer:" in capsys.readouterr().out


def _iso_preset(tmp_path):
    p = tmp_path / "iso.yaml"
    p.write_text("mesh:\n  threshold: auto\n")
    return p


# ---------------------------------------------------------------------------------------------------
# --up: a y-down input comes out upright


def _y_down_snowman(path):
    """The snowman (red head above a blue base, y up) stored y-down, as a y-down capture is."""
    from microdreamer.orient import up_rotation
    from microdreamer.synthetic import snowman_splat

    write_ply(snowman_splat(2000, seed=2).transformed(up_rotation("-y")), path)
    return path


def _red_above_blue(sheet: np.ndarray, size: int) -> list[bool]:
    """Per view of a contact sheet of ``size`` px views: is the red pixels' mean row above the blue's?"""
    out = []
    for r in range(sheet.shape[0] // size):
        for c in range(sheet.shape[1] // size):
            view = sheet[r * size : (r + 1) * size, c * size : (c + 1) * size].astype(int)
            red = (view[..., 0] > 150) & (view[..., 1] < 90) & (view[..., 2] < 90)
            blue = (view[..., 2] > 150) & (view[..., 0] < 90)
            assert red.sum() > 5 and blue.sum() > 20, (r, c, red.sum(), blue.sum())
            out.append(np.nonzero(red)[0].mean() < np.nonzero(blue)[0].mean())
    return out


def test_up_turns_a_y_down_splat_upright_in_render(tmp_path):
    from PIL import Image

    src = _y_down_snowman(tmp_path / "down.ply")
    assert run_cli("render", src, "-o", tmp_path / "as_is.png", "--size", 48) == 0
    assert run_cli("render", src, "-o", tmp_path / "up.png", "--size", 48, "--up", "-y") == 0
    as_is = _red_above_blue(np.asarray(Image.open(tmp_path / "as_is.png").convert("RGB")), 48)
    upright = _red_above_blue(np.asarray(Image.open(tmp_path / "up.png").convert("RGB")), 48)
    assert len(upright) == 8 and all(upright), upright  # the head on top in every view
    assert not any(as_is), as_is  # and upside down without --up


def test_up_turns_a_y_down_splat_upright_in_mesh(tmp_path):
    """mesh --up -y: the narrow end (the head, radius 0.18) is at the top (+y), the wide base below;
    the mesh keeps the splat's units (its height ~1.15 either way)."""
    src = _y_down_snowman(tmp_path / "down.ply")
    for up, head_on_top in (("-y", True), ("+y", False)):
        out = tmp_path / f"m{up}.ply"
        # a fixed level on point samples, so that the mesh's height is the snowman's own
        (tmp_path / "points.yaml").write_text("field:\n  voxel_filter: 0.0\n")
        args = ("--resolution", 48, "--texture", "none", "--up", up, "--threshold", 1.0,
                "--config", tmp_path / "points.yaml")  # fmt: skip
        assert run_cli("mesh", src, "-o", out, *args) == 0
        v = np.asarray(load(out).vertices)
        lo, hi = v[:, 1].min(), v[:, 1].max()
        assert 1.0 < hi - lo < 1.3, (lo, hi)
        top = v[v[:, 1] > hi - 0.15]
        bottom = v[v[:, 1] < lo + 0.15]
        width_top = np.ptp(top[:, 0]) if len(top) else 0.0
        width_bottom = np.ptp(bottom[:, 0]) if len(bottom) else 0.0
        assert (width_top < width_bottom) == head_on_top, (up, width_top, width_bottom)


def _y_down_snowman_on_ground(path):
    """The snowman standing on a grey plate (2 x 2, a third of the Gaussians, just under its base), y up,
    stored y-down: a capture with one clear ground, which ``--up auto`` finds."""
    from microdreamer.orient import up_rotation
    from microdreamer.splat import Splat
    from microdreamer.synthetic import snowman_splat

    g = torch.Generator().manual_seed(3)
    man = snowman_splat(2000, seed=2)
    k = 1000
    plate = torch.stack([torch.rand(k, generator=g) * 2 - 1, torch.full((k,), -0.66),
                         torch.rand(k, generator=g) * 2 - 1], -1)  # fmt: skip
    floor = Splat.from_activated(
        plate, torch.full((k, 3), 0.03), torch.tensor([[1.0, 0.0, 0.0, 0.0]]).expand(k, 4),
        torch.full((k,), 0.9), torch.full((k, 3), 0.5),
    )  # fmt: skip
    parts = man.tensors(), floor.tensors()
    scene = Splat(**{name: torch.cat([parts[0][name], parts[1][name]]) for name in parts[0]})
    write_ply(scene.transformed(up_rotation("-y")), path)
    return path


def test_up_auto_finds_the_ground_of_a_y_down_capture(tmp_path, capsys):
    """render and mesh --up auto: a y-down splat with a floor comes out upright, and the axis is printed;
    without a ground (the bare snowman) auto keeps +y and says so."""
    from PIL import Image

    src = _y_down_snowman_on_ground(tmp_path / "down.ply")
    assert run_cli("render", src, "-o", tmp_path / "auto.png", "--size", 64, "--up", "auto") == 0
    assert "up axis: -y (auto: the side of the input's ground)" in capsys.readouterr().out
    assert all(_red_above_blue(np.asarray(Image.open(tmp_path / "auto.png").convert("RGB")), 64))

    out = tmp_path / "auto.ply"
    assert run_cli("mesh", src, "-o", out, "--resolution", 48, "--texture", "none", "--up", "auto") == 0
    assert "up axis: -y (auto: the side of the input's ground)" in capsys.readouterr().err  # a stage line
    v = np.asarray(load(out).vertices)
    lo, hi = v[:, 1].min(), v[:, 1].max()
    top, bottom = v[v[:, 1] > hi - 0.15], v[v[:, 1] < lo + 0.05]
    assert np.ptp(top[:, 0]) < 0.5 and np.ptp(bottom[:, 0]) > 1.5  # the head on top, the 2-wide plate below

    bare = _y_down_snowman(tmp_path / "bare.ply")
    assert run_cli("render", bare, "-o", tmp_path / "bare.png", "--size", 48, "--up", "auto") == 0
    assert "up axis: +y (auto: no single clear ground layer, so the default)" in capsys.readouterr().out
    assert not any(_red_above_blue(np.asarray(Image.open(tmp_path / "bare.png").convert("RGB")), 48))


def test_up_auto_in_a_batch_is_resolved_per_splat_and_recorded(tmp_path):
    """mesh A B -o DIR/ --up auto: each splat's own axis (the y-down capture with a floor -y, the bare
    snowman +y), recorded per input in summary.json."""
    import json

    ground = _y_down_snowman_on_ground(tmp_path / "ground.ply")
    bare = _y_down_snowman(tmp_path / "bare.ply")
    out = tmp_path / "out"
    args = ("--resolution", 32, "--texture", "none", "--carve", 0, "--up", "auto")
    assert run_cli("mesh", ground, bare, "-o", f"{out}/", *args) == 0
    items = {i["name"]: i for i in json.loads((out / "summary.json").read_text())["items"]}
    assert items["ground"]["details"]["up"] == "-y"
    assert items["bare"]["details"]["up"] == "+y"


# ---------------------------------------------------------------------------------------------------
# --max-faces (the decimation target; --decimate is its older name)


@pytest.mark.parametrize(
    "command, inputs, path",
    [
        ("mesh", ["s.ply"], "mesh.decimate_target"),
        ("demo", [], "export.mesh.decimate_target"),
        ("reconstruct", ["data"], "export.mesh.decimate_target"),
        ("generate", ["image.png"], "export.mesh.decimate_target"),
    ],
)
def test_max_faces_and_decimate_set_the_same_field(command, inputs, path):
    from microdreamer import config
    from microdreamer.cli import build_parser, job_config

    def cfg(*flags):
        return job_config(build_parser().parse_args([command, *inputs, "-o", "out/", *flags]))

    assert config.get_path(cfg("--max-faces", "2000"), path) == 2000
    assert cfg("--max-faces", "2000") == cfg("--decimate", "2000")
    assert config.get_path(cfg(), path) is None  # the default keeps the full mesh


def test_max_faces_simplifies_the_mesh(tmp_path, capsys):
    """--max-faces N: the ghost at 96^3 (about 90k faces in full) comes out with about N faces."""
    ghost, full, small = sample("splats/dg_ghost_amd_17k.ply"), tmp_path / "full.glb", tmp_path / "small.glb"
    args = ("--resolution", 96, "--texture", "none", "--device", "cpu")
    assert run_cli("mesh", ghost, "-o", full, *args) == 0
    assert run_cli("mesh", ghost, "-o", small, *args, "--max-faces", 2000) == 0
    n_full, n_small = len(load(full).faces), len(load(small).faces)
    assert n_full > 4000 and 1500 <= n_small <= 2100, (n_full, n_small)  # quadric decimation: about N
    assert "decimated to about 2,000" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------------
# no silent overrides


def test_decimate_is_honoured_when_texturing(tmp_path, capsys):
    """--max-faces N above the texture stage's face cap (texture.max_faces, 1000 in this preset) gives a
    mesh of about N faces, and says that the cap was raised; without --max-faces the cap applies."""
    write_ply(make_synthetic_object(3000, seed=1, scale_fraction=0.02), tmp_path / "s.ply")
    (tmp_path / "cap.yaml").write_text("texture:\n  max_faces: 1000\n  size: 64\n  mode: field\n")
    base = ("mesh", tmp_path / "s.ply", "--resolution", 64, "--config", tmp_path / "cap.yaml")
    assert run_cli(*base, "-o", tmp_path / "capped.glb") == 0
    capped = len(load(tmp_path / "capped.glb").faces)
    capsys.readouterr()
    assert run_cli(*base, "-o", tmp_path / "asked.glb", "--max-faces", 3000) == 0
    asked = len(load(tmp_path / "asked.glb").faces)
    err = capsys.readouterr().err
    assert capped <= 1100 and 2500 <= asked <= 3300, (capped, asked)
    assert "--max-faces 3,000 is above the texture stage's face cap (1,000" in err
    assert "keeps the faces" in err


def test_mesh_says_what_a_ply_stores_and_reports_stages(tmp_path, capsys):
    write_ply(make_synthetic_object(2000, seed=1, scale_fraction=0.02), tmp_path / "s.ply")
    args = ("--resolution", 48, "--texture", "field", "--texture-size", 64)
    assert run_cli("mesh", tmp_path / "s.ply", "-o", tmp_path / "m.ply", *args) == 0
    captured = capsys.readouterr()
    assert "PLY stores no texture: the texture is sampled into vertex colours" in captured.out
    for stage in ("marching cubes and cleanup", "UV unwrap", "colour field", "filling", "writing"):
        assert stage in captured.err, (stage, captured.err)
    assert run_cli("mesh", tmp_path / "s.ply", "-o", tmp_path / "m.glb", *args) == 0
    assert "vertex colours" not in capsys.readouterr().out


@pytest.mark.slow
def test_demo_is_identical_run_to_run_with_two_threads(tmp_path):
    """Two CPU demo runs, one seed, two threads: the same metrics and the same splat, bit for bit
    (the lead measured PSNR 31.70 vs 31.61 dB and 3,770 vs 3,781 Gaussians before the rasteriser's
    backward was made deterministic). Shrunk settings; minutes on the shared 2-core CPU."""
    import json

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        for run in ("a", "b"):
            assert run_cli("demo", "-o", tmp_path / run, "--iters", 60, "--size", 32, "--resolution", 48) == 0
    finally:
        torch.set_num_threads(threads)
    a, b = (json.loads((tmp_path / r / "metrics.json").read_text()) for r in ("a", "b"))
    for key in ("psnr", "ssim", "psnr_per_view", "num_gaussians", "final_loss", "mesh_quality", "mesh"):
        assert a[key] == b[key], key
    sa, sb = read_ply(tmp_path / "a" / "splat.ply"), read_ply(tmp_path / "b" / "splat.ply")
    assert all(torch.equal(x, sb.tensors()[k]) for k, x in sa.tensors().items())


# ---------------------------------------------------------------------------------------------------
# issue 20: bad input and faults. Each test checks the exit status, the one error line, and that no
# file or folder was created or changed (a snapshot of the whole test folder before and after).


def _snapshot(root):
    out = {}
    for p in sorted(Path(root).rglob("*")):
        out[str(p.relative_to(root))] = "dir" if p.is_dir() else p.read_bytes()
    return out


def _fails_cleanly(tmp_path, capsys, args, *fragments, rc=2):
    """Run the CLI; exit status ``rc``, the last stderr line is the only ``error:`` line and holds the
    fragments, and nothing under tmp_path was created or changed."""
    before = _snapshot(tmp_path)
    code = run_cli(*args)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == rc, err
    errors = [line for line in err if line.startswith("error:")]
    assert len(errors) == 1 and err[-1] == errors[0], err
    assert "Traceback" not in "\n".join(err)
    for frag in fragments:
        assert frag in errors[0], errors[0]
    assert _snapshot(tmp_path) == before
    return errors[0]


def _splat_file(tmp_path, name="s.ply", n=400, seed=2, **edits):
    s = make_synthetic_object(n, seed=seed, scale_fraction=0.04)
    for attr, (index, value) in edits.items():
        getattr(s, attr)[index] = value
    write_ply(s, tmp_path / name)
    return tmp_path / name


FAST = ("--resolution", 16, "--texture", "none")


# 1. one bad Gaussian
def test_issue20_underflowing_log_scale_still_meshes(tmp_path, capsys, caplog):
    """Policy: an axis whose exp() underflows float32 is raised to the smallest normal scale (a flat
    disc, as viewers draw it); the splat meshes and a warning names the Gaussian."""
    src = _splat_file(tmp_path, log_scales=((3, 0), -200.0))
    assert run_cli("mesh", src, "-o", tmp_path / "m.ply", *FAST) == 0
    assert "(#3)" in caplog.text and "-200" in caplog.text
    assert len(load(tmp_path / "m.ply").faces) > 100


def test_issue20_integer_typed_scales_mesh_or_fail_cleanly(tmp_path, capsys):
    src = _splat_file(tmp_path)
    raw = src.read_bytes().replace(b"property float scale_0", b"property int scale_0")
    (tmp_path / "i.ply").write_bytes(raw)
    src.unlink()
    # the integer scale column reads as numbers: the splat meshes, or fails with one line naming it
    code = run_cli("mesh", tmp_path / "i.ply", "-o", tmp_path / "m.ply", *FAST)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    if code == 0:
        assert len(load(tmp_path / "m.ply").faces) > 0
    else:
        assert code == 2 and err.strip().splitlines()[-1].startswith("error:") and "i.ply" in err
        assert not (tmp_path / "m.ply").exists()


def test_issue20_every_gaussian_degenerate(tmp_path, capsys):
    src = _splat_file(tmp_path, n=5)
    s = read_ply(src)
    s.quats[:] = 0.0
    write_ply(s, src)
    _fails_cleanly(tmp_path, capsys, ["mesh", src, "-o", tmp_path / "m.glb"], "every Gaussian is degenerate")


# 2. -o equal to the input
@pytest.mark.parametrize("how", ["same", "hardlink", "symlink"])
def test_issue20_output_equal_to_input(tmp_path, capsys, how):
    src = _splat_file(tmp_path)
    out = src
    if how == "hardlink":
        out = tmp_path / "link.ply"
        out.hardlink_to(src)
    elif how == "symlink":
        out = tmp_path / "link.ply"
        out.symlink_to(src)
    _fails_cleanly(tmp_path, capsys, ["mesh", src, "-o", out, *FAST], "is the input")


# 3. duplicate property names, in mesh and in render
@pytest.mark.parametrize("command", ["mesh", "render"])
def test_issue20_duplicate_property(tmp_path, capsys, command):
    src = _splat_file(tmp_path)
    src.write_bytes(src.read_bytes().replace(b"property float nx", b"property float x"))
    out = tmp_path / ("m.glb" if command == "mesh" else "t.png")
    _fails_cleanly(tmp_path, capsys, [command, src, "-o", out], "property 'x' appears twice")


# 4. memory weighed against the input
@pytest.mark.parametrize("count", [10**9, 10**12])
def test_issue20_huge_vertex_count(tmp_path, capsys, count):
    src = _splat_file(tmp_path)
    src.write_bytes(src.read_bytes().replace(b"element vertex 400", f"element vertex {count}".encode()))
    _fails_cleanly(
        tmp_path, capsys, ["mesh", src, "-o", tmp_path / "m.glb"], f"declares {count}", "holds 400"
    )


def test_issue20_header_without_length_limit(tmp_path, capsys):
    src = tmp_path / "zeros.ply"
    with open(src, "wb") as f:
        f.write(b"ply\nformat binary_little_endian 1.0\ncomment ")
        f.truncate(1 << 30)  # 1 GB of zeros (sparse)
    _fails_cleanly(tmp_path, capsys, ["mesh", src, "-o", tmp_path / "m.glb"], "header runs past 1 MB")


def test_issue20_grid_weighed_against_memory(tmp_path, capsys, monkeypatch):
    from microdreamer import io_utils

    monkeypatch.setattr(io_utils, "free_host_memory", lambda: 4 << 30)  # a 4 GB machine
    src = _splat_file(tmp_path)
    msg = _fails_cleanly(tmp_path, capsys, ["mesh", src, "-o", tmp_path / "m.glb", "--resolution", 2048],
                         "--resolution 2048: the 2048^3 grid needs about", "4.0 GB are free")  # fmt: skip
    fit = int(msg.split("use --resolution ")[1].split()[0])
    from microdreamer.jobs.export import MEMORY_SHARE, grid_memory

    # the advice fits, and is close to the largest that does
    assert grid_memory(fit, torch.device("cpu"))["host"] <= MEMORY_SHARE * (4 << 30)
    assert grid_memory(int(fit * 1.04) + 1, torch.device("cpu"))["host"] > MEMORY_SHARE * (4 << 30)


def test_issue20_grid_2048_refused_on_this_machine(tmp_path, capsys):
    """2048^3 needs ~100 GB; refused before the splat is read unless the host has that much free."""
    from microdreamer.io_utils import free_host_memory
    from microdreamer.jobs.export import MEMORY_SHARE, grid_memory

    if grid_memory(2048, torch.device("cpu"))["host"] <= MEMORY_SHARE * free_host_memory():
        pytest.skip("this host has the memory for a 2048^3 grid")
    _fails_cleanly(tmp_path, capsys, ["mesh", tmp_path / "none.ply", "-o", tmp_path / "m.glb", "--resolution",
                                      2048], "use --resolution")  # fmt: skip


# 5. an empty mesh never reaches the writer
@pytest.mark.parametrize(
    "args, fragment",
    [
        (("--threshold", "nan"), "--threshold nan: must be a finite number"),
        (("--threshold", "-1"), "--threshold -1.0: must be positive"),
        (("--threshold", "0"), "must be positive"),
    ],
)
def test_issue20_thresholds_refused_up_front(tmp_path, capsys, args, fragment):
    src = _splat_file(tmp_path)
    _fails_cleanly(tmp_path, capsys, ["mesh", src, "-o", tmp_path / "m.glb", *args], fragment)


def test_issue20_every_gaussian_huge(tmp_path, capsys):
    s = make_synthetic_object(300, seed=1)
    s.log_scales[:] = 60.0
    write_ply(s, tmp_path / "s.ply")
    _fails_cleanly(tmp_path, capsys, ["mesh", tmp_path / "s.ply", "-o", tmp_path / "m.glb", *FAST],
                   "everywhere on the grid", "wider than the whole grid", "higher --threshold")  # fmt: skip


# 6. unwritable outputs found first
@pytest.mark.parametrize(
    "out", ["/proc/out.ply", "/sys/out.glb", "{tmp}/s.ply/out.glb", "{tmp}/s.ply/a/b.glb"]
)
def test_issue20_unwritable_output(tmp_path, capsys, monkeypatch, out):
    import microdreamer.splat
    import microdreamer.splat_ply

    src = _splat_file(tmp_path)

    def never(*a, **k):
        raise AssertionError("the input was read before the output was checked")

    monkeypatch.setattr(microdreamer.splat, "read_ply", never)
    monkeypatch.setattr(microdreamer.splat_ply, "read_splat_arrays", never)
    _fails_cleanly(tmp_path, capsys, ["mesh", src, "-o", out.format(tmp=tmp_path)], "out")


# 8. config floats from YAML
@pytest.mark.parametrize(
    "yaml_text, fragment",
    [
        (
            "mesh:\n  threshold: 1.0e9\n",
            "never reaches the iso-level 1e+09",
        ),  # PyYAML: a string, read as a number
        ("mesh:\n  threshold: high\n", "threshold = 'high': must be a positive number or auto"),
        ("mesh:\n  threshold: .nan\n", "must be a finite number"),
        ("field:\n  resolution: 12.5\n", "must be an integer"),
        ("field:\n  resolution: '1e30'\n", "must be between 2 and 2048"),
        ("mesh: [1, 2]\n", "ExportConfig.mesh = [1, 2]: must be MeshConfig"),
        ("mesh:\n  threshhold: 1\n", "unknown MeshConfig field"),
        ("[" * 5000, "not valid YAML"),
    ],
)
def test_issue20_preset_values(tmp_path, capsys, yaml_text, fragment):
    src = _splat_file(tmp_path)
    (tmp_path / "p.yaml").write_text(yaml_text)
    args = ["mesh", src, "-o", tmp_path / "m.glb", "--config", tmp_path / "p.yaml", "--resolution", 16]
    if "resolution" in yaml_text:
        args = args[:-2]
    _fails_cleanly(tmp_path, capsys, args, fragment)


# 10. parser gaps
def test_issue20_bare_property_and_non_numeric_ascii(tmp_path, capsys):
    src = _splat_file(tmp_path, n=3)
    src.write_bytes(src.read_bytes().replace(b"property float nx\n", b"property\n"))
    _fails_cleanly(
        tmp_path, capsys, ["mesh", src, "-o", tmp_path / "m.glb"], "malformed PLY header line 'property'"
    )
    rows = _rows(3)
    head = "ply\nformat ascii 1.0\nelement vertex 3\n" + "".join(f"property float {p}\n" for p in PROPS)
    body = "\n".join(" ".join(repr(float(v)) for v in r) for r in rows).replace(
        repr(float(rows[1, 2])), "z?", 1
    )
    (tmp_path / "a.ply").write_text(head + "end_header\n" + body + "\n")
    _fails_cleanly(
        tmp_path, capsys, ["mesh", tmp_path / "a.ply", "-o", tmp_path / "m.glb"], "non-numeric value 'z?'"
    )


# 11. files beside the output
def test_issue20_textured_obj_does_not_clobber_neighbours(tmp_path, capsys):
    src = _splat_file(tmp_path)
    (tmp_path / "photo.png").write_bytes(b"my holiday photo")
    args = [
        "mesh",
        src,
        "-o",
        tmp_path / "photo.obj",
        "--resolution",
        16,
        "--texture",
        "field",
        "--texture-size",
        16,
    ]
    _fails_cleanly(tmp_path, capsys, args, "also writes photo.mtl, photo.png", "photo.png already exists")
    # without a texture no .png/.mtl is written, so the name is fine
    assert run_cli("mesh", src, "-o", tmp_path / "photo.obj", *FAST) == 0
    assert (tmp_path / "photo.png").read_bytes() == b"my holiday photo"
    # a textured OBJ elsewhere says what it writes, and may replace its own earlier files
    (tmp_path / "t").mkdir()
    args[3] = tmp_path / "t" / "photo.obj"
    assert run_cli(*args) == 0
    assert "(+ photo.mtl, photo.png)" in capsys.readouterr().out
    assert run_cli(*args) == 0
    assert sorted(p.name for p in (tmp_path / "t").iterdir()) == ["photo.mtl", "photo.obj", "photo.png"]


# 12. SIGTERM during export
def test_issue20_sigterm_during_export_leaves_nothing(tmp_path):
    src = _splat_file(tmp_path)
    out = tmp_path / "m.glb"
    script = (
        "import os, signal, sys, pathlib\n"
        "orig = pathlib.Path.write_bytes\n"
        "def write_then_term(self, data):\n"
        "    n = orig(self, data)\n"
        "    assert self.name.startswith('.m.tmp-'), self\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    return n\n"
        "pathlib.Path.write_bytes = write_then_term\n"
        "from microdreamer.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    # no timer: a busy machine must not fail it; CI's own limit bounds a hang
    proc = subprocess.run([sys.executable, "-c", script, "mesh", str(src), "-o", str(out), *map(str, FAST)],
                          capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == 143, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == "error: terminated"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.ply"]


# 13. failed runs leave no debris
def test_issue20_mesh_into_new_folders_leaves_none_on_failure(tmp_path, capsys):
    src = _splat_file(tmp_path)
    _fails_cleanly(tmp_path, capsys, ["mesh", src, "-o", tmp_path / "newdir" / "sub" / "m.glb", "--threshold", 1e9,
                                      *FAST], "never reaches")  # fmt: skip
    assert run_cli("mesh", src, "-o", tmp_path / "newdir" / "sub" / "m.glb", *FAST) == 0
    assert (tmp_path / "newdir" / "sub" / "m.glb").is_file()


def test_issue20_generate_bad_image_leaves_no_folder(tmp_path, capsys):
    from PIL import Image

    Image.new("RGB", (1, 1), (200, 10, 10)).save(tmp_path / "dot.png")  # 9. a 1x1 RGB image
    _fails_cleanly(tmp_path, capsys, ["generate", tmp_path / "dot.png", "-o", tmp_path / "out", "--random-weights",
                                      "tiny"], "1x1 pixels", "GrabCut needs at least 16x16")  # fmt: skip
    (tmp_path / "empty").mkdir()  # a folder is a batch of the images in it; none there is bad input
    _fails_cleanly(tmp_path, capsys, ["generate", tmp_path / "empty", "-o", tmp_path / "out"], "no image")
    _fails_cleanly(
        tmp_path, capsys, ["generate", tmp_path / "dot.png", "-o", tmp_path / "dot.png"], "not a folder"
    )


def _tiny_dataset(folder, size=16, views=4, held_out=1):
    from microdreamer.cameras import orbit_cameras
    from microdreamer.data import save_dataset

    g = torch.Generator().manual_seed(0)
    c = views + held_out
    cams = orbit_cameras(torch.zeros(c), torch.linspace(0, 300, c), 2.0, 40.0, size, size)
    save_dataset(folder, torch.rand(c, size, size, 4, generator=g), cams, [False] * views + [True] * held_out)
    return folder


def _edit(folder, fn):
    import json

    meta = json.loads((folder / "transforms.json").read_text())
    fn(meta)
    (folder / "transforms.json").write_text(json.dumps(meta))


# 7. reconstruct checks transforms.json's types and values before any work
@pytest.mark.parametrize(
    "edit, fragment",
    [
        (lambda m: m.update(camera_angle_x="0.69"), "'camera_angle_x' is \"0.69\"; it must be a positive number"),
        (lambda m: m.update(camera_angle_x=None), "'camera_angle_x' is null"),
        (lambda m: m.update(camera_angle_x=0), "'camera_angle_x' is 0"),
        (lambda m: m.update(camera_angle_x=4.0), "it must be in (0, pi)"),
        (lambda m: [m.pop("camera_angle_x"), m.update(fl_x=0)], "'fl_x' is 0"),
        (lambda m: m.update(w="16"), "'w' is \"16\"; it must be a positive whole number"),
        (lambda m: m.update(h=16.5), "'h' is 16.5"),
        (lambda m: m["frames"][1].update(transform_matrix=[[0.0] * 4] * 4), "last row"),
        (lambda m: m["frames"][1].update(transform_matrix=[[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 0, 0], [0, 0, 0, 1]]),
         "singular 'transform_matrix'"),
        (lambda m: m["frames"][1]["transform_matrix"][0].__setitem__(0, float("nan")), "NaN or infinite entries"),
        (lambda m: m["frames"][1].update(held_out="no"), "'held_out' is \"no\""),
        (lambda m: m.update(near=2.0, far=1.0), "'near' 2 is not below 'far' 1"),
        (lambda m: m["frames"][0].update(fl_x="wide"), "frame 0 of"),
    ],
)  # fmt: skip
def test_issue20_reconstruct_bad_transforms(tmp_path, capsys, edit, fragment):
    data = _tiny_dataset(tmp_path / "data")
    _edit(data, edit)
    _fails_cleanly(tmp_path, capsys, ["reconstruct", data, "-o", tmp_path / "out", "--iters", 1], fragment)


def test_issue20_reconstruct_one_pixel_images(tmp_path, capsys):
    data = _tiny_dataset(tmp_path / "data", size=1)
    _fails_cleanly(tmp_path, capsys, ["reconstruct", data, "-o", tmp_path / "out", "--iters", 1],
                   "images are 1x1 pixels", "at least 11x11")  # fmt: skip


def test_issue20_reconstruct_failing_mesh_step_leaves_nothing(tmp_path, capsys):
    """The mesh step fails after training: no splat.ply alone, no folder; an existing folder's earlier
    outputs stay as they were; the advice names the setting reconstruct has (14)."""
    data = _tiny_dataset(tmp_path / "data")
    (tmp_path / "p.yaml").write_text("export:\n  mesh:\n    threshold: 1.0e9\n")
    args = ["reconstruct", data, "-o", tmp_path / "out", "--iters", 2, "--config", tmp_path / "p.yaml"]
    msg = _fails_cleanly(tmp_path, capsys, args, "export.mesh.threshold")
    assert "--threshold" not in msg
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "splat.ply").write_bytes(b"an earlier run")
    _fails_cleanly(tmp_path, capsys, args, "never reaches")


# 14. messages that say what is wrong
def test_issue20_far_gaussian_message(tmp_path, capsys):
    src = _splat_file(tmp_path, means=((7,), 1e30))
    msg = _fails_cleanly(tmp_path, capsys, ["mesh", src, "-o", tmp_path / "m.glb", *FAST], "#7 at (1e+30")
    assert "lie far from the others" in msg and "lower" not in msg


def test_issue20_directory_given_as_input(tmp_path, capsys):
    (tmp_path / "d.obj").mkdir()
    _fails_cleanly(
        tmp_path, capsys, ["render-views", tmp_path / "d.obj", "-o", tmp_path / "v"], "is a folder"
    )
    _fails_cleanly(tmp_path, capsys, ["render", tmp_path / "d.obj", "-o", tmp_path / "t.png"], "is a folder")
    # a folder given to mesh is a batch of the splats in it, which writes into a folder
    _fails_cleanly(tmp_path, capsys, ["mesh", tmp_path / "d.obj", "-o", tmp_path / "m.glb"],
                   "a batch writes one mesh per splat")  # fmt: skip


def test_issue20_nan_mesh_vertex(tmp_path, capsys):
    (tmp_path / "m.obj").write_text("v 0 0 0\nv 1 0 0\nv nan 1 0\nv 0 0 1\nf 1 2 3\nf 1 2 4\n")
    _fails_cleanly(tmp_path, capsys, ["render-views", tmp_path / "m.obj", "-o", tmp_path / "v", "--views", 4,
                                      "--held-out", 1, "--size", 16], "vertices are not finite numbers")  # fmt: skip


# progress under a pipe
def test_issue20_progress_lines_when_stderr_is_not_a_terminal(tmp_path, capsys, monkeypatch):
    from microdreamer import progress

    configure = progress.configure
    monkeypatch.setattr(
        progress, "configure", lambda mode="auto", **k: configure(mode, delay=0.0, interval=0.0)
    )
    src = _splat_file(tmp_path)
    assert run_cli("mesh", src, "-o", tmp_path / "m.glb", *FAST) == 0
    err = capsys.readouterr().err
    assert "density field: done in" in err and "marching cubes and cleanup of the 16^3 grid ..." in err
    assert "\r" not in err
