"""Tests of turntable rendering: .gif / .png / .mp4 outputs, framing, splat and mesh sources (CPU, fast)."""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest
import torch
from PIL import Image

from microdreamer.config import TurntableConfig
from microdreamer.errors import InputError
from microdreamer.jobs import turntable
from microdreamer.jobs.turntable import (
    contact_sheet,
    is_splat,
    load_renderable,
    render_turntable,
    turntable_frames,
)
from microdreamer.mesh import save_mesh
from microdreamer.splat import Splat, write_ply
from microdreamer.synthetic import CUBE_SIDE_COLORS, textured_cube


def side_cube():

    return textured_cube()


def tiny_splat() -> Splat:
    g = torch.Generator().manual_seed(0)
    n = 200
    means = torch.rand(n, 3, generator=g) - 0.5
    colors = (means + 0.5).clamp(0, 1)  # red grows with x: asymmetric
    return Splat.from_activated(
        means, torch.full((n, 3), 0.06), torch.randn(n, 4, generator=g), torch.full((n,), 0.8), colors
    )


def test_gif_has_the_frame_count_and_size(tmp_path):
    out = render_turntable(
        side_cube(), tmp_path / "cube.gif", TurntableConfig(frames=6, size=32), progress=False
    )
    assert os.listdir(tmp_path) == ["cube.gif"]
    with Image.open(out) as im:
        assert im.size == (32, 32)
        assert im.n_frames == 6  # frames of an asymmetric object differ, so none are merged
        assert im.info.get("loop") == 0


def test_png_contact_sheet_is_two_rows_of_four(tmp_path):
    out = render_turntable(side_cube(), tmp_path / "sheet.png", TurntableConfig(size=24), progress=False)
    with Image.open(out) as im:
        assert im.size == (4 * 24, 2 * 24)
        sheet = np.asarray(im.convert("RGB"))
    # the first view (azimuth 0, from +z) shows the +z side, magenta; the third (azimuth 90) +x, red

    np.testing.assert_allclose(sheet[10:14, 10:14].reshape(-1, 3).mean(0), CUBE_SIDE_COLORS[4], atol=2)
    np.testing.assert_allclose(sheet[10:14, 58:62].reshape(-1, 3).mean(0), CUBE_SIDE_COLORS[0], atol=2)


@pytest.mark.skipif(
    importlib.util.find_spec("imageio_ffmpeg") is None,
    reason="imageio-ffmpeg is not installed (mp4 is optional)",
)
def test_mp4_has_the_frame_count_and_size(tmp_path):
    import imageio.v2 as imageio

    out = render_turntable(
        side_cube(), tmp_path / "cube.mp4", TurntableConfig(frames=10, size=32), progress=False
    )
    reader = imageio.get_reader(str(out))
    try:
        assert reader.count_frames() == 10
        assert reader.get_meta_data()["size"] == (32, 32)
    finally:
        reader.close()


def test_mp4_without_ffmpeg_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(turntable, "_mp4_available", lambda: False)
    with pytest.raises(InputError, match=r"imageio-ffmpeg.*\.gif") as info:
        render_turntable(
            side_cube(), tmp_path / "cube.mp4", TurntableConfig(frames=4, size=16), progress=False
        )
    assert "\n" not in str(info.value)
    assert os.listdir(tmp_path) == []


def test_bad_outputs_are_input_errors_and_write_nothing(tmp_path):
    with pytest.raises(InputError, match="unsupported turntable format '.avi'"):
        render_turntable(side_cube(), tmp_path / "x.avi", progress=False)
    with pytest.raises(InputError, match="does not exist"):
        render_turntable(side_cube(), tmp_path / "missing" / "x.gif", progress=False)
    with pytest.raises(InputError, match="does not exist"):
        render_turntable(tmp_path / "nothing.ply", tmp_path / "x.gif", progress=False)
    assert os.listdir(tmp_path) == []


