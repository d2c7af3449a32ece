"""Score-based iterative reconstruction (MicroDreamer's SIR) with its image-to-3D defaults.

Each of K outer iterations:

1. draws C novel views (azimuths evenly spaced from a random start, elevations uniform in a range
   around the input's, radius 2) and renders the current splat there on white;
2. asks the prior to refine the renders into targets (:meth:`Prior.refine`) with t2 / T = 1 (pure
   noise) at the first iteration, then annealed from ``t_start`` to ``t_end`` by MicroDreamer's rule on
   the prior's DDIM grid (:func:`t_stop_schedule`; ``iterations`` = upstream's ``total_steps``);
3. takes ``recon_steps`` plain Gaussian-splatting steps (:class:`~microdreamer.train.GaussianTrainer`,
   Adam, densify and prune as configured) on the loss

       L = lambda_views * sum_c L1_sum(render_c, target_c) / C
         + lambda_ref_rgb * L1_sum(render_ref, input) + lambda_ref_mask * MSE_sum(alpha_ref, mask)

   with the reference view rendered in the same batch as the novel views.

Then a last prune drops Gaussians below ``final_min_opacity`` and large "over-white" Gaussians that
visibly add opacity (floaters that the white background hides in colour but that would become
geometry).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch

from microdreamer.cameras import Cameras
from microdreamer.config import DDIMConfig, SIRConfig
from microdreamer.priors.base import OrbitViews, Prior, Reference, even_orbit_views
from microdreamer.priors.ddim import annealed_t2
from microdreamer.profiling import StageTimer
from microdreamer.splat import SH_C0, Splat
from microdreamer.train import GaussianTrainer, random_ball_splat

logger = logging.getLogger(__name__)

WHITE = (1.0, 1.0, 1.0)


def t_stop_schedule(iteration: int, config: SIRConfig, grid: DDIMConfig | None = None) -> float:
    """t2 / T of outer iteration ``iteration`` (0-based): 1 at the first (pure noise), then MicroDreamer's
    annealed t2 from ``t_start`` to ``t_end`` on the prior's DDIM ``grid``
    (:func:`~microdreamer.priors.ddim.annealed_t2`; None: the default 20-step grid)."""
    if iteration == 0:
        return 1.0
    grid = grid or DDIMConfig()
    t2 = annealed_t2(iteration - 1, config.iterations - 1, config.t_start, config.t_end, grid)
    return t2 / grid.num_train_timesteps


@dataclass
class SIRResult:
    """What :func:`run_sir` returns.

    Attributes:
        splat: the final splat (detached, on the run's device).
        seconds: wall-clock seconds per stage ("render", "diffusion", "reconstruction", "prune").
        history: per outer iteration: {"t_stop", "loss"} (loss of its last step).
        prior_stats: the prior's counters (e.g. UNet calls).
        pruned: {"low_opacity", "white"} Gaussians removed by the last prune.
    """

    splat: Splat
    seconds: dict
    history: list
    prior_stats: dict
    pruned: dict


def _project(means: torch.Tensor, cams: Cameras) -> tuple[torch.Tensor, torch.Tensor]:
    """Pixel coordinates [C, N, 2] of points [N, 3] and a [C, N] mask of those in front and in frame."""
    R, t = cams.viewmats[:, :3, :3], cams.viewmats[:, :3, 3]
    p = torch.einsum("cij,nj->cni", R, means) + t[:, None, :]
    z = p[..., 2]
    zs = z.clamp_min(1e-6)
    u = cams.Ks[:, None, 0, 0] * p[..., 0] / zs + cams.Ks[:, None, 0, 2]
    v = cams.Ks[:, None, 1, 1] * p[..., 1] / zs + cams.Ks[:, None, 1, 2]
    ok = (z > cams.near) & (u >= 0) & (u < cams.width) & (v >= 0) & (v < cams.height)
    return torch.stack([u, v], -1), ok


def prune_white_floaters(splat: Splat, config: SIRConfig, backend: str = "auto") -> tuple[Splat, int]:
    """Drop large over-white Gaussians whose removal visibly lowers the alpha where they project.

    Candidates: every channel of ``0.5 + C0 * sh_dc`` > ``white_color`` and largest scale >
    ``white_min_scale``. Six check views (elevation 0 at azimuths 0, 180, 90, -90; elevation 20 at
    180 and 90) are rendered with and without all candidates; a candidate goes when the alpha at its
    projected centre drops by more than ``white_alpha_drop`` in at least one view where it is in frame.

    Returns:
        (the kept splat, how many were removed).
    """
    from microdreamer.render import render

    with torch.no_grad():
        raw = 0.5 + SH_C0 * splat.sh_dc
        cand = (raw > config.white_color).all(-1) & (splat.scales().amax(-1) > config.white_min_scale)
        if not bool(cand.any()):
            return splat, 0
        views = OrbitViews(
            [0.0, 0.0, 0.0, 20.0, 20.0, 0.0], [0.0, 180.0, 90.0, 180.0, 90.0, -90.0], config.radius
        )
        S = config.white_check_size
        cams = views.cameras(config.fovy_deg, S, S).to(splat.device)
        before = render(splat, cams, background=WHITE, backend=backend).alpha[..., 0]  # [6, S, S]
        after = render(splat.subset(~cand), cams, background=WHITE, backend=backend).alpha[..., 0]
        drop = (before - after) > config.white_alpha_drop
        idx = cand.nonzero().squeeze(1)
        uv, ok = _project(splat.means[idx], cams)  # [6, M, 2], [6, M]
        px = uv[..., 0].long().clamp(0, S - 1)
        py = uv[..., 1].long().clamp(0, S - 1)
        hit = drop[torch.arange(len(cams), device=drop.device)[:, None], py, px] & ok
        remove = torch.zeros_like(cand)
        remove[idx[hit.any(0)]] = True
        n = int(remove.sum())
        return (splat.subset(~remove) if n else splat), n


def run_sir(
    prior: Prior,
    reference: Reference | None,
    config: SIRConfig | None = None,
    device: str | torch.device = "cpu",
    progress: Callable[[float], None] | None = None,
    timer: StageTimer | None = None,
    initial: Splat | None = None,
) -> SIRResult:
    """Generate a splat from one view with score-based iterative reconstruction.

    Args:
        prior: the multi-view prior (its :meth:`~Prior.set_reference` is called here).
        reference: the input view ([3, S, S] on white and its mask, S = ``config.image_size``; other
            sizes are resized) and its camera; None for text-to-3D: no input view (views drawn around
            elevation 0, no reference row in the loss). With ``lambda_ref_rgb = lambda_ref_mask = 0`` the
            reference conditions the prior only and is not rendered (ImageDream).
        config: :class:`SIRConfig`.
        device: where to optimise (the prior runs where it was built).
        progress: called with the fraction done after every outer iteration.
        timer: a :class:`StageTimer` to add the stages to (a new one by default).
        initial: the starting splat; default: MicroDreamer's random ball (``config.train``).

    Returns:
        :class:`SIRResult`.
    """
    config = config or SIRConfig()
    device = torch.device(device)
    timer = timer or StageTimer()
    S = config.image_size
    ref = _resized_reference(reference, S) if reference is not None else None
    noise_gen = torch.Generator(device=getattr(prior, "device", device)).manual_seed(config.seed + 1)
    if ref is not None:
        with timer.stage("embed"):
            prior.set_reference(ref, noise_gen)
    ref_in_loss = ref is not None and (config.lambda_ref_rgb > 0 or config.lambda_ref_mask > 0)
    tc = config.train
    if initial is None:
        initial = random_ball_splat(
            tc.num_pts, tc.init_radius, tc.sh_degree, tc.init_opacity, config.seed, device
        )
    trainer = GaussianTrainer(initial.to(device), tc)
    view_gen = torch.Generator().manual_seed(config.seed)
    grid = prior.ddim_grid()

    C = config.views
    white = torch.tensor(WHITE, device=device)  # a device tensor: no host-to-device copy per step
    rgb_w = [config.lambda_views / C] * C
    alpha_w = [0.0] * C
    if ref_in_loss:
        ref_target = ref.straight_rgba().to(device)[None]  # [1, S, S, 4]
        rgb_w, alpha_w = rgb_w + [config.lambda_ref_rgb], alpha_w + [config.lambda_ref_mask]
    rgb_w, alpha_w = torch.tensor(rgb_w, device=device), torch.tensor(alpha_w, device=device)
    ref_elevation = ref.elevation_deg if ref is not None else 0.0
    ref_azimuth = ref.azimuth_deg if ref is not None else 0.0
    history = []
    for k in range(config.iterations):
        t_stop = t_stop_schedule(k, config, grid)
        views = even_orbit_views(C, ref_elevation, config.elevation_range, config.radius, view_gen)
        views = OrbitViews(views.elevation_deg, views.azimuth_deg + ref_azimuth, views.radius)
        cams = OrbitViews.cat([views, ref.views] if ref_in_loss else [views]).cameras(config.fovy_deg, S, S)
        cams = cams.to(device)
        images = None
        if k > 0:
            with timer.stage("render"), torch.no_grad():
                from microdreamer.render import render

                out = render(trainer.splat.detach(), cams[:C], background=white, backend=trainer.backend)
                images = out.rgb.permute(0, 3, 1, 2).contiguous()
        with timer.stage("diffusion"):
            targets = prior.refine(images, views, t_stop, noise_gen).to(device).float()  # [C, 3, S, S]
        if tuple(targets.shape) != (C, 3, S, S):
            raise RuntimeError(f"the prior returned targets {tuple(targets.shape)}, expected {(C, 3, S, S)}")
        tgt = torch.cat([targets.permute(0, 2, 3, 1), torch.ones(C, S, S, 1, device=device)], -1)
        if ref_in_loss:
            tgt = torch.cat([tgt, ref_target])  # [C + 1, S, S, 4]
        steps = config.init_steps if k == 0 else config.recon_steps
        losses = None
        with timer.stage("reconstruction"):
            for _ in range(steps):
                losses = trainer.step(tgt, cams, background=white, rgb_weights=rgb_w, alpha_weights=alpha_w)
        history.append({"t_stop": t_stop, "loss": None if losses is None else losses["loss"]})
        if progress is not None:
            progress((k + 1) / config.iterations)

    with timer.stage("prune"):
        splat = trainer.splat.detach()
        keep = splat.opacities() >= config.final_min_opacity
        n_low = int((~keep).sum())
        splat = splat.subset(keep)
        n_white = 0
        if config.white_prune and len(splat):
            splat, n_white = prune_white_floaters(splat, config, trainer.backend)
    for h in history:
        h["loss"] = None if h["loss"] is None else float(h["loss"])
    logger.info("SIR: %d Gaussians (pruned %d transparent, %d white floaters)", len(splat), n_low, n_white)
    return SIRResult(
        splat=splat,
        seconds=dict(timer.seconds),
        history=history,
        prior_stats=prior.stats(),
        pruned={"low_opacity": n_low, "white": n_white},
    )


def _resized_reference(reference: Reference, size: int) -> Reference:
    if reference.rgb.shape[-2:] == (size, size):
        return reference

    def rs(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.interpolate(
            x[None].float(), (size, size), mode="bilinear", antialias=True
        )[0]

    return Reference(rs(reference.rgb).clamp(0, 1), rs(reference.mask).clamp(0, 1), reference.elevation_deg,
                     reference.azimuth_deg, reference.radius)  # fmt: skip


def splat_view_renderer(
    splat, fovy_deg: float = 49.1, size: int = 256, backend: str = "auto"
) -> Callable[[OrbitViews], torch.Tensor]:
    """``render_views`` for :class:`GroundTruthPrior` from a known splat: [C, 3, size, size] on white."""
    from microdreamer.render import render

    def render_views(views: OrbitViews) -> torch.Tensor:
        with torch.no_grad():
            out = render(
                splat, views.cameras(fovy_deg, size, size), background=(1.0, 1.0, 1.0), backend=backend
            )
        return out.rgb.permute(0, 3, 1, 2).contiguous()

    return render_views
