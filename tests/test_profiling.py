from pathlib import Path

import numpy as np
from PIL import Image

from microdreamer.profiling import plot_stages


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
