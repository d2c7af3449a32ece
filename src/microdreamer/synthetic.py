"""Inputs built in code: object-like and random splats, meshes and cameras, seeded. The tests and the
benchmarks share these builders (one definition each, so a benchmark times what the tests check)."""

from __future__ import annotations

import math

import numpy as np
import torch

from microdreamer.cameras import Cameras, orbit_cameras
from microdreamer.mesh.types import Mesh
from microdreamer.splat import Splat, num_sh_coeffs


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


# ------------------------------------------------------------------ builders of the tests and benchmarks


def random_sh_splat(
    n: int,
    seed: int = 0,
    sh_degree: int = 0,
    spread: float = 0.6,
    log_scale: float = -2.5,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
) -> Splat:
    """N random Gaussians in [-spread, spread]^3: log-normal scales around e^log_scale, random
    unnormalised quaternions, opacities in (0, 1) incl. a few below 1/255, random SH."""
    g = torch.Generator().manual_seed(seed)
    k = num_sh_coeffs(sh_degree)
    opacity_logits = torch.randn(n, generator=g) * 1.5
    if n >= 4:
        opacity_logits[:2] = -7.0  # opacity ~ 0.0009 < 1/255: culled
    splat = Splat(
        means=(torch.rand(n, 3, generator=g) * 2 - 1) * spread,
        sh_dc=torch.randn(n, 3, generator=g),
        sh_rest=0.3 * torch.randn(n, k - 1, 3, generator=g),
        opacity_logits=opacity_logits,
        log_scales=log_scale + 0.5 * torch.randn(n, 3, generator=g),
        quats=torch.randn(n, 4, generator=g) * (0.5 + torch.rand(n, 1, generator=g)),
    )
    return Splat(**{name: t.to(device=device, dtype=dtype) for name, t in splat.tensors().items()})


def near_far_cameras(width: int = 37, height: int = 29, n: int = 3) -> Cameras:
    """C = n orbit cameras, the last one close to the origin (Gaussians behind it and near it)."""
    el = [-20.0, 10.0, 35.0, -5.0][:n]
    az = [15.0, 130.0, 250.0, 300.0][:n]
    radius = [2.0, 2.2, 0.45, 1.7][:n]
    return orbit_cameras(el, az, radius=torch.tensor(radius), width=width, height=height)


def noisy_splat(
    n: int = 35_000,
    seed: int = 0,
    clutter: float = 0.5,
    scale: float = 0.0082,
    scale_sigma: float = 0.45,
) -> Splat:
    """N Gaussians like a random-weight generation's splat: a fraction ``1 - clutter`` near a bumpy
    sphere of radius ~0.45, the rest uniform in the ball of radius 0.6; log-normal scales (median
    ``scale``, log-sd ``scale_sigma``, independent per axis), random rotations, opacities uniform in
    [0.02, 0.95], random colours. With the defaults, the 128^3 exact-mode field at iso-level 1 gives
    ~155k marching-cubes faces in ~750 components, ~128k faces after cleanup (as the H200 runs of
    ``generate --random-weights full``: 125k-140k)."""
    g = np.random.default_rng(seed)
    n_surface = int(round(n * (1.0 - clutter)))
    d = g.normal(size=(n_surface, 3))
    d /= np.linalg.norm(d, axis=1, keepdims=True)
    bump = 1.0 + 0.15 * np.sin(3.0 * d[:, 0]) * np.cos(2.0 * d[:, 1]) + 0.1 * np.sin(5.0 * d[:, 2])
    surface = d * (0.45 * bump + g.normal(0.0, 0.01, n_surface))[:, None]
    c = g.normal(size=(n - n_surface, 3))
    c /= np.linalg.norm(c, axis=1, keepdims=True)
    c *= 0.6 * g.random(n - n_surface)[:, None] ** (1.0 / 3.0)
    means = np.concatenate([surface, c])
    scales = np.exp(np.log(scale) + scale_sigma * g.normal(size=(n, 3)))
    quats = g.normal(size=(n, 4))
    opacities = g.uniform(0.02, 0.95, n)
    colors = g.random((n, 3))
    return Splat.from_activated(
        *(torch.tensor(x, dtype=torch.float32) for x in (means, scales, quats, opacities, colors))
    )


def sphere_mesh(subdivisions: int = 3, radius: float = 0.5) -> Mesh:
    """An icosphere centred at the origin, faces wound outward."""
    import trimesh

    t = trimesh.creation.icosphere(subdivisions=subdivisions, radius=radius)
    return Mesh(t.vertices, t.faces)


