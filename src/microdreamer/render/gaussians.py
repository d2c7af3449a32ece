"""Gaussian splat rendering: one interface, three backends.

``render(splat, cameras)`` returns RGB, alpha and depth images, differentiable with respect to every
splat parameter (except on the forward-only ``"cpp"`` backend). Backends:

* ``"gsplat"``: gsplat's CUDA rasteriser (PyPI ``gsplat``, Apache-2.0; compiles its CUDA sources on
  first use, then caches them). CUDA tensors only; imported lazily.
* ``"torch"``: the pure-PyTorch rasteriser in :mod:`microdreamer.render._torch_raster` (CPU or CUDA),
  the same rules as gsplat's default kernel; it is the CPU path and the reference in tests.
* ``"cpp"``: the C++ CPU rasteriser (:func:`microdreamer.kernels.cpu.rasterize`, built with the system's
  compiler on first use): the same rules as ``"torch"`` (projection and colours are the torch ones; the
  tile binning and compositing run in C++), forward only: CPU tensors, and no splat parameter that
  requires a gradient while grad mode is on.
* ``"auto"``: gsplat when the splat is on CUDA and gsplat imports; on the CPU cpp when no gradient is
  needed and the C++ kernels load; else torch.

Colour comes from the splat's spherical harmonics (degree 0..3) evaluated along the ray from each
camera centre to each Gaussian, plus 0.5, clamped below at 0 (gsplat's and 3DGS's convention).
"""

from __future__ import annotations

import functools
import importlib.util
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from microdreamer.cameras import Cameras
from microdreamer.render import _torch_raster
from microdreamer.splat import SH_C0, Splat

logger = logging.getLogger(__name__)

BACKENDS = ("auto", "torch", "gsplat", "cpp")
# the cpp backend's default tile edge: the torch backend's, so that the exponents' float32 coefficients
# (relative to the tile centres) are the reference's own; 16 was no faster on the bake views and flips
# a few more near-threshold decisions (benchmarks/bench_render_cpu.py)
CPP_TILE_SIZE = _torch_raster.TILE_SIZE

# Real spherical-harmonics constants (degrees 0..3), the 3DGS / gsplat basis and sign convention.
SH_C1 = 0.4886025119029199
SH_C2 = (
    1.0925484305920792,
    -1.0925484305920792,
    0.31539156525252005,
    -1.0925484305920792,
    0.5462742152960396,
)
SH_C3 = (
    -0.5900435899266435, 2.890611442640554, -0.4570457994644658, 0.3731763325901154,
    -0.4570457994644658, 1.445305721320277, -0.5900435899266435,
)  # fmt: skip


@dataclass
class RenderOutput:
    """What :func:`render` returns (all on the splat's device, in its dtype).

    Attributes:
        rgb: [C, H, W, 3] colour composited over the background.
        alpha: [C, H, W, 1] accumulated opacity ``1 - T``.
        depth: [C, H, W, 1] expected camera-space z normalised by alpha (gsplat's "ED" mode:
            ``sum w_i z_i / max(alpha, 1e-10)``); 0 where nothing is drawn. None when rendered
            with ``depth=False``.
        means2d: [C, N, 2] projected centres in pixels; undefined where ``radii`` is 0 (gsplat
            leaves culled entries unwritten). With ``retain_means2d_grad=True`` its ``.grad`` holds
            the view-space gradient after ``backward()`` (for densification; 0 where culled).
        radii: [C, N, 2] int32 bounding-box half-widths in pixels; 0 where a Gaussian is culled.
    """

    rgb: torch.Tensor
    alpha: torch.Tensor
    depth: torch.Tensor | None
    means2d: torch.Tensor
    radii: torch.Tensor

    @property
    def visible(self) -> torch.Tensor:
        """[C, N] bool: the Gaussian was drawn in that camera."""
        return (self.radii > 0).all(-1)


