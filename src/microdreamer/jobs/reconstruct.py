"""``microdreamer reconstruct``: a posed dataset -> splat -> mesh, with held-out metrics.

:func:`reconstruct_dataset` reads a ``transforms.json`` dataset (:mod:`microdreamer.data`), trains a splat
on its training views (:func:`microdreamer.train.reconstruct.reconstruct`), and writes ``OUT/splat.ply``,
``OUT/mesh.glb`` (:func:`microdreamer.jobs.export.export_mesh`) and ``OUT/metrics.json`` (PSNR and SSIM on
the held-out views, the Gaussian count, seconds per stage).
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from pathlib import Path

import torch

from microdreamer.config import ReconstructJobConfig, to_dict
from microdreamer.errors import InputError
from microdreamer.io_utils import atomic_path
from microdreamer.splat import write_ply
from microdreamer.train.reconstruct import evaluate_views, reconstruct

logger = logging.getLogger(__name__)


def _finite(x):
    return x if x is None or math.isfinite(x) else (1e9 if x > 0 else -1e9)


#: the smallest image side reconstruct takes: the SSIM window of the loss and the metrics
MIN_IMAGE_SIZE = 11


def check_image_size(ds, data_dir) -> None:
    """InputError when the dataset's images are smaller than :data:`MIN_IMAGE_SIZE` a side."""
    w, h = ds.cameras.width, ds.cameras.height
    if min(w, h) < MIN_IMAGE_SIZE:
        raise InputError(
            f"{data_dir}: the images are {w}x{h} pixels; reconstruct needs at least "
            f"{MIN_IMAGE_SIZE}x{MIN_IMAGE_SIZE} (the SSIM window), give larger images"
        )


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reconstruct_dataset(
    data_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    config: ReconstructJobConfig | None = None,
    device: str | torch.device = "cpu",
    progress: bool = True,
) -> dict:
    """Reconstruct a ``transforms.json`` dataset: train on its training views, evaluate on the held-out
    ones, write ``OUT/splat.ply``, ``OUT/mesh.glb`` (when ``config.mesh``) and ``OUT/metrics.json``.

    Args:
        data_dir: the dataset folder (see :mod:`microdreamer.data`).
        out_dir: created if needed; files are written atomically.
        config: the job's settings (optimisation, export, evaluation background).
        device: where to train and render.
        progress: show a progress bar over the optimisation steps.

    Returns:
        The metrics written to ``metrics.json``: {"psnr", "ssim" (held-out means, None without held-out
        views), "train_psnr", "num_gaussians", "seconds": {stage: s}, "mesh", ...}.
    """
    from microdreamer.data import load_dataset
    from microdreamer.jobs.export import PRESET_SETTINGS, export_mesh
    from microdreamer.render.gaussians import resolve_backend

    config = config or ReconstructJobConfig()
    recon = config.reconstruct
    device = torch.device(device)
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise InputError(f"{out}: exists and is not a folder; give a folder for the outputs")
    out.mkdir(parents=True, exist_ok=True)
    seconds: dict[str, float] = {}

    t = time.perf_counter()
    ds = load_dataset(data_dir)
    train, test = ds.train(), ds.test()
    if len(train) == 0:
        raise InputError(f"{data_dir}: every frame is held out; nothing to train on")
    check_image_size(ds, data_dir)
    seconds["load"] = time.perf_counter() - t

    splat, stats = reconstruct(train.images, train.cameras, recon, device=device, progress=progress)
    seconds["train"] = stats["seconds"]

    t = time.perf_counter()
    write_ply(splat, out / "splat.ply")
    seconds["write_splat"] = time.perf_counter() - t

    t = time.perf_counter()
    backend = recon.train.backend
    background = config.eval_background
    held = evaluate_views(splat, test.images, test.cameras, background, backend) if len(test) else {}
    train_eval = evaluate_views(splat, train.images, train.cameras, background, backend)
    _sync(device)
    seconds["evaluate"] = time.perf_counter() - t

    mesh_info = None
    if config.mesh:
        t = time.perf_counter()
        result = export_mesh(splat, out / "mesh.glb", config.export, device, name="reconstruction",
                             settings=PRESET_SETTINGS)  # fmt: skip
        mesh_info = {**result.summary(), "threshold": config.export.mesh.threshold}
        seconds["mesh"] = time.perf_counter() - t

    metrics = {
        "psnr": _finite(held.get("psnr")),
        "ssim": held.get("ssim"),
        "psnr_per_view": [_finite(x) for x in held.get("psnr_per_view", [])],
        "ssim_per_view": held.get("ssim_per_view", []),
        "train_psnr": _finite(train_eval["psnr"]),
        "train_ssim": train_eval["ssim"],
        "num_gaussians": len(splat),
        "num_train_views": len(train),
        "num_held_out_views": len(test),
        "image_size": [ds.cameras.width, ds.cameras.height],
        "eval_background": list(background),
        "final_loss": stats["loss"],
        "densify_grad_threshold": stats["densify_grad_threshold"],
        "seconds": seconds,
        "device": str(device),
        "render_backend": resolve_backend(backend, device),
        "mesh": mesh_info,
        "normalization": ds.normalization.to_json() if ds.normalization is not None else None,
        "config": to_dict(config),
    }
    with atomic_path(out / "metrics.json") as tmp:
        tmp.write_text(json.dumps(metrics, indent=2))
    return metrics
