"""The INRIA 3DGS PLY reader's old home: it lives in :mod:`microdreamer.formats.ply` now (every format
in :mod:`microdreamer.formats`); these names stay importable from here."""

from __future__ import annotations

from microdreamer.formats import is_splat as is_splat_file  # noqa: F401
from microdreamer.formats.common import SplatArrays  # noqa: F401
from microdreamer.formats.ply import (  # noqa: F401
    BASE_PROPS,
    LOG_SCALE_MAX,
    LOG_SCALE_MIN,
    MAX_HEADER_BYTES,
    QUAT_MIN_LENGTH,
    TAIL_PROPS,
    is_splat_ply,
    read_splat_arrays,
)