@functools.cache
def gsplat_available() -> bool:
    """True when the ``gsplat`` package is installed (its CUDA code compiles on first use)."""
    return importlib.util.find_spec("gsplat") is not None


def resolve_backend(backend: str, device: torch.device, needs_grad: bool = True) -> str:
    """Turn ``"auto"`` into a concrete backend for tensors on ``device``; check explicit choices.

    ``needs_grad``: the renders must be differentiable (the default: what a trainer resolves); when
    False, ``"auto"`` on the CPU may pick the forward-only ``"cpp"``."""
    if backend not in BACKENDS:
        raise ValueError(f"render backend {backend!r} is unknown; choose one of {', '.join(BACKENDS)}")
    if backend == "auto":
        if device.type == "cuda" and gsplat_available():
            from microdreamer.render import _gsplat

            if _gsplat.usable():  # else the one-line notice of what is slower, and the PyTorch rasteriser
                return "gsplat"
        if device.type == "cpu" and not needs_grad:
            from microdreamer.kernels import cpu

            if cpu.usable():
                return "cpp"
        return "torch"
    if backend == "cpp":
        if device.type != "cpu":
            raise ValueError(f"render backend 'cpp' needs CPU tensors, got {device}; use 'auto' or 'gsplat'")
        if needs_grad:
            raise ValueError(
                "render backend 'cpp' is forward only: a splat parameter requires grad with grad mode on; "
                "render under torch.no_grad() or use backend='torch'"
            )
    if backend == "gsplat":
        if device.type != "cuda":
            raise ValueError("render backend 'gsplat' needs CUDA tensors; use backend='torch' on the CPU")
        if not gsplat_available():
            raise ImportError("render backend 'gsplat' needs the gsplat package: pip install gsplat")
        from microdreamer.render import _gsplat

        if not _gsplat.usable():
            raise RuntimeError(
                "render backend 'gsplat' could not load its CUDA code (no CUDA compiler, or its build failed: "
                "see the warning above); use backend='auto' or 'torch'"
            )
    return backend


def eval_sh(degree: int, dirs: torch.Tensor, coeffs: torch.Tensor) -> torch.Tensor:
    """Evaluate real spherical harmonics (3DGS basis) of degree 0..3.

    Args:
        degree: the highest band used, 0..3 (coefficients beyond (degree+1)^2 are ignored).
        dirs: [..., 3] view directions (normalised here).
        coeffs: [..., K, 3] SH coefficients per colour channel, K >= (degree+1)^2.

    Returns:
        [..., 3] the SH value (without the +0.5 offset).
    """
    if not 0 <= degree <= 3:
        raise ValueError(f"SH degree {degree} is out of range 0..3")
    out = SH_C0 * coeffs[..., 0, :]
    if degree == 0:
        return out
    d = torch.nn.functional.normalize(dirs, dim=-1)
    x, y, z = (d[..., i : i + 1] for i in range(3))
    out = out - SH_C1 * y * coeffs[..., 1, :] + SH_C1 * z * coeffs[..., 2, :] - SH_C1 * x * coeffs[..., 3, :]
    if degree == 1:
        return out
    xx, yy, zz, xy, yz, xz = x * x, y * y, z * z, x * y, y * z, x * z
    out = (
        out
        + SH_C2[0] * xy * coeffs[..., 4, :]
        + SH_C2[1] * yz * coeffs[..., 5, :]
        + SH_C2[2] * (2 * zz - xx - yy) * coeffs[..., 6, :]
        + SH_C2[3] * xz * coeffs[..., 7, :]
        + SH_C2[4] * (xx - yy) * coeffs[..., 8, :]
    )
    if degree == 2:
        return out
    return (
        out
        + SH_C3[0] * y * (3 * xx - yy) * coeffs[..., 9, :]
        + SH_C3[1] * xy * z * coeffs[..., 10, :]
        + SH_C3[2] * y * (4 * zz - xx - yy) * coeffs[..., 11, :]
        + SH_C3[3] * z * (2 * zz - 3 * xx - 3 * yy) * coeffs[..., 12, :]
        + SH_C3[4] * x * (4 * zz - xx - yy) * coeffs[..., 13, :]
        + SH_C3[5] * z * (xx - yy) * coeffs[..., 14, :]
        + SH_C3[6] * x * (xx - 3 * yy) * coeffs[..., 15, :]
    )


