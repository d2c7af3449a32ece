"""Cameras: orbit cameras as MicroDreamer/DreamGaussian place them, and the matrices each renderer needs.

Conventions
-----------
* World: y up, the object at the origin.
* Orbit angles (MicroDreamer's): azimuth 0 looks from +z, azimuth 90 from +x; elevation is measured
  so that **negative elevation puts the camera above** the object (camera y = -radius * sin(elev)),
  as in MicroDreamer's `orbit_camera`. The camera looks at the origin with y up.
* :class:`Cameras` stores world-to-camera matrices in the OpenCV convention (x right, y down,
  z forward), which gsplat and our rasterisers take, plus pixel intrinsics. ``c2w_opengl`` gives the
  camera-to-world matrices in the OpenGL/NeRF convention (x right, y up, z backward) used by
  ``transforms.json``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

# OpenGL camera axes -> OpenCV camera axes (flip y and z)
_GL_TO_CV = torch.diag(torch.tensor([1.0, -1.0, -1.0, 1.0]))


@dataclass
class Cameras:
    """A batch of C pinhole cameras sharing one image size.

    Attributes:
        viewmats: [C, 4, 4] float32, world-to-camera, OpenCV axes (x right, y down, z forward).
        Ks: [C, 3, 3] float32 pixel intrinsics (fx, fy, cx, cy; pixel centres at +0.5).
        width: W, pixels.
        height: H, pixels.
        near, far: clipping distances along +z (world units).
    """

    viewmats: torch.Tensor
    Ks: torch.Tensor
    width: int
    height: int
    near: float = 0.01
    far: float = 100.0

    def __len__(self) -> int:
        return self.viewmats.shape[0]

    @property
    def device(self) -> torch.device:
        return self.viewmats.device

    def to(self, device: str | torch.device) -> Cameras:
        return Cameras(
            self.viewmats.to(device), self.Ks.to(device), self.width, self.height, self.near, self.far
        )

    def __getitem__(self, index) -> Cameras:
        v, k = self.viewmats[index], self.Ks[index]
        if v.dim() == 2:
            v, k = v[None], k[None]
        return Cameras(v, k, self.width, self.height, self.near, self.far)

    def c2w_opengl(self) -> torch.Tensor:
        """[C, 4, 4] camera-to-world matrices, OpenGL axes (x right, y up, z backward)."""
        return torch.linalg.inv(self.viewmats) @ _GL_TO_CV.to(self.viewmats)

    def camera_centers(self) -> torch.Tensor:
        """[C, 3] camera positions in world space."""
        return torch.linalg.inv(self.viewmats)[:, :3, 3]

    def fovy(self) -> torch.Tensor:
        """[C] vertical field of view in radians."""
        return 2 * torch.atan(self.height / (2 * self.Ks[:, 1, 1]))

    def projection_opengl(self) -> torch.Tensor:
        """[C, 4, 4] OpenGL clip-space projection (for rasterisers that want NDC; y up, z in [-1, 1])."""
        c = len(self)
        fx, fy, cx, cy = self.Ks[:, 0, 0], self.Ks[:, 1, 1], self.Ks[:, 0, 2], self.Ks[:, 1, 2]
        n, f = self.near, self.far
        p = torch.zeros(c, 4, 4, dtype=self.Ks.dtype, device=self.Ks.device)
        p[:, 0, 0] = 2 * fx / self.width
        p[:, 1, 1] = 2 * fy / self.height
        p[:, 0, 2] = 1 - 2 * cx / self.width
        p[:, 1, 2] = 2 * cy / self.height - 1
        p[:, 2, 2] = -(f + n) / (f - n)
        p[:, 2, 3] = -2 * f * n / (f - n)
        p[:, 3, 2] = -1
        return p


def intrinsics_from_fov(fov_rad: float, width: int, height: int, axis: str = "y") -> torch.Tensor:
    """[3, 3] pixel intrinsics for a centred pinhole with the given field of view along ``axis``."""
    focal = (height if axis == "y" else width) / (2 * math.tan(fov_rad / 2))
    return torch.tensor([[focal, 0.0, width / 2], [0.0, focal, height / 2], [0.0, 0.0, 1.0]])


def look_at_opengl(campos: torch.Tensor, target: torch.Tensor | None = None) -> torch.Tensor:
    """[C, 4, 4] OpenGL camera-to-world matrices looking from ``campos`` [C, 3] at ``target`` [3], y up."""
    if target is None:
        target = torch.zeros(3, dtype=campos.dtype, device=campos.device)
    back = torch.nn.functional.normalize(campos - target, dim=-1)  # camera +z points away from target
    up = torch.tensor([0.0, 1.0, 0.0], dtype=campos.dtype, device=campos.device).expand_as(back)
    right = torch.linalg.cross(up, back)
    # at the poles (looking straight up or down) pick x as "right"
    degenerate = right.norm(dim=-1) < 1e-6
    right[degenerate] = torch.tensor([1.0, 0.0, 0.0], dtype=campos.dtype, device=campos.device)
    right = torch.nn.functional.normalize(right, dim=-1)
    true_up = torch.linalg.cross(back, right)
    c2w = torch.eye(4, dtype=campos.dtype, device=campos.device).repeat(campos.shape[0], 1, 1)
    c2w[:, :3, 0], c2w[:, :3, 1], c2w[:, :3, 2], c2w[:, :3, 3] = right, true_up, back, campos
    return c2w


def orbit_positions(elevation_deg: torch.Tensor, azimuth_deg: torch.Tensor, radius) -> torch.Tensor:
    """[C, 3] camera positions on MicroDreamer's orbit (negative elevation = above the object)."""
    el = torch.deg2rad(torch.as_tensor(elevation_deg, dtype=torch.float32))
    az = torch.deg2rad(torch.as_tensor(azimuth_deg, dtype=torch.float32))
    r = torch.as_tensor(radius, dtype=torch.float32)
    x = r * torch.cos(el) * torch.sin(az)
    y = -r * torch.sin(el)
    z = r * torch.cos(el) * torch.cos(az)
    return torch.stack([x, y, z], dim=-1).reshape(-1, 3)


