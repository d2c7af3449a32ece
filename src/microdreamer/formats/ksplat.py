"""mkkellogg's ``.ksplat`` (GaussianSplats3D), read and written.

A 4096-byte header (version 0.1: u8 major, u8 minor; u32 section counts at 4 and 8, u32 Gaussian counts
at 12 and 16; u16 compression level at 20 (0, 1 or 2); float32 scene centre at 24; float32 SH range at
36 and 40 for level 2), one 1024-byte header per section (u32 count, max count, bucket size, bucket
count; float32 bucket block size; u16 bucket storage bytes at 20; u32 quantisation range at 24; u32 full
and partial bucket counts at 32 and 36; u16 SH degree at 40), then each section's data: the partial
buckets' sizes (u32), the bucket centres (3 x float32), and the Gaussians, bucket after bucket.

A Gaussian: level 0: position, linear scale (3 x float32), rotation (4 x float32, w x y z), RGBA (4 x
uint8: ``0.5 + C0 f_dc`` and ``sigmoid(opacity)``, times 255), SH (float32). Levels 1 and 2: the position
as 3 x uint16 offsets from its bucket's centre (``(v - range) * block / 2 / range``), scale, rotation
and (level 1) SH as float16; level 2 SH as uint8 over the header's range. SH per band, channel-major
(band 1: r0 r1 r2 g0 g1 g2 b0 b1 b2, band 2: five of each, band 3: seven of each, as splat-transform
reads degree 3). The PLY frame.

Quantisation (what the tests allow): level 0 exact but for colour and opacity (1/255); levels 1-2:
positions block/65534 (7.6e-5 for the default 5-unit block), scales and rotations float16 (relative
1e-3), SH float16 (level 1) or range/255 (level 2).
"""

from __future__ import annotations

import logging
import os
import struct
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
    read_file,
    sigmoid,
)

logger = logging.getLogger(__name__)

HEADER = 4096
SECTION = 1024
_SH_COUNT = {0: 0, 1: 9, 2: 24, 3: 45}
# bytes of (position, scale, rotation, colour, one SH component) per compression level
_LEVELS = {0: (12, 12, 16, 4, 4), 1: (6, 6, 8, 4, 2), 2: (6, 6, 8, 4, 1)}
_RANGE = 32767  # the default position quantisation range of levels 1-2
BLOCK = 5.0  # the default bucket block size (world units)
BUCKET = 256  # the default Gaussians per bucket


def sniff(head: bytes, size: int) -> bool:
    """True for a plausible ksplat header: version 0.1+, a compression level 0-2, sections that fit."""
    if len(head) < 24 or size < HEADER or head[0] != 0 or head[1] < 1:
        return False
    max_sections, _, _, count = struct.unpack("<IIII", head[4:20])
    (level,) = struct.unpack("<H", head[20:22])
    return level <= 2 and 0 < max_sections and HEADER + max_sections * SECTION <= size and count > 0


def _sh_order(degree: int, k1: int | None = None) -> np.ndarray:
    """[3 * (K-1)] the stored component i's index into the PLY's channel-major f_rest list of ``k1``
    coefficients a channel (default: the degree's own)."""
    k1 = (degree + 1) ** 2 - 1 if k1 is None else k1
    order, start = [], 0
    for band, width in ((1, 3), (2, 5), (3, 7)):
        if band > degree:
            break
        for channel in range(3):
            order += [channel * k1 + start + j for j in range(width)]
        start += width
    return np.array(order, np.int64)


