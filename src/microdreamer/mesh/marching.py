"""Marching cubes on a density grid (scikit-image's Lewiner implementation), faces wound outward."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np

from microdreamer.mesh.types import Mesh

logger = logging.getLogger(__name__)


def _as_numpy(x, dtype) -> np.ndarray:
    """A NumPy array from a NumPy array, a torch tensor (any device) or a sequence."""
    if hasattr(x, "detach"):  # torch.Tensor, without importing torch here
        x = x.detach().cpu().numpy()
    return np.asarray(x, dtype=dtype)


def _close_boundary_pad(values: np.ndarray, threshold: float) -> np.ndarray:
    """[R0+2, R1+2, R2+2] float32: ``values`` with one extra layer of samples on every side, all below
    ``threshold``.

    A pad sample next to a border sample ``v`` (its nearest border sample, for the pad's edges and
    corners) gets ``2 * threshold - v`` where ``v > threshold`` (so the iso-level crossing lies exactly
    half a voxel outside the border) and ``v`` otherwise, always clamped strictly below the threshold.
    """
    padded = np.pad(values, 1, mode="edge")
    t = np.float32(threshold)
    below = np.nextafter(t, np.float32(-np.inf))
    for axis in range(3):
        for index in (0, -1):
            sl = [slice(None)] * 3
            sl[axis] = index
            shell = padded[tuple(sl)]  # a view; edges and corners are visited twice, which is harmless
            reflected = np.where(shell > t, 2 * t - shell, shell)
            np.minimum(reflected, below, out=shell)
    return padded


def marching_cubes(
    values,
    threshold: float,
    origin,
    spacing: float | Sequence[float],
    close_boundary: bool = True,
) -> Mesh:
    """Extract the iso-surface ``values == threshold`` of a density grid as a triangle mesh.

    The object is where ``values > threshold``. Grid sample ``[i, j, k]`` sits at world position
    ``origin + spacing * (i, j, k)``; vertices are linearly interpolated along grid edges
    (scikit-image's ``marching_cubes``, Lewiner's method) and mapped to world space.

    Args:
        values: [R0, R1, R2] float grid (NumPy array or torch tensor on any device; copied to the CPU).
            The grid need not be cubic; each axis needs at least 2 samples when ``close_boundary`` is
            False. Must be finite.
        threshold: the iso-level.
        origin: [3] world position of sample ``[0, 0, 0]``.
        spacing: distance between neighbouring samples (a float, or [3] per axis).
        close_boundary: if True, the grid is padded with one layer of samples below the threshold
            before marching, so a field still above the threshold at the grid's border gives a closed
            (watertight) surface: the cap lies flat, half a voxel outside the outermost samples (the
            boundary of the cells those samples stand for). If False, such a surface is left open at
            the border.

    Returns:
        A :class:`Mesh` whose face normals point outward, away from ``values > threshold``, without
        vertex colours. An empty mesh when the grid has no surface: every sample is ``<= threshold``
        or every sample is ``> threshold`` (the latter would only give the grid's box; the caller
        decides whether either is an error). Where a sample equals the threshold exactly, marching
        cubes can emit faces with coincident corners; :func:`cleanup_mesh` merges and drops them.
    """
    from skimage import measure

    grid = _as_numpy(values, np.float32)
    if grid.ndim != 3:
        raise ValueError(f"values must be a 3D grid [R0, R1, R2], got shape {grid.shape}")
    if not close_boundary and min(grid.shape) < 2:
        raise ValueError(f"values needs at least 2 samples per axis without close_boundary, got {grid.shape}")
    if grid.size == 0:
        return Mesh.empty()
    if not np.isfinite(grid).all():
        raise ValueError("values contains NaN or infinite samples; the density field is broken")
    origin_np = _as_numpy(origin, np.float64).reshape(-1)
    if origin_np.shape != (3,):
        raise ValueError(f"origin must have 3 elements, got shape {origin_np.shape}")
    spacing_np = np.broadcast_to(_as_numpy(spacing, np.float64), (3,))
    if not (spacing_np > 0).all():
        raise ValueError(f"spacing must be positive, got {spacing_np.tolist()}")

    threshold = float(threshold)
    inside = grid > np.float32(threshold)
    n_inside = int(np.count_nonzero(inside))
    del inside
    if n_inside == 0 or n_inside == grid.size:
        where = "below or at" if n_inside == 0 else "above"
        logger.info("marching cubes: every sample is %s the threshold %g; no surface", where, threshold)
        return Mesh.empty()

    shape, offset = grid.shape, 0.0
    if close_boundary:
        grid = _close_boundary_pad(grid, threshold)
        offset = 1.0
    verts, faces, _normals, _values = measure.marching_cubes(grid, level=threshold)
    if faces.shape[0] == 0:
        return Mesh.empty()
    # scikit-image winds faces so that cross(v1 - v0, v2 - v0) points towards the larger values,
    # i.e. into our object (its returned normals point the other way). Swap two corners to turn
    # every face outward.
    faces = faces[:, [0, 2, 1]]
    world = (verts.astype(np.float64) - offset) * spacing_np + origin_np
    mesh = Mesh(world.astype(np.float32), faces.astype(np.int64))
    logger.debug("marching cubes: grid %s -> %d vertices, %d faces", shape, mesh.num_vertices, mesh.num_faces)
    return mesh
