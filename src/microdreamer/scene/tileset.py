"""A scene meshed in tiles as OGC 3D Tiles 1.1: ``tileset.json`` and one glTF binary per tile.

The layout
----------
``tileset.json`` holds a root tile whose bounding volume is the whole scene's box and one child per tile
of the plan that holds faces, each with its own box and its GLB (``tiles/tile_<a>_<b>_<c>.glb``, one node)
as content. The children are the full-resolution mesh, split by tile (seams shared exactly), so their
``geometricError`` is 0. The root carries a coarse level of detail of the whole scene
(``tiles/root.glb``: the mesh decimated to 1 / :data:`ROOT_LOD_FACTOR` of its faces, vertex colours from
the nearest full-resolution vertex) and refines by ``REPLACE``; its ``geometricError`` is the coarse mesh's
distance from the full one, measured (an upper bound: the farthest full-resolution vertex from its
nearest coarse vertex), and never below the grid's voxel. Without a coarse level (``root=None``) the root
has no content, refines by ``ADD``, and its error is the scene's diagonal (nothing drawn). The tileset's
own ``geometricError`` is the scene's diagonal.

Frames
------
glTF is y-up and 3D Tiles z-up: a client turns each glTF content by the y-up to z-up rotation
(``(x, y, z) -> (x, -z, y)``) before the tile's transform, and the bounding volumes are given in that
z-up frame (3D Tiles 1.1, "glTF transforms"). The GLBs hold our y-up world coordinates unchanged, and
each box is the tile's y-up bounds turned by the same rotation. No root transform: the tileset is in the
splat's own units and origin, not placed on the globe.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from microdreamer.mesh.types import Mesh

logger = logging.getLogger(__name__)

#: the root's coarse level of detail has 1 / ROOT_LOD_FACTOR of the scene's faces
ROOT_LOD_FACTOR = 16
#: a scene of fewer faces than this gets no coarse root (the leaves are cheap enough to load at once)
ROOT_LOD_MIN_FACES = 2000
#: the y-up (glTF) to z-up (3D Tiles) rotation: z-up = Y_UP_TO_Z_UP @ y-up
Y_UP_TO_Z_UP = np.array([[1.0, 0.0, 0.0], [0.0, 0.0, -1.0], [0.0, 1.0, 0.0]])


def box_volume(lo: np.ndarray, hi: np.ndarray) -> list[float]:
    """The 3D Tiles ``box`` (centre, then the three half-axes; 12 numbers, z-up) of the y-up axis-aligned
    box ``[lo, hi]`` ([3] each, world units)."""
    lo, hi = np.asarray(lo, np.float64), np.asarray(hi, np.float64)
    centre = Y_UP_TO_Z_UP @ (0.5 * (lo + hi))
    half = np.maximum(0.5 * (hi - lo), 1e-9)  # a flat tile's box keeps a volume
    axes = (Y_UP_TO_Z_UP * half[None, :]).T  # row i: the rotated half-axis of y-up axis i
    return [float(v) for v in (*centre, *axes.reshape(-1))]


def coarse_root(mesh: Mesh, factor: int = ROOT_LOD_FACTOR) -> tuple[Mesh, float]:
    """``mesh`` decimated to ``1 / factor`` of its faces, and its error: the largest distance from a
    vertex of ``mesh`` to the nearest vertex of the coarse mesh (world units; an upper bound of the
    distance to its surface)."""
    from scipy.spatial import cKDTree

    from microdreamer.mesh.cleanup import decimate

    if mesh.has_texture:
        mesh = Mesh(mesh.vertices, mesh.faces, mesh.colors_at_vertices())
    coarse = decimate(mesh, max(1, mesh.num_faces // factor))
    distance, _ = cKDTree(coarse.vertices.astype(np.float64)).query(mesh.vertices.astype(np.float64))
    return coarse, float(distance.max())


def write_tileset(
    folder: str | os.PathLike,
    tiles: Sequence[tuple[str, Mesh]],
    voxel: float,
    root: tuple[Mesh, float] | None = None,
) -> Path:
    """Write ``tileset.json`` and ``tiles/<name>.glb`` per tile into ``folder`` (which exists; the caller
    stages it: :func:`microdreamer.io_utils.staged_folder`). See the module docstring.

    Args:
        folder: the output folder.
        tiles: ``(name, mesh)`` per tile, none empty, all in one y-up world frame.
        voxel: the grid's spacing (world units): the least error a coarse root can claim.
        root: ``(coarse mesh, its error)`` (:func:`coarse_root`), or None for a root without content.

    Returns:
        the path of ``tileset.json``.
    """
    from microdreamer.mesh.export import glb_nodes_bytes

    if not tiles:
        raise ValueError("a tileset needs at least one tile with faces")
    folder = Path(folder)
    (folder / "tiles").mkdir(exist_ok=True)
    children = []
    lows, highs = [], []
    for name, mesh in tiles:
        lo, hi = mesh.bounds().astype(np.float64)
        lows.append(lo)
        highs.append(hi)
        uri = f"tiles/{name}.glb"
        (folder / uri).write_bytes(glb_nodes_bytes([mesh], [name]))
        children.append({"boundingVolume": {"box": box_volume(lo, hi)}, "geometricError": 0.0,
                         "content": {"uri": uri}})  # fmt: skip
    lo, hi = np.min(lows, 0), np.max(highs, 0)
    diagonal = float(np.linalg.norm(hi - lo))
    top: dict = {"boundingVolume": {"box": box_volume(lo, hi)}}
    if root is not None:
        coarse, error = root
        (folder / "tiles" / "root.glb").write_bytes(glb_nodes_bytes([coarse], ["root"]))
        top.update(geometricError=max(float(error), float(voxel)), refine="REPLACE",
                   content={"uri": "tiles/root.glb"})  # fmt: skip
    else:
        top.update(geometricError=diagonal, refine="ADD")
    top["children"] = children
    doc = {
        "asset": {"version": "1.1", "generator": "microdreamer"},
        "geometricError": max(diagonal, top["geometricError"]),
        "root": top,
    }
    path = folder / "tileset.json"
    path.write_text(json.dumps(doc, indent=1, allow_nan=False))
    logger.info("wrote %s (%d tiles%s)", path, len(tiles), ", a coarse root" if root else "")
    return path


def tile_name(index: tuple[int, int, int]) -> str:
    """``tile_<a>_<b>_<c>``: the name of tile ``(a, b, c)``'s node and file."""
    return "tile_" + "_".join(str(int(i)) for i in index)
