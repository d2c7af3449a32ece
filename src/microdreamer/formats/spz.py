"""Niantic's SPZ (``.spz``: Scaniverse, splat-transform, the compression inside glTF), read and written.

Versions 1-3 are one gzip stream: a 16-byte header (magic ``NGSP``, version, count, SH degree, the
positions' fractional bits, flags) then the attribute blocks one after another. Version 4 has a 32-byte
plain header (the same fields plus the number of streams and the table of contents' offset), optional
extension records, a table of contents (compressed and uncompressed size of each stream, u64) and one
ZSTD stream per attribute. The attributes, for N Gaussians:

* positions: 3 x 24-bit signed fixed point (``fractionalBits``; version 1: float16);
* alphas: ``sigmoid(opacity)`` in 8 bits;
* colours: ``f_dc * 0.15 + 0.5`` in 8 bits;
* scales: ``(log_scale + 10) * 16`` in 8 bits;
* rotations: version 1-2: x, y, z of the unit quaternion with w >= 0 (8 bits each, ``q * 127.5 +
  127.5``); version 3+: the smallest three (2 bits: the largest component's index, x y z w order; then
  a sign and 9 bits of magnitude of each other component, scaled from [0, 1/sqrt 2]), little endian;
* SH: ``v * 128 + 128`` in 8 bits, coefficient-major, colour inner (the writer rounds degree 1 to 5
  bits and the rest to 4, as Niantic's library does).

Files store the RUB frame (x right, y up, z back) unless the ``SPZ_ADOBE_coordinate_system`` extension
(``0xADBE0003``) names another of the 8 axis-flip frames; reading turns the splat into the PLY frame
(RDF: y and z negated), writing turns it back, as Niantic's library does with ``from``/``to: RDF``.

Why our own code: the PyPI ``spz`` package builds from Rust sources (no wheel), and Niantic's own Python
bindings are not on PyPI. Version 4 needs ``zstandard`` (a dependency).

Quantisation (what the tests allow): positions 1/4096 (12 fractional bits), log-scales 1/32, base colour
(f_dc) 1/76.5 (0.013), opacity 1/510, quaternion components 1/1022 (v3+; v2: 1/255), SH 1/128 (written:
1/32 for degree 1, 1/16 above).
"""

from __future__ import annotations

import gzip
import logging
import os
import struct
import zlib
from pathlib import Path

import numpy as np

from microdreamer.errors import InputError
from microdreamer.formats.common import (
    SplatArrays,
    check_count,
    finish,
    logit,
    normalized_quats,
    read_file,
    sigmoid,
    transform_arrays,
    truncated,
)

logger = logging.getLogger(__name__)

MAGIC = 0x5053474E  # "NGSP"
LATEST = 4
COLOR_SCALE = 0.15
_SH_DIM = {0: 0, 1: 3, 2: 8, 3: 15, 4: 24}
_COORDINATE_EXTENSION = 0xADBE0003
# SPZ's CoordinateSystem enum 1-8: the axis-flip frames, as the diagonal of the map into RUB
_FRAMES = {1: "LDB", 2: "RDB", 3: "LUB", 4: "RUB", 5: "LDF", 6: "RDF", 7: "LUF", 8: "RUF"}


def sniff(head: bytes) -> bool:
    """True for the first bytes of an SPZ file: ``NGSP`` (version 4) or a gzip stream whose first
    block inflates to ``NGSP`` (versions 1-3)."""
    if head[:4] == b"NGSP":
        return True
    if head[:2] != b"\x1f\x8b":
        return False
    try:
        inflated = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(head, 4)
    except zlib.error:
        return False
    return inflated[:4] == b"NGSP"


def _to_rdf(frame: str) -> np.ndarray:
    """The diagonal map from the frame named by three letters (e.g. RUB) into RDF (the PLY frame)."""
    return np.diag([1.0 if frame[0] == "R" else -1.0, 1.0 if frame[1] == "D" else -1.0,
                    1.0 if frame[2] == "F" else -1.0])  # fmt: skip


