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
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

ALPHA_THRESHOLD = 1.0 / 255.0  # alphas below this are skipped
MAX_ALPHA = 0.999  # alphas are clamped to this
T_THRESHOLD = 1e-4  # a pixel stops before the Gaussian that takes T to this or below
SIGMA_MAX = 30.0  # Mahalanobis terms are capped here before exp (e^-30 is far below 1/255)
EXTEND_MAX = 3.33  # cap on the bounding-box half-width in standard deviations
TILE_SIZE = 8  # smaller tiles waste fewer pixel-Gaussian pairs on the CPU


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
    mc = torch.einsum("cij,nj->cni", R, means) + t[:, None, :]  # [C, N, 3]
    cov_c = torch.einsum("cij,njk,clk->cnil", R, covars, R)  # [C, N, 3, 3]

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
    cov2d = J @ cov_c @ J.transpose(-1, -2)  # [C, N, 2, 2]
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


def _weights(expo_coef: torch.Tensor, basis: torch.Tensor, need_grad_mask: bool = False):
    """Per pixel-Gaussian alphas, transmittances and blending weights of a chunk (no autograd).

    Returns:
        (alpha [B, P, M] after the clamp and the skips, T before each Gaussian [B, P, M], weights
        w = alpha * T [B, P, M], and with ``need_grad_mask`` the [B, P, M] bool mask of pairs that
        receive gradients: drawn and not clamped at 0.999 (else None)).
    """
    expo = torch.matmul(basis, expo_coef.transpose(1, 2))  # [B, P, M]
    # the floor changes nothing drawn (e^-30 << 1/255) but keeps exp() off its slow underflow path
    alpha = torch.exp(expo.clamp_(min=-SIGMA_MAX))
    live = alpha <= MAX_ALPHA if need_grad_mask else None
    alpha.clamp_(max=MAX_ALPHA)
    alpha.masked_fill_(alpha < ALPHA_THRESHOLD, 0.0)
    t_after = torch.cumprod(1.0 - alpha, dim=-1)
    t_before = torch.cat([torch.ones_like(t_after[..., :1]), t_after[..., :-1]], dim=-1)
    # stop before the Gaussian that takes T to <= 1e-4; T only falls, so the kept Gaussians are a
    # prefix and their weights equal those of a loop that breaks there
    stop = t_after <= T_THRESHOLD
    if bool(stop[..., -1].any()):
        alpha.masked_fill_(stop, 0.0)
    weights = alpha * t_before
    if need_grad_mask:
        live &= alpha > 0
    return alpha, t_before, weights, live


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
        _, _, weights, _ = _weights(expo_coef, basis)
        ctx.save_for_backward(expo_coef, feats, basis)
        return torch.bmm(weights, feats)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        expo_coef, feats, basis = ctx.saved_tensors
        alpha, t_before, weights, live = _weights(expo_coef, basis, need_grad_mask=True)
        s = torch.bmm(grad_out, feats.transpose(1, 2))  # [B, P, M]: g . f_i
        ws = weights * s
        suffix = ws.flip(-1).cumsum(-1).flip(-1) - ws  # sum_{j > i} w_j s_j
        g_alpha = t_before * s - suffix / (1.0 - alpha)
        g_expo = torch.where(live, g_alpha * alpha, torch.zeros_like(g_alpha))
        g_coef = torch.matmul(g_expo.transpose(1, 2), basis)  # [B, M, 6]
        g_feats = torch.bmm(weights.transpose(1, 2), grad_out)  # [B, M, K]
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
    _, _, weights, _ = _weights(expo_coef, basis)
    return torch.bmm(weights, feats)


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


