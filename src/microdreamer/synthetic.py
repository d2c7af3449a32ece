"""Object-like splats built in code: the built-in demo's input and the tests' and benchmarks' inputs."""

from __future__ import annotations

import math

import torch

from microdreamer.splat import Splat


def _surface_radius(theta: torch.Tensor, phi: torch.Tensor) -> torch.Tensor:
    """A closed, star-shaped, bumpy surface r(theta, phi) in [0.36, 0.5] (a lumpy 'potato')."""
    return 0.5 * (0.86 + 0.1 * torch.sin(3 * theta) * torch.cos(2 * phi) + 0.04 * torch.cos(5 * phi))


def make_synthetic_object(
    n: int = 20_000,
    seed: int = 0,
    scale_fraction: float = 0.01,
    device: str | torch.device = "cpu",
) -> Splat:
    """A seeded synthetic object: N Gaussians on a closed bumpy surface of extent about 1.

    Gaussians sit on the surface with log-normal scales around ``scale_fraction`` of the extent
    (geometric mean), uniformly random rotations, opacities uniform in [0.05, 1], and a smooth colour
    pattern. Same seed, same splat, on any device.

    Returns:
        A float32 :class:`Splat` of N Gaussians, SH degree 0.
    """
    g = torch.Generator().manual_seed(seed)
    # uniform directions on the sphere, pushed out to the surface
    u = torch.rand(n, generator=g) * 2 - 1
    phi = torch.rand(n, generator=g) * 2 * math.pi
    theta = torch.acos(u)
    r = _surface_radius(theta, phi)
    dirs = torch.stack(
        [torch.sin(theta) * torch.cos(phi), torch.cos(theta), torch.sin(theta) * torch.sin(phi)], -1
    )
    means = dirs * r[:, None]
    scales = scale_fraction * torch.exp(0.3 * torch.randn(n, 3, generator=g))
    quats = torch.nn.functional.normalize(torch.randn(n, 4, generator=g), dim=-1)
    opacities = 0.05 + 0.95 * torch.rand(n, generator=g)
    colors = 0.5 + 0.4 * torch.stack([torch.sin(3 * theta), torch.cos(2 * phi), torch.sin(theta + phi)], -1)
    splat = Splat.from_activated(means, scales, quats, opacities, colors.clamp(0, 1))
    return splat.to(device)


def make_random_splat(
    n: int,
    seed: int = 0,
    spread: float = 1.0,
    log_scale_mean: float = -2.5,
    log_scale_std: float = 0.5,
    device: str | torch.device = "cpu",
) -> Splat:
    """Unstructured random Gaussians for tests: centres uniform in [-spread, spread]^3, log-normal
    scales, random (unnormalised) quaternions, opacities in [0.02, 0.98], random colours."""
    g = torch.Generator().manual_seed(seed)
    means = (torch.rand(n, 3, generator=g) * 2 - 1) * spread
    scales = torch.exp(log_scale_mean + log_scale_std * torch.randn(n, 3, generator=g))
    quats = torch.randn(n, 4, generator=g) * (0.5 + torch.rand(n, 1, generator=g) * 1.5)
    opacities = 0.02 + 0.96 * torch.rand(n, generator=g)
    colors = torch.rand(n, 3, generator=g)
    return Splat.from_activated(means, scales, quats, opacities, colors).to(device)
