"""What a GPU without the compiled kernels runs, said once.

The density field's and carving's CUDA kernels (:mod:`microdreamer.kernels._backend`) and gsplat's
rasteriser (:mod:`microdreamer.render._gsplat`) are compiled on first use with the CUDA toolkit's ``nvcc``.
The usual ``pip install torch`` ships the CUDA libraries but no compiler; a build can also fail. Then the
``backend="auto"`` choices on a GPU take the PyTorch paths (the same results, slower) and the user is told
once per process, in one warning line, what is slower and how to get the fast path.
"""

from __future__ import annotations

import logging
import threading

logger = logging.getLogger("microdreamer")

_said: set[str] = set()
_lock = threading.Lock()


def _say_once(key: str, line: str) -> bool:
    with _lock:
        if key in _said:
            return False
        _said.add(key)
    logger.warning("%s", line)
    return True


def needs_compiler() -> list[str]:
    """What would run on PyTorch paths for want of a compiler: the field kernels when no finished build
    of them is cached, gsplat's rasteriser when gsplat is installed without a prebuilt extension."""
    from microdreamer.kernels import _backend
    from microdreamer.render import _gsplat

    out = []
    if not _backend.finished_build_exists():
        out.append("the density field and silhouette carving")
    if _gsplat.installed() and not _gsplat.prebuilt():
        out.append("splat rendering (gsplat)")
    return out


def no_compiler() -> None:
    """No CUDA toolkit to build the kernels with: one line for the whole process, naming what is slower."""
    import torch

    what = " and ".join(needs_compiler()) or "the compiled kernels"
    _say_once(
        "no_compiler",
        f"no CUDA compiler (nvcc) found: {what} run on PyTorch paths on the GPU (same results, slower); for "
        f"the fast path install the CUDA toolkit matching torch's CUDA {torch.version.cuda} (nvcc on PATH or "
        f"CUDA_HOME set): the kernels build once, in a few minutes, into ~/.cache/torch_extensions",
    )


def build_failed(component: str, error: str, what: str) -> None:
    """Building ``component`` failed with ``error``: one line per component."""
    last = next((ln.strip() for ln in reversed(error.strip().splitlines()) if ln.strip()), "no message")
    _say_once(
        f"build_failed:{component}",
        f"building {component} failed ({last[:160]}): {what} run on PyTorch paths on the GPU (same results, "
        f"slower); fix the CUDA toolkit (nvcc matching torch's CUDA) and run again for the fast path",
    )


def kernels_usable() -> bool:
    """True when our CUDA kernels (the density field, silhouette carving) load on this machine's GPU,
    building them now if needed (tens of seconds, once). False when they cannot (no compiler, a failed
    build): then ``backend="auto"`` choices on a GPU take the PyTorch paths, said once here."""
    from microdreamer.kernels import _backend

    try:
        _backend.load()
    except _backend.NoCompiler:
        no_compiler()
        return False
    except RuntimeError as e:
        build_failed("the microdreamer CUDA kernels", str(e), "the density field and silhouette carving")
        return False
    return True


def said() -> list[str]:
    """The notices given so far in this process (their keys), for tests."""
    with _lock:
        return sorted(_said)


def reset() -> None:
    """Forget what was said (tests)."""
    with _lock:
        _said.clear()
