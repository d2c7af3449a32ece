"""CUDA kernels of the density field (no public API of their own: :mod:`microdreamer.field` dispatches
here with ``backend="cuda"``).

Layout, like gsplat: ``csrc/`` holds the CUDA sources and the one binding file, :mod:`._backend` builds
and loads them on first GPU use, and this module holds the thin wrappers. The PyTorch references live
in :mod:`microdreamer.field.reference` (float64 brute force) and :mod:`microdreamer.field.torch_impl`
(the vectorised CPU path); the tests compare every kernel with them. Importing this package compiles
nothing and works without a GPU.

Implementations of :func:`extract_fields` (``impl=``):

* ``"fast"``: Gaussians binned to 16 x 16 x (8 * chunks) voxel tiles on the GPU (count, scan, fill),
  one block per tile stages its Gaussians in shared memory; each warp culls them against its
  8 x 4-column footprint and evaluates the survivors column by column, along z with a two-multiply
  recurrence where the Gaussian is wide enough (see ``benchmarks/NOTES_fields.md``). Three variants
  (``variant=``): ``1`` reads the list sizes back to the host (one synchronisation per call) and
  processes lists larger than ``max_list_entries`` in z-slabs; ``2`` bins into one list of fixed
  capacity (``LIST_ENTRIES_PER_GAUSSIAN`` x N, at most ``max_list_entries``) with no host
  synchronisation, caps registers for more resident warps and lets empty tiles exit at once; tiles
  whose entries do not fit scan all N Gaussians (exact, slower), unless ``sized_list`` (the default
  from R = 384 on) reads the number of entries back first (one synchronisation) and bins into a list
  of that size; ``3`` is ``2`` evaluating two z-recurrence Gaussians per warp step (exact mode; in
  upstream mode it is ``2``).
  In exact mode, Gaussians whose cutoff box holds at most ``scatter_voxels`` voxels (small ones, which
  fill the warp footprints poorly) stay out of the lists: after the tiled kernel, a scatter kernel adds
  them with one warp per Gaussian and one lane per column of its box, through global (vector) atomics.
  With ``scatter_precise`` (exact mode), the Gaussians too thin for the float32 column form (the float64
  class) are added the same way in float64, instead of by the tiled kernels' float64 path over their
  boxes (thin discs have boxes far larger than their cutoff ellipsoids); its work is one warp per 256
  columns of a box, listed by the setup kernel (``max_precise_items``).
  Binning never leaves one wide Gaussian to one thread: boxes of more than 16 tiles are counted and listed
  by their whole warp, boxes of more than 128 tiles through a list of 128-tile items that warps all over
  the GPU take (``max_wide_items``).
  Variant 2 can also give a tile several blocks (``splits``): a tile list longer than
  ``split_min_entries`` is cut into up to ``splits`` slices, each evaluated by its own block and added
  into the (zeroed) grid with atomics, so that a few tiles with long lists (wide Gaussians on a coarse
  grid: the real DreamGaussian splats at 128^3) no longer run on a few SMs while the rest idle. With splits
  the scatter kernels need nothing from the binning and add into the same zeroed grid, so by default
  (``overlap``) they run on a second CUDA stream while the tiles are binned and evaluated.
* ``"naive"``: one thread per voxel looping over every Gaussian with an axis-aligned range cull (the
  measured baseline).

Both compute q in float32 in a column form that stays accurate for Gaussians up to a stated
thinness, and in float64 for thinner ones; results agree with the float64 reference to ~1e-6 relative.
Summation order in ``fast`` follows the binning atomics, so repeated runs may differ in the last bits.
"""

from __future__ import annotations

import math

import torch

from microdreamer.field.common import FieldConfig, GridSpec, PreparedGaussians, upstream_block_bounds

__all__ = [
    "extract_fields",
    "gaussian_3d_coeff",
    "default_chunks",
    "default_variant",
    "default_scatter_voxels",
    "default_splits",
    "default_sized_list",
    "default_scatter_precise",
]

