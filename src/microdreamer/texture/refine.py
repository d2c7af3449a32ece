"""Stage-2 texture refinement: fine-tune a baked texture against target images (MicroDreamer's stage 2).

The geometry stays fixed, so each view of a fixed pool is rasterised once: per covered pixel its UV is
known, and a step is a differentiable texture lookup
(:func:`microdreamer.render.mesh.sample_texture`), an MSE against the targets on the covered pixels,
and an Adam step on the texels (or on their logits, ``RefineConfig.parametrization``). Targets come
from a callable ``targets_fn(cameras) -> images``:

* the splat's own renders (:func:`splat_targets`; ``microdreamer mesh --refine``);
* a diffusion prior's refinement of the mesh's own renders (:func:`prior_targets`): MicroDreamer's
  stage 2, run by :func:`refine_with_prior` (``microdreamer generate``), which adds the input image at
  the input view as a fixed :class:`RefineAnchor` in every step.

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
from dataclasses import dataclass

import numpy as np
import torch

from microdreamer.cameras import Cameras
from microdreamer.config import RefineConfig, Stage2Config
from microdreamer.mesh import Mesh
from microdreamer.priors.base import OrbitViews, Prior, Reference

logger = logging.getLogger(__name__)

TargetsFn = Callable[[Cameras], torch.Tensor]

_LOGIT_EPS = 1e-6  # texel values are clamped into [eps, 1 - eps] before their logit is taken


@dataclass
class RefineAnchor:
    """A view in every step of :func:`refine_texture` with a fixed target (stage 2's input view).

    Attributes:
        cameras: one camera (H x W).
        target: [H, W, 3] colours, or [H, W, 4] whose last channel is the per-pixel loss weight.
        weight: the term's weight in the loss.
    """

    cameras: Cameras
    target: torch.Tensor
    weight: float = 1.0


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
    from microdreamer.cameras import centred_orbit_cameras

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
    anchor: RefineAnchor | None = None,
) -> tuple[Mesh, dict]:
    """Fine-tune ``mesh``'s texture against ``targets_fn`` on a pool of views.

    The loss of a step is the MSE of the batch's views (``config.normalize``: over their covered
    pixels, weighted, or over all their pixels) plus, with an ``anchor``, ``anchor.weight`` times the
    MSE of the anchor view (normalised the same way).

    Args:
        mesh: a textured mesh (``uv`` and ``texture``).
        targets_fn: cameras -> [C, H, W, 3] target colours, or [C, H, W, 4] with a loss weight.
        config: steps, learning rate, view pool, parametrization, normalisation.
        device: where to optimise.
        cameras: the view pool; None = :func:`refine_cameras` around the mesh.
        progress: show a tqdm bar with the loss.
        anchor: a view with a fixed target in every step (None: none).

    Returns:
        ``(mesh, stats)``: the mesh with the refined texture (same geometry and UVs; the gutters
        between charts dilated again), and stats with ``loss_first``, ``loss_last`` (mean of the first
        and last 10% of steps), ``steps`` and ``seconds``.
    """
    from microdreamer.cameras import framing
    from microdreamer.render.mesh import bilinear_taps, rasterize, sample_taps
    from microdreamer.texture.atlas import redilate, texel_samples

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

    def covered(cams: Cameras) -> tuple[torch.Tensor, torch.Tensor]:
        frags = rasterize(verts, faces, cams)
        flat = frags.face_id.reshape(-1)
        pix = (flat >= 0).nonzero(as_tuple=True)[0]
        bary = frags.bary.reshape(-1, 3)[pix]
        return pix, (bary[:, :, None] * uv[faces[flat[pix]]]).sum(1)

    # rasterise the pool once: per view the covered pixels and their UVs
    with torch.no_grad():
        views = [covered(cameras[c]) for c in range(C)]
        fixed = None
        if anchor is not None:
            a_pix, a_uv = covered(anchor.cameras.to(device))
            a_tgt = anchor.target.to(device).float()
            a_tgt = a_tgt.reshape(-1, a_tgt.shape[-1])[a_pix]
            a_w = a_tgt[:, 3] if a_tgt.shape[1] == 4 else torch.ones_like(a_tgt[:, 0])
            a_den = anchor.cameras.height * anchor.cameras.width * 3.0
            if config.normalize == "covered":
                a_den = float(a_w.sum()) * 3
            fixed = (a_uv, a_tgt[:, :3], a_w, a_den) if a_den > 0 else None
    cached: list[torch.Tensor | None] = [None] * C
    if config.cache_targets:
        for b in range(0, C, config.batch):
            cached[b : b + config.batch] = list(targets_fn(cameras[b : b + config.batch]).to(device).float())

    logit = config.parametrization == "logit"
    start_texture = torch.tensor(mesh.texture_float(), device=device)
    if logit:
        start_texture = torch.logit(start_texture.clamp(_LOGIT_EPS, 1.0 - _LOGIT_EPS))
    texture = start_texture.requires_grad_(True)
    image_pixels = cameras.height * cameras.width * 3.0
    ht, wt = start_texture.shape[:2]
    # the geometry is fixed: each covered pixel's four texels and weights are computed once, and a step
    # is one gather of every tap of its views (and the anchor's) and one weighted squared error
    taps = [bilinear_taps(puv, ht, wt) for _, puv in views]
    a_taps = bilinear_taps(fixed[0], ht, wt) if fixed is not None else None

    def view_terms(c: int, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """View c's covered pixels: target colours [P, 3] and loss weights [P]."""
        tgt = target.reshape(-1, target.shape[-1])[views[c][0]]
        return tgt[:, :3], (tgt[:, 3] if tgt.shape[1] == 4 else torch.ones_like(tgt[:, 0]))

    def step_terms(batch: list[int], targets: list[torch.Tensor]):
        """(index [P, 4], weight [P, 4], target [P, 3], coefficient [P]) of the step's loss
        sum(coefficient x squared error), or None when it has nothing to fit."""
        terms = [(taps[c], *view_terms(c, t)) for c, t in zip(batch, targets, strict=True)]
        terms = [t for t in terms if t[1].shape[0] > 0]
        count = 0.0
        if config.normalize == "image":
            count = image_pixels * len(batch)
        elif terms:  # (a host sync: only where it is needed)
            count = float(sum(float(w.sum()) for *_, w in terms)) * 3
        parts = [(ix, wx, tgt, w / count) for (ix, wx), tgt, w in terms] if count > 0 else []
        if fixed is not None:
            _, a_rgb, a_w, a_den = fixed
            parts.append((*a_taps, a_rgb, a_w * (anchor.weight / a_den)))
        if not parts:
            return None
        return tuple(torch.cat(column) for column in zip(*parts, strict=True))

    every_view = config.cache_targets and config.batch >= C
    constant = step_terms(list(range(C)), cached) if every_view else None

    opt = torch.optim.Adam([texture], lr=config.lr)
    gen = torch.Generator().manual_seed(config.seed + 1)
    losses: list[torch.Tensor] = []
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
        if every_view:
            terms = constant
        else:
            targets = [cached[c] for c in batch] if config.cache_targets else None
            if targets is None:
                targets = list(targets_fn(_select(cameras, batch)).to(device).float())
            terms = step_terms(batch, targets)
        if terms is None:
            continue
        index, weight, target, coef = terms
        opt.zero_grad(set_to_none=True)
        value = sample_taps(texture, index, weight)
        pred = torch.sigmoid(value) if logit else value
        loss = (coef * (pred - target).square().sum(dim=-1)).sum()
        loss.backward()
        opt.step()
        if not logit:
            with torch.no_grad():
                texture.clamp_(0.0, 1.0)
        losses.append(loss.detach())
        if bar is not None:
            bar.set_postfix(loss=f"{float(losses[-1]):.5f}")
            bar.update(1)
    if bar is not None:
        bar.close()
    losses = torch.stack(losses).tolist() if losses else []  # one host sync for the whole loop

    final = torch.sigmoid(texture.detach()) if logit else texture.detach()
    out = np.round(final.clamp(0, 1).cpu().numpy() * 255.0).astype(np.uint8)
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