def view_colors(splat: Splat, cameras: Cameras, sh_degree: int) -> torch.Tensor:
    """Per-camera RGB of each Gaussian from its SH: [C, N, 3] (or [1, N, 3] for degree 0)."""
    if sh_degree == 0:
        return (SH_C0 * splat.sh_dc + 0.5).clamp_min(0.0)[None]
    coeffs = torch.cat([splat.sh_dc[:, None, :], splat.sh_rest], dim=1)  # [N, K, 3]
    campos = torch.linalg.inv(cameras.viewmats.to(splat.means.dtype))[:, :3, 3]  # [C, 3]
    dirs = splat.means[None] - campos[:, None]  # [C, N, 3]
    return (eval_sh(sh_degree, dirs, coeffs[None]) + 0.5).clamp_min(0.0)


def _background(background, C: int, device, dtype) -> torch.Tensor:
    bg = torch.as_tensor(background, dtype=dtype, device=device)
    if bg.dim() == 1:
        bg = bg[None].expand(C, 3)
    if bg.shape != (C, 3):
        raise ValueError(f"background must be 3 values or [C, 3] = [{C}, 3], got {tuple(bg.shape)}")
    return bg


def render(
    splat: Splat,
    cameras: Cameras,
    background: Sequence[float] | torch.Tensor = (1.0, 1.0, 1.0),
    backend: str = "auto",
    sh_degree: int | None = None,
    retain_means2d_grad: bool = False,
    tile_size: int | None = None,
    depth: bool = True,
) -> RenderOutput:
    """Render a splat from C cameras, differentiably.

    Args:
        splat: N Gaussians (float32; float64 also on the torch backend), on the device to render on.
        cameras: C cameras of one image size W x H (moved to the splat's device).
        background: RGB in [0, 1], three values or [C, 3].
        backend: "auto", "torch", "gsplat" or "cpp" (see the module docstring).
        sh_degree: SH bands to use, at most the splat's degree; None = all of them.
        retain_means2d_grad: keep the gradient of ``RenderOutput.means2d`` (view-space gradient).
        tile_size: tile edge in pixels; None = the backend's default (gsplat 16, torch 8, cpp
            ``CPP_TILE_SIZE``). The image does not depend on it (every Gaussian's bounding box is
            exact).
        depth: also render the depth; False skips it (a cheaper render, ``depth`` is None) and
            changes nothing else.

    Returns:
        A :class:`RenderOutput` with rgb [C, H, W, 3], alpha [C, H, W, 1], depth [C, H, W, 1] or None.
    """
    device = splat.device
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in splat.tensors().values())
    if backend == "auto" and device.type == "cpu" and splat.means.dtype != torch.float32:
        backend = "torch"  # the cpp backend renders float32 splats only
    backend = resolve_backend(backend, device, needs_grad)
    degree = splat.sh_degree if sh_degree is None else int(sh_degree)
    if not 0 <= degree <= splat.sh_degree:
        raise ValueError(f"sh_degree {degree} is out of range 0..{splat.sh_degree} for this splat")
    cams = cameras.to(device)
    C, N, W, H = len(cams), len(splat), cams.width, cams.height
    dtype = splat.means.dtype
    bg = _background(background, C, device, dtype)
    if N == 0:
        means2d = torch.zeros(C, 0, 2, device=device, dtype=dtype, requires_grad=retain_means2d_grad)
        return RenderOutput(
            rgb=bg[:, None, None, :].expand(C, H, W, 3).clone(),
            alpha=torch.zeros(C, H, W, 1, device=device, dtype=dtype),
            depth=torch.zeros(C, H, W, 1, device=device, dtype=dtype) if depth else None,
            means2d=means2d,
            radii=torch.zeros(C, 0, 2, device=device, dtype=torch.int32),
        )
    if backend == "gsplat":
        from microdreamer.render._gsplat import render_gsplat

        out = render_gsplat(splat, cams, bg, degree, tile_size or 16, depth)
    elif backend == "cpp":
        out = _render_cpp(splat, cams, bg, degree, tile_size or CPP_TILE_SIZE, depth)
    else:
        out = _render_torch(splat, cams, bg, degree, tile_size or _torch_raster.TILE_SIZE, depth)
    if retain_means2d_grad and out.means2d.requires_grad:
        out.means2d.retain_grad()
    return out


