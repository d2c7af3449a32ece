import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from microdreamer.profiling import _PALETTE, amdahl_bounds, plot_scaling, plot_stages, write_profile


def _coloured_pixels(path: Path) -> int:
    a = np.asarray(Image.open(path).convert("RGB")).astype(int)
    return int(((a.max(axis=-1) - a.min(axis=-1)) > 60).sum())


def test_plot_stages_draws_one_bar_per_stage(tmp_path):
    small = plot_stages({"a": 1.0}, tmp_path / "one.png", unit="ms")
    three = plot_stages({"a": 1.0, "b": 3.0, "c": 0.5}, tmp_path / "three.png", unit="us", shares=False)
    h1, h3 = Image.open(small).size[1], Image.open(three).size[1]
    assert h3 - h1 == 2 * 28  # one row (28 px) per stage
    # bar lengths follow the values: "b" (the largest) spans the full 420 px, "a" a third, "c" a sixth
    a = np.asarray(Image.open(three).convert("RGB")).astype(int)
    coloured = (a.max(axis=-1) - a.min(axis=-1)) > 60
    for row, fraction in enumerate((1 / 3, 1.0, 1 / 6)):
        y = 28 * (row + 1) + 6 + 9  # the middle of the row's bar
        assert abs(int(coloured[y, 170 : 170 + 421].sum()) - 420 * fraction) <= 2
    assert _coloured_pixels(small) > 0


# ------------------------------------------------------------------ write_profile, plot_scaling
def _palette_pixels(path: Path, colour: tuple[int, int, int]) -> int:
    """Pixels of exactly ``colour`` (the charts draw bars and lines in flat palette colours)."""
    a = np.asarray(Image.open(path).convert("RGB"))
    return int((a == np.asarray(colour, np.uint8)).all(axis=-1).sum())


def test_write_profile_gives_amdahls_bound_per_stage(tmp_path):
    seconds = {"field": 1.0, "mesh": 3.0, "texture": 4.0}
    json_path, png_path = write_profile(seconds, tmp_path / "out", "mesh job", {"device": "cpu"})
    assert (json_path.name, png_path.name) == ("profile.json", "profile.png")
    report = json.loads(json_path.read_text())
    assert report["seconds"] == seconds and report["total"] == 8.0
    assert report["title"] == "mesh job" and report["extra"] == {"device": "cpu"}
    # by hand: T = 8; without field 7 s (8 / 7 = x1.142857), mesh 5 s (x1.6), texture 4 s (x2)
    expect = {"field": (1 / 8, 7.0, 8 / 7), "mesh": (3 / 8, 5.0, 1.6), "texture": (4 / 8, 4.0, 2.0)}
    assert list(report["amdahl"]) == list(expect)
    for name, (share, without, speedup) in expect.items():
        got = report["amdahl"][name]
        assert got["seconds"] == seconds[name]
        assert got["share"] == pytest.approx(share, rel=1e-12)
        assert got["total_without"] == pytest.approx(without, rel=1e-12)
        assert got["speedup"] == pytest.approx(speedup, rel=1e-12)
    assert not list((tmp_path / "out").glob(".*tmp*"))  # written through temporary names


def test_write_profile_png_draws_every_stage(tmp_path):
    seconds = {"a": 0.5, "b": 2.0, "c": 1.25, "d": 0.0}
    _, png = write_profile(seconds, tmp_path, "t", None)
    image = Image.open(png)
    image.verify()  # a valid PNG
    assert image.format == "PNG" and image.size[0] > 600 and image.size[1] > 4 * 26
    for i, name in enumerate(seconds):
        colour = _PALETTE[i]
        if seconds[name] > 0:  # two bars (seconds, speed-up) of the stage's colour, > 1 px each
            assert _palette_pixels(png, colour) > 200, name
    # the largest stage's seconds bar is the longest: 300 px; "a" a quarter of it
    a = np.asarray(Image.open(png).convert("RGB"))
    rows = [(a[58 + 26 * i + 12, :600] == np.asarray(_PALETTE[i], np.uint8)).all(-1).sum() for i in range(4)]
    assert abs(int(rows[1]) - 301) <= 2 and abs(int(rows[0]) - 301 * 0.25) <= 2


def test_amdahl_bounds_edge_cases():
    one = amdahl_bounds({"only": 2.0})["only"]
    assert one == {"seconds": 2.0, "share": 1.0, "total_without": 0.0, "speedup": None}  # no bound
    zero = amdahl_bounds({"a": 0.0, "b": 0.0})
    assert zero["a"]["speedup"] == 1.0 and zero["a"]["share"] == 0.0
    assert amdahl_bounds({}) == {}
    with pytest.raises(ValueError, match="'b'"):
        amdahl_bounds({"a": 1.0, "b": -1.0})
    with pytest.raises(ValueError, match="no stages"):
        write_profile({}, Path("unused"), "t", None)


def test_write_profile_json_has_null_for_no_bound(tmp_path):
    json_path, _ = write_profile({"only": 3.0}, tmp_path, "t", None)
    assert json.loads(json_path.read_text())["amdahl"]["only"]["speedup"] is None


def test_plot_scaling_draws_each_stage_and_the_shares(tmp_path):
    rows = [
        {
            "resolution": r,
            "seconds": {"field": 0.02 * (r / 128) ** 3, "mesh": 0.05 * (r / 128) ** 2, "texture": 1.5},
        }
        for r in (512, 128, 1024, 256)  # any order
    ]
    png = plot_scaling(rows, tmp_path / "scaling.png")
    image = Image.open(png)
    image.verify()
    assert image.format == "PNG"
    for i in range(3):
        assert _palette_pixels(png, _PALETTE[i]) > 500, i
    # the share bars: at 128^3 texture is 1.5 / 1.57 = 96 % of the run, at 1024^3 10 %
    a = np.asarray(Image.open(png).convert("RGB"))
    texture = (a == np.asarray(_PALETTE[2], np.uint8)).all(-1)
    columns = texture[:, 590:].sum(axis=0)
    first, last = columns[: 360 // 4].max(), columns[3 * 360 // 4 :].max()
    assert first / 330 == pytest.approx(1.5 / (1.5 + 0.02 + 0.05), abs=0.01)
    assert last / 330 == pytest.approx(1.5 / (1.5 + 0.02 * 512 + 0.05 * 64), abs=0.01)


def test_plot_scaling_rejects_bad_rows(tmp_path):
    with pytest.raises(ValueError, match="no rows"):
        plot_scaling([], tmp_path / "x.png")
    with pytest.raises(ValueError, match="resolution"):
        plot_scaling([{"seconds": {"field": 1.0}}], tmp_path / "x.png")
    with pytest.raises(ValueError, match="field"):
        plot_scaling([{"resolution": 128, "seconds": {"field": float("nan")}}], tmp_path / "x.png")
    assert not list(tmp_path.iterdir())
