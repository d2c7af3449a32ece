"""The ``mesh`` export of a scene in tiles (``--tiles auto|N``): :func:`microdreamer.scene.scene_to_mesh`,
then the file. What :func:`~microdreamer.jobs.export.export_mesh` runs when ``config.scene`` is on.

Colour (``scene.texture``, ``--tile-texture``): ``colors``, the default, colours the tiled mesh per vertex
from the splat's colour field, tile by tile (bounded memory, no UV unwrap, every face kept); ``bake`` gives
each tile its own UV texture (:func:`microdreamer.scene.texture.texture_scene`: an object-like tile from
the ring of outside views, a tile inside a room from free-space positions), about 25 s a tile on a 2-core
CPU. ``--texture none`` leaves the mesh uncoloured.

Cleanup: as the object path's, except that a scene keeps the walls of enclosed voids
(``scene.remove_cavities``, off): a closed room's inner walls are one.

Device: on a CUDA device the tiles' fields, colour fields and iso-level alphas run there
(:mod:`microdreamer.scene.tiles`, backend ``"cuda"``, or the PyTorch reference where the kernels do not
load); marching cubes, the weld and the cleanup stay on the CPU.
Files: a ``.glb`` has one node (mesh) per tile, named ``tile_<a>_<b>_<c>``, the seams shared exactly (with
``bake``, each node its own material and image); an ``.obj`` or ``.ply`` is the one welded mesh (with
``bake``, its vertex colours are the tiles' textures sampled at the vertices: one mesh holds no texture
per tile). ``scene.tileset`` also writes the tiles as OGC 3D Tiles 1.1 (:mod:`microdreamer.scene.tileset`;
with ``bake``, each tile's GLB textured) into that folder, staged and moved in as one.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from microdreamer.cameras import Cameras
from microdreamer.config import ExportConfig
from microdreamer.errors import InputError
from microdreamer.mesh import Mesh, save_mesh
from microdreamer.mesh.export import glb_nodes_bytes, glb_or_one_line
from microdreamer.profiling import StageTimer
from microdreamer.splat import Splat

logger = logging.getLogger(__name__)

#: a dense export of this many Gaussians or more says that ``--tiles`` exists (the dense path held 5.9 GB at
#: 1.09M and 20 GB at 4M on the CPU; bench_scene.py)
SCENE_HINT_GAUSSIANS = 2_000_000
#: how a stage line names each tile backend
BACKEND_NAMES = {
    "cpp": "the C++ field kernel",
    "cuda": "the CUDA gather kernel",
    "torch": "the PyTorch field",
}
#: ``--memory auto``: this share of the free memory, split over the workers, for the tiles' work (the
#: rest for the plan each worker holds, the pieces and the welded mesh)
MEMORY_SHARE = 0.25
#: ``--tile-threads auto`` on a GPU: tiles meshed at once (H100, 10.08M Gaussians: 17.1 s on one thread,
#: 14.5 s on 4; ``benchmarks/results/scene_10000k_h100.json``)
GPU_TILE_THREADS = 4


def tile_threads(threads: int | str, device: str | torch.device) -> int:
    """How many tiles this process meshes at once (``SceneConfig.threads``): ``"auto"`` is
    :data:`GPU_TILE_THREADS` on a GPU (capped by the CPU count: a tile's marching cubes and cleanup run on
    the host) and 1 on a CPU, where the field kernel already uses every core."""
    if threads != "auto":
        return int(threads)
    if torch.device(device).type == "cpu":
        return 1
    return max(1, min(GPU_TILE_THREADS, os.cpu_count() or 1))


def memory_budget(memory: float | str, workers: int = 1) -> int:
    """Bytes one tile's work may take per worker: ``memory`` GB, or for ``"auto"``
    :data:`MEMORY_SHARE` of this machine's free memory over the ``workers`` (on a cluster of several
    machines, this machine's free memory stands in for each node's)."""
    if memory != "auto":
        return int(float(memory) * 1e9)
    from microdreamer.io_utils import free_host_memory

    return int(MEMORY_SHARE * free_host_memory() / max(1, workers))


def drop_background(splat: Splat, min_opacity: float, stage: Callable[[str], None] | None = None) -> Splat:
    """``splat`` (upright, any device) without its sparse far background (``--background drop``): the
    Gaussians outside :func:`microdreamer.crop.core_box`'s box of those above ``min_opacity`` (the ones the
    tiles would mesh). ``stage`` gets one line when any is left out: how many, the box kept, and the flag
    that keeps them."""
    from microdreamer.crop import core_box, inside

    with torch.no_grad():
        visible = splat.opacities().float() > min_opacity
        means = splat.means.detach().float().cpu().numpy()
        opacities = splat.opacities().detach().float().cpu().numpy()
    shown = visible.cpu().numpy()
    if not shown.any():
        return splat
    box = core_box(means[shown], opacities[shown])
    keep = inside(means, box) | ~shown  # the faint ones go by the opacity filter, as without a box
    left_out = int(shown.sum() - (keep & shown).sum())
    if left_out == 0:
        return splat
    if stage is not None:
        corners = ",".join(f"{v:.4g}" for v in (*box.lo, *box.hi))
        stage(f"background: left out {left_out:,} of {int(shown.sum()):,} Gaussians, sparse and far from the "
              f"scene's core; kept the box {corners} (--background keep meshes them all)")  # fmt: skip
    return splat.subset(torch.from_numpy(keep).to(splat.means.device))


def export_scene(
    splat: Splat,
    path: str | os.PathLike,
    config: ExportConfig,
    device: torch.device,
    timer: StageTimer | None = None,
    name: str = "splat",
    stage: Callable[[str], None] | None = None,
    up: str = "+y",
):
    """Mesh the (upright) ``splat`` in tiles and write ``path``; returns an
    :class:`~microdreamer.jobs.export.ExportResult`.

    Finished tiles are kept in ``<path>.tiles/`` while the run lasts: a rerun after an interruption, with
    the same splat and settings, resumes from them; the folder is removed once the file is written. With
    ``config.scene.workers`` or ``ray_address`` the tiles run on Ray workers
    (:class:`~microdreamer.jobs.scene_ray.RayTiles`); the tile is capped by ``config.scene.memory``
    (:func:`memory_budget`).
    """
    from microdreamer.io_utils import atomic_path
    from microdreamer.jobs.export import ConvertResult, ExportResult
    from microdreamer.scene import scene_to_mesh, threaded_tiles
    from microdreamer.scene.tileset import tile_name

    say = stage or (lambda message: None)
    timer = timer or StageTimer()
    if config.field.mode != "exact":
        raise InputError(f"{name}: --tiles needs --mode exact (the tiled field is the exact mode's)")
    scene = config.scene
    bake = scene.texture == "bake" and config.texture.mode != "none"
    colors = config.texture.mode != "none" and not bake
    path = Path(path)
    capture = None
    if bake and scene.cameras is not None:  # read first: a bad file stops the run before any work
        from microdreamer.data.capture import read_capture_cameras, rotated
        from microdreamer.orient import up_rotation

        capture = read_capture_cameras(scene.cameras)
        capture = rotated(capture, up_rotation(up)) if up != "+y" else capture
        say(f"capture cameras: {len(capture)} from {scene.cameras} ({capture.width} x {capture.height})")
    work = path.with_name(path.name + ".tiles")
    distributed = scene.workers is not None or scene.ray_address is not None
    if distributed:
        from microdreamer.jobs.scene_ray import RayTiles

        runner = RayTiles(scene.workers, scene.ray_address, torch.device(device).type)
    else:
        threads = tile_threads(scene.threads, device)
        runner = contextlib.nullcontext(threaded_tiles(threads) if threads > 1 else None)
    with runner as map_tiles:
        workers = map_tiles.workers if distributed else threads
        memory = memory_budget(scene.memory, workers)
        if distributed:
            say(f"tiles on {workers} Ray worker(s), {map_tiles.threads} thread(s) each")
        elif threads > 1:
            say(f"tiles on {threads} threads of this process")
        try:
            result = scene_to_mesh(
                splat.to("cpu"),
                config.field,
                replace(config.mesh, remove_cavities=config.mesh.remove_cavities and scene.remove_cavities),
                tile=scene.tile,
                voxel=scene.voxel,
                tiles_along_longest=scene.tiles if isinstance(scene.tiles, int) else None,
                colors=colors,
                work_dir=work,
                progress=say,
                device=device,
                map_tiles=map_tiles,
                memory=memory,
            )
        except ValueError as e:
            raise InputError(f"{name}: {e}") from None
    say(f"tiles ran on {result.plan.device} ({BACKEND_NAMES[result.plan.backend]})")
    for k, v in result.stats["seconds"].items():
        timer.seconds[k] = timer.seconds.get(k, 0.0) + v
    mesh = result.mesh
    if mesh.is_empty:
        raise InputError(f"{name}: no surface is left after cleanup at the iso-level {result.level:g}")
    texture_stats = {"mode": "vertex colours (colour field)"} if colors else {}
    if bake:
        with timer.stage("texture"):
            tiles, mesh, texture_stats = bake_tiles(result, splat, config, say, device, capture)
    else:
        tiles = [(tile_name(result.plan.tile_index(t)), m) for t, m in result.tile_meshes()]
    # the mesh staged beside its name and moved in only once the tileset is written too: a failed tileset
    # leaves neither output
    with atomic_path(path) as staged:
        with timer.stage("export"):
            if path.suffix.lower() == ".glb":
                say(f"writing {path} ({len(tiles)} tile nodes)")
                nodes = [m for _, m in tiles], [n for n, _ in tiles]
                try:
                    data = glb_or_one_line(lambda: glb_nodes_bytes(*nodes), path)
                except InputError:  # too large for a .glb: a rerun as it is would fail again
                    shutil.rmtree(work, ignore_errors=True)
                    raise
                staged.write_bytes(data)
                del data
            else:
                sampled = " (one mesh: the tiles' textures sampled into vertex colours)" if bake else ""
                say(f"writing {path}{sampled}")
                save_mesh(mesh, staged)
        if scene.tileset is not None:
            with timer.stage("tileset"):
                write_scene_tileset(scene.tileset, tiles, mesh, result.plan.grid.spacing, say)
    written = path
    shutil.rmtree(work, ignore_errors=True)
    g = result.plan.grid
    conv = ConvertResult(
        mesh, len(splat), len(result.plan.prepared), max(g.shape), f"{result.plan.backend}-tiles", float("nan"),
        result.stats, result.level, result.iso_method, result.iso_iou, None,
    )  # fmt: skip
    return ExportResult(written, mesh, conv, texture_stats, up)


def bake_tiles(
    result,
    splat: Splat,
    config: ExportConfig,
    say: Callable[[str], None],
    device: str | torch.device = "cpu",
    capture: Cameras | None = None,
) -> tuple[list[tuple[str, Mesh]], Mesh, dict]:
    """A UV texture per tile of the meshed scene ``result`` (a :class:`~microdreamer.scene.SceneResult`;
    :func:`~microdreamer.scene.texture.texture_scene` with ``config.texture``): ``(name, textured mesh)``
    per tile, the welded mesh with the textures sampled at its vertices, and the stats (``views``: how many
    tiles took each kind of view, ``seconds`` per part summed over the tiles); the bake runs on ``device``,
    with the ``capture``'s own cameras (upright, as the splat) as candidates where the ring falls short."""
    from microdreamer.scene.texture import VIEW_NAMES, texture_scene, tile_vertex_colours
    from microdreamer.scene.tileset import tile_name

    n = len(np.unique(result.face_tile))
    say(f"texture: baking {n} tiles ({config.texture.size}^2 texels each)")
    baked = texture_scene(result, splat, config.texture, progress=say, device=device, capture=capture)
    views: dict[str, int] = {}
    seconds: dict[str, float] = {}
    for b in baked:
        kind = VIEW_NAMES.get(b.stats["views"], b.stats["views"])
        views[kind] = views.get(kind, 0) + 1
        for k, v in b.stats["seconds"].items():
            seconds[k] = seconds.get(k, 0.0) + float(v)
    mesh = Mesh(result.mesh.vertices, result.mesh.faces, tile_vertex_colours(result, baked))
    stats = {
        "mode": "bake (a UV texture per tile)",
        "size": config.texture.size,
        "tiles": len(baked),
        "views": views,
        "coverage_min": min((b.stats["coverage"] for b in baked), default=None),
        "texels_from_views": round(
            sum(b.stats["texels_from_views"] * b.stats["texels_covered"] for b in baked)
            / max(1, sum(b.stats["texels_covered"] for b in baked)), 4
        ),
        "seconds": {k: round(v, 3) for k, v in seconds.items()},
    }  # fmt: skip
    tiles = [(tile_name(result.plan.tile_index(b.stats["tile"])), b.mesh) for b in baked]
    return tiles, mesh, stats


