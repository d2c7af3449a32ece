"""Splat formats (microdreamer.formats): round trips through our writers, files written by a real writer
(PlayCanvas splat-transform, when it is on PATH: fixtures are made at test time from splats built here),
our files read by splat-transform, the shared sample splats, the glTF validator, and bad files.

Tolerances are per format and come from each format's quantisation (stated in its module's docstring).
Gaussians are compared by their covariance (a quaternion and its frame-flipped twin can differ and still
be the same Gaussian), their centre, log-scales, base colour, opacity (as a fraction) and SH bands.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from scipy.spatial import cKDTree

from microdreamer.errors import InputError
from microdreamer.formats import detect_format, is_splat, read_splat_arrays, write_splat
from microdreamer.formats.common import SplatArrays, sigmoid, transform_sh

SRC = Path(__file__).resolve().parents[1] / "src"
SAMPLES = Path(os.environ.get("MICRODREAMER_SAMPLES", "/work/shared/samples")) / "splats"
SPLAT_TRANSFORM = shutil.which("splat-transform")
needs_splat_transform = pytest.mark.skipif(
    SPLAT_TRANSFORM is None,
    reason="splat-transform is not on PATH (npm install -g @playcanvas/splat-transform; .ci/run does)",
)


def random_splat(n: int = 400, degree: int = 3, seed: int = 0) -> SplatArrays:
    """N Gaussians inside every format's ranges: centres on a jittered grid (distinct, so that formats
    that reorder can be matched by position), log-scales in [-5, -1], opacities in (0.02, 0.98), base
    colours in [0.1, 0.9], SH in [-0.3, 0.3]."""
    rng = np.random.default_rng(seed)
    side = math.ceil(n ** (1 / 3))
    grid = np.stack(np.meshgrid(*[np.arange(side)] * 3, indexing="ij"), -1).reshape(-1, 3)[:n]
    means = (grid - side / 2) * 0.1 + rng.uniform(-0.02, 0.02, (n, 3))
    q = rng.normal(size=(n, 4))
    k1 = (degree + 1) ** 2 - 1
    return SplatArrays(
        means=means.astype(np.float32),
        sh_dc=((rng.uniform(0.1, 0.9, (n, 3)) - 0.5) / 0.28209479177387814).astype(np.float32),
        sh_rest=rng.uniform(-0.3, 0.3, (n, k1, 3)).astype(np.float32),
        opacity_logits=rng.uniform(-4, 4, n).astype(np.float32),
        log_scales=rng.uniform(-5, -1, (n, 3)).astype(np.float32),
        quats=(q / np.linalg.norm(q, axis=1, keepdims=True)).astype(np.float32),
    )


def covariances(a: SplatArrays) -> np.ndarray:
    q = a.quats.astype(np.float64)
    w, x, y, z = (q / np.linalg.norm(q, axis=1, keepdims=True)).T
    R = np.stack([1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y),
                  2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x),
                  2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)], -1).reshape(-1, 3, 3)  # fmt: skip
    return np.einsum("nij,nj,nkj->nik", R, np.exp(2 * a.log_scales.astype(np.float64)), R)


@dataclass
class Tol:
    """Largest errors a format's quantisation allows (module docstrings give each one's reason)."""

    pos: float
    log_scale: float
    dc: float
    opacity: float  # as a fraction
    cov: float  # relative to the covariance's largest entry
    sh: float | None  # None: the format stores no SH bands


TOL = {
    "ply": Tol(0, 0, 0, 1e-6, 1e-5, 0),
    # 11-10-11 bits of a chunk's range (a chunk spans up to the 1.2 of random_splat(1500): 1.2 / 1023 / 2
    # on y); 10-bit quaternion components; SH 1/32 of [-4, 4]
    "compressed_ply": Tol(6e-4, 6e-3, 6e-3, 2.5e-3, 2e-2, 1.6e-2),
    # 12 fractional bits; log-scale 1/16; colour 1/(0.15 * 510); SH 5 bits (degree 1), 4 bits above
    # (half a 16/128 bucket, and the 8-bit rounding under it: 0.0625 + 1/256)
    "spz": Tol(1.3e-4, 3.2e-2, 1.4e-2, 2.5e-3, 7e-2, 6.7e-2),
    # 16-bit log-transformed positions; 256-entry codebooks; 8-bit quaternion components; opacity 1/255
    # (splat-transform truncates where we round)
    "sog": Tol(1e-4, 2e-2, 2e-2, 4e-3, 6e-2, 1.2e-2),  # quaternion bytes truncated too: 6e-2
    # float32 positions and scales; 8-bit colour; 8-bit quaternion components; no SH
    "splat": Tol(1e-6, 1e-5, 7.5e-3, 2.5e-3, 4e-2, None),
    # 16-bit bucket offsets (5/65534); float16 scales, rotations and SH
    "ksplat": Tol(1e-4, 1e-3, 7.5e-3, 2.5e-3, 5e-3, 1e-3),
    "glb": Tol(1e-6, 1e-5, 1e-5, 1e-6, 1e-5, 1e-6),
    "glb_spz": Tol(1.3e-4, 3.2e-2, 1.4e-2, 2.5e-3, 7e-2, 6.7e-2),
}
SUFFIX = {"ply": ".ply", "compressed_ply": ".compressed.ply", "spz": ".spz", "sog": ".sog", "splat": ".splat",
          "ksplat": ".ksplat", "glb": ".glb", "glb_spz": ".spz.glb"}  # fmt: skip


def matched(got: SplatArrays, ref: SplatArrays) -> SplatArrays:
    """``ref``'s Gaussians in ``got``'s order (formats that sort Gaussians are matched by position)."""
    assert len(got) == len(ref)
    dist, idx = cKDTree(ref.means).query(got.means)
    assert len(np.unique(idx)) == len(ref), "positions do not match one to one"
    return ref.subset(idx)


def assert_close(got: SplatArrays, ref: SplatArrays, tol: Tol, what: str) -> None:
    ref = matched(got, ref)
    np.testing.assert_allclose(got.means, ref.means, rtol=0, atol=tol.pos + 1e-7, err_msg=f"{what}: centres")
    np.testing.assert_allclose(got.log_scales, ref.log_scales, rtol=0, atol=tol.log_scale + 1e-6,
                               err_msg=f"{what}: log-scales")  # fmt: skip
    np.testing.assert_allclose(got.sh_dc, ref.sh_dc, rtol=0, atol=tol.dc + 1e-6, err_msg=f"{what}: f_dc")
    np.testing.assert_allclose(sigmoid(got.opacity_logits), sigmoid(ref.opacity_logits), rtol=0,
                               atol=tol.opacity + 1e-6, err_msg=f"{what}: opacity")  # fmt: skip
    cg, cr = covariances(got), covariances(ref)
    rel = np.abs(cg - cr).max(axis=(1, 2)) / np.abs(cr).max(axis=(1, 2))
    assert rel.max() <= tol.cov + 1e-5, f"{what}: covariance relative error {rel.max():.3g} > {tol.cov}"
    if tol.sh is None:
        assert got.sh_degree == 0
    else:
        assert got.sh_degree == ref.sh_degree, what
        np.testing.assert_allclose(
            got.sh_rest, ref.sh_rest, rtol=0, atol=tol.sh + 1e-6, err_msg=f"{what}: SH"
        )


# ----------------------------------------------------------------------------------------- our writers
@pytest.mark.parametrize("fmt", list(TOL))
@pytest.mark.parametrize("degree", [0, 1, 3])
def test_round_trip_through_our_writer(tmp_path, fmt, degree):
    ref = random_splat(400, degree, seed=degree)
    path = write_splat(ref, tmp_path / f"s{SUFFIX[fmt]}")
    assert detect_format(path) == ("glb" if fmt == "glb_spz" else fmt)
    got = read_splat_arrays(path)
    assert_close(got, ref, TOL[fmt], fmt)


@pytest.mark.parametrize("n", [1, 255, 257])
@pytest.mark.parametrize("fmt", ["compressed_ply", "spz", "sog", "ksplat"])
def test_odd_sizes(tmp_path, fmt, n):
    ref = random_splat(n, 1, seed=n)
    got = read_splat_arrays(write_splat(ref, tmp_path / f"s{SUFFIX[fmt]}"))
    assert len(got) == n
    assert_close(got, ref, TOL[fmt], fmt)


@pytest.mark.parametrize("level", [0, 1, 2])
def test_ksplat_levels(tmp_path, level):
    from microdreamer.formats import ksplat

    ref = random_splat(300, 2, seed=level)
    got = read_splat_arrays(ksplat.write(ref, tmp_path / "s.ksplat", level=level))
    sh = {0: 1e-6, 1: 1e-3, 2: 0.6 / 255}[level]  # float32, float16, 8 bits over the SH range
    tol = TOL["ksplat"] if level else Tol(1e-6, 1e-5, 7.5e-3, 2.5e-3, 1e-5, 0)
    assert_close(got, ref, Tol(tol.pos, tol.log_scale, tol.dc, tol.opacity, tol.cov, sh), f"level {level}")


@pytest.mark.parametrize("version", [2, 3, 4])
def test_spz_versions(tmp_path, version):
    from microdreamer.formats import spz

    ref = random_splat(300, 2, seed=version)
    got = read_splat_arrays(spz.write(ref, tmp_path / "s.spz", version=version))
    tol = TOL["spz"]
    if version == 2:  # x y z of the quaternion in 8 bits each (w derived: coarse near w = 0)
        tol = Tol(tol.pos, tol.log_scale, tol.dc, tol.opacity, 0.15, tol.sh)
    assert_close(got, ref, tol, f"SPZ v{version}")


def test_sog_folder(tmp_path):
    ref = random_splat(300, 1)
    meta = write_splat(ref, tmp_path / "sog" / "meta.json")
    for where in (meta, meta.parent):
        assert detect_format(where) == "sog"
        assert_close(read_splat_arrays(where), ref, TOL["sog"], str(where))


def test_gltf_json_and_node_transform(tmp_path):
    """A .gltf (JSON with a data URI) reads like the .glb; a node's rotation, scale and translation
    place the Gaussians (checked against the same map applied to the splat itself)."""
    from microdreamer.formats.common import FLIP_LUF, transform_arrays

    ref = random_splat(200, 2)
    assert_close(read_splat_arrays(write_splat(ref, tmp_path / "s.gltf")), ref, TOL["glb"], ".gltf")
    doc = json.loads((tmp_path / "s.gltf").read_text())
    angle = 0.7
    c, s = math.cos(angle / 2), math.sin(angle / 2)
    doc["nodes"][0].update({"rotation": [0, s, 0, c], "scale": [2, 2, 2], "translation": [1, 2, 3]})
    (tmp_path / "t.gltf").write_text(json.dumps(doc))
    Ry = np.array([[math.cos(angle), 0, math.sin(angle)], [0, 1, 0], [-math.sin(angle), 0, math.cos(angle)]])
    expect = transform_arrays(ref, FLIP_LUF @ Ry @ FLIP_LUF, 2.0, FLIP_LUF @ np.array([1.0, 2.0, 3.0]))
    got = read_splat_arrays(tmp_path / "t.gltf")
    assert_close(got, expect, Tol(1e-5, 1e-5, 1e-5, 1e-6, 1e-5, 1e-5), "node transform")


def test_sh_flip_matches_the_rotation_reference():
    """transform_sh (NumPy, used by the formats' frame changes) against microdreamer.splat.rotate_sh."""
    torch = pytest.importorskip("torch")
    from microdreamer.splat import rotate_sh

    rng = np.random.default_rng(3)
    sh = rng.normal(size=(5, 15, 3)).astype(np.float32)
    q = rng.normal(size=4)
    q /= np.linalg.norm(q)
    w, x, y, z = q
    R = np.array([[1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
                  [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
                  [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)]])  # fmt: skip
    for M in (R, np.diag([1.0, -1.0, -1.0]), np.diag([-1.0, -1.0, 1.0])):
        want = rotate_sh(torch.from_numpy(sh), torch.from_numpy(M)).numpy()
        np.testing.assert_allclose(transform_sh(sh, M), want, atol=1e-4)


def test_content_not_extension_decides(tmp_path):
    ref = random_splat(100, 1)
    for fmt in ("spz", "compressed_ply", "sog", "ksplat", "glb"):
        path = write_splat(ref, tmp_path / f"s{SUFFIX[fmt]}")
        renamed = path.rename(tmp_path / f"renamed_{fmt}.bin")
        assert detect_format(renamed) == fmt
        assert len(read_splat_arrays(renamed)) == 100
    (tmp_path / "plain.ply").write_bytes((tmp_path / "renamed_compressed_ply.bin").read_bytes())
    assert detect_format(tmp_path / "plain.ply") == "compressed_ply"


def test_a_mesh_glb_is_not_a_splat(tmp_path):
    import trimesh

    mesh = trimesh.creation.box()
    mesh.export(tmp_path / "box.glb")
    assert not is_splat(tmp_path / "box.glb")
    with pytest.raises(InputError, match="mesh, not a splat"):
        read_splat_arrays(tmp_path / "box.glb")


# ----------------------------------------------------------------------------------------- bad files
def _corruptions(path: Path, fmt: str) -> dict[str, bytes]:
    data = path.read_bytes()
    out = {"truncated": data[: len(data) // 2], "empty": b""}
    if fmt == "spz":
        out["wrong magic"] = b"XXXX" + data[4:]
        out["absurd count"] = data[:8] + (2**31 - 5).to_bytes(4, "little") + data[12:]
    elif fmt == "ksplat":
        out["wrong magic"] = b"\x07\x00" + data[2:]
        out["absurd count"] = data[:16] + (2**30).to_bytes(4, "little") + data[20:]
    elif fmt in ("ply", "compressed_ply"):
        out["wrong magic"] = b"plx" + data[3:]
        text = data[:2000].decode("latin-1")
        out["absurd count"] = (
            text.replace("element vertex 300", "element vertex 1000000000").encode("latin-1") + data[2000:]
        )
    elif fmt in ("glb", "glb_spz"):
        out["wrong magic"] = b"glTX" + data[4:]
        out["absurd count"] = data.replace(b'"count":300', b'"count":2000000000')
    elif fmt == "splat":
        out["truncated"] = data[:-7]
    return out


@pytest.mark.parametrize("fmt", ["ply", "compressed_ply", "spz", "ksplat", "splat", "glb", "glb_spz"])
def test_bad_files_refused_in_one_line(tmp_path, fmt):
    good = write_splat(random_splat(300, 1), tmp_path / f"good{SUFFIX[fmt]}")
    for what, data in _corruptions(good, fmt).items():
        bad = tmp_path / f"bad{SUFFIX[fmt]}"
        bad.write_bytes(data)
        with pytest.raises(InputError) as e:
            read_splat_arrays(bad)
        assert "\n" not in str(e.value) and str(bad) in str(e.value), (what, str(e.value))


def test_nan_refused(tmp_path):
    a = random_splat(50, 0)
    a.means[7, 1] = np.nan
    for fmt in ("glb", "splat", "ksplat"):
        from microdreamer.formats import dotsplat, gltf, ksplat

        writer = {
            "glb": gltf.write,
            "splat": dotsplat.write,
            "ksplat": lambda x, p: ksplat.write(x, p, level=0),
        }
        path = writer[fmt](a, tmp_path / f"n{SUFFIX[fmt]}")
        with pytest.raises(InputError, match="non-finite"):
            read_splat_arrays(path)


def test_bad_sog_refused(tmp_path):
    meta = write_splat(random_splat(100, 1), tmp_path / "f" / "meta.json")
    doc = json.loads(meta.read_text())
    doc["count"] = 10**9
    meta.write_text(json.dumps(doc))
    with pytest.raises(InputError, match="pixels for"):
        read_splat_arrays(meta)
    (meta.parent / "quats.webp").write_bytes(b"RIFF0000WEBPjunk")
    doc["count"] = 100
    meta.write_text(json.dumps(doc))
    with pytest.raises(InputError, match="not a readable WebP"):
        read_splat_arrays(meta)
    doc["means"]["files"] = ["../../etc/passwd", "x"]
    meta.write_text(json.dumps(doc))
    with pytest.raises(InputError, match="outside its folder"):
        read_splat_arrays(meta)
    bundle = write_splat(random_splat(100, 1), tmp_path / "b.sog")
    bundle.write_bytes(bundle.read_bytes()[:-200])
    with pytest.raises(InputError):
        read_splat_arrays(bundle)


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(SRC))
    return subprocess.run([sys.executable, "-m", "microdreamer.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip


def test_cli_convert_and_its_errors(tmp_path):
    write_splat(random_splat(300, 2), tmp_path / "in.ply")
    run = _cli("convert", "in.ply", "out.spz", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "300 Gaussians, SH degree 2" in run.stdout
    run = _cli("convert", "out.spz", "-o", "back.sog", cwd=tmp_path)
    assert run.returncode == 0 and (tmp_path / "back.sog").is_file(), run.stderr
    (tmp_path / "bad.spz").write_bytes((tmp_path / "out.spz").read_bytes()[:100])
    run = _cli("convert", "bad.spz", "never.ply", cwd=tmp_path)
    assert (
        run.returncode == 2 and run.stderr.startswith("error: ") and len(run.stderr.strip().splitlines()) == 1
    )
    assert "Traceback" not in run.stderr and not (tmp_path / "never.ply").exists()
    run = _cli("convert", "in.ply", "out.txt", cwd=tmp_path)
    assert run.returncode == 2 and "name a splat format" in run.stderr


# ----------------------------------------------------------------------------------- a real writer
def _splat_transform(*args: str, cwd: Path) -> None:
    run = subprocess.run(
        [SPLAT_TRANSFORM, "-q", "-w", *args], cwd=cwd, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stdout + run.stderr


@needs_splat_transform
@pytest.mark.parametrize(
    "out, fmt, extra",
    [("st.compressed.ply", "compressed_ply", ()), ("st.spz", "spz", ()), ("st3.spz", "spz", ("--spz-version", "3")),
     ("st.sog", "sog", ("-g", "cpu")), ("st_meta/meta.json", "sog", ("-g", "cpu")), ("st.glb", "glb", ())],
)  # fmt: skip
def test_files_written_by_splat_transform(tmp_path, out, fmt, extra):
    ref = random_splat(1500, 3, seed=7)
    write_splat(ref, tmp_path / "ref.ply")
    _splat_transform(*extra, "ref.ply", out, cwd=tmp_path)
    got = read_splat_arrays(tmp_path / out)
    tol = TOL[fmt]
    if fmt == "sog":  # splat-transform's SH palette holds 1024 entries for 1500 Gaussians: lossy, not exact
        tol = Tol(tol.pos, tol.log_scale, tol.dc, tol.opacity, tol.cov, 0.6)
        sh_err = np.abs(got.sh_rest - matched(got, ref).sh_rest).mean()
        assert sh_err < 0.05, f"SOG SH mean error {sh_err}"
    assert_close(got, ref, tol, f"splat-transform {out}")


@needs_splat_transform
@pytest.mark.parametrize("fmt", ["compressed_ply", "spz", "sog", "splat", "ksplat"])
def test_splat_transform_reads_our_files(tmp_path, fmt):
    """Our files read by splat-transform: the same count, bounds and values as our own reader gets."""
    from microdreamer.formats.ply import read as read_ply

    path = write_splat(random_splat(700, 2, seed=1), tmp_path / f"ours{SUFFIX[fmt]}")
    _splat_transform(path.name, "decoded.ply", cwd=tmp_path)
    theirs, ours = read_ply(tmp_path / "decoded.ply"), read_splat_arrays(path)
    assert len(theirs) == len(ours)
    np.testing.assert_allclose(theirs.means.min(0), ours.means.min(0), atol=1e-6)
    np.testing.assert_allclose(theirs.means.max(0), ours.means.max(0), atol=1e-6)
    # .splat: splat-transform decodes quaternion bytes as v/255*2-1, antimatter15's viewer (and we) as (v-128)/128
    cov = 0.05 if fmt == "splat" else 1e-5
    assert_close(theirs, ours, Tol(1e-6, 1e-5, 1e-5, 1e-6, cov, None if fmt == "splat" else 1e-6), fmt)


def _validator() -> Path | None:
    npm_root = (
        shutil.which("npm") and subprocess.run(["npm", "root", "-g"], capture_output=True, text=True).stdout
    )
    path = Path(npm_root.strip()) / "gltf-validator" if npm_root else None
    return path if path and (path / "index.js").is_file() and shutil.which("node") else None


@pytest.mark.skipif(
    _validator() is None, reason="the Khronos glTF validator is not installed (npm gltf-validator)"
)
@pytest.mark.parametrize("compress", [False, True])
def test_gltf_validator(tmp_path, compress):
    """The validator knows no KHR_gaussian_splatting yet: the only issues allowed are the ones that says
    (the unsupported extensions and their attribute names), exactly as for splat-transform's own .glb."""
    path = write_splat(random_splat(200, 2), tmp_path / ("s.spz.glb" if compress else "s.glb"))
    script = (f"const v=require({json.dumps(str(_validator()))});const fs=require('fs');"
              f"v.validateBytes(new Uint8Array(fs.readFileSync({json.dumps(str(path))})))"
              ".then(r=>console.log(JSON.stringify(r.issues.messages)))")  # fmt: skip
    run = subprocess.run(["node", "-e", script], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    issues = json.loads(run.stdout)
    unexpected = [
        m for m in issues
        if m["severity"] == 0
        and m["code"] != "UNSUPPORTED_EXTENSION"
        and not (m["code"] == "MESH_PRIMITIVE_INVALID_ATTRIBUTE" and "KHR_gaussian_splatting:" in m["pointer"])
    ]  # fmt: skip
    assert unexpected == []


# ---------------------------------------------------------------------------------- the shared samples
SAMPLE_FILES = sorted(SAMPLES.glob("*.ply")) if SAMPLES.is_dir() else []


@pytest.mark.skipif(not SAMPLE_FILES, reason=f"no shared sample splats in {SAMPLES}")
@pytest.mark.parametrize("sample", SAMPLE_FILES, ids=lambda p: p.name)
def test_samples_convert_and_read_back(tmp_path, sample):
    ref = read_splat_arrays(sample)
    small = len(ref) < 20000
    for fmt in ["spz", "compressed_ply", "glb", "ksplat", "splat"] + (["sog"] if small else []):
        got = read_splat_arrays(write_splat(ref, tmp_path / f"s{SUFFIX[fmt]}"))
        assert len(got) == len(ref), fmt
        extent = float(np.ptp(ref.means, axis=0).max())
        np.testing.assert_allclose(got.means.min(0), ref.means.min(0), atol=1e-3 * extent, err_msg=fmt)
        np.testing.assert_allclose(got.means.max(0), ref.means.max(0), atol=1e-3 * extent, err_msg=fmt)
        assert got.sh_degree == (0 if fmt == "splat" else ref.sh_degree), fmt


# ------------------------------------------------------------------------------- fast paths, same values
def test_axis_flip_fast_path_equals_the_general_map():
    """transform_arrays' axis-flip path (float32 sign flips) gives the general path's values exactly (a
    zero translation takes the general path: float64 matrix product, quaternion conjugation)."""
    from microdreamer.formats.common import FLIP_LUF, FLIP_RUB, transform_arrays

    a = random_splat(257, 3, seed=4)
    for M in (FLIP_RUB, FLIP_LUF, np.diag([-1.0, 1.0, 1.0]), np.eye(3)):
        fast, general = transform_arrays(a, M), transform_arrays(a, M, 1.0, np.zeros(3))
        for field in ("means", "sh_dc", "sh_rest", "opacity_logits", "log_scales", "quats"):
            assert getattr(fast, field).dtype == np.float32
            np.testing.assert_array_equal(getattr(fast, field), getattr(general, field), err_msg=field)


def test_ply_float32_fast_path_equals_the_column_path(tmp_path):
    """A float32 PLY (gathered from an [N, P] view) and the same values stored as doubles (converted
    column by column) read to the same arrays."""
    from microdreamer.formats.ply import property_names

    a = random_splat(301, 3, seed=5)
    path = write_splat(a, tmp_path / "f32.ply")
    names = property_names(3)
    ours = read_splat_arrays(path)
    header, _, body = path.read_bytes().partition(b"end_header\n")
    table = np.frombuffer(body, np.dtype([(p, "<f4") for p in names]))
    doubles = np.empty(len(table), np.dtype([(p, "<f8") for p in names]))
    for p in names:
        doubles[p] = table[p]
    (tmp_path / "f64.ply").write_bytes(header.replace(b"property float ", b"property double ")
                                       + b"end_header\n" + doubles.tobytes())  # fmt: skip
    theirs = read_splat_arrays(tmp_path / "f64.ply")
    for field in ("means", "sh_dc", "sh_rest", "opacity_logits", "log_scales", "quats"):
        np.testing.assert_array_equal(getattr(ours, field), getattr(theirs, field), err_msg=field)
        np.testing.assert_array_equal(getattr(ours, field), getattr(a, field), err_msg=field)


def test_spz_sh_codes_in_float32_equal_the_float64_formula():
    """The SPZ writer's in-place float32 SH quantisation gives the codes of the float64 formula (round to
    1/128, offset 128, bucket of 8 for degree 1 and 16 above, clip), on values at every bucket edge and
    far outside the range."""
    from microdreamer.formats.spz import _quantize_sh

    rng = np.random.default_rng(6)
    edges = (np.arange(-160, 161) / 128.0)[:, None] + np.array([-1e-7, 0.0, 1e-7, 0.5 / 128, -0.5 / 128])
    values = np.concatenate([edges.ravel(), rng.uniform(-3, 3, 4000), [1e30, -1e30, 3e38, -3e38, 0.0]])
    sh = np.resize(values, (len(values) // 45 + 1) * 45).reshape(-1, 15, 3).astype(np.float32)
    q8 = np.round(sh.astype(np.float64) * 128.0) + 128.0
    bucket = np.full(15, 16.0)
    bucket[:3] = 8.0
    b = bucket[None, :, None]
    want = np.clip(np.floor((q8 + b / 2) / b) * b, 0, 255).astype(np.uint8)
    np.testing.assert_array_equal(_quantize_sh(sh), want)


# ------------------------------------------------------------------------------- mesh and splat in one GLB
def _validator_issues(path: Path) -> list[dict]:
    script = (f"const v=require({json.dumps(str(_validator()))});const fs=require('fs');"
              f"v.validateBytes(new Uint8Array(fs.readFileSync({json.dumps(str(path))})))"
              ".then(r=>console.log(JSON.stringify(r.issues.messages)))")  # fmt: skip
    run = subprocess.run(["node", "-e", script], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


@pytest.mark.skipif(not SAMPLE_FILES, reason=f"no shared sample splats in {SAMPLES}")
def test_mesh_with_splat_one_glb(tmp_path):
    """``mesh --with-splat``: one GLB holding the textured mesh and every Gaussian (a POINTS primitive
    with KHR_gaussian_splatting, as splat-transform lays it out) in the mesh's frame; our reader reads the
    splat back; the validator finds no errors but the unsupported extension's (as for splat-transform's)."""
    src = SAMPLES / "dg_creative_tmp_8.8k.ply"
    run = _cli("mesh", str(src), "-o", "both.glb", "--with-splat", "--resolution", "64", "--texture-size", "256",
               "--device", "cpu", cwd=tmp_path)  # fmt: skip
    assert run.returncode == 0, run.stderr
    path = tmp_path / "both.glb"
    raw = path.read_bytes()
    (n,) = np.frombuffer(raw[12:16], "<u4")
    doc = json.loads(raw[20 : 20 + n])
    prims = [p for m in doc["meshes"] for p in m["primitives"]]
    splats = [p for p in prims if "KHR_gaussian_splatting" in p.get("extensions", {})]
    surfaces = [p for p in prims if p not in splats]
    assert len(splats) == 1 and splats[0]["mode"] == 0 and len(surfaces) == 1
    assert "TEXCOORD_0" in surfaces[0]["attributes"]
    assert "baseColorTexture" in doc["materials"][surfaces[0]["material"]]["pbrMetallicRoughness"]
    assert len(doc["scenes"][doc["scene"]]["nodes"]) == 2
    ref, got = read_splat_arrays(src), read_splat_arrays(path)
    assert len(got) == len(ref)  # every Gaussian
    # the same frame as the mesh: the splat's glTF positions are the mesh's coordinates (--up +y: the
    # splat's own), so reading them back through glTF's frame change (LUF -> the PLY's RDF) flips x and y
    from microdreamer.formats.common import FLIP_LUF, transform_arrays

    want = transform_arrays(ref, FLIP_LUF)  # in the file's order (the sample repeats some positions)
    np.testing.assert_allclose(got.means, want.means, atol=1e-6)
    np.testing.assert_allclose(got.log_scales, want.log_scales, atol=1e-5)
    np.testing.assert_allclose(got.sh_rest, want.sh_rest, atol=1e-6)
    np.testing.assert_allclose(sigmoid(got.opacity_logits), sigmoid(want.opacity_logits), atol=1e-6)
    mesh_pos = doc["accessors"][surfaces[0]["attributes"]["POSITION"]]
    splat_pos = doc["accessors"][splats[0]["attributes"]["POSITION"]]
    assert all(lo >= s - 0.05 for lo, s in zip(mesh_pos["min"], splat_pos["min"], strict=True))
    assert all(hi <= s + 0.05 for hi, s in zip(mesh_pos["max"], splat_pos["max"], strict=True))
    if _validator() is not None:
        unexpected = [
            m for m in _validator_issues(path)
            if m["severity"] == 0
            and m["code"] != "UNSUPPORTED_EXTENSION"
            and not (m["code"] == "MESH_PRIMITIVE_INVALID_ATTRIBUTE" and "KHR_gaussian_splatting:" in m["pointer"])
        ]  # fmt: skip
        assert unexpected == []
    run = _cli("mesh", str(src), "-o", "both.obj", "--with-splat", "--device", "cpu", cwd=tmp_path)
    assert run.returncode == 2 and "--with-splat" in run.stderr and not (tmp_path / "both.obj").exists()


def test_sog_kmeans_with_a_centre_per_row_keeps_the_rows():
    """With as many centres as sampled rows the SOG writer skips Lloyd's steps; they would change nothing
    (every row is its own nearest centre, duplicates included): the centres are the rows, each row labelled
    with a centre equal to it."""
    from microdreamer.formats.sog import kmeans

    rng = np.random.default_rng(8)
    x = np.concatenate([rng.normal(size=(300, 45)), np.repeat(rng.normal(size=(3, 45)), 4, 0)]).astype(
        np.float32
    )
    for sample in (len(x), 100):
        centres, labels = kmeans(x, len(x) if sample == len(x) else 100, sample=sample)
        if sample == len(x):
            np.testing.assert_array_equal(np.sort(centres, axis=0), np.sort(x, axis=0))
            np.testing.assert_array_equal(centres[labels], x)
        else:  # fewer centres than rows: Lloyd's steps run, every row labelled with its nearest centre
            d = ((x[:, None] - centres[None]) ** 2).sum(-1)
            np.testing.assert_allclose(d[np.arange(len(x)), labels], d.min(1), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("structured", [True, False])
def test_sog_grouped_labels_near_the_exact_ones(structured):
    """Palettes above EXACT_LABELS centres label rows by a grouped search: its squared error stays within
    20 % of the exact nearest centre's (on SH-like clustered rows, and on structureless uniform rows, the
    worst case: measured 1.10 at 20k x 8k), and it finds the exact centre for most clustered rows."""
    from microdreamer.formats.sog import EXACT_LABELS, _nearest, _nearest_grouped

    rng = np.random.default_rng(9)
    k = EXACT_LABELS + 500
    if structured:
        x = (rng.normal(size=(200, 45)) * 0.3)[rng.integers(0, 200, 12000)] + rng.normal(
            size=(12000, 45)
        ) * 0.03
    else:
        x = rng.uniform(-0.3, 0.3, (12000, 45))
    x = x.astype(np.float32)
    centres = x[rng.choice(len(x), k, replace=False)]
    exact, grouped = _nearest(x, centres), _nearest_grouped(x, centres)
    d_exact = ((x - centres[exact]) ** 2).sum(1).mean()
    d_grouped = ((x - centres[grouped]) ** 2).sum(1).mean()
    assert d_grouped <= 1.2 * d_exact, (d_grouped, d_exact)
    if structured:
        assert (exact == grouped).mean() > 0.8
