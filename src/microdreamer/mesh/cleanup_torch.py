"""Mesh cleanup in PyTorch, on the mesh's device: :func:`~microdreamer.mesh.cleanup.cleanup_mesh_with_stats`
with the same semantics, results and :class:`~microdreamer.mesh.cleanup.CleanupStats`.

The graph steps run as tensor operations: close vertex pairs from sorted cell keys in eight shifted
grids, connected components by hooking roots to the smaller root and pointer jumping until every
vertex points at the lowest index of its component.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np
import torch

from microdreamer.mesh.cleanup import CAVITY_EPS, CleanupStats
from microdreamer.mesh.marching_torch import TensorGridVertices, TensorMesh

if TYPE_CHECKING:
    from microdreamer.mesh import MeshConfig

logger = logging.getLogger(__name__)

_KEY_BITS = 20  # cells per axis in a pair search: at most 2^20 + 2 (the shift), 21 bits, three in an int64


def min_labels(num_nodes: int, u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """[num_nodes] int64 on ``u``'s device: for each node, the lowest node index of its connected
    component in the undirected graph with edges ``(u[i], v[i])`` ([E] int64 each).

    Rounds of hooking (every root of an edge's two trees points at the smaller root; ``amin`` over
    all its edges) and pointer jumping until every node points at its root. A root is never given a
    larger parent, so the component's lowest index stays a root and ends as the label of all.
    """
    parent = torch.arange(num_nodes, device=u.device)
    while u.numel():
        pu, pv = parent[u], parent[v]
        lo, hi = torch.minimum(pu, pv), torch.maximum(pu, pv)
        split = lo != hi
        if not bool(split.any()):
            break
        u, v, lo, hi = u[split], v[split], lo[split], hi[split]
        parent.scatter_reduce_(0, hi, lo, reduce="amin")  # hi is a root: parent[hi] was hi
        while True:
            grand = parent[parent]
            if torch.equal(grand, parent):
                break
            parent = grand
    return parent


def _run_pairs(sorted_key: torch.Tensor, budget: int):
    """Yields ``(first, second)`` int64 positions into ``sorted_key`` ([K] sorted), ``first < second``,
    of every pair with equal keys, at most about ``budget`` pairs at a time."""
    k = sorted_key.shape[0]
    device = sorted_key.device
    starts_run = torch.ones(k, dtype=torch.bool, device=device)
    starts_run[1:] = sorted_key[1:] != sorted_key[:-1]
    run_start = torch.nonzero(starts_run).squeeze(1)
    run_end = torch.cat([run_start[1:], torch.tensor([k], device=device)])
    run_id = torch.cumsum(starts_run, 0) - 1
    after = run_end[run_id] - torch.arange(k, device=device) - 1  # partners later in the same run
    pos = torch.nonzero(after).squeeze(1)
    if pos.numel() == 0:
        return
    reps = after[pos]
    ends = torch.cumsum(reps, 0)
    total = int(ends[-1])
    cuts = []
    if total > budget:
        marks = torch.arange(budget, total, budget, device=device)
        cuts = torch.searchsorted(ends, marks, right=True).tolist()
    bounds = [0, *cuts, pos.numel()]
    for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
        if hi <= lo:
            continue
        r = reps[lo:hi]
        n = int(r.sum())
        first = torch.repeat_interleave(pos[lo:hi], r, output_size=n)
        step = torch.arange(n, device=device) - torch.repeat_interleave(
            torch.cumsum(r, 0) - r, r, output_size=n
        )
        yield first, first + 1 + step


def close_pairs(points: torch.Tensor, tolerance: float, budget: int = 1 << 24) -> torch.Tensor:
    """[P, 2] int64: pairs ``(i, j)``, ``i != j``, of rows of ``points`` ([K, 3] float64) at most
    ``tolerance`` apart (Euclidean; 0: identical points), each pair at least once, possibly repeated.

    Cells of side ``s`` just above ``2 * tolerance`` in eight grids shifted by ``s / 2`` along any
    subset of the axes: along one axis, two points less than ``s / 2`` apart share a cell of the
    unshifted or of the shifted grid, so every close pair shares a cell in one of the eight. Points
    sharing a cell are runs of the sorted cell keys; all pairs within a run are tested (``budget``
    pairs at a time). The work is the number of same-cell pairs: small unless the tolerance spans
    many vertices.
    """
    k = points.shape[0]
    device = points.device
    if k < 2:
        return torch.zeros((0, 2), dtype=torch.int64, device=device)
    lo = points.min(dim=0).values
    extent = float((points.max(dim=0).values - lo).max())
    # the margin covers the rounding of (p - lo) / s: below 2^21 * 2^-52 cells
    cell = max(2.0 * float(tolerance) * (1.0 + 1e-6), extent * 2.0**-_KEY_BITS)
    if cell == 0.0:  # all points identical
        cell = 1.0
    scaled = (points - lo) / cell
    tol2 = float(tolerance) ** 2
    found = []
    for shift in range(8):
        s = torch.tensor([(shift >> a & 1) * 0.5 for a in range(3)], dtype=torch.float64, device=device)
        c = torch.floor(scaled + s).long()
        key = (c[:, 0] << (2 * (_KEY_BITS + 1))) | (c[:, 1] << (_KEY_BITS + 1)) | c[:, 2]
        sorted_key, order = torch.sort(key)
        for first, second in _run_pairs(sorted_key, budget):
            a, b = order[first], order[second]
            diff = points[a] - points[b]
            close = (diff * diff).sum(dim=1) <= tol2
            found.append(torch.stack([a[close], b[close]], dim=1))
    if not found:
        return torch.zeros((0, 2), dtype=torch.int64, device=device)
    return torch.cat(found)


def merge_map_torch(
    vertices: torch.Tensor, tolerance: float, candidates: torch.Tensor | None = None
) -> torch.Tensor:
    """[V] int64: for each vertex, the lowest index of its merge group (the components of "closer
    than or at ``tolerance``"), as :func:`~microdreamer.mesh.cleanup._merge_map`; ``candidates`` ([V]
    bool), when given, must hold every vertex that has another within the tolerance."""
    v = vertices.shape[0]
    remap = torch.arange(v, device=vertices.device)
    index = remap.clone() if candidates is None else torch.nonzero(candidates).squeeze(1)
    if index.numel() < 2:
        return remap
    pairs = close_pairs(vertices[index].double(), tolerance)
    if pairs.shape[0] == 0:
        return remap
    labels = min_labels(index.numel(), pairs[:, 0], pairs[:, 1])
    remap[index] = index[labels]  # index is increasing: the group's lowest global index
    return remap


def first_unique_faces(faces: torch.Tensor, num_vertices: int) -> torch.Tensor:
    """[F] bool: True for the first face on each set of three vertices (winding ignored)."""
    a, b, c = faces.unbind(1)
    lo = torch.minimum(torch.minimum(a, b), c)
    hi = torch.maximum(torch.maximum(a, b), c)
    mid = a + b + c - lo - hi
    n = int(num_vertices)
    if n < 2_000_000:  # n^3 < 2^63: one key
        order = torch.sort((lo * n + mid) * n + hi, stable=True).indices
        keys = ((lo * n + mid) * n + hi)[order]
    else:  # lexicographic (lo * n + mid, hi) by two stable sorts, least significant first
        order = torch.sort(hi, stable=True).indices
        order = order[torch.sort((lo * n + mid)[order], stable=True).indices]
        keys = torch.stack([(lo * n + mid)[order], hi[order]], dim=1)
    new = torch.ones(faces.shape[0], dtype=torch.bool, device=faces.device)
    if keys.ndim == 1:
        new[1:] = keys[1:] != keys[:-1]
    else:
        new[1:] = (keys[1:] != keys[:-1]).any(dim=1)
    keep = torch.zeros_like(new)
    keep[order[new]] = True  # stable: the first of equal keys is the lowest face index
    return keep


def _drop_unused(mesh: TensorMesh, faces: torch.Tensor) -> TensorMesh:
    used = torch.zeros(mesh.num_vertices, dtype=torch.bool, device=faces.device)
    used[faces.reshape(-1)] = True
    if bool(used.all()):
        return TensorMesh(mesh.vertices, faces, mesh.vertex_colors)
    new_index = torch.cumsum(used, 0) - 1
    colors = None if mesh.vertex_colors is None else mesh.vertex_colors[used]
    return TensorMesh(mesh.vertices[used], new_index[faces], colors)


def _open_components(faces: torch.Tensor, face_label: torch.Tensor, num_vertices: int) -> torch.Tensor:
    """[num_vertices] bool by label: :func:`microdreamer.mesh.cleanup._open_components` in torch."""
    a = faces.reshape(-1)
    b = faces[:, [1, 2, 0]].reshape(-1)
    key, back = a * num_vertices + b, b * num_vertices + a
    ordered, order = torch.sort(key)
    repeated = torch.zeros(key.shape[0], dtype=torch.bool, device=faces.device)  # in two faces
    same = ordered[1:] == ordered[:-1]
    repeated[order[1:][same]] = True
    repeated[order[:-1][same]] = True
    at = torch.searchsorted(ordered, back).clamp_max(key.shape[0] - 1)
    bad = repeated | (ordered[at] != back)  # no reverse edge (a repeated one is caught on its side)
    out = torch.zeros(num_vertices, dtype=torch.bool, device=faces.device)
    out[face_label.repeat_interleave(3)[bad]] = True
    return out


def cleanup_mesh_torch(
    mesh: TensorMesh, config: MeshConfig | None = None, grid: TensorGridVertices | None = None
) -> tuple[TensorMesh, CleanupStats]:
    """:func:`~microdreamer.mesh.cleanup.cleanup_mesh_with_stats` on the mesh's device.

    The same steps, results (vertices, faces, their order) and stats: merge vertices within
    ``config.merge_tolerance`` of the bounding-box diagonal (to the group's lowest index), drop faces
    with a repeated corner, then repeated faces (the first kept), then connected components (faces
    linked through shared vertices) below ``config.min_component_fraction`` of the faces (never the
    largest; ties: the one with the lowest vertex), then, with ``config.remove_cavities``, the walls of
    enclosed voids (float64 volumes; the per-component sums use atomics, so a volume within rounding of
    the threshold could fall differently), then unused vertices.

    Args:
        mesh: [V, 3] float32 vertices and [F, 3] int64 faces on one device (not modified).
        config: a :class:`~microdreamer.mesh.MeshConfig`; None means the defaults.
        grid: for a mesh straight from :func:`~microdreamer.mesh.marching_torch.marching_cubes_torch`,
            where its vertices lie on the grid: the merge then searches only the vertices near a grid
            sample (same result).

    Returns:
        ``(mesh, stats)``: a new :class:`TensorMesh` on the same device and the
        :class:`~microdreamer.mesh.cleanup.CleanupStats`.
    """
    if config is None:
        from microdreamer.mesh import MeshConfig

        config = MeshConfig()
    stats = CleanupStats(vertices_in=mesh.num_vertices, faces_in=mesh.num_faces)
    if mesh.num_faces == 0:
        return TensorMesh.empty(mesh.device), stats
    vertices, faces = mesh.vertices, mesh.faces
    num_vertices = mesh.num_vertices

    # the tolerance from the float32 bounds, computed on the host as the NumPy path computes it
    bounds = torch.stack([vertices.min(dim=0).values, vertices.max(dim=0).values]).cpu().numpy()
    lo, hi = bounds.astype(np.float64)
    tolerance = float(config.merge_tolerance) * float(np.linalg.norm(hi - lo))
    candidates = None
    if grid is not None:
        if grid.coords.shape[0] != num_vertices:
            raise ValueError(f"grid has {grid.coords.shape[0]} vertices, the mesh {num_vertices}")
        candidates = grid.merge_candidates(tolerance)
    remap = merge_map_torch(vertices, tolerance, candidates)
    stats.vertices_merged = int(torch.count_nonzero(remap != torch.arange(num_vertices, device=remap.device)))
    if stats.vertices_merged:
        faces = remap[faces]

    good = (faces[:, 0] != faces[:, 1]) & (faces[:, 1] != faces[:, 2]) & (faces[:, 2] != faces[:, 0])
    n_good = int(torch.count_nonzero(good))
    stats.degenerate_faces = faces.shape[0] - n_good
    if stats.degenerate_faces:
        faces = faces[good]
    if faces.shape[0]:
        unique = first_unique_faces(faces, num_vertices)
        stats.duplicate_faces = faces.shape[0] - int(torch.count_nonzero(unique))
        if stats.duplicate_faces:
            faces = faces[unique]

    if faces.shape[0]:
        labels = min_labels(num_vertices, faces[:, :2].reshape(-1), faces[:, 1:].reshape(-1))
        face_label = labels[faces[:, 0]]
        counts = torch.bincount(face_label, minlength=num_vertices)
        present = counts > 0
        stats.components = int(torch.count_nonzero(present))
        # compared in float64, as NumPy compares int64 counts with the float64 product
        keep_label = counts.double() >= float(config.min_component_fraction) * faces.shape[0]
        largest = torch.argmax(counts)
        keep_label[largest] = True  # never the largest; ties: the lowest label
        removed = present & ~keep_label
        stats.components_removed = int(torch.count_nonzero(removed))
        stats.faces_in_removed_components = int(counts[removed].sum())
        if config.remove_cavities and stats.components > 1:
            centre = torch.as_tensor(0.5 * (lo + hi), dtype=torch.float64, device=vertices.device)
            volume = torch.zeros(num_vertices, dtype=torch.float64, device=vertices.device)
            for start in range(0, faces.shape[0], 1 << 22):
                f = faces[start : start + (1 << 22)]
                a, b, c = (vertices[f[:, k]].double() - centre for k in range(3))
                six = (a * torch.linalg.cross(b, c)).sum(-1)
                volume.index_add_(0, face_label[start : start + (1 << 22)], six)
            eps = CAVITY_EPS * float(np.linalg.norm(hi - lo)) ** 3
            cavity = keep_label & present & (volume / 6.0 < -eps)
            cavity[largest] = False
            if bool(cavity.any()):  # only closed, consistently wound components bound a void
                cavity &= ~_open_components(faces, face_label, num_vertices)
            stats.cavities_removed = int(torch.count_nonzero(cavity))
            stats.faces_in_cavities = int(counts[cavity].sum())
            keep_label &= ~cavity
        if stats.components_removed or stats.cavities_removed:
            faces = faces[keep_label[face_label]]

    out = _drop_unused(mesh, faces)
    stats.vertices_out, stats.faces_out = out.num_vertices, out.num_faces
    logger.debug("cleanup (torch, %s): %s", mesh.device, stats)
    return out, stats
