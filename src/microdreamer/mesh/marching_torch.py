"""Marching cubes in PyTorch, on the device of the density grid (the GPU path of the mesh stage).

A vectorised classic marching cubes with the output contract of
:func:`~microdreamer.mesh.marching.marching_cubes`: one vertex per grid edge the surface crosses
(shared by the faces around it), faces wound outward, ``close_boundary`` by the same pad, world
coordinates ``origin + spacing * index``. Its triangulation is scikit-image's ``method="lorensen"``
(:mod:`~microdreamer.mesh.mc_table`), its vertex placement and inside/outside decision are
scikit-image's, evaluated in the same float64 arithmetic, so the mesh equals scikit-image's Lorensen
mesh bit for bit up to the numbering of the vertices (faces come in the same order).

Steps, all tensor operations on the grid's device (no Python loop over cells):

1. ``inside = values > threshold`` (decided in float64 as scikit-image decides it), on the grid
   extended by a copy of its last layer on each high side so that every sample is the lowest corner
   of a cube; per cube the 8-bit case of its corners, built one axis at a time; the active cubes
   (neither all in nor all out) by ``nonzero``. These are the only passes over R^3.
2. Every crossed edge starts at the lowest sample of an active cube (its three forward edges are the
   cube's edges from corner 0): a scan over the active cubes of how many of those three cross gives
   every crossed edge its vertex id (by sample in C order, then axis).
3. Per active cube inside the grid, its triangles from the table; each triangle corner's edge names
   its lower sample, whose rank among the active cubes (a binary search) gives the vertex id.
4. Per crossed edge, the vertex by scikit-image's interpolation between the edge's two samples.

Memory for an R^3 grid: besides the input (and its padded copy with ``close_boundary``), about three
uint8 tensors of R^3 at a time, plus O(M) for the M active cubes and O(V + F) for the mesh.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from microdreamer.mesh.mc_table import edge_geometry, table_arrays
from microdreamer.mesh.types import Mesh

logger = logging.getLogger(__name__)

# scikit-image's "strength" of a corner is 1 / (EPS + |value - level|) with EPS = np.spacing(1.0)
_SKIMAGE_EPS = float(np.spacing(1.0))


@dataclass
class TensorMesh:
    """An indexed triangle mesh held as torch tensors on one device (the device-side twin of
    :class:`~microdreamer.mesh.types.Mesh`).

    Attributes:
        vertices: [V, 3] float32, world space.
        faces: [F, 3] int64 indices into ``vertices``; ``cross(v1 - v0, v2 - v0)`` points outward.
        vertex_colors: optional [V, 3] float32 RGB in [0, 1].
    """

    vertices: torch.Tensor
    faces: torch.Tensor
    vertex_colors: torch.Tensor | None = None

    @classmethod
    def empty(cls, device: torch.device | str = "cpu") -> TensorMesh:
        return cls(
            torch.zeros((0, 3), dtype=torch.float32, device=device),
            torch.zeros((0, 3), dtype=torch.int64, device=device),
        )

    @classmethod
    def from_mesh(cls, mesh: Mesh, device: torch.device | str = "cpu") -> TensorMesh:
        """The arrays of ``mesh`` (vertices, faces, vertex colours) copied to ``device``."""
        colors = None if mesh.vertex_colors is None else torch.from_numpy(mesh.vertex_colors).to(device)
        return cls(
            torch.from_numpy(mesh.vertices).to(device), torch.from_numpy(mesh.faces).to(device), colors
        )

    @property
    def device(self) -> torch.device:
        return self.vertices.device

    @property
    def num_vertices(self) -> int:
        """V."""
        return int(self.vertices.shape[0])

    @property
    def num_faces(self) -> int:
        """F."""
        return int(self.faces.shape[0])

    @property
    def is_empty(self) -> bool:
        return self.num_faces == 0

    def to_mesh(self) -> Mesh:
        """The mesh as a NumPy :class:`Mesh` (copied to the host)."""
        colors = None if self.vertex_colors is None else self.vertex_colors.detach().cpu().numpy()
        return Mesh(self.vertices.detach().cpu().numpy(), self.faces.detach().cpu().numpy(), colors)


@dataclass
class TensorGridVertices:
    """Where the vertices of :func:`marching_cubes_torch`'s mesh lie on the grid (the torch twin of
    :class:`~microdreamer.mesh.marching.GridVertices`).

    Every vertex lies on a grid edge (two of its grid coordinates are exact integers) and no two
    vertices share an edge, so of :meth:`GridVertices.merge_candidates`'s three cases only (a), a
    vertex within the tolerance of a grid sample, can hold a close pair.

    Attributes:
        coords: [V, 3] float32 grid coordinates (sample units; the padded grid's with close_boundary).
        spacing: [3] float64 world distance of one grid step per axis.
        world_error: bound on the rounding of each world coordinate of the float32 vertices.
    """

    coords: torch.Tensor
    spacing: np.ndarray
    world_error: float = 0.0

    def merge_candidates(self, tolerance: float) -> torch.Tensor | None:
        """[V] bool on the coordinates' device: a superset of the vertices that lie within
        ``tolerance`` (world units) of another vertex; None (search all) when the tolerance is above
        a quarter grid step, where the argument does not hold."""
        e = (float(tolerance) + 4.0 * self.world_error) / float(self.spacing.min())
        if not e < 0.25:
            return None
        e32 = float(np.float32(e * (1.0 + 1e-6) + 1e-30))  # compared in float32: round up, never down
        dist = (self.coords - torch.round(self.coords)).abs()  # exact in float32
        return (dist <= e32).all(dim=1)


def _as_tensor(x, dtype: torch.dtype) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x.detach().to(dtype)
    return torch.as_tensor(np.asarray(x), dtype=dtype)


def _host_vector(x, name: str) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    return np.asarray(x, dtype=np.float64)


def _side_threshold(threshold: float) -> float:
    """The largest float32 at or below ``threshold``: for float32 ``v``, ``v > threshold`` in float64
    (scikit-image's decision) is exactly ``v > _side_threshold(threshold)`` in float32."""
    t = np.float32(threshold)
    if float(t) > float(threshold):
        t = np.nextafter(t, np.float32(-np.inf))
    return float(t)


def close_boundary_pad_torch(values: torch.Tensor, threshold: float) -> torch.Tensor:
    """[R0+2, R1+2, R2+2] float32 on ``values``' device: the pad of
    :func:`~microdreamer.mesh.marching._close_boundary_pad` (same float32 arithmetic, same result):
    edge-replicated, then on every side ``2 * threshold - v`` where ``v > threshold``, clamped strictly
    below the threshold."""
    r0, r1, r2 = values.shape
    padded = values.new_empty((r0 + 2, r1 + 2, r2 + 2))
    padded[1:-1, 1:-1, 1:-1] = values
    padded[0, 1:-1, 1:-1] = values[0]  # edge replication, one axis after the other
    padded[-1, 1:-1, 1:-1] = values[-1]
    padded[:, 0, 1:-1] = padded[:, 1, 1:-1]
    padded[:, -1, 1:-1] = padded[:, -2, 1:-1]
    padded[:, :, 0] = padded[:, :, 1]
    padded[:, :, -1] = padded[:, :, -2]
    t = torch.tensor(np.float32(threshold), dtype=torch.float32, device=values.device)
    below = torch.nextafter(t, torch.tensor(-np.inf, dtype=torch.float32, device=values.device))
    for axis in range(3):
        for index in (0, -1):
            shell = padded.select(axis, index)  # a view
            reflected = torch.where(shell > t, 2 * t - shell, shell)
            shell.copy_(torch.minimum(reflected, below))
    return padded


def _edge_bit_tables() -> tuple[np.ndarray, np.ndarray]:
    """(``[256]`` int64: per cube case, bit ``a`` set when the edge from the cube's lowest corner
    along axis ``a`` crosses the level; ``[8, 3]`` int64: for such a 3-bit mask, the set bits below
    bit ``a``, i.e. the rank of axis ``a``'s vertex among the sample's)."""
    c = np.arange(256)
    # corner 0 against corner 4 (axis 0), 2 (axis 1), 1 (axis 2)
    bits = ((c ^ (c >> 4)) & 1) | (((c ^ (c >> 2)) & 1) << 1) | (((c ^ (c >> 1)) & 1) << 2)
    b = np.arange(8)
    rank = np.stack([np.zeros(8, np.int64), b & 1, (b & 1) + (b >> 1 & 1)], axis=1)
    return bits.astype(np.int64), rank.astype(np.int64)


def marching_cubes_torch(
    values,
    threshold: float,
    origin,
    spacing: float | Sequence[float],
    close_boundary: bool = True,
) -> tuple[TensorMesh, TensorGridVertices]:
    """Marching cubes on the device of ``values``: :func:`~microdreamer.mesh.marching.marching_cubes`'s
    contract, with scikit-image's Lorensen triangulation.

    Args:
        values: [R0, R1, R2] float grid, a torch tensor on any device (the work runs there) or a
            NumPy array (CPU). Must be finite; each axis needs 2 samples without ``close_boundary``.
        threshold: the iso-level; the object is where ``values > threshold``.
        origin: [3] world position of sample ``[0, 0, 0]``.
        spacing: distance between neighbouring samples (a float, or [3] per axis).
        close_boundary: pad the grid with a layer below the threshold so the surface is closed half a
            voxel outside the outermost samples (see :func:`marching_cubes`).

    Returns:
        ``(mesh, grid)``: a :class:`TensorMesh` on the device of ``values`` (vertices [V, 3] float32
        world space, faces [F, 3] int64 wound outward; vertices numbered by their edge: lowest sample
        in C order, then axis), and :class:`TensorGridVertices` for the cleanup's merge search. An
        empty mesh when every sample is on one side of the threshold.
    """
    grid = _as_tensor(values, torch.float32)
    device = grid.device
    if grid.ndim != 3:
        raise ValueError(f"values must be a 3D grid [R0, R1, R2], got shape {tuple(grid.shape)}")
    if not close_boundary and min(grid.shape) < 2:
        raise ValueError(
            f"values needs at least 2 samples per axis without close_boundary, got {tuple(grid.shape)}"
        )
    empty = (
        TensorMesh.empty(device),
        TensorGridVertices(torch.zeros((0, 3), dtype=torch.float32, device=device), np.ones(3)),
    )
    if grid.numel() == 0:
        return empty
    # one pass for both checks: the extremes propagate NaN and hold any infinity
    low, high = (float(x) for x in torch.aminmax(grid))
    if not (math.isfinite(low) and math.isfinite(high)):
        raise ValueError("values contains NaN or infinite samples; the density field is broken")
    origin_np = _host_vector(origin, "origin").reshape(-1)
    if origin_np.shape != (3,):
        raise ValueError(f"origin must have 3 elements, got shape {origin_np.shape}")
    spacing_np = np.broadcast_to(_host_vector(spacing, "spacing"), (3,)).copy()
    if not (spacing_np > 0).all():
        raise ValueError(f"spacing must be positive, got {spacing_np.tolist()}")

    threshold = float(threshold)
    # the scikit-image path's test (in float32: low and high are float32), so both agree on "no surface"
    t32 = float(np.float32(threshold))
    if high <= t32 or low > t32:
        where = "below or at" if high <= t32 else "above"
        logger.info("marching cubes: every sample is %s the threshold %g; no surface", where, threshold)
        return empty

    offset = 0.0
    if close_boundary:
        grid = close_boundary_pad_torch(grid.contiguous(), threshold)
        offset = 1.0
    grid = grid.contiguous()
    r0, r1, r2 = grid.shape
    # 1. the case of every cube; the sample grid is extended by one copy of its last layer on each
    # high side, so that every sample is the lowest corner of a cube (the extension's cubes hold the
    # grid's last edges; edges into the copy never cross)
    ext = grid.new_empty((r0 + 1, r1 + 1, r2 + 1), dtype=torch.uint8)
    ext[:r0, :r1, :r2] = grid > _side_threshold(threshold)
    ext[r0, :r1, :r2] = ext[r0 - 1, :r1, :r2]
    ext[:, r1, :r2] = ext[:, r1 - 1, :r2]
    ext[:, :, r2] = ext[:, :, r2 - 1]
    # corner n = (di, dj, dk) is bit 4 di + 2 dj + dk: combined one axis at a time
    case = ext[:, :, :-1] | (ext[:, :, 1:] << 1)
    del ext
    case = case[:, :-1] | (case[:, 1:] << 2)
    case = (case[:-1] | (case[1:] << 4)).view(-1)  # [R0 * R1 * R2], cube = its lowest sample
    # neither all in nor all out (uint8 wraps: 255 + 1 = 0); [M] sample indices, sorted
    active = torch.nonzero((case + 1) > 1).squeeze(1)
    cases = case[active].long()
    del case

    # 2. the crossed edges that start at each active cube's lowest sample (bit a: along axis a) and
    # their vertex ids: an exclusive scan over the active cubes (vertices by sample, then axis)
    edge_bits_np, rank_np = _edge_bit_tables()
    cube_bits = torch.from_numpy(edge_bits_np).to(device)[cases]  # [M]
    rank_lut = torch.from_numpy(rank_np).to(device)  # [8, 3]: vertices of lower axes at the sample
    counts = rank_lut[cube_bits, 2] + (cube_bits >> 2)
    base = torch.cumsum(counts, 0)
    num_vertices = int(base[-1])
    base -= counts

    # 3. triangles of the active cubes inside the grid (not the extension's)
    tri_count_np, tri_edges_np = table_arrays()
    lower_np, axis_np = edge_geometry()
    strides = np.array([r1 * r2, r2, 1], np.int64)
    edge_offset = torch.from_numpy(lower_np @ strides).to(device)  # [12] linear offset of the lower sample
    edge_axis = torch.from_numpy(axis_np).to(device)
    ai = torch.div(active, r1 * r2, rounding_mode="floor")
    aj = torch.div(active, r2, rounding_mode="floor") % r1
    ak = active % r2
    inner = (ai < r0 - 1) & (aj < r1 - 1) & (ak < r2 - 1)
    ntri = torch.from_numpy(tri_count_np).to(device)[cases] * inner
    num_faces = int(ntri.sum())
    if num_faces == 0:
        return empty
    cube_of_tri = torch.repeat_interleave(ntri, output_size=num_faces)  # [F] index into active
    first = torch.cumsum(ntri, 0) - ntri
    local = torch.arange(num_faces, device=device) - first[cube_of_tri]
    del first, ntri, inner
    edges = torch.from_numpy(tri_edges_np).to(device)[cases[cube_of_tri], local]  # [F, 3] edge ids
    del local
    # the lower sample of each corner's edge is an active cube's lowest sample: its rank by search
    owner = torch.searchsorted(active, active[cube_of_tri][:, None] + edge_offset[edges])  # [F, 3]
    del cube_of_tri
    faces = base[owner] + rank_lut[cube_bits[owner], edge_axis[edges]]
    del owner, edges

    # 4. vertices: scikit-image's interpolation along each crossed edge, in float64
    flat = grid.view(-1)
    coords = torch.empty((num_vertices, 3), dtype=torch.float32, device=device)
    for a in range(3):
        on = torch.nonzero((cube_bits >> a) & 1).squeeze(1)
        s = active[on]
        lo = flat[s].double() - threshold
        hi = flat[s + int(strides[a])].double() - threshold
        w_lo = 1.0 / (_SKIMAGE_EPS + lo.abs())
        w_hi = 1.0 / (_SKIMAGE_EPS + hi.abs())
        index = torch.stack([ai[on], aj[on], ak[on]], dim=1).double()
        index[:, a] += w_hi / (w_lo + w_hi)
        coords[base[on] + rank_lut[cube_bits[on], a]] = index.float()
    del base, cube_bits, active, ai, aj, ak

    spacing_t = torch.from_numpy(spacing_np).to(device)
    origin_t = torch.from_numpy(origin_np).to(device)
    world = (coords.double() - offset) * spacing_t + origin_t
    # float32 rounding of the world positions: at most half an ulp, <= |x| 2^-24, per coordinate
    world_error = float(world.abs().max()) * 2.0**-24
    mesh = TensorMesh(world.float(), faces)
    logger.debug(
        "marching cubes (torch, %s): grid %s -> %d vertices, %d faces",
        device, tuple(grid.shape), num_vertices, num_faces,
    )  # fmt: skip
    return mesh, TensorGridVertices(coords, spacing_np, world_error)
