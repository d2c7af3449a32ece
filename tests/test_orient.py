"""The up-axis rotations and the ground-based up detection (microdreamer.orient)."""

import math

import pytest
import torch

from conftest import sample
from microdreamer.orient import UP_AXES, detect_up, orient, resolve_up, up_rotation

UNIT = {"+y": (0.0, 1.0, 0.0), "-y": (0.0, -1.0, 0.0), "+z": (0.0, 0.0, 1.0), "-z": (0.0, 0.0, -1.0)}


def table_scene(n: int = 6000, seed: int = 0, ground: bool = True) -> torch.Tensor:
    """[N, 3] points of an asymmetric scene, y up: a ground plate 2 x 1.5 at y = 0 (40 %), a box
    0.6 x 0.8 x 0.4 standing on it off-centre (40 %), a thin pole to y = 1.4 at one corner (20 %).
    Without ``ground`` the plate is left out (the box then floats above y = 0)."""
    g = torch.Generator().manual_seed(seed)
    k_ground, k_box = int(0.4 * n), int(0.4 * n)
    k_pole = n - k_ground - k_box
    plate = torch.stack([
        torch.rand(k_ground, generator=g) * 2 - 1, 0.003 * torch.randn(k_ground, generator=g),
        torch.rand(k_ground, generator=g) * 1.5 - 0.75,
    ], -1)  # fmt: skip
    # the box's surface: pick a face, then a point on it
    u = torch.rand(k_box, 3, generator=g)
    face = torch.randint(0, 3, (k_box,), generator=g)
    u[torch.arange(k_box), face] = torch.randint(0, 2, (k_box,), generator=g).double().float()
    box = u * torch.tensor([0.6, 0.8, 0.4]) + torch.tensor([0.1, 0.05, -0.5])
    t = torch.rand(k_pole, generator=g)
    a = torch.rand(k_pole, generator=g) * 2 * math.pi
    pole = torch.stack([-0.8 + 0.02 * torch.cos(a), 0.05 + 1.35 * t, 0.6 + 0.02 * torch.sin(a)], -1)
    parts = [plate, box, pole] if ground else [box, pole]
    return torch.cat(parts).double()


def test_up_rotation_is_a_proper_rotation_taking_up_to_plus_y():
    for up in UP_AXES:
        r = up_rotation(up)
        assert r.dtype == torch.float64 and r.shape == (3, 3)
        assert torch.allclose(r @ r.T, torch.eye(3, dtype=torch.float64))
        assert math.isclose(float(torch.linalg.det(r)), 1.0)
        assert torch.equal(
            r @ torch.tensor(UNIT[up], dtype=torch.float64), torch.tensor([0.0, 1.0, 0.0]).double()
        )
        assert torch.equal(r[0], torch.tensor([1.0, 0.0, 0.0]).double())  # x stays x
    assert torch.equal(up_rotation("+y"), torch.eye(3, dtype=torch.float64))
    with pytest.raises(ValueError, match="up axis"):
        up_rotation("y")


@pytest.mark.parametrize("up", UP_AXES)
def test_an_asymmetric_scene_turned_any_way_is_detected_and_turned_upright(up):
    upright = table_scene(seed=1)
    turned = upright @ up_rotation(up)  # = R^-1 applied to each point: the scene's up is now `up`
    assert detect_up(turned) == up
    rot, used = orient(turned, "auto")
    assert used == up
    assert torch.allclose(turned @ rot.T, upright, atol=1e-12)


def test_detection_with_opacity_weights():
    pts = table_scene(seed=2)
    w = torch.ones(pts.shape[0], dtype=torch.float64)
    w[pts[:, 1].abs() < 0.02] = 0.01  # a ground of nearly transparent Gaussians does not count
    assert detect_up(pts) == "+y"
    assert detect_up(pts, w) is None


@pytest.mark.parametrize("up", UP_AXES)
def test_no_ground_gives_no_guess(up):
    pts = table_scene(seed=3, ground=False) @ up_rotation(up)
    assert detect_up(pts) is None
    rot, used = orient(pts, "auto")
    assert used == "+y" and torch.equal(rot, torch.eye(3, dtype=torch.float64))


def test_a_ball_a_cube_and_degenerate_inputs_give_no_guess():
    g = torch.Generator().manual_seed(4)
    ball = torch.nn.functional.normalize(torch.randn(5000, 3, generator=g, dtype=torch.float64), dim=-1)
    assert detect_up(ball) is None
    cube = torch.rand(5000, 3, generator=g, dtype=torch.float64)
    cube[torch.arange(5000), torch.randint(0, 3, (5000,), generator=g)] = torch.randint(
        0, 2, (5000,), generator=g
    ).double()
    assert detect_up(cube) is None  # every face is a "ground": not one clear answer
    assert detect_up(torch.zeros(0, 3)) is None
    assert detect_up(torch.zeros(500, 3)) is None  # no extent
    assert detect_up(torch.randn(10, 3)) is None  # too few points


@pytest.mark.parametrize("up", UP_AXES)
def test_resolve_up_on_a_splat_and_on_vertices(up):
    """resolve_up: a splat's centres weighted by opacity, or an object's vertices; given axes unchanged."""
    from types import SimpleNamespace

    from microdreamer.splat import Splat

    pts = (table_scene(seed=6) @ up_rotation(up)).float()
    n = pts.shape[0]
    splat = Splat.from_activated(pts, torch.full((n, 3), 0.01), torch.tensor([[1.0, 0, 0, 0]]).expand(n, 4),
                                 torch.full((n,), 0.8), torch.full((n, 3), 0.5))  # fmt: skip
    assert resolve_up(splat, "auto") == (up, "ground")
    assert resolve_up(SimpleNamespace(vertices=pts.numpy()), "auto") == (up, "ground")
    for given in UP_AXES:
        assert resolve_up(splat, given) == (given, "given")
    bare = (table_scene(seed=6, ground=False) @ up_rotation(up)).float()
    assert resolve_up(SimpleNamespace(vertices=bare.numpy()), "auto") == ("+y", "default")


def test_explicit_up_is_used_as_given():
    pts = table_scene(seed=5)
    for up in UP_AXES:
        rot, used = orient(pts, up)
        assert used == up and torch.equal(rot, up_rotation(up))


def test_guitar_sample_has_no_ground_so_no_guess():
    """The PlayCanvas guitar (y-down, on a stand, no floor) is not detected: the user passes -y."""
    from microdreamer.splat import read_ply

    s = read_ply(sample("splats/pc_guitar_91k_sh0.decoded.ply"))
    assert detect_up(s.means, s.opacities()) is None
