"""Which way is up: the rotation that makes an input's up axis +y (the project's convention).

Captures come in their tool's convention: COLMAP / 3DGS / PlayCanvas scenes are often y-down, some
tools and scanners write z-up. :func:`up_rotation` gives the proper rotation for the up axis the user
names (``--up +y|-y|+z|-z``); x stays x.

(The interface of the ``fidelity`` branch's module of the same name, which adds ``detect_up``; this
file holds only what the ``--up`` flags need.)
"""

from __future__ import annotations

import torch

UP_AXES = ("+y", "-y", "+z", "-z")

# rows: where x, y, z of the input go; each maps the named up direction to +y (det +1)
_ROTATIONS = {
    "+y": ((1.0, 0.0, 0.0), (0.0, 1.0, 0.0), (0.0, 0.0, 1.0)),
    "-y": ((1.0, 0.0, 0.0), (0.0, -1.0, 0.0), (0.0, 0.0, -1.0)),  # 180 degrees about x
    "+z": ((1.0, 0.0, 0.0), (0.0, 0.0, 1.0), (0.0, -1.0, 0.0)),  # -90 degrees about x
    "-z": ((1.0, 0.0, 0.0), (0.0, 0.0, -1.0), (0.0, 1.0, 0.0)),  # +90 degrees about x
}


def up_rotation(up: str) -> torch.Tensor:
    """[3, 3] float64 rotation R (det +1) with ``R @ u = (0, 1, 0)`` for the unit vector ``u`` of
    ``up``; x stays x. Apply it as ``points @ R.T`` (a mesh's vertices, a splat's centres).

    Raises:
        ValueError: ``up`` is not one of :data:`UP_AXES`.
    """
    if up not in _ROTATIONS:
        raise ValueError(f"unknown up axis {up!r}; use one of {', '.join(UP_AXES)}")
    return torch.tensor(_ROTATIONS[up], dtype=torch.float64)
