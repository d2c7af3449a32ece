"""Splat file formats: one module a format, each a reader and a writer of the one
:class:`~microdreamer.formats.common.SplatArrays`, and the two entry points every command uses:

* :func:`read_splat_arrays` picks the format by the file's content (magic bytes, the PLY header, the
  JSON's keys), the extension deciding only where the content cannot (``.splat`` has no header);
* :func:`write_splat` picks it by the output's name.

========================  ===================  =======================================================
format                    names                module
========================  ===================  =======================================================
INRIA 3DGS PLY            ``.ply``             :mod:`~microdreamer.formats.ply`
PlayCanvas compressed     ``.compressed.ply``  :mod:`~microdreamer.formats.compressed_ply`
Niantic SPZ (v1-4)        ``.spz``             :mod:`~microdreamer.formats.spz`
PlayCanvas SOG (v1-2)     ``.sog``, folder,    :mod:`~microdreamer.formats.sog`
                          ``meta.json``
antimatter15 splat        ``.splat``           :mod:`~microdreamer.formats.dotsplat`
GaussianSplats3D ksplat   ``.ksplat``          :mod:`~microdreamer.formats.ksplat`
glTF KHR_gaussian_        ``.glb``, ``.gltf``  :mod:`~microdreamer.formats.gltf`
splatting (+ SPZ)
========================  ===================  =======================================================

NumPy only: nothing here imports torch (the command line reads its input before loading torch).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from microdreamer.errors import InputError
from microdreamer.formats.common import SplatArrays

#: format -> what a user calls it
NAMES = {
    "ply": "3DGS PLY", "compressed_ply": "compressed PLY", "spz": "SPZ", "sog": "SOG", "splat": ".splat",
    "ksplat": ".ksplat", "glb": "glTF (KHR_gaussian_splatting)", "glb_spz": "glTF with SPZ compression",
}  # fmt: skip
#: the output names :func:`write_splat` knows, longest first (``.compressed.ply`` before ``.ply``)
WRITE_SUFFIXES = {
    ".compressed.ply": "compressed_ply", ".spz.glb": "glb_spz", ".ply": "ply", ".spz": "spz", ".sog": "sog",
    "meta.json": "sog", ".splat": "splat", ".ksplat": "ksplat", ".glb": "glb", ".gltf": "glb",
}  # fmt: skip
#: suffixes of files that may hold a splat (batch folders collect these)
SPLAT_SUFFIXES = (".ply", ".spz", ".sog", ".splat", ".ksplat", ".glb", ".gltf")


def detect_format(path: str | os.PathLike) -> str | None:
    """The format of the splat at ``path`` (a key of :data:`NAMES` but ``glb_spz``), from its content;
    None for a file that holds no splat we know (a mesh PLY or glTF, an image...)."""
    path = Path(path)
    if path.is_dir():
        return "sog" if (path / "meta.json").is_file() else None
    if not path.is_file():
        return None
    try:
        with open(path, "rb") as f:
            head = f.read(1 << 16)
        size = path.stat().st_size
    except OSError:
        return None
    suffix = path.suffix.lower()
    if head.startswith(b"ply"):
        end = head.find(b"end_header")
        header = head[: end if end >= 0 else len(head)]
        if b"packed_position" in header and b"element chunk" in header:
            return "compressed_ply"
        return "ply" if b"f_dc_0" in header and b"opacity" in header else None
    from microdreamer.formats import gltf, ksplat, spz

    if spz.sniff(head):
        return "spz"
    if head.startswith(b"glTF") or (
        head.lstrip()[:1] == b"{" and suffix != ".json" and path.name != "meta.json"
    ):
        return "glb" if gltf.is_splat(path) else None
    if head.startswith(b"PK\x03\x04"):
        return "sog" if b"meta.json" in _zip_names(path) else None
    if head.lstrip()[:1] == b"{":
        return "sog" if b'"means"' in head else None
    if suffix == ".splat":
        return "splat"  # no header: the reader checks the size
    if suffix == ".ksplat" or ksplat.sniff(head, size):
        return "ksplat"
    return None


def _zip_names(path: Path) -> bytes:
    import zipfile

    from microdreamer.formats.sog import _ZIP_ERRORS

    try:
        with zipfile.ZipFile(path) as z:
            return "\n".join(z.namelist()).encode()
    except _ZIP_ERRORS:
        return b""


def is_splat(path: str | os.PathLike) -> bool:
    """True when ``path`` holds a splat in a format we read (a mesh PLY or glTF is False)."""
    return detect_format(path) is not None


def _readers() -> dict[str, Callable]:
    from microdreamer.formats import dotsplat, gltf, ksplat, ply, sog, spz

    return {
        "ply": ply.read, "compressed_ply": ply.read, "spz": spz.read, "sog": sog.read, "splat": dotsplat.read,
        "ksplat": ksplat.read, "glb": gltf.read,
    }  # fmt: skip


def read_splat_arrays(
    path: str | os.PathLike, progress: Callable[[float], None] | None = None
) -> SplatArrays:
    """Read the splat at ``path`` in any format we know (chosen by content), into PLY-frame, checked
    :class:`SplatArrays` (CPU float32; :meth:`microdreamer.splat.Splat.from_arrays` makes the Splat).

    Raises:
        InputError: one line for a missing path, a file that holds no splat we know (naming what it
            looked like), or a bad file of a known format (the format's reader says what is wrong).
    """
    path = Path(path)
    if not path.exists():
        raise InputError(f"{path}: file not found; give the path of a splat ({', '.join(SPLAT_SUFFIXES)})")
    fmt = detect_format(path)
    if fmt is None:
        if path.is_dir():
            raise InputError(f"{path}: is a directory without a SOG meta.json; give a splat file")
        suffix = path.suffix.lower()
        if suffix in (".ply", ".glb", ".gltf"):
            from microdreamer.formats import ply

            if suffix == ".ply":
                return ply.read(path, progress)  # names what is wrong with the header
            raise InputError(
                f"{path}: the glTF holds no KHR_gaussian_splatting primitive; it is a mesh, not a splat"
            )
        raise InputError(
            f"{path}: not a splat format we read (PLY, compressed PLY, SPZ, SOG, .splat, .ksplat, glTF with "
            "KHR_gaussian_splatting); check the file"
        )
    return _readers()[fmt](path, progress)


def output_format(path: str | os.PathLike) -> str | None:
    """The format :func:`write_splat` writes to ``path`` (by its name), or None."""
    name = str(path).lower().rstrip("/\\")
    for suffix, fmt in WRITE_SUFFIXES.items():
        if name.endswith(suffix):
            return fmt
    return None


def write_splat(splat, path: str | os.PathLike, fmt: str | None = None) -> Path:
    """Write ``splat`` (a :class:`SplatArrays` or a :class:`~microdreamer.splat.Splat`) to ``path`` in
    the format its name says (:data:`WRITE_SUFFIXES`), or ``fmt``; atomically. Returns the path written
    (a SOG folder's ``meta.json``)."""
    from microdreamer.formats import compressed_ply, dotsplat, gltf, ksplat, ply, sog, spz

    arrays = splat if isinstance(splat, SplatArrays) else splat.to_arrays()
    fmt = fmt or output_format(path)
    writers = {
        "ply": ply.write, "compressed_ply": compressed_ply.write, "spz": spz.write, "sog": sog.write,
        "splat": dotsplat.write, "ksplat": ksplat.write, "glb": gltf.write,
        "glb_spz": lambda a, p: gltf.write(a, p, compress_spz=True),
    }  # fmt: skip
    if fmt not in writers:
        known = ", ".join(WRITE_SUFFIXES)
        raise InputError(f"{path}: no splat format is written under this name; end it with one of {known}")
    if len(arrays) == 0:
        raise InputError(f"{path}: the splat is empty; nothing to write")
    return writers[fmt](arrays, path)


__all__ = ["NAMES", "SPLAT_SUFFIXES", "SplatArrays", "detect_format", "is_splat", "output_format",
           "read_splat_arrays", "write_splat"]  # fmt: skip
