"""Which way is up: the rotation that makes a splat's or a mesh's up axis +y (the project's convention).

Captures come in their tool's convention: COLMAP / 3DGS / PlayCanvas scenes are often y-down, some
tools write z-up. :func:`up_rotation` gives the proper rotation for an up axis the user names
(``"+y"``, ``"-y"``, ``"+z"``, ``"-z"``); :func:`detect_up` guesses the axis from the points only where
the guess is reliable, and :func:`orient` combines the two.

Detection is from a ground: a scene captured on a floor or a table has a thin, wide, dense layer of
Gaussians at one end of its up axis, and everything else lies on one side of it. :func:`detect_up`
accepts a guess only when exactly one of the four ends (y and z, low and high) holds such a layer:
at least ``min_share`` of the (opacity-weighted) points within ``thickness`` of the extent from that
end, spread over at least half the extent across both other axes, while the opposite end holds less
than a third of that share. Anything else (an object without a ground, a box-like scene with
several such ends) gives None and the caller keeps its default. A "heavier end down" rule would
guess the PlayCanvas guitar right but is not reliable (lamps, trees, people with raised arms), so it
is not used.
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
_AXIS = {"y": 1, "z": 2}


def up_rotation(up: str) -> torch.Tensor:
    """[3, 3] float64 rotation R (det +1) with ``R @ u = (0, 1, 0)`` for the unit vector ``u`` of
    ``up``; x stays x. Apply it as ``points @ R.T`` (a mesh's vertices, a splat's centres).

    Raises:
        ValueError: ``up`` is not one of :data:`UP_AXES`.
    """
    if up not in _ROTATIONS:
        raise ValueError(f"unknown up axis {up!r}; use one of {', '.join(UP_AXES)}")
    return torch.tensor(_ROTATIONS[up], dtype=torch.float64)


def detect_up(
    points: torch.Tensor,
    weights: torch.Tensor | None = None,
    thickness: float = 0.02,
    min_share: float = 0.15,
    min_spread: float = 0.5,
) -> str | None:
    """The up axis of a scene standing on a ground, or None when there is no single clear ground.

    Args:
        points: [N, 3] positions (e.g. a splat's centres).
        weights: optional [N] non-negative weights (e.g. opacities); default 1.
        thickness: the ground layer's depth, as a fraction of the extent along the candidate axis
            (the extent is taken between the 0.5 % and 99.5 % quantiles, robust to floaters).
        min_share: the least share of the total weight in the layer.
        min_spread: the layer's least extent across each other axis, as a fraction of the scene's
            (between the layer's own 5 % and 95 % quantiles).

    Returns:
        ``"+y"``, ``"-y"``, ``"+z"``, ``"-z"`` (the direction from the ground into the scene), or None.
    """
    p = torch.as_tensor(points).double().reshape(-1, 3)
    if p.shape[0] < 100:
        return None
    w = torch.ones(p.shape[0], dtype=torch.float64) if weights is None else torch.as_tensor(weights).double()
    q = torch.tensor([0.005, 0.995], dtype=torch.float64)
    lo_hi = torch.quantile(p, q, dim=0)  # [2, 3]
    extent = lo_hi[1] - lo_hi[0]
    if not bool((extent > 0).all()):
        return None
    total = float(w.sum())
    if not total > 0:
        return None
    found = []
    for name, a in _AXIS.items():
        others = [b for b in range(3) if b != a]
        shares = {}
        spreads = {}
        for side, edge in (("low", lo_hi[0, a]), ("high", lo_hi[1, a])):
            layer = (p[:, a] - edge).abs() <= thickness * extent[a]
            shares[side] = float(w[layer].sum()) / total
            if int(layer.sum()) >= 20:
                span = torch.quantile(
                    p[layer][:, others], torch.tensor([0.05, 0.95], dtype=torch.float64), dim=0
                )
                spreads[side] = float(((span[1] - span[0]) / extent[others]).min())
            else:
                spreads[side] = 0.0
        for side, other in (("low", "high"), ("high", "low")):
            if shares[side] >= min_share and spreads[side] >= min_spread and shares[other] < shares[side] / 3:
                found.append(("+" if side == "low" else "-") + name)  # up points away from the ground
    return found[0] if len(found) == 1 else None


def resolve_up(source, up: str) -> tuple[str, str]:
    """The up axis to use and how it was chosen: ``(up, "given")`` for an axis of :data:`UP_AXES`; for
    ``"auto"``, :func:`detect_up` on ``source`` (a :class:`microdreamer.splat.Splat`: its centres weighted
    by opacity; anything else with ``vertices`` [V, 3]: those), ``(axis, "ground")`` when it finds one
    and ``("+y", "default")`` when not."""
    if up != "auto":
        return up, "given"
    if hasattr(source, "means"):
        with torch.no_grad():
            points, weights = source.means.detach().float().cpu(), source.opacities().detach().float().cpu()
    else:
        points, weights = torch.as_tensor(source.vertices), None
    found = detect_up(points, weights)
    return (found, "ground") if found else ("+y", "default")


def describe_up(up: str, how: str) -> str:
    """The line that says which axis ``"auto"`` chose (``up``, ``how`` from :func:`resolve_up`)."""
    why = (
        "the side of the input's ground"
        if how == "ground"
        else "no single clear ground layer, so the default"
    )
    return f"up axis: {up} (auto: {why})"


def orient(
    points: torch.Tensor, up: str = "+y", weights: torch.Tensor | None = None
) -> tuple[torch.Tensor, str]:
    """The rotation for ``up`` (one of :data:`UP_AXES`, or ``"auto"``: :func:`detect_up`, falling
    back to ``"+y"`` when it gives None) and the axis used: ``(R [3, 3] float64, up)``."""
    if up == "auto":
        up = detect_up(points, weights) or "+y"
    return up_rotation(up), up
