"""The gsplat backend: gsplat's projection, tile intersection and rasterisation kernels (imported on
first use), called directly for our one case.

gsplat JIT-compiles its CUDA sources the first time it is used (a minute or more; cached afterwards
under ``~/.cache/torch_extensions``) and needs the ``packaging`` module and ``ninja``.

:func:`render_gsplat` does what ``gsplat.rasterization(..., packed=False, rasterize_mode="classic",
camera_model="pinhole", render_mode="RGB+ED" or "RGB")`` does, with the same kernels in the same
order, but skips the general wrapper's work we never need: for SH degree 0 the colour
``max(C0 * sh_dc + 0.5, 0)`` is one elementwise expression per Gaussian instead of a camera-position
inverse, a [C, N, 3] direction tensor and the SH kernels; without depth the rasteriser composites 3
channels, not 4. The training step is bound by the host, so every launch and autograd node counts.
gsplat older than 1.5 (whose low-level signatures differ) goes through ``gsplat.rasterization``.
"""

from __future__ import annotations

import functools
import math
import re

import torch

from microdreamer.cameras import Cameras
from microdreamer.splat import SH_C0, Splat

EPS2D = 0.3  # added to the 2D covariance's diagonal (gsplat's and 3DGS's default)


def installed() -> bool:
    """True when the gsplat package is installed (nothing imported)."""
    import importlib.util

    return importlib.util.find_spec("gsplat") is not None


