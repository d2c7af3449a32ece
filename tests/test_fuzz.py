"""Seeded fuzzing of the readers: mutated copies of shared sample splats (and their conversion), of
images (PNG and JPEG), of meshes (OBJ, PLY, GLB), of the dataset reader (mutated ``transforms.json``) and of
the config presets (mutated YAML).

Every case must either succeed or raise :class:`InputError` (one line, naming the file); never another
exception. Cases are small, so each takes milliseconds; a hang would show as the test not finishing, which
CI's own time limit catches: no wall-clock timer kills a case here (a busy machine must not fail a test).

Splats: header token edits, byte flips, truncations, line deletions and insertions, duplicated, renamed
and retyped properties, vertex counts, special values written into the data (NaN, inf, huge, tiny,
underflowing log-scales, zero quaternions) and ASCII tokens, one to three per case, on binary
little-endian, big-endian and ASCII copies of two samples (SH degree 0, and SH degree 3 with an extra
property); every splat that loads must convert to a mesh or raise InputError.

Images and meshes: see :func:`mutate_image` and :func:`mutate_mesh`; what loads must hold finite values
in range (pixels in [0, 1], vertices finite with an extent, faces in range).

Splat formats (SPZ v2-4, SOG, compressed PLY, .splat, .ksplat, GLB with and without SPZ compression; ours and
splat-transform's): see :func:`mutate_format`; what reads must be a consistent, finite splat.
"""

from __future__ import annotations

import collections
import dataclasses
import io
import logging
import struct
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import sample
from microdreamer.config import ExportConfig, FieldConfig, MeshConfig
from microdreamer.errors import InputError
from microdreamer.jobs.export import export_mesh, splat_to_mesh
from microdreamer.splat import Splat, read_ply

CASES = 2000
SEED = 20
RESOLUTION = 8  # small grids keep 2000 conversions within the suite's budget

VOCAB = [
    "float", "double", "int", "uchar", "char", "short", "uint", "int8", "float64", "list", "vertex", "face",
    "x", "y", "scale_0", "scale_2", "rot_0", "rot_3", "opacity", "f_dc_0", "f_rest_0", "f_rest_44", "nx",
    "0", "1", "-1", "7", "95", "97", "4294967296", "99999999999999999999", "1e9", "nan", "ascii",
    "binary_big_endian", "binary_little_endian", "element", "property", "comment", "end_header", "ply",
    "", "\x00", "\xe9", "1.0",
]  # fmt: skip
NON_FINITE = [np.nan, np.inf, -np.inf]
SPECIAL = [1e30, -1e30, 3.4e38, -3.4e38, 1e-30, -1e-45, 0.0, -200.0, 200.0, 88.8,
           -87.4, -104.0, 1e6, -1e6, 2.0**31]  # fmt: skip
ASCII_JUNK = [
    b"abc",
    b"1e999",
    b"--1",
    b"0x10",
    b"nan",
    b"inf",
    b"-inf",
    b"1e-400",
    b"",
    b"1.0.0",
    b"+",
    b"\xff",
]
#: mutation kinds and their probabilities (most edits of the header's structure make a file unreadable;
#: edits of the values reach the conversion)
KINDS = {"values": 0.3, "flip": 0.15, "retype": 0.1, "token": 0.1, "truncate": 0.05, "delete_line": 0.05,
         "duplicate": 0.05, "count": 0.05, "insert_line": 0.1, "swap_lines": 0.05}  # fmt: skip
#: half the cases edit only the data (so that many load and reach the conversion)
DATA_KINDS = {"values": 0.8, "flip": 0.2}
LINES = [b"comment fuzz", b"element face 3", b"property float x", b"property list uchar int vertex_indices",
         b"obj_info a", b"format ascii 1.0", b"", b"element vertex 2", b"property float transform",
         b"property double f_rest_0", b"end_header"]  # fmt: skip


def _subset(path, n: int) -> Splat:
    """The ``n`` Gaussians nearest the splat's median centre (a compact piece that has a surface)."""
    s = read_ply(path)
    c = s.means.median(0).values
    return s.subset((s.means - c).norm(dim=-1).argsort()[:n])


def _ply_bytes(s: Splat, fmt: str, extra: bool) -> bytes:
    """``s`` as a PLY in ``fmt`` (INRIA property order; an extra ``transform`` property when ``extra``)."""
    n, k1 = len(s), s.sh_rest.shape[1]
    names = ["x", "y", "z", "nx", "ny", "nz", "f_dc_0", "f_dc_1", "f_dc_2"]
    names += [f"f_rest_{i}" for i in range(3 * k1)]
    names += ["opacity", "scale_0", "scale_1", "scale_2", "rot_0", "rot_1", "rot_2", "rot_3"]
    cols = [s.means, torch.zeros(n, 3), s.sh_dc, s.sh_rest.permute(0, 2, 1).reshape(n, 3 * k1),
            s.opacity_logits[:, None], s.log_scales, s.quats]  # fmt: skip
    if extra:
        names.append("transform")
        cols.append(torch.ones(n, 1))
    table = torch.cat(cols, 1).numpy().astype(np.float32)
    header = f"ply\nformat {fmt} 1.0\nelement vertex {n}\n"
    header += "".join(f"property float {p}\n" for p in names) + "end_header\n"
    if fmt == "ascii":
        body = "".join(" ".join(f"{v:.9g}" for v in row) + "\n" for row in table).encode()
    else:
        body = table.astype("<f4" if fmt == "binary_little_endian" else ">f4").tobytes()
    return header.encode() + body


def _split(raw: bytes) -> tuple[list[bytes], bytes]:
    i = raw.find(b"end_header\n")
    if i < 0:
        return raw.split(b"\n"), b""
    return raw[: i + 10].split(b"\n"), raw[i + 11 :]


def _join(lines: list[bytes], body: bytes) -> bytes:
    return b"\n".join(lines) + b"\n" + body


def _property_lines(lines):
    return [i for i, line in enumerate(lines) if line.startswith(b"property")]


