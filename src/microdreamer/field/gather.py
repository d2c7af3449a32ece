"""The exact field of Gaussians on a small cubic grid, each voxel's terms added in Gaussian order: what a
scene's tile computes (:mod:`microdreamer.scene.tiles`).

``out[i, j, k] += o_g * exp(-q_g / 2)`` for every Gaussian ``g``, in index order, whose box holds
``(i, j, k)`` and whose ``q_g = |M_g (x - mu_g)|^2 <= limit`` at ``x = (axis[i], axis[j], axis[k])``: q in
float64 (no fused multiply-add), the term and the sum in float32. Three implementations (``backend``):

* ``"cpp"``: :func:`microdreamer.kernels.cpu.field_scatter` (CPU threads owning slabs of the grid).
* ``"cuda"``: :func:`microdreamer.kernels.field_gather` (one thread per voxel adds the Gaussians of its
  8^3 brick one by one, from a list in index order: no atomics).
* ``"torch"``: :func:`field_gather_reference`, PyTorch on any device (the (Gaussian, voxel) pairs sorted
  by voxel and added in rounds of one term per voxel); the reference the kernels are tested against.

Each sums a voxel's terms in index order, so a sample depends only on the Gaussians whose boxes hold its
point, in order: a scene tile's samples are the whole grid's, bit for bit, on every run. The three differ
from one another only in the exponential's rounding: the C++ kernel uses the C library's ``expf``, the
CUDA kernel and the reference the float64 exponential rounded once to float32.
"""

from __future__ import annotations

import torch

BACKENDS = ("cpp", "cuda", "torch")
#: voxels per brick side of the CUDA kernel's lists (``kBrick`` in ``csrc/gather.h``)
BRICK = 8


