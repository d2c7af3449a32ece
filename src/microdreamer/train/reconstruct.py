"""Reconstruction from posed views: the optimisation loop (:func:`reconstruct`) and its evaluation
(:func:`evaluate_views`). The ``reconstruct`` command's job, which reads datasets and exports meshes, is
:mod:`microdreamer.jobs.reconstruct`.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace

import torch

from microdreamer.cameras import Cameras
from microdreamer.config import ReconstructConfig
from microdreamer.render import render
from microdreamer.splat import Splat
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
