"""Marching cubes in PyTorch, on the device of the density grid (the GPU path of the mesh stage).

A vectorised classic marching cubes with the output contract of
:func:`~microdreamer.mesh.marching.marching_cubes`: one vertex per grid edge the surface crosses
(shared by the faces around it), faces wound outward, ``close_boundary`` by the same pad, world
coordinates ``origin + spacing * index``. Its triangulation is scikit-image's ``method="lorensen"``
(:mod:`~microdreamer.mesh.mc_table`), its vertex placement and inside/outside decision are
scikit-image's, evaluated in the same float64 arithmetic, so the mesh equals scikit-image's Lorensen
mesh bit for bit up to the numbering of the vertices (faces come in the same order).

Steps, all tensor operations on the grid's device (no Python loop over cells):

1. ``inside = values > threshold`` (decided in float64 as scikit-image decides it); per cube the 8-bit
   case from its corners; the active cubes (neither all in nor all out) by ``nonzero``.
2. Per sample, a 3-bit mask of which of its three forward edges the surface crosses; an exclusive
   scan of the masks' popcounts gives every crossed edge its vertex id (sample-major, then axis).
3. Per active cube, its triangles from the table; each triangle corner's edge gives the vertex id by
   a gather from the scan.
4. Per crossed edge, the vertex by scikit-image's interpolation between the edge's two samples.

Memory for an R^3 grid: besides the input (and its padded copy with ``close_boundary``), three uint8
and one int32 tensor of R^3, plus O(V + F) for the mesh (~2.3 GB at 512^3 with the pad).
"""

from __future__ import annotations

import logging
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


def _popcount3(bits: torch.Tensor) -> torch.Tensor:
    """Set bits of a uint8 tensor whose values are < 8 (uint8)."""
    return (bits & 1) + ((bits >> 1) & 1) + (bits >> 2)


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
    if not bool(torch.isfinite(grid).all()):
        raise ValueError("values contains NaN or infinite samples; the density field is broken")
    origin_np = _host_vector(origin, "origin").reshape(-1)
    if origin_np.shape != (3,):
        raise ValueError(f"origin must have 3 elements, got shape {origin_np.shape}")
    spacing_np = np.broadcast_to(_host_vector(spacing, "spacing"), (3,)).copy()
    if not (spacing_np > 0).all():
        raise ValueError(f"spacing must be positive, got {spacing_np.tolist()}")

    threshold = float(threshold)
    # the same test as the scikit-image path (float32), so both paths agree on "no surface"
    n_inside = int(torch.count_nonzero(grid > float(np.float32(threshold))))
    if n_inside == 0 or n_inside == grid.numel():
        where = "below or at" if n_inside == 0 else "above"
        logger.info("marching cubes: every sample is %s the threshold %g; no surface", where, threshold)
        return empty

    offset = 0.0
    if close_boundary:
        grid = close_boundary_pad_torch(grid.contiguous(), threshold)
        offset = 1.0
    grid = grid.contiguous()
    r0, r1, r2 = grid.shape
    inside = (grid > _side_threshold(threshold)).to(torch.uint8)

    # 1. the case of every cube, the active cubes
    c0, c1, c2 = r0 - 1, r1 - 1, r2 - 1
    case = torch.zeros((c0, c1, c2), dtype=torch.uint8, device=device)
    for n in range(8):
        di, dj, dk = n >> 2 & 1, n >> 1 & 1, n & 1
        case |= inside[di : di + c0, dj : dj + c1, dk : dk + c2] << n
    case = case.view(-1)
    active = torch.nonzero((case != 0) & (case != 255)).squeeze(1)  # [M] int64, C order
    cases = case[active].long()
    del case

    # 2. crossed edges per sample (bit a: the edge to the next sample along axis a), vertex ids
    bits = torch.zeros((r0, r1, r2), dtype=torch.uint8, device=device)
    bits[:-1] |= inside[:-1] ^ inside[1:]
    bits[:, :-1] |= (inside[:, :-1] ^ inside[:, 1:]) << 1
    bits[:, :, :-1] |= (inside[:, :, :-1] ^ inside[:, :, 1:]) << 2
    del inside
    bits = bits.view(-1)
    counts = _popcount3(bits)
    base = torch.cumsum(counts, 0, dtype=torch.int32)
    num_vertices = int(base[-1])
    base -= counts  # exclusive scan: the id of the sample's first vertex
    del counts
    # rank of a sample's vertex among its own: the set bits below its axis
    b = torch.arange(8, device=device)
    rank_lut = torch.stack([torch.zeros_like(b), b & 1, (b & 1) + (b >> 1 & 1)], dim=1)  # [8, 3]

    # 3. triangles of the active cubes
    tri_count_np, tri_edges_np = table_arrays()
    tri_count = torch.from_numpy(tri_count_np).to(device)
    tri_edges = torch.from_numpy(tri_edges_np).to(device)
    lower_np, axis_np = edge_geometry()
    strides = np.array([r1 * r2, r2, 1], np.int64)
    edge_offset = torch.from_numpy(lower_np @ strides).to(device)  # [12] linear offset of the lower sample
    edge_axis = torch.from_numpy(axis_np).to(device)

    ntri = tri_count[cases]
    num_faces = int(ntri.sum())
    if num_faces == 0:
        return empty
    cube_of_tri = torch.repeat_interleave(ntri, output_size=num_faces)  # [F] index into active
    first = torch.cumsum(ntri, 0) - ntri
    local = torch.arange(num_faces, device=device) - first[cube_of_tri]
    del first, ntri
    edges = tri_edges[cases[cube_of_tri], local]  # [F, 3] edge ids
    del local
    cube = active[cube_of_tri]
    del cube_of_tri
    ci = torch.div(cube, c1 * c2, rounding_mode="floor")
    cj = torch.div(cube, c2, rounding_mode="floor") % c1
    ck = cube % c2
    sample = (ci * r1 + cj) * r2 + ck  # [F] lowest sample of the triangle's cube
    del cube, ci, cj, ck
    p = sample[:, None] + edge_offset[edges]  # [F, 3] lower sample of each corner's edge
    faces = base[p].long() + rank_lut[bits[p].long(), edge_axis[edges]]
    del p, edges, sample

    # 4. vertices: scikit-image's interpolation along each crossed edge, in float64
    owners = torch.nonzero(bits).squeeze(1)  # samples with a crossed forward edge, C order
    owner_bits = bits[owners]
    coords = torch.empty((num_vertices, 3), dtype=torch.float32, device=device)
    for a in range(3):
        on = ((owner_bits >> a) & 1).bool()
        s = owners[on]
        ids = base[s].long() + rank_lut[owner_bits[on].long(), a]
        lo = grid.view(-1)[s].double() - threshold
        hi = grid.view(-1)[s + int(strides[a])].double() - threshold
        w_lo = 1.0 / (_SKIMAGE_EPS + lo.abs())
        w_hi = 1.0 / (_SKIMAGE_EPS + hi.abs())
        index = torch.stack(
            [
                torch.div(s, r1 * r2, rounding_mode="floor"),
                torch.div(s, r2, rounding_mode="floor") % r1,
                s % r2,
            ],
            dim=1,
        ).double()
        index[:, a] += w_hi / (w_lo + w_hi)
        coords[ids] = index.float()
    del base, bits, owners, owner_bits

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