def mutate(raw: bytes, rng: np.random.Generator, fmt: str, kinds: dict = KINDS) -> tuple[bytes, str]:
    """One random mutation of a PLY file's bytes (kind drawn from ``kinds``); returns (bytes, kind)."""
    kind = str(rng.choice(list(kinds), p=list(kinds.values())))
    lines, body = _split(raw)
    if kind == "token":
        i = int(rng.integers(0, len(lines)))
        toks = lines[i].split(b" ")
        j = int(rng.integers(0, len(toks)))
        op = rng.integers(0, 4)
        if op == 0:
            toks[j] = str(rng.choice(VOCAB)).encode("latin-1")
        elif op == 1:
            del toks[j]
        elif op == 2:
            toks.insert(j, toks[j])
        else:
            toks[j] = toks[j][::-1]
        lines[i] = b" ".join(toks)
        return _join(lines, body), kind
    if kind == "flip":
        b = bytearray(raw)
        head = len(raw) - len(body)
        for _ in range(int(rng.integers(1, 9))):
            in_header = kinds is not DATA_KINDS and rng.random() < 0.3
            pos = int(rng.integers(0, head)) if in_header or not body else int(rng.integers(head, len(b)))
            b[pos] = int(rng.integers(0, 256))
        return bytes(b), kind
    if kind == "truncate":
        return raw[: int(rng.integers(0, len(raw)))], kind
    if kind == "delete_line":
        if fmt == "ascii" and body and rng.random() < 0.5:
            rows = body.split(b"\n")
            del rows[int(rng.integers(0, len(rows)))]
            return _join(lines, b"\n".join(rows)), kind
        del lines[int(rng.integers(0, len(lines)))]
        return _join(lines, body), kind
    props = _property_lines(lines)
    if kind == "duplicate" and props:
        i = int(rng.choice(props))
        if rng.random() < 0.5:
            lines.insert(int(rng.choice(props)), lines[i])
        else:
            other = lines[int(rng.choice(props))].split(b" ")[-1]
            lines[i] = b" ".join(lines[i].split(b" ")[:-1] + [other])
        return _join(lines, body), kind
    if kind == "retype" and props:
        i = int(rng.choice(props))
        toks = lines[i].split(b" ")
        toks[1] = str(
            rng.choice(["int", "uchar", "double", "short", "char", "uint", "ushort", "float"])
        ).encode()
        lines[i] = b" ".join(toks)
        return _join(lines, body), kind
    if kind == "values" and body:
        n_props = len(props)
        if fmt == "ascii":
            rows = body.split(b"\n")
            for _ in range(int(rng.integers(1, 6))):
                r = int(rng.integers(0, len(rows)))
                toks = rows[r].split(b" ")
                if toks:
                    c = int(rng.integers(0, len(toks)))
                    junk = rng.random() < 0.2
                    toks[c] = (
                        ASCII_JUNK[rng.integers(0, len(ASCII_JUNK))]
                        if junk
                        else repr(float(SPECIAL[rng.integers(0, len(SPECIAL))])).encode()
                    )
                rows[r] = b" ".join(toks)
            return _join(lines, b"\n".join(rows)), kind
        arr = bytearray(body)
        endian = "<f4" if fmt == "binary_little_endian" else ">f4"
        rows = len(body) // (4 * max(n_props, 1))
        for _ in range(int(rng.integers(1, 6))):
            if rows == 0 or n_props == 0:
                break
            pool = NON_FINITE if rng.random() < 0.05 else SPECIAL
            value = pool[rng.integers(0, len(pool))]
            col = int(rng.integers(0, n_props))
            r_sel = (
                range(rows) if rng.random() < 0.1 else [int(rng.integers(0, rows))]
            )  # sometimes a whole column
            for r in r_sel:
                off = 4 * (r * n_props + col)
                arr[off : off + 4] = np.array([value], dtype=endian).tobytes()
        return _join(lines, bytes(arr)), kind
    if kind == "count":
        for i, line in enumerate(lines):
            if line.startswith(b"element vertex"):
                last = line.split()[-1] if line.split() else b"0"
                n = int(last) if last.isdigit() else 96
                new = rng.choice([0, 1, n - 1, n + 1, 2 * n, 10**9, 10**12, 2**63, 10**40])
                lines[i] = b"element vertex " + str(int(new)).encode()
                break
        return _join(lines, body), kind
    if kind == "insert_line":
        lines.insert(int(rng.integers(1, len(lines) + 1)), LINES[rng.integers(0, len(LINES))])
        return _join(lines, body), kind
    i, j = (int(v) for v in rng.integers(0, len(lines), 2))
    lines[i], lines[j] = lines[j], lines[i]
    return _join(lines, body), "swap_lines"


@pytest.fixture(scope="module")
def bases():
    """(name, bytes, format) of the unmutated inputs: two samples, three formats."""
    pieces = [
        (_subset(sample("splats/dg_creative_tmp_8.8k.ply"), 96), False),
        (_subset(sample("splats/supersplat_fruit_drops_4.7k_sh3.ply"), 64), True),
    ]
    out = []
    for k, (s, extra) in enumerate(pieces):
        for fmt in ("binary_little_endian", "binary_little_endian", "binary_big_endian", "ascii"):
            out.append((f"base{k}", _ply_bytes(s, fmt, extra), fmt))
    return out


def test_unmutated_bases_convert(tmp_path, bases):
    """The fuzz test's starting points load and mesh (so its outcomes measure the mutations)."""
    for i, (_, raw, _) in enumerate(bases):
        path = tmp_path / f"b{i}.ply"
        path.write_bytes(raw)
        conv = splat_to_mesh(read_ply(path), FieldConfig(resolution=RESOLUTION), MeshConfig(threshold=0.5),
                             torch.device("cpu"), name=str(path))  # fmt: skip
        assert conv.mesh.num_faces > 0


def _check_error(e: InputError, path) -> None:
    msg = str(e)
    assert msg and "\n" not in msg, msg
    assert str(path) in msg or "--" in msg, msg


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_fuzzed_splats_load_or_fail_cleanly_and_mesh_or_fail_cleanly(tmp_path, bases, caplog, device):
    """Every 10th splat that loads goes through the whole export instead (silhouette carving,
    colour-field texture, GLB written), the rest through the field and mesh stages."""
    rng = np.random.default_rng(SEED)
    counts: collections.Counter = collections.Counter()
    kinds: collections.Counter = collections.Counter()
    failures = []
    path = tmp_path / "case.ply"
    field, mesh_cfg, dev = FieldConfig(resolution=RESOLUTION), MeshConfig(threshold=0.5), torch.device(device)
    base_cfg = ExportConfig()
    textured = dataclasses.replace(  # the export's path, silhouette carving included
        base_cfg,
        field=field,
        mesh=dataclasses.replace(mesh_cfg, carve=base_cfg.mesh.carve),
        texture=dataclasses.replace(base_cfg.texture, mode="field", size=16),
    )
    out = tmp_path / "case.glb"
    loaded = 0
    start = time.perf_counter()
    with caplog.at_level(logging.ERROR):  # the warnings of clamped and dropped Gaussians are expected
        for case in range(CASES):
            _, raw, fmt = bases[int(rng.integers(0, len(bases)))]
            applied = []
            kinds_of_case = DATA_KINDS if rng.random() < 0.5 else KINDS
            for _ in range(int(rng.choice([1, 1, 1, 2, 3]))):
                raw, kind = mutate(raw, rng, fmt, kinds_of_case)
                applied.append(kind)
            kinds.update(applied)
            path.write_bytes(raw)
            stage = "load"
            try:
                try:
                    splat = read_ply(path)
                except InputError as e:
                    _check_error(e, path)
                    counts["load: InputError"] += 1
                    continue
                stage = "mesh"
                loaded += 1
                try:
                    if loaded % 10 == 0:
                        result = export_mesh(splat, out, textured, dev, name=str(path))
                        mesh = result.mesh
                        assert out.is_file() and mesh.has_texture
                        out.unlink()
                    else:
                        mesh = splat_to_mesh(splat, field, mesh_cfg, dev, name=str(path)).mesh
                except InputError as e:
                    _check_error(e, path)
                    assert not out.exists()
                    counts["loaded, mesh: InputError"] += 1
                    continue
                assert mesh.num_faces > 0 and np.isfinite(mesh.vertices).all()
                counts["loaded, meshed"] += 1
            except Exception as e:  # anything but InputError is a defect
                failures.append((case, applied, stage, f"{type(e).__name__}: {e}"))
                (tmp_path / f"failure_{case}.ply").write_bytes(raw)
    seconds = time.perf_counter() - start
    print(f"\nfuzz: {CASES} cases in {seconds:.1f} s; outcomes {dict(counts)}; mutations {dict(kinds)}")
    assert not failures, failures[:10]
    assert sum(counts.values()) == CASES
    # the mutations reach both stages: a fuzz whose cases all fail to load would test nothing
    assert counts["load: InputError"] >= CASES // 10
    assert counts["loaded, meshed"] >= CASES // 10
    assert counts["loaded, mesh: InputError"] >= 1


