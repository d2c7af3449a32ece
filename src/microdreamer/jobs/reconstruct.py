"""Reconstruction from posed views: the optimisation loop, and the ``reconstruct`` command's stage.

``reconstruct_dataset(DIR, OUT)`` reads a ``transforms.json`` dataset, trains a splat on its
training views, and writes ``OUT/splat.ply``, ``OUT/mesh.glb`` (density field and mesh stages) and
``OUT/metrics.json`` (PSNR and SSIM on the held-out views, the Gaussian count, seconds per stage).
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch

from microdreamer.cameras import Cameras
from microdreamer.errors import InputError
from microdreamer.io_utils import atomic_path
from microdreamer.render import render
from microdreamer.splat import Splat, write_ply
from microdreamer.train.config import ReconstructConfig
from microdreamer.train.initialize import random_ball_splat
from microdreamer.train.trainer import GaussianTrainer

logger = logging.getLogger(__name__)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reconstruct(
    images: torch.Tensor,
    cameras: Cameras,
    config: ReconstructConfig | None = None,
    device: str | torch.device | None = None,
    init: Splat | None = None,
    progress: bool = True,
) -> tuple[Splat, dict]:
    """Optimise a splat to reproduce posed RGBA views.

    Each step renders ``config.batch_views`` views drawn without replacement from a shuffled cycle
    over all views, and takes one :meth:`GaussianTrainer.step`. The densification threshold is
    converted from ``config.densify_grad_threshold_3dgs`` when that is set.

    Args:
        images: [C, H, W, 4] float straight RGBA in [0, 1] (or [C, H, W, 3] RGB).
        cameras: C cameras of H x W.
        config: :class:`ReconstructConfig`.
        device: where to optimise; default the images' device.
        init: the initial splat; default MicroDreamer's random ball (``config.train``).
        progress: show a tqdm progress bar with the loss.

    Returns:
        (the trained splat, detached, on ``device``; stats: {"iters", "seconds", "loss",
        "num_gaussians", "history": [(step, loss, num_gaussians), ...]}).
    """
    from tqdm.auto import tqdm

    config = config or ReconstructConfig()
    device = torch.device(device) if device is not None else images.device
    C = images.shape[0]
    if images.dim() != 4 or images.shape[-1] not in (3, 4):
        raise ValueError(f"images must be [C, H, W, 3|4], got {tuple(images.shape)}")
    if len(cameras) != C or images.shape[1:3] != (cameras.height, cameras.width):
        raise ValueError(
            f"images {tuple(images.shape)} do not match {len(cameras)} cameras of {cameras.height} x {cameras.width}"
        )
    cfg = config.train
    batch = min(config.batch_views, C)
    if config.densify_grad_threshold_3dgs is not None:
        scale = images.shape[1] * images.shape[2] * 3 / batch
        cfg = replace(cfg, densify_grad_threshold=config.densify_grad_threshold_3dgs * scale)
    images = images.to(device, torch.float32)
    cameras = cameras.to(device)
    if init is None:
        init = random_ball_splat(
            cfg.num_pts, cfg.init_radius, cfg.sh_degree, cfg.init_opacity, cfg.seed, device
        )
    trainer = GaussianTrainer(init.to(device), cfg)
    g = torch.Generator().manual_seed(cfg.seed + 1)
    order: list[int] = []
    history = []
    loss_value = float("nan")
    _sync(device)
    t0 = time.perf_counter()
    bar = tqdm(range(config.iters), desc="reconstruct", disable=not progress, dynamic_ncols=True)
    for it in bar:
        if len(order) < batch:
            order += torch.randperm(C, generator=g).tolist()
        idx, order = order[:batch], order[batch:]
        index = torch.tensor(idx, device=device)
        losses = trainer.step(images[index], cameras[index])
        if (it + 1) % config.log_every == 0 or it + 1 == config.iters:
            loss_value = float(losses["loss"])
            history.append((it + 1, loss_value, len(trainer)))
            bar.set_postfix(loss=f"{loss_value:.4g}", gaussians=len(trainer))
    bar.close()
    _sync(device)
    seconds = time.perf_counter() - t0
    stats = {
        "iters": config.iters,
        "densify_grad_threshold": cfg.densify_grad_threshold,
        "seconds": seconds,
        "loss": loss_value,
        "num_gaussians": len(trainer),
        "history": history,
    }
    return trainer.splat.detach(), stats


@torch.no_grad()
def evaluate_views(
    splat: Splat,
    images: torch.Tensor,
    cameras: Cameras,
    background=(1.0, 1.0, 1.0),
    backend: str = "auto",
    batch: int = 8,
) -> dict:
    """PSNR and SSIM of renders against RGBA targets, both composited over ``background``.

    Returns:
        {"psnr": mean over views, "ssim": mean, "psnr_per_view": [...], "ssim_per_view": [...]}.
    """
    from microdreamer.metrics import psnr, ssim

    device = splat.device
    bg = torch.tensor(background, dtype=torch.float32, device=device)
    psnrs, ssims = [], []
    for start in range(0, images.shape[0], batch):
        cams = cameras[start : start + batch].to(device)
        tgt = images[start : start + batch].to(device, torch.float32)
        if tgt.shape[-1] == 4:
            tgt = tgt[..., :3] * tgt[..., 3:] + bg * (1 - tgt[..., 3:])
        out = render(splat, cams, background=bg, backend=backend)
        rgb = out.rgb.clamp(0, 1)
        for i in range(rgb.shape[0]):
            psnrs.append(float(psnr(rgb[i], tgt[i])))
            ssims.append(float(ssim(rgb[i], tgt[i])))
    return {
        "psnr": sum(psnrs) / len(psnrs) if psnrs else None,
        "ssim": sum(ssims) / len(ssims) if ssims else None,
        "psnr_per_view": psnrs,
        "ssim_per_view": ssims,
    }


def _finite(x):
    return x if x is None or math.isfinite(x) else (1e9 if x > 0 else -1e9)


def reconstruct_dataset(
    data_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    config: ReconstructConfig | None = None,
    device: str | torch.device = "cpu",
    mesh: bool = True,
    field_config=None,
    mesh_config=None,
    progress: bool = True,
) -> dict:
    """Reconstruct a ``transforms.json`` dataset: train on its training views, evaluate on the
    held-out ones, write ``OUT/splat.ply``, ``OUT/mesh.glb`` (when ``mesh``) and ``OUT/metrics.json``.

    Args:
        data_dir: the dataset folder (see :mod:`microdreamer.data`).
        out_dir: created if needed; files are written atomically.
        config: :class:`ReconstructConfig`.
        device: where to train and render.
        mesh: also extract and write the mesh.
        field_config, mesh_config: :class:`microdreamer.field.FieldConfig` and
            :class:`microdreamer.mesh.MeshConfig` for the mesh (when None: the field's defaults, and
            the mesh stage's with ``config.mesh_threshold`` as the iso-level).

    Returns:
        The metrics written to ``metrics.json``: {"psnr", "ssim" (held-out means, None without
        held-out views), "train_psnr", "num_gaussians", "seconds": {stage: s}, ...}.
    """
    from microdreamer.data import load_dataset

    config = config or ReconstructConfig()
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
    seconds["load"] = time.perf_counter() - t

    splat, stats = reconstruct(train.images, train.cameras, config, device=device, progress=progress)
    seconds["train"] = stats["seconds"]

    t = time.perf_counter()
    write_ply(splat, out / "splat.ply")
    seconds["write_splat"] = time.perf_counter() - t

    t = time.perf_counter()
    backend = config.train.backend
    held = (
        evaluate_views(splat, test.images, test.cameras, config.eval_background, backend) if len(test) else {}
    )
    train_eval = evaluate_views(splat, train.images, train.cameras, config.eval_background, backend)
    _sync(device)
    seconds["evaluate"] = time.perf_counter() - t

    mesh_info = None
    if mesh:
        t = time.perf_counter()
        if mesh_config is None:
            from microdreamer.mesh import MeshConfig

            mesh_config = MeshConfig(threshold=config.mesh_threshold)
        mesh_info = _export_mesh(splat, out / "mesh.glb", device, field_config, mesh_config, config.texture)
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
        "eval_background": list(config.eval_background),
        "final_loss": stats["loss"],
        "densify_grad_threshold": stats["densify_grad_threshold"],
        "seconds": seconds,
        "device": str(device),
        "render_backend": _backend_name(backend, device),
        "mesh": mesh_info,
        "normalization": ds.normalization.to_json() if ds.normalization is not None else None,
        "config": asdict(config),
    }
    with atomic_path(out / "metrics.json") as tmp:
        tmp.write_text(json.dumps(metrics, indent=2))
    return metrics


def _backend_name(backend: str, device: torch.device) -> str:
    from microdreamer.render.gaussians import resolve_backend

    return resolve_backend(backend, device)


def _export_mesh(
    splat: Splat, path: Path, device: torch.device, field_config, mesh_config, texture_config=None
) -> dict:
    """Density field -> marching cubes -> texture (unless ``texture_config.mode == "none"``) ->
    ``path`` through the project's splat-to-mesh pipeline and texture stage."""
    from microdreamer.field import FieldConfig
    from microdreamer.mesh import MeshConfig, save_mesh
    from microdreamer.pipeline import splat_to_mesh

    result = splat_to_mesh(
        splat.to(device),
        field_config or FieldConfig(),
        mesh_config or MeshConfig(),
        device,
        name="reconstruction",
    )
    mesh = result.mesh
    texture = None
    if texture_config is not None and texture_config.mode != "none":
        from microdreamer.texture import texture_mesh

        mesh = texture_mesh(mesh, splat.to(device), texture_config, device=device).mesh
        texture = {"mode": texture_config.mode, "size": texture_config.size}
    save_mesh(mesh, path)
    return {
        "texture": texture,
        "path": path.name,
        "threshold": mesh_config.threshold if mesh_config is not None else None,
        "vertices": int(len(mesh.vertices)),
        "faces": int(len(mesh.faces)),
        "field_resolution": result.resolution,
        "field_backend": result.backend,
    }
