"""The gsplat backend: a thin wrapper over ``gsplat.rasterization`` (imported on first use).

gsplat JIT-compiles its CUDA sources the first time it is used (a minute or more; cached afterwards
under ``~/.cache/torch_extensions``) and needs the ``packaging`` module and ``ninja``.
"""

from __future__ import annotations

import torch

from microdreamer.cameras import Cameras
from microdreamer.splat import Splat


def render_gsplat(splat: Splat, cams: Cameras, bg: torch.Tensor, degree: int, tile_size: int):
    """Render with ``gsplat.rasterization`` in "RGB+ED" mode, non-packed (means2d is [C, N, 2]).

    Args:
        splat: N Gaussians, float32, on CUDA.
        cams: C cameras on the same device.
        bg: [C, 3] background colours.
        degree: SH bands to use.
        tile_size: tile edge in pixels.

    Returns:
        :class:`microdreamer.render.gaussians.RenderOutput`.
    """
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
        eps2d=0.3,
        sh_degree=degree,
        packed=False,
        tile_size=tile_size,
        backgrounds=bg.float().contiguous(),
        render_mode="RGB+ED",
        rasterize_mode="classic",
    )
    radii = meta["radii"]
    if radii.dim() == 2:  # gsplat < 1.5 gives one radius per Gaussian
        radii = radii[..., None].expand(*radii.shape, 2)
    return RenderOutput(
        rgb=colors[..., :3],
        alpha=alphas,
        depth=colors[..., 3:4],
        means2d=meta["means2d"],
        radii=radii.to(torch.int32),
    )
