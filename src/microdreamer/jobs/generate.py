"""Image-to-3D (``microdreamer generate``): input preparation -> Zero123 prior -> SIR -> splat -> mesh.

:func:`generate` is the stage function the CLI calls. It writes, each file atomically::

    OUT/splat.ply      the Gaussians (INRIA 3DGS layout)
    OUT/mesh.glb       the mesh extracted from them (density field -> marching cubes)
    OUT/views.png      the splat from 8 azimuths at the input's elevation (4 x 2 grid)
    OUT/timings.json   seconds per stage, grouped as diffusion / reconstruction / mesh, and counters

CPU-side work overlaps GPU work where the data allow it: the modules of the export stages are
imported in a background thread while the prior runs (the first generation in a process otherwise
pays ~1 s of imports after the GPU work), and splat.ply and views.png are written in a background
thread while the mesh is extracted and textured.

``random_weights="tiny"|"full"`` replaces the model by one of the same architecture with random
weights (:mod:`microdreamer.priors.factory`): for timing and plumbing only, its output is noise.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import torch

from microdreamer.config import RANDOM_WEIGHTS, GenerateConfig, Zero123Config
from microdreamer.data.image import prepare_image
from microdreamer.errors import InputError
from microdreamer.io_utils import atomic_path
from microdreamer.jobs import resolve_device
from microdreamer.jobs.turntable import orbit_previews, save_contact_sheet
from microdreamer.priors.base import Prior, Reference
from microdreamer.profiling import StageTimer
from microdreamer.sir import run_sir

logger = logging.getLogger(__name__)

#: imported in a background thread while the prior runs (used by the export stages after it)
PRELOAD_MODULES = (
    "microdreamer.mesh",
    "microdreamer.texture",
    "microdreamer.jobs.export",
    "skimage.measure",
    "scipy.spatial",
    "scipy.ndimage",
    "fast_simplification",
    "xatlas",
    "trimesh",
    "PIL.Image",
    "PIL.PngImagePlugin",
)
#: how the stage timer's entries add up to the three reported stages
STAGE_GROUPS = {
    "diffusion": ("embed", "warmup", "diffusion"),
    "reconstruction": ("render", "reconstruction", "prune"),
    "mesh": ("field", "mesh", "texture", "export"),
    "other": ("prepare", "views", "join_writes"),
}


def build_prior(
    config: Zero123Config,
    device: torch.device,
    model: str | os.PathLike | Prior | None = None,
    random_weights: str | None = None,
    seed: int = 0,
) -> Prior:
    """The prior of a generation: ``model`` itself when it is a :class:`Prior`; a random-weight Zero123
    for ``random_weights``; else the Zero123 model at ``model`` (or ``config.model``), loaded offline."""
    if isinstance(model, Prior):
        return model
    from microdreamer.priors.zero123 import Zero123Prior, resolve_dtype

    if random_weights is not None:
        if random_weights not in RANDOM_WEIGHTS:
            raise InputError(f"--random-weights {random_weights}: unknown; use tiny or full")
        from microdreamer.priors.factory import build_random_zero123

        logger.warning(
            "RANDOM WEIGHTS (%s): the Zero123 model is untrained; the output is noise, for timing and plumbing only",
            random_weights,
        )
        comps = build_random_zero123(random_weights, seed, device, resolve_dtype(config.dtype, device))
        return Zero123Prior(comps, replace(config, model=f"random-{random_weights}"), device)
    if model is not None:
        config = replace(config, model=str(model))
    return Zero123Prior.from_pretrained(config, device)


def _preload(names: tuple[str, ...] = PRELOAD_MODULES) -> threading.Thread | None:
    """Import ``names`` (those not imported yet, and installed) in a daemon thread; None if none."""
    todo = [n for n in names if n not in sys.modules]
    if not todo:
        return None

    def run() -> None:
        for name in todo:
            try:
                importlib.import_module(name)
            except Exception as e:  # a missing optional module fails later, where it is needed
                logger.debug("preload of %s failed: %r", name, e)

    thread = threading.Thread(target=run, name="microdreamer-preload", daemon=True)
    thread.start()
    return thread


def generate(
    image_path: str | os.PathLike,
    out_dir: str | os.PathLike,
    config: GenerateConfig | None = None,
    model: str | os.PathLike | Prior | None = None,
    random_weights: str | None = None,
    device: str | torch.device = "auto",
    progress: Callable[[float], None] | None = None,
) -> dict:
    """One image in, a Gaussian splat, a mesh, previews and timings out.

    Args:
        image_path: RGBA (alpha used) or RGB (background removed) image of one object.
        out_dir: output folder (created); splat.ply, mesh.glb, views.png, timings.json go there.
        config: :class:`GenerateConfig` (``sir.iterations``, ``sir.seed`` and ``elevation_deg`` are the
            CLI's ``--iters``, ``--seed`` and ``--elevation``).
        model: a diffusers-format folder or cached repo id (overrides ``config.prior.model``), or a
            ready :class:`~microdreamer.priors.Prior` (reused as is: no loading).
        random_weights: None, "tiny" or "full": use an untrained model of that size instead.
        device: "auto", "cpu", "cuda" or a torch device.
        progress: called with the fraction done after each SIR iteration.

    Returns:
        {"splat", "mesh", "views", "timings"}: the written paths, plus "seconds" (per stage),
        "stages" (diffusion / reconstruction / mesh), "seconds_after_load", "num_gaussians",
        "mesh_vertices", "mesh_faces", "prior_stats".

    Raises:
        InputError: bad image, missing model, unusable settings (one line each).
    """
    from microdreamer.jobs.export import PRESET_SETTINGS, export_mesh
    from microdreamer.splat import write_ply

    config = config or GenerateConfig()
    device = resolve_device(device)
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise InputError(f"{out}: exists and is not a folder; give a folder for the outputs")
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    timer = StageTimer()
    _preload()  # not joined: it only helps when it finishes in the shadow of the GPU work

    with timer.stage("prepare"):
        prepared = prepare_image(image_path, config.image)
    with timer.stage("load_model"):
        prior = build_prior(config.prior, device, model, random_weights, config.sir.seed)
    if config.warmup and hasattr(prior, "warmup"):
        with timer.stage("warmup"):
            prior.warmup(config.sir.views)
    reference = Reference(prepared.rgb, prepared.mask, config.elevation_deg, 0.0, config.sir.radius)
    result = run_sir(prior, reference, config.sir, device, progress=progress, timer=timer)
    splat = result.splat
    if len(splat) == 0:
        raise InputError(f"{image_path}: every Gaussian was pruned; nothing to export (try another --seed)")
    with timer.stage("views"):  # the GPU part; the PNG and the PLY are written in the background
        views = orbit_previews(splat, config.elevation_deg, config.views_size, radius=config.sir.radius,
                               fovy_deg=config.sir.fovy_deg, backend=config.sir.train.backend)  # fmt: skip
        splat_cpu = splat.detach().to("cpu")
    background_seconds: dict[str, float] = {}

    def write_splat_and_views() -> tuple[Path, Path]:
        t0 = time.perf_counter()
        splat_file = write_ply(splat_cpu, out / "splat.ply")
        t1 = time.perf_counter()
        views_file = save_contact_sheet(views, out / "views.png")
        background_seconds.update(export_splat=t1 - t0, views_png=time.perf_counter() - t1)
        return splat_file, views_file

    # the splat and the views are written in the shadow of the mesh stage; leaving the block waits for
    # them, also when the mesh stage fails
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="microdreamer-write") as pool:
        writer = pool.submit(write_splat_and_views)
        exported = export_mesh(
            splat, out / "mesh.glb", config.export, device, timer=timer, name=str(image_path),
            settings=PRESET_SETTINGS,
        )  # fmt: skip
        mesh, mesh_path, texture_stats = exported.mesh, exported.path, exported.texture_stats
        with timer.stage("join_writes"):  # waiting for the background writes, if they are still running
            splat_path, views_path = writer.result()
    wall = time.perf_counter() - start

    seconds = dict(timer.seconds)
    stages = {k: sum(seconds.get(s, 0.0) for s in parts) for k, parts in STAGE_GROUPS.items()}
    after_load = wall - seconds.get("load_model", 0.0)
    report = {
        "seconds": seconds,
        "stages": stages,
        "wall": wall,
        "seconds_after_load": after_load,
        "seconds_after_load_and_warmup": after_load - seconds.get("warmup", 0.0),
        "image": str(image_path),
        "mask_method": prepared.method,
        "model": str(getattr(getattr(prior, "config", None), "model", type(prior).__name__)),
        "random_weights": random_weights,
        "device": str(device) + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else ""),
        "dtype": str(getattr(prior, "dtype", "")).replace("torch.", ""),
        "iterations": config.sir.iterations,
        "views_per_iteration": config.sir.views,
        "seed": config.sir.seed,
        "elevation_deg": config.elevation_deg,
        "num_gaussians": len(splat),
        "pruned": result.pruned,
        "mesh_vertices": int(mesh.num_vertices),
        "mesh_faces": int(mesh.num_faces),
        "prior_stats": result.prior_stats,
        "background_seconds": background_seconds,
        "texture": {
            k: v
            for k, v in texture_stats.items()
            if k in ("mode", "size", "faces_in", "faces", "charts", "seconds")
        },
        "loss_history": [h["loss"] for h in result.history],
    }
    timings_path = out / "timings.json"
    with atomic_path(timings_path) as tmp:
        tmp.write_text(json.dumps(report, indent=2))
    logger.info(
        "generate: %.2f s after loading the model; %s",
        after_load,
        ", ".join(f"{k} {v:.2f} s" for k, v in stages.items()),
    )
    return {"splat": splat_path, "mesh": mesh_path, "views": views_path, "timings": timings_path, **report}
