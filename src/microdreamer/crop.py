"""Crop a splat to a box before it is meshed, rendered or viewed: a box the user gives, or ``auto``: the
main object of a scene capture, with the ground it stands on and the floaters far around it left out.

Both work in the frame after ``--up`` (+y up). A Gaussian is kept when its centre lies in the box; the
mesh export then also zeroes the density outside the box (:func:`mask_outside`) and clamps the mesh's
vertices into it (:func:`clamp_into`), so an explicit box crops exactly, and the field's grid spans the
kept Gaussians: the object gets the whole grid's resolution.

``auto`` (:func:`auto_box`), on the Gaussians with opacity at least :data:`AUTO_MIN_OPACITY`, on an
occupancy grid of :data:`AUTO_CELLS` cells along the longest side of their central 98 % (floaters
beyond it fall outside the grid):

1. the ground: the lowest run of y-layers that are each wider than :data:`GROUND_AREA` of the widest
   layer, thin (under a quarter of the height), with less than :data:`GROUND_BELOW` of the weight below
   it and only narrower layers above (a floor or a plate under the object); the box starts above it.
   A scene without one keeps its bottom;
2. the object: the heaviest 26-connected group of occupied cells above the ground (floaters, and pieces
   of the scene apart from the object, are other groups);
3. the box: that group's Gaussians' centres, grown by :data:`AUTO_MARGIN` of its size on every side
   but the bottom (which stays above the ground).

NumPy and SciPy only; :func:`crop_splat` takes a :class:`~microdreamer.splat.Splat` (torch).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from microdreamer.errors import InputError

#: Gaussians fainter than this are ignored by ``auto`` (they are kept or dropped by the box like any)
AUTO_MIN_OPACITY = 0.1
#: occupancy cells along the longest side of the visible Gaussians' central 98 %
AUTO_CELLS = 64
#: a cell is occupied when it holds at least this share of the visible Gaussians' summed opacity
AUTO_CELL_SHARE = 2e-5
#: a y-layer belongs to the ground when its occupied area is at least this share of the widest layer's
GROUND_AREA = 0.5
#: the most of the visible weight the layers under a ground may hold (its own stragglers)
GROUND_BELOW = 0.05
#: the object's box grows by this share of its size on each side (not below the ground)
AUTO_MARGIN = 0.03
#: ``core_box``: occupancy cells along the longest side of the current box
CORE_CELLS = 64
#: ``core_box``: the reference density, a quantile of the density of the Gaussians' cells, opacity-weighted
CORE_QUANTILE = 0.9
#: ``core_box``: a cell is dense at this share of the reference density or more
CORE_SHARE = 0.003
#: ``core_box``: a group of dense cells counts when it holds this share of the heaviest group's opacity
CORE_GROUP_SHARE = 0.01
#: ``core_box``: the most rounds (each on the box the one before kept)
CORE_ROUNDS = 8
#: ``core_box``: the core's box grows by this share of its longest side on each side
CORE_MARGIN = 0.03


@dataclass(frozen=True)
class CropBox:
    """An axis-aligned box in the splat's coordinates after ``--up``.

    Attributes:
        lo: (x0, y0, z0).
        hi: (x1, y1, z1), each above its ``lo``.
        how: ``"given"``, or what ``auto`` found (for the line printed).
    """

    lo: tuple[float, float, float]
    hi: tuple[float, float, float]
    how: str = "given"

    def describe(self) -> str:
        """The line a command prints: the box and, for ``auto``, what it left out."""
        box = ",".join(f"{v:.4g}" for v in (*self.lo, *self.hi))
        return f"crop: {box}" + ("" if self.how == "given" else f" (auto: {self.how})")


def parse_crop(spec: str, setting: str = "--crop") -> CropBox | str:
    """``"auto"``, or the :class:`CropBox` of ``"X0,Y0,Z0,X1,Y1,Z1"``; InputError otherwise."""
    from microdreamer.config import parse_crop_spec

    parsed = parse_crop_spec(spec, setting)
    return parsed if parsed == "auto" else CropBox(*parsed)


def inside(means: np.ndarray, box: CropBox) -> np.ndarray:
    """[N] bool: centres ``means`` [N, 3] inside ``box`` (its faces included)."""
    m = np.asarray(means)
    return ((m >= np.asarray(box.lo, m.dtype)) & (m <= np.asarray(box.hi, m.dtype))).all(-1)


def occupancy(
    points: np.ndarray, weights: np.ndarray, lo: np.ndarray, hi: np.ndarray, cell: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The summed ``weights`` [N] of ``points`` [N, 3] per cubic cell of side ``cell`` of the box ``lo`` ..
    ``hi``: ``(grid [X, Y, Z] float64, idx [N, 3] int64 each point's cell, ok [N] bool: its cell is in the
    grid)``."""
    dims = np.maximum(1, np.ceil((np.asarray(hi) - lo) / cell).astype(np.int64))
    idx = np.floor((points - lo) / cell).astype(np.int64)
    ok = ((idx >= 0) & (idx < dims)).all(-1)
    flat = np.ravel_multi_index(tuple(idx[ok].T), tuple(dims))
    grid = np.bincount(flat, weights=weights[ok], minlength=int(np.prod(dims))).reshape(tuple(dims))
    return grid, idx, ok