def orbit_cameras(
    elevation_deg,
    azimuth_deg,
    radius=2.0,
    fovy_deg: float = 49.1,
    width: int = 256,
    height: int = 256,
) -> Cameras:
    """Cameras on an orbit around the origin, looking at it.

    Args:
        elevation_deg: [C] (or scalar) degrees; negative = above the object (MicroDreamer's sign).
        azimuth_deg: [C] (or scalar) degrees; 0 = from +z, 90 = from +x.
        radius: scalar or [C] distance to the origin.
        fovy_deg: vertical field of view (MicroDreamer's default 49.1 degrees).
    """
    el = torch.as_tensor(elevation_deg, dtype=torch.float32).reshape(-1)
    az = torch.as_tensor(azimuth_deg, dtype=torch.float32).reshape(-1)
    el, az = torch.broadcast_tensors(el, az)
    c2w = look_at_opengl(orbit_positions(el, az, radius))
    return cameras_from_c2w_opengl(c2w, math.radians(fovy_deg), width, height, axis="y")


def framing(vertices: torch.Tensor) -> tuple[torch.Tensor, float]:
    """(centre [3] of the bounding box, radius of the sphere about it holding every vertex)."""
    lo, hi = vertices.amin(0), vertices.amax(0)
    center = (lo + hi) / 2
    radius = float((vertices - center).norm(dim=-1).max())
    return center, max(radius, 1e-30)  # any size frames alike (a point gets a tiny sphere, not 0)


def centred_orbit_cameras(
    elevation_deg,
    azimuth_deg,
    center: torch.Tensor,
    bound_radius: float,
    fovy_deg: float,
    size: int,
    margin: float,
) -> Cameras:
    """Orbit cameras around ``center`` (not the origin) at the distance that frames a sphere of
    ``bound_radius``: ``margin * bound_radius / sin(fovy / 2)``."""
    distance = margin * bound_radius / math.sin(math.radians(fovy_deg) / 2)
    cams = orbit_cameras(elevation_deg, azimuth_deg, distance, fovy_deg, size, size)
    c = center.detach().float().cpu()
    viewmats = cams.viewmats.clone()
    viewmats[:, :3, 3] -= viewmats[:, :3, :3] @ c  # world point p -> R (p - c) + t
    # relative to the distance, so a small object is not cut by the near plane (the old floor of
    # 1e-3 left objects under ~1e-4 across blank)
    near = 0.05 * (distance - bound_radius)
    far = 2.0 * (distance + bound_radius)
    return Cameras(viewmats, cams.Ks, size, size, near, far)


def cameras_from_c2w_opengl(
    c2w: torch.Tensor, fov_rad: float, width: int, height: int, axis: str = "x"
) -> Cameras:
    """Cameras from OpenGL/NeRF camera-to-world matrices [C, 4, 4] and one field of view.

    ``axis="x"`` takes ``fov_rad`` as the horizontal field of view (``camera_angle_x`` of
    ``transforms.json``); ``axis="y"`` as the vertical one.
    """
    c2w = torch.as_tensor(c2w, dtype=torch.float32).reshape(-1, 4, 4)
    viewmats = torch.linalg.inv(c2w @ _GL_TO_CV)
    K = intrinsics_from_fov(fov_rad, width, height, axis=axis)
    return Cameras(viewmats.contiguous(), K.expand(c2w.shape[0], 3, 3).contiguous(), width, height)
