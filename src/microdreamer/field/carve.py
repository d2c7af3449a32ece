"""Silhouette carving: the density field cut to the splat's own silhouettes, seen from many directions.

An iso-surface of the density is one level for the whole object, but what a viewer sees of a splat is its
alpha, gathered along each ray: where the Gaussians are large and overlapping the level's surface bulges
past the splat's alpha = 0.5 contour in some places and falls short of it in others (the iso-level in
:mod:`microdreamer.field.iso` only balances the two). Carving removes what no view supports: a point is
kept only if the splat's alpha is at least ``alpha_level`` wherever the point projects, in every one of
D directions (the visual hull of the splat's silhouettes, as space carving builds it from photographs),
and the density term keeps what silhouettes cannot see (concavities, the inside).

The splat's alpha seen along a direction ``d``, orthographically, at a point ``p`` of the plane across
``d`` is, as in :mod:`microdreamer.field.iso`,

    A_d(p) = 1 - prod_i (1 - a_i(p)),   a_i(p) = min(0.999, o_i exp(-(p - P mu_i)^T S_i^-1 (p - P mu_i) / 2)),

``P`` the projection onto the plane (orthonormal rows ``e1, e2``), ``S_i = P Sigma_i P^T + dilation h^2 I``
the Gaussian's marginal on the plane plus the 3DGS rasteriser's low-pass filter (one pixel = one grid
spacing h), terms ``a_i < 1/255`` skipped. The product does not depend on the Gaussians' order, so this is
what a 3DGS rasteriser shows through an orthographic camera, computed without rendering, the same way on
every device. :func:`projected_alpha` evaluates it on a pixel grid of spacing h; the three grid axes give
exactly :func:`microdreamer.field.iso.column_alpha`'s images (its pixels are the grid's columns).

The carved field is ``min(values, level * hull / alpha_level)`` with ``hull(x) = min_d A_d(x)``
(bilinear between pixels), so it crosses ``level`` where the density does, or where the hull crosses
``alpha_level``, whichever is further in, and stays in the density's units. It is evaluated at the voxels
above ``level`` and their 26 neighbours (the only ones marching cubes reads next to a surface); elsewhere
the field is left as it was, already below the level.

Directions: a direction and its opposite give the same silhouette, so D directions cover the half
sphere: the three grid axes, then a Fibonacci spiral over the hemisphere around +y.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from microdreamer.field.binning import chunk_bounds
from microdreamer.field.common import GridSpec, PreparedGaussians

# the 3DGS rasteriser's limits on one Gaussian's alpha at a pixel and its low-pass filter (squared pixels)
MIN_ALPHA = 1.0 / 255.0
MAX_ALPHA = 0.999
DILATION = 0.3

__all__ = [
    "CarveResult",
    "Footprints",
    "carve_field",
    "carving_directions",
    "direction_basis",
    "footprints",
    "plane_window",
    "projected_alpha",
    "projected_alphas",
]


def carving_directions(count: int) -> torch.Tensor:
    """[D, 3] float64 unit directions: the x, y and z axes, then ``count - 3`` on a Fibonacci spiral over
    the hemisphere y >= 0 (opposite directions see the same silhouette). ``count`` >= 3."""
    if count < 3:
        raise ValueError(f"carving needs at least the 3 axis directions, got {count}")
    axes = torch.eye(3, dtype=torch.float64)
    n = count - 3
    if n == 0:
        return axes
    k = torch.arange(n, dtype=torch.float64) + 0.5
    y = 1.0 - k / n  # cos of the angle to +y, evenly spread in (0, 1]: equal areas of the hemisphere
    phi = math.pi * (3.0 - math.sqrt(5.0)) * k  # the golden angle
    r = (1.0 - y * y).clamp_min(0.0).sqrt()
    spiral = torch.stack([r * torch.cos(phi), y, r * torch.sin(phi)], -1)
    return torch.cat([axes, spiral])


def direction_basis(direction: torch.Tensor) -> torch.Tensor:
    """[2, 3] float64 orthonormal rows (e1, e2) spanning the plane across ``direction`` [3]. For a grid
    axis they are the other two axes in increasing order (the layout of ``values.amax(axis)``)."""
    d = torch.nn.functional.normalize(direction.double(), dim=0)
    for axis in range(3):
        if float(d[axis].abs()) == 1.0:
            return torch.eye(3, dtype=torch.float64)[[a for a in range(3) if a != axis]]
    helper = torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64)
    if float(d[0].abs()) > 0.9:
        helper = torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64)
    e1 = torch.nn.functional.normalize(torch.linalg.cross(d, helper), dim=0)
    e2 = torch.linalg.cross(d, e1)
    return torch.stack([e1, e2])


def plane_window(basis: torch.Tensor, resolution: int) -> tuple[tuple[float, float], tuple[int, int]]:
    """The pixel grid that covers the grid cube [-1, 1]^3 projected onto ``basis``' plane, with pixels
    one grid spacing h apart and aligned with the grid's columns where the plane holds grid axes:
    ``(lo, size)``, pixel (i, j) at ``lo + (i, j) h`` in (e1, e2) coordinates."""
    h = 2.0 / (resolution - 1)
    lo, size = [], []
    for row in basis:
        reach = float(row.abs().sum())  # the cube's half-extent along this row, >= 1
        extra = max(0, math.ceil((reach - 1.0) / h - 1e-9))
        lo.append(-1.0 - extra * h)
        size.append(resolution + 2 * extra)
    return (lo[0], lo[1]), (size[0], size[1])


@dataclass
class Footprints:
    """Each Gaussian's projection onto one image (:func:`footprints`).

    Attributes:
        precision: [N, 3] (a, b, c) of the inverse 2D covariance, in squared pixels.
        offset: [N, 2] the box's first pixel minus the projected centre, in pixels.
        first: [N, 2] int64 the box's first pixel (u, v).
        extent: [N, 2] int64 the box's pixels along u and v (0: the Gaussian adds nothing to this image).
        opacity: [N] the opacity, at most 1.
    """

    precision: torch.Tensor
    offset: torch.Tensor
    first: torch.Tensor
    extent: torch.Tensor
    opacity: torch.Tensor


def footprints(
    prepared: PreparedGaussians,
    basis: torch.Tensor,
    lo: tuple[float, float],
    size: tuple[int, int],
    h: float,
    dilation: float = DILATION,
    dtype: torch.dtype = torch.float64,
) -> Footprints:
    """Each Gaussian's marginal on the plane of ``basis`` as pixels of the image ``(lo, size, h)`` (see
    :func:`projected_alpha`): computed in float64, the precision, offsets and opacity rounded to ``dtype``.
    The box holds every pixel where the Gaussian's alpha can reach 1/255."""
    u_size, v_size = int(size[0]), int(size[1])
    device = prepared.means.device
    e = basis.to(device=device, dtype=torch.float64)
    rs = torch.linalg.inv(prepared.transforms.double())  # M^-1 = R S
    rs2 = e @ rs  # [N, 2, 3]: the plane's rows of R S
    cov2 = rs2 @ rs2.transpose(1, 2) + dilation * h * h * torch.eye(2, dtype=torch.float64, device=device)
    det = cov2[:, 0, 0] * cov2[:, 1, 1] - cov2[:, 0, 1] ** 2
    # precision (a, b, c) of [[a, b], [b, c]] = cov2^-1 in squared pixels; det > 0 when dilation > 0 or
    # the Gaussian is not flat
    precision = torch.stack([cov2[:, 1, 1], -cov2[:, 0, 1], cov2[:, 0, 0]], -1) / det[:, None] * (h * h)
    mu = prepared.means.double() @ e.T
    opac = prepared.opacities.double().clamp(max=1.0)
    # a_i >= 1/255 needs q <= 2 ln(255 o_i): the box around that ellipse, in pixels
    q_max = 2.0 * torch.log(opac / MIN_ALPHA).clamp_min(0.0)
    half = (q_max[:, None] * torch.stack([cov2[:, 0, 0], cov2[:, 1, 1]], -1)).sqrt()
    lo_t = torch.tensor(lo, dtype=torch.float64, device=device)
    last_px = torch.tensor([u_size - 1, v_size - 1], device=device)
    first = torch.minimum(torch.ceil((mu - half - lo_t) / h - 1e-9).clamp_min(0), last_px).long()
    last = torch.minimum(torch.floor((mu + half - lo_t) / h + 1e-9), last_px).clamp_min(-1).long()
    hi_t = lo_t + last_px.double() * h
    outside = ((mu + half) < lo_t - h) | ((mu - half) > hi_t + h) | ~torch.isfinite(half)
    extent = torch.where(outside, torch.zeros_like(first), (last - first + 1).clamp_min(0))
    extent = torch.where(outside.any(-1, keepdim=True) | (extent == 0).any(-1, keepdim=True),
                         torch.zeros_like(extent), extent)  # fmt: skip
    # each centre in pixels from its box's first pixel: (lo + first h - mu) / h, a small number
    offset = (lo_t + first.double() * h - mu) / h
    return Footprints(precision.to(dtype), offset.to(dtype), first, extent, opac.to(dtype))


