"""Marching cubes on a density grid (scikit-image's Lewiner implementation), faces wound outward."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from microdreamer.mesh.types import Mesh

logger = logging.getLogger(__name__)


def _as_numpy(x, dtype) -> np.ndarray:
    """A NumPy array from a NumPy array, a torch tensor (any device) or a sequence."""
    if hasattr(x, "detach"):  # torch.Tensor, without importing torch here
        x = x.detach().cpu().numpy()
    return np.asarray(x, dtype=dtype)


@dataclass
class GridVertices:
    """Where the vertices of a marching-cubes mesh lie on the sampling grid.

    Scikit-image's marching cubes (Lewiner) puts each vertex either on a grid edge (the segment
    between two neighbouring samples; then two of its grid coordinates are exact integers, stored
    exactly in float32) or, for some ambiguous cube configurations, inside a cube (its centre vertex).
    Two vertices on edges that share no sample are at least one grid step apart; two on edges that
    share a sample can only be within ``tolerance`` of each other when both are within ``tolerance``
    of that sample (orthogonal or collinear offsets). :meth:`merge_candidates` uses this to restrict
    the merge search of :func:`~microdreamer.mesh.cleanup_mesh_with_stats` to a few vertices.

    Attributes:
        coords: [V, 3] float32 grid coordinates of the vertices (sample units; any integer offset).
        spacing: [3] float64 world distance of one grid step per axis.
        world_error: bound on the rounding of each world coordinate of the mesh's float32 vertices.
    """

    coords: np.ndarray
    spacing: np.ndarray
    world_error: float = 0.0

    @classmethod
    def empty(cls) -> GridVertices:
        return cls(np.zeros((0, 3), np.float32), np.ones(3))

    def merge_candidates(self, tolerance: float) -> np.ndarray | None:
        """[V] bool: a superset of the vertices that lie within ``tolerance`` (world units, as the
        mesh's float32 positions give it) of another vertex; None (search all) when the grid step is
        too small for the argument (tolerance above a quarter of a step).

        A vertex is a candidate when (a) it lies within the tolerance of a grid sample, or (b) it
        shares its grid edge with another vertex, or (c) it is within one cell of a vertex that is not
        on a grid edge (a cube's centre vertex). Proof that every close pair is caught: a pair with a
        vertex not on an edge is caught by (c); two vertices on one edge by (b); on two edges sharing a
        sample, both are within the tolerance of that sample, (a); on edges sharing none, they are at
        least one grid step apart, more than the tolerance.
        """
        v = self.coords.shape[0]
        if v == 0:
            return np.zeros(0, dtype=bool)
        # the tolerance in grid steps, widened by the rounding of both vertices' world positions
        e = (float(tolerance) + 4.0 * self.world_error) / float(self.spacing.min())
        if not e < 0.25:
            return None
        e32 = np.float32(e * (1.0 + 1e-6) + 1e-30)  # compared in float32: round up, never down
        cols = [np.ascontiguousarray(self.coords[:, a]) for a in range(3)]
        for a, c in enumerate(cols):  # shift by whole steps (exact) so that coordinates are >= 0
            low = np.floor(c.min())
            if low < 0:
                cols[a] = c - low
        dist = [np.abs(c - np.rint(c)) for c in cols]  # distance to the nearest integer (exact)
        integral = [d == 0 for d in dist]
        n_integral = integral[0].view(np.uint8) + integral[1].view(np.uint8) + integral[2].view(np.uint8)
        candidates = (dist[0] <= e32) & (dist[1] <= e32) & (dist[2] <= e32)  # (a) near a grid sample

        on_edge = np.flatnonzero(n_integral == 2)  # two integral coordinates: inside one grid edge
        if on_edge.size > 1:  # (b): key = (free axis, floor of the three coordinates)
            cell = [np.floor(c[on_edge]).astype(np.int64) for c in cols]
            size = max(int(c.max()) for c in cell) + 2  # coordinates are >= 0
            axis = np.where(~integral[0][on_edge], 0, np.where(~integral[1][on_edge], 1, 2))
            keys = ((axis * size + cell[0]) * size + cell[1]) * size + cell[2]
            sk = np.sort(keys)
            repeated = sk[1:][sk[1:] == sk[:-1]]
            if repeated.size:  # rare: a vertex not made for this edge lies on it
                candidates[on_edge[np.isin(keys, repeated)]] = True

        inner = n_integral < 2  # (c) not on an edge: a cube's centre vertex
        if inner.any():
            cell = [np.floor(c).astype(np.int64) + 1 for c in cols]  # >= 1: coordinates are >= 0
            occupied = np.zeros(tuple(int(c.max()) + 2 for c in cell), dtype=bool)
            ci = [c[inner] for c in cell]
            for dz in (-1, 0, 1):
                for dy in (-1, 0, 1):
                    for dx in (-1, 0, 1):
                        occupied[ci[0] + dz, ci[1] + dy, ci[2] + dx] = True
            candidates |= occupied[cell[0], cell[1], cell[2]]
        return candidates


def _straddling_cubes(grid: np.ndarray, threshold: float) -> np.ndarray:
    """[R0, R1, R2] bool, scikit-image's ``mask`` for :func:`skimage.measure.marching_cubes`: True at
    ``[i+1, j+1, k+1]`` when the cube with lowest corner ``[i, j, k]`` has corners on both sides of
    ``threshold`` (scikit-image tests a cube's mask at its highest corner). The sides are decided as
    scikit-image decides them: ``value - threshold > 0`` in float64."""
    above = grid > np.float64(threshold)  # a float64 scalar: compared in float64, not float32
    any_above = above[:-1] | above[1:]
    any_above = any_above[:, :-1] | any_above[:, 1:]
    any_above = any_above[:, :, :-1] | any_above[:, :, 1:]
    all_above = above[:-1] & above[1:]
    all_above = all_above[:, :-1] & all_above[:, 1:]
    all_above = all_above[:, :, :-1] & all_above[:, :, 1:]
    mask = np.zeros(grid.shape, dtype=bool)
    np.greater(any_above, all_above, out=mask[1:, 1:, 1:])  # any and not all
    return mask


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
    return marching_cubes_on_grid(values, threshold, origin, spacing, close_boundary)[0]


def marching_cubes_on_grid(
    values,
    threshold: float,
    origin,
    spacing: float | Sequence[float],
    close_boundary: bool = True,
) -> tuple[Mesh, GridVertices]:
    """:func:`marching_cubes`, also returning where its vertices lie on the grid (for
    :func:`~microdreamer.mesh.cleanup_mesh_with_stats`'s fast merge search)."""
    from skimage import measure

    grid = _as_numpy(values, np.float32)
    if grid.ndim != 3:
        raise ValueError(f"values must be a 3D grid [R0, R1, R2], got shape {grid.shape}")
    if not close_boundary and min(grid.shape) < 2:
        raise ValueError(f"values needs at least 2 samples per axis without close_boundary, got {grid.shape}")
    if grid.size == 0:
        return Mesh.empty(), GridVertices.empty()
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
        return Mesh.empty(), GridVertices.empty()

    shape, offset = grid.shape, 0.0
    if close_boundary:
        grid = _close_boundary_pad(grid, threshold)
        offset = 1.0
    # only the cubes whose corners straddle the level can hold triangles; scikit-image's mask skips
    # the others without changing the output (same vertices and faces in the same order), ~1.5x faster
    mask = _straddling_cubes(grid, threshold)
    verts, faces, _normals, _values = measure.marching_cubes(grid, level=threshold, mask=mask)
    if faces.shape[0] == 0:
        return Mesh.empty(), GridVertices.empty()
    # scikit-image winds faces so that cross(v1 - v0, v2 - v0) points towards the larger values,
    # i.e. into our object (its returned normals point the other way). Swap two corners to turn
    # every face outward.
    faces = faces[:, [0, 2, 1]]
    world = (verts.astype(np.float64) - offset) * spacing_np + origin_np
    mesh = Mesh(world.astype(np.float32), faces.astype(np.int64))
    # float32 rounding of the world positions: at most half an ulp, <= |x| 2^-24, per coordinate
    world_error = float(np.abs(world).max()) * 2.0**-24
    logger.debug("marching cubes: grid %s -> %d vertices, %d faces", shape, mesh.num_vertices, mesh.num_faces)
    return mesh, GridVertices(verts, spacing_np.astype(np.float64), world_error)
