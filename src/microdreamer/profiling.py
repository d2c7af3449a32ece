"""Per-stage timings with NVTX ranges, and a chart of where the time goes.

Usage::

    timer = StageTimer()
    with timer.stage("field"):
        ...
    timer.seconds  # {"field": 0.123, ...}

Each stage is an NVTX range (visible in Nsight Systems) when CUDA is available; with
``sync=True`` (the default) the device is synchronised at both ends, so the seconds are wall-clock
time of the work, not of its launch.

Reports (Pillow only): :func:`plot_stages` (one bar chart); :func:`write_profile` (``profile.json``
and ``profile.png``: per-stage seconds, shares and each stage's Amdahl bound, :func:`amdahl_bounds`);
:func:`plot_scaling` (Gustafson's view: stage seconds and shares against the grid resolution).
"""

from __future__ import annotations

import contextlib
import json
import math
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


# ------------------------------------------------------------------ reports: Amdahl and Gustafson views
_PALETTE = [(66, 133, 244), (219, 68, 55), (244, 180, 0), (15, 157, 88), (171, 71, 188), (0, 172, 193),
            (255, 112, 67), (158, 157, 36), (92, 107, 192), (240, 98, 146)]  # fmt: skip


def _font(size: int):
    """Pillow's bundled font at ``size`` px (FreeType), or its fixed bitmap font where that is missing."""
    from PIL import ImageFont

    try:
        return ImageFont.load_default(size=size)
    except (TypeError, OSError, ImportError):  # Pillow < 10.1, or built without FreeType
        return ImageFont.load_default()


def _check_seconds(seconds: dict[str, float], what: str) -> dict[str, float]:
    out = {}
    for name, value in seconds.items():
        v = float(value)
        if not math.isfinite(v) or v < 0:
            raise ValueError(f"{what}: stage {name!r} has {value!r} seconds; need a finite number >= 0")
        out[str(name)] = v
    return out


def amdahl_bounds(seconds: dict[str, float]) -> dict[str, dict[str, float | None]]:
    """Amdahl's bound per stage: what the total would be if that stage cost nothing, and the speed-up.

    For total ``T`` and a stage of ``s`` seconds: ``share = s / T``, ``total_without = T - s``,
    ``speedup = T / (T - s) = 1 / (1 - share)`` (None when the stage is all of the time, i.e. no
    bound). A zero total gives shares 0 and speed-ups 1.

    Raises:
        ValueError: a stage's seconds are negative or not finite.
    """
    seconds = _check_seconds(seconds, "amdahl_bounds")
    total = sum(seconds.values())
    out: dict[str, dict[str, float | None]] = {}
    for name, s in seconds.items():
        rest = total - s
        out[name] = {
            "seconds": s,
            "share": s / total if total > 0 else 0.0,
            "total_without": rest,
            "speedup": (total / rest if rest > 0 else None) if total > 0 else 1.0,
        }
    return out


def write_profile(
    seconds: dict[str, float],
    out_dir: str | Path,
    title: str = "where the time goes",
    extra: dict | None = None,
    name: str = "profile",
) -> tuple[Path, Path]:
    """Write ``{name}.json`` and ``{name}.png`` (``profile.json``, ``profile.png``) of one job's per-stage
    seconds into ``out_dir``.

    ``profile.json``: ``{"title", "seconds": {stage: s}, "total", "amdahl": {stage: {"seconds",
    "share", "total_without", "speedup"}}, "extra": extra}`` (see :func:`amdahl_bounds`; a speed-up
    with no bound is ``null``). ``profile.png``: the seconds as bars with their shares, and beside them
    each stage's Amdahl speed-up. Both written atomically.

    Raises:
        ValueError: no stages, or a stage's seconds are negative or not finite.
    """
    from microdreamer.io_utils import atomic_path

    seconds = _check_seconds(seconds, "write_profile")
    if not seconds:
        raise ValueError("write_profile: no stages to report; give at least one stage's seconds")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    bounds = amdahl_bounds(seconds)
    report = {"title": title, "seconds": seconds, "total": sum(seconds.values()), "amdahl": bounds,
              "extra": extra or {}}  # fmt: skip
    json_path, png_path = out_dir / f"{name}.json", out_dir / f"{name}.png"
    with atomic_path(json_path) as tmp:
        tmp.write_text(json.dumps(report, indent=2))
    image = _profile_image(seconds, bounds, title)
    with atomic_path(png_path) as tmp:
        image.save(tmp, format="PNG")
    return json_path, png_path


