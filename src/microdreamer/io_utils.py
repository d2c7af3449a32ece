"""Output files: checked before any work, written to a temporary name beside the target, then renamed."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from microdreamer.errors import InputError


def check_output_path(path: str | os.PathLike, suffixes: Sequence[str], what: str) -> Path:
    """``path`` as a Path, or a one-line InputError if its suffix is not one of ``suffixes`` (case
    ignored) or its folder does not exist. ``what`` names the kind of file in the message."""
    path = Path(path)
    if path.suffix.lower() not in suffixes:
        given = path.suffix or "(none)"
        choices = ", ".join(suffixes[:-1]) + f" or {suffixes[-1]}"
        raise InputError(f"{path}: unsupported {what} format {given!r}; use {choices}")
    if not path.parent.is_dir():
        raise InputError(f"{path}: the folder {path.parent} does not exist; create it or choose another path")
    return path


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it onto ``path`` only if the block succeeds.

    On any exception the temporary file is removed, so a failure never leaves a half-written output.
    The temporary name keeps the target's suffix (``.tmp-<pid>.glb``) so that writers choosing a
    format from the suffix still work.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.stem}.tmp-{os.getpid()}{path.suffix}")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def to_uint8(image: np.ndarray) -> np.ndarray:
    """A float image in [0, 1] (clipped) as uint8, rounded to nearest (ties to even)."""
    return np.round(np.clip(image, 0.0, 1.0) * 255.0).astype(np.uint8)