# ------------------------------------------------------------------------------- stage 2 with a prior
def prior_targets(
    prior: Prior,
    mesh: Mesh,
    strength: float = 0.8,
    generator: torch.Generator | None = None,
    weight: float = 1.0,
    seconds: dict[str, float] | None = None,
    **settings,
) -> TargetsFn:
    """Targets from a diffusion prior: ``mesh`` rendered on white from the cameras (which must orbit the
    origin: the prior conditions on their angles, :meth:`OrbitViews.from_cameras`), refined by
    :meth:`Prior.strength_refine`: [C, H, W, 4], the last channel ``weight``.

    Args:
        prior: conditioned already (:meth:`Prior.set_reference`).
        mesh: the textured mesh whose renders are refined (the texture before any refinement step).
        strength, settings: passed to :meth:`Prior.strength_refine` (Zero123: ``steps``,
            ``guidance_scale``, ``eta``).
        generator: the prior's noise (on its device).
        weight: the targets' loss weight.
        seconds: if given, ``seconds["render"]`` and ``seconds["diffusion"]`` accumulate the time spent.
    """
    from microdreamer.render.mesh import render_mesh

    def fn(cameras: Cameras) -> torch.Tensor:
        t0 = time.perf_counter()
        with torch.no_grad():
            images = render_mesh(mesh, cameras, background=(1.0, 1.0, 1.0)).rgb.permute(0, 3, 1, 2)
        t1 = _synced(cameras.device)
        refined = prior.strength_refine(images.contiguous(), OrbitViews.from_cameras(cameras), strength,
                                        generator, **settings)  # fmt: skip
        rgb = refined.to(cameras.device).float().permute(0, 2, 3, 1)
        t2 = _synced(cameras.device)
        if seconds is not None:
            seconds["render"] = seconds.get("render", 0.0) + t1 - t0
            seconds["diffusion"] = seconds.get("diffusion", 0.0) + t2 - t1
        return torch.cat([rgb, torch.full_like(rgb[..., :1], float(weight))], dim=-1)

    return fn


