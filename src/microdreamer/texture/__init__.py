"""The texture stage: mesh + splat -> textured mesh (UV unwrap, bake, optional refinement).

:func:`texture_mesh` runs the stage with a :class:`TextureConfig`:

1. face cap (quadric decimation to ``max_faces``) and UV unwrap, by ``unwrap``: charts of clustered
   normals (:func:`unwrap_charts`, the default, on the bake's device) or xatlas (:func:`unwrap`, on the
   CPU);
2. the covered texels of the ``size`` x ``size`` atlas as surface points (:func:`texel_samples`);
3. their colours, by ``mode``:

   * ``"bake"``: back-projection of splat renders from a view set, visibility from the mesh
     rasteriser (:func:`bake_views`);
   * ``"field"``: the splat's colour field at each texel's surface point, no rendering
     (:func:`bake_field`);
   * ``"none"``: no texture; the mesh is returned as it is;

4. fill: unseen texels from the nearest seen surface point, gutters by nearest-neighbour dilation
   (:func:`fill_texture`), so there is no empty texel;
5. optional stage-2 refinement against targets (:func:`refine_texture`, ``refine.steps > 0``).

xatlas is imported only when unwrapping with it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from microdreamer.cameras import framing
from microdreamer.config import TEXTURE_MODES as MODES
from microdreamer.config import BakeConfig, BakeViewsConfig, RefineConfig, TextureConfig
from microdreamer.mesh import Mesh
from microdreamer.texture.atlas import TexelSamples, fill_texture, texel_samples
from microdreamer.texture.bake import (
    bake_cameras,
    bake_views,
    mesh_render_fn,
    splat_render_fn,
)
from microdreamer.texture.charts import AtlasTooSmall, unwrap_charts
from microdreamer.texture.field_bake import bake_field, colour_field, colour_field_reference
from microdreamer.texture.refine import TargetsFn, refine_texture, splat_targets
from microdreamer.texture.unwrap import UVLayout, unwrap

logger = logging.getLogger(__name__)

__all__ = [
    "MODES",
    "BakeConfig",
    "BakeViewsConfig",
    "RefineConfig",
    "TargetsFn",
    "TexelSamples",
    "TextureConfig",
    "TextureResult",
    "UVLayout",
    "bake_cameras",
    "bake_field",
    "bake_views",
    "colour_field",
    "colour_field_reference",
    "fill_texture",
    "mesh_render_fn",
    "refine_texture",
    "splat_render_fn",
    "splat_targets",
    "texel_samples",
    "texture_mesh",
    "unwrap",
    "unwrap_charts",
]


@dataclass
class TextureResult:
    """What :func:`texture_mesh` returns.

    Attributes:
        mesh: the textured mesh (``uv`` and ``texture`` set), or the input mesh for mode ``"none"``.
        stats: ``mode``, ``size``, the unwrap stats (``faces_in``, ``faces``, ``vertices``, ``charts``,
            ``utilization``, ``atlas_width``, ``atlas_height``), the fill counts (``texels_covered``, ``texels_seen``,
            ``texels_filled_3d``, ``texels_dilated``), optional ``refine`` stats, and ``seconds``
            per step (``decimate``, ``unwrap``, ``texels``, ``render``, ``rasterize``, ``project`` or
            ``field``, ``fill``, ``refine``).
    """

    mesh: Mesh
    stats: dict


def stats_line(stats: dict) -> str:
    """The unwrap's numbers in words: faces, charts, atlas use."""
    return (f"{stats.get('faces', 0):,} faces in {stats.get('charts', 0):,} charts, "
            f"{100 * stats.get('utilization', 0):.0f}% of the atlas used")  # fmt: skip


