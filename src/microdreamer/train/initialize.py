"""Initial splats: 3DGS-style initialisation from points, and MicroDreamer's random ball."""

from __future__ import annotations

import math

import torch

from microdreamer.splat import Splat, num_sh_coeffs


def knn_mean_sq_dist(points: torch.Tensor, k: int = 3, chunk: int = 4096) -> torch.Tensor:
    """[N] mean squared distance from each point to its k nearest other points (brute force, chunked).

    Args:
        points: [N, 3].
        k: neighbours (fewer when N - 1 < k; 0 for a single point).
    """
    n = points.shape[0]
    k = min(k, n - 1)
    if k <= 0:
        return torch.zeros(n, dtype=points.dtype, device=points.device)
    out = []
    for start in range(0, n, chunk):
        d2 = torch.cdist(points[start : start + chunk], points).square()  # [b, N]
        d2[torch.arange(d2.shape[0]), torch.arange(start, start + d2.shape[0])] = float("inf")  # not itself
        out.append(torch.topk(d2, k, dim=1, largest=False).values.mean(1))
    return torch.cat(out)


def splat_from_points(
    points: torch.Tensor,
    colors: torch.Tensor,
    sh_degree: int = 0,
    opacity: float = 0.1,
) -> Splat:
    """3DGS's initialisation: isotropic Gaussians with standard deviation sqrt(mean squared distance
    to the 3 nearest neighbours) (floored at sqrt(1e-7)), identity rotations, one opacity, the colours
    as degree-0 SH and zero higher bands.

    Args:
        points: [N, 3] float32 centres.
        colors: [N, 3] RGB in [0, 1].
    """
    n = points.shape[0]
    dist2 = knn_mean_sq_dist(points.float()).clamp_min(1e-7)
    quats = torch.zeros(n, 4, device=points.device)
    quats[:, 0] = 1.0
    logit = math.log(opacity / (1.0 - opacity))
    return Splat(
        means=points.float().contiguous(),
        sh_dc=((colors.float() - 0.5) / 0.28209479177387814).contiguous(),
        sh_rest=torch.zeros(n, num_sh_coeffs(sh_degree) - 1, 3, device=points.device),
        opacity_logits=torch.full((n,), logit, device=points.device),
        log_scales=(0.5 * torch.log(dist2))[:, None].repeat(1, 3),
        quats=quats,
    )


def random_ball_splat(
    num_pts: int = 5000,
    radius: float = 0.5,
    sh_degree: int = 0,
    opacity: float = 0.1,
    seed: int = 0,
    device: str | torch.device = "cpu",
) -> Splat:
    """MicroDreamer's (DreamGaussian's) initial splat: ``num_pts`` points uniform in a ball of
    ``radius`` about the origin, grey (degree-0 SH uniform in [0, 1/255], i.e. colour ~0.5),
    opacity 0.1, 3DGS's nearest-neighbour scales. Same seed, same splat on any device.
    """
    g = torch.Generator().manual_seed(seed)
    phi = torch.rand(num_pts, generator=g) * 2 * math.pi
    cos_t = torch.rand(num_pts, generator=g) * 2 - 1
    r = radius * torch.rand(num_pts, generator=g).pow(1.0 / 3.0)
    sin_t = torch.sqrt(1 - cos_t * cos_t)
    points = torch.stack([r * sin_t * torch.cos(phi), r * sin_t * torch.sin(phi), r * cos_t], -1)
    sh = torch.rand(num_pts, 3, generator=g) / 255.0
    colors = sh * 0.28209479177387814 + 0.5
    return splat_from_points(points.to(device), colors.to(device), sh_degree, opacity)