def read(path: str | os.PathLike, progress=None) -> SplatArrays:
    """Read an SPZ file (versions 1-4) into PLY-frame :class:`SplatArrays`; one InputError line for a
    bad file (wrong magic, unknown version, a count the data cannot hold, truncated or corrupt streams)."""
    return decode(read_file(path, "splat .spz"), str(path))


def decode(data: bytes, name: str) -> SplatArrays:
    """The splat of SPZ bytes (a file, or the blob of glTF's ``KHR_gaussian_splatting_compression_spz``)."""
    if data[:4] == b"NGSP":
        return _decode_v4(data, name)
    if data[:2] != b"\x1f\x8b":
        raise InputError(f"{name}: not an SPZ file (no NGSP magic, not gzip); give a .spz splat")
    if len(data) < 16:
        raise InputError(f"{name}: truncated SPZ (the file is {len(data)} bytes long)")
    header = _gunzip(data, name, 16)
    if len(header) < 16 or header[:4] != b"NGSP":
        raise InputError(f"{name}: not an SPZ file (the gzip stream does not start with NGSP)")
    _, version, count, degree, frac, flags, _ = struct.unpack("<IIIBBBB", header[:16])
    if not 1 <= version <= 3:
        raise InputError(f"{name}: SPZ version {version} in a gzip stream; versions 1-3 are gzip, 4 is not")
    _check_header(name, count, degree)
    sizes = _sizes(version, count, degree)
    need = 16 + sum(sizes)
    if count > len(data) * 1100:  # gzip inflates at most ~1032:1; more points than that are impossible
        raise InputError(
            f"{name}: the header declares {count} Gaussians, more than {len(data)} bytes can hold"
        )
    body = _gunzip(data, name, need)
    if len(body) < need:
        raise truncated(name, count)
    blocks, at = [], 16
    for size in sizes:
        blocks.append(np.frombuffer(body, np.uint8, size, at))
        at += size
    return _unpack(name, version, count, degree, frac, blocks, _to_rdf("RUB"))


def _gunzip(data: bytes, name: str, limit: int) -> bytes:
    """At most ``limit`` bytes of the gzip stream ``data`` (no more is ever inflated)."""
    try:
        return zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(data, limit)
    except zlib.error as e:
        raise InputError(f"{name}: corrupt SPZ: the gzip stream does not inflate ({e})") from None


def _check_header(name: str, count: int, degree: int) -> None:
    check_count(name, count)
    if degree not in _SH_DIM:
        raise InputError(f"{name}: SPZ SH degree {degree}; expected 0-4, the file is corrupt")


def _sizes(version: int, count: int, degree: int) -> list[int]:
    """Bytes of the six attribute blocks: positions, alphas, colours, scales, rotations, SH."""
    return [count * (6 if version == 1 else 9), count, count * 3, count * 3, count * (4 if version >= 3 else 3),
            count * _SH_DIM[degree] * 3]  # fmt: skip


