"""The density field on a CUDA device: the fused kernels of :mod:`microdreamer.kernels`, their options
and the policy that picks them for a grid.

:func:`extract_fields` is what :func:`microdreamer.field.density_field` runs with ``backend="cuda"``.
:class:`CudaFieldOptions` holds every tuning knob of the kernels; a field left None takes the policy's
value for the grid and mode (:meth:`CudaFieldOptions.resolve`). Each rule below is the fastest setting
measured on an H200 (``benchmarks/bench_fields.py``, results in ``benchmarks/results/fields_h200.json``;
the alternatives tried are listed in ``benchmarks/README.md``).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from microdreamer.config import FieldConfig
from microdreamer.field.common import GridSpec, PreparedGaussians, upstream_block_bounds

IMPLS = ("fast", "naive")
VARIANTS = (1, 2)
#: (tile, Gaussian) list entries binned at once: 1 GiB of int32 (variant 1: per z-slab chunk; 2: in all)
MAX_LIST_ENTRIES = 1 << 28
#: variant 2's fixed list capacity per Gaussian: the synthetic object bins ~50 (tile, Gaussian) pairs per
#: Gaussian at 512^3 with 16 x 16 x 32 tiles, ~80 with 16 x 16 x 8
LIST_ENTRIES_PER_GAUSSIAN = 96
#: exact mode: the float64 scatter's work-list items (256-column slices of thin Gaussians' boxes) per
#: Gaussian, plus 65536 (the sample splats list 0.9-4.3 per Gaussian at 512^3); 32 bytes each
PRECISE_ITEMS_PER_GAUSSIAN = 4
#: the wide-box list's items (tile boxes of more than 128 tiles, one item per 128 tiles) per Gaussian, plus
#: 65536 (the DreamGaussian samples list 1.2 per Gaussian at 512^3)
WIDE_ITEMS_PER_GAUSSIAN = 4
#: from this grid resolution on, variant 2 sizes its list from the counts (one synchronisation, ~1 % of a
#: call there): wide Gaussians at 512^3 bin 150 or more entries each, past the fixed capacity
SIZED_LIST_MIN_RESOLUTION = 384
#: splits: blocks per call to aim for (~124 per SM on an H200)
SPLIT_TARGET_BLOCKS = 16384
#: splits: a slice of a cut tile list holds at least this many entries
SPLIT_MIN_ENTRIES = 128


@dataclass
class CudaFieldOptions:
    """Tuning of the CUDA density field; None = the policy's value for the grid (see the properties).

    Attributes:
        impl: ``"fast"`` (tiled) or ``"naive"`` (one thread per voxel, the baseline).
        chunks: fast: 8-voxel chunks per thread along z: 1, 2, or 4 in exact mode.
        variant: fast: 1 (host-sized lists, z-slabs) or 2 (one list, no host synchronisation).
        scatter_voxels: fast, exact mode: Gaussians with at most this many voxels in their cutoff box are
            added by the scatter kernel (0: none).
        splits: fast, variant 2: blocks per tile (1: none; more: long tile lists cut into that many slices
            evaluated by separate blocks and added with atomics).
        split_min_entries: fast, variant 2: fewest list entries per slice.
        sized_list: fast, variant 2: read the number of entries back (one synchronisation) and size the
            list to it when the fixed capacity is too small (up to ``max_list_entries``).
        scatter_precise: fast, exact mode: Gaussians too thin for the float32 column form are added by the
            float64 scatter kernel rather than the tiled kernels' float64 path.
        max_list_entries: fast: (tile, Gaussian) pairs binned at once; variant 1 processes more in z-slabs,
            variant 2 lets the tiles past it scan every Gaussian.
        max_precise_items: fast, exact mode: capacity of the float64 scatter's work list (the Gaussians whose
            items do not fit stay with the tiled kernels' float64 path).
        max_wide_items: fast: capacity of the wide-box list (the Gaussians whose items do not fit are binned
            by their own warp).
        overlap: fast, variant 2 with splits, exact mode: run the scatter kernels on a second stream,
            concurrently with the tiles' binning and evaluation; the call's stream waits for both.
    """

    impl: str = "fast"
    chunks: int | None = None
    variant: int | None = None
    scatter_voxels: int | None = None
    splits: int | None = None
    split_min_entries: int = SPLIT_MIN_ENTRIES
    sized_list: bool | None = None
    scatter_precise: bool | None = None
    max_list_entries: int = MAX_LIST_ENTRIES
    max_precise_items: int | None = None
    max_wide_items: int | None = None
    overlap: bool = True

    def __post_init__(self) -> None:
        if self.impl not in IMPLS:
            raise ValueError(f"unknown kernel implementation {self.impl!r}; use one of {', '.join(IMPLS)}")
        if self.variant is not None and self.variant not in VARIANTS:
            raise ValueError(f"unknown fast-kernel variant {self.variant!r}; use 1 or 2")
        for name in ("scatter_voxels", "max_precise_items", "max_wide_items"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}")
        if self.splits is not None and not 1 <= self.splits <= 64:
            raise ValueError(f"splits must be in [1, 64], got {self.splits}")
        if self.split_min_entries < 1:
            raise ValueError(f"split_min_entries must be >= 1, got {self.split_min_entries}")

    def resolve(self, config: FieldConfig, n: int) -> CudaFieldOptions:
        """These options with every None replaced by the policy's value for ``config`` and N Gaussians."""
        exact = config.mode == "exact"
        chunks = self.chunks or default_chunks(config)
        return dataclasses.replace(
            self,
            chunks=chunks,
            variant=self.variant or (2 if exact else 1),
            # 16^3: the synthetic object's Gaussians at 128^3 (sigma ~1.2 voxels, boxes ~11^3) all scatter,
            # those at 512^3 (~43^3) none
            scatter_voxels=(4096 if exact else 0) if self.scatter_voxels is None else self.scatter_voxels,
            splits=self.splits or default_splits(config, chunks),
            sized_list=config.resolution >= SIZED_LIST_MIN_RESOLUTION
            if self.sized_list is None
            else self.sized_list,
            scatter_precise=exact if self.scatter_precise is None else self.scatter_precise,
            max_precise_items=PRECISE_ITEMS_PER_GAUSSIAN * n + (1 << 16)
            if self.max_precise_items is None
            else self.max_precise_items,
            max_wide_items=WIDE_ITEMS_PER_GAUSSIAN * n + (1 << 16)
            if self.max_wide_items is None
            else self.max_wide_items,
        )