#: the files a tileset folder holds (replaced by the next run into the folder)
TILESET_OUTPUTS = ("tileset.json", "tiles")


def write_scene_tileset(
    folder: str | os.PathLike,
    tiles: list[tuple[str, Mesh]],
    mesh: Mesh,
    voxel: float,
    stage: Callable[[str], None] | None = None,
) -> Path:
    """Write ``tiles`` (``(name, mesh)`` each) as 3D Tiles 1.1 into ``folder``, with a coarse root made
    from the whole ``mesh`` when it has :data:`~microdreamer.scene.tileset.ROOT_LOD_MIN_FACES` faces or
    more; staged beside the folder and moved in as one (the user's other files kept). Returns the path of
    ``tileset.json``."""
    from microdreamer.io_utils import staged_folder
    from microdreamer.scene.tileset import ROOT_LOD_FACTOR, ROOT_LOD_MIN_FACES, coarse_root, write_tileset

    say = stage or (lambda message: None)
    root = None
    if mesh.num_faces >= ROOT_LOD_MIN_FACES:
        root = coarse_root(mesh, ROOT_LOD_FACTOR)
        say(f"tileset: coarse root of {root[0].num_faces:,} faces (error {root[1]:.4g})")
    say(f"writing {folder}/tileset.json ({len(tiles)} tiles)")
    with staged_folder(folder, owned=TILESET_OUTPUTS) as stage_dir:
        stage_dir.mkdir()
        write_tileset(stage_dir, tiles, voxel, root)
    return Path(folder) / "tileset.json"
