"""Learning-rate schedules."""

from __future__ import annotations

import math


def exponential_lr(
    step: int,
    lr_init: float,
    lr_final: float,
    max_steps: int,
    delay_steps: int = 0,
    delay_mult: float = 1.0,
) -> float:
    """3DGS's position schedule: log-linear from ``lr_init`` at step 0 to ``lr_final`` at
    ``max_steps`` (constant after), times an optional warm-up factor rising from ``delay_mult`` to 1
    over ``delay_steps`` along ``sin(pi/2 * step / delay_steps)``.

    Returns 0 for a negative step or when both rates are 0, and ``lr_init`` when the rates are equal.
    """
    if lr_init == lr_final:
        return lr_init
    if step < 0 or (lr_init == 0.0 and lr_final == 0.0):
        return 0.0
    if delay_steps > 0:
        frac = min(max(step / delay_steps, 0.0), 1.0)
        delay = delay_mult + (1.0 - delay_mult) * math.sin(0.5 * math.pi * frac)
    else:
        delay = 1.0
    t = min(max(step / max(max_steps, 1), 0.0), 1.0)
    return delay * math.exp(math.log(lr_init) * (1.0 - t) + math.log(lr_final) * t)
