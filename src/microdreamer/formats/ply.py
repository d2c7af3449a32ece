"""The INRIA 3DGS PLY in NumPy: the header, its checks, reading and writing.

This module imports no torch: the command line reads and checks its input with it while torch is not
yet loaded (:func:`read`); :func:`microdreamer.splat.read_ply` turns the arrays into a
:class:`~microdreamer.splat.Splat`. A PLY whose header declares PlayCanvas's ``chunk`` element and
``packed_*`` vertex properties is a compressed PLY (:mod:`microdreamer.formats.compressed_ply`).

Storage follows the INRIA 3D Gaussian Splatting layout that the whole ecosystem reads (SuperSplat,
gsplat, nerfstudio, the original viewers): one ``vertex`` element with float32 properties

    x y z  nx ny nz  f_dc_0..2  f_rest_0..(3*(K-1)-1)  opacity  scale_0..2  rot_0..3

where K = (degree + 1)^2 SH coefficients per colour channel, ``f_rest`` is stored channel-major
(all of red's higher-order coefficients, then green's, then blue's), ``opacity`` is a logit,
``scale_*`` are natural logs and ``rot_0`` is the quaternion's w. The normals are unused (written as
zeros, as the reference implementation does).

Reading is checked before anything large is allocated: the header is read up to 1 MB, every line must
be a valid PLY header line (no bare or duplicate property), and the vertex count must fit the bytes the
file holds. Values must be finite float32 numbers (NaN, inf and doubles beyond float32 refuse the file,
naming the Gaussians). Finite but degenerate Gaussians follow one policy, chosen so that the splat
meshes as the viewers draw it, and each is named in a warning (its 0-based row in the file):

* a log-scale below ``LOG_SCALE_MIN`` (-87.3: exp() underflows float32, e.g. the -200 some exporters
  write for a flat axis) is **raised** to it: a flat disc, which is what a viewer draws for a zero
  scale; in the density field it adds nothing off its plane either way;
* a log-scale above ``LOG_SCALE_MAX`` (88.7: exp() overflows to inf) or a rotation quaternion shorter
  than ``QUAT_MIN_LENGTH`` (1e-12: no orientation, viewers get NaN) makes the Gaussian **dropped**;
* if none is left, the file is refused.

The export (:func:`microdreamer.jobs.export.prepare_field`) adds a grid-relative clamp that changes no
voxel, and names Gaussians so far from the rest that they squeeze the object into a few voxels.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from microdreamer.errors import InputError
from microdreamer.formats.common import (  # noqa: F401 (re-exported: the limits are part of read's contract)
    LOG_SCALE_MAX,
    LOG_SCALE_MIN,
    QUAT_MIN_LENGTH,
    SplatArrays,
    finish,
)

logger = logging.getLogger(__name__)

BASE_PROPS = ["x", "y", "z", "nx", "ny", "nz", "f_dc_0", "f_dc_1", "f_dc_2"]
TAIL_PROPS = ["opacity", "scale_0", "scale_1", "scale_2", "rot_0", "rot_1", "rot_2", "rot_3"]
_REQUIRED = ["x", "y", "z", "f_dc_0", "f_dc_1", "f_dc_2", *TAIL_PROPS]
_OPTIONAL_IGNORED = {"nx", "ny", "nz"}
_PLY_TYPES = {
    "char": "i1", "int8": "i1", "uchar": "u1", "uint8": "u1",
    "short": "i2", "int16": "i2", "ushort": "u2", "uint16": "u2",
    "int": "i4", "int32": "i4", "uint": "u4", "uint32": "u4",
    "float": "f4", "float32": "f4", "double": "f8", "float64": "f8",
}  # fmt: skip
_REST_COUNTS = {0: 0, 9: 1, 24: 2, 45: 3}  # number of f_rest_* -> SH degree


def is_splat_ply(path: str | os.PathLike) -> bool:
    """True when ``path`` is a PLY whose header declares 3DGS properties (``f_dc_0`` and ``opacity``)."""
    path = Path(path)
    if path.suffix.lower() != ".ply" or not path.is_file():
        return False
    with open(path, "rb") as f:
        head = f.read(1 << 16)
    end = head.find(b"end_header")
    header = head[: end if end >= 0 else len(head)]
    return b"f_dc_0" in header and b"opacity" in header


#: the longest header read (a 3DGS header is about 1.5 KB; comments may add some)
MAX_HEADER_BYTES = 1 << 20
_READ_CHUNK = 32 << 20  # bytes read (and reported to the progress) at a time
_COUNT = re.compile(r"[0-9]+")


@dataclass
class _Header:
    fmt: str
    count: int
    props: list[tuple[str, str]]
    skip: int  # bytes of the elements before the vertex element (binary formats)
    data_start: int  # file offset of the first byte after the header
    elements: list  # every element: [name, count, [(prop, dtype)], {prop names}]


def _malformed(name: str, line: str, what: str = "malformed PLY header line") -> InputError:
    shown = line if len(line) <= 60 else line[:57] + "..."
    return InputError(f"{name}: {what} {shown!r}; the file is not a valid PLY, export it again")


def _parse_header(f, name: str) -> _Header:
    """Read the PLY header (at most :data:`MAX_HEADER_BYTES`): format, vertex count, properties."""
    magic = f.readline(8)
    if magic.strip() != b"ply":
        raise InputError(f"{name}: not a PLY file (it does not start with 'ply'); give a 3DGS .ply splat")
    fmt = None
    elements: list[list] = []  # [name, count, [(prop, dtype)], {prop names}]
    while True:
        raw = f.readline(MAX_HEADER_BYTES + 1)
        if not raw:
            raise InputError(f"{name}: PLY header has no 'end_header' line; the file is truncated or corrupt")
        if f.tell() > MAX_HEADER_BYTES:
            raise InputError(
                f"{name}: the PLY header runs past {MAX_HEADER_BYTES >> 20} MB without 'end_header'; "
                "the file is corrupt or not a splat"
            )
        line = raw.decode("ascii", errors="replace").strip()
        if line == "end_header":
            break
        parts = line.split()
        if not parts or parts[0] in ("comment", "obj_info"):
            continue
        if parts[0] == "format":
            if fmt is not None:
                raise _malformed(name, line, "second PLY format line")
            fmt = parts[1] if len(parts) > 1 else ""
        elif parts[0] == "element":
            if len(parts) != 3 or not _COUNT.fullmatch(parts[2]):
                raise _malformed(name, line)
            elements.append([parts[1], int(parts[2]), [], set()])
        elif parts[0] == "property":
            if not elements:
                raise InputError(f"{name}: PLY property {line!r} appears before any element")
            if len(parts) >= 2 and parts[1] == "list":
                if len(parts) != 5 or parts[2] not in _PLY_TYPES or parts[3] not in _PLY_TYPES:
                    raise _malformed(name, line)
                prop = (parts[4], "list")
            elif len(parts) != 3:
                raise _malformed(name, line)
            elif parts[1] not in _PLY_TYPES:
                raise _malformed(name, line, "unsupported PLY property type in")
            else:
                prop = (parts[2], _PLY_TYPES[parts[1]])
            el_name, _, props, seen = elements[-1]
            if prop[0] in seen:
                raise InputError(
                    f"{name}: property {prop[0]!r} appears twice in element {el_name!r}; "
                    "each property needs its own name, export the splat again"
                )
            props.append(prop)
            seen.add(prop[0])
        else:
            raise _malformed(name, line)
    data_start = f.tell()
    if fmt not in ("binary_little_endian", "binary_big_endian", "ascii"):
        raise InputError(f"{name}: unsupported PLY format {fmt!r}; expected binary_little_endian")
    skip = 0
    for el_name, count, props, _ in elements:
        if el_name == "vertex":
            if any(t == "list" for _, t in props):
                raise InputError(f"{name}: the vertex element has list properties; this is not a 3DGS splat")
            return _Header(fmt, count, props, skip, data_start, elements)
        if fmt == "ascii" or any(t == "list" for _, t in props):
            raise InputError(f"{name}: element {el_name!r} comes before 'vertex'; re-save with vertex first")
        skip += count * sum(np.dtype(t).itemsize for _, t in props)
    raise InputError(f"{name}: PLY has no 'vertex' element; this is not a 3DGS splat")


def read(path: str | os.PathLike, progress: Callable[[float], None] | None = None) -> SplatArrays:
    """Read a 3DGS splat from an INRIA-layout PLY file (binary little/big endian, or ASCII) into NumPy;
    a PlayCanvas compressed PLY is handed to :func:`microdreamer.formats.compressed_ply.decode`.

    Returns float32 :class:`SplatArrays` (:func:`microdreamer.splat.read_ply` makes the Splat of them;
    this function imports no torch, so the command line reads its input before torch is loaded).
    Raises :class:`InputError` with one line for a missing file, a file that is not a PLY, a malformed header (duplicate or bare properties, a header with no
    end), missing properties, a vertex count the file cannot hold (checked against the file's size
    before anything is read), truncated data, non-numeric ASCII values, non-finite values or an empty
    splat. Unknown extra properties are ignored with a warning.

    Degenerate Gaussians (module docstring): log-scales below :data:`LOG_SCALE_MIN` are raised to it,
    Gaussians with a log-scale above :data:`LOG_SCALE_MAX` or a quaternion shorter than
    :data:`QUAT_MIN_LENGTH` are dropped; a warning names them. InputError if none is left.

    Args:
        path: the .ply file.
        progress: ``progress(fraction)`` while the data is read (default: :mod:`microdreamer.progress`
            lines for files above 256 MB).
    """
    path = Path(path)
    name = str(path)
    if not path.exists():
        raise InputError(f"{name}: file not found; give the path of a 3DGS .ply splat")
    if path.is_dir():
        raise InputError(f"{name}: is a directory; give the path of a 3DGS .ply splat")
    try:
        f = open(path, "rb")
    except OSError as e:
        raise InputError(f"{name}: cannot open ({e.strerror}); check the file's permissions") from None
    with f:
        size = os.fstat(f.fileno()).st_size
        head = _parse_header(f, name)
        fmt, count, props = head.fmt, head.count, head.props
        names = [p for p, _ in props]
        if "packed_position" in names and any(e[0] == "chunk" for e in head.elements):
            from microdreamer.formats import compressed_ply

            return compressed_ply.decode(f, head, name, size)
        missing = [p for p in _REQUIRED if p not in names]
        if missing:
            raise InputError(
                f"{name}: missing required PLY properties {', '.join(missing)}; "
                "expected the INRIA 3DGS layout (x y z f_dc_* opacity scale_* rot_*)"
            )
        n_rest = sum(1 for p in names if p.startswith("f_rest_"))
        if n_rest not in _REST_COUNTS or any(f"f_rest_{i}" not in names for i in range(n_rest)):
            raise InputError(
                f"{name}: found {n_rest} f_rest_* properties; expected 0, 9, 24 or 45 (SH degree 0-3) "
                "numbered from f_rest_0"
            )
        known = set(_REQUIRED) | _OPTIONAL_IGNORED | {f"f_rest_{i}" for i in range(n_rest)}
        extra = [p for p in names if p not in known]
        if extra:
            shown = ", ".join(extra[:10]) + (f" and {len(extra) - 10} more" if len(extra) > 10 else "")
            logger.warning("%s: ignoring unknown PLY properties: %s", name, shown)
        if count == 0:
            raise InputError(f"{name}: the splat is empty (0 Gaussians); nothing to convert")
        available = size - head.data_start
        own = progress is None and size > (256 << 20)
        report = _progress_reporter(f"reading {path.name}") if own else progress
        try:
            if fmt == "ascii":
                data = _read_ascii(f, name, count, props, available, report)
            else:
                endian = "<" if fmt == "binary_little_endian" else ">"
                dtype = np.dtype([(p, endian + t) for p, t in props])
                _check_binary_size(name, count, dtype.itemsize, head.skip, available)
                f.seek(head.skip, os.SEEK_CUR)
                data = _read_binary(f, name, count, dtype, report)
        finally:
            if own:
                report.close()
    return _arrays_from_table(data, name, count, n_rest)


def _progress_reporter(desc: str):
    from microdreamer.progress import reporter

    return reporter(desc)


def _check_binary_size(name: str, count: int, itemsize: int, skip: int, available: int) -> None:
    """The header's vertex count against the bytes the file holds, before anything is allocated."""
    if skip + count * itemsize <= available:
        return
    got = max(0, available - skip) // itemsize
    raise InputError(
        f"{name}: truncated: the header declares {count} Gaussians but the data holds {got}; "
        "the file is incomplete, export it again"
    )


