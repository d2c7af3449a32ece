"""Vertex clustering with quadric placement, in PyTorch on any device: the fast first step of decimating
a mesh of millions of faces.

Edge collapse (fast_simplification, :func:`~microdreamer.mesh.cleanup.decimate`) costs about a second
per million faces on one CPU core however few faces are wanted. A marching-cubes surface at 512^3 has
several million, nearly all far smaller than the 50k-face output can show. :func:`cluster_vertices`
merges the vertices of each cell of a uniform grid (Rossignac and Borrel's clustering), placing each
merged vertex where it best fits the planes of the faces around it (Lindstrom's out-of-core
simplification: the minimiser of their summed, area-weighted squared distances, regularised towards
the cells' mean vertex and kept inside the bounding box of the merged vertices). Faces whose corners
share a cell vanish; faces that become copies of one another are kept once. No edge is left open, but
where the surface crosses a cell twice the two sheets meet: a few edges (0.6 % on a sphere clustered
to 8k faces) then have three or four faces. Edge collapse then takes the few hundred thousand faces
left to the target.

Sums run in 64-bit fixed point (integer adds are exact in any order), so the result is the same on
every run; the 3 x 3 solves are elementwise arithmetic (the adjugate), so devices differ only in the
last bits of their floating-point operations.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from microdreamer.mesh.types import Mesh

_FIXED = 2.0**40  # fixed-point scale of the sums: coordinates are first mapped into [0, 1]^3
_REG = 1e-3  # the pull towards the mean vertex, relative to the mean eigenvalue of a cell's quadric


def _fixed_sum(index: torch.Tensor, values: torch.Tensor, n: int) -> torch.Tensor:
    """[n, D] float64 sums of ``values`` [N, D] (|values| well under 2^22) over ``index`` [N], exact in
    fixed point: the same in any summation order."""
    q = torch.round(values * _FIXED).to(torch.int64)
    out = torch.zeros(n, values.shape[1], dtype=torch.int64, device=values.device)
    out.index_add_(0, index, q)
    return out.to(torch.float64) / _FIXED


def _solve_spd3(m: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """[N, 3] solutions of the symmetric positive definite systems m [N, 3, 3] x = r [N, 3], by the
    adjugate: elementwise arithmetic only, so the same on every device to the last bits of its FMAs."""
    a, b, c = m[:, 0, 0], m[:, 0, 1], m[:, 0, 2]
    d, e, f = m[:, 1, 1], m[:, 1, 2], m[:, 2, 2]
    c00, c01, c02 = d * f - e * e, c * e - b * f, b * e - c * d
    c11, c12, c22 = a * f - c * c, b * c - a * e, a * d - b * b
    det = a * c00 + b * c01 + c * c02
    x = torch.stack(
        [
            c00 * r[:, 0] + c01 * r[:, 1] + c02 * r[:, 2],
            c01 * r[:, 0] + c11 * r[:, 1] + c12 * r[:, 2],
            c02 * r[:, 0] + c12 * r[:, 1] + c22 * r[:, 2],
        ],
        1,
    )
    return x / det[:, None]


def cluster_vertices(
    vertices: torch.Tensor, faces: torch.Tensor, cell: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Merge the vertices of each ``cell``-sized cube of a grid anchored at the vertices' minimum corner.

    Args:
        vertices: [V, 3] float; faces: [F, 3] int64 (on the same device).
        cell: the cube's side, in the vertices' units (> 0).

    Returns:
        (vertices [V', 3] float64, faces [F', 3] int64, cluster [V] int64: the new vertex of each input
        vertex). A new vertex is numbered by the first input vertex of its cell; the faces keep their
        order and winding, each rotated so that its smallest index comes first, without faces of fewer
        than three distinct vertices or repeats of an earlier face.
    """
    if not cell > 0:
        raise ValueError(f"cell = {cell} must be positive")
    device = vertices.device
    v = vertices.to(torch.float64)
    lo = v.amin(0)
    span = float((v.amax(0) - lo).max().clamp_min(1e-30))
    p = (v - lo) / span  # in [0, 1]^3: the fixed-point range
    h = cell / span
    ijk = torch.floor(p / h).long()
    n_axis = int(ijk.max()) + 1
    key = (ijk[:, 0] * n_axis + ijk[:, 1]) * n_axis + ijk[:, 2]
    uniq, inverse = torch.unique(key, return_inverse=True)
    n = uniq.numel()
    # number the clusters by their first vertex (the order of the input)
    first = torch.full((n,), v.shape[0], dtype=torch.int64, device=device)
    first.scatter_reduce_(0, inverse, torch.arange(v.shape[0], device=device), reduce="amin")
    rank = torch.empty(n, dtype=torch.int64, device=device)
    rank[torch.argsort(first)] = torch.arange(n, device=device)
    cluster = rank[inverse]

    # area-weighted plane quadrics of the faces, summed into the clusters of their corners
    tri = p[faces]
    cross = torch.linalg.cross(tri[:, 1] - tri[:, 0], tri[:, 2] - tri[:, 0])
    double_area = cross.norm(dim=-1)
    nrm = cross / double_area.clamp_min(1e-300)[:, None]
    d = -(nrm * tri[:, 0]).sum(-1)
    w = 0.5 * double_area
    i, j = torch.triu_indices(3, 3, device=device)
    parts = torch.cat([w[:, None] * nrm[:, i] * nrm[:, j], (w * d)[:, None] * nrm], 1)  # [F, 6 + 3]
    corner = cluster[faces].reshape(-1)
    quad = _fixed_sum(corner, parts.repeat_interleave(3, 0), n)
    mean = _fixed_sum(cluster, torch.cat([p, torch.ones_like(p[:, :1])], 1), n)
    x0 = mean[:, :3] / mean[:, 3:]
    a = torch.zeros(n, 3, 3, dtype=torch.float64, device=device)
    a[:, i, j] = quad[:, :6]
    a[:, j, i] = quad[:, :6]
    b = quad[:, 6:]
    trace = a.diagonal(dim1=1, dim2=2).sum(-1)
    lam = (_REG * trace / 3).clamp_min(1e-30)
    x = _solve_spd3(
        a + lam[:, None, None] * torch.eye(3, dtype=torch.float64, device=device), lam[:, None] * x0 - b
    )
    big = torch.finfo(torch.float64).max
    box_lo = torch.full((n, 3), big, dtype=torch.float64, device=device)
    box_hi = torch.full((n, 3), -big, dtype=torch.float64, device=device)
    idx = cluster[:, None].expand(-1, 3)
    box_lo.scatter_reduce_(0, idx, p, reduce="amin")
    box_hi.scatter_reduce_(0, idx, p, reduce="amax")
    x = torch.where(torch.isfinite(x), x, x0)
    x = torch.minimum(torch.maximum(x, box_lo), box_hi)

    f = cluster[faces]
    keep = (f[:, 0] != f[:, 1]) & (f[:, 1] != f[:, 2]) & (f[:, 2] != f[:, 0])
    f = f[keep]
    # rotate each face so that its smallest index leads (winding kept), then drop later repeats
    shift = f.argmin(1)
    cols = (shift[:, None] + torch.arange(3, device=device)) % 3
    f = f.gather(1, cols)
    if f.shape[0]:
        if n < 2**21:  # three indices fit one int64 key
            _, inv = torch.unique((f[:, 0] * n + f[:, 1]) * n + f[:, 2], return_inverse=True)
        else:
            _, inv = torch.unique(f, dim=0, return_inverse=True)
        firsts = torch.full((int(inv.max()) + 1,), f.shape[0], dtype=torch.int64, device=device)
        firsts.scatter_reduce_(0, inv, torch.arange(f.shape[0], device=device), reduce="amin")
        f = f[torch.sort(firsts).values]
    return x * span + lo, f, cluster


