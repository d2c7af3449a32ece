"""The iso-level of a splat's density field, chosen from the splat itself.

A fixed level does not fit every splat: a generated object (DreamGaussian) is a pile of large,
overlapping Gaussians whose summed density reaches tens inside it, while a real capture is a thin,
fuzzy layer of small, partly transparent Gaussians whose density stays well below 1 at most points
even where the splat renders opaque (its alpha gathers many of them along each ray; a point sample
sees only those at that depth). The level chosen here makes the mesh's silhouettes match the splat's.

Seen along a grid axis, orthographically, at the grid's own columns, the splat has the alpha

    A(p) = 1 - prod_i (1 - a_i(p)),   a_i(p) = min(0.999, o_i exp(-d^T Sigma2_i^-1 d / 2)),

``d`` the column's offset from Gaussian i's centre across the axis, ``Sigma2_i`` its covariance
marginalised onto the plane across the axis plus ``dilation * h^2 I`` (the 3DGS rasteriser's low-pass
filter of 0.3 pixel^2, one pixel per grid column), terms ``a_i < 1/255`` skipped, as the rasteriser
skips them. Along a column the product does not depend on the order, and an orthographic projection
of a Gaussian is exactly its marginal, so this is what a 3DGS rasteriser shows through an orthographic
camera, with no render. The mesh covers the same column where the field's largest sample along it
exceeds the level (marching cubes follows the trilinear interpolant, whose maximum along a grid line
is its largest sample there). :func:`choose_iso_level` picks the level whose silhouettes
``{column maximum > level}`` match ``{A > alpha_level}`` best (intersection over union, the columns of
the three axes pooled). The original Gaussians give the alpha (no voxel filter); the field is whatever
the config made (with its filter).

Cost: one pass over the (Gaussian, column) pairs of each axis' footprints, of the order of the field's
own (Gaussian, voxel) pairs divided by R, and three max-reductions of the grid.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from microdreamer.field.carve import DILATION, projected_alpha, projected_alphas
from microdreamer.field.common import FieldConfig, GridSpec, PreparedGaussians, prepare_gaussians

# DreamGaussian's density_thresh: the level of ``upstream`` mode
UPSTREAM_ISO_LEVEL = 1.0

__all__ = [
    "DILATION",
    "UPSTREAM_ISO_LEVEL",
    "IsoLevel",
    "auto_iso_level",
    "choose_iso_level",
    "column_alpha",
    "resolve_iso_level",
]


@dataclass
class IsoLevel:
    """An iso-level and how it was set.

    Attributes:
        level: the iso-level (the object is where the field exceeds it).
        method: ``"auto"`` (chosen from the splat), ``"upstream"`` (DreamGaussian's 1) or ``"fixed"``.
        iou: auto: the silhouettes' intersection over union at ``level`` (three axes pooled).
        iou_per_axis: auto: (x, y, z) the same per axis.
        column_alphas: auto: the splat's alpha along the x, y and z axes at the grid's columns
            (:func:`column_alpha`), for the stages after it (silhouette carving).
    """

    level: float
    method: str = "fixed"
    iou: float | None = None
    iou_per_axis: tuple[float, float, float] | None = None
    column_alphas: list[torch.Tensor] | None = field(default=None, repr=False)


def column_alpha(
    prepared: PreparedGaussians,
    grid: GridSpec,
    axis: int,
    dilation: float = DILATION,
    max_pairs: int = 1 << 18,
) -> torch.Tensor:
    """The splat's orthographic alpha along ``axis`` at the grid's columns (see the module docstring):
    :func:`~microdreamer.field.carve.projected_alpha` on the plane of the two other axes, one pixel per
    column.

    Args:
        prepared: N Gaussians as :func:`prepare_gaussians` makes them with ``voxel_filter=0``: their
            own opacities and covariances, normalised coordinates.
        grid: the field's grid; the columns are its points across ``axis``.
        axis: 0, 1 or 2.
        dilation: added to every 2D covariance, in squared grid spacings.
        max_pairs: (Gaussian, column) pairs evaluated at once (memory: about 16 bytes each).

    Returns:
        [R, R] float32 alpha on the Gaussians' device; ``[u, v]`` is the column at grid indices (u, v)
        of the two other axes in increasing order (the layout of ``values.amax(axis)``).
    """
    if axis not in (0, 1, 2):
        raise ValueError(f"axis must be 0, 1 or 2, got {axis}")
    r = grid.resolution
    basis = torch.eye(3, dtype=torch.float64)[[a for a in range(3) if a != axis]]
    return projected_alpha(prepared, basis, (-1.0, -1.0), (r, r), 2.0 / (r - 1), dilation, max_pairs)


def choose_iso_level(
    column_max: list[torch.Tensor], alphas: list[torch.Tensor], alpha_level: float = 0.5
) -> IsoLevel:
    """The level t maximising the pooled IoU of ``{column_max > t}`` and ``{alpha > alpha_level}``.

    The IoU changes only where t passes a column's maximum, so every gap between consecutive distinct
    column maxima (and 0) is tried, at its midpoint; among equally good levels the highest wins.

    Args:
        column_max: per view, [H, W] the field's largest sample along each column.
        alphas: per view, [H, W] the splat's alpha at the same columns.
        alpha_level: the alpha of the splat's silhouette.

    Returns:
        :class:`IsoLevel` with ``method="auto"``. When the splat covers no column or the field is 0
        everywhere, the level is DreamGaussian's 1 and ``iou`` is None.
    """
    m = torch.cat([x.reshape(-1).double().cpu() for x in column_max])
    a = torch.cat([x.reshape(-1).cpu() > alpha_level for x in alphas])
    if not a.any() or not (m.numel() and float(m.max()) > 0.0):
        return IsoLevel(UPSTREAM_ISO_LEVEL, "auto")
    values = torch.unique(torch.cat([m.new_zeros(1), m.clamp_min(0.0)]))  # sorted, from 0
    levels = (values[:-1] + values[1:]) / 2  # one level in every gap, the one above 0 included
    # |{m > t}| and |{m > t} & {a}| for every t at once, from sorted values
    covered = int(a.sum())
    above = m.numel() - torch.searchsorted(torch.sort(m).values, levels, right=True)
    inter = covered - torch.searchsorted(torch.sort(m[a]).values, levels, right=True)
    iou = inter.double() / (above + covered - inter).double()
    k = int(torch.nonzero(iou >= iou.max()).max())
    level = float(levels[k])
    per_axis = []
    for x, y in zip(column_max, alphas, strict=True):
        mm, aa = x.cpu() > level, y.cpu() > alpha_level
        union = int((mm | aa).sum())
        per_axis.append(int((mm & aa).sum()) / union if union else 1.0)
    return IsoLevel(level, "auto", float(iou[k]), tuple(per_axis))


def auto_iso_level(
    splat, values: torch.Tensor, grid: GridSpec, config: FieldConfig, alpha_level: float = 0.5
) -> IsoLevel:
    """The iso-level of ``values`` (the field of ``splat`` under ``config``) whose silhouettes along
    the grid's three axes match the splat's ``alpha_level`` contour best (see the module docstring).

    Args:
        splat: the splat the field was computed from (on the device to compute on: on a GPU the axis
            images come from :func:`~microdreamer.field.carve.projected_alphas`' kernel, float32 terms, where
            the CPU sums float64 ones; the two agree to about 1e-7 in alpha).
        values: [R, R, R] its density field.
        grid: the field's grid (from ``prepare_gaussians(splat, config)``).
        config: the field's settings.
        alpha_level: the alpha of the splat's silhouette.
    """
    raw, raw_grid = prepare_gaussians(splat, replace(config, voxel_filter=0.0))
    if (
        raw_grid.center != grid.center
        or raw_grid.scale != grid.scale
        or values.shape != (grid.resolution,) * 3
    ):
        raise ValueError("values is not the field of this splat on this grid")
    if raw.means.is_cuda:  # the carving kernel, float32 terms summed in fixed point (one launch)
        r = grid.resolution
        bases = [torch.eye(3, dtype=torch.float64)[[b for b in range(3) if b != a]] for a in range(3)]
        alphas = projected_alphas(raw, bases, [((-1.0, -1.0), (r, r))] * 3, 2.0 / (r - 1), backend="auto")
    else:
        alphas = [column_alpha(raw, grid, a) for a in range(3)]
    values = values.to(raw.means.device)
    return replace(
        choose_iso_level([values.amax(a) for a in range(3)], alphas, alpha_level), column_alphas=alphas
    )


def resolve_iso_level(
    threshold: float | str, splat, values: torch.Tensor, grid: GridSpec, config: FieldConfig
) -> IsoLevel:
    """A mesh threshold setting -> the level to mesh at: a number as it is; ``"auto"`` as
    DreamGaussian's 1 in ``upstream`` mode (its semantics exactly) and :func:`auto_iso_level` in
    ``exact`` mode."""
    if threshold != "auto":
        return IsoLevel(float(threshold), "fixed")
    if config.mode == "upstream":
        return IsoLevel(UPSTREAM_ISO_LEVEL, "upstream")
    return auto_iso_level(splat, values, grid, config)