def default_chunks(config: FieldConfig) -> int:
    """Tile depth in 8-voxel chunks: 4 in exact mode at every R (with :func:`default_splits`: within 11 % of
    the best setting on the synthetic object at 128^3 and 256^3, within 1.25x on every sample splat);
    upstream mode: 1 up to R = 160, else 2."""
    if config.mode != "exact":
        return 1 if config.resolution <= 160 else 2
    return 4


def default_splits(config: FieldConfig, chunks: int) -> int:
    """Variant 2's blocks per tile: enough that a call has about SPLIT_TARGET_BLOCKS blocks, at most 16 (at
    tile depth 32, 128^3 grids get 16, 256^3 8). From R = SIZED_LIST_MIN_RESOLUTION on 16 too: the tiles
    alone fill the GPU there, but a real splat's few long lists do not (pc_guitar at 512^3: 1.87 -> 0.84
    ms)."""
    r = config.resolution
    if r >= SIZED_LIST_MIN_RESOLUTION:
        return 16
    tiles = math.ceil(r / 16) ** 2 * math.ceil(r / (8 * chunks))
    return max(1, min(16, SPLIT_TARGET_BLOCKS // tiles))


_tables: dict[tuple, object] = {}


def _axis_table(r: int, length: int, device: torch.device) -> torch.Tensor:
    """[length] float32 grid coordinates -1 + 2 k / (R - 1): ``GridSpec.axis`` extended past R - 1."""
    key = ("axis", r, length, str(device))
    if key not in _tables:
        idx = torch.arange(length, dtype=torch.float64)
        _tables[key] = (-1.0 + 2.0 * idx / (r - 1)).to(torch.float32).to(device)
    return _tables[key]


def _block_tables(grid: GridSpec, config: FieldConfig, device: torch.device):
    """upstream: (voxels per block, lower [B], upper [B] float64) on ``device``; exact mode: placeholders."""
    if config.mode == "exact":
        key = ("no-blocks", str(device))
        if key not in _tables:
            placeholder = torch.zeros(1, dtype=torch.float64, device=device)
            _tables[key] = (1, placeholder, placeholder)
        return _tables[key]
    key = ("blocks", grid.resolution, config.num_blocks, config.relax_ratio, str(device))
    if key not in _tables:
        t, lower, upper = upstream_block_bounds(grid, config)
        _tables[key] = (t, lower.to(device), upper.to(device))
    return _tables[key]


def extract_fields(
    prepared: PreparedGaussians,
    grid: GridSpec,
    config: FieldConfig,
    options: CudaFieldOptions | None = None,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Density field of prepared Gaussians on their CUDA device (semantics: :mod:`microdreamer.field.common`).

    Args:
        prepared: N Gaussians on one CUDA device (means [N, 3], opacities [N], transforms [N, 3, 3],
            radii [N, 3], float32, contiguous).
        grid: the sampling grid (R = grid.resolution).
        config: mode and its parameters.
        options: the kernels' tuning (None: the policy's defaults).
        out: optional [R, R, R] float32 CUDA tensor to write into (every voxel is written).

    Returns:
        [R, R, R] float32 on the Gaussians' device; [i, j, k] is the point (axis[i], axis[j], axis[k]).

    Raises:
        RuntimeError: the Gaussians are not on a CUDA device, or the kernels cannot be built.
    """
    from microdreamer import kernels

    device = prepared.means.device
    if device.type != "cuda":
        raise RuntimeError(
            f"the CUDA density field needs the Gaussians on a CUDA device, got {device}; use backend='torch'"
        )
    n = len(prepared)
    o = (options or CudaFieldOptions()).resolve(config, n)
    r = grid.resolution
    tz = 8 * o.chunks
    length = max(math.ceil(r / 16) * 16, math.ceil(r / tz) * tz) + 8
    t, lower, upper = _block_tables(grid, config, device)
    return kernels.extract_fields(
        prepared.means, prepared.opacities, prepared.transforms, prepared.radii, _axis_table(r, length, device),
        lower, upper, out, r, config.mode == "exact", config.cutoff_sq, config.cutoff_tol, t, o.impl, o.chunks,
        o.max_list_entries, o.variant, max(LIST_ENTRIES_PER_GAUSSIAN * n, 1 << 16), o.scatter_voxels, o.splits,
        o.split_min_entries, o.sized_list, o.scatter_precise, o.max_precise_items, o.max_wide_items, o.overlap,
    )  # fmt: skip
