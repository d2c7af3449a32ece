"""Scenes: a splat too large for one dense grid meshed tile by tile, out of core (:mod:`.tiles`).

The tiling is a plan above the stages: :func:`plan_scene` lays one global grid over the scene and cuts it
into cubic tiles; :func:`scene_to_mesh` runs the field (:mod:`microdreamer.field`'s C++ kernel), marching
cubes and the cleanup's merge search (:mod:`microdreamer.mesh`) on each tile on its own, with one iso
level for the whole scene chosen before the tiles are meshed, and welds the pieces by their global grid
edges. A single object is the one-tile case of the same plan.
"""

from microdreamer.scene.tiles import (
    MemoryCounter,
    SceneGrid,
    ScenePlan,
    SceneResult,
    TilePiece,
    plan_scene,
    scene_to_mesh,
    threaded_tiles,
    tile_of_points,
    weld_pieces,
)

__all__ = [
    "MemoryCounter",
    "SceneGrid",
    "ScenePlan",
    "SceneResult",
    "TilePiece",
    "plan_scene",
    "scene_to_mesh",
    "threaded_tiles",
    "tile_of_points",
    "weld_pieces",
]