IMPLS = ("fast", "naive")
VARIANTS = (1, 2, 3)
MAX_LIST_ENTRIES = 1 << 28  # 1 GiB of int32 list entries (variant 1: per z-slab chunk; 2, 3: in all)
# variants 2 and 3: list capacity per Gaussian; the synthetic object bins ~50 (tile, Gaussian) pairs per
# Gaussian at 512^3 with 16 x 16 x 32 tiles, ~80 with 16 x 16 x 8 (NOTES_fields.md)
LIST_ENTRIES_PER_GAUSSIAN = 96
# exact mode: the float64 scatter's work list holds this many items (256-column slices of thin Gaussians'
# boxes) per Gaussian, plus 65536: at 512^3 pc_guitar lists 0.9 per Gaussian, supersplat_fruit 4.3
# (NOTES_fields.md, round 8); 32 bytes per Gaussian
PRECISE_ITEMS_PER_GAUSSIAN = 4
# fast: the wide-box list (tile boxes of more than 128 tiles, one item per 128 tiles) holds this many items per
# Gaussian, plus 65536: dg_ghost lists 1.2 per Gaussian at 512^3 (NOTES_fields.md, round 8)
WIDE_ITEMS_PER_GAUSSIAN = 4

_tables: dict[tuple, torch.Tensor] = {}


def default_chunks(config: FieldConfig) -> int:
    """8-voxel chunks per thread along z (tile depth 8 * chunks) for this grid and mode: the fastest
    measured on an H200. Exact mode: 4 at every R, with :func:`default_splits` (fields_h200_splits_sweep.json:
    at 128^3 and 256^3 within 11 % of the best setting measured on the synthetic object and within 1.25x
    on every real sample splat, where the previous default, depth 8 with one block per tile, was up to
    3.8x slower; 512^3: fields_h200.json); upstream mode (variant 1): fields_h200_round1.json."""
    r = config.resolution
    if config.mode != "exact":
        return 1 if r <= 160 else 2
    return 4


def default_variant(config: FieldConfig) -> int:
    """The fast kernel's variant used when none is given (see the module docstring): 2 in exact mode, where
    it measured faster than 1 on an H200 (512^3 / 1M: 36.2 against 39.4 ms; 128^3 / 50k with the small
    Gaussians scattered: 0.28-0.30 against 0.33-0.35 ms, benchmarks/results/fields_h200.json), 1 in
    upstream mode (not compared there)."""
    return 2 if config.mode == "exact" else 1


# variants 2, 3: from this grid resolution on, the list is sized from the counts when they overflow the
# fixed capacity (one synchronisation per call, ~1 % of a call there): wide Gaussians at 512^3 (the
# DreamGaussian sample splats) bin 150 or more entries each, past LIST_ENTRIES_PER_GAUSSIAN
SIZED_LIST_MIN_RESOLUTION = 384
SPLIT_TARGET_BLOCKS = 16384  # default_splits: blocks per call to aim for (~124 per SM on an H200)
SPLIT_MIN_ENTRIES = 128  # a split block evaluates at least this many list entries


def default_sized_list(config: FieldConfig) -> bool:
    """Variants 2, 3: size the tile list from the counts (one synchronisation per call) from R =
    SIZED_LIST_MIN_RESOLUTION on, where lists overflow the fixed capacity and a call takes milliseconds."""
    return config.resolution >= SIZED_LIST_MIN_RESOLUTION


