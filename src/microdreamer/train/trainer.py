"""The Gaussian trainer: Adam with per-parameter learning rates, the position schedule, densification.

:meth:`GaussianTrainer.step` is one optimisation step against target images from given cameras; the
reconstruction loop and MicroDreamer's score-based iterative reconstruction both drive it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch

from microdreamer.cameras import Cameras
from microdreamer.config import TrainConfig
from microdreamer.render import RenderOutput, render
from microdreamer.render.gaussians import resolve_backend
from microdreamer.splat import Splat
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
        self._fixed_bg: tuple | None = None  # (config.background, its [3] device tensor)
        self._target_cache: tuple | None = None  # see _targets

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

    def _backgrounds(self, background, C: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """([C, 3] background, the tensor it was made from or None when it is new every step)."""
        if background is not None:
            src = torch.as_tensor(background, dtype=torch.float32, device=self.device)
            return (src[None].expand(C, 3) if src.dim() == 1 else src), src
        if self.config.random_background:
            return torch.rand(C, 3, device=self.device, generator=self.generator), None
        key = tuple(self.config.background)
        if self._fixed_bg is None or self._fixed_bg[0] != key:  # made once: no copy to the device per step
            self._fixed_bg = (key, torch.tensor(key, device=self.device))
        return self._fixed_bg[1][None].expand(C, 3), self._fixed_bg[1]

    def _weights(
        self,
        C: int,
        has_alpha: bool,
        rgb_weights: torch.Tensor | None,
        alpha_weights: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """[C] per-view weights of the RGB term and of the alpha term (None: no alpha term)."""
        cfg = self.config
        if rgb_weights is None:
            rgb_weights = torch.full((C,), cfg.lambda_rgb / C, device=self.device)
        if not has_alpha or (cfg.lambda_alpha <= 0 and alpha_weights is None):
            return rgb_weights, None
        if alpha_weights is None:
            alpha_weights = torch.full((C,), cfg.lambda_alpha / C, device=self.device)
        return rgb_weights, alpha_weights

    def _targets(
        self, targets: torch.Tensor, bg: torch.Tensor, bg_source: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(target RGB [C, H, W, 3], target alpha [C, H, W, 1] or None): RGBA composited over ``bg``.

        The result is kept while the same ``targets`` and background tensors come back unmodified
        (same objects, same version counters): SIR takes 15 steps per set of targets.
        """
        if targets.shape[-1] != 4:
            return targets[..., :3], None
        cache = self._target_cache
        if (
            bg_source is not None
            and cache is not None
            and cache[0] is targets
            and cache[1] == targets._version
            and cache[2] is bg_source
            and cache[3] == bg_source._version
        ):
            return cache[4], cache[5]
        with torch.no_grad():
            a = targets[..., 3:]
            rgb = targets[..., :3] * a + bg[:, None, None, :] * (1 - a)
            a = a.contiguous()
        self._target_cache = (
            None if bg_source is None else (targets, targets._version, bg_source, bg_source._version, rgb, a)
        )
        return rgb, a

    # ------------------------------------------------------------------ one step
    def loss(
        self,
        out: RenderOutput,
        targets: torch.Tensor,
        background: torch.Tensor,
        rgb_weights: torch.Tensor | None = None,
        alpha_weights: torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor]:
        """The loss terms of a render against targets (see :meth:`step`), differentiable.

        :meth:`step` computes the same terms and gradients without building this graph.
        """
        C = targets.shape[0]
        tgt_rgb = targets[..., :3]
        has_alpha = targets.shape[-1] == 4
        if has_alpha:
            a = targets[..., 3:]
            tgt_rgb = tgt_rgb * a + background[:, None, None, :] * (1 - a)
        w_rgb, w_a = self._weights(C, has_alpha, rgb_weights, alpha_weights)
        losses = {"rgb": (w_rgb * (out.rgb - tgt_rgb).abs().sum((1, 2, 3))).sum()}
        if w_a is not None:
            losses["alpha"] = (w_a * (out.alpha - targets[..., 3:]).square().sum((1, 2, 3))).sum()
        losses["loss"] = sum(losses.values())
        return losses

    def _backward_loss(
        self,
        out: RenderOutput,
        tgt_rgb: torch.Tensor,
        tgt_alpha: torch.Tensor | None,
        w_rgb: torch.Tensor,
        w_a: torch.Tensor | None,
    ) -> dict[str, torch.Tensor]:
        """Backpropagate :meth:`loss` and return its terms (detached), with the image gradients written
        out instead of recorded: d/d rgb = w_c sign(rgb - target), d/d alpha = 2 w_c (alpha - target)
        (what autograd computes for those terms, to the bit). The rasteriser's backward is launched
        right after its forward; the loss values are reduced afterwards.
        """
        w4 = w_rgb[:, None, None, None]
        with torch.no_grad():
            d_rgb = out.rgb.detach() - tgt_rgb
            outputs, grads = [out.rgb], [torch.sign(d_rgb).mul_(w4)]
            if w_a is not None:
                d_a = out.alpha.detach() - tgt_alpha
                outputs.append(out.alpha)
                grads.append(d_a * (2 * w_a)[:, None, None, None])
        if out.rgb.requires_grad:  # N = 0 renders the background: nothing to optimise
            torch.autograd.backward(outputs, grads)
        with torch.no_grad():
            losses = {"rgb": (w_rgb * d_rgb.abs().sum((1, 2, 3))).sum()}
            if w_a is not None:
                losses["alpha"] = (w_a * d_a.square().sum((1, 2, 3))).sum()
            losses["loss"] = losses["rgb"] + losses["alpha"] if w_a is not None else losses["rgb"]
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
            Detached loss tensors {"loss", "rgb"[, "alpha"]} (no host sync). ``last_render`` is the
            step's render, without depth.
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
        bg, bg_source = self._backgrounds(background, C)
        track = self.densifying(it)
        out = render(
            self.splat, cameras, background=bg, backend=self.backend, retain_means2d_grad=track, depth=False
        )
        tgt_rgb, tgt_alpha = self._targets(targets, bg, bg_source)
        w_rgb, w_a = self._weights(C, tgt_alpha is not None, rgb_weights, alpha_weights)
        losses = self._backward_loss(out, tgt_rgb, tgt_alpha, w_rgb, w_a)
        if track and out.means2d.grad is not None:
            self.stats.accumulate(out.means2d.grad, out.radii, cameras.width, cameras.height)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.last_render = out
        if track and it % cfg.densify_interval == 0:
            self.densify_and_prune()
        if track and cfg.opacity_reset_interval > 0 and it % cfg.opacity_reset_interval == 0:
            self.params = reset_opacity(self.params, self.optimizer, cfg.opacity_reset_value)
        return losses

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