def texture_mesh(
    mesh: Mesh,
    splat,
    config: TextureConfig | None = None,
    device: str | torch.device = "cpu",
    targets_fn: TargetsFn | None = None,
    progress: bool = False,
    stage: Callable[[str], None] | None = None,
) -> TextureResult:
    """Unwrap ``mesh`` and bake the texture of ``splat`` onto it (see the module docstring).

    Args:
        mesh: the mesh extracted from ``splat`` (same coordinates), non-empty.
        splat: :class:`microdreamer.splat.Splat` (moved to ``device``).
        config: stage settings; None = defaults (bake, 1024^2, 50k-face cap, no refinement).
        device: where the bake runs (``"cuda"``: gsplat renders with ``bake.backend="auto"``).
        targets_fn: refinement targets, cameras -> [C, H, W, 3 or 4]; None = the splat's own renders
            (:func:`splat_targets`). Used only when ``config.refine.steps > 0``.
        progress: tqdm progress bars for the bake and the refinement.
        stage: optional ``stage(message)`` called as each step starts (unwrap, texels, bake, fill,
            refinement), so none of them runs silently.

    Returns:
        :class:`TextureResult`.
    """
    config = config or TextureConfig()
    if config.mode == "none":
        return TextureResult(mesh, {"mode": "none"})
    if mesh.is_empty:
        raise ValueError("cannot texture an empty mesh (0 faces)")
    device = torch.device(device)
    seconds: dict[str, float] = {}
    say = stage or (lambda message: None)

    cap = config.max_faces
    how = ("charts of clustered normals" if config.unwrap == "charts"
           else "xatlas, one CPU thread: ~10 s at 50k faces")  # fmt: skip
    if cap is not None and mesh.num_faces > cap:
        say(
            f"texture: decimating {mesh.num_faces:,} -> {cap:,} faces (texture.max_faces), then the UV unwrap ({how})"
        )
    else:
        say(f"texture: UV unwrap of {mesh.num_faces:,} faces ({how})")
    unwrap_used = config.unwrap
    if config.unwrap == "charts":
        try:
            layout = unwrap_charts(mesh, config.max_faces, config.size, config.padding, device=device)
            seconds["unwrap"] = layout.stats["seconds"]["unwrap"]
        except AtlasTooSmall as e:  # charts that cannot each get a texel of a tiny atlas: xatlas shrinks them
            logger.warning("texture: %s; unwrapping with xatlas instead", e)
            unwrap_used = "xatlas"
    if unwrap_used == "xatlas":
        layout = unwrap(mesh, config.max_faces, config.size, config.padding, config.chart_iterations)
        seconds["unwrap"] = layout.stats["seconds"]["xatlas"]
    seconds["decimate"] = layout.stats["seconds"]["decimate"]
    stats = {"mode": config.mode, "unwrap": unwrap_used, "size": config.size}
    stats.update({k: v for k, v in layout.stats.items() if k != "seconds"})

    say(f"texture: {stats_line(layout.stats)}; sampling the {config.size}^2 atlas's texels")
    start = time.perf_counter()
    verts = torch.as_tensor(layout.mesh.vertices, device=device)
    faces = torch.as_tensor(layout.mesh.faces, device=device)
    uv = torch.as_tensor(layout.uv, device=device)
    samples = texel_samples(verts, faces, uv, config.size, config.size)
    seconds["texels"] = time.perf_counter() - start

    splat = splat.to(device)
    if config.mode == "bake":
        center, radius = framing(verts)
        cameras = bake_cameras(config.bake.views, center, radius)
        say(f"texture: baking from {len(cameras)} splat renders of {config.bake.views.size}^2")
        colors, seen, bake_stats = bake_views(
            samples, verts, faces, cameras, splat_render_fn(splat, config.bake.backend), config.bake, progress
        )
        seconds.update(bake_stats["seconds"])
        stats["views"] = bake_stats["views"]
    else:
        from microdreamer.field import FieldConfig

        say("texture: the splat's colour field at every texel")
        start = time.perf_counter()
        colors, seen, field_stats = bake_field(
            samples, splat, FieldConfig(cutoff_tol=config.field_cutoff_tol)
        )
        seconds["field"] = time.perf_counter() - start
        stats.update(field_stats)

    say("texture: filling the texels no view saw (nearest seen surface point) and the gutters")
    start = time.perf_counter()
    texture, fill_stats = fill_texture(samples, colors, seen, eps=config.fill_eps)
    seconds["fill"] = time.perf_counter() - start
    stats.update(fill_stats)
    out = layout.with_texture(texture)

    if config.refine.steps > 0:
        say(f"texture: refining for {config.refine.steps} steps")
        fn = targets_fn if targets_fn is not None else splat_targets(splat, config.bake.backend)
        out, refine_stats = refine_texture(out, fn, config.refine, device, progress=progress)
        seconds["refine"] = refine_stats["seconds"]
        stats["refine"] = {k: v for k, v in refine_stats.items() if k != "seconds"}
    stats["seconds"] = seconds
    logger.info(
        "texture: %s %dx%d, %d of %d covered texels seen, %.1f s",
        config.mode, config.size, config.size, stats["texels_seen"], stats["texels_covered"], sum(seconds.values()),
    )  # fmt: skip
    return TextureResult(out, stats)
