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
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from microdreamer.data_image import ImageConfig, prepare_image
from microdreamer.errors import InputError
from microdreamer.field import FieldConfig
from microdreamer.io_utils import atomic_path
from microdreamer.priors.base import OrbitViews, Prior, Reference
from microdreamer.priors.zero123 import Zero123Config
from microdreamer.profiling import StageTimer
from microdreamer.sir import SIRConfig, run_sir

logger = logging.getLogger(__name__)

RANDOM_WEIGHTS = ("tiny", "full")
#: imported in a background thread while the prior runs (used by the export stages after it)
PRELOAD_MODULES = (
    "microdreamer.mesh",
    "microdreamer.texture",
    "microdreamer.pipeline",
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
    "mesh": ("field", "mesh", "texture", "export_mesh"),
    "other": ("prepare", "views", "join_writes"),
}


def generate_texture_config():
    """generate's texture default: a 512^2 atlas baked from splat renders onto the mesh capped at
    10k faces. The cap bounds xatlas (single-threaded, superlinear in faces: 0.5 s at 5k, 1 s at
    10k, 4.7 s at 20k, 16 s at 50k faces of a smooth mesh on the 2-core dev CPU; on the H200 host,
    the random model's noise mesh: ~2 s at 10k, 19 s at 50k); 512^2 texels suit views made at
    256^2 and keep the bake and the nearest-neighbour fill at a quarter of 1024^2's texels.
    xatlas runs without chart refinement (``chart_iterations=0``): on a noisy 10k-face mesh of this
    dev CPU 0.44 s instead of 2.97 s, on a smooth one 0.61 s instead of 0.88 s, for ~20 % more charts."""
    from microdreamer.texture import TextureConfig

    return TextureConfig(size=512, max_faces=10_000, chart_iterations=0)


@dataclass
class GenerateConfig:
    """``microdreamer generate``: every stage's settings.

    Attributes:
        image: input preparation (its ``size`` must equal ``sir.image_size``).
        prior: the Zero123 prior (model, guidance, DDIM schedule).
        sir: score-based iterative reconstruction (iterations, views, losses, training, seed).
        field: density field of the mesh export.
        mesh: the mesh stage (:class:`microdreamer.mesh.MeshConfig`; imported lazily).
        texture: the mesh's texture (:class:`microdreamer.texture.TextureConfig`; default:
            :func:`generate_texture_config`, baked from the splat's renders; ``mode="none"`` exports
            it untextured).
        elevation_deg: elevation of the input image's camera (MicroDreamer's sign: negative = above).
        views_size: side of each of the 8 preview renders in views.png.
        warmup: before the SIR loop, capture the prior's CUDA graphs (timed as its own stage).
    """

    image: ImageConfig = field(default_factory=ImageConfig)
    prior: Zero123Config = field(default_factory=Zero123Config)
    sir: SIRConfig = field(default_factory=SIRConfig)
    field: FieldConfig = field(default_factory=FieldConfig)
    mesh: Any = None
    texture: Any = None
    elevation_deg: float = 0.0
    views_size: int = 256
    warmup: bool = True

    def __post_init__(self) -> None:
        if self.mesh is None:
            from microdreamer.mesh import MeshConfig

            self.mesh = MeshConfig()
        if self.texture is None:
            self.texture = generate_texture_config()
        if self.image.size != self.sir.image_size:
            raise InputError(
                f"image.size ({self.image.size}) differs from sir.image_size ({self.sir.image_size}); set both to one size"
            )
        if not -90.0 < self.elevation_deg < 90.0:
            raise InputError(f"--elevation {self.elevation_deg}: must be between -90 and 90 degrees")


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


def render_turntable(splat, elevation_deg: float, size: int = 256, count: int = 8, radius: float = 2.0,
                     fovy_deg: float = 49.1, backend: str = "auto") -> torch.Tensor:  # fmt: skip
    """[count, size, size, 3] float32 renders on white at azimuths 0, 360/count, ... (CPU tensor)."""
    from microdreamer.render import render

    az = torch.arange(count, dtype=torch.float32) * (360.0 / count)
    cams = OrbitViews(torch.full((count,), float(elevation_deg)), az, radius).cameras(fovy_deg, size, size)
    with torch.no_grad():
        out = render(splat, cams.to(splat.device), background=(1.0, 1.0, 1.0), backend=backend)
    return out.rgb.clamp(0, 1).cpu()


def save_grid(images: torch.Tensor, path: str | os.PathLike, columns: int = 4) -> Path:
    """Write [C, H, W, 3] images in [0, 1] as one PNG grid, ``columns`` wide (atomically)."""
    from PIL import Image

    C, H, W, _ = images.shape
    rows = -(-C // columns)
    grid = torch.ones(rows * H, columns * W, 3)
    for i in range(C):
        r, c = divmod(i, columns)
        grid[r * H : (r + 1) * H, c * W : (c + 1) * W] = images[i]
    arr = (grid.numpy() * 255 + 0.5).astype("uint8")
    path = Path(path)
    with atomic_path(path) as tmp:
        Image.fromarray(arr).save(
            tmp, format="PNG", compress_level=1
        )  # 4x faster than the default, ~20% larger
    return path


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
    from microdreamer.mesh import save_mesh
    from microdreamer.pipeline import resolve_device, splat_to_mesh
    from microdreamer.splat import write_ply

    config = config or GenerateConfig()
    if isinstance(device, str):
        device = resolve_device(device)
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise InputError(f"-o {out}: exists and is not a folder")
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
        views = render_turntable(splat, config.elevation_deg, config.views_size, radius=config.sir.radius,
                                 fovy_deg=config.sir.fovy_deg, backend=config.sir.train.backend)  # fmt: skip
        splat_cpu = splat.detach().to("cpu")
    background_seconds: dict[str, float] = {}

    def write_splat_and_views() -> tuple[Path, Path]:
        t0 = time.perf_counter()
        splat_file = write_ply(splat_cpu, out / "splat.ply")
        t1 = time.perf_counter()
        views_file = save_grid(views, out / "views.png")
        background_seconds.update(export_splat=t1 - t0, views_png=time.perf_counter() - t1)
        return splat_file, views_file

    # the splat and the views are written in the shadow of the mesh stage; leaving the block waits for
    # them, also when the mesh stage fails
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="microdreamer-write") as pool:
        writer = pool.submit(write_splat_and_views)
        conv = splat_to_mesh(splat, config.field, config.mesh, device, timer=timer, name=str(image_path))
        mesh = conv.mesh
        texture_stats: dict = {}
        if config.texture.mode != "none":
            from microdreamer.texture import texture_mesh

            with timer.stage("texture"):
                textured = texture_mesh(mesh, splat, config.texture, device=device)
                mesh, texture_stats = textured.mesh, textured.stats
        with timer.stage("export_mesh"):
            mesh_path = save_mesh(mesh, out / "mesh.glb")
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