def _profile_image(seconds: dict[str, float], bounds: dict, title: str):
    """Two bar charts side by side: seconds (with shares) and Amdahl speed-up per stage."""
    from PIL import Image, ImageDraw

    font, bold = _font(13), _font(15)
    total = sum(seconds.values())
    names = list(seconds)
    row, top, label_w, bar_w, text_w = 26, 58, 150, 300, 150
    panel_w = label_w + bar_w + text_w
    width, height = 2 * panel_w + 30, top + row * len(names) + 20
    img = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(img)
    draw.text((10, 8), f"{title}  (total {total:.3f} s)", fill="black", font=bold)
    draw.text((10, 34), "seconds per stage (share of the total)", fill=(90, 90, 90), font=font)
    x1 = panel_w + 20
    draw.text(
        (x1, 34), "Amdahl: speed-up of the whole if the stage cost nothing", fill=(90, 90, 90), font=font
    )
    vmax = max(seconds.values()) or 1.0
    finite = [b["speedup"] for b in bounds.values() if b["speedup"] is not None]
    smax = max(finite + [1.0])
    for i, name in enumerate(names):
        y = top + row * i
        colour = _PALETTE[i % len(_PALETTE)]
        s, b = seconds[name], bounds[name]
        for x0 in (10, x1):
            draw.text((x0, y + 4), name[:22], fill="black", font=font)
        length = int(round(bar_w * s / vmax))
        draw.rectangle([10 + label_w, y + 3, 10 + label_w + length, y + row - 5], fill=colour)
        draw.text((10 + label_w + length + 6, y + 4), f"{s:.3f} s ({100 * b['share']:.1f}%)", fill="black",
                  font=font)  # fmt: skip
        if b["speedup"] is None:
            length, text = bar_w, "no bound (all of the time)"
        else:
            # bars start at 1x: a stage that costs nothing gives no speed-up
            length = int(round(bar_w * (b["speedup"] - 1.0) / (smax - 1.0))) if smax > 1.0 else 0
            text = f"x{b['speedup']:.2f} ({b['total_without']:.3f} s)"
        draw.rectangle([x1 + label_w, y + 3, x1 + label_w + max(length, 1), y + row - 5], fill=colour)
        draw.text((x1 + label_w + length + 6, y + 4), text, fill="black", font=font)
    return img


