"""Mesh cleanup (merge duplicate vertices, drop degenerate/duplicate faces and floaters) and decimation."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from microdreamer.mesh.types import Mesh

if TYPE_CHECKING:
    import torch

    from microdreamer.mesh import MeshConfig
    from microdreamer.mesh.marching import GridVertices

logger = logging.getLogger(__name__)


@dataclass
class CleanupStats:
    """What :func:`cleanup_mesh_with_stats` did."""

    vertices_in: int = 0
    faces_in: int = 0
    vertices_merged: int = 0  # vertices folded into another within the merge tolerance
    degenerate_faces: int = 0  # faces left with a repeated corner after merging
    duplicate_faces: int = 0  # faces on the same three vertices as an earlier face (either winding)
    components: int = 0  # connected components (sharing a vertex) before floater removal
    components_removed: int = 0
    faces_in_removed_components: int = 0
    cavities_removed: int = 0  # closed components around an enclosed void (MeshConfig.remove_cavities)
    faces_in_cavities: int = 0
    vertices_out: int = 0
    faces_out: int = 0
    #: [faces_out] int64: the input face each output face is (face order is kept)
    face_source: np.ndarray | None = field(default=None, repr=False, compare=False)


def _merge_map(vertices: np.ndarray, tolerance: float, candidates: np.ndarray | None = None) -> np.ndarray:
    """[V] int64: for each vertex, the lowest index of the group of vertices it merges with.

    Groups are the connected components of the graph "closer than or at ``tolerance``" (so merging is
    transitive); ``tolerance == 0`` merges exact duplicates only. ``candidates`` ([V] bool), when
    given, must hold every vertex that has another within the tolerance; only those are searched.
    """
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components
    from scipy.spatial import cKDTree

    v = vertices.shape[0]
    remap = np.arange(v, dtype=np.int64)
    index = remap if candidates is None else np.flatnonzero(candidates)
    if index.size < 2:
        return remap
    points = vertices[index]
    if tolerance > 0:
        pairs = cKDTree(points.astype(np.float64)).query_pairs(tolerance, output_type="ndarray")
    else:
        _, inverse = np.unique(points, axis=0, return_inverse=True)
        order = np.argsort(inverse.reshape(-1), kind="stable")
        sorted_inv = inverse.reshape(-1)[order]
        same = sorted_inv[1:] == sorted_inv[:-1]
        pairs = np.stack([order[:-1][same], order[1:][same]], axis=1)
    if len(pairs) == 0:
        return remap
    k = index.size
    graph = coo_matrix((np.ones(len(pairs), np.int8), (pairs[:, 0], pairs[:, 1])), shape=(k, k))
    n, labels = connected_components(graph, directed=False)
    first = np.full(n, v, dtype=np.int64)
    np.minimum.at(first, labels, index)  # index is increasing: the group's lowest global index
    remap[index] = first[labels]
    return remap


def _first_unique_rows(faces: np.ndarray, num_vertices: int) -> np.ndarray:
    """[F] bool: True for the first face on each set of three vertices (winding ignored).

    Each face's sorted corners (lo, mid, hi) make one int64 key ``(lo * V + mid) * V + hi``: exact while
    ``V ** 3 < 2 ** 63``; beyond, the product wraps around (a hash: equal corners, equal keys), and only the
    faces whose key is repeated are compared exactly, on their corners.
    """
    a, b, c = faces[:, 0], faces[:, 1], faces[:, 2]
    lo = np.minimum(np.minimum(a, b), c)
    hi = np.maximum(np.maximum(a, b), c)
    mid = a + b + c - lo - hi  # the three sorted: (lo, mid, hi)
    n = np.uint64(max(num_vertices, 1))
    with np.errstate(over="ignore"):
        keys = ((lo.astype(np.uint64) * n + mid.astype(np.uint64)) * n + hi.astype(np.uint64)).view(np.int64)
    sorted_keys = np.sort(keys)
    repeated = sorted_keys[1:] == sorted_keys[:-1]
    if not repeated.any():  # the usual case: no duplicate at all
        return np.ones(faces.shape[0], dtype=bool)
    exact = num_vertices < 2_000_000  # num_vertices**3 < 2**63
    if exact:
        _, first = np.unique(keys, return_index=True)
        keep = np.zeros(faces.shape[0], dtype=bool)
        keep[first] = True
        return keep
    keep = np.ones(faces.shape[0], dtype=bool)
    shared = np.flatnonzero(np.isin(keys, np.unique(sorted_keys[1:][repeated])))
    _, first = np.unique(np.stack([lo[shared], mid[shared], hi[shared]], axis=1), axis=0, return_index=True)
    keep[shared] = False
    keep[shared[first]] = True
    return keep


def _vertex_components(faces: np.ndarray, num_vertices: int, backend: str = "auto") -> tuple[int, np.ndarray]:
    """Connected components of the vertices linked by face edges: (count, [V] int32 labels).

    Labels are numbered in the order of each component's lowest vertex index. Two edges per face
    (v0-v1, v1-v2) link its three vertices. ``backend``: ``"scipy"`` searches the graph as directed with
    weak connection (SciPy does it without building the symmetrised graph; the reference), ``"cpp"`` is
    union-find in the C++ CPU kernels (:func:`microdreamer.kernels.cpu.vertex_components`, the same count
    and labels, several times faster), ``"auto"`` the C++ one where it builds.
    """
    if backend not in ("auto", "cpp", "scipy"):
        raise ValueError(f"backend must be 'auto', 'cpp' or 'scipy', got {backend!r}")
    if backend != "scipy":
        from microdreamer.kernels import cpu

        if backend == "cpp" or cpu.usable():
            import torch

            count, labels = cpu.vertex_components(
                torch.from_numpy(np.ascontiguousarray(faces, np.int64)), num_vertices
            )
            return count, labels.numpy()
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import connected_components

    rows = faces[:, :2].reshape(-1)
    cols = faces[:, 1:].reshape(-1)
    data = np.ones(rows.shape[0], np.int8)
    graph = csr_matrix((data, (rows, cols)), shape=(num_vertices, num_vertices))
    return connected_components(graph, directed=True, connection="weak")


#: a component is a cavity when its signed volume is below -CAVITY_EPS times the cube of the mesh's
#: bounding-box diagonal (a void of about 1 % of the object's size across): a margin for the float
#: rounding of the volume's sum, so that a flat sliver with a volume of about 0 is never one
CAVITY_EPS = 1e-6


VOLUME_CHUNK = 1 << 20  # faces per part of :func:`_component_volumes`' sum
VOLUME_WORKERS = 8  # threads at most: a part's arrays take ~150 MB


def _component_volumes(
    vertices: np.ndarray, faces: np.ndarray, face_label: np.ndarray, n: int, lo: np.ndarray, hi: np.ndarray
) -> np.ndarray:
    """[n] float64 signed volume of each component (sum of its faces' tetrahedra with the bounding box's
    centre; for a closed, outward-wound component its volume, negative for one wound inward): per part of
    :data:`VOLUME_CHUNK` faces a sum over its faces in order, the parts' sums then added in order (the
    parts run on up to :data:`VOLUME_WORKERS` threads; NumPy releases the GIL in their array work)."""
    centre = 0.5 * (lo + hi)

    def part(start: int) -> np.ndarray:
        f = faces[start : start + VOLUME_CHUNK]
        a, b, c = (vertices[f[:, k]].astype(np.float64) - centre for k in range(3))
        six = np.einsum("ij,ij->i", a, np.cross(b, c))
        return np.bincount(face_label[start : start + VOLUME_CHUNK], weights=six, minlength=n)

    starts = range(0, faces.shape[0], VOLUME_CHUNK)
    workers = min(len(starts), os.cpu_count() or 1, VOLUME_WORKERS)
    if workers > 1:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=workers) as pool:
            sums = list(pool.map(part, starts))
    else:
        sums = [part(start) for start in starts]
    volume = np.zeros(n, np.float64)
    for s in sums:
        volume += s
    return volume / 6.0


def _open_components(faces: np.ndarray, face_label: np.ndarray, n: int, num_vertices: int) -> np.ndarray:
    """[n] bool: the components with a directed edge (a, b) whose reverse (b, a) is not an edge of
    another face exactly once, i.e. that are not closed and consistently wound."""
    a = faces.reshape(-1).astype(np.int64)
    b = faces[:, [1, 2, 0]].reshape(-1).astype(np.int64)
    key, back = a * num_vertices + b, b * num_vertices + a
    order = np.argsort(key, kind="stable")
    ordered = key[order]
    repeated = np.zeros(key.shape[0], bool)  # a directed edge in two faces
    same = ordered[1:] == ordered[:-1]
    repeated[order[1:][same]] = True
    repeated[order[:-1][same]] = True
    pos = np.searchsorted(ordered, back, side="left")
    at = np.minimum(pos, key.shape[0] - 1)
    found = ordered[at] == back  # the reverse edge exists (once: repeats are caught on its own side)
    bad = repeated | ~found
    out = np.zeros(n, bool)
    out[np.repeat(face_label, 3)[bad]] = True
    return out


def cleanup_mesh_with_stats(
    mesh: Mesh, config: MeshConfig | None = None, grid: GridVertices | None = None, backend: str = "auto"
) -> tuple[Mesh, CleanupStats]:
    """:func:`cleanup_mesh`, also returning what it did.

    ``grid``: for a mesh straight from :func:`~microdreamer.mesh.marching.marching_cubes_on_grid`,
    where its vertices lie on the grid; the merge step then searches only the vertices that can be
    within the tolerance of another (:meth:`GridVertices.merge_candidates`; same result, ~20x faster).
    ``backend``: the connected components' (:func:`_vertex_components`: ``"auto"``, ``"cpp"`` or
    ``"scipy"``; the same result).
    """
    if config is None:
        from microdreamer.mesh import MeshConfig

        config = MeshConfig()
    stats = CleanupStats(vertices_in=mesh.num_vertices, faces_in=mesh.num_faces)
    if mesh.num_faces == 0:
        stats.face_source = np.zeros(0, np.int64)
        return Mesh.empty(), stats

    vertices, faces = mesh.vertices, mesh.faces
    source = np.arange(faces.shape[0], dtype=np.int64)
    # per column: NumPy's axis-0 reductions of an [V, 3] float32 array are ~10x slower
    lo = np.array([vertices[:, a].min() for a in range(3)], np.float64)
    hi = np.array([vertices[:, a].max() for a in range(3)], np.float64)
    tolerance = float(config.merge_tolerance) * float(np.linalg.norm(hi - lo))
    candidates = None
    if grid is not None:
        if grid.coords.shape[0] != mesh.num_vertices:
            raise ValueError(f"grid has {grid.coords.shape[0]} vertices, the mesh {mesh.num_vertices}")
        candidates = grid.merge_candidates(tolerance)
    remap = _merge_map(vertices, tolerance, candidates)
    stats.vertices_merged = int(np.count_nonzero(remap != np.arange(remap.shape[0])))
    if stats.vertices_merged:
        faces = remap[faces]

    # np.compress: row selection by a mask, several times faster than boolean indexing
    good = (faces[:, 0] != faces[:, 1]) & (faces[:, 1] != faces[:, 2]) & (faces[:, 2] != faces[:, 0])
    stats.degenerate_faces = int(faces.shape[0] - np.count_nonzero(good))
    if stats.degenerate_faces:
        faces = np.compress(good, faces, axis=0)
        source = np.compress(good, source)
    if faces.shape[0]:
        unique = _first_unique_rows(faces, mesh.num_vertices)
        stats.duplicate_faces = int(faces.shape[0] - np.count_nonzero(unique))
        if stats.duplicate_faces:
            faces = np.compress(unique, faces, axis=0)
            source = np.compress(unique, source)

    if faces.shape[0]:
        _, labels = _vertex_components(faces, mesh.num_vertices, backend)
        face_label = labels[faces[:, 0]]
        counts = np.bincount(face_label)
        present = counts > 0
        stats.components = int(np.count_nonzero(present))
        keep_label = counts >= float(config.min_component_fraction) * faces.shape[0]
        largest = np.argmax(counts)
        keep_label[largest] = True  # never remove the largest component
        removed = present & ~keep_label
        stats.components_removed = int(np.count_nonzero(removed))
        stats.faces_in_removed_components = int(counts[removed].sum())
        if config.remove_cavities and stats.components > 1:
            volume = _component_volumes(vertices, faces, face_label, counts.shape[0], lo, hi)
            cavity = keep_label & present & (volume < -CAVITY_EPS * float(np.linalg.norm(hi - lo)) ** 3)
            cavity[largest] = False
            if cavity.any():  # only closed, consistently wound components bound a void
                cavity &= ~_open_components(faces, face_label, counts.shape[0], mesh.num_vertices)
            stats.cavities_removed = int(np.count_nonzero(cavity))
            stats.faces_in_cavities = int(counts[cavity].sum())
            keep_label &= ~cavity
        if stats.components_removed or stats.cavities_removed:
            keep = keep_label[face_label]
            faces = np.compress(keep, faces, axis=0)
            source = np.compress(keep, source)

    out = Mesh(vertices, faces, mesh.vertex_colors).subset_faces(slice(None))
    stats.vertices_out, stats.faces_out = out.num_vertices, out.num_faces
    stats.face_source = source
    logger.debug("cleanup: %s", stats)
    return out, stats


def cleanup_mesh(mesh: Mesh, config: MeshConfig | None = None) -> Mesh:
    """Clean a marching-cubes mesh.

    In order:

    1. merge vertices closer than ``config.merge_tolerance`` times the bounding-box diagonal
       (transitively; each group keeps the position and colour of its lowest-index vertex);
    2. drop faces with a repeated corner, then faces on the same three vertices as an earlier face
       (either winding; the first is kept);
    3. drop floaters: connected components (faces linked through shared vertices) with fewer than
       ``config.min_component_fraction`` times the total face count; the largest component is never
       dropped (``min_component_fraction = 0`` keeps everything);
    4. with ``config.remove_cavities``: drop the closed, consistently wound components (every directed
       edge's reverse in exactly one other face) whose signed volume is below ``-CAVITY_EPS`` times the
       diagonal cubed (wound inward: the wall of an enclosed void, which nothing outside sees), never
       the largest;
    5. drop vertices no face uses.

    Faces with three distinct but collinear corners are kept: removing them would open holes.

    Args:
        mesh: the input mesh (not modified).
        config: a :class:`~microdreamer.mesh.MeshConfig` (uses ``merge_tolerance``,
            ``min_component_fraction`` and ``remove_cavities``); None means the defaults.

    Returns:
        A new :class:`Mesh`; face order and vertex order are kept among the survivors. Empty in,
        empty out.
    """
    return cleanup_mesh_with_stats(mesh, config)[0]


CLUSTER_ABOVE = 8  # a CUDA decimation clusters first when the mesh has this many times the target's faces
CLUSTER_TO = 4  # ... to this many times the target's faces


def decimate(
    mesh: Mesh, target_faces: int, aggressiveness: float = 7.0, device: str | torch.device | None = None
) -> Mesh:
    """Simplify ``mesh`` to about ``target_faces`` faces by quadric edge collapse (fast_simplification).

    A no-op (returns ``mesh`` itself) when it already has ``target_faces`` faces or fewer. The result
    usually lands within a few percent of the target (the simplifier stops at the first pass that
    reaches it). Vertex colours, if any, are taken from the nearest input vertex.

    Args:
        mesh: the input mesh (not modified).
        target_faces: the wanted face count, >= 1.
        aggressiveness: fast_simplification's ``agg`` (higher is faster and rougher; 7 is its default).
        device: a CUDA device: a mesh of more than ``CLUSTER_ABOVE`` times the target's faces is first
            clustered there to about ``CLUSTER_TO`` times the target (:func:`~microdreamer.mesh.cluster.
            cluster_decimate`; edge collapse costs about a second per million faces, clustering on the
            GPU a few milliseconds, ``benchmarks/bench_decimate.py``). On a 2-core CPU the two ways were
            even at 327k -> 25k faces (0.19-0.46 s against 0.24-0.31 s), so None or a CPU device leaves
            it to edge collapse alone.
    """
    if target_faces < 1:
        raise ValueError(f"target_faces must be >= 1, got {target_faces}")
    if mesh.num_faces <= target_faces:
        return mesh
    import fast_simplification

    if (
        device is not None
        and str(device).startswith("cuda")
        and mesh.num_faces > CLUSTER_ABOVE * target_faces
    ):
        from microdreamer.mesh.cluster import cluster_decimate

        mesh = cluster_decimate(mesh, CLUSTER_TO * target_faces, device)
    points, faces = fast_simplification.simplify(
        mesh.vertices.astype(np.float64),
        mesh.faces,
        target_count=int(target_faces),
        agg=float(aggressiveness),
    )
    colors = None
    if mesh.vertex_colors is not None and len(points):
        from scipy.spatial import cKDTree

        _, nearest = cKDTree(mesh.vertices.astype(np.float64)).query(points)
        colors = mesh.vertex_colors[nearest]
    out = Mesh(points.astype(np.float32), faces.astype(np.int64), colors)
    if out.num_faces:
        out = out.subset_faces(slice(None))  # drop vertices the simplifier left without faces
    logger.debug("decimate: %d -> %d faces (target %d)", mesh.num_faces, out.num_faces, target_faces)
    return out
