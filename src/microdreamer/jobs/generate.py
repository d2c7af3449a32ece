"""Image-to-3D (``microdreamer generate``): input preparation -> Zero123 prior -> SIR -> splat -> mesh
-> texture -> stage 2 (the texture refined against the prior) -> file.

:func:`generate` is the stage function the CLI calls. It writes, each file atomically::

    OUT/input_rgba.png the prepared input: the object cut out (its mask), recentred, 256^2 RGBA
    OUT/splat.ply      the Gaussians (INRIA 3DGS layout)
    OUT/mesh.glb       the mesh extracted from them (density field -> marching cubes), its texture baked
                       from the splat and refined by stage 2 (MicroDreamer's ``main2.py``;
                       ``GenerateConfig.refine``, ``--no-refine`` skips it)
    OUT/views.png      the splat from 8 azimuths at the input's elevation (4 x 2 grid)
    OUT/timings.json   seconds per stage, grouped as diffusion / reconstruction / mesh / refine, and counters

CPU-side work overlaps GPU work where the data allow it: the modules of the export stages are
imported in a background thread while the prior runs (the first generation in a process otherwise
pays ~1 s of imports after the GPU work), and splat.ply and views.png are written in a background
thread while the mesh is extracted and textured.

``random_weights="tiny"|"full"`` replaces the model by one of the same architecture with random
weights (:mod:`microdreamer.priors.factory`): for timing and plumbing only, its output is noise.
"""

from __future__ import annotations

