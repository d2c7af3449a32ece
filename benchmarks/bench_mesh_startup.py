"""Where a ``microdreamer mesh`` process spends its wall clock before and around the work: each part in
fresh processes (``--reps`` times, the median reported), so the CLI's wall can be split into start-up and
the in-process stages.

    python benchmarks/bench_mesh_startup.py SPLAT [--device cuda] [--reps 3] [--json FILE]

Parts, one after another in one child process: ``import torch``; the device's context (a first CUDA
tensor); ``import microdreamer.cli``; the export job's modules; our compiled kernels (``load()``, from the
cache: build them first); gsplat's CUDA extension (``gsplat.cuda._backend._C``, gsplat's own JIT loader);
the splat's read. Then the CLI itself (``microdreamer mesh SPLAT -o ... -v``): its wall clock and the stage
seconds it prints, and one more run under ``python -X importtime`` (top packages by cumulative import time).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import save_result  # benchmarks/ is on sys.path when run as a script

PARTS = r"""
import sys, time, json
t = {}
s = time.perf_counter()
import torch
t["import torch"] = time.perf_counter() - s
s = time.perf_counter()
if sys.argv[1] == "cuda":
    torch.zeros(1, device="cuda"); torch.cuda.synchronize()
t["device context"] = time.perf_counter() - s
s = time.perf_counter()
import microdreamer.cli
t["import microdreamer.cli"] = time.perf_counter() - s
s = time.perf_counter()
import microdreamer.jobs.export, microdreamer.mesh, microdreamer.texture
t["import export modules"] = time.perf_counter() - s
if sys.argv[1] == "cuda":
    s = time.perf_counter()
    from microdreamer.kernels import _backend
    _backend.load()
    t["our kernels (cached)"] = time.perf_counter() - s
    s = time.perf_counter()
    from gsplat.cuda._backend import _C
    assert _C is not None
    t["gsplat extension (cached)"] = time.perf_counter() - s
s = time.perf_counter()
from microdreamer.splat import read_splat
read_splat(sys.argv[2])
t["read splat"] = time.perf_counter() - s
print("RESULT " + json.dumps(t))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("splat", type=Path)
    ap.add_argument("--device", default="cuda", choices=["cpu", "cuda"])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    py = sys.executable
    parts: list[dict] = []
    for _ in range(args.reps):
        p = subprocess.run([py, "-c", PARTS, args.device, str(args.splat)], capture_output=True, text=True)
        m = re.search(r"^RESULT (.*)$", p.stdout, re.M)
        if not m:
            sys.exit(f"parts failed: {p.stderr[-2000:]}")
        parts.append(json.loads(m.group(1)))
    with tempfile.TemporaryDirectory() as tmp:
        cli = [py, "-m", "microdreamer.cli", "-v", "mesh", str(args.splat), "-o", f"{tmp}/m.glb",
               "--overwrite", "--device", args.device]  # fmt: skip
        walls, stages = [], []
        for _ in range(args.reps):
            s = time.perf_counter()
            p = subprocess.run(cli, capture_output=True, text=True)
            walls.append(time.perf_counter() - s)
            if p.returncode:
                sys.exit(f"cli failed: {p.stderr[-2000:]}")
            stages.append(p.stdout[-3000:] + p.stderr[-3000:])
        p = subprocess.run([py, "-X", "importtime", *cli[1:]], capture_output=True, text=True)
        top = []
        for line in p.stderr.splitlines():
            m = re.match(r"import time:\s+\d+ \|\s+(\d+) \|(\s*)(\S+)", line)
            if m and len(m.group(2)) <= 3:  # top-level and first-nested packages
                top.append((int(m.group(1)) / 1e6, m.group(3)))
        top.sort(reverse=True)
    med = {k: round(statistics.median(p[k] for p in parts), 3) for k in parts[0]}
    result = {
        "splat": args.splat.name,
        "device": args.device,
        "parts_median_seconds": med,
        "parts_sum_seconds": round(sum(med.values()), 3),
        "cli_wall_seconds": [round(w, 3) for w in walls],
        "cli_wall_median_seconds": round(statistics.median(walls), 3),
        "cli_last_output": stages[-1],
        "importtime_top_seconds": [[round(s, 3), n] for s, n in top[:25]],
    }
    for k, v in med.items():
        print(f"{k:30s} {v:7.3f} s")
    print(f"{'CLI wall (median)':30s} {result['cli_wall_median_seconds']:7.3f} s")
    for s, n in top[:12]:
        print(f"  import {n:40s} {s:6.3f} s")
    if args.json:
        save_result(args.json, result)


if __name__ == "__main__":
    main()
