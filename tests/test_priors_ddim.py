"""SIR's timestep schedule (microdreamer.priors.ddim) pinned to upstream MicroDreamer's, as facts.

Upstream: github.com/ML-GSAI/MicroDreamer at 597e3731f7a425f121cbe781182488d23184402d. The rules:

* ``main.py`` L724 ``gui.train(opt.total_steps)``: ``total_steps`` prior calls; L94 ``self.total_steps =
  opt.total_steps - 1``; L293-295, L356-357: the first call has ``init_3d`` (pure noise, L201-203 of
  ``guidance/zero123_utils.py``: t_stop = 1000, the whole grid) and leaves ``_denoise_step`` at 0, every
  later call is annealed with ``_denoise_step`` = 0, 1, ..., total_steps - 2;
* ``main.py`` L112-121 ``get_denoise_schedule``: t2 = ``timesteps[int(d / K * (end - start) + start)]``,
  ``start = denoise_steps * (1 - t_start)``, ``end = denoise_steps * (1 - t_end)``;
* ``guidance/zero123_utils.py`` L194-196 (``imagedream_utils.py`` L230-231, ``mvdream_utils.py`` L164-165):
  t1 = ``inverse_scheduler.timesteps[torch.tensor((step / 1000) * iter_steps * inverse_ratio, long)]``;
  L205-215 invert t1 -> t2 one grid step at a time, L217-223 denoise every grid timestep <= t2.
"""

from __future__ import annotations

import pytest
import torch

from microdreamer.config import DDIMConfig, ImageDreamConfig, MVDreamConfig, SIRConfig, Zero123Config
from microdreamer.priors.ddim import annealed_t2, ddim_calls, inversion_t1, sir_timesteps

# configs/image_sai.yaml L88-91, L99: denoise_steps 20, total_steps 21, t_start 0.9, t_end 0.2, inv_r 0.6
IMAGE_T2 = [901, 851, 801, 751, 751, 701, 651, 651, 601, 551,
            501, 501, 451, 401, 401, 351, 301, 301, 251, 201]  # fmt: skip
IMAGE_T1 = [501, 501, 451, 451, 451, 401, 351, 351, 351, 301,
            301, 301, 251, 201, 201, 201, 151, 151, 151, 101]  # fmt: skip
# configs/imagedream.yaml L86-89: denoise_steps 10, total_steps 31, t_start 0.8, t_end 0.4 (inverse_ratio
# 0.6: imagedream_utils.py L144, the default; main.py L329 passes none)
IMAGEDREAM_T2 = [801] + [701] * 7 + [601] * 8 + [501] * 7 + [401] * 7
IMAGEDREAM_T1 = [401] * 8 + [301] * 15 + [201] * 7


def _schedule(cfg_sir: SIRConfig, ratio: float, grid: DDIMConfig):
    return sir_timesteps(cfg_sir.iterations, cfg_sir.t_start, cfg_sir.t_end, ratio, grid)


def test_image_to_3d_default_is_upstreams_21_calls_with_its_t2_and_t1():
    sir, prior = SIRConfig(), Zero123Config()
    assert sir.iterations == 21  # image_sai.yaml L89 total_steps; main.py L724 train(total_steps)
    assert prior.ddim.num_inference_steps == 20  # image_sai.yaml L88 denoise_steps
    # image_sai.yaml L99 inv_r, L100 eta, L96 cfg: main.py L334 passes all three to zero123_utils.train_step
    assert (prior.inversion_ratio, prior.eta, prior.guidance_scale) == (0.6, 0.5, 3.0)
    plan = _schedule(sir, prior.inversion_ratio, prior.ddim)
    assert plan[0] == (None, 951)  # init_3d: pure noise, every grid timestep <= 1000
    assert [t2 for _, t2 in plan[1:]] == IMAGE_T2
    assert [t1 for t1, _ in plan[1:]] == IMAGE_T1
    # UNet calls: 20 from noise, then (t2 - t1) / 50 inversion steps + the grid timesteps <= t2
    calls = [ddim_calls(t1, t2, prior.ddim) for t1, t2 in plan]
    assert calls[0] == (0, 20) and calls[1] == (8, 19) and calls[-1] == (2, 5)
    assert sum(u + g for u, g in calls) == 352


def test_the_first_annealed_t2_is_upstreams_float_truncation():
    """``20 * (1 - 0.9)`` is 1.9999999999999996 in float64: index 1 (901), not 2 (851)."""
    assert 20 * (1 - 0.9) < 2
    assert annealed_t2(0, 20, 0.9, 0.2, DDIMConfig()) == 901
    assert annealed_t2(0, 30, 0.8, 0.4, DDIMConfig(num_inference_steps=10)) == 801  # 10 * 0.2 = 1.999...