# ------------------------------------------------------------------------------------- transforms.json
JSON_CASES = 600
JSON_SEED = 43
#: values written into a transforms.json: wrong types, non-finite and huge numbers, paths that climb out
JSON_VALUES = [None, True, 0, -1, 1e308, -1e308, 1e39, 1e-320, "nan", "abc", "", [], {}, [1, 2], [[1e300] * 4] * 4,
               [[0.0] * 4] * 4, 2**64, 3.0, 0.5, "r_0.png", "../outside.png", "/etc/hostname", "sub/../../x.png",
               "link.png", "missing.png", "imgs", "r_0", "\x00", float("nan"), float("inf")]  # fmt: skip
JSON_KEYS = ["camera_angle_x", "camera_angle_y", "fl_x", "fl_y", "cx", "cy", "w", "h", "frames", "file_path",
             "transform_matrix", "held_out", "aabb_scale"]  # fmt: skip


def _json_dataset(folder):
    """Three 8x8 RGBA views and their transforms.json (a valid dataset), a folder, an outside image and a
    symlink to it beside the dataset."""
    from PIL import Image

    folder.mkdir()
    frames = []
    for i in range(3):
        Image.new("RGBA", (8, 8), (40 * i, 90, 200, 255)).save(folder / f"r_{i}.png")
        m = np.eye(4)
        m[:3, 3] = [0.0, 0.0, 2.0 + i]
        frames.append({"file_path": f"r_{i}.png", "transform_matrix": m.tolist(), "held_out": i == 2})
    (folder / "imgs").mkdir()
    Image.new("RGBA", (8, 8)).save(folder.parent / "outside.png")
    (folder / "link.png").symlink_to(folder.parent / "outside.png")
    return {"camera_angle_x": 0.7, "w": 8, "h": 8, "frames": frames}


def _mutate_json(meta, rng):
    """One structural edit of the parsed JSON: a value replaced, a key deleted or added, a frame dropped
    or duplicated; or (as text) a byte flipped, the text truncated."""
    import copy
    import json

    meta = copy.deepcopy(meta)
    kind = str(
        rng.choice(["value", "value", "frame_value", "frame_value", "delete", "add", "frames", "text"])
    )
    pick = JSON_VALUES[int(rng.integers(0, len(JSON_VALUES)))]
    frames = meta.get("frames") if isinstance(meta, dict) else None
    if kind == "value" and isinstance(meta, dict) and meta:
        meta[str(rng.choice(list(meta)))] = pick
    elif kind == "frame_value" and isinstance(frames, list) and frames and isinstance(frames[0], dict):
        frame = frames[int(rng.integers(0, len(frames)))]
        if isinstance(frame, dict):
            key = str(rng.choice(["file_path", "transform_matrix", "held_out", "fl_x", "w"]))
            if key == "transform_matrix" and isinstance(frame.get(key), list) and rng.random() < 0.5:
                row, col = (int(v) for v in rng.integers(0, 4, 2))
                frame[key][row % len(frame[key])] = list(frame[key][row % len(frame[key])])
                frame[key][row % len(frame[key])][col % 4] = pick
            else:
                frame[key] = pick
    elif kind == "delete" and isinstance(meta, dict) and meta:
        del meta[str(rng.choice(list(meta)))]
    elif kind == "add" and isinstance(meta, dict):
        meta[str(rng.choice(JSON_KEYS))] = pick
    elif kind == "frames" and isinstance(frames, list) and frames:
        i = int(rng.integers(0, len(frames)))
        frames.insert(i, frames[i]) if rng.random() < 0.5 else frames.pop(i)
    text = json.dumps(meta, allow_nan=True).encode()
    if kind == "text":
        raw = bytearray(text)
        if rng.random() < 0.5 and raw:
            raw[int(rng.integers(0, len(raw)))] = int(rng.integers(0, 256))
        else:
            raw = raw[: int(rng.integers(0, len(raw) + 1))]
        text = bytes(raw)
    return meta, text, kind


def _one_line(e, *names):
    msg = str(e)
    assert msg and "\n" not in msg, msg
    assert any(str(n) in msg for n in names), msg


def _run_cases(cases, run):
    """Run each case; (outcome counts, failures). No timer: a hang shows as the test not finishing."""
    counts: collections.Counter = collections.Counter()
    failures = []
    for i, case in enumerate(cases):
        try:
            counts[run(case)] += 1
        except Exception as e:  # anything but InputError (turned into an outcome by run) is a defect
            failures.append((i, f"{type(e).__name__}: {e}"))
    return counts, failures


def test_fuzzed_transforms_json_loads_or_fails_cleanly(tmp_path):
    """Mutated transforms.json files: each loads (finite cameras, images inside the folder) or is one
    InputError line naming the file or the image; never a traceback, a hang, or a read outside."""

    from microdreamer.data.dataset import load_dataset

    data = tmp_path / "data"
    base = _json_dataset(data)
    rng = np.random.default_rng(JSON_SEED)
    kinds: collections.Counter = collections.Counter()
    cases = []
    for _ in range(JSON_CASES):
        meta = base
        for _ in range(int(rng.choice([1, 1, 2, 3]))):
            meta, text, kind = _mutate_json(meta, rng)
            kinds[kind] += 1
        cases.append(text)

    def run(text):
        (data / "transforms.json").write_bytes(text)
        try:
            ds = load_dataset(data)
        except InputError as e:
            _one_line(e, data)
            return "InputError"
        assert torch.isfinite(ds.images).all() and len(ds) >= 1
        assert torch.isfinite(ds.cameras.viewmats).all() and torch.isfinite(ds.cameras.Ks).all()
        return "loaded"

    counts, failures = _run_cases(cases, run)
    print(f"\ntransforms.json fuzz: {JSON_CASES} cases; outcomes {dict(counts)}; mutations {dict(kinds)}")
    assert not failures, failures[:10]
    assert sum(counts.values()) == JSON_CASES
    assert counts["InputError"] >= JSON_CASES // 10 and counts["loaded"] >= JSON_CASES // 20


# ------------------------------------------------------------------------------------------ YAML presets
YAML_CASES = 800
YAML_SEED = 44
YAML_LINES = ["sir: {iterations: 1000000000}", "views_size: 50000", "seed: -1", "field: {resolution: 1e9}",
              "a: &a [1, 2]\nb: [*a, *a]", "!!python/object/apply:os.system ['true']", "x: !!binary AAAA",
              "mesh:\n  threshold: .nan", "mesh: {threshold: .inf}", "[[[[[[[[[[[[[[[[[[[[[[[[", "{", "- 1",
              "field:\n\tresolution: 64", "field: {resolution: 128, resolution: 256}", "'': 1", "? [1]\n: 2",
              "texture: {size: 99999999999999999999}", "sir: {seed: 18446744073709551616}", "null", "~: 3",
              "%YAML 9.9\n---", "--- |\n  text", "field: {mode: upstream}", "export: {field: {resolution: 8}}"]  # fmt: skip
YAML_TOKENS = ["1", "-1", "0", "1e309", "nan", ".nan", ".inf", "true", "null", "~", "'x'", "[]", "{}", "&a",
               "*a", "!!str", "1_000", "0x10", "0o7", "2001-01-01", "\u00e9", "\x00", "::", "- ", "#"]  # fmt: skip


