"""A scene larger than any one grid of its voxel could hold densely (a street, a drone flight): the voxel
stays the Gaussians' (no fixed cap on the points along an axis), each object is meshed as it is alone, in
memory that follows the tiles, and only a grid past what the plan addresses grows the voxel or is refused."""

from __future__ import annotations

import dataclasses
import re
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.spatial import cKDTree

from microdreamer.config import FieldConfig, MeshConfig
from microdreamer.scene import plan_scene, scene_to_mesh
from microdreamer.scene import tiles as scene_tiles

pytest.importorskip("skimage")
sys.path.insert(0, str(Path(__file__).parent))
from test_scene import _canonical_faces, spheres  # noqa: E402  (the scene tests' input builder)

#: the spheres' voxel: VOXEL_FACTOR times their Gaussians' largest scale (0.03, the same for all)
VOXEL = scene_tiles.VOXEL_FACTOR * 0.03
#: the points along an axis the grid had at most before (the auto voxel was grown past it)
OLD_CAP = 16384


def _object(result, centre) -> scene_tiles.Mesh:
    """The faces of ``result``'s mesh within 1 of ``centre`` (one sphere of radius 0.3), with their
    vertices."""
    v = result.mesh.vertices[result.mesh.faces].astype(np.float64).mean(1)
    near = np.abs(v - np.asarray(centre)).max(1) < 1.0
    return result.mesh.subset_faces(np.flatnonzero(near))


def _distances(a, b) -> np.ndarray:
    """For each vertex of ``a``: the distance to the nearest vertex of ``b``, in voxels."""
    dist, _ = cKDTree(b.vertices.astype(np.float64)).query(a.vertices.astype(np.float64))
    return dist / VOXEL


def test_a_street_past_the_old_cap_keeps_the_gaussians_voxel_and_meshes_each_object_as_alone():
    """Two spheres 500 apart (20,875 points along x at the auto voxel): the voxel is not grown, and each
    sphere's mesh is the mesh of that sphere alone at the same voxel and level. The first sphere lies on
    the same grid points either way (the grid starts at the lowest centre), so its mesh is the same, bit
    for bit; the second's centres are float32 at 500 (rounded by 1/400 of a voxel), so its vertices move
    by a few hundredths of a voxel, the same faces. No merge (its tolerance is a fraction of the bounding
    box) and no cavity removal (off for scenes, ``SceneConfig.remove_cavities``): both depend on the scene's
    extent by design."""
    far = (round(500 / VOXEL) * VOXEL, 0.0, 0.0)  # on the first sphere's grid but for float32 rounding
    splat = spheres([(0.0, 0.0, 0.0), far])
    said = []
    config = MeshConfig(threshold="auto", remove_cavities=False, merge_tolerance=0.0)
    pair = scene_to_mesh(splat, FieldConfig(), config, tile=64, progress=said.append)
    g = pair.plan.grid
    median = float(splat.scales().amax(-1).median())
    assert g.spacing == scene_tiles.VOXEL_FACTOR * median  # from the Gaussians' scales, not grown
    assert max(g.shape) > OLD_CAP, g.shape
    assert not [s for s in said if "grown" in s]
    # memory follows the tile: one (tile + 1)^3 field and its padded copy at most
    assert pair.memory.largest <= (64 + 3) ** 3 * 4
    assert pair.memory.peak <= 2 * (64 + 3) ** 3 * 4
    assert pair.memory.current == 0
    for centre, exact in (((0.0, 0.0, 0.0), True), (far, False)):
        at_level = dataclasses.replace(config, threshold=pair.level)
        alone = scene_to_mesh(spheres([centre]), FieldConfig(), at_level, tile=64, voxel=g.spacing)
        a, b = alone.mesh, _object(pair, centre)
        assert (a.num_vertices, a.num_faces) == (b.num_vertices, b.num_faces)
        dist, match = cKDTree(b.vertices.astype(np.float64)).query(a.vertices.astype(np.float64))
        assert float(dist.max()) / VOXEL <= (1e-5 if exact else 0.05)
        assert np.unique(match).size == a.num_vertices
        assert _canonical_faces(match[a.faces]) == _canonical_faces(b.faces)


