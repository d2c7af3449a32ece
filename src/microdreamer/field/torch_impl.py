"""The vectorised, chunked PyTorch density field: the CPU path, and the fallback on CUDA.

Design: the grid is cut into cubic tiles (exact: 8^3 voxels; upstream: its blocks, grouped into
tiles of at least 8 voxels a side when blocks are smaller, with the block rule applied per voxel). Each Gaussian
is binned to the tiles its rule lets it reach (upstream: the blocks whose grown box holds its
centre; exact: the tiles its cutoff box overlaps), the (Gaussian, tile) pairs are sorted by tile,
and each tile is evaluated densely as one matrix product: with tile-local coordinates x' and
mu' = mu - tile centre, ``q = |M (x' - mu')|^2 = phi(x') . psi(mu', M)`` where phi holds the 10
monomials (x^2, y^2, z^2, 2xy, 2xz, 2yz, x, y, z, 1) and psi the matching coefficients of
P = M^T M. The product runs in float64 (the expanded form cancels; float64 keeps q accurate to
~1e-12 even for nearly flat Gaussians), the exponentials in float32, and the opacity-weighted sum is
a float32 matrix-vector product.

Memory is bounded: Gaussians are processed in chunks of at most ``max_pairs`` (Gaussian, tile)
pairs (about 56 bytes each), and each tile's Gaussians in column blocks so that the [voxels x
Gaussians] float64 block stays under ``block_bytes``. Peak: the float32 grid (4 R^3 bytes) plus about
``56 * max_pairs + 2 * block_bytes`` (~200 MB with the defaults).
"""

from __future__ import annotations

import math

import torch

from microdreamer.field.binning import box_cells, chunk_bounds
from microdreamer.field.common import FieldConfig, GridSpec, PreparedGaussians, upstream_block_bounds

EXACT_TILE = 8
_Q_MAX = 174.0  # exp(-0.5 * 174) = 1.6e-38


def exact_voxel_ranges(prepared: PreparedGaussians, grid: GridSpec) -> tuple[torch.Tensor, ...]:
    """[N, 3] float64 first and last voxel index per axis of each cutoff box (clamped to the grid,
    widened by 1e-9 of a voxel for rounding), and [N, 3] bool: the box misses the grid on that axis."""
    r = grid.resolution
    h = 2.0 / (r - 1)
    mu = prepared.means.double()
    rad = prepared.radii.double()
    lo = torch.ceil((mu - rad + 1.0) / h - 1e-9).clamp(0, r - 1)
    hi = torch.floor((mu + rad + 1.0) / h + 1e-9).clamp(0, r - 1)
    empty = ((mu + rad) < -1.0 - h) | ((mu - rad) > 1.0 + h)
    return lo, hi, empty


def _tile_ranges_exact(prepared: PreparedGaussians, grid: GridSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, 3] first and last tile index per axis whose voxels the cutoff box may reach (last < first: none)."""
    lo, hi, empty = exact_voxel_ranges(prepared, grid)
    first = (lo / EXACT_TILE).floor().long()
    last = (hi / EXACT_TILE).floor().long()
    last = torch.where(empty, first - 1, last)
    return first, last


def _tile_ranges_upstream(
    prepared: PreparedGaussians, lower: torch.Tensor, upper: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, 3] first and last block per axis with lower[b] < mean < upper[b] (both sorted ascending)."""
    mu = prepared.means.double().contiguous()
    first = torch.searchsorted(upper.to(mu.device), mu, right=True)  # first b with upper[b] > mu
    last = torch.searchsorted(lower.to(mu.device), mu, right=False) - 1  # last b with lower[b] < mu
    return first, last


def _features(coords: torch.Tensor) -> torch.Tensor:
    """[V, 3] float64 tile-local points -> [V, 10] monomials (x^2, y^2, z^2, 2xy, 2xz, 2yz, x, y, z, 1)."""
    x, y, z = coords.unbind(-1)
    one = torch.ones_like(x)
    return torch.stack([x * x, y * y, z * z, 2 * x * y, 2 * x * z, 2 * y * z, x, y, z, one], dim=-1)


def _coefficients(mu_local: torch.Tensor, precision: torch.Tensor) -> torch.Tensor:
    """[L, 3] tile-local means and [L, 3, 3] P = M^T M -> [L, 10] coefficients of q in the monomials."""
    pm = (precision @ mu_local[:, :, None])[:, :, 0]  # [L, 3]
    const = (mu_local * pm).sum(-1)
    p = precision
    return torch.stack(
        [p[:, 0, 0], p[:, 1, 1], p[:, 2, 2], p[:, 0, 1], p[:, 0, 2], p[:, 1, 2],
         -2 * pm[:, 0], -2 * pm[:, 1], -2 * pm[:, 2], const],
        dim=-1,
    )  # fmt: skip


