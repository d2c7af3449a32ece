"""PlayCanvas's compressed PLY (``.compressed.ply``: SuperSplat, splat-transform), read and written.

A binary little-endian PLY with three elements:

* ``chunk``: one row per 256 Gaussians (in file order): float ``min_x .. max_z`` (the chunk's position
  bounds), ``min_scale_x .. max_scale_z`` (its log-scale bounds) and, in newer files,
  ``min_r .. max_b`` (its base-colour bounds; without them colours span [0, 1]);
* ``vertex``: uint ``packed_position`` and ``packed_scale`` (11-10-11 bits, each a fraction of its
  chunk's range), ``packed_rotation`` (2 bits: the index of the largest quaternion component, in
  ``rot_0..rot_3`` order, then the other three in 10 bits each, scaled from [-1/sqrt 2, 1/sqrt 2]) and
  ``packed_color`` (8 bits each: base colour ``0.5 + C0 f_dc`` as a fraction of the chunk's colour range,
  then the opacity itself, ``sigmoid(opacity)``);
* ``sh`` (optional): uchar ``f_rest_0 ..`` (9, 24 or 45: degree 1-3, the PLY's channel-major order),
  each ``(v + 0.5) / 256`` of [-4, 4] (0 and 255 are the ends).

The quantisation this layout costs (what the tests allow): positions 1/2047 of the chunk's extent
(1/1023 on y), log-scales the same of the chunk's log-scale range (clamped to [-20, 20]), base colour
1/255 of the chunk's range, opacity 1/255, each quaternion component about 7e-4, SH 1/32 (+-4 range).
Written like splat-transform writes it: Gaussians in Morton order so that a chunk is compact.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from microdreamer.errors import InputError
from microdreamer.formats.common import (
    SH_C0,
    SplatArrays,
    check_count,
    finish,
    logit,
    normalized_quats,
    sigmoid,
)

CHUNK = 256
_CHUNK_PROPS = [
    "min_x", "min_y", "min_z", "max_x", "max_y", "max_z",
    "min_scale_x", "min_scale_y", "min_scale_z", "max_scale_x", "max_scale_y", "max_scale_z",
]  # fmt: skip
_COLOR_PROPS = ["min_r", "min_g", "min_b", "max_r", "max_g", "max_b"]
_VERTEX_PROPS = ["packed_position", "packed_rotation", "packed_scale", "packed_color"]
_SQRT2 = float(np.sqrt(2.0))


def decode(f, head, name: str, size: int) -> SplatArrays:
    """The splat of a compressed PLY whose header :func:`microdreamer.formats.ply._parse_header` has
    read (``f`` stands at the first data byte; ``size`` is the file's size)."""
    if head.fmt != "binary_little_endian":
        raise InputError(f"{name}: a compressed PLY must be binary_little_endian, not {head.fmt}")
    tables = {}
    need = 0
    for el_name, count, props, _ in head.elements:
        if any(t == "list" for _, t in props):
            raise InputError(f"{name}: element {el_name!r} has list properties; not a compressed PLY")
        check_count(name, count, f"{el_name} rows")
        dtype = np.dtype([(p, "<" + t) for p, t in props])
        tables[el_name] = (count, dtype, need)
        need += count * dtype.itemsize
    if need > size - head.data_start:
        raise InputError(
            f"{name}: truncated: the header declares {need} bytes of data but the file holds "
            f"{size - head.data_start}; the file is incomplete, export it again"
        )
    missing = [p for p in _CHUNK_PROPS if p not in tables["chunk"][1].names] + [
        p for p in _VERTEX_PROPS if p not in tables["vertex"][1].names
    ]
    if missing:
        raise InputError(f"{name}: compressed PLY without {', '.join(missing)}; export it again")
    n, n_chunks = tables["vertex"][0], tables["chunk"][0]
    if n == 0:
        raise InputError(f"{name}: the splat is empty (0 Gaussians); nothing to convert")
    if n_chunks != -(-n // CHUNK):
        raise InputError(
            f"{name}: {n_chunks} chunks for {n} Gaussians (expected {-(-n // CHUNK)}, one per {CHUNK}); "
            "the file is corrupt"
        )
    data = {}
    for el_name, (count, dtype, offset) in tables.items():
        f.seek(head.data_start + offset)
        raw = f.read(count * dtype.itemsize)
        data[el_name] = np.frombuffer(raw, dtype=dtype, count=count)
    chunk, vertex = data["chunk"], data["vertex"]
    ci = np.arange(n) // CHUNK

    def chunk_cols(names: list[str]) -> np.ndarray:
        return np.stack([chunk[p].astype(np.float64) for p in names], -1)[ci]

    def lerp(lo: np.ndarray, hi: np.ndarray, t: np.ndarray) -> np.ndarray:
        return lo * (1 - t) + hi * t

    def unorm(v: np.ndarray, shift: int, bits: int) -> np.ndarray:
        return ((v >> np.uint32(shift)) & np.uint32((1 << bits) - 1)).astype(np.float64) / ((1 << bits) - 1)

    def p111011(v: np.ndarray) -> np.ndarray:
        return np.stack([unorm(v, 21, 11), unorm(v, 11, 10), unorm(v, 0, 11)], -1)

    pos = vertex["packed_position"].astype(np.uint32)
    means = lerp(chunk_cols(_CHUNK_PROPS[0:3]), chunk_cols(_CHUNK_PROPS[3:6]), p111011(pos))
    sc = vertex["packed_scale"].astype(np.uint32)
    log_scales = lerp(chunk_cols(_CHUNK_PROPS[6:9]), chunk_cols(_CHUNK_PROPS[9:12]), p111011(sc))
    col = vertex["packed_color"].astype(np.uint32)
    rgb = np.stack([unorm(col, 24, 8), unorm(col, 16, 8), unorm(col, 8, 8)], -1)
    if all(p in chunk.dtype.names for p in _COLOR_PROPS):
        rgb = lerp(chunk_cols(_COLOR_PROPS[:3]), chunk_cols(_COLOR_PROPS[3:]), rgb)
    opacity = logit(unorm(col, 0, 8))
    rot = vertex["packed_rotation"].astype(np.uint32)
    rest = np.stack([(unorm(rot, s, 10) - 0.5) * _SQRT2 for s in (20, 10, 0)], -1)
    largest = (rot >> np.uint32(30)).astype(np.int64)
    m = np.sqrt(np.maximum(0.0, 1.0 - np.square(rest).sum(-1)))
    quats = np.empty((n, 4))
    others = np.array([[1, 2, 3], [0, 2, 3], [0, 1, 3], [0, 1, 2]])[largest]  # [N, 3]
    quats[np.arange(n), largest] = m
    np.put_along_axis(quats, others, rest, axis=1)
    sh_rest = np.zeros((n, 0, 3), np.float32)
    if "sh" in data:
        sh = data["sh"]
        n_rest = len(sh.dtype.names)
        if (
            n_rest not in (9, 24, 45)
            or sh.shape[0] != n
            or set(sh.dtype.names) != {f"f_rest_{i}" for i in range(n_rest)}
        ):
            raise InputError(
                f"{name}: sh element with {n_rest} properties for {sh.shape[0]} rows (expected f_rest_0.. of 9, "
                f"24 or 45 for {n}); the file is corrupt"
            )
        v = np.stack([sh[f"f_rest_{i}"] for i in range(n_rest)], -1).astype(np.float64)
        t = np.where(v == 0, 0.0, np.where(v == 255, 1.0, (v + 0.5) / 256))
        k1 = n_rest // 3
        sh_rest = ((t - 0.5) * 8).reshape(n, 3, k1).transpose(0, 2, 1)
    return finish(name, means, (rgb - 0.5) / SH_C0, sh_rest, opacity, log_scales, quats)


def morton_order(means: np.ndarray) -> np.ndarray:
    """[N] the permutation that sorts ``means`` [N, 3] along a Z-order curve of 1024^3 cells."""
    lo, hi = means.min(0), means.max(0)
    q = ((means - lo) / np.where(hi > lo, hi - lo, 1.0) * 1023).astype(np.uint64)

    def spread(v: np.ndarray) -> np.ndarray:  # 10 bits -> every third bit of 30
        v = (v | (v << np.uint64(16))) & np.uint64(0x030000FF)
        v = (v | (v << np.uint64(8))) & np.uint64(0x0300F00F)
        v = (v | (v << np.uint64(4))) & np.uint64(0x030C30C3)
        return (v | (v << np.uint64(2))) & np.uint64(0x09249249)

    code = spread(q[:, 0]) | (spread(q[:, 1]) << np.uint64(1)) | (spread(q[:, 2]) << np.uint64(2))
    return np.argsort(code, kind="stable")


def pack_unorm(t: np.ndarray, bits: int) -> np.ndarray:
    top = (1 << bits) - 1
    return np.clip(np.floor(t * top + 0.5), 0, top).astype(np.uint32)


def write(arrays: SplatArrays, path: str | os.PathLike) -> Path:
    """Write ``arrays`` as a PlayCanvas compressed PLY (atomically)."""
    from microdreamer.io_utils import atomic_path

    path = Path(path)
    a = arrays.subset(morton_order(arrays.means))
    n = len(a)
    n_chunks = -(-n // CHUNK)
    pad = n_chunks * CHUNK - n

    def chunked(v: np.ndarray) -> np.ndarray:  # [C, 256, D], the last chunk padded with its last row
        v = np.asarray(v, np.float64).reshape(n, -1)
        return np.concatenate([v, np.repeat(v[-1:], pad, 0)]).reshape(n_chunks, CHUNK, -1)

    def normalised(v: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        span = hi - lo
        t = np.where(span[:, None] < 1e-5, 0.0, (v - lo[:, None]) / np.where(span < 1e-5, 1.0, span)[:, None])
        return np.clip(t, 0.0, 1.0).reshape(-1, v.shape[-1])[:n]

    pos, sc = chunked(a.means), chunked(a.log_scales)
    rgb = chunked(a.sh_dc * SH_C0 + 0.5)
    pmin, pmax = pos.min(1), pos.max(1)
    smin, smax = np.clip(sc.min(1), -20, 20), np.clip(sc.max(1), -20, 20)
    cmin, cmax = rgb.min(1), rgb.max(1)

    def pack111011(t: np.ndarray) -> np.ndarray:
        return (pack_unorm(t[:, 0], 11) << 21) | (pack_unorm(t[:, 1], 10) << 11) | pack_unorm(t[:, 2], 11)

    packed_position = pack111011(normalised(pos, pmin, pmax))
    packed_scale = pack111011(normalised(sc, smin, smax))
    c = normalised(rgb, cmin, cmax)
    alpha = sigmoid(a.opacity_logits)
    packed_color = (
        (pack_unorm(c[:, 0], 8) << 24) | (pack_unorm(c[:, 1], 8) << 16) | (pack_unorm(c[:, 2], 8) << 8)
    ) | pack_unorm(alpha, 8)
    q = normalized_quats(a.quats)
    largest = np.abs(q).argmax(-1)
    q *= np.where(q[np.arange(n), largest] < 0, -1.0, 1.0)[:, None]
    others = np.array([[1, 2, 3], [0, 2, 3], [0, 1, 3], [0, 1, 2]])[largest]
    rest = np.take_along_axis(q, others, axis=1) * (_SQRT2 / 2) + 0.5
    packed_rotation = (
        (largest.astype(np.uint32) << 30)
        | (pack_unorm(rest[:, 0], 10) << 20)
        | (pack_unorm(rest[:, 1], 10) << 10)
        | pack_unorm(rest[:, 2], 10)
    )
    chunk_table = np.concatenate([pmin, pmax, smin, smax, cmin, cmax], axis=1).astype("<f4")
    vertex_table = np.stack([packed_position, packed_rotation, packed_scale, packed_color], -1).astype("<u4")
    k1 = a.sh_rest.shape[1]
    lines = ["ply", "format binary_little_endian 1.0", "comment written by microdreamer",
             f"element chunk {n_chunks}", *[f"property float {p}" for p in _CHUNK_PROPS + _COLOR_PROPS],
             f"element vertex {n}", *[f"property uint {p}" for p in _VERTEX_PROPS]]  # fmt: skip
    sh_table = None
    if k1:
        lines += [f"element sh {n}", *[f"property uchar f_rest_{i}" for i in range(3 * k1)]]
        flat = a.sh_rest.transpose(0, 2, 1).reshape(n, 3 * k1).astype(np.float64)
        sh_table = np.clip(np.trunc((flat / 8 + 0.5) * 256), 0, 255).astype(np.uint8)
    header = ("\n".join(lines) + "\nend_header\n").encode("ascii")
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        f.write(header)
        f.write(np.ascontiguousarray(chunk_table).tobytes())
        f.write(np.ascontiguousarray(vertex_table).tobytes())
        if sh_table is not None:
            f.write(np.ascontiguousarray(sh_table).tobytes())
    return path
