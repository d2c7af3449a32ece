"""CUDA kernels of the density field: sources (``csrc/``), their loader (:mod:`._backend`) and thin
wrappers. Tensors and plain numbers in, tensors out; nothing here imports the rest of microdreamer. What
the arguments mean, the defaults and the choice between implementations live in
:mod:`microdreamer.field.cuda`, which calls these wrappers; the PyTorch references they are tested against
are :mod:`microdreamer.field.reference` (float64 brute force) and :mod:`microdreamer.field.torch_impl`.
Importing this package compiles nothing and works without a GPU.

``csrc/cpu/`` holds the C++ CPU kernels (plain C functions, built with the system's compiler and loaded
with ctypes by :mod:`._cpu_backend`; wrappers in :mod:`.cpu`): the density field's ``"cpp"`` backend, the
Gaussian rasteriser's forward pass (render backend ``"cpp"``), the bake's back-projection and mesh depth
raster, and the UV packer's skyline loop. ``csrc/carve.cu`` holds silhouette carving's projected alpha
(:func:`carve_alpha`; its PyTorch path and the semantics are in :mod:`microdreamer.field.carve`).
``csrc/gather.cu`` holds the exact field of a scene's tile as a deterministic per-voxel gather
(:func:`field_gather`; its PyTorch reference and the semantics are in :mod:`microdreamer.field.gather`).

The field kernels (``csrc/fields.cu``):

* ``"fast"``: Gaussians binned to 16 x 16 x (8 * chunks) voxel tiles on the GPU (count, scan, fill), one
  block per tile stages its Gaussians in shared memory; each warp culls them against its 8 x 4-column
  footprint and evaluates the survivors column by column, along z with a two-multiply recurrence where
  the Gaussian is wide enough. Variant 1 reads the list sizes back to the host (one synchronisation) and
  processes long lists in z-slabs; variant 2 bins into one list of fixed capacity with no host
  synchronisation (or, with ``sized_list``, of the size the counts give), and can cut long tile lists into
  slices evaluated by separate blocks (``splits``). In exact mode, small Gaussians skip the lists and are
  added by a scatter kernel (one warp per Gaussian, one lane per column, vector atomics), and Gaussians too
  thin for the float32 column form by a float64 scatter kernel; with splits both run on a second stream
  while the tiles are binned and evaluated (``overlap``). Boxes of more than 16 tiles are binned by a whole
  warp, of more than 128 tiles through a list of 128-tile items that warps all over the GPU take.
* ``"naive"``: one thread per voxel looping over every Gaussian with an axis-aligned range cull (the
  measured baseline).

Both compute q in float32 in a column form that stays accurate for Gaussians up to a stated thinness, and
in float64 for thinner ones. Summation order in ``fast`` follows the binning atomics, so repeated runs may
differ in the last bits. The design and its measurements: ``benchmarks/README.md``.
"""

from __future__ import annotations

import torch

__all__ = ["carve_alpha", "extract_fields", "field_gather"]


