"""The density field from the C++ CPU kernels (:func:`microdreamer.kernels.cpu.field_scatter`).

Each Gaussian is scattered into the voxels of its box, the same boxes and rules as the PyTorch path
(:mod:`microdreamer.field.torch_impl`, whose tiles are these boxes rounded out): exact mode, the voxels
its cutoff box reaches, kept where ``q <= min(c^2, 174)``; upstream mode, the voxels of the blocks whose
grown box holds its centre, kept where ``q <= 174`` (``exp(-87)`` is below float32's smallest normal).
``q = |M (x - mean)|^2`` in float64, the exponential and the sums in float32, every voxel's terms added
in Gaussian order: the result does not depend on the number of threads. Only the work differs: no
voxel of a tile outside a Gaussian's box, and along each grid row only the interval where ``q`` can be
under the limit.
"""

from __future__ import annotations

import torch

from microdreamer.field.common import FieldConfig, GridSpec, PreparedGaussians, upstream_block_bounds
from microdreamer.field.torch_impl import _Q_MAX, _tile_ranges_upstream, exact_voxel_ranges


def voxel_boxes(prepared: PreparedGaussians, grid: GridSpec, config: FieldConfig) -> torch.Tensor:
    """[N, 3, 2] int64 first and last voxel per axis each Gaussian may reach under the mode's rule
    (last < first: none)."""
    r = grid.resolution
    if config.mode == "upstream":
        block, lower, upper = upstream_block_bounds(grid, config)
        first, last = _tile_ranges_upstream(prepared, lower, upper)
        lo = first * block
        hi = torch.minimum((last + 1) * block - 1, torch.full_like(last, r - 1))
        hi = torch.where(last < first, lo - 1, hi)
    else:
        lo, hi, empty = exact_voxel_ranges(prepared, grid)
        lo, hi = lo.long(), hi.long()
        hi = torch.where(empty, lo - 1, hi)
    return torch.stack([lo, hi], dim=-1).contiguous()


def density_field_cpp(
    prepared: PreparedGaussians, grid: GridSpec, config: FieldConfig, workers: int | None = None
) -> torch.Tensor:
    """[R, R, R] float32 density field on the CPU (index [i, j, k] is (axis[i], axis[j], axis[k])).

    Args:
        prepared: the kept Gaussians (CPU tensors).
        grid: the sampling grid; config: the mode and its parameters.
        workers: threads (None: ``torch.get_num_threads()``).
    """
    from microdreamer.kernels import cpu

    if prepared.means.device.type != "cpu":
        raise ValueError("the C++ field backend needs the Gaussians on the CPU")
    r = grid.resolution
    out = torch.zeros(r, r, r, dtype=torch.float32)
    if len(prepared) == 0:
        return out
    limit = min(config.cutoff_sq, _Q_MAX) if config.mode == "exact" else _Q_MAX
    return cpu.field_scatter(
        prepared.means.double().contiguous(),
        prepared.transforms.double().contiguous(),
        prepared.opacities.float().contiguous(),
        voxel_boxes(prepared, grid, config),
        grid.axis().double().contiguous(),
        limit,
        out,
        workers=torch.get_num_threads() if workers is None else workers,
    )