def _decode_v4(data: bytes, name: str) -> SplatArrays:
    if len(data) < 32:
        raise InputError(f"{name}: truncated SPZ (the file is {len(data)} bytes, the header alone is 32)")
    _, version, count, degree, frac, flags, n_streams, toc = struct.unpack("<IIIBBBBI", data[:20])
    if version < 4 or version > LATEST:
        raise InputError(f"{name}: SPZ version {version} after an NGSP magic; this reads versions 1-{LATEST}")
    _check_header(name, count, degree)
    if count * 9 > len(data) * 1024:  # Niantic's bound: zstd never packs better than 1024:1
        raise InputError(
            f"{name}: the header declares {count} Gaussians, more than {len(data)} bytes can hold"
        )
    frame = "RUB"
    if flags & 0x2 and 32 < toc <= len(data):
        frame = _extension_frame(data[32:toc], name) or frame
    sizes = [s for s in _sizes(version, count, degree) if s]
    if n_streams != len(sizes) or toc < 32 or toc + 16 * n_streams > len(data):
        raise InputError(
            f"{name}: SPZ table of contents ({n_streams} streams at byte {toc}) does not fit the file or the "
            f"{len(sizes)} attributes; the file is corrupt"
        )
    try:
        import zstandard
    except ImportError:
        raise InputError(
            f"{name}: SPZ version 4 needs the zstandard package: pip install zstandard"
        ) from None
    entries = struct.unpack(f"<{2 * n_streams}Q", data[toc : toc + 16 * n_streams])
    at = toc + 16 * n_streams
    blocks = []
    decompressor = zstandard.ZstdDecompressor()
    for i, want in enumerate(sizes):
        packed, plain = entries[2 * i], entries[2 * i + 1]
        if plain != want or at + packed > len(data):
            if at + packed > len(data):
                raise truncated(name, count)
            raise InputError(
                f"{name}: SPZ stream {i} holds {plain} bytes, expected {want}; the file is corrupt"
            )
        stream = data[at : at + packed]
        try:
            declared = zstandard.frame_content_size(stream)  # -1: not stated
            if declared not in (-1, want):  # a frame that says it holds more (or less) than the table
                raise InputError(
                    f"{name}: SPZ stream {i}'s frame declares {declared} bytes, expected {want}; the file is "
                    "corrupt"
                )
            out = decompressor.decompress(stream, max_output_size=want)
        except (zstandard.ZstdError, MemoryError) as e:
            raise InputError(f"{name}: corrupt SPZ stream {i} ({e}); export it again") from None
        if len(out) != want:
            raise truncated(name, count)
        blocks.append(np.frombuffer(out, np.uint8))
        at += packed
    if degree == 0:
        blocks.append(np.zeros(0, np.uint8))
    return _unpack(name, version, count, degree, frac, blocks, _to_rdf(frame))


def _extension_frame(records: bytes, name: str) -> str | None:
    """The frame named by an ``SPZ_ADOBE_coordinate_system`` record, if any."""
    at = 0
    while at + 8 <= len(records):
        kind, length = struct.unpack("<II", records[at : at + 8])
        if kind == _COORDINATE_EXTENSION and length >= 4:
            (value,) = struct.unpack("<I", records[at + 8 : at + 12])
            if value in _FRAMES:
                return _FRAMES[value]
            if value:
                raise InputError(
                    f"{name}: SPZ stores a rotated coordinate system ({value}); only the axis-flip ones "
                    "(1-8) are read, convert it with Niantic's spz tools first"
                )
        at += 8 + length
    return None


def _lut(values: np.ndarray) -> np.ndarray:
    """A float32 table of a byte code's values, computed in float64 and rounded once (what decoding
    each byte in float64 and casting the result gives, exactly)."""
    return np.asarray(values, np.float64).astype(np.float32)


_CODES = np.arange(256, dtype=np.float64)
_ALPHA = _lut(logit(_CODES / 255.0))
_COLOR = _lut((_CODES / 255.0 - 0.5) / COLOR_SCALE)
_SCALE = _lut(_CODES / 16.0 - 10.0)
_SH = _lut((_CODES - 128.0) / 128.0)
_MAGNITUDE = np.arange(512, dtype=np.float64) / 511 * np.sqrt(0.5)
_SMALLEST_THREE = np.concatenate([_MAGNITUDE, -_MAGNITUDE])  # float64: the quaternion is built in it
_OTHERS = np.array([[1, 2, 3], [0, 2, 3], [0, 1, 3], [0, 1, 2]])
# [largest, w x y z]: where each component of the quaternion sits in (the three stored, the largest)
_WXYZ_FROM = np.array(
    [[3 if c == big else list(_OTHERS[big]).index(c) for c in (3, 0, 1, 2)] for big in range(4)]
)