import importlib
import inspect
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
from microdreamer.priors.mvdream import FRONT_AZIMUTH_DEG
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
#: how the messages name each mask method of data.image.foreground
MASK_NOTES = {
    "alpha": "the image's alpha channel",
    "rembg": "rembg (background removal)",
    "grabcut": "GrabCut (the image has no alpha channel: a rough cut, check input_rgba.png)",
}
#: how the stage timer's entries add up to the three reported stages
STAGE_GROUPS = {
    "diffusion": ("embed", "warmup", "diffusion"),
    "reconstruction": ("render", "reconstruction", "prune"),
    "mesh": ("field", "mesh", "texture", "export"),
    "refine": ("refine",),
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


#: generation modes by their inputs, and the prior each one uses
MODES = {"image": "Zero123", "text": "MVDream", "image+text": "ImageDream"}
#: the built-in presets of the MVDream-family modes (their SIR schedules; upstream's configs)
MODE_PRESETS = {"text": "text.yaml", "image+text": "imagedream.yaml"}


def generation_mode(image: str | os.PathLike | None, prompt: str | None) -> str:
    """``"image"`` (image-to-3D, Zero123), ``"text"`` (MVDream) or ``"image+text"`` (ImageDream)."""
    if image is None and not prompt:
        raise InputError("nothing to generate from: give an input image, a --prompt, or both")
    if image is None:
        return "text"
    return "image+text" if prompt else "image"


def default_config(mode: str) -> GenerateConfig:
    """A mode's default settings: :class:`GenerateConfig`'s, with the built-in preset of the MVDream-family
    modes (``presets/text.yaml``, ``presets/imagedream.yaml``) applied."""
    from microdreamer.config import load_preset

    if mode not in MODES:
        raise InputError(f"generation mode {mode!r} is unknown; use one of {', '.join(MODES)}")
    if mode not in MODE_PRESETS:
        return GenerateConfig()
    return load_preset(GenerateConfig, Path(__file__).resolve().parents[1] / "presets" / MODE_PRESETS[mode])


def build_generate_prior(
    config: GenerateConfig,
    mode: str,
    device: torch.device,
    model: str | os.PathLike | Prior | None = None,
    random_weights: str | None = None,
) -> Prior:
    """The prior of a generation in ``mode``: ``model`` itself when it is a :class:`Prior`; a random-weight
    model of the mode's architecture for ``random_weights``; else the mode's model (``model`` or the
    config's), loaded offline."""
    if isinstance(model, Prior) or mode == "image":
        return build_prior(config.prior, device, model, random_weights, config.sir.seed)
    from microdreamer.priors.imagedream import ImageDreamPrior
    from microdreamer.priors.mvdream import MVDreamPrior
    from microdreamer.priors.zero123 import resolve_dtype

    cfg, cls = (config.mvdream, MVDreamPrior) if mode == "text" else (config.imagedream, ImageDreamPrior)
    if random_weights is not None:
        if random_weights not in RANDOM_WEIGHTS:
            raise InputError(f"random weights {random_weights!r}: unknown; use tiny or full")
        from microdreamer.priors.factory import build_random_mvdream

        logger.warning("RANDOM WEIGHTS (%s): the %s model is untrained; the output is noise, for timing and "
                       "plumbing only", random_weights, cls.kind)  # fmt: skip
        comps = build_random_mvdream(random_weights, config.sir.seed, device, resolve_dtype(cfg.dtype, device),
                                     image_prompt=mode != "text")  # fmt: skip
        return cls(comps, replace(cfg, model=f"random-{random_weights}"), device)
    if model is not None:
        cfg = replace(cfg, model=str(model))
    return cls.from_pretrained(cfg, device)


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


def initialise_device(device: torch.device) -> threading.Thread | None:
    """On a CUDA device, create its context and load cuBLAS, cuDNN and the attention kernels in a daemon
    thread (a tiny matmul, convolution and attention on zeros; no random numbers drawn), and return it;
    None on other devices. The driver and library loads run with the interpreter's lock released, so
    they overlap the model's imports (seconds of Python) instead of following them."""
    if device.type != "cuda":
        return None

    def run() -> None:
        try:
            x = torch.zeros(1, 8, 8, 8, device=device, dtype=torch.float16)
            x.flatten(1) @ torch.zeros(512, 8, device=device, dtype=torch.float16)
            torch.nn.functional.conv2d(x, torch.zeros(8, 8, 3, 3, device=device, dtype=x.dtype), padding=1)
            q = torch.zeros(1, 1, 16, 64, device=device, dtype=x.dtype)
            torch.nn.functional.scaled_dot_product_attention(q, q, q)
            torch.cuda.synchronize(device)
        except Exception as e:  # the same calls fail later, where the model needs them
            logger.debug("initialising %s in the background failed: %r", device, e)

    thread = threading.Thread(target=run, name="microdreamer-device", daemon=True)
    thread.start()
    return thread


def generate(
    image_path: str | os.PathLike | None,
    out_dir: str | os.PathLike,
    config: GenerateConfig | None = None,
    model: str | os.PathLike | Prior | None = None,
    random_weights: str | None = None,
    device: str | torch.device = "auto",
    progress: Callable[[float], None] | None = None,
    prompt: str | None = None,
    stage: Callable[[str], None] | None = None,
) -> dict:
    """One image and/or a prompt in, a Gaussian splat, a mesh, previews and timings out.

    Args:
        image_path: RGBA (alpha used) or RGB (background removed) image of one object; None for text-to-3D.
        out_dir: output folder (created); input_rgba.png (with an image), splat.ply, mesh.glb, views.png,
            timings.json go there.
        config: :class:`GenerateConfig` (``sir.iterations``, ``sir.seed`` and ``elevation_deg`` are the
            CLI's ``--iters``, ``--seed`` and ``--elevation``).
        model: a diffusers-format folder or cached repo id (overrides ``config.prior.model``), or a
            ready :class:`~microdreamer.priors.Prior` (reused as is: no loading).
        random_weights: None, "tiny" or "full": use an untrained model of that size instead.
        device: "auto", "cpu", "cuda" or a torch device.
        progress: called with 0.0 when the SIR loop starts, then with the fraction done after each SIR
            iteration.
        prompt: the text of text-to-3D (no image: MVDream) or image+text-to-3D (ImageDream); None: image-to-3D
            (Zero123). The mode's defaults: :func:`default_config` (the CLI starts from them).
        stage: called with a one-line message as each stage starts (the input's mask method, loading,
            the mesh and texture stages), so a caller can show that something is happening.

    Returns:
        {"splat", "mesh", "views", "timings"}: the written paths, plus "seconds" (per stage),
        "stages" (diffusion / reconstruction / mesh / refine / other), "seconds_after_load",
        "num_gaussians", "mesh_vertices", "mesh_faces", "prior_stats", "refine" (stage 2's stats).

    Raises:
        InputError: bad image, missing model, unusable settings (one line each).
    """
    from microdreamer.jobs.export import PRESET_SETTINGS, export_mesh
    from microdreamer.splat import write_ply

    mode = generation_mode(image_path, prompt)
    config = config or default_config(mode)
    device = resolve_device(device)
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise InputError(f"{out}: exists and is not a folder; give a folder for the outputs")
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    timer = StageTimer()
    _preload()  # not joined: it only helps when it finishes in the shadow of the GPU work
    if not isinstance(model, Prior):  # not joined either: the model's first CUDA calls wait for it
        initialise_device(device)

    say = stage or (lambda message: None)
    prepared = input_path = None
    if image_path is not None:
        with timer.stage("prepare"):
            prepared = prepare_image(image_path, config.image)
            input_path = prepared.save(out / "input_rgba.png")
        say(f"input: the object's mask from {MASK_NOTES.get(prepared.method, prepared.method)}; the prepared "
            f"input is {input_path}")  # fmt: skip
    say(
        "loading the model"
        if random_weights is None
        else f"building a random-weight ({random_weights}) model"
    )
    with timer.stage("load_model"):
        prior = build_generate_prior(config, mode, device, model, random_weights)
    if prompt is not None and hasattr(prior, "set_prompt"):
        with timer.stage("embed"):
            prior.set_prompt(prompt, config.negative_prompt)
    # stage 2 refines Zero123's image-to-3D texture; the MVDream-family modes have no stage 2
    stage2 = (mode == "image" and config.refine.enabled and config.refine.iterations > 0
              and config.export.texture.mode != "none")  # fmt: skip
    if config.warmup and hasattr(prior, "warmup"):
        with timer.stage("warmup"):
            if stage2 and "extra_views" in inspect.signature(prior.warmup).parameters:
                prior.warmup(config.sir.views, extra_views=(config.refine.views,))
            else:
                prior.warmup(config.sir.views)
    # MVDream's and ImageDream's front view is our azimuth 90 (MicroDreamer: "the second view is the front")
    front = 0.0 if mode == "image" else FRONT_AZIMUTH_DEG
    reference = None
    if prepared is not None:
        reference = Reference(prepared.rgb, prepared.mask, config.elevation_deg, front, config.sir.radius)
    say(f"SIR: {config.sir.iterations} iterations of {config.sir.views} views")
    if progress is not None:
        progress(0.0)
    result = run_sir(prior, reference, config.sir, device, progress=progress, timer=timer)
    splat = result.splat
    if len(splat) == 0:
        raise InputError(
            f"{image_path or repr(prompt)}: every Gaussian was pruned; nothing to export (try another --seed)"
        )
    with timer.stage("views"):  # the GPU part; the PNG and the PLY are written in the background
        views = orbit_previews(splat, config.elevation_deg, config.views_size, start_deg=front, radius=config.sir.radius,
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

    refine_stats: dict = {"enabled": False}
    post_texture = None
    if stage2:

        def post_texture(textured):
            from microdreamer.texture.refine import refine_with_prior

            r = config.refine
            say(f"stage 2: the texture refined against the prior's refinement of {r.views} renders of "
                f"{r.size}^2, {r.iterations} x {r.steps} Adam steps")  # fmt: skip
            with timer.stage("refine"):
                refined, stats = refine_with_prior(textured, prior, reference, config.refine, device,
                                                   config.sir.seed, config.sir.fovy_deg)  # fmt: skip
            refine_stats.update(enabled=True, **stats)
            return refined

    # the splat and the views are written in the shadow of the mesh stage; leaving the block waits for
    # them, also when the mesh stage fails
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="microdreamer-write") as pool:
        writer = pool.submit(write_splat_and_views)
        exported = export_mesh(
            splat, out / "mesh.glb", config.export, device, timer=timer, name=str(image_path),
            post_texture=post_texture, stage=stage, settings=PRESET_SETTINGS,
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
        "image": None if image_path is None else str(image_path),
        "mask_method": None if prepared is None else prepared.method,
        "input_rgba": None if input_path is None else input_path.name,
        "mode": mode,
        "prompt": prompt,
        "negative_prompt": config.negative_prompt if prompt is not None else None,
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
        "prior_stats": prior.stats() if refine_stats["enabled"] else result.prior_stats,  # SIR + stage 2
        "background_seconds": background_seconds,
        "texture": {
            k: v
            for k, v in texture_stats.items()
            if k in ("mode", "size", "faces_in", "faces", "charts", "seconds")
        },
        "loss_history": [h["loss"] for h in result.history],
        "refine": refine_stats,
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
