"""microdreamer: image-to-3D with score-based iterative reconstruction, and fast splat-to-mesh.

Importing the package is cheap: it imports neither torch nor any stage. ``Splat``, ``read_ply`` and
``write_ply`` (:mod:`microdreamer.splat`) load on first use; heavy modules (diffusers, gsplat, the CUDA
kernels) load inside the stage that needs them.
"""

from __future__ import annotations

from microdreamer.errors import ConfigError, InputError

__all__ = ["ConfigError", "InputError", "Splat", "read_ply", "write_ply"]
__version__ = "0.1.0"

_FROM_SPLAT = ("Splat", "read_ply", "write_ply")


def __getattr__(name: str):
    if name in _FROM_SPLAT:
        from microdreamer import splat

        return getattr(splat, name)
    raise AttributeError(f"module 'microdreamer' has no attribute {name!r}")