def position_color(points) -> np.ndarray:
    """[..., 3] smooth, asymmetric RGB in [0.1, 0.9] as a function of position (float64 math)."""
    p = np.asarray(points, np.float64)
    r = 0.5 + 0.4 * np.sin(3.0 * p[..., 0] + 0.5)
    g = 0.5 + 0.4 * np.sin(2.5 * p[..., 1] - 1.0 + p[..., 2])
    b = 0.5 + 0.4 * np.cos(3.5 * p[..., 2] + 0.3 * p[..., 0])
    return np.stack([r, g, b], -1)


def position_colored_sphere(subdivisions: int = 3) -> Mesh:
    """The ground-truth object: a sphere whose vertex colours are :func:`position_color`."""
    m = sphere_mesh(subdivisions)
    return Mesh(m.vertices, m.faces, vertex_colors=position_color(m.vertices))


def surface_splat(n: int = 3000, radius: float = 0.5, scale: float = 0.025, seed: int = 0) -> Splat:
    """Flat Gaussians tangent to a sphere (Fibonacci points), coloured by :func:`position_color`."""
    i = np.arange(n) + 0.5
    phi = np.arccos(1 - 2 * i / n)
    theta = math.pi * (1 + 5**0.5) * i
    normal = np.stack([np.cos(theta) * np.sin(phi), np.cos(phi), np.sin(theta) * np.sin(phi)], -1)
    return tangent_splat(radius * normal, normal, scale, 0.2)


def tangent_splat(means: np.ndarray, normals: np.ndarray, scale: float, flatness: float) -> Splat:
    """Flat Gaussians at ``means`` ([N, 3]) tangent to the unit ``normals``: scales (scale, scale,
    flatness * scale) with the short axis along the normal, opacity 0.9, coloured by :func:`position_color`."""
    n = len(means)
    # rotation taking z to the normal: quaternion of the shortest arc
    z = np.array([0.0, 0.0, 1.0])
    w = 1.0 + normals @ z
    quats = np.concatenate([w[:, None], np.cross(z, normals)], 1)
    quats[w < 1e-6] = [0.0, 1.0, 0.0, 0.0]
    scales = np.tile([scale, scale, flatness * scale], (n, 1))
    return Splat.from_activated(
        torch.tensor(means, dtype=torch.float32),
        torch.tensor(scales, dtype=torch.float32),
        torch.tensor(quats, dtype=torch.float32),
        torch.full((n,), 0.9),
        torch.tensor(position_color(means), dtype=torch.float32),
    )


CUBE_SIDE_COLORS = np.array(
    [[230, 20, 20], [20, 20, 230], [20, 200, 20], [230, 230, 20], [220, 20, 220], [20, 220, 220]], np.uint8
)


def textured_cube(cell: int = 16) -> Mesh:
    """A unit cube (24 unshared vertices, 12 faces wound outward) whose texture is a 3 x 2 grid of
    cells, one flat colour per side (CUBE_SIDE_COLORS); each side's UVs map inside its own cell."""
    tex = np.zeros((2 * cell, 3 * cell, 3), np.uint8)
    verts, uvs, faces = [], [], []
    for side in range(6):
        axis, sign = divmod(side, 2)
        sign = 1.0 - 2.0 * sign
        a, b = [k for k in range(3) if k != axis]
        row, col = divmod(side, 3)
        tex[row * cell : (row + 1) * cell, col * cell : (col + 1) * cell] = CUBE_SIDE_COLORS[side]
        # cell (row, col): u in [col, col + 1] / 3, v in [1 - (row + 1) / 2, 1 - row / 2], 20% margin
        u0, u1 = (col + 0.2) / 3, (col + 0.8) / 3
        v0, v1 = 1 - (row + 0.8) / 2, 1 - (row + 0.2) / 2
        base = len(verts)
        for s, t in [(-1, -1), (1, -1), (1, 1), (-1, 1)]:
            p = np.zeros(3)
            p[axis], p[a], p[b] = sign * 0.5, s * 0.5, t * 0.5
            verts.append(p)
            uvs.append([u0 + (s + 1) / 2 * (u1 - u0), v0 + (t + 1) / 2 * (v1 - v0)])
        quad = [[0, 1, 2], [0, 2, 3]]
        for tri in quad:
            i, j, k = (base + q for q in tri)
            n = np.cross(verts[j] - verts[i], verts[k] - verts[i])
            faces.append([i, j, k] if n[axis] * sign > 0 else [i, k, j])
    return Mesh(np.array(verts), np.array(faces), uv=np.array(uvs), texture=tex)