def test_a_failure_while_rendering_leaves_no_file(tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        yield np.zeros((16, 16, 3), np.uint8)
        raise RuntimeError("out of memory")

    monkeypatch.setattr(turntable, "turntable_frames", broken)
    with pytest.raises(RuntimeError, match="out of memory"):
        render_turntable(side_cube(), tmp_path / "x.gif", TurntableConfig(frames=4, size=16), progress=False)
    assert os.listdir(tmp_path) == []


def test_splat_and_mesh_files_load_and_render(tmp_path):
    splat_path = tmp_path / "splat.ply"
    write_ply(tiny_splat(), splat_path)
    mesh_path = save_mesh(side_cube(), tmp_path / "cube.ply")
    assert is_splat(splat_path) and not is_splat(mesh_path)
    assert isinstance(load_renderable(splat_path), Splat)
    assert load_renderable(mesh_path).num_faces == 12
    sheet = render_turntable(splat_path, tmp_path / "splat.png", TurntableConfig(size=16), progress=False)
    with Image.open(sheet) as im:
        assert im.size == (64, 32)
        pixels = np.asarray(im.convert("RGB")).astype(float)
    assert (pixels < 250).any()  # the splat is drawn over the white background

    # the splat's red channel grows with x: seen from +x (azimuth 90) it is redder than from -x (270)
    frames = list(turntable_frames(tiny_splat(), [90.0, 270.0], size=32))
    red = [f[..., 0][f.min(-1) < 250].mean() for f in frames]
    assert red[0] > red[1] + 20


def test_frames_are_framed_around_an_off_centre_object():
    cube = side_cube()
    shifted = type(cube)(
        cube.vertices + np.array([5.0, -3.0, 2.0], np.float32), cube.faces, uv=cube.uv, texture=cube.texture
    )
    a = list(turntable_frames(cube, [0.0, 45.0], size=32))
    b = list(turntable_frames(shifted, [0.0, 45.0], size=32))
    for fa, fb in zip(a, b, strict=True):
        assert np.abs(fa.astype(int) - fb.astype(int)).max() <= 1  # same picture: orbit about the centre


def test_contact_sheet_fills_a_short_last_row():
    frames = [np.full((2, 3, 3), k, np.uint8) for k in range(5)]
    sheet = contact_sheet(frames, columns=4)
    assert sheet.shape == (4, 12, 3)
    assert (sheet[2:, 3:6] == 0).all()  # row 2 holds frame 4 at column 0, then the fill colour
    assert (sheet[2:, 0:3] == 4).all() and (sheet[0:2, 9:12] == 3).all()


def test_up_stands_a_z_up_mesh_and_an_uncoloured_mesh_is_shaded(tmp_path):
    """A tall box along +z with a red top (a Z-up scan): with up +z every frame shows it standing, red
    above blue; the same box without colour renders with more than one grey level (head light)."""
    import trimesh

    from microdreamer.mesh import Mesh

    box = trimesh.creation.box(extents=(0.3, 0.3, 1.2))
    v = np.asarray(box.vertices)
    colors = np.where(v[:, 2:] > 0, [[0.9, 0.1, 0.1]], [[0.1, 0.1, 0.9]])
    mesh = Mesh(v, box.faces, vertex_colors=colors)
    upright = turntable.turn_upright(mesh, "+z")
    for frame in turntable_frames(upright, [0.0, 90.0, 200.0], size=48):
        f = frame.astype(int)
        red = (f[..., 0] > 150) & (f[..., 2] < 100)
        blue = (f[..., 2] > 150) & (f[..., 0] < 100)
        ys, xs = np.nonzero(f.sum(-1) < 700)  # the object (the background is white)
        assert np.ptp(ys) > 2 * np.ptp(xs)  # standing: taller than wide
        assert np.nonzero(red)[0].mean() < np.nonzero(blue)[0].mean()
    grey = Mesh(v, box.faces)
    config = TurntableConfig(size=48, sheet_views=4, up="+z", elevation_deg=-30.0)  # top and a side seen
    render_turntable(grey, tmp_path / "g.png", config)
    sheet = np.asarray(Image.open(tmp_path / "g.png").convert("L"))
    obj = sheet < 250
    inner = obj[1:-1, 1:-1].copy()  # object pixels whose 8 neighbours are object too: no antialiased edge
    for dy in (-1, 0, 1):
        for dx in (-1, 0, 1):
            inner &= obj[1 + dy : obj.shape[0] - 1 + dy, 1 + dx : obj.shape[1] - 1 + dx]
    values = sheet[1:-1, 1:-1][inner]
    assert inner.sum() > 100 and np.ptp(values) > 30, np.unique(values)  # shaded, not a flat silhouette