def _mutate_yaml(text, rng):
    lines = text.split("\n")
    kind = str(rng.choice(["insert", "token", "token", "delete", "flip", "truncate", "indent", "swap"]))
    i = int(rng.integers(0, len(lines)))
    if kind == "insert":
        lines.insert(i, YAML_LINES[int(rng.integers(0, len(YAML_LINES)))])
    elif kind == "token":  # a value (after the colon) or a key replaced
        line = lines[i]
        token = YAML_TOKENS[int(rng.integers(0, len(YAML_TOKENS)))]
        head, colon, _ = line.partition(":")
        lines[i] = (
            f"{head}: {token}"
            if colon and rng.random() < 0.7
            else f"{' ' * (len(line) - len(line.lstrip()))}{token}: 1"
        )
    elif kind == "delete":
        lines.pop(i)
    elif kind == "indent":
        lines[i] = " " * int(rng.integers(0, 5)) + lines[i].lstrip()
    elif kind == "swap":
        j = int(rng.integers(0, len(lines)))
        lines[i], lines[j] = lines[j], lines[i]
    text = "\n".join(lines)
    raw = text.encode("utf-8", "surrogatepass")
    if kind == "flip" and raw:
        b = bytearray(raw)
        b[int(rng.integers(0, len(b)))] = int(rng.integers(0, 256))
        return b.decode("utf-8", "replace") if rng.random() < 0.5 else bytes(b), kind
    if kind == "truncate":
        return raw[: int(rng.integers(0, len(raw) + 1))], kind
    return text, kind


def test_fuzzed_yaml_presets_load_or_fail_cleanly(tmp_path):
    """Mutated copies of the shipped presets (and of the configs they load into): each loads into its config
    or is one InputError line naming the file; never a traceback or a hang."""
    from pathlib import Path

    import microdreamer
    from microdreamer import config

    presets = sorted((Path(microdreamer.__file__).parent / "presets").glob("*.yaml"))
    bases = []
    for path in presets:  # the config each preset is written for: the first that loads it
        for cls in (
            config.GenerateConfig,
            config.ExportConfig,
            config.ReconstructJobConfig,
            config.DemoConfig,
        ):
            try:
                config.load_preset(cls, path)
            except InputError:
                continue
            bases.append((path.read_text(), cls))
            break
    assert len(bases) == len(presets)
    rng = np.random.default_rng(YAML_SEED)
    kinds: collections.Counter = collections.Counter()
    cases = []
    for _ in range(YAML_CASES):
        text, cls = bases[int(rng.integers(0, len(bases)))]
        for _ in range(int(rng.choice([1, 1, 2, 3]))):
            text, kind = _mutate_yaml(text if isinstance(text, str) else text.decode("utf-8", "replace"), rng)
            kinds[kind] += 1
        cases.append((text, cls))
    target = tmp_path / "preset.yaml"

    def run(case):
        text, cls = case
        target.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass"))
        try:
            cfg = config.load_preset(cls, target)
        except InputError as e:
            _one_line(e, target)
            return "InputError"
        assert isinstance(cfg, cls)
        return "loaded"

    counts, failures = _run_cases(cases, run)
    print(f"\nYAML fuzz: {YAML_CASES} cases; outcomes {dict(counts)}; mutations {dict(kinds)}")
    assert not failures, failures[:10]
    assert sum(counts.values()) == YAML_CASES
    assert counts["InputError"] >= YAML_CASES // 10 and counts["loaded"] >= YAML_CASES // 20


# ============================================================================================== images
IMAGE_CASES = 1500
IMAGE_SEED = 43
#: (width, height) written into PNG IHDR / JPEG SOF sizes (16 bits there): empty, small, and sizes past
#: Pillow's decompression-bomb limit (the readers must refuse those before allocating); none between,
#: which would only make the fuzz slow (a truncated 60-megapixel image is allocated, then refused)
IMAGE_SIZES = [(0, 0), (0, 20), (24, 0), (1, 1), (3, 999), (999, 3), (999, 999), (65535, 65535),
               (2**20, 2**20), (2**31 - 1, 1), (1, 2**31 - 1)]  # fmt: skip
PNG_BIT_DEPTHS = [1, 2, 3, 4, 8, 16, 0, 255]
PNG_COLOUR_TYPES = [0, 1, 2, 3, 4, 5, 6, 7]
EXIF_ORIENTATIONS = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 255, 65535]


def _image_bases() -> list[tuple[str, bytes]]:
    """(suffix, bytes) of small images of every kind the readers meet: 8-bit RGBA, 16-bit greyscale,
    palette with a transparent entry, RGB, greyscale + alpha (PNG); RGB with an EXIF orientation and
    greyscale (JPEG)."""
    from PIL import Image

    yy, xx = np.mgrid[0:20, 0:24]
    disc = ((yy - 10) ** 2 + (xx - 12) ** 2 < 49).astype(np.uint8) * 255
    rgba = np.dstack([xx * 10, yy * 12, 255 - xx * 10, disc]).astype(np.uint8)
    on_white = np.where(disc[..., None] > 0, rgba[..., :3], 255).astype(np.uint8)  # for GrabCut to find
    grey16 = np.where(disc > 0, 60000 - yy * 1500, 2000).astype(np.uint16)

    def png(im, **kw) -> bytes:
        buf = io.BytesIO()
        im.save(buf, format="PNG", **kw)
        return buf.getvalue()

    def jpeg(im, **kw) -> bytes:
        buf = io.BytesIO()
        im.save(buf, format="JPEG", quality=90, **kw)
        return buf.getvalue()

    palette = Image.fromarray(rgba[..., :3]).quantize(8)
    exif = Image.Exif()
    exif[0x0112] = 6
    return [
        (".png", png(Image.fromarray(rgba, "RGBA"))),
        (".png", png(Image.fromarray(grey16))),
        (".png", png(palette, transparency=0)),
        (".png", png(Image.fromarray(on_white, "RGB"))),
        (".png", png(Image.fromarray(rgba[..., 2:], "LA"))),
        (".jpg", jpeg(Image.fromarray(on_white, "RGB"), exif=exif)),
        (".jpg", jpeg(Image.fromarray(on_white[..., 0], "L"))),
    ]


def _png_chunks(raw: bytes) -> list[tuple[int, bytes]]:
    """(offset, type) of each PNG chunk (as far as the lengths hold)."""
    out, pos = [], 8
    while pos + 8 <= len(raw):
        n = struct.unpack(">I", raw[pos : pos + 4])[0]
        out.append((pos, raw[pos + 4 : pos + 8]))
        pos += 12 + n
    return out


def _fix_png_crcs(raw: bytes) -> bytes:
    """The PNG with every chunk's CRC recomputed (as far as the lengths hold), so that Pillow's CRC
    check does not stop a mutated header or data before the decoder sees them."""
    import zlib

    b = bytearray(raw)
    for pos, _ in _png_chunks(raw):
        n = struct.unpack(">I", raw[pos : pos + 4])[0]
        end = pos + 8 + n
        if end + 4 <= len(b):
            b[end : end + 4] = struct.pack(">I", zlib.crc32(bytes(b[pos + 4 : end])))
    return bytes(b)