def _read_binary(f, name: str, count: int, dtype: np.dtype, progress) -> np.ndarray:
    data = np.empty(count, dtype=dtype)
    view = memoryview(data).cast("B")
    total, done = view.nbytes, 0
    while done < total:
        n = f.readinto(view[done : done + _READ_CHUNK])
        if not n:
            raise InputError(
                f"{name}: truncated: the header declares {count} Gaussians but the data holds "
                f"{done // dtype.itemsize}; the file is incomplete, export it again"
            )
        done += n
        if progress is not None:
            progress(done / total)
    return data


def _read_ascii(
    f, name: str, count: int, props: list[tuple[str, str]], available: int, progress
) -> np.ndarray:
    """Rows of an ASCII PLY, parsed in blocks (memory bounded by the float64 table)."""
    width = len(props)
    if count * 2 * width > available + 1:  # every value takes a digit and a separator at least
        room = (available + 1) // (2 * width)
        raise InputError(
            f"{name}: truncated: the header declares {count} Gaussians but the data has room for at most "
            f"{room}; the file is incomplete, export it again"
        )
    table = np.empty((count, width), dtype=np.float64)
    block = max(1, (1 << 16) // width)
    row = 0
    while row < count:
        lines = []
        for _ in range(min(block, count - row)):
            line = f.readline(1 << 16)
            if not line:
                raise InputError(
                    f"{name}: truncated: the header declares {count} Gaussians but the data holds "
                    f"{row + len(lines)}; the file is incomplete, export it again"
                )
            lines.append(line.split())
        for i, vals in enumerate(lines):
            if len(vals) != width:
                raise InputError(
                    f"{name}: ASCII PLY row {row + i} has {len(vals)} values, expected {width}; "
                    "the file is corrupt, export it again"
                )
        try:
            table[row : row + len(lines)] = np.array(lines, dtype=np.float64)
        except ValueError:
            for i, vals in enumerate(lines):
                for j, v in enumerate(vals):
                    try:
                        float(v)
                    except ValueError:
                        shown = v.decode("ascii", errors="replace")[:20]
                        raise InputError(
                            f"{name}: ASCII PLY row {row + i} has the non-numeric value {shown!r} for "
                            f"property {props[j][0]!r}; the file is corrupt, export it again"
                        ) from None
            raise
        row += len(lines)
        if progress is not None:
            progress(row / count)
    out = np.empty(count, dtype=[(p, "f8") for p, _ in props])
    for j, (p, _) in enumerate(props):
        out[p] = table[:, j]
    return out


def _arrays_from_table(data: np.ndarray, name: str, count: int, n_rest: int) -> SplatArrays:
    """The arrays of a vertex table, checked by :func:`~microdreamer.formats.common.finish`.

    A table of native float32 properties only (what every 3DGS trainer writes) is viewed as an [N, P]
    matrix and each field gathered at once (one pass in the output's order); any other table (doubles,
    integers, the other endianness, ASCII) is converted column by column. Both give the same values."""
    k1 = n_rest // 3  # K - 1 higher-order coefficients per channel
    # f_rest is channel-major in the file; [N, K-1, 3] wants f_rest_{c * (K-1) + k} at [k, c]
    rest = [f"f_rest_{c * k1 + k}" for k in range(k1) for c in range(3)]
    native = np.dtype("=f4")
    if data.dtype.fields and all(t == native for t, *_ in data.dtype.fields.values()):
        table = data.view(native).reshape(count, len(data.dtype.names))
        column = {p: i for i, p in enumerate(data.dtype.names)}

        def cols(names: list[str]) -> np.ndarray:
            return table[:, [column[p] for p in names]]
    else:

        def cols(names: list[str]) -> np.ndarray:
            with np.errstate(over="ignore", invalid="ignore"):  # doubles beyond float32 become inf: refused
                return np.stack([np.asarray(data[p], dtype=np.float32) for p in names], axis=-1)

    sh_rest = cols(rest).reshape(count, k1, 3) if k1 else np.zeros((count, 0, 3), np.float32)
    return finish(
        name,
        means=cols(["x", "y", "z"]),
        sh_dc=cols(["f_dc_0", "f_dc_1", "f_dc_2"]),
        sh_rest=sh_rest,
        opacity_logits=cols(["opacity"])[:, 0],
        log_scales=cols(["scale_0", "scale_1", "scale_2"]),
        quats=cols(["rot_0", "rot_1", "rot_2", "rot_3"]),
    )


def property_names(degree: int) -> list[str]:
    """The INRIA vertex properties of a splat of SH degree ``degree``, in the order written."""
    n_rest = 3 * ((degree + 1) ** 2 - 1)
    return [*BASE_PROPS, *[f"f_rest_{i}" for i in range(n_rest)], *TAIL_PROPS]


def write(arrays: SplatArrays, path: str | os.PathLike) -> Path:
    """Write ``arrays`` as an INRIA-layout binary little-endian PLY (float32; atomically: temp + rename)."""
    from microdreamer.io_utils import atomic_path

    path = Path(path)
    n = len(arrays)
    k1 = arrays.sh_rest.shape[1]
    columns = [
        arrays.means,
        np.zeros((n, 3), np.float32),
        arrays.sh_dc,
        arrays.sh_rest.transpose(0, 2, 1).reshape(n, 3 * k1),
        arrays.opacity_logits.reshape(n, 1),
        arrays.log_scales,
        arrays.quats,
    ]
    table = np.concatenate([np.asarray(c, "<f4") for c in columns], axis=1)
    header = f"ply\nformat binary_little_endian 1.0\nelement vertex {n}\n"
    header += "".join(f"property float {p}\n" for p in property_names(arrays.sh_degree)) + "end_header\n"
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        f.write(header.encode("ascii"))
        f.write(np.ascontiguousarray(table).tobytes())
    return path


read_splat_arrays = read  # the name this reader had before the formats package
