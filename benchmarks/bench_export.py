"""Wall-clock time of `microdreamer mesh --texture none` (splat -> field -> mesh -> file), Python
start-up included, on this machine (the texture stage is timed by bench_bake.py).

    python benchmarks/bench_export.py [--splat PATH] [--resolution 128] [--repeat 3]

Runs the installed console script in a fresh process per repetition, for both field modes, and
writes benchmarks/results/export_cpu.json (median wall seconds, the per-stage seconds the command
printed, the exact commands, and the hardware).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import hardware  # benchmarks/ is on sys.path when run as a script

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SPLAT = ROOT / ".." / "shared" / "samples" / "splats" / "dg_ghost_amd_17k.ply"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--splat", type=Path, default=DEFAULT_SPLAT)
    ap.add_argument("--resolution", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "export_cpu.json")
    args = ap.parse_args()
    if not args.splat.exists():
        sys.exit(f"error: {args.splat}: not found (the sample splats live in ../shared/samples/splats)")
    exe = shutil.which("microdreamer") or sys.exit("error: the microdreamer command is not installed")
    hw = hardware()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for mode in ("exact", "upstream"):
            cmd = [exe, "mesh", str(args.splat), "-o", f"{tmp}/mesh.glb", "--resolution", str(args.resolution),
                   "--mode", mode, "--device", "cpu", "--texture", "none"]  # fmt: skip
            walls, stages = [], []
            for _ in range(args.repeat):
                t = time.perf_counter()
                proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
                walls.append(time.perf_counter() - t)
                m = re.search(r"seconds: (.*)", proc.stdout)
                stages.append({k: float(v) for k, v in (kv.split() for kv in m.group(1).split(", "))})
            rows.append({
                "mode": mode,
                "command": " ".join(["microdreamer", *cmd[1:]]).replace(tmp, "OUT"),
                "wall_seconds_median": statistics.median(walls),
                "wall_seconds": walls,
                "stage_seconds_last": stages[-1],
            })  # fmt: skip
    result = {"benchmark": "microdreamer mesh, CPU, wall clock including Python start-up",
              "script_command": "python " + " ".join(sys.argv), "splat": args.splat.name,
              "resolution": args.resolution, "hardware": hw, "results": rows}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{'mode':<10} {'wall (median)':>14}  stages (last run)")
    for r in rows:
        stages = ", ".join(f"{k} {v:.2f}" for k, v in r["stage_seconds_last"].items())
        print(f"{r['mode']:<10} {r['wall_seconds_median']:>12.2f} s  {stages}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