def mutate_image(raw: bytes, rng: np.random.Generator) -> tuple[bytes, str]:
    """One random mutation of a PNG or JPEG file's bytes; returns (bytes, kind). Kinds: byte flips
    (header-biased), truncation, inserted and deleted bytes, PNG IHDR fields (width, height, bit depth,
    colour type), PNG chunk lengths and duplicated chunks, JPEG SOF sizes, and the EXIF orientation."""
    kinds = ["flip", "truncate", "insert", "delete", "size", "format", "chunk", "exif"]
    kind = str(rng.choice(kinds, p=[0.25, 0.1, 0.1, 0.1, 0.15, 0.1, 0.1, 0.1]))
    b = bytearray(raw)
    is_png = raw[:8] == b"\x89PNG\r\n\x1a\n"
    if kind == "flip":
        for _ in range(int(rng.integers(1, 6))):
            pos = (
                int(rng.integers(0, min(len(b), 128))) if rng.random() < 0.5 else int(rng.integers(0, len(b)))
            )
            b[pos] = int(rng.integers(0, 256))
    elif kind == "truncate":
        del b[int(rng.integers(0, len(b))) :]
    elif kind == "insert":
        pos = int(rng.integers(0, len(b) + 1))
        b[pos:pos] = rng.integers(0, 256, int(rng.integers(1, 64))).astype(np.uint8).tobytes()
    elif kind == "delete":
        pos = int(rng.integers(0, len(b)))
        del b[pos : pos + int(rng.integers(1, 64))]
    elif kind == "size":
        w, h = IMAGE_SIZES[int(rng.integers(0, len(IMAGE_SIZES)))]
        if is_png and len(b) >= 24:
            b[16:24] = struct.pack(">II", w, h)
        else:
            sof = raw.find(b"\xff\xc0")
            if sof >= 0 and sof + 9 <= len(b):
                b[sof + 5 : sof + 9] = struct.pack(">HH", min(h, 0xFFFF), min(w, 0xFFFF))
    elif kind == "format":
        if is_png and len(b) >= 26:
            b[24] = int(rng.choice(PNG_BIT_DEPTHS))
            b[25] = int(rng.choice(PNG_COLOUR_TYPES))
        else:  # JPEG: components / precision of the SOF
            sof = raw.find(b"\xff\xc0")
            if sof >= 0 and sof + 10 <= len(b):
                b[sof + 4 if rng.random() < 0.5 else sof + 9] = int(rng.choice([0, 1, 2, 3, 4, 12, 16, 255]))
    elif kind == "chunk" and is_png:
        chunks = _png_chunks(raw)
        pos, _ = chunks[int(rng.integers(0, len(chunks)))]
        if rng.random() < 0.5:
            b[pos : pos + 4] = struct.pack(">I", int(rng.choice([0, 1, 13, 2**31 - 1, 2**32 - 1])))
        else:
            n = struct.unpack(">I", raw[pos : pos + 4])[0]
            b[pos:pos] = raw[pos : pos + 12 + n]  # the chunk twice
    elif kind == "exif" and not is_png:
        from PIL import Image

        value = int(rng.choice(EXIF_ORIENTATIONS))
        try:  # re-encoded with the new tag, when the (perhaps already mutated) file still decodes
            with Image.open(io.BytesIO(raw)) as im:
                exif = im.getexif()
                exif[0x0112] = value
                buf = io.BytesIO()
                im.save(buf, format="JPEG", quality=90, exif=exif)
            return buf.getvalue(), kind
        except Exception:
            kind = "flip"
            b[int(rng.integers(0, len(b)))] ^= 0xFF
    else:
        kind = "flip"
        b[int(rng.integers(0, len(b)))] ^= 0xFF
    if is_png and rng.random() < 0.7:
        return _fix_png_crcs(bytes(b)), kind
    return bytes(b), kind


def _check_pixels(arr: np.ndarray, channels: int, what: str) -> None:
    assert arr.ndim == 3 and arr.shape[2] == channels and min(arr.shape[:2]) >= 1, (what, arr.shape)
    if arr.dtype == np.uint8:
        return
    assert np.isfinite(arr).all() and arr.min() >= 0.0 and arr.max() <= 1.0, what


def test_fuzzed_images_read_or_fail_cleanly(tmp_path, caplog):
    """Every mutated image through the three image readers (an input image, evaluate's reference
    picture, a texture); every 8th one that reads is also prepared (mask, recentring, 32^2)."""
    from microdreamer.config import ImageConfig
    from microdreamer.data.image import load_image, prepare_image
    from microdreamer.mesh.load import load_texture_image
    from microdreamer.metrics_clip import read_image_on_white

    rng = np.random.default_rng(IMAGE_SEED)
    bases = _image_bases()
    counts: collections.Counter = collections.Counter()
    kinds: collections.Counter = collections.Counter()
    failures = []
    readers = {
        "input": lambda p: _check_pixels(arrays.setdefault("input", load_image(p)), 4, "input"),
        "evaluate": lambda p: _check_pixels(read_image_on_white(p), 3, "evaluate"),
        "texture": lambda p: _check_pixels(load_texture_image(p), 3, "texture"),
    }
    read = 0
    start = time.perf_counter()
    with caplog.at_level(logging.ERROR):
        for case in range(IMAGE_CASES):
            suffix, raw = bases[int(rng.integers(0, len(bases)))]
            applied = []
            for _ in range(int(rng.choice([1, 1, 2, 3]))):
                raw, kind = mutate_image(raw, rng)
                applied.append(kind)
            kinds.update(applied)
            path = tmp_path / f"case{suffix}"
            path.write_bytes(raw)
            outcome, arrays = [], {}
            for name, reader in readers.items():
                try:
                    reader(path)
                    outcome.append(f"{name} ok")
                except InputError as e:
                    _check_error(e, path)
                    outcome.append(f"{name} InputError")
                except Exception as e:  # anything but InputError is a defect
                    failures.append((case, applied, name, f"{type(e).__name__}: {e}"))
                    (tmp_path / f"failure_{case}{suffix}").write_bytes(raw)
                    outcome.append(f"{name} FAILED")
            if outcome[0] == "input ok":
                read += 1
                # every 8th, when small: GrabCut on a mutated header's 60-megapixel image takes minutes
                if read % 8 == 0 and arrays["input"].shape[0] * arrays["input"].shape[1] <= 1 << 16:
                    try:
                        prepared = prepare_image(path, ImageConfig(size=32))
                        assert torch.isfinite(prepared.rgb).all() and prepared.rgb.shape == (3, 32, 32)
                        outcome.append("prepared")
                    except InputError as e:
                        _check_error(e, path)
                        outcome.append("prepare InputError")
                    except Exception as e:
                        failures.append((case, applied, "prepare", f"{type(e).__name__}: {e}"))
            counts[", ".join(outcome)] += 1
    seconds = time.perf_counter() - start
    print(
        f"\nimage fuzz: {IMAGE_CASES} cases in {seconds:.1f} s; outcomes {dict(counts)}; mutations {dict(kinds)}"
    )
    assert not failures, sorted({f[-1][:150] for f in failures})
    everywhere = sum(n for k, n in counts.items() if k.startswith("input ok, evaluate ok, texture ok"))
    refused = sum(n for k, n in counts.items() if "ok" not in k)
    assert everywhere >= IMAGE_CASES // 10 and refused >= IMAGE_CASES // 10, counts  # both outcomes reached


# ============================================================================================== meshes
MESH_CASES = 1500
MESH_SEED = 44
MESH_TOKENS = [b"nan", b"inf", b"-inf", b"1e39", b"-1e39", b"1e20", b"1e-30", b"0", b"-0", b"1", b"-1", b"-99",
               b"99999", b"2147483648", b"18446744073709551616", b"", b"x", b"1/", b"//", b"0/0", b"1e", b"0x1"]  # fmt: skip
MESH_LINES = [b"f 0 1 2", b"f 1 2", b"f 1 2 3 4 5", b"f -1 -2 -3", b"f -99 1 2", b"v nan nan nan", b"v 1e39 0 0",
              b"vt nan 0", b"vt 0", b"vn 0 0 0", b"usemtl nothing", b"mtllib missing.mtl", b"g part", b"o obj",
              b"s 1", b"l 1 2", b"# comment", b"element face 3", b"property float w", b"end_header", b""]  # fmt: skip
GLB_KEYS = [b'"count"', b'"componentType"', b'"byteOffset"', b'"byteLength"', b'"bufferView"', b'"type"',
            b'"indices"', b'"POSITION"', b'"TEXCOORD_0"', b'"COLOR_0"', b'"mode"', b'"source"']  # fmt: skip
GLB_VALUES = [b"0", b"1", b"-1", b"3", b"5121", b"5123", b"5125", b"5126", b"4294967296", b"1e400", b"null",
              b'"VEC2"', b'"SCALAR"', b'"MAT4"', b"[]", b"{}", b'"x"']  # fmt: skip
