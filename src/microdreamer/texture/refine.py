"""Stage-2 texture refinement: fine-tune a baked texture against target images (MicroDreamer's stage 2).

The geometry stays fixed, so each view of a fixed pool is rasterised once: per covered pixel its UV is
known, and a step is a differentiable texture lookup
(:func:`microdreamer.render.mesh.sample_texture`), an MSE against the targets on the covered pixels,
and an Adam step on the texels. Targets come from a callable ``targets_fn(cameras) -> images``:

* now: the splat's own renders (:func:`splat_targets`);
* later: SIR targets from a diffusion prior (issue 6) plug in with the same signature.

``targets_fn`` returns [C, H, W, 3] colours, or [C, H, W, 4] whose last channel is a per-pixel loss
weight (e.g. the splat's alpha, so pixels the splat barely covers count little). With
``cache_targets`` the targets of each pool view are computed once; otherwise ``targets_fn`` is called
for every batch (what an iterative prior needs).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

import numpy as np
import torch

from microdreamer.cameras import Cameras
from microdreamer.config import RefineConfig
from microdreamer.mesh import Mesh

logger = logging.getLogger(__name__)

TargetsFn = Callable[[Cameras], torch.Tensor]


def splat_targets(splat, backend: str = "auto") -> TargetsFn:
    """Targets from the splat's own renders: its colour without background (premultiplied colour over
    black divided by alpha) and its alpha as the loss weight: [C, H, W, 4]."""
    from microdreamer.render.gaussians import render

    def fn(cameras: Cameras) -> torch.Tensor:
        with torch.no_grad():
            out = render(splat, cameras.to(splat.device), background=(0.0, 0.0, 0.0), backend=backend)
        alpha = out.alpha.float()
        rgb = out.rgb.float() / alpha.clamp_min(1e-4)
        return torch.cat([rgb.clamp(0.0, 1.0), alpha], dim=-1)

    return fn


def refine_cameras(config: RefineConfig, center: torch.Tensor, bound_radius: float) -> Cameras:
    """The pool of ``config.views`` random orbit views (seeded), framing the bounding sphere."""
    from microdreamer.texture.bake import centred_orbit_cameras

    gen = torch.Generator().manual_seed(config.seed)
    lo, hi = config.elevation_range
    el = lo + (hi - lo) * torch.rand(config.views, generator=gen)
    az = 360.0 * torch.rand(config.views, generator=gen)
    return centred_orbit_cameras(el, az, center, bound_radius, config.fovy_deg, config.size, config.margin)


def refine_texture(
    mesh: Mesh,
    targets_fn: TargetsFn,
    config: RefineConfig,
    device: str | torch.device = "cpu",
    cameras: Cameras | None = None,
    progress: bool = False,
) -> tuple[Mesh, dict]:
    """Fine-tune ``mesh``'s texture against ``targets_fn`` on a pool of views.

    Args:
        mesh: a textured mesh (``uv`` and ``texture``).
        targets_fn: cameras -> [C, H, W, 3] target colours, or [C, H, W, 4] with a loss weight.
        config: steps, learning rate, view pool.
        device: where to optimise.
        cameras: the view pool; None = :func:`refine_cameras` around the mesh.
        progress: show a tqdm bar with the loss.

    Returns:
        ``(mesh, stats)``: the mesh with the refined texture (same geometry and UVs; the gutters
        between charts dilated again), and stats with ``loss_first``, ``loss_last`` (mean of the first
        and last 10% of steps), ``steps`` and ``seconds``.
    """
    from microdreamer.render.mesh import rasterize, sample_texture
    from microdreamer.texture.atlas import redilate, texel_samples
    from microdreamer.texture.bake import framing

    if not mesh.has_texture:
        raise ValueError("refine_texture needs a textured mesh (uv and texture)")
    start = time.perf_counter()
    device = torch.device(device)
    verts = torch.as_tensor(mesh.vertices, device=device)
    faces = torch.as_tensor(mesh.faces, device=device)
    uv = torch.as_tensor(mesh.uv, device=device)
    if config.steps == 0:
        return mesh, {"steps": 0, "seconds": 0.0}
    if cameras is None:
        center, radius = framing(verts)
        cameras = refine_cameras(config, center, radius)
    cameras = cameras.to(device)
    C = len(cameras)

    # rasterise the pool once: per view the covered pixels and their UVs
    views = []
    with torch.no_grad():
        for c in range(C):
            frags = rasterize(verts, faces, cameras[c])
            flat = frags.face_id.reshape(-1)
            pix = (flat >= 0).nonzero(as_tuple=True)[0]
            bary = frags.bary.reshape(-1, 3)[pix]
            puv = (bary[:, :, None] * uv[faces[flat[pix]]]).sum(1)
            views.append((pix, puv))
    cached: list[torch.Tensor | None] = [None] * C
    if config.cache_targets:
        for b in range(0, C, config.batch):
            cached[b : b + config.batch] = list(targets_fn(cameras[b : b + config.batch]).to(device).float())

    texture = torch.tensor(mesh.texture_float(), device=device, requires_grad=True)
    opt = torch.optim.Adam([texture], lr=config.lr)
    gen = torch.Generator().manual_seed(config.seed + 1)
    losses = []
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=config.steps, desc="refine", unit="step", leave=False)
    order = torch.randperm(C, generator=gen)
    cursor = 0
    for _ in range(config.steps):
        if cursor + config.batch > C:
            order, cursor = torch.randperm(C, generator=gen), 0
        batch = order[cursor : cursor + config.batch].tolist()
        cursor += config.batch
        targets = [cached[c] for c in batch] if config.cache_targets else None
        if targets is None:
            fresh = targets_fn(_select(cameras, batch)).to(device).float()
            targets = list(fresh)
        total, count = 0.0, 0.0
        opt.zero_grad(set_to_none=True)
        loss_terms = []
        for c, target in zip(batch, targets, strict=True):
            pix, puv = views[c]
            if pix.numel() == 0:
                continue
            tgt = target.reshape(-1, target.shape[-1])[pix]
            weight = tgt[:, 3] if tgt.shape[1] == 4 else torch.ones_like(tgt[:, 0])
            pred = sample_texture(texture, puv)
            loss_terms.append((weight[:, None] * (pred - tgt[:, :3]) ** 2).sum())
            count += float(weight.sum()) * 3
        if not loss_terms or count == 0:
            continue
        loss = torch.stack(loss_terms).sum() / count
        loss.backward()
        opt.step()
        with torch.no_grad():
            texture.clamp_(0.0, 1.0)
        total = float(loss.detach())
        losses.append(total)
        if bar is not None:
            bar.set_postfix(loss=f"{total:.5f}")
            bar.update(1)
    if bar is not None:
        bar.close()

    out = np.round(texture.detach().clamp(0, 1).cpu().numpy() * 255.0).astype(np.uint8)
    ht, wt = out.shape[:2]
    samples = texel_samples(verts, faces, uv, ht, wt)
    out = redilate(out, samples)
    k = max(1, math.ceil(0.1 * len(losses)))
    stats = {
        "steps": config.steps,
        "loss_first": float(np.mean(losses[:k])) if losses else float("nan"),
        "loss_last": float(np.mean(losses[-k:])) if losses else float("nan"),
        "seconds": time.perf_counter() - start,
    }
    logger.info("refine: %d steps, loss %.5f -> %.5f", config.steps, stats["loss_first"], stats["loss_last"])
    return Mesh(mesh.vertices, mesh.faces, mesh.vertex_colors, mesh.uv, out), stats


def _select(cameras: Cameras, index: list[int]) -> Cameras:
    idx = torch.as_tensor(index, dtype=torch.long)
    return Cameras(
        cameras.viewmats[idx.to(cameras.device)], cameras.Ks[idx.to(cameras.device)],
        cameras.width, cameras.height, cameras.near, cameras.far,
    )  # fmt: skip
