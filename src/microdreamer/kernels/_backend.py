"""Loader of the compiled CUDA kernels: built with ``torch.utils.cpp_extension.load`` on first GPU use.

The build is cached in PyTorch's extensions directory (``TORCH_EXTENSIONS_DIR`` or
``~/.cache/torch_extensions``) and redone only when a source changes. Build settings come from the
usual PyTorch variables (``TORCH_CUDA_ARCH_LIST``, default: the visible GPUs' architecture, sm_90 on
Hopper; ``MAX_JOBS``; ``CUDA_HOME``). Importing this module compiles nothing.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from types import ModuleType

logger = logging.getLogger(__name__)

CSRC = Path(__file__).resolve().with_name("csrc")
SOURCES = ("bindings.cpp", "fields.cu", "carve.cu")
EXTENSION_NAME = "microdreamer_kernels"

_module: ModuleType | None = None
_lock = threading.Lock()


def load() -> ModuleType:
    """The compiled extension; builds it on the first call in a process (cached across processes).

    Raises:
        RuntimeError: no CUDA build of PyTorch, no GPU, or no CUDA toolkit to build with.
    """
    global _module
    if _module is not None:
        return _module
    with _lock:
        if _module is not None:
            return _module
        import torch

        if torch.version.cuda is None or not torch.cuda.is_available():
            raise RuntimeError(
                f"the microdreamer CUDA kernels need a CUDA GPU and a CUDA build of PyTorch (torch "
                f"{torch.__version__}, CUDA available: {torch.cuda.is_available()}); use backend='torch'"
            )
        from torch.utils import cpp_extension

        if cpp_extension.CUDA_HOME is None:
            raise RuntimeError(
                f"cannot build the microdreamer CUDA kernels: no CUDA toolkit found (nvcc); install the CUDA "
                f"toolkit matching torch's CUDA {torch.version.cuda} and set CUDA_HOME, or use backend='torch'"
            )
        logger.info("loading the microdreamer CUDA kernels (compiled on first use, then cached by torch)")
        _module = cpp_extension.load(
            name=EXTENSION_NAME,
            sources=[str(CSRC / s) for s in SOURCES],
            extra_cflags=["-O3"],
            extra_cuda_cflags=["-O3", "-std=c++17"],
            verbose=False,
        )
        return _module
