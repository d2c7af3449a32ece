"""``microdreamer mesh`` from two source trees, run alternately: wall clock and seconds per stage.

    python benchmarks/bench_cli_ab.py --before /tmp/before/src --rounds 3 \
        --out benchmarks/results/mesh_cpu_ab.json -- SPLAT.ply [mesh flags...]

On a shared machine the time one command takes swings several-fold with what else runs; two versions
timed one after the other in alternation, in fresh processes, see the same load. ``--before`` is a
source folder (``git archive COMMIT src | tar -x -C DIR`` makes one); the other is this checkout's
``src``. Each run is ``python -m microdreamer.cli mesh ... --profile --overwrite`` with PYTHONPATH set to
its tree; the JSON records every run's wall clock, the load average before it, and the stages its
``--profile`` printed, then the minimum and median per version. A table is printed last. Each tree first
runs ``--warmup`` untimed times (default 1), so that neither pays a one-off cost in the timed rounds (the
C++ CPU kernels of a tree whose sources differ are compiled on its first run, ``.pyc`` files written).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import save_result  # benchmarks/ is on sys.path when run as a script

ROOT = Path(__file__).resolve().parents[1]


def one_run(src: Path, args: list[str], out: Path, threads: int | None) -> dict:
    env = {**os.environ, "PYTHONPATH": str(src)}
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    cmd = [
        sys.executable,
        "-m",
        "microdreamer.cli",
        "mesh",
        *args,
        "-o",
        str(out),
        "--profile",
        "--overwrite",
    ]
    load = os.getloadavg()[0]
    t = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t
    if p.returncode != 0:
        raise SystemExit(f"error: {' '.join(cmd)} failed: {p.stderr.strip().splitlines()[-1:]}")
    profile = json.loads(out.with_suffix(".profile.json").read_text())
    return {"wall_s": wall, "load_before": load, "stages_s": profile["seconds"], "total_s": profile["total"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=Path, required=True, help="the other source tree (its src folder)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1, help="untimed runs of each tree first")
    ap.add_argument("--threads", type=int, default=None, help="OMP_NUM_THREADS for the runs (default: unset)")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("mesh_args", nargs=argparse.REMAINDER, help="-- SPLAT [mesh flags]")
    args = ap.parse_args()
    mesh_args = [a for a in args.mesh_args if a != "--"]
    trees = {"before": args.before.resolve(), "after": ROOT / "src"}
    runs: dict[str, list[dict]] = {k: [] for k in trees}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.warmup):
            for name in ("after", "before"):
                one_run(trees[name], mesh_args, Path(tmp) / f"{name}.glb", args.threads)
        for _ in range(args.rounds):
            for name in ("after", "before"):
                run = one_run(trees[name], mesh_args, Path(tmp) / f"{name}.glb", args.threads)
                runs[name].append(run)
                print(f"{name:<7} {run['wall_s']:7.2f} s (load {run['load_before']:.2f})", flush=True)
    summary = {}
    for name, rs in runs.items():
        walls = [r["wall_s"] for r in rs]
        stages = {k: statistics.median(r["stages_s"].get(k, 0.0) for r in rs) for k in rs[0]["stages_s"]}
        summary[name] = {
            "min_wall_s": min(walls),
            "median_wall_s": statistics.median(walls),
            "median_stages_s": stages,
        }
    if args.out:
        save_result(args.out, {"trees": {k: str(v) for k, v in trees.items()}, "mesh_args": mesh_args,
                               "threads": args.threads, "warmup": args.warmup, "runs": runs,
                               "summary": summary})  # fmt: skip
    names = list(summary["after"]["median_stages_s"])
    print(f"\n{'stage':<20}{'before':>9}{'after':>9}   (medians of {args.rounds} runs, seconds)")
    for k in names:
        b, a = summary["before"]["median_stages_s"].get(k, 0.0), summary["after"]["median_stages_s"][k]
        print(f"{k:<20}{b:>9.2f}{a:>9.2f}")
    for k in ("min_wall_s", "median_wall_s"):
        print(f"{k:<20}{summary['before'][k]:>9.2f}{summary['after'][k]:>9.2f}")


if __name__ == "__main__":
    main()
