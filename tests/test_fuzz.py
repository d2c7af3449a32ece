"""Seeded fuzzing of the splat reader and the conversion (mutated copies of shared sample splats), of the
dataset reader (mutated ``transforms.json``) and of the config presets (mutated YAML).

Every case must either load or raise :class:`InputError` (one line, naming the file); every splat that
loads must convert to a mesh or raise InputError; no case may run past a per-case time limit. The
mutations: header token edits, byte flips, truncations, line deletions and insertions, duplicated,
renamed and retyped properties, vertex counts, special values written into the data (NaN, inf, huge,
tiny, underflowing log-scales, zero quaternions) and ASCII tokens, one to three per case, on binary
little-endian, big-endian and ASCII copies of two samples (SH degree 0, and SH degree 3 with an extra
property).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import signal
import time

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
#: a hang detector, not a timing assertion: CPU seconds of this process (ITIMER_PROF), not wall-clock time,
#: so a busy machine does not trip it (cases take ~20 ms of CPU); CI's own limit bounds a hang that sleeps
CASE_LIMIT_S = 60.0
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


class _CaseTimeout(BaseException):
    pass


def _on_alarm(signum, frame):
    raise _CaseTimeout()


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
    previous = signal.signal(signal.SIGPROF, _on_alarm)
    start = time.perf_counter()
    try:
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
                signal.setitimer(signal.ITIMER_PROF, CASE_LIMIT_S)
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
                except _CaseTimeout:
                    failures.append((case, applied, stage, f"ran past {CASE_LIMIT_S} s"))
                except Exception as e:  # anything but InputError is a defect
                    failures.append((case, applied, stage, f"{type(e).__name__}: {e}"))
                    (tmp_path / f"failure_{case}.ply").write_bytes(raw)
                finally:
                    signal.setitimer(signal.ITIMER_PROF, 0)
    finally:
        signal.signal(signal.SIGPROF, previous)
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


def _run_cases(cases, run, limit_s=CASE_LIMIT_S):
    """Run each case under a CPU-time hang detector; (outcome counts, failures)."""
    counts: collections.Counter = collections.Counter()
    failures = []
    previous = signal.signal(signal.SIGPROF, _on_alarm)
    try:
        for i, case in enumerate(cases):
            signal.setitimer(signal.ITIMER_PROF, limit_s)
            try:
                counts[run(case)] += 1
            except _CaseTimeout:
                failures.append((i, f"ran past {limit_s} CPU s"))
            except Exception as e:  # anything but InputError (turned into an outcome by run) is a defect
                failures.append((i, f"{type(e).__name__}: {e}"))
            finally:
                signal.setitimer(signal.ITIMER_PROF, 0)
    finally:
        signal.signal(signal.SIGPROF, previous)
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