def cluster_decimate(mesh: Mesh, target_faces: int, device: str | torch.device = "cpu") -> Mesh:
    """``mesh`` clustered (:func:`cluster_vertices`, on ``device``) to about ``target_faces`` faces: the
    cell side h from the surface's area A (a surface crosses about 1.5 A / h^2 cells, two triangles
    each: 3 A / h^2 faces), corrected once by the count it gave when that is off by over 25 %. Vertices
    that no face uses are dropped; vertex colours (in [0, 1]) are averaged over each cluster."""
    if target_faces < 1:
        raise ValueError(f"target_faces must be >= 1, got {target_faces}")
    device = torch.device(device)
    verts = torch.as_tensor(np.asarray(mesh.vertices), device=device)
    faces = torch.as_tensor(np.asarray(mesh.faces, np.int64), device=device)
    tri = verts.double()[faces]
    area = float(0.5 * torch.linalg.cross(tri[:, 1] - tri[:, 0], tri[:, 2] - tri[:, 0]).norm(dim=-1).sum())
    cell = math.sqrt(3.0 * max(area, 1e-30) / target_faces)
    new_v, new_f, cluster = cluster_vertices(verts, faces, cell)
    if new_f.shape[0] and abs(new_f.shape[0] / target_faces - 1) > 0.25:
        cell *= math.sqrt(new_f.shape[0] / target_faces)
        new_v, new_f, cluster = cluster_vertices(verts, faces, cell)
    colors = None
    if mesh.vertex_colors is not None:
        c = torch.as_tensor(np.asarray(mesh.vertex_colors, np.float64), device=device)
        sums = _fixed_sum(cluster, torch.cat([c, torch.ones_like(c[:, :1])], 1), new_v.shape[0])
        colors = (sums[:, :-1] / sums[:, -1:].clamp_min(1)).cpu().numpy().astype(np.float32)
    out = Mesh(new_v.cpu().numpy().astype(np.float32), new_f.cpu().numpy(), colors)
    return out.subset_faces(slice(None)) if out.num_faces else out
