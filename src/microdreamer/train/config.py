"""Typed settings of Gaussian optimisation and of reconstruction from posed views.

:class:`TrainConfig` defaults are MicroDreamer's (``configs/image_sai.yaml`` and the arguments its
``main.py`` passes to DreamGaussian's ``GaussianModel``), including the effective values that its code
derives:

* the random initialisation's ``spatial_lr_scale`` of 10 multiplies the position learning rates
  (so they run from 0.01 down to 0.0002), and its exponential schedule is called without delay
  steps, so ``position_lr_delay_mult`` has no effect by default (``position_lr_delay_steps = 0``);
* densification uses ``extent = 4``: clone when the largest scale is <= ``percent_dense * 4`` =
  0.04, split otherwise; prune opacity < 0.005 and largest scale > ``0.1 * 4`` = 0.4. Its
  screen-size prune is a no-op there (the 2D radii are zeroed by the densification that runs just
  before it), so ours is off by default;
* SH features of degree > 0 learn at ``feature_lr / 20``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class TrainConfig:
    """Gaussian optimisation: initialisation, Adam, the position schedule, densification, the loss.

    Attributes:
        num_pts: Gaussians of the random initialisation, uniform in a ball.
        init_radius: radius of that ball (world units, centred at the origin).
        sh_degree: SH degree of the optimised splat (0..3).
        init_opacity: initial opacity of every Gaussian.
        position_lr_init, position_lr_final: the position learning rate's exponential schedule, before
            multiplication by ``spatial_lr_scale``.
        position_lr_delay_steps, position_lr_delay_mult: optional warm-up (3DGS's "delay"): the rate
            is scaled by ``delay_mult`` at step 0 rising to 1 at ``delay_steps`` along a sine.
        position_lr_max_steps: the step at which the schedule reaches its final rate.
        spatial_lr_scale: multiplies both position learning rates.
        feature_lr: learning rate of the degree-0 SH (colour); higher bands use ``feature_lr *
            sh_rest_lr_factor``.
        opacity_lr, scaling_lr, rotation_lr: learning rates of the opacity logits, log-scales and
            quaternions.
        adam_eps: Adam's epsilon.
        densify_start_iter, densify_end_iter: gradients are accumulated, and densification runs, at
            steps in [start, end] (steps count from 1).
        densify_interval: densify and prune at steps that are multiples of this.
        densify_grad_threshold: a Gaussian whose mean view-space gradient norm (in NDC units:
            pixel gradient times W/2, H/2, averaged over the views that drew it) reaches this is
            cloned or split.
        percent_dense: clone when the largest scale <= percent_dense * scene_extent, else split.
        scene_extent: the scene size that scales the two scale thresholds.
        prune_min_opacity: prune Gaussians less opaque than this.
        prune_max_scale: prune Gaussians whose largest scale exceeds this fraction of scene_extent.
        prune_max_screen_radius: if set, also prune Gaussians whose 2D radius (pixels) exceeded this
            since the previous densification.
        opacity_reset_interval: every this many steps (while densifying) clamp opacities to
            ``opacity_reset_value``; 0 disables.
        max_gaussians: if set, densification never grows the splat beyond this (highest gradients
            first).
        lambda_rgb: weight of the RGB L1 term (summed over pixels and channels, divided by C).
        lambda_alpha: weight of the alpha squared-error term (summed over pixels, divided by C),
            used when targets are RGBA. MicroDreamer's novel views carry no alpha term: 0.
        background: RGB background the renders and RGBA targets are composited over.
        random_background: draw a random background colour per view and step instead (makes
            alpha observable from colour alone).
        backend: render backend, "auto", "torch" or "gsplat".
        seed: seeds initialisation, splitting and random backgrounds.
    """

    num_pts: int = 5000
    init_radius: float = 0.5
    sh_degree: int = 0
    init_opacity: float = 0.1
    position_lr_init: float = 0.001
    position_lr_final: float = 0.00002
    position_lr_delay_steps: int = 0
    position_lr_delay_mult: float = 0.02
    position_lr_max_steps: int = 500
    spatial_lr_scale: float = 10.0
    feature_lr: float = 0.01
    sh_rest_lr_factor: float = 1.0 / 20.0
    opacity_lr: float = 0.05
    scaling_lr: float = 0.005
    rotation_lr: float = 0.0005
    adam_eps: float = 1e-15
    densify_start_iter: int = 0
    densify_end_iter: int = 300
    densify_interval: int = 100
    densify_grad_threshold: float = 0.01
    percent_dense: float = 0.01
    scene_extent: float = 4.0
    prune_min_opacity: float = 0.005
    prune_max_scale: float = 0.1
    prune_max_screen_radius: float | None = None
    opacity_reset_interval: int = 700
    opacity_reset_value: float = 0.01
    max_gaussians: int | None = None
    lambda_rgb: float = 1.0
    lambda_alpha: float = 0.0
    background: tuple[float, float, float] = (1.0, 1.0, 1.0)
    random_background: bool = False
    backend: str = "auto"
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.sh_degree <= 3:
            raise ValueError(f"sh_degree must be in 0..3, got {self.sh_degree}")
        if self.num_pts < 1:
            raise ValueError(f"num_pts must be >= 1, got {self.num_pts}")
        if self.densify_interval < 1:
            raise ValueError(f"densify_interval must be >= 1, got {self.densify_interval}")
        self.background = tuple(float(x) for x in self.background)
        if len(self.background) != 3:
            raise ValueError(f"background must be 3 values (RGB), got {self.background}")


def _default_texture():
    from microdreamer.texture import TextureConfig

    return TextureConfig()


def _reconstruction_train_config() -> TrainConfig:
    return TrainConfig(
        position_lr_max_steps=2000,
        densify_start_iter=100,
        densify_end_iter=1200,
        densify_interval=100,
        opacity_reset_interval=500,
        max_gaussians=500_000,
        lambda_alpha=1.0,
        random_background=True,
    )


@dataclass
class ReconstructConfig:
    """Reconstruction of a splat from posed RGBA views (``microdreamer reconstruct``).

    Attributes:
        train: the optimisation settings; the defaults differ from MicroDreamer's (which are tuned
            for 500 steps against a diffusion prior) in: a 2000-step position schedule, densification
            from step 100 to 1200 (threshold: see ``densify_grad_threshold_3dgs``) capped at 500k
            Gaussians, opacity resets at steps 500 and 1000 (they clear the initial ball's
            occluded interior, which would otherwise leave density ~1 inside the object), an alpha
            term and random backgrounds.
        iters: optimisation steps.
        batch_views: views rendered per step (MicroDreamer renders 6).
        eval_background: background of the held-out evaluation renders and targets (PSNR, SSIM).
        log_every: update the progress bar's loss every this many steps.
        densify_grad_threshold_3dgs: if set, replaces ``train.densify_grad_threshold`` by this
            threshold in 3DGS's convention (a per-view mean L1 loss; 3DGS uses 0.0002) converted to
            our per-view L1 sum: times ``H * W * 3 / batch_views``. MicroDreamer's 0.01 on 256^2
            views is ~3e-7 in that convention (it densifies nearly every Gaussian, three times).
        mesh_threshold: iso-level of the density field for the exported mesh: MicroDreamer's
            ``density_thresh`` (0.2). A reconstructed surface is a thin layer of partly transparent
            Gaussians whose summed density peaks near 1, so DreamGaussian's level 1 cuts inside it
            (Spot, H200: Chamfer-L1 0.99% of the diagonal at 1, 0.25% at 0.2).
        texture: the exported mesh's texture (:class:`microdreamer.texture.TextureConfig`; default: a
            1024^2 atlas baked from the splat's renders; ``mode="none"`` exports it untextured).
    """

    train: TrainConfig = field(default_factory=_reconstruction_train_config)
    iters: int = 2000
    batch_views: int = 6
    eval_background: tuple[float, float, float] = (1.0, 1.0, 1.0)
    log_every: int = 25
    densify_grad_threshold_3dgs: float | None = 0.0002
    mesh_threshold: float = 0.2
    texture: Any = field(default_factory=_default_texture)

    def __post_init__(self) -> None:
        if self.iters < 0:
            raise ValueError(f"iters must be >= 0, got {self.iters}")
        if self.batch_views < 1:
            raise ValueError(f"batch_views must be >= 1, got {self.batch_views}")
