"""Pure-PyTorch Gaussian rasteriser: the CPU path and the reference for the gsplat backend.

It follows gsplat's default ("classic", pinhole, 3DGS) rules so that the two agree to float32
rounding:

* **Projection** (EWA): camera-space mean ``m = R x + t``; camera-space covariance
  ``R Sigma R^T``; pinhole Jacobian ``J = [[fx/z, 0, -fx tx/z^2], [0, fy/z, -fy ty/z^2]]`` where
  ``tx/z``, ``ty/z`` are clamped to 1.3 times the image's half-extent (gsplat's ``lim_*``);
  ``Sigma2D = J Sigma_c J^T + 0.3 I`` (the low-pass dilation ``eps2d``); pixel mean
  ``(fx x/z + cx, fy y/z + cy)`` with pixel centres at ``+0.5``.
* **Culling**: depth outside ``[near, far]``, ``det(Sigma2D) <= 0``, opacity below 1/255, or a
  bounding box entirely off screen. The box is gsplat's opacity-aware one: half-widths
  ``ceil(e sqrt(Sigma2D_xx))``, ``ceil(e sqrt(Sigma2D_yy))`` with ``e = min(3.33, sqrt(2 ln(255 o)))``.
  Outside it every pixel's alpha is below 1/255 (so skipped anyway), which makes the tiling
  exact: which tiles a Gaussian touches never changes the image.
* **Compositing**, per pixel, front to back in increasing depth (ties by index):
  ``alpha = min(0.999, o exp(-0.5 d^T Sigma2D^-1 d))``; a Gaussian with ``alpha < 1/255`` is
  skipped; the pixel stops *before* the Gaussian that would take the transmittance ``T`` to
  ``<= 1e-4``. ``colour = sum w_i c_i + T bg`` with ``w_i = alpha_i T_i``; ``alpha_out = 1 - T``.
* **Depth** is gsplat's "ED": ``sum w_i z_i / max(alpha_out, 1e-10)`` (camera z, expected depth
  normalised by alpha; 0 where nothing is drawn).

Memory stays bounded: pixels are processed in square tiles (8 x 8 by default), each with its own
depth-sorted list of Gaussians, a chunk of tiles at a time (padded to the chunk's longest list); the
compositing has its own backward pass, which recomputes each chunk instead of storing it.

Work skipped without changing the image:

* A tile's list holds only the Gaussians whose alpha can reach 1/255 at one of its pixel centres
  (the smallest Mahalanobis term over the tile's rectangle, with a margin far above float rounding);
  the others are skipped at every pixel anyway (23 % of the bounding boxes' pairs on the ghost
  sample's bake views). The lists come from one stable sort of (tile, Gaussian) pairs made in depth
  order (:func:`tile_intersections`).
* Without gradients, each tile's list is composited in depth slices of ``depth_slice`` Gaussians that
  carry the transmittance from one slice to the next (the same running product, so the same ``T``
  and the same stops), and a tile leaves once all its pixels have stopped: what is behind an opaque
  surface is never composited.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from microdreamer import fixed_order
from microdreamer.cpu_pool import cpu_workers, map_single_threaded

ALPHA_THRESHOLD = 1.0 / 255.0  # alphas below this are skipped
MAX_ALPHA = 0.999  # alphas are clamped to this
T_THRESHOLD = 1e-4  # a pixel stops before the Gaussian that takes T to this or below
SIGMA_MAX = 30.0  # Mahalanobis terms are capped here before exp (e^-30 is far below 1/255)
EXTEND_MAX = 3.33  # cap on the bounding-box half-width in standard deviations
TILE_SIZE = 8  # smaller tiles waste fewer pixel-Gaussian pairs on the CPU
DEPTH_SLICE = 32  # Gaussians per tile composited at a time without gradients (see rasterize)
CHUNK_ELEMS = 1 << 20  # tiles x pixels x Gaussians per chunk with gradients (bounds peak memory)
SLICE_CHUNK_ELEMS = 1 << 17  # the same without gradients: 1.5x faster than 2^20 on the CPU (cache)
REACH_MARGIN = 1e-2  # slack of the tile test on the exponent: float32 errors are below 1e-4 there


@dataclass
class Projection:
    """Gaussians projected into C cameras.

    Attributes:
        means2d: [C, N, 2] pixel coordinates of the centres (differentiable).
        conics: [C, N, 3] inverse 2D covariance (xx, xy, yy) (differentiable).
        depths: [C, N] camera-space z (differentiable).
        radii: [C, N, 2] int32 bounding-box half-widths in pixels (x, y); 0 where culled.
    """

    means2d: torch.Tensor
    conics: torch.Tensor
    depths: torch.Tensor
    radii: torch.Tensor


def project(
    means: torch.Tensor,
    covars: torch.Tensor,
    opacities: torch.Tensor,
    viewmats: torch.Tensor,
    Ks: torch.Tensor,
    width: int,
    height: int,
    near: float = 0.01,
    far: float = 1e10,
    eps2d: float = 0.3,
) -> Projection:
    """EWA-project N Gaussians into C pinhole cameras (gsplat's fully fused projection, in torch).

    Args:
        means: [N, 3] world-space centres.
        covars: [N, 3, 3] world-space covariances.
        opacities: [N] in (0, 1); used only for culling and the bounding box.
        viewmats: [C, 4, 4] world-to-camera, OpenCV axes.
        Ks: [C, 3, 3] pixel intrinsics.
        width, height: image size W x H in pixels.
        near, far: depth range kept.
        eps2d: added to the diagonal of every 2D covariance.
    """
    R = viewmats[:, :3, :3]
    t = viewmats[:, :3, 3]
    # products summed in a fixed order (not the BLAS): a camera's projection does not depend on the
    # other cameras in the call, so groups of cameras on threads give the same bits (see fixed_order)
    mc = fixed_order.transform_points(R, t, means)  # [C, N, 3]
    r = R[:, None]  # [C, 1, 3, 3]
    cov_c = fixed_order.matmul(fixed_order.matmul(r, covars[None]), r.transpose(-1, -2))  # [C, N, 3, 3]

    x, y, z = mc.unbind(-1)
    depth_ok = (z >= near) & (z <= far)
    # keep every branch finite (masked entries still take part in the backward pass)
    zs = torch.where(depth_ok, z, torch.ones_like(z))
    fx, fy = Ks[:, 0, 0][:, None], Ks[:, 1, 1][:, None]
    cx, cy = Ks[:, 0, 2][:, None], Ks[:, 1, 2][:, None]
    tan_fovx, tan_fovy = 0.5 * width / fx, 0.5 * height / fy
    lim_x_pos, lim_x_neg = (width - cx) / fx + 0.3 * tan_fovx, cx / fx + 0.3 * tan_fovx
    lim_y_pos, lim_y_neg = (height - cy) / fy + 0.3 * tan_fovy, cy / fy + 0.3 * tan_fovy
    rz = 1.0 / zs
    tx = zs * torch.minimum(lim_x_pos, torch.maximum(-lim_x_neg, x * rz))
    ty = zs * torch.minimum(lim_y_pos, torch.maximum(-lim_y_neg, y * rz))
    zero = torch.zeros_like(zs)
    J = torch.stack(
        [
            torch.stack([fx * rz, zero, -fx * tx * rz * rz], -1),
            torch.stack([zero, fy * rz, -fy * ty * rz * rz], -1),
        ],
        dim=-2,
    )  # [C, N, 2, 3]
    cov2d = fixed_order.matmul(fixed_order.matmul(J, cov_c), J.transpose(-1, -2))  # [C, N, 2, 2]
    a = cov2d[..., 0, 0] + eps2d
    b = cov2d[..., 0, 1]
    c = cov2d[..., 1, 1] + eps2d
    det = a * c - b * b
    det_ok = det > 0
    dets = torch.where(det_ok, det, torch.ones_like(det))
    conics = torch.stack([c / dets, -b / dets, a / dets], dim=-1)
    means2d = torch.stack([fx * x * rz + cx, fy * y * rz + cy], dim=-1)

    with torch.no_grad():
        op = opacities.detach()[None, :].expand_as(z)
        op_ok = op >= ALPHA_THRESHOLD
        extend = torch.sqrt(2.0 * torch.log(op.clamp_min(ALPHA_THRESHOLD) / ALPHA_THRESHOLD)).clamp(
            max=EXTEND_MAX
        )
        rx = torch.ceil(extend * torch.sqrt(a.detach().clamp_min(0)))
        ry = torch.ceil(extend * torch.sqrt(c.detach().clamp_min(0)))
        mx, my = means2d.detach().unbind(-1)
        on_screen = (mx + rx > 0) & (mx - rx < width) & (my + ry > 0) & (my - ry < height)
        keep = depth_ok & det_ok & op_ok & ((rx > 0) | (ry > 0)) & on_screen
        radii = torch.stack([rx, ry], -1).to(torch.int32) * keep[..., None]
    return Projection(means2d=means2d, conics=conics, depths=z, radii=radii)


@functools.cache
def _just_below(x: float, dtype: torch.dtype) -> float:
    """The largest value of ``dtype`` below ``x`` as ``dtype`` rounds it: ``v > _just_below(x)`` is
    ``v >= x`` for every ``v`` of that dtype (so ``threshold_`` can do a ``>=`` cut)."""
    t = torch.tensor(x, dtype=dtype)
    return float(torch.nextafter(t, torch.zeros_like(t)))


def _weights(
    expo_coef: torch.Tensor,
    basis: torch.Tensor,
    need_grad_mask: bool = False,
    t_start: torch.Tensor | None = None,
):
    """Per pixel-Gaussian alphas, transmittances and blending weights of a chunk (no autograd).

    Everything is laid out [B, M, P] (Gaussian before pixel): the running product over the M
    Gaussians then runs over whole rows of P pixels (along the last axis it is ~8x slower on the CPU).

    Args:
        expo_coef: [B, M, 6] exponent coefficients; basis: [P, 6] pixel basis.
        need_grad_mask: also return the mask of pairs that receive gradients.
        t_start: [B, P] transmittance before the first of the M Gaussians (for a slice of a longer
            list; the running product continues from it); None = 1.

    Returns:
        (alpha [B, M, P] after the clamp and the skips, T before each Gaussian [B, M, P], weights
        w = alpha * T [B, M, P], with ``need_grad_mask`` the [B, M, P] bool mask of pairs that receive
        gradients: drawn and not clamped at 0.999 (else None), and T [B, P] after the last Gaussian
        before the stop rule: a pixel has stopped when it is at most ``T_THRESHOLD``).
    """
    expo = torch.matmul(expo_coef, basis.t())  # [B, M, P]
    # the floor changes nothing drawn (e^-30 << 1/255) but keeps exp() off its slow underflow path
    alpha = expo.clamp_(min=-SIGMA_MAX).exp_()
    live = alpha <= MAX_ALPHA if need_grad_mask else None
    alpha.clamp_(max=MAX_ALPHA)
    # alpha < 1/255 -> 0 (threshold_ keeps v > t: a comparison and masked_fill_ take ~9x as long)
    torch.nn.functional.threshold_(alpha, _just_below(ALPHA_THRESHOLD, alpha.dtype), 0.0)
    B, M, P = alpha.shape
    # running[:, 0] = T before the first Gaussian, running[:, k + 1] = T after Gaussian k
    running = torch.empty(B, M + 1, P, dtype=alpha.dtype, device=alpha.device)
    if t_start is None:
        running[:, 0] = 1.0
    else:
        running[:, 0] = t_start
    torch.sub(alpha.new_ones(()), alpha, out=running[:, 1:])
    running.cumprod_(dim=1)
    t_before, t_after = running[:, :-1], running[:, 1:]
    # stop before the Gaussian that takes T to <= 1e-4; T only falls, so the kept Gaussians are a
    # prefix and their weights equal those of a loop that breaks there. T >= 0, so
    # sign(threshold(T, 1e-4)) is 1 where T > 1e-4 and 0 where the pixel has stopped.
    if bool((running[:, -1] <= T_THRESHOLD).any()):
        alpha.mul_(torch.nn.functional.threshold(t_after, T_THRESHOLD, 0.0).sign_())
    weights = alpha * t_before
    if need_grad_mask:
        live &= alpha > 0
    return alpha, t_before, weights, live, running[:, -1]


class _Composite(torch.autograd.Function):
    """Front-to-back compositing of B tiles of P pixels, each with M depth-sorted Gaussians.

    A Gaussian's alpha at pixel ``p = o + u`` (``o`` the tile centre) is ``exp(e(u))`` with the
    exponent ``e = ln(opacity) - 0.5 d^T Q d`` a quadratic in the local offset ``u``:
    ``e = basis(u) . coef`` with ``basis = [1, ux, uy, ux^2/2, ux uy, uy^2/2]``. One batched matrix
    product gives a chunk's exponents; local offsets keep float32 cancellation small.

    The backward pass recomputes the chunk (so nothing of size B x P x M is stored) and applies
    ``dL/dalpha_i = T_i (g . f_i) - sum_{j > i} w_j (g . f_j) / (1 - alpha_i)``.
    """

    @staticmethod
    def forward(ctx, expo_coef: torch.Tensor, feats: torch.Tensor, basis: torch.Tensor) -> torch.Tensor:
        """expo_coef [B, M, 6]; feats [B, M, K]; basis [P, 6] -> [B, P, K] sum_i w_i f_i."""
        _, _, weights, _, _ = _weights(expo_coef, basis)
        ctx.save_for_backward(expo_coef, feats, basis)
        return torch.bmm(weights.transpose(1, 2), feats)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        expo_coef, feats, basis = ctx.saved_tensors
        alpha, t_before, weights, live, _ = _weights(expo_coef, basis, need_grad_mask=True)
        s = torch.bmm(feats, grad_out.transpose(1, 2))  # [B, M, P]: g . f_i
        ws = weights * s
        suffix = ws.flip(1).cumsum(1).flip(1) - ws  # sum_{j > i} w_j s_j
        g_alpha = t_before * s - suffix / (1.0 - alpha)
        g_expo = torch.where(live, g_alpha * alpha, torch.zeros_like(g_alpha))
        g_coef = torch.matmul(g_expo, basis)  # [B, M, 6]
        g_feats = torch.bmm(weights, grad_out)  # [B, M, K]
        return g_coef, g_feats, None


def _composite_chunk(expo_coef: torch.Tensor, feats: torch.Tensor, basis: torch.Tensor) -> torch.Tensor:
    """[B, P, K] accumulated features sum_i w_i f_i of a chunk (see :class:`_Composite`).

    Args:
        expo_coef: [B, M, 6] exponent coefficients (padding slots hold a constant far below
            ln(1/255), so they are skipped like any faint Gaussian).
        feats: [B, M, K] features to composite (the last one is all ones: it accumulates alpha).
        basis: [P, 6] pixel basis.
    """
    if torch.is_grad_enabled() and (expo_coef.requires_grad or feats.requires_grad):
        return _Composite.apply(expo_coef, feats, basis)
    _, _, weights, _, _ = _weights(expo_coef, basis)
    return torch.bmm(weights.transpose(1, 2), feats)


def gather_rows(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``table[index]`` for an integer ``index`` of any shape: [*index.shape, D] from ``table`` [R, D].

    Through ``index_select``, whose backward accumulates with ``index_add_``: deterministic on the CPU
    with any number of threads (and no slower). Advanced indexing (``table[index]``) accumulates its
    backward with ``index_put_(accumulate=True)``, which on the CPU with more than one thread adds
    float32 values with atomics in whatever order the threads run, so two identical training runs
    drift apart (the gradients differ in the last bits, then densification diverges).
    """
    return table.index_select(0, index.reshape(-1)).view(*index.shape, table.shape[-1])


def _exponent_coefficients(
    xy: torch.Tensor, conic: torch.Tensor, opac: torch.Tensor, centre: torch.Tensor, valid: torch.Tensor
) -> torch.Tensor:
    """[B, M, 6] coefficients of ``ln(opacity) - sigma(u)`` for tiles centred at ``centre`` [B, 2]."""
    dx = centre[:, None, 0] - xy[..., 0]  # [B, M]: tile centre minus Gaussian mean
    dy = centre[:, None, 1] - xy[..., 1]
    a, b, c = conic.unbind(-1)
    s0 = 0.5 * (a * dx * dx + c * dy * dy) + b * dx * dy
    gx = a * dx + b * dy
    gy = b * dx + c * dy
    coef = -torch.stack([s0 - torch.log(opac), gx, gy, a, b, c], dim=-1)
    pad = torch.zeros_like(coef)
    pad[..., 0] = -2 * SIGMA_MAX
    return torch.where(valid[..., None], coef, pad)


def tile_intersections(
    proj: Projection, opacities: torch.Tensor, width: int, height: int, tile_size: int = TILE_SIZE
) -> tuple[torch.Tensor, torch.Tensor]:
    """Every tile's front-to-back list of the Gaussians that can draw in it (no gradients).

    A Gaussian is listed in a tile of its bounding box when its ellipse ``E = {d : q(d) <= t}``,
    ``q(d) = 0.5 d^T Q d`` (Q its conic), ``t = ln(255 o) + REACH_MARGIN``, meets the rectangle spanned
    by the tile's pixel centres: outside ``E`` its alpha is below 1/255 at every pixel (the margin is
    far above float rounding), so dropping the other tiles changes no pixel. Per tile row of the box,
    the x-extent of ``E`` over the row's band of pixel centres gives the row's tiles in closed form:
    the leftmost point of ``E`` in the band is at the clamp to the band of the ``dy`` of ``E``'s
    leftmost point (the left boundary is convex in ``dy``), likewise the rightmost.

    Args:
        proj: :func:`project` of N Gaussians in C cameras (W x H); opacities: [N].
        tile_size: tile edge in pixels; tiles are numbered (camera, row, column), ``th x tw`` each.

    Returns:
        (isect_gauss [I] int64 flat (camera, Gaussian) ids ``c * N + n``, grouped by tile, each tile's
        front to back by depth, ties by index; per_tile [C * th * tw] int64 list lengths).
    """
    C, N = proj.depths.shape
    dev, dt = proj.means2d.device, proj.means2d.dtype
    tw, th = math.ceil(width / tile_size), math.ceil(height / tile_size)
    with torch.no_grad():
        # visible (camera, Gaussian) ids in depth order inside each camera: pairs made in this order
        # and stably sorted by tile come out front to back in every tile (index_select throughout:
        # advanced indexing is ~4x slower on the CPU)
        order = torch.sort(proj.depths.detach(), dim=1, stable=True).indices  # [C, N]
        flat = (order + N * torch.arange(C, device=dev)[:, None]).reshape(-1)
        flat = flat[(proj.radii.reshape(C * N, 2).index_select(0, flat) > 0).all(-1)]
        xy = proj.means2d.detach().reshape(C * N, 2).index_select(0, flat)
        radii = proj.radii.reshape(C * N, 2).index_select(0, flat).to(dt)
        a, b, c = proj.conics.detach().reshape(C * N, 3).index_select(0, flat).unbind(-1)
        t2 = 2.0 * (torch.log(opacities.detach().index_select(0, flat % N) / ALPHA_THRESHOLD) + REACH_MARGIN)
        tx0 = torch.floor((xy[:, 0] - radii[:, 0]) / tile_size).clamp(0, tw).long()
        tx1 = torch.ceil((xy[:, 0] + radii[:, 0]) / tile_size).clamp(0, tw).long()
        ty0 = torch.floor((xy[:, 1] - radii[:, 1]) / tile_size).clamp(0, th).long()
        ty1 = torch.ceil((xy[:, 1] + radii[:, 1]) / tile_size).clamp(0, th).long()
        # E: a dx^2 + 2 b dx dy + c dy^2 <= t2; |dy| <= y_max; leftmost point at dy = y_left
        det = a * c - b * b
        y_max = torch.sqrt(t2 * a / det)
        y_left = b * torch.sqrt(t2 / (c * det))

        # ------------------------------------------------ one entry per (Gaussian, tile row of its box)
        rows_per = (ty1 - ty0).clamp_min(0)
        g = torch.repeat_interleave(torch.arange(flat.numel(), device=dev), rows_per)

        def per_row(x: torch.Tensor) -> torch.Tensor:
            return x.index_select(0, g)

        row = per_row(ty0 - (torch.cumsum(rows_per, 0) - rows_per)) + torch.arange(g.numel(), device=dev)
        mx = per_row(xy[:, 0])
        y_lo = row.to(dt) * tile_size + 0.5 - per_row(xy[:, 1])  # band of pixel-centre offsets
        ym, yl = per_row(y_max), per_row(y_left)
        y0 = torch.maximum(y_lo, -ym)
        y1 = torch.minimum(y_lo + (tile_size - 1), ym)
        ag, bg, dg, tg = per_row(a), per_row(b), per_row(det), per_row(t2)

        def x_edge(dy: torch.Tensor, sign: float) -> torch.Tensor:  # E's boundary x at dy
            return (sign * torch.sqrt((ag * tg - dg * dy * dy).clamp_min(0.0)) - bg * dy) / ag

        x_min = mx + x_edge(torch.minimum(torch.maximum(yl, y0), y1), -1.0)
        x_max = mx + x_edge(torch.minimum(torch.maximum(-yl, y0), y1), 1.0)
        # tiles whose pixel centres [i ts + 0.5, i ts + ts - 0.5] meet [x_min, x_max], inside the box
        i_lo = torch.maximum(torch.ceil((x_min - (tile_size - 0.5)) / tile_size).long(), per_row(tx0))
        i_hi = torch.minimum(torch.floor((x_max - 0.5) / tile_size).long(), per_row(tx1) - 1)
        cols = torch.where(y0 <= y1, (i_hi - i_lo + 1).clamp_min(0), 0)
        # the entry's first tile, numbered (camera, row, column)
        tile0 = (per_row(torch.div(flat, N, rounding_mode="floor")) * th + row) * tw + i_lo

        # ------------------------------------------------ one entry per (Gaussian, tile)
        r = torch.repeat_interleave(torch.arange(g.numel(), device=dev), cols)
        tile = (tile0 - (torch.cumsum(cols, 0) - cols)).index_select(0, r) + torch.arange(
            r.numel(), device=dev
        )
        n_tiles = C * th * tw
        key_dtype = torch.int16 if n_tiles <= 2**15 else torch.int32 if n_tiles <= 2**31 else torch.int64
        tile_sorted, perm = torch.sort(tile.to(key_dtype), stable=True)  # smaller keys sort faster
        ids = flat.index_select(0, g.index_select(0, r.index_select(0, perm)))
        return ids, torch.bincount(tile_sorted.long(), minlength=n_tiles)


def rasterize(
    proj: Projection,
    opacities: torch.Tensor,
    feats: torch.Tensor,
    width: int,
    height: int,
    tile_size: int = TILE_SIZE,
    chunk_elems: int | None = None,
    depth_slice: int | None = DEPTH_SLICE,
    workers: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Alpha-composite projected Gaussians into C images of W x H pixels.

    Args:
        proj: the :func:`project` result for C cameras and N Gaussians.
        opacities: [N] in (0, 1).
        feats: [C, N, K] per-camera features to composite (e.g. RGB and depth), or [N, K].
        tile_size: tile edge in pixels.
        chunk_elems: cap on B x P x M (tiles x pixels x Gaussians) per chunk: bounds peak memory
            (forward and backward: the backward pass recomputes each chunk); None =
            ``CHUNK_ELEMS`` with gradients, ``SLICE_CHUNK_ELEMS`` in depth slices.
        depth_slice: without gradients, composite each tile's list this many Gaussians at a time and
            stop a tile once all its pixels have stopped (the same image to float rounding of the
            sums); None = whole lists at once, as with gradients.
        workers: on the CPU without gradients, render groups of cameras on this many threads that run
            PyTorch single-threaded (:mod:`microdreamer.cpu_pool`); None =
            :func:`~microdreamer.cpu_pool.cpu_workers`; 1 = this thread. Each camera's projection and
            tile lists are the same bits in any group, but its sums are BLAS products over chunks of
            tiles padded to the chunk's longest list, whose blocking (so their last bits) depends on
            the other tiles in the call and on the BLAS: a camera's image equals the whole call's to
            float32 rounding of those sums (tested at 1e-6), not to the bit. The C++ backend
            (:func:`microdreamer.kernels.cpu.rasterize`, the CPU's default) is the same to the bit.

    Returns:
        (accumulated features [C, H, W, K] = sum_i w_i f_i with no background,
        accumulated alpha [C, H, W, 1] = sum_i w_i = 1 - T).
    """
    C, N = proj.depths.shape
    if feats.dim() == 2:
        feats = feats[None].expand(C, N, feats.shape[-1])
    grad = torch.is_grad_enabled() and any(
        t.requires_grad for t in (proj.means2d, proj.conics, opacities, feats)
    )
    if workers is None:
        workers = cpu_workers(proj.means2d.device, C)
    workers = min(C, workers)
    if grad or depth_slice is None or proj.means2d.device.type != "cpu" or workers <= 1:
        return _rasterize(proj, opacities, feats, width, height, tile_size, chunk_elems, depth_slice)
    bounds = [C * i // workers for i in range(workers + 1)]

    def group(i: int) -> tuple[torch.Tensor, torch.Tensor]:
        a, b = bounds[i], bounds[i + 1]
        part = Projection(proj.means2d[a:b], proj.conics[a:b], proj.depths[a:b], proj.radii[a:b])
        return _rasterize(part, opacities, feats[a:b], width, height, tile_size, chunk_elems, depth_slice)

    parts = map_single_threaded(group, range(workers), workers)
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])


def _rasterize(
    proj: Projection,
    opacities: torch.Tensor,
    feats: torch.Tensor,
    width: int,
    height: int,
    tile_size: int,
    chunk_elems: int | None,
    depth_slice: int | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`rasterize` in this thread; feats [C, N, K]."""
    C, N = proj.depths.shape
    K = feats.shape[-1]
    dev, dt = proj.means2d.device, proj.means2d.dtype
    tw, th = math.ceil(width / tile_size), math.ceil(height / tile_size)
    n_tiles = C * th * tw
    P = tile_size * tile_size
    acc = torch.zeros(n_tiles, P, K + 1, device=dev, dtype=dt)  # features, then alpha
    isect_gauss, per_tile = tile_intersections(proj, opacities, width, height, tile_size)
    if isect_gauss.numel() > 0:
        with torch.no_grad():
            tile_start = torch.cumsum(per_tile, 0) - per_tile
            nonempty = torch.nonzero(per_tile).squeeze(1)
            # longest lists first, so each chunk pads little
            nonempty = nonempty[torch.argsort(per_tile[nonempty], descending=True, stable=True)]
            # pixel basis [1, ux, uy, ux^2/2, ux uy, uy^2/2] in offsets from the tile centre
            local = torch.arange(P, device=dev)
            u = torch.stack([local % tile_size, torch.div(local, tile_size, rounding_mode="floor")], -1)
            u = u.to(dt) + 0.5 - 0.5 * tile_size
            ux, uy = u.unbind(-1)
            basis = torch.stack([torch.ones_like(ux), ux, uy, 0.5 * ux * ux, ux * uy, 0.5 * uy * uy], -1)

        # one table of every per-(camera, Gaussian) input of a chunk: mean (2), conic (3), opacity (1),
        # features (K) and a channel of ones that accumulates alpha = sum_i w_i alongside them; a chunk
        # gathers its rows with one index_select (see gather_rows: a deterministic backward on the CPU)
        table = torch.cat(
            [
                proj.means2d.reshape(C * N, 2),
                proj.conics.reshape(C * N, 3),
                opacities[None, :, None].expand(C, N, 1).reshape(C * N, 1),
                feats.reshape(C * N, K),
                torch.ones(C * N, 1, device=dev, dtype=dt),
            ],
            -1,
        )
        lists = _TileLists(isect_gauss, tile_start, per_tile, tile_size, tw, th)
        if depth_slice is None or (torch.is_grad_enabled() and table.requires_grad):
            done, out = _composite_whole(lists, nonempty, table, basis, chunk_elems or CHUNK_ELEMS)
        else:
            chunk_elems = chunk_elems or SLICE_CHUNK_ELEMS
            done, out = nonempty, _composite_sliced(lists, nonempty, table, basis, chunk_elems, depth_slice)
        acc = acc.index_copy(0, done, out)

    def to_image(x: torch.Tensor) -> torch.Tensor:  # [C*th*tw, P, k] -> [C, H, W, k]
        k = x.shape[-1]
        x = x.reshape(C, th, tw, tile_size, tile_size, k).permute(0, 1, 3, 2, 4, 5)
        return x.reshape(C, th * tile_size, tw * tile_size, k)[:, :height, :width]

    img = to_image(acc)
    return img[..., :K], img[..., K:]


@dataclass
class _TileLists:
    """Every tile's depth-sorted Gaussians: ``isect_gauss[tile_start[t] : tile_start[t] + per_tile[t]]``
    are tile t's flat (camera, Gaussian) ids, front to back; tiles are numbered (camera, row, column)."""

    isect_gauss: torch.Tensor
    tile_start: torch.Tensor
    per_tile: torch.Tensor
    tile_size: int
    tw: int
    th: int

    def rows(self, table: torch.Tensor, tiles: torch.Tensor, first: int, m: int):
        """Slots ``first .. first + m - 1`` of the lists of ``tiles`` [b]: (rows [b, m, D] gathered from
        ``table``, valid [b, m] bool: the slot holds a Gaussian, centre [b, 2] of each tile in pixels).

        Padding slots repeat the tile's first (drawn) Gaussian, so every gathered value is finite."""
        dev = tiles.device
        with torch.no_grad():
            slot = torch.arange(first, first + m, device=dev)
            start = self.tile_start[tiles]
            valid = slot[None, :] < self.per_tile[tiles][:, None]  # [b, m]
            src = (start[:, None] + slot[None, :]).clamp(max=self.isect_gauss.numel() - 1)
            gid = torch.where(valid, self.isect_gauss[src], self.isect_gauss[start][:, None])  # [b, m]
            t_local = tiles % (self.th * self.tw)
            origin = torch.stack([t_local % self.tw, torch.div(t_local, self.tw, rounding_mode="floor")], -1)
            centre = origin.to(table.dtype) * self.tile_size + 0.5 * self.tile_size  # [b, 2]
        return gather_rows(table, gid), valid, centre


def _composite_whole(
    lists: _TileLists, nonempty: torch.Tensor, table: torch.Tensor, basis: torch.Tensor, chunk_elems: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Composite whole lists, a chunk of tiles at a time (differentiable): (tiles [T'], sums [T', P, D - 6])
    for the ``nonempty`` tiles in chunk order."""
    P = basis.shape[0]
    ne_counts = lists.per_tile[nonempty].tolist()
    outs, tiles_done = [], []
    i = 0
    n_ne = len(ne_counts)
    while i < n_ne:
        m = ne_counts[i]  # the longest list in this chunk (descending order)
        b = max(1, min(n_ne - i, chunk_elems // max(1, P * m)))
        tiles_b = nonempty[i : i + b]
        rows, valid, centre = lists.rows(table, tiles_b, 0, m)  # [b, m, 7 + K]
        expo_coef = _exponent_coefficients(rows[..., :2], rows[..., 2:5], rows[..., 5], centre, valid)
        outs.append(_composite_chunk(expo_coef, rows[..., 6:], basis))
        tiles_done.append(tiles_b)
        i += b
    return torch.cat(tiles_done), torch.cat(outs)


def _composite_sliced(
    lists: _TileLists,
    nonempty: torch.Tensor,
    table: torch.Tensor,
    basis: torch.Tensor,
    chunk_elems: int,
    depth_slice: int,
) -> torch.Tensor:
    """Composite the ``nonempty`` tiles' lists (longest first) ``depth_slice`` Gaussians at a time with
    no gradients, carrying each pixel's transmittance; a tile leaves once its list is done or all its
    pixels have stopped. Returns [T', P, D - 6] sums for ``nonempty`` in its order.

    Each slice gathers and prepares the rows of all its tiles at once; its chunks (``chunk_elems``
    pixel-Gaussian pairs, small enough to stay in the CPU's cache) only composite."""
    P = basis.shape[0]
    dev, dt = table.device, table.dtype
    n_ne = nonempty.numel()
    length = lists.per_tile[nonempty]  # non-increasing
    out = torch.zeros(n_ne, P, table.shape[1] - 6, device=dev, dtype=dt)
    trans = torch.ones(n_ne, P, device=dev, dtype=dt)
    active = torch.arange(n_ne, device=dev)  # positions in nonempty, still longest first
    first = 0
    with torch.no_grad():
        while active.numel() > 0:
            left = (length[active] - first).tolist()
            rows, valid, centre = lists.rows(table, nonempty[active], first, min(depth_slice, left[0]))
            expo_coef = _exponent_coefficients(rows[..., :2], rows[..., 2:5], rows[..., 5], centre, valid)
            feats = rows[..., 6:]
            t_in = trans[active]
            sums, t_out = [], []
            i = 0
            while i < len(left):
                m = min(depth_slice, left[i])  # the longest list left in this chunk
                b = max(1, min(len(left) - i, chunk_elems // max(1, P * m)))
                _, _, weights, _, t_end = _weights(expo_coef[i : i + b, :m], basis, t_start=t_in[i : i + b])
                sums.append(torch.bmm(weights.transpose(1, 2), feats[i : i + b, :m]))
                t_out.append(t_end)
                i += b
            out.index_add_(0, active, torch.cat(sums))
            trans.index_copy_(0, active, torch.cat(t_out))
            first += depth_slice
            active = active[(length[active] > first) & (trans[active].amax(1) > T_THRESHOLD)]
    return out
