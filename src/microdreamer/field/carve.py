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
    """Each Gaussian's projection onto each of D images (:func:`footprints`).

    Attributes:
        precision: [D, N, 3] (a, b, c) of the inverse 2D covariance, in squared pixels.
        offset: [D, N, 2] the box's first pixel minus the projected centre, in pixels.
        first: [D, N, 2] int64 the box's first pixel (u, v).
        extent: [D, N, 2] int64 the box's pixels along u and v (0: the Gaussian adds nothing to this image).
        opacity: [N] the opacity, at most 1.
    """

    precision: torch.Tensor
    offset: torch.Tensor
    first: torch.Tensor
    extent: torch.Tensor
    opacity: torch.Tensor


def _marginal_inputs(
    prepared: PreparedGaussians,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """What every direction's footprints start from, float64: the covariances [9, N] (row-major 3x3 in
    each column), the centres [3, N], the opacities [N] (at most 1) and the largest q where alpha reaches
    1/255 [N]."""
    rs = torch.linalg.inv(prepared.transforms.double())  # M^-1 = R S
    sigma = (rs @ rs.transpose(1, 2)).reshape(-1, 9).T.contiguous()  # R S S R^T
    opac = prepared.opacities.double().clamp(max=1.0)
    # a_i >= 1/255 needs q <= 2 ln(255 o_i)
    q_max = 2.0 * torch.log(opac / MIN_ALPHA).clamp_min(0.0)
    return sigma, prepared.means.double().T.contiguous(), opac, q_max


def _footprint(
    inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
    basis: torch.Tensor,
    lo: tuple[float, float],
    size: tuple[int, int],
    h: float,
    dilation: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One direction's footprints (:func:`footprints`) from :func:`_marginal_inputs`, a row per component:
    precision [3, N] and offset [2, N] float64, first and extent [2, N] int64."""
    sigma, means, _, q_max = inputs
    e = basis.to(device=means.device, dtype=torch.float64)
    # the plane's marginal e_a Sigma e_b^T for (a, b) = (0, 0), (0, 1), (1, 1), plus the low-pass filter
    weights = torch.stack([torch.outer(e[0], e[0]), torch.outer(e[0], e[1]), torch.outer(e[1], e[1])])
    cov2 = weights.reshape(3, 9) @ sigma
    cu = cov2[0] + dilation * h * h
    cuv = cov2[1]
    cv = cov2[2] + dilation * h * h
    det = cu * cv - cuv**2
    # precision (a, b, c) of [[a, b], [b, c]] = cov2^-1 in squared pixels; det > 0 when dilation > 0 or
    # the Gaussian is not flat
    precision = torch.stack([cv, -cuv, cu]).div_(det).mul_(h * h)
    mu = e @ means
    half = torch.stack([cu, cv]).mul_(q_max).sqrt_()  # the box around that ellipse
    lo_t = torch.tensor(lo, dtype=torch.float64, device=mu.device)[:, None]
    last_px = torch.tensor([size[0] - 1, size[1] - 1], dtype=torch.float64, device=mu.device)[:, None]
    low, high = mu - half, mu + half
    first = torch.minimum((low - lo_t).div_(h).sub_(1e-9).ceil_().clamp_(min=0.0), last_px)
    last = torch.minimum((high - lo_t).div_(h).add_(1e-9).floor_(), last_px).clamp_(min=-1.0)
    outside = (high < lo_t - h) | (low > lo_t + last_px * h + h) | ~torch.isfinite(half)
    empty = outside.any(0) | (last < first).any(0)
    extent = torch.where(empty, 0.0, last - first + 1.0).long()
    # each centre in pixels from its box's first pixel: (lo + first h - mu) / h, a small number
    offset = (first * h).add_(lo_t).sub_(mu).div_(h)
    return precision, offset, first.long(), extent


def footprints(
    prepared: PreparedGaussians,
    bases: list[torch.Tensor],
    windows: list[tuple[tuple[float, float], tuple[int, int]]],
    h: float,
    dilation: float = DILATION,
    dtype: torch.dtype = torch.float64,
) -> Footprints:
    """Each Gaussian's marginal on the plane of ``bases[k]`` as pixels of the image ``windows[k] = (lo, size)``
    of spacing ``h`` (see :func:`projected_alpha`), for D directions: computed in float64, the precision,
    offsets and opacity rounded to ``dtype``. The box holds every pixel where the Gaussian's alpha can reach
    1/255."""
    inputs = _marginal_inputs(prepared)
    parts = [
        _footprint(inputs, b, lo, size, h, dilation) for b, (lo, size) in zip(bases, windows, strict=True)
    ]
    precision, offset, first, extent = (torch.stack(x).transpose(1, 2) for x in zip(*parts, strict=True))
    return Footprints(precision.to(dtype), offset.to(dtype), first, extent, inputs[2].to(dtype))


def _block_sides(largest: int, exact: int = 8, growth: float = 1.2) -> torch.Tensor:
    """[S] int64 increasing block sides up to at least ``largest``: every side up to ``exact``, then
    growing by about ``growth`` (a box side is padded to the next block side, by less than that factor)."""
    sides = list(range(1, exact + 1))
    while sides[-1] < largest:
        sides.append(max(sides[-1] + 1, int(sides[-1] * growth)))
    return torch.tensor(sides)


def _log_transmittance(
    prepared: PreparedGaussians,
    bases: list[torch.Tensor],
    windows: list[tuple[tuple[float, float], tuple[int, int]]],
    h: float,
    dilation: float,
    max_pairs: int,
    dtype: torch.dtype,
) -> tuple[torch.Tensor, tuple[int, int]]:
    """sum_i log(1 - a_i) at every pixel of the D images (:func:`projected_alphas`' PyTorch path), in
    ``dtype`` terms and sums.

    Each direction's nonempty footprints are listed, the (direction, Gaussian) pairs of every direction
    are grouped by box size, and each group is evaluated as dense [n, Bu, Bv] blocks (each box padded to
    its group's block, the padding's terms exactly 0), ``max_pairs`` block pixels at a time. A term is

        -0.5 q = (a' du) du + (b' du) dv + (c' dv) dv,   a' = -a / 2, b' = -b, c' = -c / 2,

    bit for bit -0.5 (((a du) du + ((2 b) du) dv) + (c dv) dv), the CUDA kernel's order (scaling by a
    power of two commutes with rounding, away from subnormal numbers, where q rounds to 0 either way); then
    a = min(0.999, o exp(-0.5 q)), kept when a >= 1/255, added as log1p(-a).

    Returns:
        The sums [D * U' * V'] on a canvas of (U', V') pixels per direction, at least the largest window
        (image k's pixel (u, v) at ``(k U' + u) V' + v``), and (U', V').
    """
    device = prepared.means.device
    u_max = max(int(size[0]) for _, size in windows)
    v_max = max(int(size[1]) for _, size in windows)
    inputs = _marginal_inputs(prepared)
    columns = []  # per direction: (k, fu, fv, eu, ev) int64, (a', b', c', ou, ov, o) in dtype, of its boxes
    for k, (basis, (lo, size)) in enumerate(zip(bases, windows, strict=True)):
        precision, offset, first, extent = _footprint(inputs, basis, lo, size, h, dilation)
        keep = torch.nonzero(extent[0]).flatten()
        pa, pb, pc, ou, ov = torch.cat([precision, offset]).index_select(1, keep).to(dtype)
        fu, fv, eu, ev = torch.cat([first, extent]).index_select(1, keep)
        o = inputs[2].index_select(0, keep).to(dtype)
        columns.append((torch.full_like(keep, k), fu, fv, eu, ev, -0.5 * pa, -pb, -0.5 * pc, ou, ov, o))
    k, fu, fv, eu, ev, a_, b_, c_, ou, ov, opacity = (torch.cat(c) for c in zip(*columns, strict=True))
    if k.numel() == 0:
        return torch.zeros(len(bases) * u_max * v_max, dtype=dtype, device=device), (u_max, v_max)
    sides = _block_sides(int(torch.maximum(eu.max(), ev.max()))).to(device)
    # each box side's block side and its index: the first block side at least as long
    level_of = torch.searchsorted(sides, torch.arange(int(sides[-1]) + 1, device=device))
    lu, lv = level_of.index_select(0, eu), level_of.index_select(0, ev)
    canvas = (max(u_max, int((fu + sides.index_select(0, lu)).max())),
              max(v_max, int((fv + sides.index_select(0, lv)).max())))  # fmt: skip
    base = (k * canvas[0] + fu) * canvas[1] + fv
    key = lu * len(sides) + lv
    key, order = torch.sort(key.to(torch.int16) if len(sides) ** 2 < 2**15 else key, stable=True)
    base, eu, ev, a_, b_, c_, ou, ov, opacity = (x.index_select(0, order)
                                                  for x in (base, eu, ev, a_, b_, c_, ou, ov, opacity))  # fmt: skip
    keys, counts = torch.unique_consecutive(key, return_counts=True)
    starts = [0, *torch.cumsum(counts, 0).tolist()]
    group_blocks = [(int(sides[x // len(sides)]), int(sides[x % len(sides)])) for x in keys.tolist()]
    # sides up to the first gap are whole boxes: no padding
    exact = int((sides == torch.arange(1, len(sides) + 1, device=device)).sum())
    log_t = torch.zeros(len(bases) * canvas[0] * canvas[1], dtype=dtype, device=device)
    index_dtype = torch.int32 if log_t.numel() < 2**31 else torch.int64
    base = base.to(index_dtype)
    steps = torch.arange(int(sides[-1]), device=device)
    steps_f = steps.to(dtype)
    largest = max(max_pairs, max(bu * bv for bu, bv in group_blocks))
    terms = torch.empty(largest, dtype=dtype, device=device)
    cells = torch.empty(largest, dtype=index_dtype, device=device)
    # a <= the float below 1/255, i.e. a < 1/255: 0
    skip = float(torch.nextafter(torch.tensor(MIN_ALPHA, dtype=dtype), torch.tensor(0.0, dtype=dtype)))
    for (bu, bv), g0, g1 in zip(group_blocks, starts[:-1], starts[1:], strict=True):
        block_cells = (steps[:bu, None] * canvas[1] + steps[:bv]).to(index_dtype)
        chunk = max(1, max_pairs // (bu * bv))
        for c0 in range(g0, g1, chunk):
            s = slice(c0, min(c0 + chunk, g1))
            n = s.stop - s.start
            du = steps_f[:bu] + ou[s, None]  # [n, bu]: float(iu) + ou
            dv = steps_f[:bv] + ov[s, None]
            qa = (a_[s, None] * du).mul_(du)
            qc = (c_[s, None] * dv).mul_(dv)
            if bu > exact:
                qa.masked_fill_(steps[:bu] >= eu[s, None], -math.inf)  # padding: exp(-inf) = 0
            if bv > exact:
                qc.masked_fill_(steps[:bv] >= ev[s, None], -math.inf)
            t = torch.mul(
                (b_[s, None] * du)[:, :, None], dv[:, None, :], out=terms[: n * bu * bv].view(n, bu, bv)
            )
            t += qa[:, :, None]
            t += qc[:, None, :]
            # -q/2 < ln(1/255) gives a < 1/255 whatever the opacity: a floor far below that changes no kept
            # term and keeps exp out of subnormal results, which are slow on CPUs
            t.clamp_(min=-30.0).exp_().mul_(opacity[s, None, None]).clamp_(max=MAX_ALPHA)
            torch.nn.functional.threshold_(t, skip, 0.0)
            at = torch.add(base[s, None, None], block_cells, out=cells[: n * bu * bv].view(n, bu, bv))
            log_t.index_add_(0, at.view(-1), t.neg_().log1p_().view(-1))
    return log_t, canvas


def projected_alpha(
    prepared: PreparedGaussians,
    basis: torch.Tensor,
    lo: tuple[float, float],
    size: tuple[int, int],
    h: float,
    dilation: float = DILATION,
    max_pairs: int = 1 << 18,
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
        max_pairs: (Gaussian, pixel) pairs evaluated at once (memory: about 16 bytes each, padding included).
        dtype: the arithmetic of each (Gaussian, pixel) term and of the sums: float64, or float32 (about
            twice as fast on a CPU; each Gaussian's projection, box and offsets are still computed in
            float64, and the terms in pixels from their box, so float32 only rounds them).

    Returns:
        [U, V] float32 alpha on the Gaussians' device.
    """
    return _torch_alphas(prepared, [basis], [(lo, size)], h, dilation, max_pairs, dtype)[0]


def _torch_alphas(prepared, bases, windows, h, dilation, max_pairs, dtype) -> list[torch.Tensor]:
    """:func:`projected_alphas`' PyTorch path: the D images, [U_k, V_k] float32 each."""
    if len(prepared) == 0:
        return [torch.zeros(int(size[0]), int(size[1]), dtype=torch.float32, device=prepared.means.device)
                for _, size in windows]  # fmt: skip
    log_t, (u_c, v_c) = _log_transmittance(prepared, bases, windows, h, dilation, max_pairs, dtype)
    alpha = (-torch.expm1(log_t.double())).float().reshape(len(windows), u_c, v_c)
    return [alpha[k, : int(size[0]), : int(size[1])].contiguous() for k, (_, size) in enumerate(windows)]


def projected_alphas(
    prepared: PreparedGaussians,
    bases: list[torch.Tensor],
    windows: list[tuple[tuple[float, float], tuple[int, int]]],
    h: float,
    dilation: float = DILATION,
    backend: str = "auto",
    max_pairs: int = 1 << 18,
) -> list[torch.Tensor]:
    """:func:`projected_alpha` of several directions, in float32 terms: per direction ``k`` the
    [U_k, V_k] image of plane ``bases[k]`` over ``windows[k] = (lo, size)``.

    ``backend``: ``"torch"`` (the pairs of every direction grouped by box size and evaluated as dense
    blocks, ``max_pairs`` at a time), ``"cuda"`` (one launch of :func:`microdreamer.kernels.carve_alpha` for
    every direction: the same float32 terms, summed in fixed point, so the result does not depend on the
    order of the GPU's atomics) or ``"auto"`` (cuda for Gaussians on a CUDA device where the kernels load).
    """
    device = prepared.means.device
    if backend == "auto":
        backend = "torch"
        if device.type == "cuda":
            from microdreamer import fallback

            backend = "cuda" if fallback.kernels_usable() else "torch"
    if backend not in ("torch", "cuda"):
        raise ValueError(f"unknown carving backend {backend!r}; use auto, torch or cuda")
    if not bases:
        return []
    if backend == "torch" or len(prepared) == 0:
        return _torch_alphas(prepared, bases, windows, h, dilation, max_pairs, torch.float32)
    if device.type != "cuda":
        raise ValueError("backend='cuda' needs the Gaussians on a CUDA device")
    from microdreamer import kernels

    u_max = max(size[0] for _, size in windows)
    v_max = max(size[1] for _, size in windows)
    fp = footprints(prepared, bases, windows, h, dilation, torch.float32)
    box = torch.cat([fp.first, fp.extent], -1).to(torch.int32).contiguous()
    sums = torch.zeros(len(bases), u_max * v_max, dtype=torch.int64, device=device)
    kernels.carve_alpha(fp.precision.contiguous(), fp.offset.contiguous(), box, fp.opacity.contiguous(), sums,
                        v_max)  # fmt: skip
    alpha = (-torch.expm1(sums.double() / 2.0**32)).float().reshape(len(bases), u_max, v_max)
    return [alpha[k, : size[0], : size[1]] for k, (_, size) in enumerate(windows)]


def _hull(
    points: torch.Tensor,
    bases: list[torch.Tensor],
    windows: list[tuple[tuple[float, float], tuple[int, int]]],
    images: list[torch.Tensor],
    h: float,
    chunk: int = 1 << 15,
) -> torch.Tensor:
    """[M] float32: the least over D directions of image k [U_k, V_k] at the projections of ``points``
    [M, 3] (float64, normalised coordinates) onto ``bases[k]``, pixel ``(p . e - lo) / h`` per row ``e`` of
    the basis, linear between pixel centres, 0 outside the image.

    The images lie side by side on one float64 canvas, each followed by a column of zeros, and
    ``grid_sample`` (bilinear, zero padding) samples all of them at once, ``chunk`` points at a time, at
    coordinates from one matrix product per chunk."""
    device = points.device
    d = len(images)
    u_c, v_c = max(x.shape[0] for x in images), max(x.shape[1] for x in images) + 1
    canvas = torch.zeros(u_c, d, v_c, dtype=torch.float64, device=device)
    for k, image in enumerate(images):
        canvas[: image.shape[0], k, : image.shape[1]] = image
    # grid_sample's (x, y) = (column, row) of the canvas, scaled to [-1, 1] (align_corners): 2 c / (size - 1) - 1
    scale = torch.tensor([2.0 / (d * v_c - 1), 2.0 / (u_c - 1)], dtype=torch.float64, device=device)
    e = torch.stack(bases).to(device=device, dtype=torch.float64).flip(1)  # [D, 2, 3] rows (e2, e1)
    lo = torch.tensor([lo for lo, _ in windows], dtype=torch.float64, device=device).flip(1)  # [D, 2]
    first = torch.zeros(d, 2, dtype=torch.float64, device=device)
    first[:, 0] = torch.arange(d, device=device) * v_c  # image k's first canvas column
    # [4, D * 2]: (x, y) of every image from homogeneous points (p, 1)
    weights = torch.cat([e * (scale / h)[:, None], ((first - lo / h) * scale - 1.0)[:, :, None]], -1)
    weights = weights.permute(2, 0, 1).reshape(4, 2 * d).contiguous()
    hull = torch.empty(points.shape[0], dtype=torch.float32, device=device)
    homogeneous = torch.ones(min(chunk, points.shape[0]), 4, dtype=torch.float64, device=device)
    for c0 in range(0, points.shape[0], chunk):
        m = min(chunk, points.shape[0] - c0)
        homogeneous[:m, :3] = points[c0 : c0 + m]
        grid = (homogeneous[:m] @ weights).view(1, m, d, 2)
        taps = torch.nn.functional.grid_sample(canvas.view(1, 1, u_c, d * v_c), grid, mode="bilinear",
                                               padding_mode="zeros", align_corners=True)  # fmt: skip
        hull[c0 : c0 + m] = taps.view(m, d).amin(1)
    return hull


def _near(inside: torch.Tensor) -> tuple[tuple[slice, slice, slice], torch.Tensor]:
    """The voxels of ``inside`` [R, R, R] bool and their 26 neighbours: the box around them (slices of
    the grid) and the mask of those voxels in it (a 3x3x3 dilation, one axis at a time)."""
    flags = inside.view(torch.uint8)  # max-reductions of bytes are vectorised, those of bools are not
    across = flags.amax(2)  # [R, R]
    hits = (across.amax(1), across.amax(0), flags.view(-1, flags.shape[2]).amax(0))
    box = []
    for axis, hit in enumerate(hits):
        hit = torch.nonzero(hit).flatten()
        box.append(slice(max(int(hit[0]) - 1, 0), min(int(hit[-1]) + 2, inside.shape[axis])))
    near = inside[tuple(box)].clone()
    for axis in range(3):
        n = near.shape[axis]
        if n > 1:
            was = near.clone()
            near.narrow(axis, 1, n - 1).logical_or_(was.narrow(axis, 0, n - 1))
            near.narrow(axis, 0, n - 1).logical_or_(was.narrow(axis, 1, n - 1))
    return tuple(box), near


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
    if not bool(inside.view(torch.uint8).max()):
        return CarveResult(values, directions, 0, 0, 0, "no voxel is above the level")
    box, near = _near(inside)
    inside_before = int(inside[box].sum())
    start = torch.tensor([x.start for x in box], device=device)
    points = grid.axis(device).double()[torch.nonzero(near) + start]  # [M, 3]
    bases = [direction_basis(d) for d in carving_directions(directions)]
    windows = [plane_window(b, r) for b in bases]
    given = 3 if axis_images is not None else 0
    images = [x.to(device) for x in (axis_images or [])] + projected_alphas(
        raw, bases[given:], windows[given:], h, dilation, backend
    )
    hull = _hull(points, bases, windows, images, h)
    carved_at = torch.minimum(values[box][near], (level / alpha_level) * hull)
    inside_after = int((carved_at > level).sum())
    if inside_after == 0:
        return CarveResult(values, directions, hull.numel(), inside_before, inside_before,
                           f"the splat's alpha never reaches {alpha_level:g} where its density is above the level")  # fmt: skip
    out = values.clone()
    out[box][near] = carved_at
    return CarveResult(out, directions, hull.numel(), inside_before, inside_after)