def prebuilt() -> bool:
    """True when the installed gsplat carries a compiled extension (``gsplat/csrc*.so``, its prebuilt
    wheels), so it needs no compiler; found without importing gsplat."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("gsplat")
    if spec is None or not spec.submodule_search_locations:
        return False
    return any(
        any(Path(p).glob("csrc*.so")) or any(Path(p).glob("csrc*.pyd"))
        for p in spec.submodule_search_locations
    )


@functools.cache
def usable() -> bool:
    """True when gsplat's CUDA code loads (compiling it now if needed: a few minutes, once, cached under
    ``~/.cache/torch_extensions``). False when gsplat is not installed, when there is no prebuilt extension
    and no CUDA compiler, or when its build fails: then ``backend="auto"`` on a GPU takes the PyTorch
    rasteriser, and :mod:`microdreamer.fallback` says so once."""
    from microdreamer import fallback
    from microdreamer.kernels import _backend

    if not installed():
        return False
    if not prebuilt() and _backend.toolkit() is None:
        fallback.no_compiler()
        return False
    try:
        from gsplat.cuda._backend import _C
    except Exception as e:  # noqa: BLE001  (a compiler's or linker's error of any kind: the build failed)
        fallback.build_failed("gsplat's CUDA code", f"{type(e).__name__}: {e}", "splat rendering (gsplat)")
        return False
    if _C is None:  # gsplat looked for a toolkit its own way and found none
        fallback.no_compiler()
        return False
    return True


@functools.cache
def _gsplat_version() -> tuple[int, int]:
    import gsplat

    m = re.match(r"(\d+)\.(\d+)", getattr(gsplat, "__version__", "0.0"))
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def render_gsplat(
    splat: Splat, cams: Cameras, bg: torch.Tensor, degree: int, tile_size: int, depth: bool = True
):
    """Render with gsplat's kernels, non-packed (means2d is [C, N, 2]), classic (no antialiasing).

    Args:
        splat: N Gaussians, float32, on CUDA.
        cams: C cameras on the same device.
        bg: [C, 3] background colours.
        degree: SH bands to use.
        tile_size: tile edge in pixels.
        depth: also composite the expected depth (a fourth channel); False leaves
            ``RenderOutput.depth`` None.

    Returns:
        :class:`microdreamer.render.gaussians.RenderOutput`.
    """
    if splat.means.dtype != torch.float32:
        raise ValueError(f"render backend 'gsplat' needs float32 splats, got {splat.means.dtype}")
    if _gsplat_version() < (1, 5):
        return render_gsplat_rasterization(splat, cams, bg, degree, tile_size, depth)
    from gsplat import fully_fused_projection, isect_offset_encode, isect_tiles, rasterize_to_pixels

    from microdreamer.render.gaussians import RenderOutput

    C, N, W, H = len(cams), len(splat), cams.width, cams.height
    viewmats = cams.viewmats.float().contiguous()
    opacities = splat.opacities()  # [N]
    radii, means2d, depths, conics, _ = fully_fused_projection(
        splat.means,
        None,
        splat.quats,  # normalised inside gsplat
        splat.scales(),
        viewmats,
        cams.Ks.float().contiguous(),
        W,
        H,
        eps2d=EPS2D,
        near_plane=cams.near,
        far_plane=cams.far,
        radius_clip=0.0,
        packed=False,
        calc_compensations=False,
        camera_model="pinhole",
        opacities=opacities,  # a tighter bounding box for faint Gaussians
    )  # radii [C, N, 2] int32, means2d [C, N, 2], depths [C, N], conics [C, N, 3]
    colors = _colors(splat, viewmats, radii, degree)  # [C, N, 3]
    bg = bg.float()
    if depth:
        colors = torch.cat([colors, depths[..., None]], dim=-1)  # [C, N, 4]
        bg = torch.cat([bg, bg.new_zeros(C, 1)], dim=-1)
    # the copies the rasteriser needs, queued before the tile intersection's host sync rather than after
    colors, bg = colors.contiguous(), bg.contiguous()
    opacities_cn = opacities[None].expand(C, N).contiguous()  # [C, N]
    tw, th = math.ceil(W / tile_size), math.ceil(H / tile_size)
    _, isect_ids, flatten_ids = isect_tiles(means2d, radii, depths, tile_size, tw, th)  # one host sync
    offsets = isect_offset_encode(isect_ids, C, tw, th).reshape(C, th, tw)
    image, alpha = rasterize_to_pixels(
        means2d, conics, colors, opacities_cn, W, H, tile_size, offsets, flatten_ids, backgrounds=bg
    )  # [C, H, W, 3 or 4], [C, H, W, 1]
    return RenderOutput(
        rgb=image[..., :3] if depth else image,
        alpha=alpha,
        depth=image[..., 3:4] / alpha.clamp(min=1e-10) if depth else None,
        means2d=means2d,
        radii=radii,
    )


def _colors(splat: Splat, viewmats: torch.Tensor, radii: torch.Tensor, degree: int) -> torch.Tensor:
    """[C, N, 3] RGB per camera and Gaussian: gsplat's ``max(SH(dir) + 0.5, 0)``, direction from the
    camera centre to the Gaussian (degree 0: the same for every camera, returned as an expanded view)."""
    C, N = radii.shape[:2]
    if degree == 0:
        return (SH_C0 * splat.sh_dc + 0.5).clamp_min(0.0)[None].expand(C, N, 3)
    from gsplat import spherical_harmonics

    coeffs = torch.cat([splat.sh_dc[:, None, :], splat.sh_rest], dim=1)  # [N, K, 3]
    campos = torch.inverse(viewmats)[:, :3, 3]  # [C, 3]
    dirs = splat.means[None] - campos[:, None]  # [C, N, 3]
    masks = (radii > 0).all(dim=-1)  # [C, N]: no SH work for culled Gaussians
    sh = spherical_harmonics(degree, dirs, coeffs[None].expand(C, *coeffs.shape), masks=masks)
    return torch.clamp_min(sh + 0.5, 0.0)


def render_gsplat_rasterization(
    splat: Splat, cams: Cameras, bg: torch.Tensor, degree: int, tile_size: int, depth: bool = True
):
    """The same render through ``gsplat.rasterization`` ("RGB+ED" or "RGB" mode): the path for gsplat
    older than 1.5, and the reference the direct path is tested against."""
    from gsplat import rasterization  # lazy: compiles CUDA code on first use

    from microdreamer.render.gaussians import RenderOutput

    if splat.means.dtype != torch.float32:
        raise ValueError(f"render backend 'gsplat' needs float32 splats, got {splat.means.dtype}")
    coeffs = torch.cat([splat.sh_dc[:, None, :], splat.sh_rest], dim=1)  # [N, K, 3]
    colors, alphas, meta = rasterization(
        means=splat.means,
        quats=splat.quats,  # normalised inside gsplat
        scales=splat.scales(),
        opacities=splat.opacities(),
        colors=coeffs,
        viewmats=cams.viewmats.float().contiguous(),
        Ks=cams.Ks.float().contiguous(),
        width=cams.width,
        height=cams.height,
        near_plane=cams.near,
        far_plane=cams.far,
        eps2d=EPS2D,
        sh_degree=degree,
        packed=False,
        tile_size=tile_size,
        backgrounds=bg.float().contiguous(),
        render_mode="RGB+ED" if depth else "RGB",
        rasterize_mode="classic",
    )
    radii = meta["radii"]
    if radii.dim() == 2:  # gsplat < 1.5 gives one radius per Gaussian
        radii = radii[..., None].expand(*radii.shape, 2)
    return RenderOutput(
        rgb=colors[..., :3],
        alpha=alphas,
        depth=colors[..., 3:4] if depth else None,
        means2d=meta["means2d"],
        radii=radii.to(torch.int32),
    )
