import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
from PIL import Image

from microdreamer.profiling import plot_stages

ROOT = Path(__file__).resolve().parents[1]


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


def test_plot_fields_writes_the_charts(tmp_path):
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "plot_fields.py"), "--out-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
    )
    written = sorted(Path(p).name for p in out.stdout.split())
    assert written == [
        "fields_h200_defaults_R128.png",
        "fields_h200_defaults_R256.png",
        "fields_h200_defaults_R512.png",
        "fields_h200_kernels_128_10k.png",
        "fields_h200_kernels_128_50k.png",
        "fields_h200_kernels_256_200k.png",
        "fields_h200_kernels_512_1M.png",
    ]
    assert all(_coloured_pixels(tmp_path / name) > 0 for name in written)


def test_plot_fields_without_results_says_what_is_missing(tmp_path):
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "plot_fields.py"), "--results", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert out.returncode != 0
    assert "not found" in out.stderr and "--results" in out.stderr
    assert not list(tmp_path.glob("*.png"))


def test_plot_fields_shortens_kernel_names():
    spec = importlib.util.spec_from_file_location("plot_fields", ROOT / "benchmarks" / "plot_fields.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.kernel_name("ns::(anonymous namespace)::setup_kernel(ns::SetupArgs)") == "setup_kernel"
    assert module.kernel_name(
        "void ns::(anonymous namespace)::fast_kernel_v2<4, true>(ns::FastArgs, long)"
    ) == ("fast_kernel_v2")
    assert module.kernel_name("Memset (Device)") == "Memset"
