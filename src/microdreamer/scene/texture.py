"""A UV texture per tile of a scene, baked from views that see the tile's surface.

The object path (:func:`microdreamer.texture.texture_mesh`) bakes from a ring of views outside the object.
In a scene that ring stands behind walls; here each tile chooses its own views:

1. **Neighbourhood.** The tile's mesh bounds, grown by :attr:`TileViews.margin` times their longest side,
   are the tile's *region*. Only the Gaussians that reach into the region are rendered, and only the
   scene's faces inside it occlude (memory follows the tile, not the scene).
2. **Candidates.** The ring the object path uses, framed on the tile's mesh (:func:`~microdreamer.texture.
   bake_cameras`), and *free-space positions*: the points of a ``free_grid``^3 lattice over the region that
   lie at least ``free_margin`` (times the region's longest side) from every occluding vertex and, when the
   scene's iso level is given, where the splat's density is below ``free_level`` times that level. A
   free position looks six ways (a cube of 90-degree views), or, with the capture's own cameras, those.
3. **Visibility.** Each candidate view's depth buffer of the occluding faces (:func:`~microdreamer.render.
   mesh.rasterize_depth`, ``vis_size``^2 pixels, no back-face culling: the cut region is open); a tile face
   is seen when its centre faces the camera and its depth matches the buffer's.
4. **Choice.** The ring when it sees the tile's surface (by area) within ``ring_slack`` of all the
   candidates together (or of the whole area: the candidates are then not looked at): an object-like
   tile, baked as the object path bakes. Otherwise positions are taken
   greedily, each the one that sees the most area not yet seen, until a position adds less than
   ``min_gain`` of the area or ``max_positions`` are taken; the bake uses the chosen positions' views that
   see any face.
5. **Bake and fill.** :func:`~microdreamer.texture.bake_views` from renders of the neighbourhood's Gaussians;
   texels no view sees take the splat's colour field (:func:`~microdreamer.texture.colour_field`) at their
   surface point; the few no Gaussian reaches, and the gutters, the fill's
   (:func:`~microdreamer.texture.fill_texture`).

The unwrap is the object path's default (:func:`~microdreamer.texture.unwrap_charts`) with no face cap, so
the tile's geometry is kept: vertices are only split at chart seams.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import TYPE_CHECKING

import numpy as np
import torch

from microdreamer.cameras import Cameras, cameras_from_c2w_opengl, framing, look_at_opengl
from microdreamer.config import FieldConfig, TextureConfig
from microdreamer.mesh.types import Mesh
from microdreamer.splat import Splat

if TYPE_CHECKING:
    from microdreamer.scene.tiles import SceneResult

logger = logging.getLogger(__name__)

#: the six directions a free-space position looks in
CUBE_DIRECTIONS = ((1.0, 0.0, 0.0), (-1.0, 0.0, 0.0), (0.0, 1.0, 0.0), (0.0, -1.0, 0.0), (0.0, 0.0, 1.0),
                   (0.0, 0.0, -1.0))  # fmt: skip


@dataclass(frozen=True)
class TileViews:
    """How :func:`texture_tile` chooses its views (module docstring).

    Attributes:
        margin: the region around the tile's mesh bounds, times their longest side.
        free_grid: free-space candidates on a free_grid^3 lattice over the region.
        free_margin: a candidate lies at least this times the region's longest side from every occluding
            vertex.
        free_level: a candidate's density is below this times the scene's iso level (when one is given).
        vis_size: the visibility buffers' side, pixels.
        ring_slack: the ring is chosen when it sees the tile's area within this fraction of what every
            candidate together sees (or of the whole area).
        min_gain: a position is taken only if it sees at least this fraction of the area not yet seen.
        max_positions: free-space positions taken at most.
        size: the bake's free-space views' side, pixels (the ring's is ``TextureConfig.bake.views.size``).
    """

    margin: float = 0.5
    free_grid: int = 5
    free_margin: float = 0.05
    free_level: float = 0.1
    vis_size: int = 64
    ring_slack: float = 0.05
    min_gain: float = 0.01
    max_positions: int = 8
    size: int = 256


@dataclass
class TileTexture:
    """What :func:`texture_tile` made.

    Attributes:
        mesh: the tile's mesh with ``uv`` [V', 2] and ``texture`` [Ht, Wt, 3] uint8 (its vertices split at
            the charts' seams; faces in the input's order).
        stats: ``views`` (``"ring"`` or ``"free space"``), ``cameras``, ``positions`` (free space),
            ``ring_coverage`` and ``coverage`` (the area fraction seen by the ring and by the chosen views,
            at the visibility buffers' resolution), ``gaussians`` (rendered) of ``gaussians_scene``, the
            texel shares ``texels_from_views``, ``texels_from_field``, ``texels_filled`` (of the covered
            texels), the unwrap's stats and ``seconds`` per step.
    """

    mesh: Mesh
    stats: dict


# ------------------------------------------------------------------------------------------ region
def neighbourhood(splat: Splat, lo: np.ndarray, hi: np.ndarray, sigmas: float = 3.0) -> torch.Tensor:
    """[n] int64 indices of the Gaussians whose box of ``sigmas`` times their largest scale about the
    centre meets the box ``[lo, hi]`` (world, [3] each)."""
    with torch.no_grad():
        reach = sigmas * splat.scales().amax(-1, keepdim=True)
        lo_t = torch.as_tensor(lo, dtype=splat.means.dtype, device=splat.means.device)
        hi_t = torch.as_tensor(hi, dtype=splat.means.dtype, device=splat.means.device)
        inside = ((splat.means + reach >= lo_t) & (splat.means - reach <= hi_t)).all(-1)
    return torch.nonzero(inside).flatten().cpu()


def faces_in_box(mesh: Mesh, lo: np.ndarray, hi: np.ndarray) -> Mesh:
    """The faces of ``mesh`` with a vertex inside ``[lo, hi]``, without unused vertices."""
    inside = ((mesh.vertices >= lo) & (mesh.vertices <= hi)).all(-1)
    return mesh.subset_faces(inside[mesh.faces].any(-1))


def field_colours(points: np.ndarray, splat: Splat, cutoff_tol: float) -> np.ndarray:
    """[P, 3] float32: the splat's colour field (:func:`~microdreamer.texture.colour_field`) at world
    ``points`` [P, 3]; where no Gaussian reaches, the colour of the nearest Gaussian centre."""
    from scipy.spatial import cKDTree

    colour, weight = _field_at(torch.as_tensor(points, dtype=torch.float32), splat, cutoff_tol)
    colour = colour.numpy()
    far = (weight <= 1e-6).numpy()
    if far.any():
        with torch.no_grad():
            keep = splat.opacities() > FieldConfig().min_opacity
            centres, base = splat.means[keep].numpy(), splat.colors()[keep].numpy()
        _, near = cKDTree(centres.astype(np.float64)).query(np.asarray(points, np.float64)[far])
        colour[far] = base[near]
    return np.clip(colour, 0.0, 1.0).astype(np.float32)


def _field_at(points: torch.Tensor, splat: Splat, cutoff_tol: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The splat's colour field (colour [P, 3], density [P]) at world ``points`` [P, 3]."""
    from microdreamer.texture.field_bake import colour_field, prepared_with_colors

    config = FieldConfig(cutoff_tol=cutoff_tol)
    prepared, grid, colors = prepared_with_colors(splat, config)
    local = (points.float() - torch.tensor(grid.center)) * grid.scale
    return colour_field(local.float().contiguous(), prepared, colors, config.cutoff_sq)


# -------------------------------------------------------------------------------------------- views
def cube_cameras(positions: torch.Tensor, size: int, near: float, far: float) -> Cameras:
    """6 P cameras of 90 degrees at ``positions`` [P, 3], looking along +-x, +-y, +-z (position-major)."""
    dirs = torch.tensor(CUBE_DIRECTIONS)
    c2w = torch.cat([look_at_opengl(p[None].float(), p.float() + d) for p in positions for d in dirs])
    cams = cameras_from_c2w_opengl(c2w, math.pi / 2, size, size, axis="y")
    return Cameras(cams.viewmats, cams.Ks, size, size, near, far)


def face_visibility(
    centres: torch.Tensor,
    normals: torch.Tensor,
    occluders: Mesh,
    cameras: Cameras,
    cos_threshold: float = 0.1,
    depth_eps: float = 0.01,
    max_slope: float = 3.0,
    chunk: int = 24,
) -> torch.Tensor:
    """[C, F] bool: face centre f (``centres`` [F, 3], unit ``normals`` [F, 3]) is seen by camera c: it
    faces the camera (cosine above ``cos_threshold``), projects inside the image in front of the near
    plane, and its depth is within ``depth_eps`` (relative) plus the face's depth change over 0.75 pixels
    (its slope capped at ``max_slope``: a grazing face is not let through by its own gradient) of the depth
    buffer of ``occluders`` (no back-face culling) at its pixel. Cameras are taken ``chunk`` at a time."""
    from microdreamer.render.mesh import rasterize_depth

    C, H, W = len(cameras), cameras.height, cameras.width
    F = centres.shape[0]
    if C == 0 or F == 0:
        return torch.zeros(C, F, dtype=torch.bool)
    verts = torch.as_tensor(occluders.vertices, dtype=torch.float32)
    faces = torch.as_tensor(occluders.faces, dtype=torch.int64)
    out = torch.zeros(C, F, dtype=torch.bool)
    for c0 in range(0, C, chunk):
        cams = cameras[c0 : c0 + chunk]
        with torch.no_grad():
            depth, covered = rasterize_depth(verts, faces, cams, cull_backfaces=False)
        depth = torch.where(covered > 0, depth, torch.full_like(depth, math.inf)).reshape(len(cams), H * W)
        R, t = cams.viewmats[:, :3, :3], cams.viewmats[:, :3, 3]
        centre = -(R.transpose(1, 2) @ t[:, :, None])[..., 0]  # [c, 3]
        to_cam = centre[:, None, :] - centres[None]
        cos = (normals[None] * to_cam).sum(-1) / to_cam.norm(dim=-1).clamp_min(1e-12)
        pc = torch.einsum("cij,fj->cfi", R, centres) + t[:, None, :]
        z = pc[..., 2]
        zs = z.clamp_min(1e-9)
        fy = cams.Ks[:, 1, 1, None]
        x = cams.Ks[:, 0, 0, None] * pc[..., 0] / zs + cams.Ks[:, 0, 2, None]
        y = fy * pc[..., 1] / zs + cams.Ks[:, 1, 2, None]
        ok = (cos > cos_threshold) & (z > cams.near) & (x >= 0) & (y >= 0) & (x < W) & (y < H)
        buf = torch.gather(depth, 1, y.clamp(0, H - 1).long() * W + x.clamp(0, W - 1).long())
        c = cos.clamp_min(1e-3)
        tan = ((1.0 - c * c).clamp_min(0.0).sqrt() / c).clamp_max(max_slope)
        out[c0 : c0 + chunk] = ok & ((buf - z).abs() <= z * (depth_eps + 0.75 * tan / fy))
    return out


def free_positions(
    lo: np.ndarray,
    hi: np.ndarray,
    occluders: Mesh,
    splat: Splat,
    views: TileViews,
    level: float | None,
    cutoff_tol: float,
) -> torch.Tensor:
    """[P, 3] float32 free-space candidates in the region ``[lo, hi]`` (module docstring, step 2)."""
    from scipy.spatial import cKDTree

    n = views.free_grid
    axes = [np.linspace(lo[a], hi[a], n + 2)[1:-1] for a in range(3)]
    points = np.stack(np.meshgrid(*axes, indexing="ij"), -1).reshape(-1, 3)
    if occluders.num_vertices:
        dist, _ = cKDTree(occluders.vertices.astype(np.float64)).query(points)
        points = points[dist >= views.free_margin * float(np.max(hi - lo))]
    points = torch.tensor(points, dtype=torch.float32)
    if level is not None and points.shape[0] and len(splat):
        _, density = _field_at(points, splat, cutoff_tol)
        points = points[density < views.free_level * level]
    return points


def choose_views(
    mesh: Mesh,
    occluders: Mesh,
    region: tuple[np.ndarray, np.ndarray],
    splat: Splat,
    config: TextureConfig,
    views: TileViews,
    level: float | None = None,
    capture: Cameras | None = None,
) -> tuple[Cameras, dict]:
    """The bake's cameras for the tile ``mesh`` (module docstring, steps 2 to 4) and what was chosen:
    ``views``, ``cameras``, ``positions``, ``candidates``, ``ring_coverage``, ``coverage``."""
    from microdreamer.texture import bake_cameras

    v = torch.as_tensor(mesh.vertices, dtype=torch.float32)
    f = torch.as_tensor(mesh.faces, dtype=torch.int64)
    tri = v[f]
    cross = torch.linalg.cross(tri[:, 1] - tri[:, 0], tri[:, 2] - tri[:, 0])
    area = cross.norm(dim=-1) / 2
    normals = torch.nn.functional.normalize(cross, dim=-1)
    centres = tri.mean(1)
    total = float(area.sum()) or 1.0
    cos_t = config.bake.cos_threshold

    center, radius = framing(v)
    ring = bake_cameras(config.bake.views, center, radius)
    ring_vis = face_visibility(centres, normals, occluders,
                               _resized(ring, views.vis_size), cos_t)  # fmt: skip
    ring_seen = ring_vis.any(0)
    ring_coverage = float(area[ring_seen].sum()) / total

    info = {"ring_coverage": round(ring_coverage, 4)}
    if ring_coverage >= 1.0 - views.ring_slack:  # no candidate can add more than the slack
        return ring, {**info, "candidates": 0, "views": "ring", "cameras": len(ring), "positions": 0,
                      "coverage": round(ring_coverage, 4)}  # fmt: skip
    lo, hi = region
    extent = float(np.max(hi - lo))
    near, far = 1e-3 * extent, 4.0 * extent
    if capture is not None:  # clipped at the tile's scale, as the free-space cubes are
        capture = Cameras(capture.viewmats, capture.Ks, capture.width, capture.height, near, far)
        cand = _resized(capture, views.vis_size)
        groups = [[i] for i in range(len(cand))]
        kind = "capture"
    else:
        positions = free_positions(lo, hi, occluders, splat, views, level, config.field_cutoff_tol)
        cand = cube_cameras(positions, views.vis_size, near, far)
        groups = [list(range(6 * i, 6 * i + 6)) for i in range(positions.shape[0])]
        kind = "free space"
    vis = (
        face_visibility(centres, normals, occluders, cand, cos_t)
        if len(cand)
        else torch.zeros(0, len(f), dtype=bool)
    )
    group_vis = torch.stack([vis[g].any(0) for g in groups]) if groups else torch.zeros(0, len(f), dtype=bool)
    best = float(area[ring_seen | group_vis.any(0)].sum()) / total if groups else ring_coverage
    info["candidates"] = len(groups)
    if ring_coverage >= best - views.ring_slack:
        return ring, {**info, "views": "ring", "cameras": len(ring), "positions": 0,
                      "coverage": round(ring_coverage, 4)}  # fmt: skip

    seen = torch.zeros(len(f), dtype=torch.bool)
    chosen: list[int] = []
    while len(chosen) < views.max_positions:
        gain = ((group_vis & ~seen) * area).sum(-1)
        k = int(gain.argmax())
        if float(gain[k]) < views.min_gain * total:
            break
        chosen.append(k)
        seen |= group_vis[k]
    cams = [i for k in chosen for i in groups[k] if bool(vis[i].any())]
    if capture is not None:  # rendered at the bake's size, not the photos'
        out = _resized(capture[torch.tensor(cams, dtype=torch.long)], views.size)
    else:
        out = cube_cameras(positions[chosen], views.size, near, far)
        keep = [6 * j + d for j, k in enumerate(chosen) for d in range(6) if bool(vis[groups[k][d]].any())]
        out = out[torch.tensor(keep, dtype=torch.long)]
    coverage = float(area[seen].sum()) / total
    return out, {**info, "views": kind, "cameras": len(out), "positions": len(chosen),
                 "coverage": round(coverage, 4)}  # fmt: skip


def _resized(cameras: Cameras, size: int) -> Cameras:
    """``cameras`` with the image scaled to ``size`` pixels on its longer side (the same frusta)."""
    s = size / max(cameras.width, cameras.height)
    Ks = cameras.Ks.clone()
    Ks[:, :2] *= s
    w, h = max(1, round(cameras.width * s)), max(1, round(cameras.height * s))
    return Cameras(cameras.viewmats, Ks, w, h, cameras.near, cameras.far)


# --------------------------------------------------------------------------------------------- bake
def texture_tile(
    mesh: Mesh,
    splat: Splat,
    config: TextureConfig | None = None,
    views: TileViews | None = None,
    occluders: Mesh | None = None,
    level: float | None = None,
    capture: Cameras | None = None,
    field_colors: Callable[[np.ndarray], np.ndarray] | None = None,
    device: str | torch.device = "cpu",
) -> TileTexture:
    """Unwrap the tile's ``mesh`` and bake its texture from views that see it (module docstring).

    Args:
        mesh: the tile's faces (world space, wound outward), non-empty.
        splat: the scene's N Gaussians (CPU); only those reaching into the tile's region are rendered.
        config: ``size``, ``padding``, ``bake`` (thresholds, renderer backend; ``bake.views`` is the ring),
            ``field_cutoff_tol`` and ``fill_eps``; ``mode``, ``max_faces`` and ``refine`` do not apply.
        views: how the views are chosen; None = :class:`TileViews` defaults.
        occluders: the scene's mesh (or any part of it holding the region); its faces inside the region
            hide what lies behind them. None = the tile's mesh alone.
        level: the scene's iso level; free-space positions then also need a density below
            ``views.free_level`` times it.
        capture: the capture's own cameras, taken as the candidates instead of free-space positions.
        field_colors: the colour of the texels no view sees: world points [P, 3] -> [P, 3] float32; None =
            :func:`field_colours` of the region's Gaussians.
        device: where the texels, the renders of the region's Gaussians and the bake run (the view choice
            and the unwrap run on the CPU).

    Returns:
        :class:`TileTexture`.
    """
    from microdreamer.texture import (
        AtlasTooSmall,
        bake_views,
        fill_texture,
        splat_render_fn,
        texel_samples,
        unwrap,
        unwrap_charts,
    )

    if mesh.is_empty:
        raise ValueError("cannot texture an empty tile (0 faces)")
    config = config or TextureConfig()
    views = views or TileViews()
    seconds: dict[str, float] = {}
    start = time.perf_counter()
    lo, hi = mesh.vertices.min(0).astype(np.float64), mesh.vertices.max(0).astype(np.float64)
    pad = views.margin * float(np.max(hi - lo)) + 1e-6
    region = (lo - pad, hi + pad)
    index = neighbourhood(splat, *region)
    local = splat.subset(index).to("cpu")
    occ = faces_in_box(occluders, *region) if occluders is not None else mesh
    seconds["region"] = time.perf_counter() - start

    start = time.perf_counter()
    bare = Mesh(mesh.vertices, mesh.faces)
    try:
        layout = unwrap_charts(bare, None, config.size, config.padding)
        unwrapper = "charts"
    except AtlasTooSmall as e:
        logger.warning("tile texture: %s; unwrapping with xatlas instead", e)
        layout = unwrap(bare, None, config.size, config.padding, config.chart_iterations)
        unwrapper = "xatlas"
    seconds["unwrap"] = time.perf_counter() - start
    device = torch.device(device)
    verts = torch.as_tensor(layout.mesh.vertices, dtype=torch.float32, device=device)
    faces = torch.as_tensor(layout.mesh.faces, dtype=torch.int64, device=device)
    samples = texel_samples(verts, faces, torch.as_tensor(layout.uv, device=device), config.size, config.size)

    start = time.perf_counter()
    cameras, chosen = choose_views(mesh, occ, region, local, config, views, level, capture)
    seconds["views"] = time.perf_counter() - start

    start = time.perf_counter()
    occ_v = torch.as_tensor(occ.vertices, dtype=torch.float32, device=device)
    occ_f = torch.as_tensor(occ.faces, dtype=torch.int64, device=device)
    bake = replace(config.bake, cull_backfaces=False)  # the region's cut leaves the occluders open
    render_fn = splat_render_fn(local.to(device), bake.backend)
    colors, seen, _ = bake_views(samples, occ_v, occ_f, cameras.to(device), render_fn, bake)
    seconds["bake"] = time.perf_counter() - start

    start = time.perf_counter()
    from_views = int(seen.sum())
    unseen = torch.nonzero(~seen).flatten()
    if unseen.numel() and len(local):
        fn = field_colors or (lambda points: field_colours(points, local, config.field_cutoff_tol))
        points = samples.points[unseen].cpu().numpy()
        colors[unseen] = torch.as_tensor(fn(points), dtype=torch.float32, device=colors.device).clamp(0, 1)
        seen[unseen] = True
    from_field = int(seen.sum()) - from_views
    seconds["field"] = time.perf_counter() - start
    start = time.perf_counter()
    texture, fill = fill_texture(samples, colors, seen, eps=config.fill_eps)
    seconds["fill"] = time.perf_counter() - start
    covered = max(len(samples), 1)
    stats = {
        **chosen,
        "unwrap": unwrapper,
        "charts": layout.stats.get("charts"),
        "size": config.size,
        "gaussians": int(index.numel()),
        "gaussians_scene": len(splat),
        "texels_covered": len(samples),
        "texels_from_views": round(from_views / covered, 4),
        "texels_from_field": round(from_field / covered, 4),
        "texels_filled": round(fill.get("texels_filled_3d", 0) / covered, 4),
        "seconds": {k: round(v, 3) for k, v in seconds.items()},
    }
    return TileTexture(layout.with_texture(texture), stats)


# -------------------------------------------------------------------------------------------- scene
#: how a progress line and a summary name each kind of view choice (``TileTexture.stats["views"]``)
VIEW_NAMES = {"ring": "ring", "free space": "free-space", "capture": "capture cameras"}


def describe_tile(stats: dict) -> str:
    """One line of what :func:`texture_tile` chose and made for a tile (its ``stats``)."""
    s = stats
    where = VIEW_NAMES.get(s["views"], s["views"])
    if s["views"] == "free space":
        where += f" ({s['positions']} positions)"
    return (f"{where}, {s['cameras']} views, {100 * s['coverage']:.0f}% of the area seen; "
            f"{100 * s['texels_from_views']:.0f}% of texels from views, {100 * s['texels_from_field']:.0f}% "
            "from the colour field")  # fmt: skip


def texture_scene(
    scene: SceneResult,
    splat: Splat,
    config: TextureConfig | None = None,
    views: TileViews | None = None,
    progress: Callable[[str], None] | None = None,
    capture: Cameras | None = None,
    device: str | torch.device = "cpu",
) -> list[TileTexture]:
    """:func:`texture_tile` on every tile of a meshed ``scene`` (its
    :meth:`~microdreamer.scene.SceneResult.tile_meshes`), with the scene's whole mesh as occluder, its iso
    level for the free-space test, and the texels no view sees coloured as the vertex colours are (the
    plan's colour field of the tile, :func:`~microdreamer.scene.tiles._tile_colors`): one textured mesh per
    tile with faces, in tile order, ``stats["tile"]`` its tile number. ``progress`` gets one line a tile;
    ``device``: where each tile's bake runs (:func:`texture_tile`)."""
    from microdreamer.scene.tiles import _tile_colors

    say = progress or (lambda message: None)
    parts = scene.tile_meshes()
    out = []
    for n, (t, part) in enumerate(parts):
        result = texture_tile(part, splat, config, views, occluders=scene.mesh, level=scene.level,
                              capture=capture, field_colors=partial(_tile_colors, scene.plan, t),
                              device=device)  # fmt: skip
        result.stats["tile"] = t
        say(f"texture: tile {n + 1}/{len(parts)}: {part.num_faces:,} faces, {describe_tile(result.stats)}")
        out.append(result)
    return out


def tile_vertex_colours(scene: SceneResult, tiles: list[TileTexture]) -> np.ndarray:
    """[V, 3] float32 the colours of ``scene.mesh``'s vertices from the tiles' textures (``tiles`` as
    :func:`texture_scene` made them): each vertex the mean of its corners' texture samples over every face
    that uses it, in every tile. A tile's faces are the scene's faces of that tile, in order, so its
    corners map back to the scene's vertices face by face."""
    mesh = scene.mesh
    total = np.zeros((mesh.num_vertices, 3), np.float64)
    count = np.zeros(mesh.num_vertices, np.int64)
    for tile in tiles:
        faces = mesh.faces[scene.face_tile == tile.stats["tile"]].reshape(-1)
        colours = tile.mesh.colors_at_vertices()[tile.mesh.faces.reshape(-1)]
        np.add.at(total, faces, colours)
        np.add.at(count, faces, 1)
    return (total / np.maximum(count, 1)[:, None]).astype(np.float32)