FLOAT_SPECIALS = [np.nan, np.inf, -np.inf, 1e38, -3.4e38, 1e-45, 0.0, 1e20]


def _mesh_bases(folder: Path) -> list[tuple[str, bytes, dict]]:
    """(suffix, bytes, companions {name: bytes}) of small meshes of every kind the readers meet: OBJ
    textured (with its MTL and PNG), coloured, and plain with quads and negative indices; PLY ASCII with
    colours and binary; GLB textured and coloured."""
    from microdreamer.mesh import Mesh, save_mesh
    from microdreamer.synthetic import position_colored_sphere, textured_cube

    sphere = position_colored_sphere(1)
    cube = textured_cube(16)
    out = []
    for mesh, suffix in (
        (cube, ".obj"),
        (sphere, ".obj"),
        (sphere, ".ply"),
        (cube, ".glb"),
        (sphere, ".glb"),
    ):
        path = save_mesh(mesh, folder / f"base{len(out)}{suffix}")
        companions = {
            p.name: p.read_bytes() for p in folder.glob(f"{path.stem}.*") if p.suffix in (".mtl", ".png")
        }
        out.append((suffix, path.read_bytes(), companions))
    plain = Mesh(sphere.vertices, sphere.faces)
    quads = "".join(f"v {x:.6g} {y:.6g} {z:.6g}\n" for x, y, z in plain.vertices.tolist())
    quads += "".join(f"f {a - plain.num_vertices} {b - plain.num_vertices} {c - plain.num_vertices}\n"
                     for a, b, c in plain.faces.tolist())  # fmt: skip
    quads += "v 2 2 2\nv 3 2 2\nv 3 3 2\nv 2 3 2\nf -4 -3 -2 -1\n"
    out.append((".obj", quads.encode(), {}))
    header = (
        f"ply\nformat ascii 1.0\nelement vertex {plain.num_vertices}\nproperty float x\nproperty float y\n"
        f"property float z\nproperty uchar red\nproperty uchar green\nproperty uchar blue\n"
        f"element face {plain.num_faces}\nproperty list uchar int vertex_indices\nend_header\n"
    )
    colors = (sphere.vertex_colors * 255).astype(int)
    body = "".join(f"{x:.6g} {y:.6g} {z:.6g} {r} {g} {b}\n" for (x, y, z), (r, g, b) in
                   zip(plain.vertices.tolist(), colors.tolist(), strict=True))  # fmt: skip
    body += "".join(f"3 {a} {b} {c}\n" for a, b, c in plain.faces.tolist())
    out.append((".ply", (header + body).encode(), {}))
    return out


def _glb_json(raw: bytes) -> tuple[int, int] | None:
    """(start, end) of a GLB's JSON chunk text."""
    if raw[:4] != b"glTF" or len(raw) < 20:
        return None
    n = struct.unpack("<I", raw[12:16])[0]
    return 20, min(len(raw), 20 + n)