def cube_side_of_vertices(mesh: Mesh) -> np.ndarray:
    """[V] side index (0..5: +x, -x, +y, -y, +z, -z) of each vertex of a face-unshared cube: the side
    is the axis along which all four corners of a side agree, taken from the face's normal."""
    tri = mesh.vertices[mesh.faces].astype(np.float64)
    n = np.cross(tri[:, 1] - tri[:, 0], tri[:, 2] - tri[:, 0])
    axis = np.abs(n).argmax(1)
    side_f = 2 * axis + (n[np.arange(len(n)), axis] < 0)
    side = np.zeros(mesh.num_vertices, np.int64)
    side[mesh.faces] = side_f[:, None]
    return side


def blobby_field(
    r: int, seed: int = 0, device: torch.device | str = "cpu", floaters: int = 24
) -> torch.Tensor:
    """[R, R, R] float32 on ``device``, an object like a splat's density field at iso-level 1 on the
    grid [-1, 1]^3: a lumpy ball of radius ~0.55 (low-frequency noise on its radius; ~16 R^2 faces)
    with ``floaters`` small balls (1.5 to 4 voxels) around it, values falling off as 1 + 8 x (signed
    distance). Built on ``device`` (a few passes over R^3; no R^3 coordinate grids)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.linspace(-1.0, 1.0, r, device=device)
    radius = torch.sqrt(x[:, None, None] ** 2 + x[None, :, None] ** 2 + x[None, None, :] ** 2)
    noise = torch.randn((1, 1, 6, 6, 6), generator=g).to(device)
    lumps = torch.nn.functional.interpolate(noise, size=(r, r, r), mode="trilinear", align_corners=True)[0, 0]
    values = 1.0 + 8.0 * (0.55 + 0.05 * lumps - radius)
    del radius, lumps
    h = 2.0 / (r - 1)
    for _ in range(floaters):
        d = torch.randn(3, generator=g)
        centre = d / d.norm() * (0.7 + 0.2 * torch.rand(1, generator=g))
        rb = h * (1.5 + 2.5 * float(torch.rand(1, generator=g)))
        lo = [max(0, int((float(c) - 2 * rb + 1) / h)) for c in centre]
        hi = [min(r, int((float(c) + 2 * rb + 1) / h) + 2) for c in centre]
        box = [x[lo[a] : hi[a]] - float(centre[a]) for a in range(3)]
        dist = torch.sqrt(
            box[0][:, None, None] ** 2 + box[1][None, :, None] ** 2 + box[2][None, None, :] ** 2
        )
        sub = values[lo[0] : hi[0], lo[1] : hi[1], lo[2] : hi[2]]
        torch.maximum(sub, 1.0 + 8.0 * (rb - dist), out=sub)
    return values.float().contiguous()


def snowman_splat(n: int = 3000, seed: int = 0) -> Splat:
    """A known asymmetric object, y up: a wide blue ball (radius 0.4, centre y = -0.25) under a small red
    one (radius 0.18, centre y = +0.36), Gaussians on both surfaces, opaque. Which end is up shows in
    any render (red above blue) and in its mesh (the narrow end is the top).

    Returns:
        An SH-degree-0 :class:`Splat` of N Gaussians (3/4 of them on the base).
    """
    g = torch.Generator().manual_seed(seed)
    n_base = (3 * n) // 4
    parts = []
    for count, centre_y, radius, color in (
        (n_base, -0.25, 0.4, (0.15, 0.25, 0.9)),
        (n - n_base, 0.36, 0.18, (0.9, 0.1, 0.1)),
    ):
        d = torch.nn.functional.normalize(torch.randn(count, 3, generator=g), dim=-1)
        means = d * radius + torch.tensor([0.0, centre_y, 0.0])
        parts.append((means, torch.tensor(color).expand(count, 3)))
    means = torch.cat([p[0] for p in parts])
    colors = torch.cat([p[1] for p in parts])
    scales = torch.full((n, 3), 0.03)
    quats = torch.nn.functional.normalize(torch.randn(n, 4, generator=g), dim=-1)
    return Splat.from_activated(means, scales, quats, torch.full((n,), 0.9), colors)


def noisy_blob(faces: int, noise: float = 0.002, seed: int = 0) -> Mesh:
    """About ``faces`` faces of a lumpy closed surface (a sphere with low-frequency bumps) with per-vertex
    noise of ``noise`` (relative): the synthetic noisy capture of the benchmark."""
    sub = max(1, int(round(math.log(max(faces, 80) / 20) / math.log(4))))
    import trimesh

    t = trimesh.creation.icosphere(subdivisions=sub, radius=1.0)
    p = np.asarray(t.vertices)
    bumps = 1 + 0.15 * np.sin(3 * p[:, 0]) * np.cos(2 * p[:, 1]) + 0.1 * np.sin(5 * p[:, 2] + 1)
    rng = np.random.default_rng(seed)
    r = bumps * (1 + noise * rng.standard_normal(len(p)))
    return Mesh(0.5 * p * r[:, None], t.faces)