def _synced(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def stage2_views(config: Stage2Config, reference: Reference, generator: torch.Generator) -> OrbitViews:
    """The ``config.views`` views of one stage-2 iteration: azimuths ``360 / C`` apart from a random start
    in [-180, -180 + 360 / C) (relative to the input view), at ``config.elevation_deg`` (None: the
    input's) and the input's radius; ``generator`` is a CPU generator."""
    C = config.views
    step = 360.0 / C
    start = -180.0 + step * float(torch.rand(1, generator=generator, dtype=torch.float64))
    azimuth = reference.azimuth_deg + start + step * torch.arange(C, dtype=torch.float64)
    el = reference.elevation_deg if config.elevation_deg is None else config.elevation_deg
    return OrbitViews(torch.full((C,), float(el)), azimuth.float(), torch.full((C,), float(reference.radius)))


def reference_anchor(
    mesh: Mesh, reference: Reference, fovy_deg: float, min_cos: float, weight: float, device: torch.device
) -> RefineAnchor:
    """The input view as a :class:`RefineAnchor`: target the input image (on white), loss weight 1 where
    the mesh covers the pixel with a normal whose cosine with the camera's axis exceeds ``min_cos``
    (MicroDreamer's ``valid_mask``), else 0."""
    from microdreamer.render.mesh import render_mesh

    H, W = reference.rgb.shape[-2:]
    cams = reference.views.cameras(fovy_deg, W, H).to(device)
    with torch.no_grad():
        out = render_mesh(mesh, cams, background=(1.0, 1.0, 1.0))
        back = -cams.viewmats[0, 2, :3]  # world direction from the object towards the camera's plane
        viewcos = (out.normals[0] * back).sum(-1, keepdim=True)
        valid = ((out.alpha[0] > 0) & (viewcos > min_cos)).float()
    target = torch.cat([reference.rgb.to(device).float().permute(1, 2, 0), valid], dim=-1)
    return RefineAnchor(cams, target, weight)


def refine_with_prior(
    mesh: Mesh,
    prior: Prior,
    reference: Reference,
    config: Stage2Config | None = None,
    device: str | torch.device = "cpu",
    seed: int = 0,
    fovy_deg: float = 49.1,
    progress: bool = False,
) -> tuple[Mesh, dict]:
    """MicroDreamer's stage 2 (``main2.py``): refine a textured mesh's texture against the prior.

    For each of ``config.iterations`` iterations: :func:`stage2_views`; the mesh rendered from them and
    refined once by the prior (:func:`prior_targets`, cached); then ``config.steps`` Adam steps on the
    texture's logits (:func:`refine_texture`, every view in every step, the MSE over whole images)
    with the input view as an anchor (:func:`reference_anchor`). The geometry and UVs do not change.

    Args:
        mesh: the stage-1 textured mesh, in the prior's world (the object at the origin, SIR's cameras).
        prior: conditioned on the input already (:meth:`Prior.set_reference`, as SIR leaves it).
        reference: the input view (its image composited on white, its camera).
        config: :class:`Stage2Config` (upstream's settings by default).
        device: where to render and optimise.
        seed: seeds the views and the prior's noise.
        fovy_deg: the cameras' vertical field of view (SIR's).
        progress: tqdm bars of the Adam steps.

    Returns:
        ``(mesh, stats)``: stats with per-iteration ``loss_first`` / ``loss_last`` and ``seconds``
        (``render``, ``diffusion``, ``optimise``).
    """
    config = config or Stage2Config()
    device = torch.device(device)
    if not mesh.has_texture:
        raise ValueError("refine_with_prior needs a textured mesh (uv and texture)")
    start = time.perf_counter()
    view_gen = torch.Generator().manual_seed(seed)
    noise_gen = torch.Generator(device=getattr(prior, "device", "cpu")).manual_seed(seed + 1)
    anchor = reference_anchor(mesh, reference, fovy_deg, config.ref_min_cos, config.lambda_ref, device)
    seconds: dict[str, float] = {}
    history = []
    for k in range(config.iterations):
        views = stage2_views(config, reference, view_gen)
        cams = views.cameras(fovy_deg, config.size, config.size).to(device)
        fn = prior_targets(prior, mesh, config.strength, noise_gen, config.lambda_views, seconds,
                           steps=config.ddim_steps, guidance_scale=config.guidance_scale, eta=config.eta)  # fmt: skip
        before = dict(seconds)
        mesh, st = refine_texture(mesh, fn, config.texture_refine(seed + k), device, cams, progress, anchor)
        spent = sum(seconds.values()) - sum(before.values())
        seconds["optimise"] = seconds.get("optimise", 0.0) + st.get("seconds", 0.0) - spent
        history.append({"azimuth_start": float(views.azimuth_deg[0]), "loss_first": st.get("loss_first"),
                        "loss_last": st.get("loss_last")})  # fmt: skip
    stats = {
        "iterations": config.iterations,
        "views": config.views,
        "size": config.size,
        "steps": config.steps,
        "history": history,
        "seconds": {**seconds, "total": time.perf_counter() - start},
    }
    logger.info("stage 2: %d iteration(s), %.2f s", config.iterations, stats["seconds"]["total"])
    return mesh, stats