def _sum_squares(v: np.ndarray) -> np.ndarray:
    """[N] the sum of squares of the first 3 columns of ``v`` [N, >= 3], added left to right (as ``sum(-1)``
    adds 3 values, without its slow reduction along short rows)."""
    return v[:, 0] * v[:, 0] + v[:, 1] * v[:, 1] + v[:, 2] * v[:, 2]


def _unpack(
    name: str, version: int, count: int, degree: int, frac: int, blocks: list, to_rdf: np.ndarray
) -> SplatArrays:
    """The splat of the six attribute blocks (uint8 arrays). Every 8-bit code is decoded through a
    256-entry table; positions and quaternions are exact in the precision they are computed in."""
    positions, alphas, colors, scales, rotations, sh = blocks
    if version == 1:
        means = positions.view("<f2").reshape(count, 3).astype(np.float32)
    else:
        p = positions.reshape(count * 3, 3)
        fixed = p[:, 0].astype(np.int32) | (p[:, 1].astype(np.int32) << 8) | (p[:, 2].astype(np.int32) << 16)
        fixed = (fixed << 8) >> 8  # sign-extend the 24 bits
        if frac <= 126:  # a 24-bit integer times 2^-frac is a normal float32: exact
            means = (fixed.astype(np.float32) * np.float32(2.0**-frac)).reshape(count, 3)
        else:
            means = (fixed.astype(np.float64) / 2.0**frac).reshape(count, 3)
    opacity = _ALPHA[alphas]
    sh_dc = _COLOR[colors].reshape(count, 3)
    log_scales = _SCALE[scales].reshape(count, 3)
    if version >= 3:
        comp = rotations.view("<u4")
        largest = (comp >> 30).astype(np.intp)
        vals = np.empty((count, 4))  # the three stored components, then the largest
        for j in (2, 1, 0):  # the last of the three sits in the lowest bits: a sign bit, 9 of magnitude
            vals[:, j] = _SMALLEST_THREE[comp & 1023]
            comp = comp >> 10
        vals[:, 3] = np.sqrt(np.maximum(0.0, 1.0 - _sum_squares(vals)))
        quats = np.take_along_axis(vals, _WXYZ_FROM[largest], axis=1).astype(np.float32)
    else:
        xyz = rotations.reshape(count, 3).astype(np.float64) / 127.5 - 1.0
        xyzw = np.concatenate([xyz, np.sqrt(np.maximum(0.0, 1.0 - _sum_squares(xyz)))[:, None]], -1)
        quats = xyzw[:, [3, 0, 1, 2]].astype(np.float32)
    dim = _SH_DIM[degree]
    sh_rest = _SH[sh].reshape(count, dim, 3)
    arrays = finish(name, means, sh_dc, sh_rest, opacity, log_scales, quats)
    if not np.array_equal(to_rdf, np.eye(3)):
        arrays = transform_arrays(arrays, to_rdf)
    return arrays


def _quantize_sh(sh_rest: np.ndarray) -> np.ndarray:
    """[N, K-1, 3] uint8 SPZ codes of the SH bands (coefficient-major, colour inner, as stored):
    ``round(v * 128) + 128`` rounded to a bucket of 8 (5 bits, degree 1) or 16 (4 bits, above), clipped.

    In float32, in place: every step is exact there (a float32 times 128 is exact, an integer below 2^24
    plus 128 or a bucket's half is exact, a division by a power of two and its floor too; beyond 2^24 the
    code clips to 0 or 255 either way), so the codes equal the float64 formula's."""
    with np.errstate(over="ignore"):  # beyond float32: inf, clipped to 255 (0) as the float64 code is
        q = np.multiply(sh_rest, np.float32(128.0), dtype=np.float32)
    np.rint(q, out=q)  # half to even, as np.round
    bucket = np.full((1, q.shape[1], 1), 16.0, np.float32)  # 4 bits above degree 1
    bucket[:, :3] = 8.0  # 5 bits for degree 1
    q += 128.0 + bucket / 2
    q /= bucket
    np.floor(q, out=q)
    q *= bucket
    np.clip(q, 0, 255, out=q)
    return q.astype(np.uint8)


