"""antimatter15's ``.splat`` (the web viewers' format), read and written.

No header: 32 bytes a Gaussian, little endian: position (3 x float32), scale (3 x float32, linear),
colour and opacity (4 x uint8: ``0.5 + C0 f_dc`` and ``sigmoid(opacity)``, times 255) and the rotation
(4 x uint8, w x y z, ``q * 128 + 128`` of the unit quaternion). No SH bands: they are dropped on writing.
The PLY frame, as every viewer of the format reads it.

Quantisation (what the tests allow): positions and scales exact (float32), base colour 1/255 of
``0.5 + C0 f_dc`` (f_dc 1/72), opacity 1/255, quaternion components 1/128 before renormalising.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np

from microdreamer.errors import InputError
from microdreamer.formats.common import (
    SH_C0,
    SplatArrays,
    finish,
    logit,
    normalized_quats,
    read_file,
    sigmoid,
)

logger = logging.getLogger(__name__)

RECORD = np.dtype([("position", "<f4", 3), ("scale", "<f4", 3), ("rgba", "u1", 4), ("rot", "u1", 4)])


def read(path: str | os.PathLike, progress=None) -> SplatArrays:
    """Read a ``.splat`` file; one InputError line for a size that is not a whole number of records."""
    name = str(path)
    data = read_file(path, "splat .splat")
    if len(data) % RECORD.itemsize:
        raise InputError(
            f"{name}: {len(data)} bytes is not a whole number of 32-byte .splat records; the file is "
            "truncated or not a .splat"
        )
    rec = np.frombuffer(data, RECORD)
    with np.errstate(divide="ignore", invalid="ignore"):
        log_scales = np.log(rec["scale"].astype(np.float64))
    bad = ~(rec["scale"] > 0).all(-1) & np.isfinite(rec["scale"]).all(-1)
    if bad.any():  # zero or negative linear scales: the flattest disc float32 holds, as viewers draw them
        log_scales[bad] = np.log(np.maximum(rec["scale"][bad].astype(np.float64), 1e-38))
    rgba = rec["rgba"].astype(np.float64) / 255.0
    quats = rec["rot"].astype(np.float64) - 128.0
    return finish(
        name, rec["position"], (rgba[:, :3] - 0.5) / SH_C0, np.zeros((len(rec), 0, 3), np.float32),
        logit(rgba[:, 3]), log_scales, quats,
    )  # fmt: skip


def write(arrays: SplatArrays, path: str | os.PathLike) -> Path:
    """Write ``arrays`` as a ``.splat`` file (atomically); SH bands above 0 are dropped (with a note)."""
    from microdreamer.io_utils import atomic_path

    path = Path(path)
    if arrays.sh_degree:
        logger.warning("%s: .splat holds no SH bands; degree %d dropped", path, arrays.sh_degree)
    rec = np.zeros(len(arrays), RECORD)
    rec["position"] = arrays.means
    rec["scale"] = np.exp(arrays.log_scales.astype(np.float64))
    rgb = arrays.sh_dc.astype(np.float64) * SH_C0 + 0.5
    alpha = sigmoid(arrays.opacity_logits)[:, None]
    rec["rgba"] = np.clip(np.round(np.concatenate([rgb, alpha], -1) * 255), 0, 255)
    rec["rot"] = np.clip(np.round(normalized_quats(arrays.quats) * 128 + 128), 0, 255)
    with atomic_path(path) as tmp:
        tmp.write_bytes(rec.tobytes())
    return path
