"""Tests of the mesh stage's fast paths against their references (CPU, fast).

Input builder shared with benchmarks/bench_mesh_stage.py: :func:`noisy_splat`, a splat like the
random-weight model's output (a noisy blobby surface plus clutter), whose 128^3 mesh has ~150k faces
in hundreds of pieces.
"""

from __future__ import annotations

import numpy as np
import torch

from microdreamer.splat import Splat

# ---------------------------------------------------------------------------------------------------
# input builders (shared with benchmarks/bench_mesh_stage.py)


def noisy_splat(
    n: int = 35_000,
    seed: int = 0,
    clutter: float = 0.5,
    scale: float = 0.0082,
    scale_sigma: float = 0.45,
) -> Splat:
    """N Gaussians like a random-weight generation's splat: a fraction ``1 - clutter`` near a bumpy
    sphere of radius ~0.45, the rest uniform in the ball of radius 0.6; log-normal scales (median
    ``scale``, log-sd ``scale_sigma``, independent per axis), random rotations, opacities uniform in
    [0.02, 0.95], random colours. With the defaults, the 128^3 exact-mode field at iso-level 1 gives
    ~155k marching-cubes faces in ~750 components, ~128k faces after cleanup (as the H200 runs of
    ``generate --random-weights full``: 125k-140k)."""
    g = np.random.default_rng(seed)
    n_surface = int(round(n * (1.0 - clutter)))
    d = g.normal(size=(n_surface, 3))
    d /= np.linalg.norm(d, axis=1, keepdims=True)
    bump = 1.0 + 0.15 * np.sin(3.0 * d[:, 0]) * np.cos(2.0 * d[:, 1]) + 0.1 * np.sin(5.0 * d[:, 2])
    surface = d * (0.45 * bump + g.normal(0.0, 0.01, n_surface))[:, None]
    c = g.normal(size=(n - n_surface, 3))
    c /= np.linalg.norm(c, axis=1, keepdims=True)
    c *= 0.6 * g.random(n - n_surface)[:, None] ** (1.0 / 3.0)
    means = np.concatenate([surface, c])
    scales = np.exp(np.log(scale) + scale_sigma * g.normal(size=(n, 3)))
    quats = g.normal(size=(n, 4))
    opacities = g.uniform(0.02, 0.95, n)
    colors = g.random((n, 3))
    return Splat.from_activated(
        *(torch.tensor(x, dtype=torch.float32) for x in (means, scales, quats, opacities, colors))
    )