def _render_torch(
    splat: Splat, cams: Cameras, bg: torch.Tensor, degree: int, tile_size: int, depth: bool = True
) -> RenderOutput:
    dtype = splat.means.dtype
    viewmats, Ks = cams.viewmats.to(dtype), cams.Ks.to(dtype)
    opacities = splat.opacities()
    proj = _torch_raster.project(
        splat.means,
        splat.covariances(),
        opacities,
        viewmats,
        Ks,
        cams.width,
        cams.height,
        cams.near,
        cams.far,
    )
    colors = view_colors(splat, cams, degree).expand(len(cams), -1, -1)  # [C, N, 3]
    feats = torch.cat([colors, proj.depths[..., None]], dim=-1) if depth else colors  # [C, N, 4 or 3]
    acc, alpha = _torch_raster.rasterize(proj, opacities, feats, cams.width, cams.height, tile_size=tile_size)
    rgb = acc[..., :3] + (1.0 - alpha) * bg[:, None, None, :]
    z = acc[..., 3:4] / alpha.clamp_min(1e-10) if depth else None
    return RenderOutput(rgb=rgb, alpha=alpha, depth=z, means2d=proj.means2d, radii=proj.radii)


def _render_cpp(
    splat: Splat, cams: Cameras, bg: torch.Tensor, degree: int, tile_size: int, depth: bool
) -> RenderOutput:
    """The ``"cpp"`` backend: torch's projection and colours, then the C++ binning and compositing."""
    from microdreamer.cpu_pool import cpu_workers
    from microdreamer.kernels import cpu

    if splat.means.dtype != torch.float32:
        raise ValueError(f"render backend 'cpp' renders float32 splats, got {splat.means.dtype}; use 'torch'")
    with torch.no_grad():
        opacities = splat.opacities()
        viewmats, Ks = cams.viewmats.to(torch.float32), cams.Ks.to(torch.float32)
        proj = _torch_raster.project(
            splat.means,
            splat.covariances(),
            opacities,
            viewmats,
            Ks,
            cams.width,
            cams.height,
            cams.near,
            cams.far,
        )
        C = len(cams)
        colors = view_colors(splat, cams, degree)  # [C, N, 3] or [1, N, 3]
        if depth:
            feats = torch.cat([colors.expand(C, -1, -1), proj.depths[..., None]], dim=-1).contiguous()
        else:
            feats = colors[0].contiguous() if colors.shape[0] == 1 else colors.contiguous()
        order = torch.sort(proj.depths, dim=1, stable=True).indices  # front to back, ties by index
        acc, alpha = cpu.rasterize(
            proj.means2d.contiguous(),
            proj.conics.contiguous(),
            proj.radii.contiguous(),
            torch.log(opacities).contiguous(),
            order,
            feats,
            cams.width,
            cams.height,
            tile_size=tile_size,
            workers=cpu_workers(splat.device, C * 4),
        )
        rgb = acc[..., :3] + (1.0 - alpha) * bg[:, None, None, :]
        z = acc[..., 3:4] / alpha.clamp_min(1e-10) if depth else None
    return RenderOutput(rgb=rgb, alpha=alpha, depth=z, means2d=proj.means2d, radii=proj.radii)
