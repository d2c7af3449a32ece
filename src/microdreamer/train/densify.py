"""Adaptive density control (3DGS): view-space gradient statistics, clone, split, prune, opacity reset.

Everything here works on a dict of named parameter tensors (the :class:`~microdreamer.splat.Splat`
fields) and keeps a ``torch.optim.Adam`` consistent with it: rows of Adam's moments follow their
Gaussians, new Gaussians start with zero moments, pruned ones drop theirs. Same code on CPU and GPU.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from microdreamer.splat import quat_to_rotmat

PARAM_NAMES = ("means", "sh_dc", "sh_rest", "opacity_logits", "log_scales", "quats")


@dataclass
class DensifyStats:
    """Per-Gaussian statistics gathered between two densifications.

    Attributes:
        grad_sum: [N] sum of view-space gradient norms (NDC units) over the views that drew it.
        count: [N] number of such views.
        max_radius: [N] largest 2D radius (pixels) seen.
    """

    grad_sum: torch.Tensor
    count: torch.Tensor
    max_radius: torch.Tensor

    @staticmethod
    def zeros(n: int, device: torch.device | str) -> DensifyStats:
        z = torch.zeros(n, device=device)
        return DensifyStats(z.clone(), z.clone(), z.clone())

    def mean_grad(self) -> torch.Tensor:
        """[N] mean gradient norm; 0 for Gaussians never drawn."""
        return torch.where(
            self.count > 0, self.grad_sum / self.count.clamp_min(1), torch.zeros_like(self.grad_sum)
        )

    def accumulate(self, means2d_grad: torch.Tensor, radii: torch.Tensor, width: int, height: int) -> None:
        """Add one rendered batch.

        Args:
            means2d_grad: [C, N, 2] gradient of the loss with respect to the pixel means.
            radii: [C, N, 2] int 2D radii (0 = not drawn).
            width, height: image size (the gradient is scaled to NDC units: x by W/2, y by H/2).
        """
        scale = _ndc_scale(width, height, means2d_grad.device, means2d_grad.dtype)
        vis = (radii > 0).all(-1)  # [C, N]
        # in-place, mixed-dtype updates: as few launches as the step allows (it is bound by the host)
        self.grad_sum += ((means2d_grad * scale).norm(dim=-1) * vis).sum(0)
        self.count += vis.sum(0)
        torch.maximum(self.max_radius, (radii.amax(-1) * vis).amax(0), out=self.max_radius)


@functools.lru_cache(maxsize=16)
def _ndc_scale(width: int, height: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """[2] (W/2, H/2) on ``device``, made once per size: building it every step would be a blocking
    host-to-device copy (a stream synchronisation) per training step."""
    return torch.tensor([0.5 * width, 0.5 * height], dtype=dtype).to(device)


def _replace_rows(
    optimizer: torch.optim.Optimizer,
    params: dict[str, torch.Tensor],
    new_values: dict[str, torch.Tensor],
    rows_fn,
) -> dict[str, torch.Tensor]:
    """Swap every parameter for ``new_values[name]`` and map its Adam moments with
    ``rows_fn(name, moment)``.

    Returns the new tensors by name; those the optimizer holds are fresh leaves (requires_grad) and
    its groups point to them; the others (e.g. empty SH bands) are plain tensors.
    """
    out = {name: new_values[name].detach().clone() for name in params}
    for group in optimizer.param_groups:
        name = group["name"]
        old = group["params"][0]
        new = out[name].requires_grad_(True)
        state = optimizer.state.pop(old, None)
        if state:
            for key in ("exp_avg", "exp_avg_sq"):
                if key in state:
                    state[key] = rows_fn(name, state[key])
            optimizer.state[new] = state
        group["params"][0] = new
    return out


def densify_and_prune(
    params: dict[str, torch.Tensor],
    optimizer: torch.optim.Optimizer,
    stats: DensifyStats,
    grad_threshold: float,
    percent_dense: float,
    scene_extent: float,
    min_opacity: float,
    max_scale: float,
    max_screen_radius: float | None = None,
    max_gaussians: int | None = None,
    generator: torch.Generator | None = None,
) -> tuple[dict[str, torch.Tensor], dict[str, int]]:
    """3DGS densification then pruning.

    Gaussians whose mean view-space gradient reaches ``grad_threshold`` are cloned (an exact copy,
    when their largest scale is <= ``percent_dense * scene_extent``) or split (otherwise: replaced
    by two children drawn from the Gaussian itself, scales divided by 1.6, the rest copied). Then
    Gaussians with opacity < ``min_opacity``, largest scale > ``max_scale * scene_extent`` or (if
    given) a 2D radius that exceeded ``max_screen_radius`` are removed.

    Returns:
        (the new parameters, {"cloned", "split", "pruned", "num_gaussians"}).
    """
    n = params["means"].shape[0]
    dev = params["means"].device
    with torch.no_grad():
        grads = stats.mean_grad()
        scales = params["log_scales"].exp()
        largest = scales.amax(1)
        cand = grads >= grad_threshold
        if max_gaussians is not None:
            room = max(0, max_gaussians - n)  # a clone or a split adds one Gaussian each
            if int(cand.sum()) > room:
                order = torch.argsort(torch.where(cand, grads, torch.full_like(grads, -1.0)), descending=True)
                cand = torch.zeros_like(cand)
                cand[order[:room]] = True
        big = largest > percent_dense * scene_extent
        clone = cand & ~big
        split = cand & big
        n_clone, n_split = int(clone.sum()), int(split.sum())

        # children of splits: two samples from each Gaussian, rotated into world space
        s_idx = split.nonzero().squeeze(1).repeat(2)
        q = torch.nn.functional.normalize(params["quats"][s_idx], dim=-1)
        local = torch.randn(s_idx.shape[0], 3, device=dev, generator=generator) * scales[s_idx]
        child_means = (quat_to_rotmat(q) @ local[:, :, None]).squeeze(-1) + params["means"][s_idx]
        keep = ~split
        new_values = {}
        for name in PARAM_NAMES:
            p = params[name].detach()
            parts = [p[keep], p[clone]]
            if name == "means":
                parts.append(child_means)
            elif name == "log_scales":
                parts.append(p[s_idx] - math.log(0.8 * 2))
            else:
                parts.append(p[s_idx])
            new_values[name] = torch.cat(parts)
        n_added = n_clone + 2 * n_split

        # prune the grown set
        n_grown = n - n_split + n_added
        op = torch.sigmoid(new_values["opacity_logits"])
        prune = op < min_opacity
        prune |= new_values["log_scales"].exp().amax(1) > max_scale * scene_extent
        if max_screen_radius is not None:
            radius = torch.cat([stats.max_radius[keep], torch.zeros(n_added, device=dev)])
            prune |= radius > max_screen_radius
        survive = ~prune
        new_values = {k: v[survive] for k, v in new_values.items()}

    def rows(name: str, t: torch.Tensor) -> torch.Tensor:
        grown = torch.cat(
            [t[keep], torch.zeros(n_grown - int(keep.sum()), *t.shape[1:], device=t.device, dtype=t.dtype)]
        )
        return grown[survive]

    new_params = _replace_rows(optimizer, params, new_values, rows)
    info = {
        "cloned": n_clone,
        "split": n_split,
        "pruned": int(prune.sum()),
        "num_gaussians": int(survive.sum()),
    }
    return new_params, info


def reset_opacity(
    params: dict[str, torch.Tensor], optimizer: torch.optim.Optimizer, value: float = 0.01
) -> dict[str, torch.Tensor]:
    """Clamp every opacity to at most ``value`` and zero the opacity logits' Adam moments (3DGS)."""
    cap = math.log(value / (1.0 - value))
    new_values = dict(params)
    new_values["opacity_logits"] = params["opacity_logits"].detach().clamp(max=cap)

    def rows(name: str, t: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(t) if name == "opacity_logits" else t

    return _replace_rows(optimizer, params, new_values, rows)
