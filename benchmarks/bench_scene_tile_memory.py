"""One tile's memory (`mesh --tiles --memory GB`): the resident bytes the work of the densest tile adds
(field, marching cubes, colours), measured, against :func:`microdreamer.scene.tiles.tile_memory`'s estimate
the budget chooses the tile by, and the MemoryCounter's count (the grid arrays only).

    python benchmarks/bench_scene_tile_memory.py [--gaussians 1000000] [--tiles 48,96,128,192,256]

bench_scene.py's scene (:func:`bench_scene.scene_splat`). Each tile size runs in a fresh child process with
``MALLOC_MMAP_THRESHOLD_=131072`` (large arrays mapped and given back when freed, so that the heap the plan
freed does not hide the tile's own) after one warm-up tile and ``malloc_trim``; the peak is VmHWM reset by
``/proc/self/clear_refs`` just before the tile. Writes benchmarks/results/scene_tile_memory.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import save_result  # benchmarks/ is on sys.path when run as a script

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import ctypes, gc, json, re, sys
from pathlib import Path
import torch
from microdreamer.config import FieldConfig
from microdreamer.scene.tiles import MemoryCounter, plan_scene, tile_memory, tile_piece
from microdreamer.splat import read_splat

tile, path, level = int(sys.argv[1]), sys.argv[2], float(sys.argv[3])
plan = plan_scene(read_splat(path), FieldConfig(), tile=tile)
occupied, per = plan.occupied()
t = int(occupied[per.argmax()])

def status(key):
    return int(re.search(rf"{key}:\s+(\d+)", Path("/proc/self/status").read_text()).group(1)) * 1024

tile_piece(plan, int(occupied[0]), level, 1e-6, True)  # imports, kernels
gc.collect()
ctypes.CDLL("libc.so.6").malloc_trim(0)
Path("/proc/self/clear_refs").write_text("5")
before = status("VmRSS")
counter, seconds = MemoryCounter(), {}
piece, _ = tile_piece(plan, t, level, 1e-6, True, counter=counter, seconds=seconds)
print(json.dumps({"tile": tile, "gaussians_in_tile": int(per.max()), "faces": int(piece.faces.shape[0]),
                  "measured_bytes": status("VmHWM") - before, "estimate_bytes": tile_memory(tile, int(per.max())),
                  "counted_bytes": counter.peak, "seconds": {k: round(v, 3) for k, v in seconds.items()}}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gaussians", type=int, default=1_000_000)
    ap.add_argument("--tiles", default="48,96,128,192,256")
    ap.add_argument("--level", type=float, default=0.02, help="iso level (the 1M scene's auto level: 0.018)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "scene_tile_memory.json")
    args = ap.parse_args()
    from bench_scene import build_scene

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        ply = Path(tmp) / "scene.ply"
        built = build_scene(ply, args.gaussians)
        env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072"}
        for tile in (int(x) for x in args.tiles.split(",")):
            out = subprocess.run([sys.executable, "-c", CHILD, str(tile), str(ply), str(args.level)], env=env,
                                 capture_output=True, text=True, check=True).stdout  # fmt: skip
            row = json.loads(out.strip().splitlines()[-1])
            row["estimate_over_measured"] = round(row["estimate_bytes"] / row["measured_bytes"], 2)
            rows.append(row)
    save_result(args.out, {
        "benchmark": "one tile's added resident memory (densest tile, with colours) against tile_memory's estimate",
        "scene": built,
        "level": args.level,
        "rows": rows,
    })  # fmt: skip
    print(
        f"{'tile':>5} {'Gaussians':>10} {'faces':>8} {'measured MB':>12} {'estimate MB':>12} {'counted MB':>11} ratio"
    )
    for r in rows:
        print(f"{r['tile']:>5} {r['gaussians_in_tile']:>10} {r['faces']:>8} {r['measured_bytes'] / 1e6:>12.1f} "
              f"{r['estimate_bytes'] / 1e6:>12.1f} {r['counted_bytes'] / 1e6:>11.1f} {r['estimate_over_measured']}")  # fmt: skip
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
