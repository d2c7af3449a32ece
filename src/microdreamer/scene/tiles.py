"""A scene meshed tile by tile on one global grid, in memory that follows the tile, not the scene.

The plan
--------
One global grid of points ``origin + spacing * (i, j, k)``, ``0 <= i < shape[0]`` (and so on), covers the
kept Gaussians' centres with a margin. Its cells are cut into cubic tiles of ``tile`` cells a side: tile
``(a, b, c)`` holds the points ``a * tile .. a * tile + tile`` along x (and so on, clipped to the grid), so
two neighbouring tiles share one plane of points and no cell. Each Gaussian goes to every tile its cutoff
box (the grid points where it can count, :mod:`microdreamer.field.common`'s exact mode) touches; only the
tiles some Gaussian touches are kept and meshed, so nothing is dense over the grid and its size is limited
only by what its coordinates and ids address (:func:`grid_limit`).

Exactness
---------
The Gaussians are prepared once, in *voxel units* (grid point ``i`` at coordinate ``i``; float64 then
rounded to float32 once, as :func:`~microdreamer.field.prepare_gaussians` does in its normalised units).
A tile's field is the C++ kernel's (:func:`microdreamer.kernels.cpu.field_scatter`) with its Gaussians
shifted by the tile's integer offset and the axis ``0, 1, ..., tile``: ``i - (mu - s)`` and
``(i + s) - mu`` are both exact in float64, so every sample equals, bit for bit, the sample of the same
point in any other tiling (each voxel's terms are added in Gaussian order, and a Gaussian left out of a
tile has no term at its points). Marching cubes triangulates each cell from its eight samples alone, so
the tiles' faces are exactly the faces of the whole grid; a vertex on a grid edge (or a grid point) is
given its global edge id and its position is recomputed from the edge's two samples, so the copies two
tiles make of a border vertex are the same vertex, merged by id (the weld): no crack, no doubled face.

The iso level is one for the scene, chosen before any tile is meshed: a fixed ``--threshold``, or
``auto`` as :func:`~microdreamer.field.iso.choose_iso_level` chooses it for a dense grid, from the
scene's column maxima (a first pass over the tiles, field only: the maximum along a column is the
maximum of the tiles' maxima; with a work folder the fields are kept on disk for the second pass) and the
splat's alpha along the grid's three axes, at every :data:`ISO_STRIDE`-th column both ways (more apart
where an image would pass :data:`ISO_MAX_COLUMNS`, :func:`iso_stride`); tiling changes neither.

Devices
-------
The plan's tensors stay on the host; ``device`` says where the per-tile work runs (the plan's preparation
and binning, a chunk of Gaussians at a time; each tile's field, its colour field and the iso level's alpha
images), and ``backend`` which field implementation (:mod:`microdreamer.field.gather`): ``"cpp"`` on the
CPU, ``"cuda"`` on a CUDA device (a per-voxel gather in Gaussian order, no atomics: the same invariance
across tilings) or ``"torch"``, the PyTorch reference, on either. A tile's Gaussians go to the device when
the tile runs, so device memory follows the tile (and the chunk), not the scene. Marching cubes, the weld
and the cleanup run on the CPU.

Colour: per vertex from the splat's colour field, tile by tile (``colors``); a UV texture per tile is
:mod:`microdreamer.scene.texture`'s, after the weld. Silhouette carving is not done per tile (its views look
at one object from outside).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from microdreamer.config import FieldConfig, MeshConfig
from microdreamer.field.common import PreparedGaussians
from microdreamer.mesh.types import Mesh
from microdreamer.splat import Splat

logger = logging.getLogger(__name__)

#: voxel = this times the median of the kept Gaussians' largest scales (``voxel="auto"``); the dense
#: path's ``resolution="auto"`` lands between 0.67x and 1x of that median (the guitar capture: 0.79x)
VOXEL_FACTOR = 0.8
#: the grid's margin beyond the kept centres: this many voxels, plus 3 times the 99th percentile of the
#: Gaussians' largest scales
MARGIN_VOXELS = 4
#: grid points along an axis at most (:func:`grid_limit`): the Gaussians' centres in voxel units are
#: float32, which keeps them to 1/32 of a voxel (half an ulp) below 2^20 (a float32 splat spanning as many
#: voxels around its origin rounds its own coordinates as much)
MAX_AXIS_POINTS = 1 << 20
#: the weld's int64 vertex keys, ``4 * (nx + 2) * (ny + 2) * (nz + 2)`` at most (a grid edge or point and
#: its axis, :func:`tile_mesh`), stay below this; :data:`MAX_AXIS_POINTS` on every axis keeps them there
MAX_KEYS = 2**63 - 1
#: Gaussians prepared at once (float64 work arrays of about 300 bytes each)
PREPARE_CHUNK = 1 << 20
#: the vertex colours' grid takes every COLOUR_STRIDE-th grid point
COLOUR_STRIDE = 2
#: the auto iso level is chosen from every ISO_STRIDE-th column of each axis, both ways (the pooled IoU's
#: statistic on a quarter of the columns: the alpha images cost a quarter)
ISO_STRIDE = 2
#: columns of one iso-level image at most (the field's column maxima and the splat's alpha across an axis
#: are dense over the grid's face, about 40 bytes a column in the pass: 0.5 GB for the three at most); past
#: it the stride grows (:func:`iso_stride`): a grid of up to 4096 x 4096 points across its two longest axes
#: keeps :data:`ISO_STRIDE`
ISO_MAX_COLUMNS = 1 << 22
#: the merge tolerance (``MeshConfig.merge_tolerance``, a fraction of the bounding box's diagonal) at most
#: this many voxels, so that it does not grow with the scene (the default 1e-6 reaches it at a diagonal
#: of 31,250 voxels; :meth:`~microdreamer.mesh.marching.GridVertices.merge_candidates` searches all
#: vertices from a quarter)
MERGE_MAX_VOXELS = 1 / 32
#: the smallest tile a memory budget may choose (cells a side; :class:`~microdreamer.config.SceneConfig`'s)
MIN_TILE = 8
#: one tile's work, bytes per point of its padded (tile + 3)^3 cube: the field and its padded copy
#: (float32), marching cubes' masks (bool), the colour grids (4 float32 at every 2nd point): measured,
#: then rounded up (benchmarks/README.md, "Scenes on Ray workers")
TILE_BYTES_PER_POINT = 16
#: bytes per Gaussian binned to the tile: its parameters gathered in float64 for the kernel, the boxes
TILE_BYTES_PER_GAUSSIAN = 400
#: bytes per (tile + 1)^2: the surface's vertices, faces, edge keys and merge candidates (the densest
#: tiles of the guitar scene hold about 6 faces per cell of a side's area, ~200 bytes a face alive)
TILE_BYTES_PER_AREA = 1600
#: the first pass keeps tile fields on disk for the second (with a work folder, on a CPU plan) up to this
#: many bytes in all, and this share of the work folder's free disk (``field_cache="auto"``); the tiles
#: past it compute their field again in the second pass
FIELD_CACHE_CEILING = 2_000_000_000
FIELD_CACHE_SHARE = 0.25
#: bytes of a kept field's ``.npy`` header, counted against the cap with its samples
NPY_HEADER_BYTES = 128


@dataclass(frozen=True)
class SceneGrid:
    """The global grid: point ``(i, j, k)`` at ``origin + spacing * (i, j, k)``, ``shape`` points per axis."""

    origin: tuple[float, float, float]
    spacing: float
    shape: tuple[int, int, int]


@dataclass
class ScenePlan:
    """The grid, the Gaussians in its voxel units, and the tiles.

    Attributes:
        grid: the global grid.
        tile: cells per tile side (a tile's field is ``(tile + 1)^3`` float32 at most).
        tiles: (Tx, Ty, Tz) tiles per axis.
        prepared: N kept Gaussians in voxel units (``means`` [N, 3] float32, ``transforms`` [N, 3, 3],
            ``opacities`` [N], ``radii`` [N, 3]), the field's (voxel filter included).
        boxes: [N, 3, 2] int64 first and last grid point per axis each Gaussian's cutoff box reaches
            (last < first: none).
        colors: [N, 3] float32 base colours of the kept Gaussians.
        config: the field settings.
        device: where the tiles' fields run (the tensors above stay on the host).
        backend: the tiles' field implementation, :mod:`microdreamer.field.gather`'s ``"cpp"``, ``"cuda"``
            or ``"torch"``.
    """

    grid: SceneGrid
    tile: int
    tiles: tuple[int, int, int]
    prepared: PreparedGaussians
    boxes: torch.Tensor
    colors: torch.Tensor
    config: FieldConfig
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    backend: str = "cpp"
    _order: torch.Tensor | None = field(default=None, repr=False)
    _tiles: torch.Tensor | None = field(default=None, repr=False)
    _starts: torch.Tensor | None = field(default=None, repr=False)

    @property
    def num_tiles(self) -> int:
        return self.tiles[0] * self.tiles[1] * self.tiles[2]

    def tile_index(self, t: int) -> tuple[int, int, int]:
        """Tile number ``t`` (row-major over (x, y, z): z fastest) -> its (a, b, c)."""
        tx, ty, tz = self.tiles
        return (t // (ty * tz), (t // tz) % ty, t % tz)

    def tile_points(self, t: int) -> tuple[tuple[int, int], ...]:
        """The first and last global grid point per axis of tile ``t`` (inclusive)."""
        idx = self.tile_index(t)
        return tuple(
            (i * self.tile, min(i * self.tile + self.tile, n - 1))
            for i, n in zip(idx, self.grid.shape, strict=True)
        )

    def gaussians_of(self, t: int) -> torch.Tensor:
        """[n] int64 indices (ascending) of the Gaussians whose cutoff box touches tile ``t``."""
        if self._order is None:
            self._bin()
        k = int(torch.searchsorted(self._tiles, torch.tensor([t], dtype=self._tiles.dtype))[0])
        if k == self._tiles.numel() or int(self._tiles[k]) != t:
            return self._order[:0]
        return self._order[int(self._starts[k]) : int(self._starts[k + 1])]

    def occupied(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The tiles some Gaussian's cutoff box touches (the only ones meshed): ``(tiles [T'] int64
        ascending, counts [T'] int64 Gaussians binned to each)``."""
        if self._order is None:
            self._bin()
        return self._tiles, self._starts[1:] - self._starts[:-1]

    def _bin(self) -> None:
        """(Gaussian, tile) pairs sorted by tile, Gaussians in order within a tile (in chunks of
        :data:`PREPARE_CHUNK` Gaussians on the plan's device; int32 Gaussian ids, int32 tile ids where the
        tiles allow); kept on the host for the occupied tiles only (memory follows the pairs, not the
        tile count)."""
        device = self.device
        n_t = torch.tensor(self.tiles, device=device)
        tile_dtype = torch.int32 if self.num_tiles < 2**31 else torch.int64
        gids, tids = [], []
        for start in range(0, self.boxes.shape[0], PREPARE_CHUNK):
            chunk = self.boxes[start : start + PREPARE_CHUNK].to(device)
            lo, hi = chunk[:, :, 0], chunk[:, :, 1]
            valid = (hi >= lo).all(-1)
            # point p lies in tiles ceil(p / T) - 1 .. floor(p / T): a box [lo, hi] touches those from
            # ceil(lo / T) - 1 to floor(hi / T)
            t0 = (torch.div(lo + self.tile - 1, self.tile, rounding_mode="floor") - 1).clamp_min(0)[valid]
            t1 = torch.minimum(torch.div(hi, self.tile, rounding_mode="floor"), n_t - 1)[valid]
            gid = torch.nonzero(valid).flatten() + start
            ext = (t1 - t0 + 1).clamp_min(0)
            count = ext.prod(-1)
            rep = torch.repeat_interleave(torch.arange(gid.numel(), device=device), count)
            offset = torch.arange(rep.numel(), device=device) - torch.repeat_interleave(
                torch.cumsum(count, 0) - count, count
            )
            e = ext[rep]
            iz = offset % e[:, 2]
            iy = (offset // e[:, 2]) % e[:, 1]
            ix = offset // (e[:, 2] * e[:, 1])
            tid = ((t0[rep, 0] + ix) * self.tiles[1] + (t0[rep, 1] + iy)) * self.tiles[2] + (t0[rep, 2] + iz)
            gids.append(gid[rep].int())
            tids.append(tid.to(tile_dtype))
        gid = torch.cat(gids) if gids else torch.zeros(0, dtype=torch.int32, device=device)
        tid = torch.cat(tids) if tids else torch.zeros(0, dtype=tile_dtype, device=device)
        del gids, tids
        order = torch.argsort(tid, stable=True)
        self._order = gid[order].long().cpu()
        tiles, counts = torch.unique_consecutive(tid[order], return_counts=True)
        self._tiles = tiles.long().cpu()
        self._starts = torch.cat([counts.new_zeros(1), torch.cumsum(counts, 0)]).long().cpu()


def grid_limit(shape: Sequence[int]) -> str | None:
    """Why a global grid of ``shape`` points is past what the plan can address, or None. Nothing of the
    plan is dense over the grid (the tiles' bins are kept for the occupied tiles, the iso level's images
    thinned to :data:`ISO_MAX_COLUMNS`, a tile's own indices are local): what limits it are the Gaussians'
    float32 voxel coordinates (:data:`MAX_AXIS_POINTS`) and the weld's int64 keys (:data:`MAX_KEYS`)."""
    if max(shape) > MAX_AXIS_POINTS:
        return (
            f"more than {MAX_AXIS_POINTS:,} points along an axis (the Gaussians' float32 voxel coordinates)"
        )
    if 4 * math.prod(int(n) + 2 for n in shape) > MAX_KEYS:
        return "more grid edges than the weld's int64 keys address"
    return None


def _grid_shape(lo: torch.Tensor, hi: torch.Tensor, h: float, p99: float) -> tuple[torch.Tensor, tuple]:
    """The grid of spacing ``h`` over the centres' box ``[lo, hi]`` ([3] float64) with its margin (of
    :data:`MARGIN_VOXELS` voxels and 3 times ``p99``, the largest scales' 99th percentile): (origin, shape)."""
    margin = MARGIN_VOXELS * h + 3.0 * p99
    origin = lo - margin
    shape = tuple(max(2, math.ceil(min(float(v), 1e300)) + 1) for v in (hi + margin - origin) / h)
    return origin, shape


def _fitting_voxel(lo: torch.Tensor, hi: torch.Tensor, h: float, p99: float) -> float:
    """The smallest voxel of at least ``h`` (to a part in 10^6) whose grid passes :func:`grid_limit`."""
    if grid_limit(_grid_shape(lo, hi, h, p99)[1]) is None:
        return h
    # along an axis: ceil((extent + 6 p99) / h) + 2 MARGIN_VOXELS + 1 points
    span = float((hi - lo).amax()) + 6.0 * p99
    h = max(h, span / (MAX_AXIS_POINTS - 2 * MARGIN_VOXELS - 1))
    while grid_limit(_grid_shape(lo, hi, h, p99)[1]) is not None:  # rounding, or the keys' product
        h *= 1.0 + 1e-6
    return h


def _prepare_voxel_units(
    splat: Splat,
    keep: torch.Tensor,
    grid: SceneGrid,
    config: FieldConfig,
    filter_variance: float,
    device: torch.device | None = None,
    to_host: bool = True,
) -> tuple[PreparedGaussians, torch.Tensor]:
    """The kept Gaussians in voxel units (float64, rounded once), in chunks computed on ``device`` (default:
    the splat's) and, with ``to_host``, kept on the host: (prepared, boxes)."""
    device = splat.means.device if device is None else torch.device(device)
    index = torch.nonzero(keep).flatten()
    origin = torch.tensor(grid.origin, dtype=torch.float64, device=device)
    h = grid.spacing
    c = math.sqrt(config.cutoff_sq)
    shape = torch.tensor(grid.shape, device=device)
    parts = []
    for start in range(0, index.numel(), PREPARE_CHUNK):
        sub = splat.subset(index[start : start + PREPARE_CHUNK]).to(device)
        with torch.no_grad():
            means = (sub.means.double() - origin) / h
            scales = sub.scales().double() / h
            rot = sub.rotation_matrices().double()
            opac = sub.opacities().double()
        if filter_variance > 0.0:  # Sigma + v h^2 I with the mass kept (field/common.py)
            wide = (scales.square() + filter_variance).sqrt()
            opac = opac * (scales / wide).prod(-1)
            scales = wide
        transforms = rot.transpose(1, 2) / scales[:, :, None]
        radii = c * ((rot * scales[:, None, :]) ** 2).sum(-1).sqrt() * (1.0 + 1e-6)
        m32, r32 = means.float(), radii.float()
        mu, rad = m32.double(), r32.double()
        lo = torch.ceil(mu - rad - 1e-9).clamp(min=0).long()
        hi = torch.minimum(torch.floor(mu + rad + 1e-9).long(), shape - 1)
        part = (m32, opac.float(), transforms.float(), r32, torch.stack([lo, hi], -1))
        parts.append(tuple(t.cpu() for t in part) if to_host else part)
    cat = [torch.cat([p[k] for p in parts]) if parts else None for k in range(5)]
    if not parts:
        z = torch.zeros(0, 3, device=None if to_host else device)
        return PreparedGaussians(z, z[:, 0], z.new_zeros(0, 3, 3), z), z.new_zeros(0, 3, 2, dtype=torch.long)
    return PreparedGaussians(*(t.contiguous() for t in cat[:4])), cat[4].contiguous()


def plan_scene(
    splat: Splat,
    config: FieldConfig,
    tile: int = 128,
    voxel: float | str = "auto",
    tiles_along_longest: int | None = None,
    device: str | torch.device = "cpu",
    backend: str = "auto",
    memory: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> ScenePlan:
    """Lay the global grid over ``splat`` (CPU) and cut it into tiles.

    Args:
        splat: N Gaussians on the CPU.
        config: the field's settings (exact mode: ``min_opacity``, ``cutoff_tol``, ``voxel_filter``).
        tile: cells per tile side.
        voxel: the grid spacing in the splat's units, or ``"auto"``: :data:`VOXEL_FACTOR` times the median of
            the kept Gaussians' largest scales, grown only where the grid would pass :func:`grid_limit`
            (:data:`MAX_AXIS_POINTS` points along an axis), which ``progress`` is told in one line.
        tiles_along_longest: when given, ``tile`` is chosen so that the grid's longest axis holds this many
            tiles (``--tiles N``).
        device: where the preparation, the binning and later the tiles run (module docstring).
        backend: the tiles' field: ``"cpp"`` (CPU), ``"cuda"`` (CUDA device), ``"torch"`` (the reference) or
            ``"auto"`` (cpp on the CPU; on a CUDA device cuda where the kernels load, else torch).
        memory: bytes one tile's work may take (``--memory``): the tile is made smaller where the
            estimate of its densest tile's work (:func:`tile_memory`) passes it.
        progress: called with a one-line message (the auto voxel grown); default: a logged warning.

    Raises:
        ValueError: bad Gaussians, a voxel too small for :func:`grid_limit`, or a budget that not even a
            tile of :data:`MIN_TILE` cells fits.
    """
    if config.mode != "exact":
        raise ValueError("the tiled path computes the exact mode's field (--mode exact)")
    device = torch.device(device)
    backend = _resolve_backend(device, backend)
    finite = torch.ones(len(splat), dtype=torch.bool)
    for t in (splat.means, splat.opacity_logits, splat.log_scales, splat.quats):
        finite &= torch.isfinite(t.reshape(len(splat), -1)).all(-1)
    if not bool(finite.all()):
        bad = torch.nonzero(~finite).flatten()[:5].tolist()
        raise ValueError(f"{int((~finite).sum())} Gaussians have non-finite parameters (NaN or inf: "
                         f"{', '.join(f'#{i}' for i in bad)}); fix or drop them")  # fmt: skip
    with torch.no_grad():
        keep = splat.opacities().float() > config.min_opacity
        means = splat.means[keep].double()
        largest = splat.scales()[keep].double().amax(-1) if means.shape[0] else torch.zeros(0)
    if means.shape[0] == 0:
        lo = hi = torch.zeros(3, dtype=torch.float64)
        med = p99 = 1.0
    else:
        lo, hi = means.amin(0), means.amax(0)
        med = float(largest.median())
        p99 = float(torch.quantile(largest[: 1 << 24].float(), 0.99))
    extent = float((hi - lo).amax())
    if voxel == "auto":
        asked = max(VOXEL_FACTOR * med if med > 0 else max(extent, 1.0) / 128, 1e-30)
        h = _fitting_voxel(lo, hi, asked, p99)
        if h != asked:
            why = grid_limit(_grid_shape(lo, hi, asked, p99)[1])
            (progress or logger.warning)(f"voxel {asked:.4g} (from the Gaussians' scales) grown to {h:.4g}: "
                                         f"the scene spans {extent:.4g}, and the grid would have {why}")  # fmt: skip
    else:
        h = float(voxel)
        if not (h > 0.0 and math.isfinite(h)):
            raise ValueError(f"voxel {voxel}: must be a positive number")
        why = grid_limit(_grid_shape(lo, hi, h, p99)[1])
        if why is not None:
            least = _fitting_voxel(lo, hi, h, p99)
            step = 10.0 ** (math.floor(math.log10(least)) - 2)
            least = math.ceil(least * (1.0 + 1e-9) / step) * step  # three digits, rounded up
            raise ValueError(f"voxel {h:g}: the scene spans {extent:.4g}, so the grid would have {why}; use a "
                             f"voxel of {least:g} or more")  # fmt: skip
    origin, shape = _grid_shape(lo, hi, h, p99)
    grid = SceneGrid(tuple(float(v) for v in origin), float(h), shape)
    prepared, boxes = _prepare_voxel_units(splat, keep, grid, config, config.filter_variance, device)
    if tiles_along_longest is not None:
        tile = max(1, math.ceil((max(shape) - 1) / tiles_along_longest))
    tile = max(1, min(int(tile), max(shape) - 1))
    if memory is not None:
        tile = min(tile, fit_tile(prepared, memory, tile))
    tiles = tuple(max(1, math.ceil((s - 1) / tile)) for s in shape)
    with torch.no_grad():
        colors = splat.colors()[keep].float().contiguous()
    return ScenePlan(grid, tile, tiles, prepared, boxes, colors, config, device, backend)


def _resolve_backend(device: torch.device, backend: str) -> str:
    """``backend`` for ``device`` (:func:`plan_scene`), ``"auto"`` resolved; raises ValueError on a mismatch."""
    from microdreamer.field.gather import BACKENDS

    if backend == "auto":
        if device.type == "cpu":
            return "cpp"
        from microdreamer import fallback

        return "cuda" if device.type == "cuda" and fallback.kernels_usable() else "torch"
    if backend not in BACKENDS:
        raise ValueError(f"unknown tile backend {backend!r}; use auto, {', '.join(BACKENDS)}")
    if (backend == "cpp" and device.type != "cpu") or (backend == "cuda" and device.type != "cuda"):
        raise ValueError(f"the {backend} tile backend cannot run on {device}")
    return backend


# ------------------------------------------------------------------------------------------ memory
def tile_memory(tile: int, gaussians: int) -> int:
    """Estimated peak bytes of one tile's work (field, marching cubes, colours) at ``tile`` cells a side
    with ``gaussians`` binned to it, on top of the plan every worker holds."""
    return (
        TILE_BYTES_PER_POINT * (tile + 3) ** 3
        + TILE_BYTES_PER_GAUSSIAN * gaussians
        + TILE_BYTES_PER_AREA * (tile + 1) ** 2
    )


def densest_tile(prepared: PreparedGaussians, tile: int) -> int:
    """An estimate of the most Gaussians any tile of ``tile`` cells is binned (their cutoff boxes touch
    it): the most centres in one tile, times the tile grown by the median cutoff radius on every side."""
    if len(prepared) == 0:
        return 0
    cells = torch.div(prepared.means.clamp_min(0), tile, rounding_mode="floor").long()
    dims = cells.amax(0) + 1
    key = (cells[:, 0] * dims[1] + cells[:, 1]) * dims[2] + cells[:, 2]
    if int(dims.prod()) <= max(1 << 24, 4 * key.numel()):  # a count per tile of the centres' box
        most = int(torch.bincount(key).max())
    else:  # a sparse scene: counts of the occupied tiles only
        most = int(torch.unique(key, return_counts=True)[1].max())
    reach = float(prepared.radii.amax(-1).median())
    return math.ceil(most * ((tile + 2 * reach) / tile) ** 3)


def fit_tile(prepared: PreparedGaussians, memory: int, largest: int) -> int:
    """The largest tile (cells a side, at most ``largest``) whose densest tile's work fits ``memory``
    bytes (:func:`tile_memory`, :func:`densest_tile`): from ``largest`` down, 15 % at a time.

    Raises:
        ValueError: not even a tile of :data:`MIN_TILE` cells fits.
    """
    tile = max(1, int(largest))
    while True:
        need = tile_memory(tile, densest_tile(prepared, tile))
        if need <= memory:
            return tile
        if tile <= MIN_TILE:
            raise ValueError(
                f"a memory budget of {memory / 1e9:.3g} GB: one tile of {tile} cells needs about "
                f"{need / 1e9:.2g} GB (its Gaussians and grid); give --memory {1.1 * need / 1e9:.2g} or more"
            )
        tile = max(MIN_TILE, min(tile - 1, int(tile * 0.85)))


@dataclass
class MemoryCounter:
    """Counts the bytes of the per-tile grid arrays (field, padded copy) alive at once: the instrumented
    hook the tests read (``peak``: the most at any time; ``largest``: the largest single array)."""

    current: int = 0
    peak: int = 0
    largest: int = 0

    def add(self, nbytes: int) -> None:
        self.current += int(nbytes)
        self.peak = max(self.peak, self.current)
        self.largest = max(self.largest, int(nbytes))

    def sub(self, nbytes: int) -> None:
        self.current -= int(nbytes)


# ------------------------------------------------------------------------------------------- tiles
def _tile_gaussians(plan: ScenePlan, idx: torch.Tensor, start: torch.Tensor):
    """The Gaussians ``idx`` of the plan shifted by the tile's first point ``start`` [3] int64, on the plan's
    device: (means [n, 3] float64, transforms [n, 3, 3] float64, opacities [n] float32)."""
    p, device = plan.prepared, plan.device
    means = p.means[idx].to(device, non_blocking=True).double() - start.to(device).double()  # exact
    transforms = p.transforms[idx].to(device, non_blocking=True).double().contiguous()
    return means, transforms, p.opacities[idx].to(device).contiguous()


def tile_values(plan: ScenePlan, t: int, counter: MemoryCounter | None = None) -> torch.Tensor:
    """:func:`tile_field` as a tensor on the plan's device ([nx, ny, nz] float32, a view of the
    ``max(n) ^ 3`` cube the field implementation writes)."""
    from microdreamer.field.gather import field_gather
    from microdreamer.field.torch_impl import _Q_MAX

    bounds = plan.tile_points(t)
    start = torch.tensor([b[0] for b in bounds])
    sizes = [b[1] - b[0] + 1 for b in bounds]
    side = max(sizes)
    out = torch.zeros(side, side, side, dtype=torch.float32, device=plan.device)
    if counter is not None:
        counter.add(out.numel() * 4)
    idx = plan.gaussians_of(t)
    if idx.numel():
        box = plan.boxes[idx] - start[None, :, None]
        last = torch.tensor(sizes) - 1
        box[..., 1] = torch.minimum(box[..., 1], last)  # no work outside the grid
        box[..., 0] = box[..., 0].clamp_min(0)
        means, transforms, opacities = _tile_gaussians(plan, idx, start)
        axis = torch.arange(side, dtype=torch.float64, device=plan.device)
        limit = min(plan.config.cutoff_sq, _Q_MAX)
        field_gather(means, transforms, opacities, box.to(plan.device).contiguous(), axis, limit, out,
                     backend=plan.backend)  # fmt: skip
    return out[: sizes[0], : sizes[1], : sizes[2]]


def tile_field(plan: ScenePlan, t: int, counter: MemoryCounter | None = None) -> np.ndarray:
    """[nx, ny, nz] float32 field of tile ``t`` at its points (:meth:`ScenePlan.tile_points`), the same
    samples as any other tiling gives (module docstring). On the CPU the array is a view of a cube of
    ``max(n) ^ 3`` samples (the kernel's layout); from a device, a copy."""
    return tile_values(plan, t, counter).cpu().numpy()


def _pad_sides(
    values: np.ndarray, threshold: float, lo: tuple[bool, ...], hi: tuple[bool, ...]
) -> np.ndarray:
    """``values`` with one layer of samples below ``threshold`` on the sides flagged (those on the global
    grid's border), as :func:`microdreamer.mesh.marching._close_boundary_pad` pads every side: the same
    values there, so a tile on the border closes the surface as the whole grid would."""
    pad = [(int(a), int(b)) for a, b in zip(lo, hi, strict=True)]
    padded = np.pad(values, pad, mode="edge") if any(any(p) for p in pad) else np.ascontiguousarray(values)
    t = np.float32(threshold)
    below = np.nextafter(t, np.float32(-np.inf))
    for axis in range(3):
        for index, on in ((0, lo[axis]), (-1, hi[axis])):
            if not on:
                continue
            sl = [slice(None)] * 3
            sl[axis] = index
            shell = padded[tuple(sl)]
            reflected = np.where(shell > t, 2 * t - shell, shell)
            np.minimum(reflected, below, out=shell)
    return padded


@dataclass
class TilePiece:
    """One tile's part of the mesh, before the weld.

    Attributes:
        vertices: [V, 3] float32 world positions.
        faces: [F, 3] int64 into ``vertices``, wound outward.
        keys: [V] int64 global id of the grid edge (or grid point) each vertex lies on, -1 for a vertex
            inside a cell (marching cubes' centre vertices).
        candidates: [V] bool, the vertices the merge search must look at
            (:meth:`~microdreamer.mesh.marching.GridVertices.merge_candidates`).
        colors: [V, 3] float32 colour-field colours, or None.
    """

    vertices: np.ndarray
    faces: np.ndarray
    keys: np.ndarray
    candidates: np.ndarray
    colors: np.ndarray | None = None

    @classmethod
    def empty(cls, colors: bool = False) -> TilePiece:
        return cls(np.zeros((0, 3), np.float32), np.zeros((0, 3), np.int64), np.zeros(0, np.int64),
                   np.zeros(0, bool), np.zeros((0, 3), np.float32) if colors else None)  # fmt: skip


def tile_mesh(
    plan: ScenePlan,
    t: int,
    level: float,
    tolerance: float,
    colors: bool = False,
    counter: MemoryCounter | None = None,
    seconds: dict[str, float] | None = None,
    values: np.ndarray | None = None,
) -> TilePiece:
    """Field, marching cubes and the merge candidates of tile ``t`` (see the module docstring).

    Args:
        level: the scene's iso level.
        tolerance: the merge tolerance (world units) the weld's cleanup will use, or an upper bound.
        colors: colour the vertices from the splat's colour field (the tile's Gaussians).
        seconds: adds the seconds of ``"field"``, ``"marching"`` (marching cubes, the weld's ids, the merge
            candidates) and ``"colour"``.
        values: the tile's field when it was computed before (:func:`tile_field`), else computed here.
    """
    from microdreamer.mesh.marching import marching_cubes_on_grid

    seconds = {} if seconds is None else seconds
    start = time.perf_counter()
    if values is None:
        values = tile_field(plan, t, counter)
        field_bytes = max(values.shape) ** 3 * 4
    else:
        field_bytes = values.nbytes
        if counter is not None:
            counter.add(field_bytes)
    seconds["field"] = seconds.get("field", 0.0) + time.perf_counter() - start
    start = time.perf_counter()
    bounds = plan.tile_points(t)
    lo = tuple(b[0] == 0 for b in bounds)
    hi = tuple(b[1] == n - 1 for b, n in zip(bounds, plan.grid.shape, strict=True))
    padded = _pad_sides(values, level, lo, hi)
    if counter is not None:
        counter.add(padded.nbytes)
    shift = np.array(
        [b[0] - int(p) for b, p in zip(bounds, lo, strict=True)], np.int64
    )  # padded [0] -> global
    h = plan.grid.spacing
    origin = np.asarray(plan.grid.origin, np.float64)
    mesh, gv = marching_cubes_on_grid(padded, level, origin + h * shift, h, close_boundary=False)
    if counter is not None:
        counter.sub(padded.nbytes)
        counter.sub(field_bytes)
    if mesh.is_empty:
        seconds["marching"] = seconds.get("marching", 0.0) + time.perf_counter() - start
        return TilePiece.empty(colors)
    local = gv.coords.astype(np.float64)
    integral = local == np.floor(local)
    n_int = integral.sum(1)
    cell = np.floor(local).astype(np.int64)
    g = cell + shift + 1  # >= 0: the pad layer is at global -1
    dims = np.asarray(plan.grid.shape, np.int64) + 2
    free = np.where(n_int == 3, 3, np.argmin(integral, axis=1))  # the edge's axis; 3: on a grid point
    keys = ((free * dims[0] + g[:, 0]) * dims[1] + g[:, 1]) * dims[2] + g[:, 2]
    keys = np.where(n_int >= 2, keys, -1)
    vertices = mesh.vertices.astype(np.float64)
    # positions of edge vertices from the edge's two samples (the same in every tiling)
    on_edge = np.flatnonzero(n_int == 2)
    if on_edge.size:
        c0 = cell[on_edge]
        ax = free[on_edge]
        c1 = c0.copy()
        c1[np.arange(on_edge.size), ax] += 1
        v0 = padded[c0[:, 0], c0[:, 1], c0[:, 2]].astype(np.float64)
        v1 = padded[c1[:, 0], c1[:, 1], c1[:, 2]].astype(np.float64)
        frac = (level - v0) / (v1 - v0)
        pos = (c0 + shift).astype(np.float64)
        pos[np.arange(on_edge.size), ax] += frac
        vertices[on_edge] = origin + h * pos
    on_point = np.flatnonzero(n_int == 3)
    if on_point.size:
        vertices[on_point] = origin + h * (cell[on_point] + shift)
    candidates = gv.merge_candidates(tolerance)
    if candidates is None:
        candidates = np.ones(mesh.num_vertices, bool)
    piece = TilePiece(vertices.astype(np.float32), mesh.faces.astype(np.int64), keys, candidates)
    seconds["marching"] = seconds.get("marching", 0.0) + time.perf_counter() - start
    if colors:
        start = time.perf_counter()
        piece.colors = _tile_colors(plan, t, piece.vertices, counter)
        seconds["colour"] = seconds.get("colour", 0.0) + time.perf_counter() - start
    return piece


def _tile_colors(
    plan: ScenePlan, t: int, vertices: np.ndarray, counter: MemoryCounter | None = None
) -> np.ndarray:
    """[V, 3] float32: the splat's colour field ``sum_i w_i c_i / sum_i w_i`` (``w_i`` the field's terms,
    ``c_i`` the base colours) at the vertices, from the tile's Gaussians: the numerator's three channels
    and the denominator scattered by the field kernel onto every :data:`COLOUR_STRIDE`-th grid point (a
    coarser grid, 1 / 8 of the field's work per channel) and interpolated trilinearly, each separately.
    Where no Gaussian reaches, the colour of the nearest Gaussian centre of the tile. The four grids and
    the interpolation run on the plan's device."""
    from microdreamer.field.gather import brick_lists, field_gather_channels
    from microdreamer.field.torch_impl import _Q_MAX

    idx = plan.gaussians_of(t)
    if idx.numel() == 0:
        return np.full((vertices.shape[0], 3), 0.5, np.float32)
    k = COLOUR_STRIDE
    bounds = plan.tile_points(t)
    start = torch.tensor([b[0] for b in bounds])
    size = max(b[1] - b[0] + 1 for b in bounds)
    side = (size - 1 + k - 1) // k + 2  # coarse points 0, k, 2k, ... past the tile's last point
    p = plan.prepared
    box = plan.boxes[idx] - start[None, :, None]
    box[..., 0] = torch.div(box[..., 0] + k - 1, k, rounding_mode="floor").clamp_min(0)
    box[..., 1] = torch.div(box[..., 1], k, rounding_mode="floor")
    device = plan.device
    means, transforms, _ = _tile_gaussians(plan, idx, start)
    box = box.to(device).contiguous()
    axis = torch.arange(side, dtype=torch.float64, device=device) * k
    limit = min(plan.config.cutoff_sq, _Q_MAX)
    op = p.opacities[idx]
    weights = torch.stack([op * plan.colors[idx, c] for c in range(3)] + [op], -1)  # [n, 4]
    lists = brick_lists(box, side) if plan.backend == "cuda" else None  # the four grids share them
    out = torch.zeros(4, side, side, side, dtype=torch.float32, device=device)
    if counter is not None:
        counter.add(out.numel() * 4)
    field_gather_channels(means, transforms, weights.to(device).contiguous(), box, axis, limit, out,
                          plan.backend, lists)  # fmt: skip
    if device.type != "cpu":
        acc = _interpolate(out, vertices, plan, start, k, side)
    else:
        acc = _interpolate_numpy(list(out.numpy()), vertices, plan, start, k, side)
    if counter is not None:
        counter.sub(4 * side**3 * 4)
    del out
    denom = acc[3]
    colour = np.zeros((vertices.shape[0], 3), np.float32)
    seen = denom > 1e-12
    colour[seen] = (acc[:3, seen] / denom[seen]).T
    if not seen.all():
        from scipy.spatial import cKDTree

        local = (vertices[~seen].astype(np.float64) - np.asarray(plan.grid.origin)) / plan.grid.spacing
        _, near = cKDTree(p.means[idx].numpy()).query(local)
        colour[~seen] = plan.colors[idx].numpy()[near]
    return np.clip(colour, 0.0, 1.0).astype(np.float32)


def _interpolate(
    grids: torch.Tensor, vertices: np.ndarray, plan: ScenePlan, start: torch.Tensor, k: int, side: int
) -> np.ndarray:
    """[4, V] float64: the trilinear interpolation of ``grids`` [4, side, side, side] float32 (on any device)
    at the vertices, in float64 as :func:`_interpolate_numpy` computes it."""
    device = grids.device
    origin = torch.tensor(plan.grid.origin, dtype=torch.float64, device=device)
    v = torch.from_numpy(vertices).to(device).double()
    u = ((v - origin) / plan.grid.spacing - start.to(device).double()) / k
    u = u.clamp(0.0, side - 1.000001)
    i0 = torch.floor(u).long()
    f = u - i0
    acc = torch.zeros(4, v.shape[0], dtype=torch.float64, device=device)
    for dx in (0, 1):
        for dy in (0, 1):
            for dz in (0, 1):
                wt = (
                    (f[:, 0] if dx else 1 - f[:, 0])
                    * (f[:, 1] if dy else 1 - f[:, 1])
                    * (f[:, 2] if dz else 1 - f[:, 2])
                )
                acc += wt * grids[:, i0[:, 0] + dx, i0[:, 1] + dy, i0[:, 2] + dz].double()
    return acc.cpu().numpy()


def _interpolate_numpy(
    grids: list[np.ndarray], vertices: np.ndarray, plan: ScenePlan, start: torch.Tensor, k: int, side: int
) -> np.ndarray:
    """:func:`_interpolate` of four [side, side, side] float32 arrays, in numpy (the CPU path)."""
    u = ((vertices.astype(np.float64) - np.asarray(plan.grid.origin)) / plan.grid.spacing - start.numpy()) / k
    u = np.clip(u, 0.0, side - 1.000001)
    i0 = np.floor(u).astype(np.int64)
    f = u - i0
    acc = np.zeros((4, vertices.shape[0]), np.float64)
    for dx in (0, 1):
        for dy in (0, 1):
            for dz in (0, 1):
                wt = (
                    (f[:, 0] if dx else 1 - f[:, 0])
                    * (f[:, 1] if dy else 1 - f[:, 1])
                    * (f[:, 2] if dz else 1 - f[:, 2])
                )
                ix, iy, iz = i0[:, 0] + dx, i0[:, 1] + dy, i0[:, 2] + dz
                for c in range(4):
                    acc[c] += wt * grids[c][ix, iy, iz]
    return acc


# ---------------------------------------------------------------------------------- one tile's work
def field_file_bytes(plan: ScenePlan, t: int) -> int:
    """Bytes of tile ``t``'s field kept on disk (its samples and the ``.npy`` header)."""
    return 4 * math.prod(b - a + 1 for a, b in plan.tile_points(t)) + NPY_HEADER_BYTES


def field_cache_bytes(work: Path, cap: int | str = "auto") -> int:
    """The bytes of tile fields the first pass may keep in ``work`` (an existing folder): ``cap``, or for
    ``"auto"`` :data:`FIELD_CACHE_SHARE` of its disk's free space, at most :data:`FIELD_CACHE_CEILING`."""
    if cap != "auto":
        return max(0, int(cap))
    import shutil

    return int(min(FIELD_CACHE_CEILING, FIELD_CACHE_SHARE * shutil.disk_usage(work).free))


def tile_maxima(
    plan: ScenePlan,
    t: int,
    work: Path | None = None,
    cache_below: int | None = None,
    counter: MemoryCounter | None = None,
    seconds: dict[str, float] | None = None,
) -> tuple[list[np.ndarray], bool]:
    """The iso level's first pass over tile ``t``: the maxima of its field along each axis.

    Returns ``(maxima, loaded)``: ``maxima[a]`` float32 over the tile's points of the two other axes
    (``[ny, nz]``, ``[nx, nz]``, ``[nx, ny]``); ``loaded``: the field was read from ``work``
    (``field_<t>.npy``, kept by an interrupted run) instead of computed. With ``work`` a computed field is
    kept there for the second pass (:func:`tile_piece`), on a CPU plan only, when ``t`` is below
    ``cache_below`` (None: every tile). ``seconds`` adds ``"field"``.
    """
    start = time.perf_counter()
    keep = work is not None and plan.device.type == "cpu"  # a device computes a field again faster
    cached = work / f"field_{t}.npy" if keep else None
    loaded = cached is not None and cached.exists()
    if cache_below is not None and t >= cache_below and not loaded:
        cached = None
    if loaded:
        values = torch.from_numpy(np.load(cached))
        if counter is not None:
            counter.add(max(values.shape) ** 3 * 4)
    else:
        values = tile_values(plan, t, counter)
        if cached is not None:
            tmp = cached.with_name(cached.name + ".tmp")
            with open(tmp, "wb") as f:
                np.save(f, values.numpy())
            os.replace(tmp, cached)
    maxima = [values.amax(a).cpu().numpy() for a in range(3)]
    if counter is not None:
        counter.sub(max(values.shape) ** 3 * 4)
    if seconds is not None:
        seconds["field"] = seconds.get("field", 0.0) + time.perf_counter() - start
    return maxima, loaded


def tile_piece(
    plan: ScenePlan,
    t: int,
    level: float,
    tolerance: float,
    colors: bool = False,
    work: Path | None = None,
    counter: MemoryCounter | None = None,
    seconds: dict[str, float] | None = None,
) -> tuple[TilePiece, bool]:
    """Tile ``t``'s piece (:func:`tile_mesh`), through the work folder: returns ``(piece, loaded)``.

    With ``work``, a piece a run finished before (``tile_<t>.npz``) is loaded (``loaded`` True); else the
    field the first pass kept there is used, the piece saved (written whole, then renamed) and the field
    removed.
    """
    path = work / f"tile_{t}.npz" if work is not None else None
    if path is not None and path.exists():
        return _load_piece(path), True
    cached = work / f"field_{t}.npy" if work is not None and plan.device.type == "cpu" else None
    values = np.load(cached) if cached is not None and cached.exists() else None
    piece = tile_mesh(plan, t, level, tolerance, colors, counter, seconds, values)
    del values
    if path is not None:
        _save_piece(path, piece)
        if cached is not None:
            cached.unlink(missing_ok=True)
    return piece, False


#: ``map_tiles(fn, plan, tiles, kwargs)``: ``fn(plan, t, counter=, seconds=, **kwargs)`` for each tile, in
#: the order of ``tiles``: ``(result, counter, seconds)`` each, the tile's own :class:`MemoryCounter` and
#: stage seconds (:func:`serial_tiles` here; on Ray workers: :mod:`microdreamer.jobs.scene_ray`)
TileMap = Callable[[Callable, ScenePlan, Sequence[int], dict], Iterator[tuple[Any, MemoryCounter, dict]]]


def serial_tiles(
    fn: Callable, plan: ScenePlan, tiles: Sequence[int], kwargs: dict
) -> Iterator[tuple[Any, MemoryCounter, dict]]:
    """The tiles one after the other in this process (the default :data:`TileMap`)."""
    for t in tiles:
        counter, seconds = MemoryCounter(), {}
        yield fn(plan, t, counter=counter, seconds=seconds, **kwargs), counter, seconds


def threaded_tiles(workers: int) -> TileMap:
    """A :data:`TileMap` running the tiles on ``workers`` threads of this process, results in tile order.

    Each tile's work is the one :func:`serial_tiles` runs (tiles share nothing but the read-only plan), so
    the pieces, and the mesh, are the same. Meant for a device plan: marching cubes (scikit-image holds
    the GIL, ~half of a tile's marching) then overlaps the other tiles' NumPy work and device waits (both
    release it). On a CPU plan the field kernel already uses every core (:mod:`microdreamer.kernels.cpu`).
    Memory: up to ``workers`` tiles' work at once (host and device), so ``memory`` budgets are per thread.
    """
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")

    def map_tiles(fn: Callable, plan: ScenePlan, tiles: Sequence[int], kwargs: dict):
        if workers == 1 or len(tiles) <= 1:
            yield from serial_tiles(fn, plan, tiles, kwargs)
            return
        from concurrent.futures import ThreadPoolExecutor

        plan.gaussians_of(tiles[0])  # bins the Gaussians once, before the threads share the plan

        def one(t: int):
            counter, seconds = MemoryCounter(), {}
            return fn(plan, t, counter=counter, seconds=seconds, **kwargs), counter, seconds

        with ThreadPoolExecutor(max_workers=workers) as pool:
            yield from pool.map(one, tiles)

    return map_tiles


def _merge_memory(total: MemoryCounter, tile: MemoryCounter) -> None:
    """Fold one tile's counter into the run's: the peak of one tile's work, per worker."""
    total.peak = max(total.peak, total.current + tile.peak)
    total.largest = max(total.largest, tile.largest)
    total.current += tile.current


def _add_seconds(total: dict[str, float], part: dict[str, float]) -> None:
    for k, v in part.items():
        total[k] = total.get(k, 0.0) + v


# -------------------------------------------------------------------------------------------- weld
def weld_pieces(pieces: list[TilePiece]) -> tuple[Mesh, np.ndarray, np.ndarray]:
    """The tiles' pieces as one mesh: vertices with the same grid edge id are one vertex. Returns
    ``(mesh, candidates [V] bool, face_piece [F] int64)``, ``face_piece`` the index in ``pieces`` of the
    piece each face came from. Vertices on grid edges come first, in the order of their ids (the same in
    every tiling), then the cells' centre vertices, tile by tile; faces piece by piece."""
    number = [n for n, p in enumerate(pieces) if p.faces.shape[0]]
    pieces = [pieces[n] for n in number]
    if not pieces:
        return Mesh.empty(), np.zeros(0, bool), np.zeros(0, np.int64)
    keys = np.concatenate([p.keys for p in pieces])
    keyed = keys >= 0
    uniq, inverse = np.unique(keys[keyed], return_inverse=True)
    ids = np.empty(keys.shape[0], np.int64)
    ids[keyed] = inverse.reshape(-1)
    n_center = int((~keyed).sum())
    ids[~keyed] = uniq.size + np.arange(n_center)
    v = uniq.size + n_center
    all_vertices = np.concatenate([p.vertices for p in pieces])
    vertices = np.empty((v, 3), np.float32)
    vertices[ids[::-1]] = all_vertices[::-1]  # the first copy wins (all copies are equal)
    candidates = np.zeros(v, bool)
    np.logical_or.at(candidates, ids, np.concatenate([p.candidates for p in pieces]))
    colors = None
    if pieces[0].colors is not None:
        colors = np.empty((v, 3), np.float32)
        colors[ids[::-1]] = np.concatenate([p.colors for p in pieces])[::-1]
    starts = np.cumsum([0] + [p.vertices.shape[0] for p in pieces])
    faces = np.concatenate([ids[p.faces + s] for p, s in zip(pieces, starts[:-1], strict=True)])
    face_piece = np.repeat(np.asarray(number, np.int64), [p.faces.shape[0] for p in pieces])
    return Mesh(vertices, faces, colors), candidates, face_piece


@dataclass
class _Candidates:
    """The weld's merge candidates, in the shape the cleanup asks of a
    :class:`~microdreamer.mesh.marching.GridVertices` (``coords`` rows and ``merge_candidates``)."""

    mask: np.ndarray

    @property
    def coords(self) -> np.ndarray:
        return np.empty((self.mask.shape[0], 0), np.float32)

    def merge_candidates(self, tolerance: float) -> np.ndarray:
        return self.mask


# --------------------------------------------------------------------------------------- the scene
@dataclass
class SceneResult:
    """What :func:`scene_to_mesh` made.

    Attributes:
        mesh: the welded, cleaned mesh (vertex colours when asked for).
        face_tile: [F] int64 the tile number (:meth:`ScenePlan.tile_index`) each face of ``mesh`` belongs
            to: the tile that made it, or, after a decimation, the tile whose cells hold its centroid.
        plan: the plan it ran.
        level: the iso level; iso_method: ``"fixed"`` or ``"auto"``; iso_iou: the silhouettes' IoU.
        stats: counts (tiles run, empty, resumed; faces before and after cleanup) and ``seconds`` per stage.
        memory: the per-tile grid arrays' bytes (:class:`MemoryCounter`).
    """

    mesh: Mesh
    face_tile: np.ndarray
    plan: ScenePlan
    level: float
    iso_method: str
    iso_iou: float | None
    stats: dict
    memory: MemoryCounter

    def tile_meshes(self) -> list[tuple[int, Mesh]]:
        """``(tile number, mesh)`` for each tile with faces, in tile order: the faces of ``mesh`` that
        tile holds, with the vertices they use (a vertex on a seam in every tile that uses it, at the
        same position, so that the tiles still meet exactly)."""
        order = np.argsort(self.face_tile, kind="stable")
        tiles, starts = np.unique(self.face_tile[order], return_index=True)
        ends = np.append(starts[1:], order.size)
        return [(int(t), self.mesh.subset_faces(np.sort(order[a:b])))
                for t, a, b in zip(tiles, starts, ends, strict=True)]  # fmt: skip


def tile_of_points(plan: ScenePlan, points: np.ndarray) -> np.ndarray:
    """[P] int64 the number of the tile whose cells hold each of ``points`` ([P, 3], world units;
    those outside the grid go to the nearest tile)."""
    cell = np.floor((np.asarray(points, np.float64) - np.asarray(plan.grid.origin)) / plan.grid.spacing)
    cell = np.clip(cell, 0, np.asarray(plan.grid.shape) - 2).astype(np.int64)
    idx = np.minimum(cell // plan.tile, np.asarray(plan.tiles) - 1)
    return (idx[:, 0] * plan.tiles[1] + idx[:, 1]) * plan.tiles[2] + idx[:, 2]


def iso_stride(shape: Sequence[int]) -> int:
    """The column stride of the iso level's images for a grid of ``shape`` points: :data:`ISO_STRIDE`, or
    the smallest above it whose largest image (across the two longest axes) holds at most
    :data:`ISO_MAX_COLUMNS` columns."""
    a, b = sorted(int(n) for n in shape)[1:]
    stride = max(ISO_STRIDE, math.isqrt(a * b // ISO_MAX_COLUMNS))
    while -(-a // stride) * -(-b // stride) > ISO_MAX_COLUMNS:
        stride += 1
    return stride


def _column_alphas(plan: ScenePlan, splat: Splat, stride: int = ISO_STRIDE) -> list[torch.Tensor]:
    """The splat's alpha along the grid's three axes at every ``stride``-th column both ways
    ([ceil(n_b / stride), ceil(n_c / stride)] for axis a; the low-pass filter is the grid's, one grid
    spacing a pixel, as :func:`~microdreamer.field.iso.column_alpha` has it). The Gaussians are taken
    :data:`PREPARE_CHUNK` at a time (bounded memory): ``1 - alpha`` is the product of the chunks' own. On a
    CUDA plan the chunks go to the device and the three images are one launch of the carving kernel
    (:func:`~microdreamer.field.carve.projected_alphas`, the same float32 terms summed in fixed point)."""
    from microdreamer.field.carve import DILATION, projected_alphas

    keep = splat.opacities().float() > plan.config.min_opacity
    index = torch.nonzero(keep).flatten()
    sizes = [tuple(-(-plan.grid.shape[b] // stride) for b in range(3) if b != a) for a in range(3)]
    device = plan.device
    log_t = [torch.zeros(size, dtype=torch.float64, device=device) for size in sizes]
    bases = [torch.eye(3, dtype=torch.float64)[[b for b in range(3) if b != a]] for a in range(3)]
    for start in range(0, index.numel(), PREPARE_CHUNK):
        chunk = torch.zeros_like(keep)
        chunk[index[start : start + PREPARE_CHUNK]] = True
        if device.type != "cpu":
            raw, _ = _prepare_voxel_units(splat, chunk, plan.grid, plan.config, 0.0, device, to_host=False)
            backend = "cuda" if plan.backend == "cuda" else "torch"
            alphas = projected_alphas(raw, [b.to(device) for b in bases], [((0.0, 0.0), size) for size in sizes],
                                      float(stride), DILATION / stride**2, backend=backend)  # fmt: skip
            for a in range(3):
                log_t[a] += torch.log1p(-alphas[a].double())
            del raw, alphas
            continue
        raw, _ = _prepare_voxel_units(splat, chunk, plan.grid, plan.config, 0.0)
        # the three images in one call: each Gaussian's marginal set up once (each image's terms and sums
        # as three calls give them)
        alphas = projected_alphas(raw, bases, [((0.0, 0.0), size) for size in sizes], float(stride),
                                  DILATION / stride**2, backend="torch")  # fmt: skip
        for a in range(3):
            log_t[a] += torch.log1p(-alphas[a].double())
        del raw, alphas
    return [(-torch.expm1(t)).float().cpu() for t in log_t]


def _sync(device: torch.device) -> None:
    """Wait for ``device``'s queued work (a stage's seconds include its kernels)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _peak_rss_gib() -> float:
    """This process's peak resident memory so far, GiB (Linux: ru_maxrss in KiB)."""
    import resource

    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 3)


def _signature(plan: ScenePlan, splat: Splat, threshold, mesh_config: MeshConfig, colors: bool) -> str:
    """A digest of everything a tile's piece depends on (the resume check)."""
    h = hashlib.sha256()
    for t in (splat.means, splat.opacity_logits, splat.log_scales, splat.quats, splat.sh_dc):
        h.update(t.detach().cpu().contiguous().numpy())  # the buffer itself, no copy
    h.update(json.dumps([plan.grid.origin, plan.grid.spacing, plan.grid.shape, plan.tile, repr(plan.config),
                         repr(threshold), mesh_config.merge_tolerance, colors, plan.backend]).encode())  # fmt: skip
    return h.hexdigest()[:16]


def _write_state(work: Path, state: dict) -> None:
    tmp = work / "scene.json.tmp"
    tmp.write_text(json.dumps(state))
    os.replace(tmp, work / "scene.json")


def _save_piece(path: Path, piece: TilePiece) -> None:
    tmp = path.with_name(path.name + ".tmp.npz")
    arrays = {k: getattr(piece, k) for k in ("vertices", "faces", "keys", "candidates")}
    if piece.colors is not None:
        arrays["colors"] = piece.colors
    np.savez(tmp, **arrays)
    os.replace(tmp, path)


def _load_piece(path: Path) -> TilePiece:
    with np.load(path) as z:
        return TilePiece(z["vertices"], z["faces"], z["keys"], z["candidates"],
                         z["colors"] if "colors" in z else None)  # fmt: skip


def scene_to_mesh(
    splat: Splat,
    field_config: FieldConfig,
    mesh_config: MeshConfig,
    tile: int = 128,
    voxel: float | str = "auto",
    tiles_along_longest: int | None = None,
    colors: bool = False,
    work_dir: str | os.PathLike | None = None,
    progress: Callable[[str], None] | None = None,
    plan: ScenePlan | None = None,
    device: str | torch.device = "cpu",
    backend: str = "auto",
    map_tiles: TileMap | None = None,
    memory: int | None = None,
    field_cache: int | str = "auto",
) -> SceneResult:
    """Mesh a scene tile by tile (module docstring): plan, iso level, tiles, weld, cleanup.

    Args:
        splat: N Gaussians (moved to the CPU).
        field_config: exact mode's settings (``resolution`` is not used: the grid's spacing is ``voxel``).
        mesh_config: ``threshold`` (a number or ``"auto"``), ``min_component_fraction`` (here: of the
            largest component's faces, so that a scene of many objects keeps them all),
            ``remove_cavities``, ``merge_tolerance``, ``decimate_target``; ``carve`` is not applied.
        tile, voxel, tiles_along_longest: the plan (:func:`plan_scene`).
        colors: vertex colours from the splat's colour field, tile by tile.
        work_dir: a folder keeping the iso level, the first pass's tile fields until their tile is meshed
            (CPU plans only: a device computes a field again faster than a disk reads it), and each finished
            tile's piece; a rerun with the same splat and settings loads them instead of computing them
            again (resume). Without one, the second pass computes each field again.
        progress: called with a one-line message per tile.
        plan: a plan made before (the other plan arguments, ``device`` and ``backend`` included, are then
            ignored).
        device, backend: where the tiles run and their field implementation (:func:`plan_scene`).
        map_tiles: runs the per-tile work (the first pass's field maxima, the tiles' pieces); default
            :func:`serial_tiles`. The weld, the iso level and the cleanup run here.
        memory: bytes one tile's work may take, per worker: caps the tile (:func:`plan_scene`).
        field_cache: bytes of tile fields the work folder may keep between the passes, or ``"auto"``
            (:func:`field_cache_bytes`); the tiles past it (in tile order) compute their field again.

    Raises:
        ValueError: no Gaussian above the opacity filter, or no surface at the level.
    """
    from microdreamer.field.iso import IsoLevel, choose_iso_level
    from microdreamer.mesh.cleanup import _vertex_components, cleanup_mesh_with_stats, decimate

    say = progress or (lambda message: None)
    map_tiles = map_tiles or serial_tiles
    seconds: dict[str, float] = {}
    start = time.perf_counter()
    splat = splat.to("cpu")
    if plan is None:
        plan = plan_scene(splat, field_config, tile, voxel, tiles_along_longest, device, backend, memory, say)
    if len(plan.prepared) == 0:
        raise ValueError(f"no Gaussian has opacity above {field_config.min_opacity}; nothing to mesh")
    plan.gaussians_of(0)  # bin now, inside the plan's time
    _sync(plan.device)
    seconds["plan"] = time.perf_counter() - start
    rss = {"plan": _peak_rss_gib()}
    counter = MemoryCounter()
    worker_seconds: dict[str, float] = {}
    g = plan.grid
    diag = g.spacing * math.sqrt(sum((s - 1) ** 2 for s in g.shape))
    tolerance = min(float(mesh_config.merge_tolerance) * diag, MERGE_MAX_VOXELS * g.spacing)
    tiles_occupied, per_tile = plan.occupied()
    occupied = tiles_occupied.tolist()
    need = tile_memory(plan.tile, int(per_tile.max()) if per_tile.numel() else 0)
    budget = f" of a {memory / 1e9:.3g} GB budget" if memory is not None else ""
    say(f"scene grid {g.shape[0]}x{g.shape[1]}x{g.shape[2]} points of {g.spacing:.4g}, "
        f"{plan.num_tiles} tiles of {plan.tile}^3 cells ({len(occupied)} with Gaussians; one tile's work "
        f"about {need / 1e9:.2g} GB{budget})")  # fmt: skip
    if memory is not None and need > memory:
        logger.warning("the densest tile's work (about %.2g GB) may pass the %.3g GB budget", need / 1e9,
                       memory / 1e9)  # fmt: skip

    work = Path(work_dir) if work_dir is not None else None
    signature = _signature(plan, splat, mesh_config.threshold, mesh_config, colors) if work else ""
    state: dict = {}
    if work is not None:
        work.mkdir(parents=True, exist_ok=True)
        state_path = work / "scene.json"
        if state_path.exists():
            state = json.loads(state_path.read_text())
        if state.get("signature") != signature:  # another splat or other settings: start again
            for old in [*work.glob("tile_*.npz"), *work.glob("field_*.npy")]:
                old.unlink()
            state = {"signature": signature}
            _write_state(work, state)

    t0 = time.perf_counter()
    fields_resumed = 0
    if mesh_config.threshold != "auto":
        iso = IsoLevel(float(mesh_config.threshold), "fixed")
    elif "level" in state:
        iso = IsoLevel(state["level"], state["iso_method"], state.get("iso_iou"))
    else:  # first pass: the column maxima of the field at every stride-th column, tile by tile
        stride = iso_stride(g.shape)
        if stride != ISO_STRIDE:
            say(f"iso level from a column every {stride} grid points (images of {ISO_MAX_COLUMNS:,} at most)")
        sides = [-(-n // stride) for n in g.shape]
        maxima = [np.zeros([sides[b] for b in range(3) if b != a], np.float32) for a in range(3)]
        t1 = time.perf_counter()
        cache_below = None
        if work is not None and plan.device.type == "cpu":
            cap = field_cache_bytes(work, field_cache)
            sizes = np.cumsum([field_file_bytes(plan, t) for t in occupied])
            fits = int(np.searchsorted(sizes, cap, side="right"))
            if fits < len(occupied):
                cache_below = occupied[fits]
                say(f"work folder: the first {fits} of {len(occupied)} tile fields kept on disk ({cap / 1e9:.3g} "
                    "GB at most), the others computed again")  # fmt: skip
        results = map_tiles(tile_maxima, plan, occupied, {"work": work, "cache_below": cache_below})
        for n, (t, ((tile_max, loaded), used, part)) in enumerate(zip(occupied, results, strict=True)):
            _merge_memory(counter, used)
            _add_seconds(worker_seconds, part)
            fields_resumed += int(loaded)
            first = [b[0] for b in plan.tile_points(t)]
            for a in range(3):  # the column maxima of the tile's points, across axis a, at the kept columns
                src, dst = [], []
                for b, n_b in zip([b for b in range(3) if b != a], tile_max[a].shape, strict=True):
                    skip = -first[b] % stride  # the tile's first column of a multiple of the stride
                    count = len(range(skip, n_b, stride))
                    src.append(slice(skip, n_b, stride))
                    dst.append(slice((first[b] + skip) // stride, (first[b] + skip) // stride + count))
                view = maxima[a][tuple(dst)]
                np.maximum(view, tile_max[a][tuple(src)], out=view)
            say(f"iso-level pass: tile {n + 1}/{len(occupied)}")
        seconds["iso_field"] = time.perf_counter() - t1
        t1 = time.perf_counter()
        alphas = _column_alphas(plan, splat, stride)
        _sync(plan.device)
        seconds["iso_alpha"] = time.perf_counter() - t1
        iso = choose_iso_level([torch.from_numpy(m) for m in maxima], alphas)
        del maxima, alphas
    seconds["iso"] = time.perf_counter() - t0 - seconds.get("iso_field", 0.0) - seconds.get("iso_alpha", 0.0)
    rss["iso"] = _peak_rss_gib()
    if work is not None:
        state.update(level=iso.level, iso_method=iso.method, iso_iou=iso.iou)
        _write_state(work, state)

    t0 = time.perf_counter()
    tile_seconds: dict[str, float] = {}
    pieces, resumed = [], 0
    kwargs = {"level": iso.level, "tolerance": tolerance, "colors": colors, "work": work}
    for n, ((piece, loaded), used, part) in enumerate(map_tiles(tile_piece, plan, occupied, kwargs)):
        _merge_memory(counter, used)
        _add_seconds(tile_seconds, part)
        resumed += int(loaded)
        pieces.append(piece)
        say(f"tile {n + 1}/{len(occupied)}: {pieces[-1].faces.shape[0]:,} faces")
    if map_tiles is serial_tiles:  # this process's seconds: the stages' split of the wall clock
        seconds.update(tile_seconds)
        seconds["tiles_other"] = time.perf_counter() - t0 - sum(tile_seconds.values())  # loading, saving
    else:  # the workers' seconds add up past the wall clock: kept apart
        seconds["tiles"] = time.perf_counter() - t0
        _add_seconds(worker_seconds, tile_seconds)
    rss["tiles"] = _peak_rss_gib()

    t0 = time.perf_counter()
    welded, candidates, face_piece = weld_pieces(pieces)
    del pieces
    seconds["weld"] = time.perf_counter() - t0
    if welded.is_empty:
        raise ValueError(f"no surface at the iso-level {iso.level:g} in any tile")
    t0 = time.perf_counter()
    _, labels = _vertex_components(welded.faces, welded.num_vertices)
    counts = np.bincount(labels[welded.faces[:, 0]])
    fraction = mesh_config.min_component_fraction * float(counts.max()) / float(welded.num_faces)
    merge = float(mesh_config.merge_tolerance)
    v = welded.vertices
    extent = math.hypot(*(float(v[:, a].max()) - float(v[:, a].min()) for a in range(3)))  # cleanup's
    if merge * extent > MERGE_MAX_VOXELS * g.spacing:  # the tolerance in voxels, not growing with the scene
        merge = MERGE_MAX_VOXELS * g.spacing / extent
    clean_config = replace(mesh_config, threshold=iso.level, min_component_fraction=fraction,
                           merge_tolerance=merge)  # fmt: skip
    mesh, cleanup = cleanup_mesh_with_stats(welded, clean_config, _Candidates(candidates))
    face_tile = np.asarray(occupied, np.int64)[face_piece[cleanup.face_source]]
    del face_piece
    if mesh_config.decimate_target is not None and mesh.num_faces > mesh_config.decimate_target:
        mesh = decimate(mesh, mesh_config.decimate_target)
        face_tile = tile_of_points(plan, mesh.vertices[mesh.faces].astype(np.float64).mean(1))
    seconds["cleanup"] = time.perf_counter() - t0
    rss["cleanup"] = _peak_rss_gib()
    stats = {
        "tiles": plan.num_tiles,
        "tiles_with_gaussians": len(occupied),
        "tiles_resumed": resumed,
        "fields_resumed": fields_resumed,
        "faces_marching_cubes": int(welded.num_faces),
        "faces_after_cleanup": int(cleanup.faces_out),
        "components_removed": cleanup.components_removed,
        "cavities_removed": cleanup.cavities_removed,
        "vertices": mesh.num_vertices,
        "faces": mesh.num_faces,
        "grid_shape": list(g.shape),
        "voxel": g.spacing,
        "tile_cells": plan.tile,
        "device": str(plan.device),
        "backend": plan.backend,
        "tile_memory_estimate_bytes": need,
        "memory_budget_bytes": memory,
        "seconds": seconds,
        "peak_rss_GiB_after": rss,
        **({"worker_seconds": worker_seconds} if map_tiles is not serial_tiles else {}),
    }
    if plan.device.type == "cuda":
        stats["peak_gpu_GiB"] = round(torch.cuda.max_memory_allocated(plan.device) / 2**30, 3)
    return SceneResult(mesh, face_tile, plan, iso.level, iso.method, iso.iou, stats, counter)