def read(path: str | os.PathLike, progress=None) -> SplatArrays:
    """Read a ``.ksplat`` file (compression levels 0-2); one InputError line for a bad file."""
    name = str(path)
    data = read_file(path, "splat .ksplat")
    size = len(data)
    if size < HEADER:
        raise InputError(f"{name}: {size} bytes, shorter than a .ksplat header ({HEADER}); not a .ksplat")
    major, minor = data[0], data[1]
    if major != 0 or minor < 1:
        raise InputError(f"{name}: .ksplat version {major}.{minor}; this reads 0.1 and later 0.x")
    max_sections, _, _, count = struct.unpack("<IIII", data[4:20])
    (level,) = struct.unpack("<H", data[20:22])
    sh_min, sh_max = struct.unpack("<ff", data[36:44])
    sh_min, sh_max = (sh_min or -1.5), (sh_max or 1.5)
    if level not in _LEVELS:
        raise InputError(f"{name}: .ksplat compression level {level}; expected 0, 1 or 2")
    check_count(name, count)
    if HEADER + max_sections * SECTION > size:
        raise InputError(
            f"{name}: {max_sections} section headers do not fit the file's {size} bytes; corrupt"
        )
    cb, sb, rb, colb, shb = _LEVELS[level]
    sections = []
    total = 0
    degree = 0
    for s in range(max_sections):
        h = data[HEADER + s * SECTION : HEADER + (s + 1) * SECTION]
        n, n_max, bucket_size, n_buckets = struct.unpack("<IIII", h[:16])
        (block,) = struct.unpack("<f", h[16:20])
        (bucket_bytes,) = struct.unpack("<H", h[20:22])
        (qrange,) = struct.unpack("<I", h[24:28])
        full, partial = struct.unpack("<II", h[32:40])
        (sh_degree,) = struct.unpack("<H", h[40:42])
        if sh_degree not in _SH_COUNT:
            raise InputError(f"{name}: .ksplat section {s} has SH degree {sh_degree}; expected 0-3")
        for v in (n, n_max, n_buckets, full, partial):
            check_count(name, v, "entries in a section")
        sections.append((n, n_max, bucket_size, n_buckets, block, bucket_bytes, qrange or _RANGE, full, partial,
                         sh_degree))  # fmt: skip
        total += n
        if n:
            degree = max(degree, sh_degree)
    if total != count:
        raise InputError(
            f"{name}: the sections hold {total} Gaussians, the header {count}; the file is corrupt"
        )
    if count == 0:
        raise InputError(f"{name}: the splat is empty (0 Gaussians); nothing to convert")
    k1 = (degree + 1) ** 2 - 1
    means = np.empty((count, 3))
    log_scales = np.empty((count, 3))
    quats = np.empty((count, 4))
    rgba = np.empty((count, 4))
    flat_sh = np.zeros((count, 3 * k1))
    at, row = HEADER + max_sections * SECTION, 0
    for n, n_max, bucket_size, n_buckets, block, bucket_bytes, qrange, full, partial, sh_degree in sections:
        n_sh = _SH_COUNT[sh_degree]
        per = cb + sb + rb + colb + n_sh * shb
        bucket_store = (bucket_bytes * n_buckets + 4 * partial) if level else 0
        if at + bucket_store + per * n_max > size:
            raise InputError(
                f"{name}: truncated: a section declares {n_max} Gaussians of {per} bytes but the file ends "
                "first; the file is incomplete, export it again"
            )
        if n > n_max:
            raise InputError(f"{name}: a section holds {n} Gaussians but has room for {n_max}; corrupt")
        body = np.frombuffer(data, np.uint8, per * n, at + bucket_store).reshape(n, per)

        def field(offset: int, width: int, dtype: str, body=body) -> np.ndarray:
            return np.ascontiguousarray(body[:, offset : offset + width]).view(dtype)

        sl = slice(row, row + n)
        if level == 0:
            means[sl] = field(0, 12, "<f4")
            scales = field(cb, 12, "<f4").astype(np.float64)
            quats[sl] = field(cb + sb, 16, "<f4")
        else:
            if bucket_bytes != 12 or (n and bucket_size == 0) or full + partial != n_buckets:
                raise InputError(
                    f"{name}: .ksplat section with {n_buckets} buckets ({full} full, {partial} partial) of "
                    f"{bucket_size} Gaussians and {bucket_bytes} bytes; the file is corrupt"
                )
            sizes = np.frombuffer(data, "<u4", partial, at).astype(np.int64)
            centres = np.frombuffer(data, "<f4", 3 * n_buckets, at + 4 * partial).reshape(n_buckets, 3)
            idx = np.arange(n)
            ends = full * bucket_size + np.cumsum(sizes)  # where each partial bucket ends
            bucket_of = np.where(
                idx < full * bucket_size,
                idx // max(bucket_size, 1),
                full + np.searchsorted(ends, idx, side="right"),
            )
            if n and bucket_of.max() >= n_buckets:
                raise InputError(
                    f"{name}: .ksplat Gaussians beyond its {n_buckets} buckets; the file is corrupt"
                )
            offsets = field(0, 6, "<u2").astype(np.float64) - qrange
            means[sl] = offsets * (block / 2.0 / qrange) + centres[bucket_of]
            scales = field(cb, 6, "<f2").astype(np.float64)
            quats[sl] = field(cb + sb, 8, "<f2").astype(np.float64)
        with np.errstate(divide="ignore"):
            log_scales[sl] = np.log(np.maximum(scales, 1e-38))
        rgba[sl] = field(cb + sb + rb, 4, "u1").astype(np.float64) / 255.0
        if n_sh:
            start = cb + sb + rb + colb
            if level == 0:
                sh = field(start, 4 * n_sh, "<f4").astype(np.float64)
            elif level == 1:
                sh = field(start, 2 * n_sh, "<f2").astype(np.float64)
            else:
                sh = sh_min + field(start, n_sh, "u1").astype(np.float64) / 255.0 * (sh_max - sh_min)
            flat_sh[sl, _sh_order(sh_degree, k1)] = sh
        at += bucket_store + per * n_max
        row += n
    sh_rest = flat_sh.reshape(count, 3, k1).transpose(0, 2, 1)
    return finish(name, means, (rgba[:, :3] - 0.5) / SH_C0, sh_rest, logit(rgba[:, 3]), log_scales, quats)


