"""Seeded fuzzing of the splat reader and the conversion: mutated copies of shared sample splats.

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
CASE_LIMIT_S = 10.0  # a hang detector, not a timing assertion: cases take ~20 ms
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
    previous = signal.signal(signal.SIGALRM, _on_alarm)
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
                signal.setitimer(signal.ITIMER_REAL, CASE_LIMIT_S)
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
                    signal.setitimer(signal.ITIMER_REAL, 0)
    finally:
        signal.signal(signal.SIGALRM, previous)
    seconds = time.perf_counter() - start
    print(f"\nfuzz: {CASES} cases in {seconds:.1f} s; outcomes {dict(counts)}; mutations {dict(kinds)}")
    assert not failures, failures[:10]
    assert sum(counts.values()) == CASES
    # the mutations reach both stages: a fuzz whose cases all fail to load would test nothing
    assert counts["load: InputError"] >= CASES // 10
    assert counts["loaded, meshed"] >= CASES // 10
    assert counts["loaded, mesh: InputError"] >= 1
