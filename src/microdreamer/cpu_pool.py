"""Independent pieces of CPU work on a pool of threads that each run PyTorch single-threaded.

PyTorch's intra-op (OpenMP) threads meet at a barrier after every operation. On a 2-core machine that
other processes also use, those barriers collapse: the bake's Gaussian renders took 9-30 s on two
threads against 1.2-1.3 s on one (4 views of 512^2, the ghost sample). Work that splits into
independent parts (cameras, texel ranges) runs them on Python threads instead, PyTorch at one thread
each (its operations release the GIL): about one thread's speed when the other core is taken, both
cores when it is free. The density field (``field/torch_impl.py``) does the same with its tiles.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import torch

T = TypeVar("T")
R = TypeVar("R")


def cpu_workers(device: torch.device, parts: int) -> int:
    """How many threads :func:`map_single_threaded` should use for ``parts`` parts on ``device``: 1
    off the CPU, else ``min(parts, torch.get_num_threads())`` (1 inside a worker of another pool)."""
    if device.type != "cpu":
        return 1
    return max(1, min(parts, torch.get_num_threads()))


def map_single_threaded(fn: Callable[[T], R], items: Sequence[T], workers: int) -> list[R]:
    """``[fn(x) for x in items]``, in order, on ``workers`` threads with PyTorch at one thread each
    (restored after). ``workers <= 1`` runs in this thread with the threads as they are."""
    if workers <= 1 or len(items) <= 1:
        return [fn(x) for x in items]
    from concurrent.futures import ThreadPoolExecutor

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            return list(pool.map(fn, items))
    finally:
        torch.set_num_threads(threads)