@pytest.mark.parametrize("steps", [10, 20, 50])
@pytest.mark.parametrize("ratio", [0.3, 0.5, 0.6, 0.75, 1.0])
def test_t1_is_upstreams_float32_index_into_the_inverse_grid(steps, ratio):
    """t1 for every grid t2 equals upstream's expression evaluated as upstream evaluates it: ``step`` is a
    0-d int64 tensor (a scheduler timestep), so ``step / 1000 * iter_steps * inverse_ratio`` is float32."""
    from diffusers import DDIMInverseScheduler, DDIMScheduler

    grid = DDIMConfig(num_inference_steps=steps)
    sched, inv = DDIMScheduler(**grid.scheduler_kwargs()), DDIMInverseScheduler(**grid.scheduler_kwargs())
    sched.set_timesteps(steps)
    inv.set_timesteps(steps)
    for step in sched.timesteps:
        index = ((step / 1000) * steps * ratio).to(torch.long)
        assert inversion_t1(int(step), ratio, grid) == int(inv.timesteps[index]), int(step)


def test_t1_at_551_and_401_differ_from_the_largest_grid_step_under_06_t2():
    """Where upstream's index rule and "the largest grid timestep <= 0.6 t2" part (issue 42)."""
    grid = DDIMConfig()
    assert inversion_t1(551, 0.6, grid) == 301  # int(0.551 * 12) = 6; 0.6 * 551 = 330.6 would give 301 too
    assert inversion_t1(401, 0.6, grid) == 201  # int(4.812) = 4
    assert inversion_t1(501, 0.6, grid) == 301  # int(6.012) = 6


def test_imagedream_preset_is_upstreams_schedule_eta_and_ratio():
    from microdreamer.jobs.generate import default_config

    cfg = default_config("image+text")
    sir, prior = cfg.sir, cfg.imagedream
    assert sir.iterations == 31 and sir.views == 4  # imagedream.yaml L87 total_steps, L99-100 batch sizes
    assert prior.ddim.num_inference_steps == 10 and prior.guidance_scale == 2.0  # L86, L94
    # main.py L329 passes neither ddim_eta nor inverse_ratio: imagedream_utils.py L144-145's defaults win
    # over the YAML's eta 0.0 (L98)
    assert (prior.eta, prior.inversion_ratio) == (1.0, 0.6) == (ImageDreamConfig().eta, 0.6)
    plan = _schedule(sir, prior.inversion_ratio, prior.ddim)
    assert plan[0] == (None, 901)
    assert [t2 for _, t2 in plan[1:]] == IMAGEDREAM_T2
    assert [t1 for t1, _ in plan[1:]] == IMAGEDREAM_T1
    calls = [ddim_calls(t1, t2, prior.ddim) for t1, t2 in plan]
    assert calls[0] == (0, 10) and calls[1] == (4, 9) and calls[-1] == (2, 5)
    assert sum(u + g for u, g in calls) == 285


def test_text_preset_is_upstreams_schedule_with_the_assumed_fix():
    """text_mv.yaml L86-87: denoise_steps 50, total_steps 31; mvdream_utils.py hard-codes inverse ratio 0.6
    (L164) and eta 0.0 (L189). The config lacks t_start / t_end (main.py L115-116 read them); the fix
    assumed: imagedream.yaml's 0.8 / 0.4 (benchmarks/NOTES_mvdream.md)."""
    from microdreamer.jobs.generate import default_config

    cfg = default_config("text")
    sir, prior = cfg.sir, cfg.mvdream
    assert sir.iterations == 31 and sir.views == 4 and prior.ddim.num_inference_steps == 50
    assert (prior.eta, prior.inversion_ratio) == (0.0, 0.6) == (MVDreamConfig().eta, 0.6)
    assert (sir.t_start, sir.t_end) == (0.8, 0.4)
    plan = _schedule(sir, prior.inversion_ratio, prior.ddim)
    t2 = [t for _, t in plan[1:]]
    assert plan[0] == (None, 981) and t2[:4] == [801, 781, 761, 761] and t2[-3:] == [421, 421, 401]
    assert [t1 for t1, _ in plan[1:4]] == [481, 461, 441]  # int(0.801 * 30) = 24 -> 481
    assert sum(u + g for u, g in (ddim_calls(a, b, prior.ddim) for a, b in plan)) == 1344


def test_one_iteration_is_the_pure_noise_call_alone():
    assert sir_timesteps(1, 0.9, 0.2, 0.6, DDIMConfig()) == [(None, 951)]
    with pytest.raises(ValueError):
        sir_timesteps(0, 0.9, 0.2, 0.6, DDIMConfig())
