"""The partial diffusion round trip of SIR: add noise to t1, DDIM-invert t1 -> t2, DDIM-denoise t2 -> 0.

The update rules are diffusers' own (:class:`diffusers.DDIMScheduler` for denoising,
:class:`diffusers.DDIMInverseScheduler` for inversion, ``add_noise`` for the forward jump); this module
only chooses the timesteps and runs the loops. What is ours:

* the timestep grid is the denoising scheduler's (``leading`` spacing with ``steps_offset`` = 1 and 20
  steps: 951, 901, ..., 1); a continuous t (as a fraction of T) is mapped to the largest grid
  timestep not above it;
* which t2 and t1 each SIR iteration visits is MicroDreamer's rule, with its floating-point truncation
  (:func:`annealed_t2`, :func:`inversion_t1`, :func:`sir_timesteps`: the one place the schedule lives);
* inversion from grid timestep ``a`` to the next one up ``b = a + T / steps`` evaluates the network
  at ``(x_a, a)`` (the noise level the latents actually have) and applies diffusers' inverse step,
  the exact algebraic inverse of the denoising step ``b -> a`` given the same noise prediction;
* the variance noise of eta > 0 steps is drawn from our generator and handed to diffusers
  (``variance_noise``), so one seed gives one result on any device;
* :meth:`DDIMRoundTrip.strength_start` is MicroDreamer's stage-2 "strength" (``guidance/zero123_utils.py``
  ``refine``): the index ``int(steps * strength)`` into the descending grid, so strength 0.8 of 50 steps
  noises to the grid's 41st timestep (181) and denoises through the last 10.

Latents are float32 here whatever the network's precision; the noise predictor casts.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from microdreamer.config import DDIMConfig

#: ``eps_fn(latents [B, 4, h, w] float32, t: int) -> eps [B, 4, h, w]`` (any float dtype).
NoisePredictor = Callable[[torch.Tensor, int], torch.Tensor]


def grid_timesteps(config: DDIMConfig, inverse: bool = False) -> list[int]:
    """The timestep grid of diffusers' ``DDIMScheduler.set_timesteps`` (``inverse``: of
    ``DDIMInverseScheduler.set_timesteps``) for ``config``, computed as they compute it (NumPy), without
    importing diffusers: descending, e.g. [951, 901, ..., 1] (``inverse``: ascending)."""
    import numpy as np

    T, n = config.num_train_timesteps, config.num_inference_steps
    if config.timestep_spacing == "leading":
        ratio = T // n
        grid = (np.arange(0, n) * ratio).round()
        grid = (grid if inverse else grid[::-1]).copy().astype(np.int64) + config.steps_offset
    elif config.timestep_spacing == "trailing":
        ratio = T / n
        grid = np.arange(T, 0, -ratio)
        grid = np.round(grid[::-1] if inverse else grid).astype(np.int64) - 1
    else:
        raise ValueError(f"timestep_spacing {config.timestep_spacing!r}: use leading or trailing")
    return [int(t) for t in grid]


def annealed_t2(index: int, count: int, t_start: float, t_end: float, config: DDIMConfig) -> int:
    """t2 of the ``index``-th of ``count`` annealed refinements (0-based; SIR's iterations after the first).

    MicroDreamer's ``main.py`` ``get_denoise_schedule``: the descending grid's entry at
    ``int(index / count * (end - start) + start)`` with ``start = steps * (1 - t_start)``, ``end = steps *
    (1 - t_end)``, in float64 as Python computes it, truncated: ``20 * (1 - 0.9)`` is 1.9999999999999996,
    so t_start 0.9 on 20 steps starts at index 1 (901), not 2 (851).
    """
    if not 0 <= index < count:
        raise ValueError(f"annealed refinement {index} of {count}: the index must be in 0..{count - 1}")
    grid = grid_timesteps(config)
    steps = config.num_inference_steps
    start = steps * (1 - t_start)
    end = steps * (1 - t_end)
    position = int(index / count * (end - start) + start)
    return grid[min(max(position, 0), len(grid) - 1)]


def inversion_t1(t2: int, inversion_ratio: float, config: DDIMConfig) -> int:
    """t1 (where the noise is added, the DDIM inversion's start) for t2, by MicroDreamer's rule
    (``guidance/zero123_utils.py``, ``imagedream_utils.py``, ``mvdream_utils.py`` ``train_step``): the
    ascending (inverse) grid's entry at ``int(t2 / T * steps * inversion_ratio)``, computed as upstream
    computes it: on a float32 tensor (t2 is a timestep tensor), truncated. E.g. t2 = 551, 20 steps, 0.6:
    6.612 -> index 6 -> t1 = 301. Never above t2."""
    up = grid_timesteps(config, inverse=True)
    x = torch.tensor(t2, dtype=torch.long) / config.num_train_timesteps * config.num_inference_steps
    index = int((x * inversion_ratio).to(torch.long))  # float32 -> int64 truncates, as upstream's
    return min(up[min(index, len(up) - 1)], t2)


def sir_timesteps(
    iterations: int, t_start: float, t_end: float, inversion_ratio: float, config: DDIMConfig
) -> list[tuple[int | None, int]]:
    """(t1, t2) of each of SIR's ``iterations`` refinements (MicroDreamer's ``train(total_steps)``): the
    first from pure noise through the whole grid (t1 None, t2 the grid's top), then ``iterations - 1``
    annealed ones (:func:`annealed_t2`, :func:`inversion_t1`)."""
    if iterations < 1:
        raise ValueError(f"iterations must be at least 1, got {iterations}")
    plan: list[tuple[int | None, int]] = [(None, grid_timesteps(config)[0])]
    for i in range(iterations - 1):
        t2 = annealed_t2(i, iterations - 1, t_start, t_end, config)
        plan.append((inversion_t1(t2, inversion_ratio, config), t2))
    return plan


def ddim_calls(t1: int | None, t2: int, config: DDIMConfig) -> tuple[int, int]:
    """(inversion steps, denoising steps) of one refinement (t1, t2): the network calls it makes."""
    grid = grid_timesteps(config)
    step = config.num_train_timesteps // config.num_inference_steps
    return (0 if t1 is None else (t2 - t1) // step), sum(1 for t in grid if t <= t2)


class DDIMRoundTrip:
    """Forward noising, DDIM inversion and DDIM denoising on one timestep grid (diffusers' schedulers).

    The grid is known at construction (:func:`grid_timesteps`); diffusers is imported and its schedulers
    are built on first use (:attr:`scheduler`, :attr:`inverse`), so planning a run imports nothing heavy.
    """

    def __init__(self, config: DDIMConfig | None = None) -> None:
        self.config = config or DDIMConfig()
        #: descending grid timesteps, e.g. [951, 901, ..., 1]
        self.timesteps: list[int] = grid_timesteps(self.config)
        self.step_size = self.config.num_train_timesteps // self.config.num_inference_steps
        up = grid_timesteps(self.config, inverse=True)
        if up != sorted(self.timesteps):
            raise ValueError(f"inverse grid {up} differs from the denoising grid {self.timesteps}")
        if any(b - a != self.step_size for a, b in zip(up[:-1], up[1:], strict=True)):
            raise ValueError(f"DDIM inversion needs an evenly spaced grid; got {up}")

    @functools.cached_property
    def scheduler(self):
        """diffusers' ``DDIMScheduler`` on :attr:`timesteps` (built on first use)."""
        from diffusers import DDIMScheduler

        return self._on_grid(DDIMScheduler(**self.config.scheduler_kwargs()), self.timesteps)

    @functools.cached_property
    def inverse(self):
        """diffusers' ``DDIMInverseScheduler`` on :attr:`timesteps`, ascending (built on first use)."""
        from diffusers import DDIMInverseScheduler

        return self._on_grid(DDIMInverseScheduler(**self.config.scheduler_kwargs()), sorted(self.timesteps))

    def _on_grid(self, scheduler, expected: list[int]):
        scheduler.set_timesteps(self.config.num_inference_steps)
        got = [int(t) for t in scheduler.timesteps]
        if got != expected:
            raise ValueError(f"{type(scheduler).__name__}'s grid {got} differs from {expected}")
        return scheduler

    @property
    def T(self) -> int:
        return self.config.num_train_timesteps

    def grid_at_or_below(self, t: float) -> int | None:
        """The largest grid timestep <= t (t in timestep units), or None when t is below the grid."""
        below = [g for g in self.timesteps if g <= t]
        return max(below) if below else None

    def strength_start(self, strength: float) -> int | None:
        """The grid timestep a "strength" refinement starts at: ``timesteps[int(steps * strength)]``
        (``strength`` is the fraction of the descending grid skipped, MicroDreamer's stage-2 rule);
        None when that index is past the grid (strength 1: nothing to denoise).

        Raises:
            ValueError: strength outside [0, 1].
        """
        if not 0.0 <= strength <= 1.0:
            raise ValueError(f"strength must be in [0, 1], got {strength}")
        index = int(self.config.num_inference_steps * strength)
        return self.timesteps[index] if index < len(self.timesteps) else None

    def add_noise(
        self, latents: torch.Tensor, t: int, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """x_t = sqrt(abar_t) x_0 + sqrt(1 - abar_t) noise, the noise drawn from ``generator``."""
        noise = torch.randn(latents.shape, generator=generator, device=latents.device, dtype=torch.float32)
        t_tensor = torch.tensor([t], dtype=torch.long)
        return self.scheduler.add_noise(latents.float(), noise, t_tensor)

    def invert(self, latents: torch.Tensor, t_from: int, t_to: int, eps_fn: NoisePredictor) -> torch.Tensor:
        """DDIM inversion (eta 0) from grid timestep ``t_from`` up to grid timestep ``t_to`` >= t_from.

        Each step a -> a + step_size predicts the noise at ``(x_a, a)``.

        Returns:
            [B, 4, h, w] float32 latents at ``t_to``.
        """
        if t_from not in self.timesteps or t_to not in self.timesteps or t_to < t_from:
            raise ValueError(f"invert needs grid timesteps t_from <= t_to, got {t_from} -> {t_to}")
        x = latents.float()
        t = t_from
        while t < t_to:
            eps = eps_fn(x, t).float()
            x = self.inverse.step(eps, t + self.step_size, x).prev_sample
            t += self.step_size
        return x

    def denoise(
        self,
        latents: torch.Tensor,
        t_from: int,
        eps_fn: NoisePredictor,
        eta: float = 0.0,
        generator: torch.Generator | None = None,
        t_to: int | None = None,
    ) -> torch.Tensor:
        """DDIM sampling from grid timestep ``t_from`` down through the grid.

        Args:
            latents: [B, 4, h, w] latents at ``t_from``.
            t_from: grid timestep to start at.
            eps_fn: the noise predictor (called at each grid timestep visited).
            eta: DDIM's stochasticity (0: deterministic).
            generator: draws the variance noise when eta > 0.
            t_to: stop once the latents are at this grid timestep; None: go to the end (clean latents).

        Returns:
            [B, 4, h, w] float32 latents at ``t_to`` (or clean).
        """
        if t_from not in self.timesteps:
            raise ValueError(f"denoise needs a grid timestep, got {t_from}; grid {self.timesteps}")
        if t_to is not None and (t_to not in self.timesteps or t_to > t_from):
            raise ValueError(f"denoise needs a grid timestep t_to <= t_from, got {t_from} -> {t_to}")
        x = latents.float()
        for t in self.timesteps:
            if t > t_from:
                continue
            if t_to is not None and t <= t_to:
                break
            eps = eps_fn(x, t).float()
            noise = None
            if eta > 0:
                noise = torch.randn(x.shape, generator=generator, device=x.device, dtype=torch.float32)
            x = self.scheduler.step(eps, t, x, eta=eta, variance_noise=noise).prev_sample
        return x

    def plan(self, t_stop: float, inversion_ratio: float) -> tuple[int | None, int | None]:
        """Grid timesteps (t1, t2) of one refinement for ``t_stop`` = t2 / T.

        ``t2`` is the largest grid timestep <= t_stop * T (None: t_stop is below the grid, nothing to
        do; t_stop * T is rounded to 6 decimals first, so t_stop = t2 / T gives t2 back); ``t1`` is
        :func:`inversion_t1` of t2. For t_stop >= 1 the plan is (None, top of the grid): start from pure
        noise.
        """
        if t_stop >= 1.0:
            return None, self.timesteps[0]
        t2 = self.grid_at_or_below(round(t_stop * self.T, 6))
        if t2 is None:
            return None, None
        return inversion_t1(t2, inversion_ratio, self.config), t2