def _clipped_box(box: torch.Tensor, r: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(first [N, 3], last [N, 3], valid [N]) of each box clipped to ``0 .. r - 1``."""
    lo = box[..., 0].clamp_min(0)
    hi = box[..., 1].clamp_max(r - 1)
    return lo, hi, (hi >= lo).all(-1)


def _box_offsets(ext: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For boxes of ``ext`` [N, 3] cells (0 allowed): (owner [P] int64, cell [P, 3] int64 within the box) of
    every cell, the boxes in order, each row-major (z fastest)."""
    count = ext.prod(-1)
    owner = torch.repeat_interleave(torch.arange(ext.shape[0], device=ext.device), count)
    offset = torch.arange(owner.numel(), device=ext.device) - torch.repeat_interleave(
        torch.cumsum(count, 0) - count, count
    )
    e = ext[owner]
    cell = torch.stack([offset // (e[:, 2] * e[:, 1]), (offset // e[:, 2]) % e[:, 1], offset % e[:, 2]], -1)
    return owner, cell


def brick_lists(box: torch.Tensor, r: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The CUDA kernel's lists: every Gaussian in each :data:`BRICK`^3 brick its box touches.

    Args:
        box: [N, 3, 2] int64 first and last voxel per axis (inclusive; clipped to the grid here).
        r: R, points a side.

    Returns:
        ``(brick_start [B^3 + 1] int64, brick_list [M] int32)`` on ``box``'s device, B = ceil(R / 8): brick
        ``(a, b, c)`` (number ``(a B + b) B + c``) lists ``brick_list[brick_start[t] : brick_start[t + 1]]``,
        Gaussian indices ascending.
    """
    b = -(-r // BRICK)
    lo, hi, valid = _clipped_box(box, r)
    first = torch.div(lo, BRICK, rounding_mode="floor")
    ext = torch.where(valid[:, None], torch.div(hi, BRICK, rounding_mode="floor") - first + 1, 0)
    owner, cell = _box_offsets(ext)
    brick = first[owner] + cell
    key = (brick[:, 0] * b + brick[:, 1]) * b + brick[:, 2]
    order = torch.argsort(key, stable=True)
    start = torch.zeros(b**3 + 1, dtype=torch.int64, device=box.device)
    start[1:] = torch.cumsum(torch.bincount(key, minlength=b**3), 0)
    return start, owner[order].int().contiguous()


def field_gather_reference(
    means: torch.Tensor,
    transforms: torch.Tensor,
    opacities: torch.Tensor,
    box: torch.Tensor,
    axis: torch.Tensor,
    limit: float,
    out: torch.Tensor,
    max_pairs: int = 1 << 22,
) -> torch.Tensor:
    """:func:`field_gather` in PyTorch (module docstring), on the tensors' device; ``max_pairs`` (Gaussian,
    voxel) pairs at once (about 100 bytes each), consecutive Gaussians together. Shapes as
    :func:`field_gather`'s."""
    n, r = means.shape[0], axis.shape[0]
    if n == 0 or r == 0:
        return out
    lo, hi, valid = _clipped_box(box, r)
    ext = torch.where(valid[:, None], hi - lo + 1, 0)
    ends = torch.cumsum(ext.prod(-1), 0).cpu()
    flat = out.view(-1)
    g0 = 0
    while g0 < n:
        base = int(ends[g0 - 1]) if g0 else 0
        g1 = max(g0 + 1, int(torch.searchsorted(ends, base + max_pairs, right=True)))
        owner, cell = _box_offsets(ext[g0:g1])
        g = owner + g0
        idx = lo[g] + cell
        m = transforms[g]
        d = axis[idx] - means[g]  # [P, 3] exact per axis, as the kernels subtract
        dx, dy, dz = d.unbind(-1)
        u = [m[:, a, 0] * dx + m[:, a, 1] * dy + m[:, a, 2] * dz for a in range(3)]
        q = u[0] * u[0] + u[1] * u[1] + u[2] * u[2]
        keep = q <= limit
        x = (q[keep].float() * -0.5).double()
        term = opacities[g[keep]] * torch.exp(x).float()
        voxel = (idx[keep, 0] * r + idx[keep, 1]) * r + idx[keep, 2]
        # one term per voxel a round, each voxel's terms in Gaussian order
        order = torch.argsort(voxel, stable=True)
        voxel, term = voxel[order], term[order]
        first = torch.ones_like(voxel, dtype=torch.bool)
        first[1:] = voxel[1:] != voxel[:-1]
        starts = torch.nonzero(first).flatten()
        seg = torch.cumsum(first.long(), 0) - 1
        rank = torch.arange(voxel.numel(), device=voxel.device) - starts[seg]
        by_rank = torch.argsort(rank, stable=True)
        counts = torch.bincount(rank).cpu().tolist() if rank.numel() else []
        at = 0
        for c in counts:
            sel = by_rank[at : at + c]
            v = voxel[sel]
            flat[v] = flat[v] + term[sel]
            at += c
        g0 = g1
    return out


def field_gather(
    means: torch.Tensor,
    transforms: torch.Tensor,
    opacities: torch.Tensor,
    box: torch.Tensor,
    axis: torch.Tensor,
    limit: float,
    out: torch.Tensor,
    backend: str = "cpp",
    lists: tuple[torch.Tensor, torch.Tensor] | None = None,
    workers: int | None = None,
) -> torch.Tensor:
    """Add the exact field of N Gaussians to ``out`` (module docstring), every voxel's terms in index order.

    Args:
        means: [N, 3] float64; transforms: [N, 3, 3] float64 whitening transforms M,
            ``q = |M (x - mean)|^2``; opacities: [N] float32.
        box: [N, 3, 2] int64 first and last voxel per axis (inclusive; clipped to the grid here; last <
            first: none).
        axis: [R] float64 grid coordinates along every axis (evenly spaced, ascending).
        limit: terms with q above it are dropped.
        out: [R, R, R] float32, added to in place ([i, j, k] is (axis[i], axis[j], axis[k])).
        backend: ``"cpp"`` (CPU tensors), ``"cuda"`` (CUDA tensors) or ``"torch"`` (any device).
        lists: cuda: :func:`brick_lists` of ``box`` made before (several calls on the same boxes share them).
        workers: cpp: threads (default: torch's).

    Returns:
        ``out``.
    """
    if backend == "cpp":
        from microdreamer.kernels import cpu

        threads = torch.get_num_threads() if workers is None else workers
        return cpu.field_scatter(means, transforms, opacities, box, axis, limit, out, workers=threads)
    if backend == "torch":
        return field_gather_reference(means, transforms, opacities, box, axis, limit, out)
    if backend != "cuda":
        raise ValueError(f"unknown field backend {backend!r}; use one of {', '.join(BACKENDS)}")
    from microdreamer import kernels

    if means.shape[0] == 0 or axis.shape[0] == 0:
        return out
    start, order = lists if lists is not None else brick_lists(box, axis.shape[0])
    kernels.field_gather(means, transforms, opacities, box, axis, limit, out, start, order)
    return out


def field_gather_channels(
    means: torch.Tensor,
    transforms: torch.Tensor,
    weights: torch.Tensor,
    box: torch.Tensor,
    axis: torch.Tensor,
    limit: float,
    out: torch.Tensor,
    backend: str = "cpp",
    lists: tuple[torch.Tensor, torch.Tensor] | None = None,
    workers: int | None = None,
) -> torch.Tensor:
    """:func:`field_gather` of C weights a Gaussian into C grids: ``out[c]`` is what :func:`field_gather`
    with ``weights[:, c]`` gives (the cpp backend computes each term's exponential once for all C; the
    others run one :func:`field_gather` a channel).

    Args:
        weights: [N, C] float32; out: [C, R, R, R] float32, added to in place; the rest as
            :func:`field_gather`'s.

    Returns:
        ``out``.
    """
    if weights.dim() != 2 or out.dim() != 4 or out.shape[0] != weights.shape[1]:
        raise ValueError(
            f"weights must be [N, C] and out [C, R, R, R], got {list(weights.shape)} and {list(out.shape)}"
        )
    if backend == "cpp":
        from microdreamer.kernels import cpu

        threads = torch.get_num_threads() if workers is None else workers
        return cpu.field_scatter_channels(means, transforms, weights, box, axis, limit, out, workers=threads)
    for c in range(weights.shape[1]):
        field_gather(means, transforms, weights[:, c].contiguous(), box, axis, limit, out[c], backend, lists)
    return out