def projected_alpha(
    prepared: PreparedGaussians,
    basis: torch.Tensor,
    lo: tuple[float, float],
    size: tuple[int, int],
    h: float,
    dilation: float = DILATION,
    max_pairs: int = 1 << 22,
    dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """The splat's orthographic alpha on a pixel grid of the plane across a direction (module docstring),
    in PyTorch (any device; the CUDA kernel is :func:`projected_alphas`' other backend).

    Args:
        prepared: N Gaussians as :func:`~microdreamer.field.common.prepare_gaussians` makes them with
            ``voxel_filter=0`` (their own opacities and covariances), normalised coordinates.
        basis: [2, 3] orthonormal rows (e1, e2) of the plane.
        lo: the plane coordinates of pixel (0, 0).
        size: (U, V) pixels.
        h: the pixel spacing (normalised units); the low-pass filter adds ``dilation * h^2``.
        dilation: squared pixels added to every 2D covariance.
        max_pairs: (Gaussian, pixel) pairs evaluated at once (memory: about 80 bytes each).
        dtype: the arithmetic of each (Gaussian, pixel) term and of the sums: float64, or float32 (about
            twice as fast on a CPU; each Gaussian's projection, box and offsets are still computed in
            float64, and the terms in pixels from their box, so float32 only rounds them).

    Returns:
        [U, V] float32 alpha on the Gaussians' device.
    """
    u_size, v_size = int(size[0]), int(size[1])
    device = prepared.means.device
    if len(prepared) == 0:
        return torch.zeros(u_size, v_size, dtype=torch.float32, device=device)
    fp = footprints(prepared, basis, lo, size, h, dilation, dtype)
    pa, pb, pc = fp.precision.unbind(-1)
    counts = fp.extent.prod(-1)
    log_t = torch.zeros(u_size * v_size, dtype=dtype, device=device)
    bounds = chunk_bounds(counts, max_pairs)
    for c0, c1 in zip(bounds[:-1], bounds[1:], strict=True):
        n = counts[c0:c1]
        if int(n.sum()) == 0:
            continue
        owner = torch.repeat_interleave(torch.arange(c0, c1, device=device), n)
        local = torch.arange(owner.numel(), device=device) - torch.repeat_interleave(
            torch.cumsum(n, 0) - n, n
        )
        across = fp.extent[owner, 1]
        iu = torch.div(local, across, rounding_mode="floor")
        iv = local - iu * across
        du = iu.to(dtype) + fp.offset[owner, 0]
        dv = iv.to(dtype) + fp.offset[owner, 1]
        q = pa[owner] * du * du + 2.0 * pb[owner] * du * dv + pc[owner] * dv * dv
        a = (fp.opacity[owner] * torch.exp(-0.5 * q)).clamp_(max=MAX_ALPHA)
        a = torch.where(a >= MIN_ALPHA, a, torch.zeros_like(a))
        cell = (fp.first[owner, 0] + iu) * v_size + fp.first[owner, 1] + iv
        log_t.index_add_(0, cell, torch.log1p(-a))
    return (-torch.expm1(log_t.double())).float().reshape(u_size, v_size)


def projected_alphas(
    prepared: PreparedGaussians,
    bases: list[torch.Tensor],
    windows: list[tuple[tuple[float, float], tuple[int, int]]],
    h: float,
    dilation: float = DILATION,
    backend: str = "auto",
) -> list[torch.Tensor]:
    """:func:`projected_alpha` of several directions, in float32 terms: per direction ``k`` the
    [U_k, V_k] image of plane ``bases[k]`` over ``windows[k] = (lo, size)``.

    ``backend``: ``"torch"`` (one :func:`projected_alpha` per direction), ``"cuda"`` (one launch of
    :func:`microdreamer.kernels.carve_alpha` for every direction: the same float32 terms, summed in fixed
    point, so the result does not depend on the order of the GPU's atomics) or ``"auto"`` (cuda for
    Gaussians on a CUDA device).
    """
    device = prepared.means.device
    if backend == "auto":
        backend = "cuda" if device.type == "cuda" else "torch"
    if backend not in ("torch", "cuda"):
        raise ValueError(f"unknown carving backend {backend!r}; use auto, torch or cuda")
    if backend == "torch" or len(prepared) == 0 or not bases:
        return [projected_alpha(prepared, b, lo, size, h, dilation, dtype=torch.float32)
                for b, (lo, size) in zip(bases, windows, strict=True)]  # fmt: skip
    if device.type != "cuda":
        raise ValueError("backend='cuda' needs the Gaussians on a CUDA device")
    from microdreamer import kernels

    u_max = max(size[0] for _, size in windows)
    v_max = max(size[1] for _, size in windows)
    fps = [footprints(prepared, b, lo, size, h, dilation, torch.float32)
           for b, (lo, size) in zip(bases, windows, strict=True)]  # fmt: skip
    precision = torch.stack([f.precision for f in fps]).contiguous()
    offset = torch.stack([f.offset for f in fps]).contiguous()
    box = torch.stack([torch.cat([f.first, f.extent], -1) for f in fps]).to(torch.int32).contiguous()
    sums = torch.zeros(len(fps), u_max * v_max, dtype=torch.int64, device=device)
    kernels.carve_alpha(precision, offset, box, fps[0].opacity.contiguous(), sums, v_max)
    alpha = (-torch.expm1(sums.double() / 2.0**32)).float().reshape(len(fps), u_max, v_max)
    return [alpha[k, : size[0], : size[1]] for k, (_, size) in enumerate(windows)]


def _bilinear(image: torch.Tensor, pix: torch.Tensor) -> torch.Tensor:
    """[M] float32: ``image`` [U, V] at the fractional pixel positions ``pix`` [M, 2] (float64), linear
    between pixel centres, 0 outside the image."""
    u_size, v_size = image.shape
    padded = torch.nn.functional.pad(image, (1, 1, 1, 1))  # zero outside the image
    p = pix + 1.0
    p = torch.stack([p[:, 0].clamp(0.0, u_size + 1.0), p[:, 1].clamp(0.0, v_size + 1.0)], -1)
    i0 = p.floor().long()
    i0 = torch.stack([i0[:, 0].clamp(max=u_size), i0[:, 1].clamp(max=v_size)], -1)
    f = (p - i0.double()).float()
    w = v_size + 2
    flat = padded.reshape(-1)
    base = i0[:, 0] * w + i0[:, 1]
    a00, a01 = flat[base], flat[base + 1]
    a10, a11 = flat[base + w], flat[base + w + 1]
    top = a00 + (a01 - a00) * f[:, 1]
    bottom = a10 + (a11 - a10) * f[:, 1]
    return top + (bottom - top) * f[:, 0]


@dataclass
class CarveResult:
    """What :func:`carve_field` did.

    Attributes:
        values: [R, R, R] float32 the carved field (``values`` itself when nothing was carved).
        directions: D, the directions carved from.
        evaluated: voxels where the hull was evaluated (those above the level and their neighbours).
        inside_before: voxels above the level before carving.
        inside_after: voxels above the level after carving.
        skipped: why carving was not applied (the silhouettes are empty), or None.
    """

    values: torch.Tensor
    directions: int
    evaluated: int
    inside_before: int
    inside_after: int
    skipped: str | None = None


def carve_field(
    values: torch.Tensor,
    raw: PreparedGaussians,
    grid: GridSpec,
    level: float,
    directions: int,
    alpha_level: float = 0.5,
    dilation: float = DILATION,
    axis_images: list[torch.Tensor] | None = None,
    backend: str = "auto",
) -> CarveResult:
    """The density field carved to the splat's silhouettes from ``directions`` directions (module
    docstring): ``min(values, level * hull / alpha_level)`` at the voxels above ``level`` and their
    neighbours.

    Args:
        values: [R, R, R] the density field on ``grid`` (any device; the work runs there).
        raw: the splat's Gaussians prepared on the same grid with ``voxel_filter=0``.
        grid: the grid.
        level: the iso-level the mesh will be extracted at.
        directions: D >= 3 (:func:`carving_directions`).
        alpha_level: the alpha of the silhouettes.
        axis_images: the three grid axes' images when already made
            (:func:`microdreamer.field.iso.column_alpha` with the same ``dilation``, as the iso-level
            stage makes them); the other directions' images are computed in float32 terms by
            :func:`projected_alphas` with ``backend`` (``"auto"``: the CUDA kernel for a CUDA field).

    When no voxel above ``level`` is inside every silhouette (the splat's alpha never reaches
    ``alpha_level`` where the density is high), nothing is carved and ``skipped`` says why.
    """
    r = grid.resolution
    h = 2.0 / (r - 1)
    device = values.device
    raw = raw.to(device)
    inside = values > level
    inside_before = int(inside.sum())
    if inside_before == 0:
        return CarveResult(values, directions, 0, 0, 0, "no voxel is above the level")
    near = torch.nn.functional.max_pool3d(inside[None, None].float(), 3, stride=1, padding=1)[0, 0] > 0
    idx = torch.nonzero(near.reshape(-1)).flatten()
    axis = grid.axis(device).double()
    points = torch.stack([axis[idx // (r * r)], axis[(idx // r) % r], axis[idx % r]], -1)
    bases = [direction_basis(d) for d in carving_directions(directions)]
    windows = [plane_window(b, r) for b in bases]
    given = 3 if axis_images is not None else 0
    images = [x.to(device) for x in (axis_images or [])] + projected_alphas(
        raw, bases[given:], windows[given:], h, dilation, backend
    )
    hull = torch.ones(idx.numel(), dtype=torch.float32, device=device)
    for basis, (lo, _), image in zip(bases, windows, images, strict=True):
        pix = (points @ basis.to(device).T - torch.tensor(lo, dtype=torch.float64, device=device)) / h
        hull = torch.minimum(hull, _bilinear(image, pix))
    flat = values.reshape(-1)
    carved_at = torch.minimum(flat[idx], (level / alpha_level) * hull)
    inside_after = int((carved_at > level).sum())
    if inside_after == 0:
        return CarveResult(values, directions, idx.numel(), inside_before, inside_before,
                           f"the splat's alpha never reaches {alpha_level:g} where its density is above the level")  # fmt: skip
    out = flat.clone()
    out[idx] = carved_at
    return CarveResult(out.reshape(values.shape), directions, idx.numel(), inside_before, inside_after)
