"""Loader of the C++ CPU kernels: one shared library built with the system's C++ compiler on first use.

The sources (``csrc/cpu/``) export plain C functions (pointers and sizes; no PyTorch or Python headers),
so a build is one compiler call of about a second and the library is loaded with :mod:`ctypes`, whose
calls release the GIL: the wrappers in :mod:`microdreamer.kernels.cpu` run them on several Python
threads at once (:mod:`microdreamer.cpu_pool`). Each build lives in ``$XDG_CACHE_HOME/microdreamer/cpu_kernels/<key>``
(``~/.cache`` when unset), the key a hash of the sources, the flags and the compiler's ``--version``;
the library is written under a temporary name and renamed, so processes that build at once never load
half a file. The compiler is ``$CXX``, else ``c++``; a machine without one keeps the PyTorch paths
(:func:`available` is False and ``backend="auto"`` choices fall back). Importing this module compiles
nothing.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

logger = logging.getLogger(__name__)

CSRC = Path(__file__).resolve().with_name("csrc")
SOURCES = (
    "cpu/bake.cpp",
    "cpu/components.cpp",
    "cpu/field.cpp",
    "cpu/mesh_raster.cpp",
    "cpu/raster.cpp",
    "cpu/skyline.cpp",
    "cpu/skyline_c.cpp",
    "cpu/uv_raster.cpp",
)
HEADERS = ("cpu/skyline.h",)
CXXFLAGS = ["-O3", "-std=c++17", "-fPIC", "-shared", "-fno-math-errno", "-ffp-contract=off"]
LIBRARY = "libmicrodreamer_cpu.so"

_i64, _f64, _ptr = ctypes.c_int64, ctypes.c_double, ctypes.c_void_p
#: every exported function: name -> argument types (all return int64; pointers are tensors' data_ptr())
SIGNATURES: dict[str, list] = {
    "md_bake_accumulate": [_i64, _i64, _ptr, _ptr, _i64, _ptr, _ptr, _i64, _i64, _f64, _ptr, _ptr]
    + [_f64, _f64, _f64, _f64, _ptr, _ptr],
    "md_raster_depth": [_i64, _i64, _ptr, _ptr, _i64, _ptr, _i64, _i64, _i64, _f64, _f64, _i64, _ptr],
    "md_field_scatter": [_i64, _ptr, _ptr, _ptr, _ptr, _ptr, _f64, _i64, _i64, _i64, _ptr],
    "md_field_scatter_channels": [_i64, _ptr, _ptr, _ptr, _i64, _ptr, _ptr, _f64, _i64, _i64, _i64, _ptr],
    "md_raster_forward": [
        _i64,
        _i64,
        _i64,
        _i64,
        _i64,
        _ptr,
        _ptr,
        _ptr,
        _ptr,
        _ptr,
        _ptr,
        _i64,
        _i64,
        _ptr,
        _ptr,
    ],  # fmt: skip
    "md_skyline_pack": [_ptr, _ptr, _ptr, _ptr, _ptr, _ptr, _ptr, _i64, _i64, _i64, _i64, _ptr, _ptr],
    "md_slab_extents": [_i64, _ptr, _ptr, _ptr, _ptr, _ptr, _i64, _ptr, _ptr],
    "md_row_spans": [_ptr, _ptr, _i64, _i64, _i64, _f64, _ptr, _ptr, _ptr, _ptr, _i64],
    "md_run_conflicts": [_ptr, _ptr, _ptr, _ptr, _i64, _i64, _ptr, _ptr, _ptr, _ptr],
    "md_face_components": [_ptr, _ptr, _i64, _ptr],
    "md_vertex_components": [_ptr, _i64, _i64, _ptr],
}

_library: ctypes.CDLL | None = None
_failure: str | None = None
_lock = threading.Lock()


def compiler() -> str | None:
    """The C++ compiler's path (``$CXX``, else ``c++`` on the PATH), or None."""
    name = os.environ.get("CXX") or "c++"
    return shutil.which(name)


def available() -> bool:
    """True when the library is built or can be (a compiler is found) and did not fail to build in this
    process. Cheap: builds nothing."""
    if _library is not None:
        return True
    return _failure is None and compiler() is not None


def load() -> ctypes.CDLL:
    """The loaded library; builds it on the first call (cached across processes).

    Raises:
        RuntimeError: no C++ compiler, or the build failed (the compiler's last lines in the message).
    """
    global _library, _failure
    if _library is not None:
        return _library
    with _lock:
        if _library is not None:
            return _library
        if _failure is not None:
            raise RuntimeError(_failure)
        try:
            path = _finished_build() or _build()
            lib = ctypes.CDLL(str(path))
        except (RuntimeError, OSError) as e:
            _failure = str(e)
            raise RuntimeError(_failure) from None
        for name, argtypes in SIGNATURES.items():
            fn = getattr(lib, name)
            fn.argtypes = argtypes
            fn.restype = ctypes.c_int64
        _library = lib
        return lib


def build_key(cxx: str) -> str:
    """A hash of what the library depends on: sources, headers, flags and the compiler's version."""
    h = hashlib.sha256()
    for name in sorted(SOURCES + HEADERS):
        h.update(name.encode() + b"\0" + (CSRC / name).read_bytes() + b"\0")
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True, check=False).stdout
    for part in (cxx, version, repr(CXXFLAGS)):
        h.update(part.encode() + b"\0")
    return h.hexdigest()[:16]


def cache_root() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "microdreamer" / "cpu_kernels"


def _finished_build() -> Path | None:
    cxx = compiler()
    if cxx is None:
        return None
    path = cache_root() / build_key(cxx) / LIBRARY
    return path if path.is_file() else None


def _build() -> Path:
    cxx = compiler()
    if cxx is None:
        raise RuntimeError(
            "cannot build the microdreamer C++ CPU kernels: no C++ compiler found (set CXX or install g++); "
            "the PyTorch paths are used instead"
        )
    folder = cache_root() / build_key(cxx)
    folder.mkdir(parents=True, exist_ok=True)
    logger.info("building the microdreamer C++ CPU kernels (once per source change) in %s", folder)
    fd, tmp = tempfile.mkstemp(prefix=".build-", suffix=".so", dir=folder)
    os.close(fd)
    try:
        cmd = [cxx, *CXXFLAGS, "-I", str(CSRC / "cpu"), *(str(CSRC / s) for s in SOURCES), "-o", tmp]
        result = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            tail = " | ".join(result.stderr.strip().splitlines()[-5:])
            raise RuntimeError(f"building the microdreamer C++ CPU kernels failed ({' '.join(cmd)}): {tail}")
        os.replace(tmp, folder / LIBRARY)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return folder / LIBRARY
