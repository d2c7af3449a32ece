"""What every density-field implementation shares: the config, the grid, and the prepared Gaussians.

The field is ``occ(x) = sum_i o_i * exp(-0.5 * q_i(x))`` with opacity ``o_i = sigmoid(logit_i)`` and the
Mahalanobis form ``q_i(x) = (x - mu_i)^T Sigma_i^-1 (x - mu_i)``, ``Sigma_i = R_i S_i S_i^T R_i^T``.
Every implementation evaluates ``q`` as ``|M_i (x - mu_i)|^2`` with ``M_i = S_i^-1 R_i^T`` (the
"whitening transform"): a sum of squares, so ``q >= 0`` by construction and no 3x3 inverse is taken.
Upstream (DreamGaussian's ``gaussian_3d_coeff``) inverts the 6-entry covariance analytically with
``+1e-24`` on the determinant and zeroes positive exponents; the two agree to rounding on every
non-degenerate Gaussian, and ours stays accurate when a Gaussian is nearly flat.

Coordinates follow upstream ``extract_fields``: Gaussians whose opacity is ``<= min_opacity`` are
dropped; the rest are normalised by their bounding-box centre and ``extent_factor / largest extent``
(scales too), and the grid points are ``linspace(-1, 1, R)`` on each axis, stored once as a float32
table that every backend reads (so all backends sample exactly the same points).

Modes
-----
``upstream``: a Gaussian counts at a voxel only if its centre lies strictly inside the voxel's block
(``R // num_blocks`` voxels a side, the last block possibly smaller), grown by
``relax_ratio * 2 / num_blocks`` on every side, exactly as upstream's tiling decides; no other cut
(the fast paths skip terms below 1.6e-38, float32's smallest normal number, which upstream's float32
arithmetic cannot add to anything either).

``exact``: no blocks; Gaussian i counts wherever ``q_i(x) <= c^2`` with ``c^2 = 2 ln(1 / cutoff_tol)``.
Bound: every dropped term is ``o_i exp(-q/2) < cutoff_tol * o_i <= cutoff_tol``, i.e. below
``cutoff_tol`` times that Gaussian's own peak. At one voxel the total dropped is at most
``cutoff_tol * sum(o_i)`` over the Gaussians cut there. With the default ``cutoff_tol = 1e-4``
(``c = 4.29``), a voxel would need 10^4 fully opaque Gaussians cut at it to move by 1 (the default
mesh threshold). Integrated over space, the mass dropped per Gaussian is the chi-square(3) tail
``P(chi2_3 > c^2) = 3.8e-4`` of its own mass.

Voxel filter (anti-aliased sampling)
------------------------------------
A captured surface is a thin layer of small, partly transparent Gaussians, often thinner than a voxel;
point samples at voxel centres miss them or under-count them, and the mesh falls apart. With
``voxel_filter = v > 0`` each kept Gaussian's covariance is widened by ``v h^2`` in every direction,
``Sigma' = Sigma + v h^2 I`` (``h = 2 / (R - 1)``, the grid spacing in normalised units), and its
opacity scaled so that it keeps its mass (its integral over space):
``o' = o sqrt(det Sigma / det Sigma') = o prod_k s_k / sqrt(s_k^2 + v h^2)``. The field is then the
splat's density convolved with an isotropic Gaussian of variance ``v h^2``, a low-pass filter before
sampling at spacing h. ``v = 1/12`` is a one-voxel box filter's variance (the samples approximate the
density averaged over each voxel) but still aliases: by Poisson summation, the grid sum of a Gaussian of
sigma s varies with its sub-voxel position by up to ``2 exp(-2 pi^2 s^2 / h^2)`` per axis, 39 % at
``s^2 = h^2 / 12``, so a surface of thin Gaussians still samples into holes; ``v = 1/4`` (s = h / 2,
the exact mode's default) brings that to 1.4 %. The added term is
isotropic, so ``Sigma'`` keeps the Gaussian's axes (``S'^2 = S^2 + v h^2``) and the whitening transform
stays ``S'^-1 R^T``. Every backend reads the widened Gaussians from :func:`prepare_gaussians`; the
exact mode's cutoff and radii apply to the widened Gaussian. The opacity filter (``min_opacity``) and
the normalisation use the original opacities and centres. ``upstream`` mode samples points, as
DreamGaussian does (no filter by default).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from microdreamer.config import FieldConfig
from microdreamer.splat import Splat


@dataclass
class GridSpec:
    """The sampling grid: R points per axis at ``linspace(-1, 1, R)`` in normalised coordinates.

    Normalised coordinates relate to the splat's own (world) coordinates by
    ``normalised = (world - center) * scale``.
    """

    resolution: int
    center: tuple[float, float, float]
    scale: float

    def axis(self, device: str | torch.device = "cpu") -> torch.Tensor:
        """[R] float32 grid coordinates along each axis (computed in float64, rounded once)."""
        r = self.resolution
        idx = torch.arange(r, dtype=torch.float64)
        return (-1.0 + 2.0 * idx / (r - 1)).to(torch.float32).to(device)

    @property
    def origin(self) -> tuple[float, float, float]:
        """World position of grid index (0, 0, 0)."""
        return tuple(c - 1.0 / self.scale for c in self.center)

    @property
    def spacing(self) -> float:
        """World distance between neighbouring grid points."""
        return 2.0 / ((self.resolution - 1) * self.scale)


@dataclass
class PreparedGaussians:
    """The N kept Gaussians in normalised grid coordinates, as every backend consumes them.

    Attributes:
        means: [N, 3] float32, normalised coordinates.
        opacities: [N] float32 in (0, 1] (scaled down by the voxel filter, which keeps each
            Gaussian's mass).
        transforms: [N, 3, 3] float32 whitening transforms M = S^-1 R^T (normalised units), so that
            q(x) = |M (x - mean)|^2.
        radii: [N, 3] float32 half-extents of the axis-aligned box holding the ellipsoid q <= c^2 of
            the exact mode (c from the config), normalised units, grown by 1e-6 relative for rounding.
    """

    means: torch.Tensor
    opacities: torch.Tensor
    transforms: torch.Tensor
    radii: torch.Tensor

    def __len__(self) -> int:
        return self.means.shape[0]

    def to(self, device: str | torch.device) -> PreparedGaussians:
        return PreparedGaussians(
            *(t.to(device) for t in (self.means, self.opacities, self.transforms, self.radii))
        )


def auto_resolution(splat: Splat, config: FieldConfig) -> int:
    """The grid resolution ``FieldConfig.resolution = "auto"`` stands for: the smallest of
    :data:`~microdreamer.config.AUTO_RESOLUTIONS` whose grid spacing (in the splat's units, on the grid
    ``prepare_gaussians`` would build) is at most the median of the kept Gaussians' largest scales, or
    the largest of them. ``upstream`` mode: the smallest (DreamGaussian's 128).

    A generated object (DreamGaussian, MicroDreamer) is a few thousand large Gaussians, resolved on the
    coarsest grid; a real capture's surface is a thin layer of Gaussians far smaller than that grid's
    voxel, which samples into holes and loses thin parts (``benchmarks/README.md``: mesh fidelity against
    the grid).
    """
    from microdreamer.config import AUTO_RESOLUTIONS

    if config.mode == "upstream":
        return AUTO_RESOLUTIONS[0]
    with torch.no_grad():
        keep = splat.opacities().float() > config.min_opacity
        if int(keep.sum()) < 2:
            return AUTO_RESOLUTIONS[0]
        means = splat.means[keep].double()
        extent = float((means.amax(0) - means.amin(0)).amax())
        largest = float(splat.scales()[keep].double().amax(-1).median())
    if not (extent > 0.0 and largest > 0.0):
        return AUTO_RESOLUTIONS[0]
    for r in AUTO_RESOLUTIONS:
        spacing = extent / config.extent_factor * 2.0 / (r - 1)  # GridSpec.spacing of this grid
        if spacing <= largest:
            return r
    return AUTO_RESOLUTIONS[-1]


def resolve_resolution(splat: Splat, config: FieldConfig) -> FieldConfig:
    """``config`` with an ``"auto"`` resolution replaced by :func:`auto_resolution`'s choice."""
    if config.resolution != "auto":
        return config
    from dataclasses import replace

    return replace(config, resolution=auto_resolution(splat, config))


def prepare_gaussians(splat: Splat, config: FieldConfig) -> tuple[PreparedGaussians, GridSpec]:
    """Filter by opacity, normalise into the grid's cube, apply the voxel filter (if any) and build
    the whitening transforms.

    Runs on the splat's device; the geometry is computed in float64 and rounded to float32 once.
    When the kept centres have no extent (one Gaussian, or all at one point) the cube is sized to
    +-3 standard deviations of the largest Gaussian instead (upstream would divide by zero).
    ``config.resolution`` must be a number (:func:`resolve_resolution` turns ``"auto"`` into one).
    """
    if not isinstance(config.resolution, int):
        raise ValueError(
            f"resolution {config.resolution!r}: resolve it first (field.common.resolve_resolution)"
        )
    with torch.no_grad():
        opac = splat.opacities().float()
        keep = opac > config.min_opacity
        means = splat.means[keep].double()
        n = means.shape[0]
        device = splat.means.device
        scales = splat.scales()[keep].double()
        rot = splat.rotation_matrices()[keep].double() if n else torch.zeros(0, 3, 3, device=device)
        if n == 0:
            grid = GridSpec(config.resolution, (0.0, 0.0, 0.0), 1.0)
            empty = torch.zeros(0, 3, dtype=torch.float32, device=device)
            return PreparedGaussians(empty, empty[:, 0], empty.new_zeros(0, 3, 3), empty), grid
        mn, mx = means.amin(0), means.amax(0)
        center = (mn + mx) / 2
        extent = float((mx - mn).amax())
        if not extent > 1e-12 * (1.0 + float(center.abs().amax())):
            extent = 6.0 * float(scales.amax())
            if not extent > 0.0:
                extent = 1.0
        scale = config.extent_factor / extent
        norm_means = (means - center) * scale
        norm_scales = scales * scale
        opacities = opac[keep].double()
        widen = config.filter_variance_normalised
        if widen > 0.0:  # Sigma + v h^2 I with the mass kept (see the module docstring)
            wide = (norm_scales.square() + widen).sqrt()
            opacities = opacities * (norm_scales / wide).prod(-1)
            norm_scales = wide
        # M = S^-1 R^T: row k is the k-th axis of the Gaussian divided by its standard deviation
        transforms = rot.transpose(1, 2) / norm_scales[:, :, None]
        # Sigma_kk = sum_j (R_kj s_j)^2; the ellipsoid q <= c^2 spans c * sqrt(Sigma_kk) along axis k
        sigma_diag = ((rot * norm_scales[:, None, :]) ** 2).sum(-1)
        radii = math.sqrt(config.cutoff_sq) * sigma_diag.sqrt() * (1.0 + 1e-6)
        prepared = PreparedGaussians(
            means=norm_means.float().contiguous(),
            opacities=opacities.float().contiguous(),
            transforms=transforms.float().contiguous(),
            radii=radii.float().contiguous(),
        )
        grid = GridSpec(config.resolution, tuple(float(c) for c in center), float(scale))
        return prepared, grid


def upstream_block_bounds(grid: GridSpec, config: FieldConfig) -> tuple[int, torch.Tensor, torch.Tensor]:
    """The upstream block rule along one axis (the same for x, y and z).

    Returns ``(block_voxels, lower [B], upper [B])`` float64 on the CPU: a Gaussian counts at a voxel
    in block b (per axis) iff ``lower[b] < mean < upper[b]`` on all three axes; B = ceil(R / block).
    The bounds are the block's first and last grid coordinates (the float32 table) -/+ relax.
    """
    r = grid.resolution
    t = config.block_voxels
    axis = grid.axis().double()
    first = torch.arange(0, r, t)
    last = torch.clamp(first + t - 1, max=r - 1)
    return t, axis[first] - config.relax, axis[last] + config.relax