def test_objects_far_apart_on_every_axis_are_meshed_in_memory_that_follows_the_tiles():
    """Two spheres 3,000 apart along x, y and z: a grid of 125,042^3 points cut into 7.5 billion tiles of
    64 cells, two of them occupied. Nothing is dense over the grid or its tiles (the bins, the densest
    tile's estimate under a memory budget, the weld's int64 keys), each sphere meshes as it does alone
    (at the default merge tolerance too: a fraction of the bounding box, held to MERGE_MAX_VOXELS of a
    voxel, where 1e-6 of this diagonal would be 0.22 of a voxel), and an auto iso level thins its images."""
    far = 125_000 * VOXEL
    splat = spheres([(0.0, 0.0, 0.0), (far, far, far)])
    level = scene_to_mesh(spheres([(0.0, 0.0, 0.0)]), FieldConfig(), MeshConfig(threshold="auto")).level
    plan = plan_scene(splat, FieldConfig(), tile=64, memory=50 * 10**6)
    assert plan.grid.spacing == pytest.approx(VOXEL, rel=1e-6)
    assert min(plan.grid.shape) > 125_000 and plan.num_tiles > 2**32
    tiles, counts = plan.occupied()
    assert tiles.numel() == 2 and plan._starts.numel() == 3  # one bin per occupied tile, not per tile
    assert int(counts.sum()) == len(splat)
    config = MeshConfig(threshold=level, remove_cavities=False)
    pair = scene_to_mesh(splat, FieldConfig(), config, plan=plan)
    assert pair.memory.peak <= 2 * (64 + 3) ** 3 * 4
    for centre in ((0.0, 0.0, 0.0), (far, far, far)):
        alone = scene_to_mesh(spheres([centre]), FieldConfig(), config, tile=64, voxel=plan.grid.spacing)
        a, b = alone.mesh, _object(pair, centre)
        # the pair merges vertices within 1/32 of a voxel, the sphere alone within 1e-6 of its own box's
        # diagonal: about 2 % fewer vertices here (0.22 of a voxel would merge a fifth)
        assert 0.95 * a.num_vertices <= b.num_vertices <= a.num_vertices
        assert 0.95 * a.num_faces <= b.num_faces <= a.num_faces
        assert float(_distances(a, b).max()) <= scene_tiles.MERGE_MAX_VOXELS + 0.25  # merged, or float32
        assert float(np.quantile(_distances(b, a), 0.99)) <= 0.05
    said = []
    tracemalloc.start()  # NumPy's allocations (the column maxima among them)
    try:
        scene_to_mesh(splat, FieldConfig(), MeshConfig(threshold="auto"), plan=plan, progress=said.append)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert scene_tiles.iso_stride(plan.grid.shape) > scene_tiles.ISO_STRIDE
    assert [s for s in said if s.startswith("iso level from a column every")]
    assert peak < 200 * 10**6  # the three maxima images at every 2nd column would take 47 GB


def test_only_a_grid_past_what_the_plan_addresses_grows_the_auto_voxel_or_refuses_a_voxel():
    """Past 2^20 points along an axis (the Gaussians' voxel coordinates are float32) the auto voxel grows
    to fit, said in one line; an explicit voxel there is refused with one line naming a voxel that fits."""
    assert 4 * (scene_tiles.MAX_AXIS_POINTS + 2) ** 3 <= scene_tiles.MAX_KEYS  # the weld's keys never limit
    assert scene_tiles.grid_limit((scene_tiles.MAX_AXIS_POINTS, 2, 2)) is None
    assert "float32" in scene_tiles.grid_limit((scene_tiles.MAX_AXIS_POINTS + 1, 2, 2))
    far = 1.1 * scene_tiles.MAX_AXIS_POINTS * VOXEL
    splat = spheres([(0.0, 0.0, 0.0), (far, 0.0, 0.0)], n=100)
    said = []
    plan = plan_scene(splat, FieldConfig(), progress=said.append)
    assert len(said) == 1 and "grown" in said[0] and "\n" not in said[0], said
    assert plan.grid.spacing > VOXEL
    assert scene_tiles.MAX_AXIS_POINTS - 2 <= max(plan.grid.shape) <= scene_tiles.MAX_AXIS_POINTS
    with pytest.raises(ValueError, match="use a voxel of") as error:
        plan_scene(splat, FieldConfig(), voxel=VOXEL)
    message = str(error.value)
    assert "\n" not in message and f"{scene_tiles.MAX_AXIS_POINTS:,}" in message
    least = float(re.search(r"use a voxel of (\S+) or more", message).group(1))
    assert plan.grid.spacing <= least <= 1.011 * plan.grid.spacing
    fits = plan_scene(splat, FieldConfig(), voxel=least)
    assert max(fits.grid.shape) <= scene_tiles.MAX_AXIS_POINTS
    with pytest.raises(ValueError, match="positive"):
        plan_scene(splat, FieldConfig(), voxel=float("nan"))


def test_the_tile_bins_hold_the_occupied_tiles_only():
    """gaussians_of is empty for a tile no Gaussian touches; occupied() lists the others."""
    plan = plan_scene(spheres([(0.0, 0.0, 0.0), (5.0, 0.0, 0.0)], n=100), FieldConfig(), tile=16)
    tiles, counts = plan.occupied()
    assert 0 < tiles.numel() < plan.num_tiles and bool((counts > 0).all())
    empty = sorted(set(range(plan.num_tiles)) - set(tiles.tolist()))[0]
    assert plan.gaussians_of(empty).numel() == 0 and plan.gaussians_of(empty).dtype == torch.int64
    for t, n in zip(tiles.tolist(), counts.tolist(), strict=True):
        assert plan.gaussians_of(t).numel() == n
