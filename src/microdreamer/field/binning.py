"""Binning items (Gaussians) into the cells of integer boxes, in bounded chunks.

Shared by the tiled density field (:mod:`microdreamer.field.torch_impl`) and the colour-field bake
(:mod:`microdreamer.texture.field_bake`): each item covers a box of cells ``[first, first + extent)``
per axis; the (item, cell) pairs are enumerated in vectorised form.
"""

from __future__ import annotations

import torch


def chunk_bounds(counts: torch.Tensor, max_items: int) -> list[int]:
    """Split ``range(len(counts))`` into consecutive chunks of at most about ``max_items`` summed counts.

    Args:
        counts: [N] int64 items per element (e.g. (Gaussian, tile) pairs per Gaussian).
        max_items: the budget per chunk; an element holding more than it forms a chunk of its own.
    Returns:
        Boundaries ``[0, b1, ..., N]``: chunk k is ``range(b[k], b[k + 1])``.
    """
    n = counts.numel()
    if n == 0:
        return [0]
    cum = torch.cumsum(counts, 0)
    total = int(cum[-1])
    bounds = [0]
    if total > max_items:
        cuts = torch.arange(max_items, total, max_items, device=counts.device)
        bounds += torch.searchsorted(cum, cuts, right=True).tolist()
    return sorted(set(bounds)) + [n]


def box_cells(
    first: torch.Tensor,
    extent: torch.Tensor,
    dims: tuple[int, int, int],
    start: int = 0,
    stop: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Every cell of the boxes of items ``start..stop``.

    Args:
        first: [N, 3] int64 first cell of each item's box per axis.
        extent: [N, 3] int64 cells per axis (>= 0; 0 = an empty box).
        dims: cells per axis of the grid the linear index refers to.
    Returns:
        (owner [P] int64 item index, cell [P] int64 linear index ``(x * dims[1] + y) * dims[2] + z``),
        ordered by item, then x, y, z.
    """
    stop = first.shape[0] if stop is None else stop
    counts = extent[start:stop].prod(-1)
    device = first.device
    owner = torch.repeat_interleave(torch.arange(start, stop, device=device), counts)
    offset = torch.repeat_interleave(torch.cumsum(counts, 0) - counts, counts)
    local = torch.arange(owner.numel(), device=device) - offset
    e = extent[owner]
    z = first[owner, 2] + local % e[:, 2]
    y = first[owner, 1] + (local // e[:, 2]) % e[:, 1]
    x = first[owner, 0] + local // (e[:, 2] * e[:, 1])
    return owner, (x * dims[1] + y) * dims[2] + z
