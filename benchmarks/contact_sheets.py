"""Before/after pictures of issue 28 (a new user's first hour), written to docs/issue28/.

Runs the command line of two source trees, ``--before`` (e.g. main's ``src``, from ``git archive main
src | tar -x -C /tmp/main``) and this checkout's ``src``, on the shared samples:

* ``cow_render_views.png``: ``render-views`` of Spot without its texture (an uncoloured OBJ): before, flat
  grey silhouettes; after, shaded by the dataset's fixed light (8 of the dataset's views);
* ``guitar_render.png``: ``render`` of the y-down PlayCanvas guitar: before, upside down; after, with
  ``--up -y``, upright;
* ``demo_sheet_before.png`` / ``demo_sheet_after.png``: the demo's ``mesh_views.png`` from two demo
  output folders given with ``--demo-before`` / ``--demo-after`` (copied), and the after run's
  ``held_out_views.png`` as ``demo_held_out_after.png``.

    python benchmarks/contact_sheets.py --before /tmp/main/src --demo-before /tmp/demo_before \\
        --demo-after /tmp/demo_after
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / ".." / "shared" / "samples"


def cli(src: Path, *args: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(src)}
    cmd = [sys.executable, "-m", "microdreamer.cli", *map(str, args)]
    print("$", "PYTHONPATH=" + str(src), " ".join(cmd[1:]), flush=True)
    subprocess.run(cmd, env=env, check=True)


def dataset_strip(folder: Path, count: int = 8) -> list[np.ndarray]:
    """The first ``count`` views of a render-views dataset, composited on white, uint8 RGB."""
    frames = []
    for path in sorted((folder / "images").glob("*.png"))[:count]:
        rgba = np.asarray(Image.open(path).convert("RGBA")).astype(np.float32) / 255
        rgb = rgba[..., :3] * rgba[..., 3:] + (1 - rgba[..., 3:])
        frames.append((rgb * 255 + 0.5).astype(np.uint8))
    return frames


def sheet_rows(path: Path, size: int) -> list[np.ndarray]:
    """The views of a ``render`` contact sheet (4 columns of size x size), in order."""
    sheet = np.asarray(Image.open(path).convert("RGB"))
    return [
        sheet[r * size : (r + 1) * size, c * size : (c + 1) * size]
        for r in range(sheet.shape[0] // size)
        for c in range(sheet.shape[1] // size)
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=Path, required=True, help="the src folder of the code before")
    ap.add_argument("--after", type=Path, default=ROOT / "src")
    ap.add_argument("--demo-before", type=Path, default=None)
    ap.add_argument("--demo-after", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "issue28")
    ap.add_argument("--size", type=int, default=160)
    args = ap.parse_args()
    from microdreamer.jobs.turntable import save_labelled_sheet

    args.out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp())
    cow = SAMPLES / "meshes" / "spot" / "spot_triangulated.obj"
    rows = []
    for name, src in (("before", args.before), ("after", args.after)):
        cli(src, "render-views", cow, "-o", tmp / f"cow_{name}", "--views", 8, "--held-out", 0,
            "--size", args.size, "--device", "cpu")  # fmt: skip
        rows.append(dataset_strip(tmp / f"cow_{name}"))
    save_labelled_sheet(args.out / "cow_render_views.png", rows, ["before", "after"], None,
                        "render-views spot_triangulated.obj (no texture given): 8 dataset views")  # fmt: skip

    guitar = SAMPLES / "splats" / "pc_guitar_91k_sh0.decoded.ply"
    cli(
        args.before, "render", guitar, "-o", tmp / "guitar_before.png", "--size", args.size, "--device", "cpu"
    )
    cli(args.after, "render", guitar, "-o", tmp / "guitar_after.png", "--size", args.size, "--up", "-y",
        "--device", "cpu")  # fmt: skip
    rows = [sheet_rows(tmp / f"guitar_{n}.png", args.size) for n in ("before", "after")]
    save_labelled_sheet(args.out / "guitar_render.png", rows, ["before", "after --up -y"], None,
                        "render pc_guitar_91k_sh0.decoded.ply (a y-down capture): 8 azimuths")  # fmt: skip

    for flag, name in ((args.demo_before, "before"), (args.demo_after, "after")):
        if flag is not None and (flag / "mesh_views.png").exists():
            shutil.copy(flag / "mesh_views.png", args.out / f"demo_sheet_{name}.png")
    if args.demo_after is not None and (args.demo_after / "held_out_views.png").exists():
        shutil.copy(args.demo_after / "held_out_views.png", args.out / "demo_held_out_after.png")
    shutil.rmtree(tmp, ignore_errors=True)
    print("wrote", ", ".join(sorted(p.name for p in args.out.glob("*.png"))))


if __name__ == "__main__":
    main()
