"""The Gaussian trainer: Adam with per-parameter learning rates, the position schedule, densification.

:meth:`GaussianTrainer.step` is one optimisation step against target images from given cameras; the
reconstruction loop and MicroDreamer's score-based iterative reconstruction both drive it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch

from microdreamer.cameras import Cameras
from microdreamer.render import RenderOutput, render
from microdreamer.render.gaussians import resolve_backend
from microdreamer.splat import Splat
from microdreamer.train.config import TrainConfig
from microdreamer.train.densify import PARAM_NAMES, DensifyStats, densify_and_prune, reset_opacity
from microdreamer.train.schedule import exponential_lr

logger = logging.getLogger(__name__)


class GaussianTrainer:
    """Optimises a splat's parameters against target views.

    Args:
        splat: the initial splat (its tensors are copied); it sets the device.
        config: :class:`TrainConfig`.

    Attributes:
        iteration: steps taken so far (the next step is ``iteration + 1``).
        params: the current parameters by :class:`Splat` field name.
        optimizer: ``torch.optim.Adam``, one group per parameter, named like it.
        stats: the densification statistics since the last densification.
    """

    def __init__(self, splat: Splat, config: TrainConfig | None = None) -> None:
        self.config = config or TrainConfig()
        cfg = self.config
        self.device = splat.device
        self.backend = resolve_backend(cfg.backend, self.device)
        self.iteration = 0
        self.params = {k: v.detach().clone().float().contiguous() for k, v in splat.tensors().items()}
        lrs = {
            "means": self.position_lr(0),
            "sh_dc": cfg.feature_lr,
            "sh_rest": cfg.feature_lr * cfg.sh_rest_lr_factor,
            "opacity_logits": cfg.opacity_lr,
            "log_scales": cfg.scaling_lr,
            "quats": cfg.rotation_lr,
        }
        groups = []
        for name in PARAM_NAMES:
            if self.params[name].numel() == 0 and name == "sh_rest":
                continue  # degree 0: nothing to optimise
            self.params[name].requires_grad_(True)
            groups.append({"params": [self.params[name]], "lr": lrs[name], "name": name})
        fused = self.device.type == "cuda"
        self.optimizer = torch.optim.Adam(groups, lr=0.0, eps=cfg.adam_eps, fused=fused)
        self.stats = DensifyStats.zeros(len(splat), self.device)
        self.generator = torch.Generator(device=self.device).manual_seed(cfg.seed)
        self.last_render: RenderOutput | None = None

    # ------------------------------------------------------------------ state
    @property
    def splat(self) -> Splat:
        """The current splat (its tensors are the live parameters; detach before keeping it)."""
        return Splat(**self.params)

    def __len__(self) -> int:
        return self.params["means"].shape[0]

    def position_lr(self, step: int) -> float:
        """The position learning rate at ``step``."""
        cfg = self.config
        return exponential_lr(
            step,
            cfg.position_lr_init * cfg.spatial_lr_scale,
            cfg.position_lr_final * cfg.spatial_lr_scale,
            cfg.position_lr_max_steps,
            cfg.position_lr_delay_steps,
            cfg.position_lr_delay_mult,
        )

    def densifying(self, step: int | None = None) -> bool:
        """Whether gradient statistics are gathered at ``step`` (default: the next step)."""
        step = self.iteration + 1 if step is None else step
        return self.config.densify_start_iter <= step <= self.config.densify_end_iter

    def _backgrounds(self, background, C: int) -> torch.Tensor:
        if background is not None:
            bg = torch.as_tensor(background, dtype=torch.float32, device=self.device)
            return bg[None].expand(C, 3) if bg.dim() == 1 else bg
        if self.config.random_background:
            return torch.rand(C, 3, device=self.device, generator=self.generator)
        return torch.tensor(self.config.background, device=self.device)[None].expand(C, 3)

    # ------------------------------------------------------------------ one step
    def loss(
        self,
        out: RenderOutput,
        targets: torch.Tensor,
        background: torch.Tensor,
        rgb_weights: torch.Tensor | None = None,
        alpha_weights: torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor]:
        """The loss terms of a render against targets (see :meth:`step`)."""
        cfg = self.config
        C = targets.shape[0]
        tgt_rgb = targets[..., :3]
        has_alpha = targets.shape[-1] == 4
        if has_alpha:
            a = targets[..., 3:]
            tgt_rgb = tgt_rgb * a + background[:, None, None, :] * (1 - a)
        w_rgb = (
            torch.full((C,), cfg.lambda_rgb / C, device=self.device) if rgb_weights is None else rgb_weights
        )
        losses = {"rgb": (w_rgb * (out.rgb - tgt_rgb).abs().sum((1, 2, 3))).sum()}
        if has_alpha and (cfg.lambda_alpha > 0 or alpha_weights is not None):
            w_a = (
                torch.full((C,), cfg.lambda_alpha / C, device=self.device)
                if alpha_weights is None
                else alpha_weights
            )
            losses["alpha"] = (w_a * (out.alpha - targets[..., 3:]).square().sum((1, 2, 3))).sum()
        losses["loss"] = sum(losses.values())
        return losses

    def step(
        self,
        targets: torch.Tensor,
        cameras: Cameras,
        background: Sequence[float] | torch.Tensor | None = None,
        rgb_weights: torch.Tensor | None = None,
        alpha_weights: torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor]:
        """One optimisation step: render the C cameras, compare, backpropagate, Adam, then densify,
        prune and reset opacities when the schedule says so.

        The loss is ``sum_c rgb_weights[c] * sum_pixels |rgb - target_rgb|_1`` plus, for RGBA targets,
        ``sum_c alpha_weights[c] * sum_pixels (alpha - target_alpha)^2``; RGBA targets are composited
        over the same background as the render. Default weights: ``lambda_rgb / C`` and
        ``lambda_alpha / C`` (MicroDreamer's per-view L1 sum averaged over views).

        Args:
            targets: [C, H, W, 3] RGB or [C, H, W, 4] straight RGBA in [0, 1], on the trainer's device.
            cameras: C cameras of H x W.
            background: 3 values or [C, 3]; None = the config's (fixed or random).
            rgb_weights, alpha_weights: [C] per-view weights overriding the defaults.

        Returns:
            Detached loss tensors {"loss", "rgb"[, "alpha"]} (no host sync).
        """
        cfg = self.config
        self.iteration += 1
        it = self.iteration
        for group in self.optimizer.param_groups:
            if group["name"] == "means":
                group["lr"] = self.position_lr(it)
        C = len(cameras)
        if targets.shape[0] != C or targets.shape[1:3] != (cameras.height, cameras.width):
            raise ValueError(
                f"targets {tuple(targets.shape)} do not match {C} cameras of {cameras.height} x {cameras.width}"
            )
        bg = self._backgrounds(background, C)
        track = self.densifying(it)
        out = render(self.splat, cameras, background=bg, backend=self.backend, retain_means2d_grad=track)
        losses = self.loss(out, targets, bg, rgb_weights, alpha_weights)
        losses["loss"].backward()
        if track and out.means2d.grad is not None:
            self.stats.accumulate(out.means2d.grad, out.radii, cameras.width, cameras.height)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.last_render = out
        if track and it % cfg.densify_interval == 0:
            self.densify_and_prune()
        if track and cfg.opacity_reset_interval > 0 and it % cfg.opacity_reset_interval == 0:
            self.params = reset_opacity(self.params, self.optimizer, cfg.opacity_reset_value)
        return {k: v.detach() for k, v in losses.items()}

    def densify_and_prune(self) -> dict[str, int]:
        """Densify by the gradients gathered since the last call, prune, and restart the statistics."""
        cfg = self.config
        self.params, info = densify_and_prune(
            self.params,
            self.optimizer,
            self.stats,
            grad_threshold=cfg.densify_grad_threshold,
            percent_dense=cfg.percent_dense,
            scene_extent=cfg.scene_extent,
            min_opacity=cfg.prune_min_opacity,
            max_scale=cfg.prune_max_scale,
            max_screen_radius=cfg.prune_max_screen_radius,
            max_gaussians=cfg.max_gaussians,
            generator=self.generator,
        )
        self.stats = DensifyStats.zeros(len(self), self.device)
        logger.debug("step %d: densify %s", self.iteration, info)
        return info