def default_splits(config: FieldConfig, chunks: int) -> int:
    """Variant 2: blocks per tile (1: none). Enough that a call has about SPLIT_TARGET_BLOCKS blocks, at most
    16: at tile depth 32, 128^3 grids (256 tiles) get 16, 256^3 8. From R = SIZED_LIST_MIN_RESOLUTION on
    16 as well: there the tiles alone fill the GPU, but a real splat's few long lists do not (512^3 on an
    H200, fields_h200_round7_splits512.json: pc_guitar 1.87 -> 0.84 ms, the synthetic 1M 35.7 -> 34.9 ms,
    the other sample splats within -4 % .. +5 %)."""
    r = config.resolution
    if r >= SIZED_LIST_MIN_RESOLUTION:
        return 16
    tiles = math.ceil(r / 16) ** 2 * math.ceil(r / (8 * chunks))
    return max(1, min(16, SPLIT_TARGET_BLOCKS // tiles))


def default_scatter_voxels(config: FieldConfig) -> int:
    """fast, exact mode: Gaussians whose cutoff box holds at most this many voxels go to the scatter kernel
    instead of the tile lists (0: none; upstream mode never scatters). 16^3: the synthetic object's
    Gaussians at 128^3 (sigma ~1.2 voxels, boxes ~11^3) all scatter, those at 512^3 (~43^3) none."""
    return 4096 if config.mode == "exact" else 0


def default_scatter_precise(config: FieldConfig) -> bool:
    """fast, exact mode: add the float64-class Gaussians with the float64 scatter kernel (upstream mode never
    scatters)."""
    return config.mode == "exact"


def _axis_table(r: int, length: int, device: torch.device) -> torch.Tensor:
    """[length] float32 grid coordinates -1 + 2 k / (R - 1): ``GridSpec.axis`` extended past R - 1."""
    key = ("axis", r, length, str(device))
    if key not in _tables:
        idx = torch.arange(length, dtype=torch.float64)
        _tables[key] = (-1.0 + 2.0 * idx / (r - 1)).to(torch.float32).to(device)
    return _tables[key]


def _block_tables(
    grid: GridSpec, config: FieldConfig, device: torch.device
) -> tuple[int, torch.Tensor, torch.Tensor]:
    key = ("blocks", grid.resolution, config.num_blocks, config.relax_ratio, str(device))
    if key not in _tables:
        t, lower, upper = upstream_block_bounds(grid, config)
        _tables[key] = (t, lower.to(device), upper.to(device))
    return _tables[key]


def extract_fields(
    prepared: PreparedGaussians,
    grid: GridSpec,
    config: FieldConfig,
    impl: str = "fast",
    *,
    out: torch.Tensor | None = None,
    chunks: int | None = None,
    max_list_entries: int = MAX_LIST_ENTRIES,
    variant: int | None = None,
    scatter_voxels: int | None = None,
    splits: int | None = None,
    split_min_entries: int = SPLIT_MIN_ENTRIES,
    sized_list: bool | None = None,
    scatter_precise: bool | None = None,
    max_precise_items: int | None = None,
    max_wide_items: int | None = None,
    overlap: bool = True,
) -> torch.Tensor:
    """Density field of prepared Gaussians on the GPU (semantics: :mod:`microdreamer.field.common`).

    Args:
        prepared: N Gaussians on one CUDA device (means [N, 3], opacities [N], transforms [N, 3, 3],
            radii [N, 3], float32, contiguous).
        grid: the sampling grid (R = grid.resolution).
        config: mode and its parameters.
        impl: ``"fast"`` (tiled) or ``"naive"`` (one thread per voxel).
        out: optional [R, R, R] float32 CUDA tensor to write into (every voxel is written).
        chunks: fast: 8-voxel chunks per thread along z, 1, 2 or 4 (4: exact mode only); default
            :func:`default_chunks`.
        max_list_entries: fast: (tile, Gaussian) pairs binned at once; variant 1 processes more in
            z-slabs, variants 2 and 3 let the tiles past it scan every Gaussian.
        variant: fast: 1, 2 or 3 (see the module docstring); default :func:`default_variant`.
        scatter_voxels: fast, exact mode: Gaussians with at most this many voxels in their cutoff box are
            added by the scatter kernel (0: none); default :func:`default_scatter_voxels`.
        splits: fast, variant 2: blocks per tile (1: one block per tile; more: long tile lists are cut into
            that many slices, evaluated by separate blocks and added with atomics); default
            :func:`default_splits`. Other variants ignore it.
        split_min_entries: fast, variant 2: fewest list entries per slice when a list is cut.
        sized_list: fast, variants 2 and 3: read the number of list entries back (one synchronisation) and
            grow the list to it when the fixed capacity is too small (up to ``max_list_entries``); default
            :func:`default_sized_list`.
        scatter_precise: fast, exact mode: the Gaussians too thin for the float32 column form are added by
            the float64 scatter kernel rather than the tiled kernels; default
            :func:`default_scatter_precise`.
        max_precise_items: fast, exact mode: capacity of the float64 scatter's work list (one item per 256
            columns of a thin Gaussian's box); the Gaussians whose items do not fit stay with the tiled
            kernels' float64 path. Default ``PRECISE_ITEMS_PER_GAUSSIAN`` x N + 65536.
        max_wide_items: fast: capacity of the wide-box list (tile boxes of more than 128 tiles, one item per 128
            tiles, binned by warps all over the GPU); the Gaussians whose items do not fit are binned by their
            own warp. Default ``WIDE_ITEMS_PER_GAUSSIAN`` x N + 65536.
        overlap: fast, variant 2 with splits > 1 (exact mode): run the scatter kernels on a second CUDA stream,
            concurrently with the tiles' binning and the tiled kernel (every kernel then adds into the zeroed
            grid); the call's stream waits for both before it returns. False: one stream, the scatter kernels
            after the tiled kernel.
    Returns:
        [R, R, R] float32 on the Gaussians' device; [i, j, k] is the point (axis[i], axis[j], axis[k]).
    Raises:
        RuntimeError: the Gaussians are not on a CUDA device, or the kernels cannot be built.
    """
    if impl not in IMPLS:
        raise ValueError(f"unknown kernel implementation {impl!r}; use one of {', '.join(IMPLS)}")
    variant = variant or default_variant(config)
    if variant not in VARIANTS:
        raise ValueError(f"unknown fast-kernel variant {variant!r}; use one of 1, 2, 3")
    device = prepared.means.device
    if device.type != "cuda":
        raise RuntimeError(
            f"microdreamer.kernels.extract_fields needs the Gaussians on a CUDA device, got {device}; "
            "use backend='torch' on the CPU"
        )
    from microdreamer.kernels import _backend

    ext = _backend.load()
    r = grid.resolution
    exact = config.mode == "exact"
    chunks = chunks or default_chunks(config)
    if scatter_voxels is None:
        scatter_voxels = default_scatter_voxels(config)
    if scatter_voxels < 0:
        raise ValueError(f"scatter_voxels must be >= 0, got {scatter_voxels}")
    for name, value in (("max_precise_items", max_precise_items), ("max_wide_items", max_wide_items)):
        if value is not None and value < 0:
            raise ValueError(f"{name} must be >= 0, got {value}")
    if splits is None:
        splits = default_splits(config, chunks)
    if sized_list is None:
        sized_list = default_sized_list(config)
    if not 1 <= splits <= 64 or split_min_entries < 1:
        raise ValueError(
            f"splits must be in [1, 64] and split_min_entries >= 1, got {splits} and {split_min_entries}"
        )
    tz = 8 * chunks
    length = max(math.ceil(r / 16) * 16, math.ceil(r / tz) * tz) + 8
    axis = _axis_table(r, length, device)
    if exact:
        key = ("no-blocks", str(device))  # exact mode has no blocks: placeholders the binding ignores
        if key not in _tables:
            _tables[key] = torch.zeros(1, dtype=torch.float64, device=device)
        t, lower, upper = 1, _tables[key], _tables[key]
    else:
        t, lower, upper = _block_tables(grid, config, device)
    # out=None: the binding allocates the grid
    return ext.extract_fields(
        prepared.means, prepared.opacities, prepared.transforms, prepared.radii, axis, lower, upper, out, r,
        exact, float(config.cutoff_sq), float(config.cutoff_tol), int(t), impl, int(chunks), int(max_list_entries),
        int(variant), int(max(LIST_ENTRIES_PER_GAUSSIAN * len(prepared), 1 << 16)), int(scatter_voxels),
        int(splits), int(split_min_entries), bool(sized_list),
        bool(default_scatter_precise(config) if scatter_precise is None else scatter_precise),
        int(PRECISE_ITEMS_PER_GAUSSIAN * len(prepared) + (1 << 16) if max_precise_items is None else max_precise_items),
        int(WIDE_ITEMS_PER_GAUSSIAN * len(prepared) + (1 << 16) if max_wide_items is None else max_wide_items),
        bool(overlap),
    )  # fmt: skip


def gaussian_3d_coeff(xyzs: torch.Tensor, covs: torch.Tensor) -> torch.Tensor:
    """Fused ``gaussian_3d_coeff`` (DreamGaussian semantics, see the PyTorch version in
    :func:`microdreamer.field.reference.gaussian_3d_coeff`).

    Args:
        xyzs: [M, 3] float32 or float64 offsets x - mu.
        covs: [M, 6] covariances (S00, S01, S02, S11, S12, S22), same dtype and device.
    Returns:
        [M] ``exp(-0.5 d^T Sigma^-1 d)`` (0 where the exponent is positive), same dtype. On CUDA one
        elementwise kernel, evaluated in float64 and rounded once; on the CPU the PyTorch version.
    """
    if not xyzs.is_cuda:
        from microdreamer.field.reference import gaussian_3d_coeff as reference

        return reference(xyzs, covs)
    from microdreamer.kernels import _backend

    return _backend.load().gaussian_3d_coeff(xyzs.contiguous(), covs.contiguous())