def extract_fields(
    means: torch.Tensor,
    opacities: torch.Tensor,
    transforms: torch.Tensor,
    radii: torch.Tensor,
    axis: torch.Tensor,
    lower: torch.Tensor,
    upper: torch.Tensor,
    out: torch.Tensor | None,
    resolution: int,
    exact: bool,
    cutoff_sq: float,
    cutoff_tol: float,
    block_voxels: int,
    impl: str,
    chunks: int,
    max_list_entries: int,
    variant: int,
    list_capacity: int,
    scatter_voxels: int,
    splits: int,
    split_min_entries: int,
    sized_list: bool,
    scatter_precise: bool,
    precise_capacity: int,
    wide_capacity: int,
    overlap: bool,
) -> torch.Tensor:
    """The density field of N Gaussians on an R^3 grid, on their CUDA device (the binding checks every
    input: device, dtype, contiguity, shapes).

    Args:
        means: [N, 3] float32, normalised grid coordinates.
        opacities: [N] float32.
        transforms: [N, 3, 3] float32 whitening transforms M (q = |M (x - mean)|^2).
        radii: [N, 3] float32 half-extents of each exact-mode cutoff box.
        axis: [>= max(16 ceil(R / 16), 8 chunks ceil(R / (8 chunks)))] float32 grid coordinates.
        lower, upper: [B] float64 upstream block bounds per axis (exact mode: any [1] float64 tensor).
        out: optional [R, R, R] float32 to write (every voxel is written); None allocates it.
        resolution: R. exact: exact mode (else upstream's block rule).
        cutoff_sq, cutoff_tol: the exact mode's c^2 and its tolerance.
        block_voxels: upstream: voxels per block side.
        impl: "fast" or "naive". chunks: 8-voxel chunks per thread along z (1, 2, or 4 in exact mode).
        max_list_entries: most (tile, Gaussian) entries binned at once.
        variant: 1 or 2. list_capacity: variant 2's fixed list capacity.
        scatter_voxels: exact: Gaussians with at most this many voxels in their box are scattered.
        splits, split_min_entries: variant 2: blocks per tile, fewest entries per slice.
        sized_list: variant 2: size the list from the counts (one synchronisation).
        scatter_precise: exact: the float64 class is scattered in float64.
        precise_capacity, wide_capacity: capacities of the float64 scatter's and the wide boxes' work lists.
        overlap: run the scatter kernels on a second stream (variant 2 with splits).

    Returns:
        [R, R, R] float32; [i, j, k] is the point (axis[i], axis[j], axis[k]).
    """
    from microdreamer.kernels import _backend

    return _backend.load().extract_fields(
        means, opacities, transforms, radii, axis, lower, upper, out, int(resolution), bool(exact),
        float(cutoff_sq), float(cutoff_tol), int(block_voxels), str(impl), int(chunks), int(max_list_entries),
        int(variant), int(list_capacity), int(scatter_voxels), int(splits), int(split_min_entries),
        bool(sized_list), bool(scatter_precise), int(precise_capacity), int(wide_capacity), bool(overlap),
    )  # fmt: skip


def carve_alpha(
    precision: torch.Tensor,
    offset: torch.Tensor,
    box: torch.Tensor,
    opacity: torch.Tensor,
    sums: torch.Tensor,
    v_size: int,
) -> None:
    """Add the log-transmittance terms of N Gaussians seen along D directions to ``sums``, in place.

    Every (direction k, Gaussian i, pixel (first_u + s, first_v + t)) of Gaussian i's box in image k adds
    ``log(1 - a)``, ``a = min(0.999, o_i exp(-q / 2))``, ``q = pa du^2 + 2 pb du dv + pc dv^2`` with
    ``(du, dv) = (s, t) + offset``, when ``a >= 1/255``; as a fixed-point integer (``round(log(1 - a) 2^32)``,
    so the sums do not depend on the order the atomics land in).

    Args:
        precision: [D, N, 3] float32 (pa, pb, pc) of each Gaussian's inverse 2D covariance in squared pixels.
        offset: [D, N, 2] float32 its box's first pixel minus its centre, in pixels.
        box: [D, N, 4] int32 the box's first pixel (u, v) and extent (u, v) (0 = empty), inside the image.
        opacity: [N] float32.
        sums: [D, U * V] int64 per image, row-major with ``v_size`` pixels a row.
        v_size: V.
    """
    from microdreamer.kernels import _backend

    _backend.load().carve_alpha(precision, offset, box, opacity, sums, int(v_size))


def field_gather(
    means: torch.Tensor,
    transforms: torch.Tensor,
    opacities: torch.Tensor,
    box: torch.Tensor,
    axis: torch.Tensor,
    limit: float,
    out: torch.Tensor,
    brick_start: torch.Tensor,
    brick_list: torch.Tensor,
) -> None:
    """Add ``opacity * exp(-q / 2)`` of N Gaussians to the voxels of their boxes where ``q <= limit``, in place,
    each voxel's terms summed by one thread in the order of its brick's list (no atomics).

    Args:
        means: [N, 3] float64; transforms: [N, 3, 3] float64 whitening transforms M, ``q = |M (x - mean)|^2``.
        opacities: [N] float32.
        box: [N, 3, 2] int64 first and last voxel per axis (inclusive; clipped to the grid here).
        axis: [R] float64 grid coordinates along every axis.
        limit: terms with q above it are dropped.
        out: [R, R, R] float32, added to.
        brick_start: [B^3 + 1] int64 list position of each 8^3 brick's first entry (B = ceil(R / 8), bricks
            row-major, z fastest); brick_list: [M] int32 Gaussian indices, ascending within a brick.
    """
    from microdreamer.kernels import _backend

    _backend.load().field_gather(
        means, transforms, opacities, box, axis, float(limit), out, brick_start, brick_list
    )
