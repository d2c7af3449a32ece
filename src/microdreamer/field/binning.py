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
    device = first.device
    # one axis at a time, with no integer division: entries (item, x), then (item, x, y), then cells;
    # each entry expands into the cells of its box along the next axis, in order
    owner = torch.arange(start, stop, device=device)
    item = owner - start  # row of first / extent
    cell = torch.zeros_like(owner)
    f, e = first[start:stop], extent[start:stop]
    for axis in range(3):
        cnt = e[:, axis].index_select(0, item)
        base = cell * dims[axis] + f[:, axis].index_select(0, item)
        if bool((cnt == 1).all()):
            cell = base
            continue
        total = int(cnt.sum())
        rep = torch.repeat_interleave(torch.arange(cnt.numel(), device=device), cnt, output_size=total)
        local = torch.arange(total, device=device) - (torch.cumsum(cnt, 0) - cnt).index_select(0, rep)
        cell = base.index_select(0, rep) + local
        owner, item = owner.index_select(0, rep), item.index_select(0, rep)
    return owner, cell