def rasterize(
    proj: Projection,
    opacities: torch.Tensor,
    feats: torch.Tensor,
    width: int,
    height: int,
    tile_size: int = TILE_SIZE,
    chunk_elems: int = 1 << 20,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Alpha-composite projected Gaussians into C images of W x H pixels.

    Args:
        proj: the :func:`project` result for C cameras and N Gaussians.
        opacities: [N] in (0, 1).
        feats: [C, N, K] per-camera features to composite (e.g. RGB and depth), or [N, K].
        tile_size: tile edge in pixels.
        chunk_elems: cap on B x P x M (tiles x pixels x Gaussians) per chunk: bounds peak memory
            (forward and backward: the backward pass recomputes each chunk).

    Returns:
        (accumulated features [C, H, W, K] = sum_i w_i f_i with no background,
        accumulated alpha [C, H, W, 1] = sum_i w_i = 1 - T).
    """
    C, N = proj.depths.shape
    K = feats.shape[-1]
    dev, dt = proj.means2d.device, proj.means2d.dtype
    tw, th = math.ceil(width / tile_size), math.ceil(height / tile_size)
    n_tiles = C * th * tw
    P = tile_size * tile_size
    if feats.dim() == 2:
        feats = feats[None].expand(C, N, K)

    with torch.no_grad():
        # ------------------------------------------------ tile intersections
        radii = proj.radii.to(dt)
        m2 = proj.means2d.detach()
        vis = (proj.radii > 0).all(-1)  # [C, N]
        tx0 = torch.floor((m2[..., 0] - radii[..., 0]) / tile_size).clamp(0, tw).long()
        tx1 = torch.ceil((m2[..., 0] + radii[..., 0]) / tile_size).clamp(0, tw).long()
        ty0 = torch.floor((m2[..., 1] - radii[..., 1]) / tile_size).clamp(0, th).long()
        ty1 = torch.ceil((m2[..., 1] + radii[..., 1]) / tile_size).clamp(0, th).long()
        counts = ((tx1 - tx0) * (ty1 - ty0)) * vis
        flat_counts = counts.reshape(-1)
        total = int(flat_counts.sum())
        # depth rank inside each camera: sorting by (tile, rank) gives per-tile front-to-back lists
        order = torch.sort(proj.depths.detach(), dim=1, stable=True).indices
        rank = torch.empty_like(order)
        rank.scatter_(1, order, torch.arange(N, device=dev).expand(C, N).contiguous())
    acc = torch.zeros(n_tiles, P, K + 1, device=dev, dtype=dt)  # features, then alpha
    if total > 0:
        with torch.no_grad():
            ids = torch.repeat_interleave(torch.arange(C * N, device=dev), flat_counts)  # flat (c, n)
            starts = torch.cumsum(flat_counts, 0) - flat_counts
            k = torch.arange(total, device=dev) - starts[ids]
            w = (tx1 - tx0).reshape(-1)[ids]
            tile_x = tx0.reshape(-1)[ids] + k % w
            tile_y = ty0.reshape(-1)[ids] + torch.div(k, w, rounding_mode="floor")
            cam = torch.div(ids, N, rounding_mode="floor")
            tile = (cam * th + tile_y) * tw + tile_x
            key = tile * N + rank.reshape(-1)[ids]
            sorted_key, perm = torch.sort(key)
            isect_gauss = ids[perm]  # flat (c, n) ids, grouped by tile, front to back
            isect_tile = torch.div(sorted_key, N, rounding_mode="floor")
            per_tile = torch.bincount(isect_tile, minlength=n_tiles)
            tile_start = torch.cumsum(per_tile, 0) - per_tile
            nonempty = torch.nonzero(per_tile).squeeze(1)
            # longest lists first, so each chunk pads little
            nonempty = nonempty[torch.argsort(per_tile[nonempty], descending=True, stable=True)]
            ne_counts = per_tile[nonempty].tolist()
            # pixel basis [1, ux, uy, ux^2/2, ux uy, uy^2/2] in offsets from the tile centre
            local = torch.arange(P, device=dev)
            u = torch.stack([local % tile_size, torch.div(local, tile_size, rounding_mode="floor")], -1).to(
                dt
            )
            u = u + 0.5 - 0.5 * tile_size
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
        outs, tiles_done = [], []
        i = 0
        n_ne = len(ne_counts)
        while i < n_ne:
            m = ne_counts[i]  # the longest list in this chunk (descending order)
            b = max(1, min(n_ne - i, chunk_elems // max(1, P * m)))
            tiles_b = nonempty[i : i + b]
            with torch.no_grad():
                slot = torch.arange(m, device=dev)
                valid = slot[None, :] < per_tile[tiles_b][:, None]  # [b, m]
                src = (tile_start[tiles_b][:, None] + slot[None, :]).clamp(max=total - 1)
                # padding repeats the tile's first (drawn) Gaussian, so every gathered value is finite
                first = isect_gauss[tile_start[tiles_b]][:, None].expand_as(src)
                gid = torch.where(valid, isect_gauss[src], first)  # [b, m]
                t_local = tiles_b % (th * tw)
                origin = torch.stack([t_local % tw, torch.div(t_local, tw, rounding_mode="floor")], -1).to(dt)
                centre = origin * tile_size + 0.5 * tile_size  # [b, 2]
            rows = gather_rows(table, gid)  # [b, m, 7 + K]
            expo_coef = _exponent_coefficients(rows[..., :2], rows[..., 2:5], rows[..., 5], centre, valid)
            outs.append(_composite_chunk(expo_coef, rows[..., 6:], basis))
            tiles_done.append(tiles_b)
            i += b
        done = torch.cat(tiles_done)
        acc = acc.index_copy(0, done, torch.cat(outs))

    def to_image(x: torch.Tensor) -> torch.Tensor:  # [C*th*tw, P, k] -> [C, H, W, k]
        k = x.shape[-1]
        x = x.reshape(C, th, tw, tile_size, tile_size, k).permute(0, 1, 3, 2, 4, 5)
        return x.reshape(C, th * tile_size, tw * tile_size, k)[:, :height, :width]

    img = to_image(acc)
    return img[..., :K], img[..., K:]