def plot_scaling(rows: list[dict], path: str | Path, title: str = "stage seconds against grid size") -> Path:
    """Gustafson's view of a conversion: each stage's seconds against the grid resolution, and its share.

    Args:
        rows: one per run, ``{"resolution": R, "seconds": {stage: s, ...}}`` (e.g. R = 128 ... 1024;
            stages such as field, mesh, texture), in any order; a stage missing from a row is left out
            of that row.
        path: the PNG to write (atomically).

    Left: seconds per stage and their total against R, both axes logarithmic (x labelled R^3). Right:
    one bar per R stacked from the stages' shares of that run's total.

    Raises:
        ValueError: no rows, a row without ``resolution`` (an integer >= 2) or ``seconds``, or
            negative / non-finite seconds.
    """
    from PIL import Image, ImageDraw

    from microdreamer.io_utils import atomic_path

    if not rows:
        raise ValueError("plot_scaling: no rows; give one {'resolution': R, 'seconds': {...}} per run")
    runs = []
    for i, r in enumerate(rows):
        res, secs = r.get("resolution"), r.get("seconds")
        if not isinstance(res, int) or res < 2 or not isinstance(secs, dict):
            raise ValueError(
                f"plot_scaling: row {i} needs 'resolution' (an integer >= 2) and a 'seconds' dict"
            )
        runs.append((res, _check_seconds(secs, f"plot_scaling row {i}")))
    runs.sort(key=lambda t: t[0])
    stages = list(dict.fromkeys(k for _, secs in runs for k in secs))
    colour = {k: _PALETTE[i % len(_PALETTE)] for i, k in enumerate(stages)}

    font, bold = _font(12), _font(15)
    W, H = 980, 470
    img = Image.new("RGB", (W, H), "white")
    draw = ImageDraw.Draw(img)
    draw.text((10, 8), title, fill="black", font=bold)

    # left: log-log lines
    ax0, ay0, aw, ah = 70, 50, 440, 330  # plot area (x, y of the top left corner, width, height)
    draw.text((ax0, ay0 - 18), "seconds (log) per stage and total", fill=(90, 90, 90), font=font)
    values = [v for _, secs in runs for v in list(secs.values()) + [sum(secs.values())] if v > 0]
    lo, hi = (min(values), max(values)) if values else (1e-3, 1.0)
    ylo, yhi = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    yhi = max(yhi, ylo + 1)
    xs = [math.log2(r) for r, _ in runs]
    xlo, xhi = (min(xs), max(xs)) if len(set(xs)) > 1 else (xs[0] - 1, xs[0] + 1)

    def px(res: int) -> float:
        return ax0 + aw * (math.log2(res) - xlo) / (xhi - xlo)

    def py(v: float) -> float:
        return ay0 + ah * (1 - (math.log10(v) - ylo) / (yhi - ylo))

    draw.rectangle([ax0, ay0, ax0 + aw, ay0 + ah], outline=(160, 160, 160))
    for e in range(ylo, yhi + 1):
        y = py(10.0**e)
        draw.line([ax0, y, ax0 + aw, y], fill=(228, 228, 228))
        draw.text((ax0 - 8, y), f"{10.0**e:g} s", fill="black", font=font, anchor="rm")
    for res, _ in runs:
        x = px(res)
        draw.line([x, ay0, x, ay0 + ah], fill=(228, 228, 228))
        draw.text((x, ay0 + ah + 9), f"{res}^3", fill="black", font=font, anchor="ma")
    series = [(k, colour[k], [(px(r), py(s[k])) for r, s in runs if k in s and s[k] > 0]) for k in stages]
    series.append(
        ("total", (40, 40, 40), [(px(r), py(sum(s.values()))) for r, s in runs if sum(s.values()) > 0])
    )
    for _, c, points in series:
        if len(points) > 1:
            draw.line(points, fill=c, width=3)
        for x, y in points:
            draw.ellipse([x - 4, y - 4, x + 4, y + 4], fill=c)

    # right: stacked shares
    bx0, bw = 590, 360
    draw.text((bx0, ay0 - 18), "share of each run's total", fill=(90, 90, 90), font=font)
    slot = bw / len(runs)
    for j, (res, secs) in enumerate(runs):
        total = sum(secs.values())
        x = bx0 + j * slot + slot * 0.15
        y = ay0 + ah
        for k in stages:
            if total <= 0 or secs.get(k, 0.0) <= 0:
                continue
            share = secs[k] / total
            h = ah * share
            draw.rectangle([x, y - h, x + slot * 0.7, y], fill=colour[k])
            if h > 16:
                draw.text(
                    (x + slot * 0.35, y - h / 2), f"{100 * share:.0f}%", fill="white", font=font, anchor="mm"
                )
            y -= h
        draw.text((x + slot * 0.35, ay0 + ah + 6), f"{res}^3", fill="black", font=font, anchor="ma")

    # legend
    lx, ly = ax0, H - 50
    for k, c, _ in series:
        draw.rectangle([lx, ly, lx + 14, ly + 14], fill=c)
        draw.text((lx + 20, ly + 1), k, fill="black", font=font)
        lx += 40 + int(draw.textlength(k, font=font))
        if lx > W - 120:
            lx, ly = ax0, ly + 20
    path = Path(path)
    with atomic_path(path) as tmp:
        img.save(tmp, format="PNG")
    return path
