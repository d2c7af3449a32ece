"""Pure-PyTorch references: brute force in float64, written for clarity, not speed.

These define the semantics every fast path is tested against (tests only; small inputs: cost is
N x R^3). They share nothing with the fast implementations beyond the prepared inputs.
"""

from __future__ import annotations

import torch

from microdreamer.field.common import (
    FieldConfig,
    GridSpec,
    PreparedGaussians,
    prepare_gaussians,
    upstream_block_bounds,
)


def gaussian_3d_coeff(xyzs: torch.Tensor, covs: torch.Tensor) -> torch.Tensor:
    """Upstream's per-pair Gaussian weight (DreamGaussian ``gaussian_3d_coeff`` semantics).

    Args:
        xyzs: [M, 3] offsets x - mu.
        covs: [M, 6] covariances as (a, b, c, d, e, f) = (S00, S01, S02, S11, S12, S22).
    Returns:
        [M] ``exp(-0.5 d^T Sigma^-1 d)`` with Sigma^-1 from the analytic 3x3 inverse with ``+1e-24`` on
        the determinant; a positive exponent (a numerically broken inverse) gives 0. Same dtype as
        the inputs.
    """
    x, y, z = xyzs.unbind(-1)
    a, b, c, d, e, f = covs.unbind(-1)
    inv_det = 1.0 / (a * d * f + 2 * e * c * b - e * e * a - c * c * d - b * b * f + 1e-24)
    inv_a = (d * f - e * e) * inv_det
    inv_b = (e * c - b * f) * inv_det
    inv_c = (e * b - c * d) * inv_det
    inv_d = (a * f - c * c) * inv_det
    inv_e = (b * c - e * a) * inv_det
    inv_f = (a * d - b * b) * inv_det
    power = (
        -0.5 * (x * x * inv_a + y * y * inv_d + z * z * inv_f) - x * y * inv_b - x * z * inv_c - y * z * inv_e
    )
    return torch.where(power > 0, torch.zeros_like(power), torch.exp(power))


def covariance6(transforms: torch.Tensor) -> torch.Tensor:
    """[N, 3, 3] whitening transforms M -> [N, 6] covariances (S00, S01, S02, S11, S12, S22).

    Sigma = (M^T M)^-1 = M^-1 M^-T.
    """
    minv = torch.linalg.inv(transforms)
    cov = minv @ minv.transpose(1, 2)
    return torch.stack(
        [cov[:, 0, 0], cov[:, 0, 1], cov[:, 0, 2], cov[:, 1, 1], cov[:, 1, 2], cov[:, 2, 2]], -1
    )


def density_field_reference(prepared: PreparedGaussians, grid: GridSpec, config: FieldConfig) -> torch.Tensor:
    """Brute-force density field in float64: every Gaussian at every voxel, then the mode's rule.

    Returns:
        [R, R, R] float64 on the CPU; index [i, j, k] is the point (axis[i], axis[j], axis[k]).
    """
    r = grid.resolution
    axis = grid.axis().double()
    xs = torch.stack(torch.meshgrid(axis, axis, axis, indexing="ij"), dim=-1).reshape(-1, 3)  # [R^3, 3]
    means = prepared.means.double().cpu()
    opac = prepared.opacities.double().cpu()
    transforms = prepared.transforms.double().cpu()
    occ = torch.zeros(r**3, dtype=torch.float64)
    if config.mode == "upstream":
        t, lower, upper = upstream_block_bounds(grid, config)
        block_of_voxel = torch.arange(r) // t  # [R]
        lo, hi = lower[block_of_voxel], upper[block_of_voxel]  # [R] per-voxel box along one axis
    for i in range(means.shape[0]):
        u = (xs - means[i]) @ transforms[i].T
        q = (u * u).sum(-1)
        w = opac[i] * torch.exp(-0.5 * q)
        if config.mode == "exact":
            w = torch.where(q <= config.cutoff_sq, w, torch.zeros_like(w))
        else:
            inside = [(lo < means[i, a]) & (means[i, a] < hi) for a in range(3)]  # [R] per axis
            mask = inside[0][:, None, None] & inside[1][None, :, None] & inside[2][None, None, :]
            w = torch.where(mask.reshape(-1), w, torch.zeros_like(w))
        occ += w
    return occ.reshape(r, r, r)


def density_field_splat_reference(splat, config: FieldConfig) -> torch.Tensor:
    """The density field defined from the splat itself, in float64, voxel filter included.

    Independent of :func:`prepare_gaussians`'s arithmetic except for the grid (its centre and scale,
    tested on their own): for each Gaussian with opacity ``> min_opacity``, the world covariance
    ``R S S^T R^T`` is scaled into normalised units (``scale^2 Sigma``), the filter's ``v h^2 I`` is
    added (``v = config.filter_variance``, ``h = 2 / (R - 1)``), the opacity is multiplied by
    ``sqrt(det Sigma / det Sigma')`` and ``q = d^T Sigma'^-1 d`` comes from the 3x3 inverse; then the
    mode's rule (exact: ``q <= c^2``; upstream: the block rule on the centres).

    Returns:
        [R, R, R] float64 on the CPU (index as :func:`density_field_reference`).
    """
    _, grid = prepare_gaussians(splat, config)
    r = grid.resolution
    opac = splat.opacities().double().cpu()
    keep = opac > config.min_opacity
    opac = opac[keep]
    means = (splat.means.double().cpu()[keep] - torch.tensor(grid.center, dtype=torch.float64)) * grid.scale
    rot = splat.rotation_matrices().double().cpu()[keep]
    rs = rot * splat.scales().double().cpu()[keep][:, None, :]
    cov = (rs @ rs.transpose(1, 2)) * grid.scale**2
    v = config.filter_variance * (2.0 / (r - 1)) ** 2
    wide = cov + v * torch.eye(3, dtype=torch.float64)
    opac = opac * torch.sqrt(torch.linalg.det(cov) / torch.linalg.det(wide))
    precision = torch.linalg.inv(wide)
    axis = grid.axis().double()
    xs = torch.stack(torch.meshgrid(axis, axis, axis, indexing="ij"), dim=-1).reshape(-1, 3)
    occ = torch.zeros(r**3, dtype=torch.float64)
    if config.mode == "upstream":
        t, lower, upper = upstream_block_bounds(grid, config)
        block_of_voxel = torch.arange(r) // t
        lo, hi = lower[block_of_voxel], upper[block_of_voxel]
    for i in range(means.shape[0]):
        d = xs - means[i]
        q = ((d @ precision[i]) * d).sum(-1)
        w = opac[i] * torch.exp(-0.5 * q)
        if config.mode == "exact":
            w = torch.where(q <= config.cutoff_sq, w, torch.zeros_like(w))
        else:
            inside = [(lo < means[i, a]) & (means[i, a] < hi) for a in range(3)]
            mask = inside[0][:, None, None] & inside[1][None, :, None] & inside[2][None, None, :]
            w = torch.where(mask.reshape(-1), w, torch.zeros_like(w))
        occ += w
    return occ.reshape(r, r, r)