def encode(arrays: SplatArrays, version: int = LATEST, antialiased: bool = False) -> bytes:
    """SPZ bytes of ``arrays`` (the PLY frame; stored as RUB, as Niantic's library stores it).

    Args:
        arrays: the splat (SH degree 0-3).
        version: 2, 3 (gzip) or 4 (ZSTD streams; needs ``zstandard``).
        antialiased: the header's antialiasing flag (mip-splatting trained splats).
    """
    if version not in (2, 3, 4):
        raise ValueError(f"SPZ version {version}: write 2, 3 or 4")
    a = transform_arrays(arrays, np.linalg.inv(_to_rdf("RUB")))
    n, degree, frac = len(a), a.sh_degree, 12
    fixed = np.round(a.means.astype(np.float64) * (1 << frac)).astype(np.int64)
    fixed = np.clip(fixed, -(1 << 23), (1 << 23) - 1).reshape(-1)
    positions = np.stack([fixed & 0xFF, (fixed >> 8) & 0xFF, (fixed >> 16) & 0xFF], -1).astype(np.uint8)

    def u8(v: np.ndarray) -> np.ndarray:
        return np.clip(np.round(v), 0, 255).astype(np.uint8)

    alphas = u8(sigmoid(a.opacity_logits) * 255.0)
    colors = u8(a.sh_dc.astype(np.float64) * (COLOR_SCALE * 255.0) + 0.5 * 255.0)
    scales = u8((a.log_scales.astype(np.float64) + 10.0) * 16.0)
    q = normalized_quats(a.quats)[:, [1, 2, 3, 0]]  # x y z w
    if version >= 3:
        largest = np.abs(q).argmax(-1)
        negate = q[np.arange(n), largest] < 0
        others = np.array([[1, 2, 3], [0, 2, 3], [0, 1, 3], [0, 1, 2]])[largest]
        vals = np.take_along_axis(q, others, axis=1)
        comp = largest.astype(np.uint32)
        for j in range(3):
            sign = ((vals[:, j] < 0) ^ negate).astype(np.uint32)
            mag = np.floor(511.0 * np.abs(vals[:, j]) / np.sqrt(0.5) + 0.5).astype(np.uint32)
            comp = (comp << 10) | (sign << 9) | np.minimum(mag, 511)
        rotations = np.stack([(comp >> s) & 0xFF for s in (0, 8, 16, 24)], -1).astype(np.uint8)
    else:
        q = q * np.where(q[:, 3:] < 0, -1.0, 1.0)
        rotations = u8(q[:, :3] * 127.5 + 127.5)
    sh = np.zeros((n, 0), np.uint8)
    if degree:
        sh = _quantize_sh(a.sh_rest).reshape(n, -1)
    blocks = [positions, alphas, colors, scales, rotations, sh]
    flags = 0x1 if antialiased else 0
    if version < 4:
        header = struct.pack("<IIIBBBB", MAGIC, version, n, degree, frac, flags, 0)
        return gzip.compress(header + b"".join(b.tobytes() for b in blocks), compresslevel=6, mtime=0)
    import zstandard

    compressor = zstandard.ZstdCompressor(level=3)
    streams = [compressor.compress(b.tobytes()) for b in blocks if b.size]
    plain = [b.size for b in blocks if b.size]
    header = struct.pack("<IIIBBBBI12x", MAGIC, 4, n, degree, frac, flags, len(streams), 32)
    toc = struct.pack(
        f"<{2 * len(streams)}Q", *[v for pair in zip(map(len, streams), plain, strict=True) for v in pair]
    )
    return header + toc + b"".join(streams)


def write(arrays: SplatArrays, path: str | os.PathLike, version: int = LATEST) -> Path:
    """Write ``arrays`` as an SPZ file (atomically)."""
    from microdreamer.io_utils import atomic_path

    path = Path(path)
    data = encode(arrays, version)
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    return path
