"""Per-stage timings with NVTX ranges, and a chart of where the time goes.

Usage::

    timer = StageTimer()
    with timer.stage("field"):
        ...
    timer.seconds  # {"field": 0.123, ...}

Each stage is an NVTX range (visible in Nsight Systems) when CUDA is available; with
``sync=True`` (the default) the device is synchronised at both ends, so the seconds are wall-clock
time of the work, not of its launch.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path

import torch


class StageTimer:
    """Accumulates wall-clock seconds per named stage (a repeated name adds up)."""

    def __init__(self, sync: bool = True) -> None:
        self.sync = sync
        self.seconds: dict[str, float] = {}

    def _synchronize(self) -> None:
        if self.sync and torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        nvtx = torch.cuda.is_available()
        self._synchronize()
        if nvtx:
            torch.cuda.nvtx.range_push(name)
        start = time.perf_counter()
        try:
            yield
        finally:
            self._synchronize()
            elapsed = time.perf_counter() - start
            if nvtx:
                torch.cuda.nvtx.range_pop()
            self.seconds[name] = self.seconds.get(name, 0.0) + elapsed

    @property
    def total(self) -> float:
        return sum(self.seconds.values())

    def table(self) -> str:
        """A small text table, one stage per line, with its share of the total."""
        total = self.total or 1.0
        width = max((len(k) for k in self.seconds), default=5)
        lines = [f"{k:<{width}}  {v:8.3f} s  {100 * v / total:5.1f}%" for k, v in self.seconds.items()]
        lines.append(f"{'total':<{width}}  {self.total:8.3f} s")
        return "\n".join(lines)

    def to_json(self, path: str | Path, **extra) -> None:
        Path(path).write_text(json.dumps({"seconds": self.seconds, "total": self.total, **extra}, indent=2))


def plot_stages(
    seconds: dict[str, float],
    path: str | Path,
    title: str = "where the time goes",
    unit: str = "s",
    shares: bool = True,
) -> Path:
    """Write a horizontal bar chart (PNG) of time per stage (values in ``unit``). Needs only Pillow.

    ``shares``: the bars are parts of one whole (stages of one job): show the total and each bar's
    percentage; off for side-by-side measurements."""
    from PIL import Image, ImageDraw

    items = list(seconds.items())
    total = sum(v for _, v in items) or 1.0
    row, left, width = 28, 170, 420
    img = Image.new("RGB", (left + width + 150, row * (len(items) + 2)), "white")
    draw = ImageDraw.Draw(img)
    draw.text((10, 6), f"{title} (total {total:.3f} {unit})" if shares else title, fill="black")
    vmax = max((v for _, v in items), default=1.0) or 1.0
    palette = [(66, 133, 244), (219, 68, 55), (244, 180, 0), (15, 157, 88), (171, 71, 188), (0, 172, 193)]
    for i, (name, v) in enumerate(items):
        y = row * (i + 1) + 6
        draw.text((10, y + 4), name[:24], fill="black")
        draw.rectangle([left, y, left + int(width * v / vmax), y + row - 10], fill=palette[i % len(palette)])
        draw.text(
            (left + int(width * v / vmax) + 6, y + 4),
            f"{v:.3f} {unit}" + (f" ({100 * v / total:.0f}%)" if shares else ""),
            fill="black",
        )
    path = Path(path)
    img.save(path)
    return path