def write(arrays: SplatArrays, path: str | os.PathLike, level: int = 1) -> Path:
    """Write ``arrays`` as a one-section ``.ksplat`` (atomically).

    Args:
        arrays: the splat (SH degree 0-3; GaussianSplats3D itself renders up to degree 2).
        path: the output.
        level: compression level 0 (float32), 1 (float16, positions in buckets; the default, as
            GaussianSplats3D's converter writes) or 2 (level 1 with 8-bit SH).
    """
    from microdreamer.io_utils import atomic_path

    if level not in _LEVELS:
        raise ValueError(f"ksplat compression level {level}: write 0, 1 or 2")
    path = Path(path)
    a = arrays
    n, degree = len(a), a.sh_degree
    k1 = a.sh_rest.shape[1]
    n_sh = _SH_COUNT[degree]
    cb, sb, rb, colb, shb = _LEVELS[level]
    per = cb + sb + rb + colb + n_sh * shb
    flat_sh = a.sh_rest.transpose(0, 2, 1).reshape(n, 3 * k1).astype(np.float64)[:, _sh_order(degree)]
    sh_min, sh_max = (float(flat_sh.min()), float(flat_sh.max())) if n_sh else (-1.5, 1.5)
    if sh_max <= sh_min:
        sh_min, sh_max = sh_min - 1.5, sh_max + 1.5
    scales = np.exp(a.log_scales.astype(np.float64))
    rgba = np.concatenate([a.sh_dc * SH_C0 + 0.5, sigmoid(a.opacity_logits)[:, None]], -1)
    rgba_u8 = np.clip(np.round(rgba * 255), 0, 255).astype(np.uint8)
    q = normalized_quats(a.quats)
    centre = a.means.astype(np.float64).mean(0) if n else np.zeros(3)
    bucket_data = b""
    order = np.arange(n)
    n_buckets = full = 0
    partial_sizes: list[int] = []
    if level:
        cell = np.floor(a.means.astype(np.float64) / BLOCK).astype(np.int64)
        keys, inverse = np.unique(cell, axis=0, return_inverse=True)
        inverse = inverse.reshape(-1)
        order = np.argsort(inverse, kind="stable")
        counts = np.bincount(inverse, minlength=len(keys))
        # every cell's Gaussians in buckets of BUCKET, full buckets first, then the partly filled ones
        full_idx, full_centres, part_idx, part_centres = [], [], [], []
        starts = np.concatenate([[0], np.cumsum(counts)])
        for c in range(len(keys)):
            members = order[starts[c] : starts[c + 1]]
            centre_c = (keys[c] + 0.5) * BLOCK
            for b in range(0, len(members), BUCKET):
                chunk = members[b : b + BUCKET]
                if len(chunk) == BUCKET:
                    full_idx.append(chunk)
                    full_centres.append(centre_c)
                else:
                    part_idx.append(chunk)
                    part_centres.append(centre_c)
        full, n_buckets = len(full_idx), len(full_idx) + len(part_idx)
        order = np.concatenate(full_idx + part_idx)
        partial_sizes = [len(p) for p in part_idx]
        bucket_centres = np.array(full_centres + part_centres, np.float32).reshape(-1, 3)
        bucket_of = np.repeat(np.arange(n_buckets), [BUCKET] * full + partial_sizes)
        bucket_data = np.array(partial_sizes, "<u4").tobytes() + bucket_centres.astype("<f4").tobytes()
    body = np.zeros((n, per), np.uint8)

    def put(offset: int, values: np.ndarray, dtype: str) -> None:
        raw = np.ascontiguousarray(values.astype(dtype)).view(np.uint8).reshape(n, -1)
        body[:, offset : offset + raw.shape[1]] = raw

    a_means = a.means.astype(np.float64)[order]
    if level == 0:
        put(0, a_means, "<f4")
        put(cb, scales[order], "<f4")
        put(cb + sb, q[order], "<f4")
    else:
        delta = a_means - bucket_centres.astype(np.float64)[bucket_of]
        put(0, np.clip(np.round(delta * (_RANGE / (BLOCK / 2))) + _RANGE, 0, 2 * _RANGE + 1), "<u2")
        put(cb, np.minimum(scales[order], 65504.0), "<f2")
        put(cb + sb, q[order], "<f2")
    put(cb + sb + rb, rgba_u8[order], "u1")
    if n_sh:
        start = cb + sb + rb + colb
        sh = flat_sh[order]
        if level == 0:
            put(start, sh, "<f4")
        elif level == 1:
            put(start, sh, "<f2")
        else:
            put(start, np.clip(np.floor((sh - sh_min) / (sh_max - sh_min) * 255), 0, 255), "u1")
    header = bytearray(HEADER)
    struct.pack_into("<BB", header, 0, 0, 1)
    struct.pack_into("<IIII", header, 4, 1, 1, n, n)
    struct.pack_into("<H", header, 20, level)
    struct.pack_into("<fff", header, 24, *centre)
    struct.pack_into("<ff", header, 36, sh_min, sh_max)
    section = bytearray(SECTION)
    storage = len(bucket_data) + body.nbytes
    struct.pack_into("<IIII", section, 0, n, n, BUCKET if level else 0, n_buckets)
    struct.pack_into("<f", section, 16, BLOCK if level else 0.0)
    struct.pack_into("<H", section, 20, 12 if level else 0)
    struct.pack_into("<IIII", section, 24, _RANGE if level else 0, storage, full, len(partial_sizes))
    struct.pack_into("<H", section, 40, degree)
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        f.write(bytes(header))
        f.write(bytes(section))
        f.write(bucket_data)
        f.write(body.tobytes())
    return path