def density_field_torch(
    prepared: PreparedGaussians,
    grid: GridSpec,
    config: FieldConfig,
    *,
    max_pairs: int = 1 << 21,
    block_bytes: int = 64 << 20,
    progress=None,
) -> torch.Tensor:
    """Density field on ``prepared``'s device.

    Args:
        prepared: the kept Gaussians (see :func:`prepare_gaussians`).
        grid: the sampling grid.
        config: mode and its parameters.
        max_pairs: (Gaussian, tile) pairs binned at once (memory bound).
        block_bytes: size of one [voxels x Gaussians] float64 block (memory bound).
        progress: optional callable ``progress(done_fraction)``.
    Returns:
        [R, R, R] float32; index [i, j, k] is the grid point (axis[i], axis[j], axis[k]).
    """
    r = grid.resolution
    device = prepared.means.device
    out = torch.zeros(r, r, r, dtype=torch.float32, device=device)
    n = len(prepared)
    if n == 0:
        return out
    axis64 = grid.axis(device).double()
    group = 1  # upstream: blocks per tile side (small blocks are grouped into tiles of >= 8 voxels)
    if config.mode == "upstream":
        block, lower, upper = upstream_block_bounds(grid, config)
        block_first, block_last = _tile_ranges_upstream(prepared, lower, upper)
        group = max(1, math.ceil(EXACT_TILE / block))
        tile = block * group
        first, last = block_first // group, torch.div(block_last, group, rounding_mode="floor")
    else:
        tile = EXACT_TILE
        first, last = _tile_ranges_exact(prepared, grid)
    n_tiles = math.ceil(r / tile)
    first = first.clamp(0, n_tiles - 1)
    last = last.clamp(-1, n_tiles - 1)
    extent = (last - first + 1).clamp(min=0)  # [N, 3] tiles per axis
    counts = extent.prod(-1)  # [N]

    mt = prepared.transforms.double()
    precision = mt.transpose(1, 2) @ mt  # [N, 3, 3]
    mu64 = prepared.means.double()
    opac = prepared.opacities.float()
    # upstream has no cutoff; terms below exp(-87) ~ 1e-38 (float32's smallest normal) are dropped
    limit = min(config.cutoff_sq, _Q_MAX) if config.mode == "exact" else _Q_MAX

    # chunk the Gaussians so that each chunk bins at most max_pairs pairs
    starts = chunk_bounds(counts, max_pairs)

    # every tile's centre along an axis: the mean of its axis samples (one tensor, indexed per tile)
    centres = torch.stack([axis64[i * tile : (i + 1) * tile].mean() for i in range(n_tiles)])

    def eval_tile(t_id: int, members: torch.Tensor) -> None:
        ix, rem = divmod(t_id, n_tiles * n_tiles)
        iy, iz = divmod(rem, n_tiles)
        sl = [slice(i * tile, min((i + 1) * tile, r)) for i in (ix, iy, iz)]
        centre = centres[[ix, iy, iz]]
        offsets = [axis64[s_] - centres[i] for s_, i in zip(sl, (ix, iy, iz), strict=True)]
        pts = torch.stack(torch.meshgrid(*offsets, indexing="ij"), -1)
        phi = _features(pts.reshape(-1, 3))  # [V, 10]
        cols = max(1, block_bytes // (8 * phi.shape[0]))
        acc = None
        if group > 1:  # the block of each voxel of this tile, per axis
            blocks = [torch.arange(s_.start, s_.stop, device=device) // block for s_ in sl]
        for m in torch.split(members, cols):
            psi = _coefficients(mu64[m] - centre, precision[m])  # [L, 10]
            q = phi @ psi.T  # [V, L] float64
            keep = q <= limit
            if group > 1:  # several blocks share this tile: apply the block rule per voxel
                inside = [
                    (block_first[m, a] <= blocks[a][:, None]) & (blocks[a][:, None] <= block_last[m, a])
                    for a in range(3)
                ]  # [T_a, L] each
                rule = inside[0][:, None, None] & inside[1][None, :, None] & inside[2][None, None, :]
                keep &= rule.reshape(keep.shape)
            # clamping keeps exp's argument above -87: float32 exp is ~20x slower when its
            # result underflows; those entries are zeroed just after (a product with the mask:
            # the same values as masked_fill_, which took 2.4x as long on the CPU)
            w = q.to(torch.float32).clamp_(0.0, _Q_MAX).mul_(-0.5).exp_().mul_(keep)
            part = w @ opac[m]
            acc = part if acc is None else acc + part
        out[sl[0], sl[1], sl[2]] += acc.reshape(pts.shape[:3])

    def _run_chunks() -> None:
        for c0, c1 in zip(starts[:-1], starts[1:], strict=False):
            if int(counts[c0:c1].sum()) == 0:
                continue
            gid, tile_id = box_cells(first, extent, (n_tiles, n_tiles, n_tiles), c0, c1)
            order = torch.argsort(tile_id, stable=True)
            tile_sorted, gid_sorted = tile_id[order], gid[order]
            uniq, per_tile = torch.unique_consecutive(tile_sorted, return_counts=True)
            work = list(zip(uniq.tolist(), torch.split(gid_sorted, per_tile.tolist()), strict=True))
            if workers > 1:  # tiles of one chunk are distinct: workers write disjoint parts of `out`
                list(
                    pool.map(
                        lambda item: eval_tile(*item), work, chunksize=max(1, len(work) // (8 * workers))
                    )
                )
            else:
                for item in work:
                    eval_tile(*item)
            if progress is not None:
                progress(c1 / n)

    # On the CPU, tiles run on a pool of single-threaded workers instead of PyTorch's intra-op
    # threads: the per-tile operations are small, and OpenMP's barriers after each one collapse
    # when another process competes for the cores (measured 5x-10x slower on a busy 2-core machine).
    workers = torch.get_num_threads() if device.type == "cpu" else 1
    saved_threads = torch.get_num_threads()
    pool = None
    if workers > 1:
        from concurrent.futures import ThreadPoolExecutor

        pool = ThreadPoolExecutor(max_workers=workers)
        torch.set_num_threads(1)
    try:
        _run_chunks()
    finally:
        if pool is not None:
            pool.shutdown()
            torch.set_num_threads(saved_threads)
    return out
