"""A self-contained web viewer for meshes (GLB/OBJ), 3DGS splats and job output folders.

:func:`build_viewer` writes a folder (``index.html``, the assets, the vendored three.js + Spark
bundle) that needs no network; :func:`serve` serves it on 127.0.0.1. The page reports what it loaded
(splats, vertices, triangles, load times, errors) as JSON in ``#md-stats``, whose ``data-state`` is
``loading``, ``ready`` or ``error``.

The JavaScript is rebuilt from npm with pinned versions by ``scripts/vendor_viewer.sh``
(``vendor/VERSIONS`` lists them).
"""

from microdreamer.viewer.build import build_viewer
from microdreamer.viewer.server import serve

__all__ = ["build_viewer", "serve"]
