"""Loader of the compiled CUDA kernels: built with ``torch.utils.cpp_extension.load`` on first GPU use.

Each build lives in its own folder of PyTorch's extensions directory (``TORCH_EXTENSIONS_DIR`` or
``~/.cache/torch_extensions``), named by a hash of everything the binary depends on (the sources and
headers, the compiler flags, torch's and CUDA's versions, ``TORCH_CUDA_ARCH_LIST`` and the visible GPUs'
architectures). A process that finds a finished build for its hash imports it directly, without
``cpp_extension`` (no ninja run, no rebuild check: about half a second per process); otherwise
``cpp_extension.load`` builds it (tens of seconds) and marks the folder finished. Build settings come
from the usual PyTorch variables (``TORCH_CUDA_ARCH_LIST``, default: the visible GPUs' architecture,
sm_90 on Hopper; ``MAX_JOBS``; ``CUDA_HOME``). Importing this module compiles nothing.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import threading
import time
from pathlib import Path
from types import ModuleType

logger = logging.getLogger(__name__)

CSRC = Path(__file__).resolve().with_name("csrc")
SOURCES = ("bindings.cpp", "fields.cu", "carve.cu", "gather.cu")
EXTENSION_NAME = "microdreamer_kernels"
CFLAGS = ["-O3"]
CUDA_CFLAGS = ["-O3", "-std=c++17"]
#: written into a build's folder once ``cpp_extension.load`` has built and imported it
FINISHED = "finished"

_module: ModuleType | None = None
_failure: RuntimeError | None = None
_lock = threading.Lock()


def load() -> ModuleType:
    """The compiled extension; builds it on the first call in a process (cached across processes).

    Raises:
        RuntimeError: no CUDA build of PyTorch, no GPU, no CUDA toolkit to build with (:class:`NoCompiler`),
            or the build failed; a failure is remembered, so a process tries to build once.
    """
    global _module, _failure
    if _module is not None:
        return _module
    with _lock:
        if _module is not None:
            return _module
        if _failure is not None:
            raise _failure
        try:
            _module = _load()
        except RuntimeError as e:
            _failure = e
            raise
        except Exception as e:  # a compiler's or linker's error of any other kind: the build failed
            _failure = RuntimeError(f"{type(e).__name__}: {e}")
            raise _failure from e
        return _module


class NoCompiler(RuntimeError):
    """No CUDA toolkit (``nvcc``) to build the kernels with, and no finished build of them."""


def toolkit() -> str | None:
    """The CUDA toolkit's ``nvcc`` that a build would use (PyTorch's ``CUDA_HOME``: the ``CUDA_HOME``
    variable, else ``nvcc`` on ``PATH``, else ``/usr/local/cuda``), or None when there is none: the case of
    the usual pip install of PyTorch, which ships the CUDA libraries but no compiler."""
    import shutil

    from torch.utils import cpp_extension

    home = cpp_extension.CUDA_HOME
    if home is not None and os.path.isfile(os.path.join(home, "bin", "nvcc")):
        return os.path.join(home, "bin", "nvcc")
    return shutil.which("nvcc")


def finished_build_exists() -> bool:
    """True when this machine's cache holds a finished build for these sources and GPUs (needs CUDA)."""
    import torch

    if torch.version.cuda is None or not torch.cuda.is_available():
        return False
    folder = build_folder()
    return (folder / FINISHED).is_file() and (folder / f"{EXTENSION_NAME}.so").is_file()


def _load() -> ModuleType:
    import torch

    if torch.version.cuda is None or not torch.cuda.is_available():
        raise RuntimeError(
            f"the microdreamer CUDA kernels need a CUDA GPU and a CUDA build of PyTorch (torch "
            f"{torch.__version__}, CUDA available: {torch.cuda.is_available()}); use backend='torch'"
        )
    folder = build_folder()
    if finished_build_exists():
        return _import_built(folder / f"{EXTENSION_NAME}.so")
    if toolkit() is None:
        raise NoCompiler(
            f"cannot build the microdreamer CUDA kernels: no CUDA toolkit found (nvcc); install the CUDA "
            f"toolkit matching torch's CUDA {torch.version.cuda} and set CUDA_HOME, or use backend='torch'"
        )
    from torch.utils import cpp_extension

    # said at warning level: the first run waits for it (about half a minute), once per source and GPU change
    logger.warning("compiling the microdreamer CUDA kernels (first use: about 30 s, once) into %s", folder)
    folder.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    module = cpp_extension.load(
        name=EXTENSION_NAME,
        sources=[str(CSRC / s) for s in SOURCES],
        extra_cflags=CFLAGS,
        extra_cuda_cflags=CUDA_CFLAGS,
        build_directory=str(folder),
        verbose=False,
    )
    (folder / FINISHED).write_text(f"{EXTENSION_NAME}\n")
    logger.info("built the microdreamer CUDA kernels in %.1f s", time.perf_counter() - started)
    return module


def build_key() -> str:
    """A hash of what the compiled binary depends on (module docstring); needs CUDA."""
    import torch

    h = hashlib.sha256()
    for path in sorted(CSRC.iterdir()):
        if path.suffix in (".cpp", ".cu", ".h", ".cuh"):
            h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    arches = sorted({torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())})
    for part in (torch.__version__, torch.version.cuda, os.environ.get("TORCH_CUDA_ARCH_LIST", ""),
                 repr(arches), repr(CFLAGS), repr(CUDA_CFLAGS), repr(SOURCES)):  # fmt: skip
        h.update(str(part).encode() + b"\0")
    return h.hexdigest()[:16]


def build_folder() -> Path:
    """This build's folder: ``TORCH_EXTENSIONS_DIR``, else ``$XDG_CACHE_HOME`` (``~/.cache``)
    ``/torch_extensions/py<version>_cu<version>`` as PyTorch lays it out, then ``microdreamer_kernels-<key>``
    (found without importing ``torch.utils.cpp_extension``)."""
    import sys

    import torch

    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    if root is None:
        cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        tag = f"py{sys.version_info.major}{sys.version_info.minor}{getattr(sys, 'abiflags', '')}"
        root = os.path.join(
            cache, "torch_extensions", f"{tag}_cu{(torch.version.cuda or '').replace('.', '')}"
        )
    return Path(root) / f"{EXTENSION_NAME}-{build_key()}"


def _import_built(path: Path) -> ModuleType:
    """Import the finished build at ``path`` (an extension module named :data:`EXTENSION_NAME`)."""
    import torch  # noqa: F401  (the extension links against torch's libraries, loaded by this import)

    spec = importlib.util.spec_from_file_location(EXTENSION_NAME, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