def auto_box(means: np.ndarray, opacities: np.ndarray) -> CropBox:
    """The box of the main object of a scene (module docstring).

    Args:
        means: [N, 3] Gaussian centres, +y up.
        opacities: [N] opacities in [0, 1].
    """
    m = np.asarray(means, np.float64)
    w = np.asarray(opacities, np.float64)
    visible = w >= AUTO_MIN_OPACITY
    if visible.sum() < 10:
        visible = np.ones(len(m), bool)
    p, pw = m[visible], w[visible]
    if len(p) == 0:
        raise InputError("--crop auto: the splat is empty")
    lo, hi = np.quantile(p, 0.01, axis=0), np.quantile(p, 0.99, axis=0)
    size = float((hi - lo).max())
    if not size > 0:
        return CropBox(tuple(p.min(0)), tuple(p.max(0) + 1e-6), "all Gaussians at one point")
    cell = size / AUTO_CELLS
    lo, hi = lo - cell, hi + cell  # a border, so that the central part's edge cells are whole
    grid, idx, ok = occupancy(p, pw, lo, hi, cell)
    occupied = grid >= AUTO_CELL_SHARE * pw.sum()
    left_out = []
    y0 = 0
    area = occupied.sum(axis=(0, 2))  # occupied cells per y-layer
    if area.max() > 0:
        wide = area >= GROUND_AREA * area.max()
        first = int(np.argmax(wide))
        top = first
        while top + 1 < len(area) and wide[top + 1]:
            top += 1
        above = area[top + 1 :]
        below = float(grid[:, :first].sum()) / float(grid.sum())  # the ground's own stragglers only
        # a ground: a thin wide run at the bottom with something narrower standing on it
        if (
            below < GROUND_BELOW
            and above.sum() > 0
            and above.max() < GROUND_AREA * area.max()
            and (top - first < len(area) // 4)
        ):
            y0 = top + 1
            left_out.append(f"the ground below y = {lo[1] + y0 * cell:.4g}")
    from scipy import ndimage

    occupied[:, :y0] = False
    labels, count = ndimage.label(occupied, structure=np.ones((3, 3, 3)))
    if count == 0:
        raise InputError(
            "--crop auto: no object found above the ground; give the box as --crop X0,Y0,Z0,X1,Y1,Z1"
        )
    weight = ndimage.sum(grid, labels, index=np.arange(1, count + 1))
    main = 1 + int(np.argmax(weight))
    if count > 1:
        left_out.append(f"{count - 1} other group{'s' if count > 2 else ''} of Gaussians apart from it")
    cell_label = np.zeros(len(p), int)
    cell_label[ok] = labels[tuple(idx[ok].T)]
    obj = p[cell_label == main]
    far = int((~ok).sum())
    if far:
        left_out.append(f"{far} Gaussians far out")
    olo, ohi = obj.min(0), obj.max(0)
    pad = AUTO_MARGIN * float((ohi - olo).max())
    box_lo = olo - pad
    if y0:
        box_lo[1] = max(box_lo[1], lo[1] + y0 * cell)
    box_hi = ohi + pad
    kept = int(inside(m, CropBox(tuple(box_lo), tuple(box_hi))).sum())
    how = f"the main object, {kept:,} of {len(m):,} Gaussians" + (
        "; left out " + ", ".join(left_out) if left_out else ""
    )
    return CropBox(tuple(float(v) for v in box_lo), tuple(float(v) for v in box_hi), how)


def resolve_crop(splat, spec: str | None, setting: str = "--crop") -> CropBox | None:
    """The box of ``spec`` (None, ``"auto"`` or six numbers) for ``splat`` (a Splat, after ``--up``)."""
    if not spec:
        return None
    box = parse_crop(spec, setting)
    if box != "auto":
        return box
    import torch

    with torch.no_grad():
        means = splat.means.detach().float().cpu().numpy()
        opacities = splat.opacities().detach().float().cpu().numpy()
    return auto_box(means, opacities)


def crop_splat(splat, box: CropBox, name: str = "splat"):
    """The Gaussians of ``splat`` (a Splat) whose centres lie in ``box``; InputError when none does."""
    import torch

    keep = torch.from_numpy(inside(splat.means.detach().float().cpu().numpy(), box)).to(splat.means.device)
    if not bool(keep.any()):
        m = splat.means.detach().float().cpu().numpy()
        bounds = ",".join(f"{v:.4g}" for v in (*m.min(0), *m.max(0)))
        raise InputError(
            f"{name}: no Gaussian lies in the crop box {','.join(f'{v:.4g}' for v in (*box.lo, *box.hi))}; "
            f"the splat spans {bounds} (after --up)"
        )
    return splat.subset(keep)


def mask_outside(values, origin, spacing: float, box: CropBox):
    """The field ``values`` [R, R, R] (torch, grid point (i, j, k) at ``origin + spacing * (i, j, k)``)
    with every grid point outside ``box`` set to 0 (a new tensor)."""
    import torch

    r = values.shape
    out = values.clone()
    for axis in range(3):
        coord = origin[axis] + spacing * torch.arange(r[axis], dtype=torch.float64)
        outside = ((coord < box.lo[axis]) | (coord > box.hi[axis])).to(values.device)
        shape = [1, 1, 1]
        shape[axis] = r[axis]
        out = torch.where(outside.reshape(shape), torch.zeros((), dtype=out.dtype, device=out.device), out)
    return out


def clamp_into(vertices: np.ndarray, box: CropBox) -> np.ndarray:
    """Vertices [V, 3] clamped into ``box`` (marching cubes places a surface crossing between the last
    point inside and the first outside: this moves those vertices less than one voxel, onto the box)."""
    return np.clip(vertices, np.asarray(box.lo, vertices.dtype), np.asarray(box.hi, vertices.dtype))


def core_box(means: np.ndarray, opacities: np.ndarray) -> CropBox:
    """The box of a scene capture's core, its sparse far background left out (``--tiles`` with
    ``--background drop``).

    In rounds, on the Gaussians inside the current box (at first, all of them): an occupancy grid of
    :data:`CORE_CELLS` cells along the box's longest side sums their opacities per cell; the reference
    density is the weighted :data:`CORE_QUANTILE` quantile of the density a Gaussian's cell has (the
    densest 10 % of the opacity lie in cells at least that dense); the cells of at least
    :data:`CORE_SHARE` of it are dense; of their 26-connected groups those holding at least
    :data:`CORE_GROUP_SHARE` of the heaviest one's opacity count (all of them, not just the heaviest), and
    the next box is that of the Gaussians in their cells or the cells' 26 neighbours. Rounds stop when a box keeps every Gaussian of the one before
    (at most :data:`CORE_ROUNDS`); the last box grows by :data:`CORE_MARGIN` of its longest side on every
    side. A scene without a sparse far part keeps its box whole.

    Args:
        means: [N, 3] Gaussian centres.
        opacities: [N] opacities in [0, 1].
    """
    from scipy import ndimage

    m = np.asarray(means, np.float64)
    w = np.asarray(opacities, np.float64)
    if len(m) == 0:
        raise InputError("the splat is empty")
    whole_lo, whole_hi = m.min(0), m.max(0)
    lo, hi = whole_lo, whole_hi
    for _ in range(CORE_ROUNDS):
        held = ((m >= lo) & (m <= hi)).all(-1)
        p, pw = m[held], w[held]
        size = float((hi - lo).max())
        if not size > 0 or pw.sum() <= 0:
            break
        cell = size / CORE_CELLS
        grid, idx, _ = occupancy(p, pw, lo, lo + cell * (np.floor((hi - lo) / cell) + 1), cell)
        # the weighted quantile over Gaussians of their cell's weight: over cells, each weighted by itself
        values = np.sort(grid[grid > 0])
        mass = np.cumsum(values)
        ref = values[min(len(values) - 1, int(np.searchsorted(mass, CORE_QUANTILE * mass[-1])))]
        labels, count = ndimage.label(grid >= CORE_SHARE * ref, structure=np.ones((3, 3, 3)))
        weight = ndimage.sum(grid, labels, index=np.arange(1, count + 1))
        heavy = np.flatnonzero(weight >= CORE_GROUP_SHARE * weight.max()) + 1
        near = ndimage.binary_dilation(np.isin(labels, heavy), structure=np.ones((3, 3, 3), bool))
        core = p[near[tuple(np.minimum(idx, np.asarray(near.shape) - 1).T)]]
        new_lo, new_hi = core.min(0), core.max(0)
        if np.array_equal(new_lo, lo) and np.array_equal(new_hi, hi):
            break
        lo, hi = new_lo, new_hi
    if np.array_equal(lo, whole_lo) and np.array_equal(hi, whole_hi):
        return CropBox(tuple(float(v) for v in lo), tuple(float(v) for v in hi), "the whole scene")
    pad = CORE_MARGIN * float((hi - lo).max())
    return CropBox(tuple(float(v) for v in lo - pad), tuple(float(v) for v in hi + pad), "the scene's core")