def mutate_mesh(raw: bytes, suffix: str, rng: np.random.Generator) -> tuple[bytes, str]:
    """One random mutation of a mesh file's bytes; returns (bytes, kind). Text (OBJ, ASCII PLY): a
    token replaced by a special one (NaN, inf, overflowing, zero and negative indices, junk), a line
    deleted, duplicated or inserted (faces with index 0, NaN vertices, bad element counts), lines
    swapped, truncation. Binary (GLB, binary PLY): byte flips, truncation, special floats written over
    the data, GLB JSON values replaced (counts, component types, offsets, lengths)."""
    text = suffix == ".obj" or raw.startswith(b"ply\nformat ascii")
    if text:
        kind = str(rng.choice(["token", "delete", "duplicate", "insert", "swap", "truncate", "count"],
                              p=[0.4, 0.1, 0.1, 0.15, 0.1, 0.05, 0.1]))  # fmt: skip
        lines = raw.split(b"\n")
        i = int(rng.integers(0, len(lines)))
        if kind == "token":
            toks = lines[i].split(b" ")
            j = int(rng.integers(0, len(toks)))
            toks[j] = MESH_TOKENS[int(rng.integers(0, len(MESH_TOKENS)))]
            lines[i] = b" ".join(toks)
        elif kind == "delete":
            del lines[i]
        elif kind == "duplicate":
            lines.insert(i, lines[i])
        elif kind == "insert":
            lines.insert(i, MESH_LINES[int(rng.integers(0, len(MESH_LINES)))])
        elif kind == "swap":
            j = int(rng.integers(0, len(lines)))
            lines[i], lines[j] = lines[j], lines[i]
        elif kind == "count":  # a PLY element count, or an OBJ face's index pushed out of range
            hits = [k for k, line in enumerate(lines) if line.startswith((b"element", b"f "))]
            if hits:
                k = int(rng.choice(hits))
                toks = lines[k].split(b" ")
                toks[-1] = str(int(rng.choice([0, 1, 2, 10**6, 10**12, 2**63, -1]))).encode()
                lines[k] = b" ".join(toks)
        else:
            return raw[: int(rng.integers(0, len(raw)))], kind
        return b"\n".join(lines), kind
    kind = str(rng.choice(["flip", "floats", "json", "truncate"], p=[0.3, 0.3, 0.3, 0.1]))
    b = bytearray(raw)
    span = _glb_json(raw)
    data_start = span[1] + 8 if span else (raw.find(b"end_header\n") + 11 if b"end_header\n" in raw else 0)
    if kind == "truncate":
        return raw[: int(rng.integers(0, len(raw)))], kind
    if kind == "json" and span:
        textpart = raw[span[0] : span[1]]
        key = GLB_KEYS[int(rng.integers(0, len(GLB_KEYS)))]
        where = [k for k in range(len(textpart)) if textpart.startswith(key, k)]
        if where:
            k = int(rng.choice(where)) + len(key) + 1  # past the key and its colon
            end = k
            while end < len(textpart) and textpart[end : end + 1] not in (b",", b"}", b"]"):
                end += 1
            value = GLB_VALUES[int(rng.integers(0, len(GLB_VALUES)))]
            textpart = textpart[:k] + value + textpart[end:]
            textpart += b" " * (-len(textpart) % 4)
            rest = raw[span[1] :]
            head = struct.pack("<III", 0x46546C67, 2, 12 + 8 + len(textpart) + len(rest))
            return head + struct.pack("<II", len(textpart), 0x4E4F534A) + textpart + rest, kind
        kind = "flip"
    if kind == "floats" and len(b) - data_start >= 4:
        for _ in range(int(rng.integers(1, 6))):
            off = data_start + 4 * int(rng.integers(0, (len(b) - data_start) // 4))
            b[off : off + 4] = np.array([rng.choice(FLOAT_SPECIALS)], "<f4").tobytes()
        return bytes(b), kind
    for _ in range(int(rng.integers(1, 6))):
        b[int(rng.integers(0, len(b)))] = int(rng.integers(0, 256))
    return bytes(b), "flip"


def _check_mesh(mesh) -> None:
    v = mesh.vertices
    assert mesh.num_faces > 0 and np.isfinite(v).all()
    assert mesh.faces.min() >= 0 and mesh.faces.max() < len(v)
    assert (v[mesh.faces].max((0, 1)) > v[mesh.faces].min((0, 1))).any()  # an extent
    if mesh.vertex_colors is not None:
        assert np.isfinite(mesh.vertex_colors).all()
        assert mesh.vertex_colors.min() >= 0 and mesh.vertex_colors.max() <= 1
    if mesh.uv is not None:
        assert np.isfinite(mesh.uv).all() and mesh.texture.dtype == np.uint8


def test_fuzzed_meshes_load_or_fail_cleanly(tmp_path, caplog):
    """Every mutated mesh through the renderer's reader (``render``, ``evaluate``); every 10th one that
    loads is also drawn (one 24^2 view) and, for OBJ and GLB, framed by the viewer (``view``)."""
    from microdreamer.jobs.turntable import turntable_frames
    from microdreamer.mesh.load import load_textured_mesh
    from microdreamer.viewer.build import _mesh_view

    rng = np.random.default_rng(MESH_SEED)
    (tmp_path / "bases").mkdir()
    bases = _mesh_bases(tmp_path / "bases")
    counts: collections.Counter = collections.Counter()
    kinds: collections.Counter = collections.Counter()
    failures = []
    loaded = 0
    start = time.perf_counter()
    with caplog.at_level(logging.ERROR):
        for case in range(MESH_CASES):
            suffix, raw, companions = bases[int(rng.integers(0, len(bases)))]
            applied = []
            for _ in range(int(rng.choice([1, 1, 2, 3]))):
                raw, kind = mutate_mesh(raw, suffix, rng)
                applied.append(kind)
            kinds.update(f"{suffix[1:]} {k}" for k in applied)
            folder = tmp_path / f"case{case}"
            folder.mkdir()
            path = folder / f"m{suffix}"
            path.write_bytes(raw)
            for name, data in companions.items():  # the MTL and PNG an OBJ names (as the base's stem)
                (folder / name).write_bytes(data)
                if name.endswith(".mtl"):
                    mtllib = f"mtllib {name}".encode()
                    path.write_bytes(raw.replace(mtllib, mtllib))
            stage = "load"
            try:
                try:
                    mesh = load_textured_mesh(path)
                except InputError as e:
                    _check_error(e, path)
                    counts[f"{suffix[1:]}: InputError"] += 1
                    continue
                _check_mesh(mesh)
                loaded += 1
                counts[f"{suffix[1:]}: loaded"] += 1
                if loaded % 10 == 0:
                    stage = "render"
                    frame = next(turntable_frames(mesh, [30.0], size=24, ssaa=1))
                    assert frame.shape == (24, 24, 3)
                    if suffix in (".obj", ".glb"):
                        stage = "view"
                        (folder / "site" / "assets" / "0").mkdir(parents=True)
                        try:
                            view = _mesh_view(path, folder / "site" / "assets" / "0", "assets/0")
                            assert all(np.isfinite(v) for v in view.camera.position + view.camera.target)
                        except InputError as e:
                            _check_error(e, path)
                            counts[f"{suffix[1:]}: view InputError"] += 1
            except Exception as e:  # anything but InputError is a defect
                failures.append((case, applied, stage, f"{type(e).__name__}: {e}"))
                (tmp_path / f"failure_{case}{suffix}").write_bytes(raw)
            finally:
                for p in sorted(folder.rglob("*"), reverse=True):
                    p.rmdir() if p.is_dir() else p.unlink()
                folder.rmdir()
    seconds = time.perf_counter() - start
    print(
        f"\nmesh fuzz: {MESH_CASES} cases in {seconds:.1f} s; outcomes {dict(counts)}; mutations {dict(kinds)}"
    )
    assert not failures, sorted({f"{f[2]}: {f[3][:160]}" for f in failures})
    refused = sum(n for k, n in counts.items() if k.endswith("InputError"))
    assert loaded >= MESH_CASES // 10 and refused >= MESH_CASES // 10, counts  # both outcomes reached


# ======================================================================================== splat formats
FORMAT_CASES = 1200
FORMAT_SEED = 45
#: JSON keys of SOG's meta.json and of glTF whose values the mutations replace
FORMAT_KEYS = [b'"count"', b'"mins"', b'"maxs"', b'"codebook"', b'"files"', b'"bands"', b'"version"',
               b'"componentType"', b'"byteOffset"', b'"byteLength"', b'"bufferView"', b'"type"', b'"buffer"',
               b'"KHR_gaussian_splatting:SCALE"', b'"POSITION"', b'"mode"', b'"translation"', b'"scale"']  # fmt: skip
FORMAT_VALUES = [b"0", b"1", b"-1", b"3", b"255", b"65536", b"5121", b"5126", b"4294967296", b"1e400", b"null",
                 b'"VEC3"', b'"SCALAR"', b"[]", b"{}", b'"x"', b'["../x.webp"]', b"[1e308, 0, 0]", b"[0, 0]",
                 b'"NaN"', b"-1e39", b"true"]  # fmt: skip
#: 32-bit integers written over header fields (counts, versions, offsets, sizes)
HEADER_INTS = [0, 1, 2, 3, 4, 5, 255, 256, 1 << 16, 1 << 24, (1 << 31) - 1, 1 << 31, (1 << 32) - 1]


def _format_bases(folder: Path) -> list[tuple[str, bytes]]:
    """(suffix, bytes) of small splats written by our writers (and by splat-transform when it is on PATH)
    in every format: SPZ v2, v3 (gzip) and v4 (ZSTD), SOG bundle, compressed PLY, .splat, .ksplat, GLB
    and GLB with SPZ compression; SH degrees 0 and 3."""
    import shutil
    import subprocess

    from microdreamer.formats import ksplat, spz, write_splat
    from test_formats import random_splat

    bases = []
    for degree in (0, 3):
        a = random_splat(48, degree, seed=degree)
        for version in (2, 3, 4):
            bases.append((".spz", spz.encode(a, version)))
        for suffix in (".sog", ".compressed.ply", ".splat", ".glb", ".spz.glb"):
            bases.append((suffix, write_splat(a, folder / f"b{degree}{suffix}").read_bytes()))
        for level in (0, 1, 2):
            bases.append(
                (".ksplat", ksplat.write(a, folder / f"b{degree}_{level}.ksplat", level=level).read_bytes())
            )
        tool = shutil.which("splat-transform")
        if tool and degree == 3:  # a real writer's files too
            write_splat(a, folder / "ref.ply")
            for out in ("st.spz", "st.sog", "st.compressed.ply", "st.glb"):
                run = subprocess.run([tool, "-q", "-w", "ref.ply", out, *(["-g", "cpu"] if out.endswith(".sog") else [])],
                                     cwd=folder, capture_output=True, timeout=300)  # fmt: skip
                if run.returncode == 0:
                    bases.append((out[2:], (folder / out).read_bytes()))
    return bases


def _mutate_bytes(raw: bytes, rng: np.random.Generator, header: int, floats_from: int) -> tuple[bytes, str]:
    """One mutation of a binary file: byte flips, a truncation, an integer over a header field (the first
    ``header`` bytes), or special float32 values written over the data (from ``floats_from`` on)."""
    kind = str(rng.choice(["flip", "truncate", "int", "floats"], p=[0.35, 0.15, 0.3, 0.2]))
    b = bytearray(raw)
    if kind == "truncate" or len(b) < 8:
        return raw[: int(rng.integers(0, len(raw) + 1))], "truncate"
    if kind == "int":
        off = 4 * int(rng.integers(0, max(1, min(header, len(b) - 4) // 4)))
        b[off : off + 4] = struct.pack("<I", int(rng.choice(HEADER_INTS)))
        return bytes(b), kind
    if kind == "floats" and len(b) - floats_from >= 4:
        for _ in range(int(rng.integers(1, 6))):
            off = floats_from + 4 * int(rng.integers(0, (len(b) - floats_from) // 4))
            b[off : off + 4] = np.array([rng.choice(FLOAT_SPECIALS)], "<f4").tobytes()
        return bytes(b), kind
    for _ in range(int(rng.integers(1, 6))):
        b[int(rng.integers(0, len(b)))] = int(rng.integers(0, 256))
    return bytes(b), "flip"


def _mutate_json_value(text: bytes, rng: np.random.Generator) -> bytes:
    """``text`` with one value of a :data:`FORMAT_KEYS` key replaced by one of :data:`FORMAT_VALUES`."""
    key = FORMAT_KEYS[int(rng.integers(0, len(FORMAT_KEYS)))]
    where = [k for k in range(len(text)) if text.startswith(key, k)]
    if not where:
        b = bytearray(text)
        b[int(rng.integers(0, len(b)))] = int(rng.integers(0, 256))
        return bytes(b)
    k = int(rng.choice(where)) + len(key) + 1
    end, depth = k, 0
    while end < len(text):  # past one value (a list or object as a whole)
        c = text[end : end + 1]
        depth += c in (b"[", b"{")
        if depth == 0 and c in (b",", b"}", b"]"):
            break
        depth -= c in (b"]", b"}")
        end += 1
    return text[:k] + FORMAT_VALUES[int(rng.integers(0, len(FORMAT_VALUES)))] + text[end:]


def mutate_format(raw: bytes, suffix: str, rng: np.random.Generator) -> tuple[bytes, str]:
    """One mutation of a splat file, made to reach the decoder: a gzip SPZ is inflated, mutated and
    compressed again; a SOG bundle's meta.json values or one of its images are changed and the zip
    written again; a GLB's JSON values are replaced; everything else (and a fifth of these) is mutated
    as bytes (:func:`_mutate_bytes`)."""
    import gzip
    import zipfile
    import zlib

    if rng.random() < 0.2:
        kind = "raw"
        out, sub = _mutate_bytes(raw, rng, 64, 0)
        return out, f"{kind} {sub}"
    if suffix == ".spz" and raw[:2] == b"\x1f\x8b":
        try:
            inflated = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error):  # an earlier mutation broke the stream: bytes then
            return _mutate_bytes(raw, rng, 64, 0)
        plain, sub = _mutate_bytes(inflated, rng, 16, 16)
        return gzip.compress(plain, mtime=0), f"inflated {sub}"
    if suffix == ".spz":  # version 4: the header, table of contents and extensions are plain
        return _mutate_bytes(raw, rng, 32 + 16 * raw[16 + 3] if len(raw) > 20 else 32, 1 << 30)
    if suffix == ".sog":
        try:
            with zipfile.ZipFile(io.BytesIO(raw)) as z:
                files = {n: z.read(n) for n in z.namelist()}
        except (
            zipfile.BadZipFile,
            OSError,
            EOFError,
            zlib.error,
            ValueError,
            NotImplementedError,
            RuntimeError,
        ):
            return _mutate_bytes(raw, rng, 64, 0)
        if not files:
            return _mutate_bytes(raw, rng, 64, 0)
        name = "meta.json" if rng.random() < 0.6 else str(rng.choice(sorted(files)))
        if name not in files:  # an earlier mutation dropped it
            return _mutate_bytes(raw, rng, 64, 0)
        if name == "meta.json":
            files[name] = _mutate_json_value(files[name], rng)
            kind = "meta.json"
        elif rng.random() < 0.5:
            files[name] = files[str(rng.choice(sorted(files)))]  # another file (an image of another size)
            kind = "swapped file"
        else:
            files[name], sub = _mutate_bytes(files[name], rng, 32, 1 << 30)
            kind = f"image {sub}"
        if rng.random() < 0.1:
            del files[str(rng.choice(sorted(files)))]
            kind += " + missing file"
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w") as z:
            for n, data in files.items():
                z.writestr(n, data)
        return buf.getvalue(), kind
    span = _glb_json(raw)
    if suffix.endswith(".glb") and span and rng.random() < 0.5:
        textpart = _mutate_json_value(raw[span[0] : span[1]], rng)
        textpart += b" " * (-len(textpart) % 4)
        rest = raw[span[1] :]
        head = struct.pack("<III", 0x46546C67, 2, 12 + 8 + len(textpart) + len(rest))
        return head + struct.pack("<II", len(textpart), 0x4E4F534A) + textpart + rest, "json"
    if suffix.endswith(".glb") and span:
        return _mutate_bytes(raw, rng, 20, span[1] + 8)
    if suffix == ".compressed.ply":
        end = raw.find(b"end_header\n") + 11
        text = raw[: max(end, 0)].decode("latin-1").split("\n")
        hits = [i for i, line in enumerate(text) if line.startswith("element")]
        if hits and end > 11 and rng.random() < 0.3:  # an element count in the header
            i = int(rng.choice(hits))
            text[i] = " ".join(text[i].split(" ")[:2] + [str(int(rng.choice(HEADER_INTS + [10**12, -1])))])
            return "\n".join(text).encode("latin-1") + raw[end:], "count"
        return _mutate_bytes(raw, rng, 0, end)
    if suffix == ".ksplat":
        return _mutate_bytes(raw, rng, 4096 + 1024, 4096 + 1024)
    return _mutate_bytes(raw, rng, 0, 0)  # .splat: no header


def test_fuzzed_splat_formats_read_or_fail_cleanly(tmp_path, caplog):
    """Mutated SPZ (v2-4), SOG, compressed PLY, .splat, .ksplat and GLB splats (ours, and splat-transform's
    when it is on PATH) through ``read_splat_arrays`` (what every command reads with): each reads to a
    consistent, finite splat or raises one InputError line naming the file; never another exception."""
    from microdreamer.formats import read_splat_arrays

    rng = np.random.default_rng(FORMAT_SEED)
    (tmp_path / "bases").mkdir()
    bases = _format_bases(tmp_path / "bases")
    counts: collections.Counter = collections.Counter()
    kinds: collections.Counter = collections.Counter()
    failures = []
    with caplog.at_level(logging.ERROR):
        for case in range(FORMAT_CASES):
            suffix, raw = bases[case % len(bases)]
            applied = []
            for _ in range(int(rng.choice([1, 1, 2]))):
                raw, kind = mutate_format(raw, suffix, rng)
                applied.append(kind)
            kinds.update(f"{suffix[1:]} {k}" for k in applied)
            path = tmp_path / f"case{case}{suffix}"
            path.write_bytes(raw)
            try:
                try:
                    a = read_splat_arrays(path)
                except InputError as e:
                    _check_error(e, path)
                    counts[f"{suffix[1:]}: InputError"] += 1
                    continue
                n = len(a)
                assert n > 0 and a.sh_dc.shape == (n, 3) and a.log_scales.shape == (n, 3)
                assert a.quats.shape == (n, 4) and a.opacity_logits.shape == (n,)
                assert a.sh_rest.shape[0] == n and a.sh_rest.shape[1] in (0, 3, 8, 15)
                for v in (a.means, a.sh_dc, a.sh_rest, a.opacity_logits, a.log_scales, a.quats):
                    assert v.dtype == np.float32 and np.isfinite(v).all()
                counts[f"{suffix[1:]}: read"] += 1
            except Exception as e:  # anything but InputError is a defect
                failures.append((case, suffix, applied, f"{type(e).__name__}: {e}"))
                (tmp_path / f"failure_{case}{suffix}").write_bytes(raw)
            finally:
                path.unlink()
    print(f"\nformat fuzz: {FORMAT_CASES} cases on {len(bases)} bases; outcomes {dict(sorted(counts.items()))}; "
          f"mutations {dict(sorted(kinds.items()))}")  # fmt: skip
    assert not failures, sorted({f"{f[1]} {f[2]}: {f[3][:200]}" for f in failures})
    read = sum(n for k, n in counts.items() if k.endswith("read"))
    refused = sum(n for k, n in counts.items() if k.endswith("InputError"))
    assert read >= FORMAT_CASES // 10 and refused >= FORMAT_CASES // 10, counts  # both outcomes reached
