"""Where the charts unwrap runs: the host CPU at several torch thread counts, or the GPU.

    python benchmarks/bench_unwrap_device.py [--cases ghost@128,guitar@256,...] [--threads 16,4,1]
                                             [--packers auto] [--repeat 3]
                                             [--out benchmarks/results/unwrap_device_h200.json]

Each case ``NAME@R`` is a shared splat meshed as ``microdreamer mesh`` meshes it (``ExportConfig``'s
field and mesh settings at resolution R, upright, on CUDA when present) and decimated to the texture
stage's face cap (50k); then :func:`microdreamer.texture.charts.unwrap_charts` at 1024^2 runs
``--repeat`` times on the CPU with each ``--threads`` count and on CUDA, on CUDA once per ``--packers``
entry (the skyline loop: ``auto``, ``numpy`` or ``compiled``; the layouts are the same). Printed per run: the median
seconds, the steps (labels, merge, charts, folds, pack, split), the charts and the atlas use; the JSON
holds every run, the command and the hardware.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from _common import save_result  # benchmarks/ is on sys.path when run as a script
from bench_export import SHARED, SPLATS, case_input, cli_mesh


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="ghost@128,creative@128,fruit@128,guitar@256")
    ap.add_argument("--threads", default="16,4,1", help="torch thread counts of the CPU runs")
    ap.add_argument("--packers", default="auto", help="the skyline loops of the CUDA runs, comma-separated")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    from microdreamer.mesh import decimate
    from microdreamer.texture.charts import unwrap_charts

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    threads_default = torch.get_num_threads()
    where = [("cpu", int(t), "auto") for t in args.threads.split(",") if t]
    if device.type == "cuda":
        where += [("cuda", threads_default, packer) for packer in args.packers.split(",")]
    rows = []
    for case in args.cases.split(","):
        name, r = case.split("@")
        if name in SHARED and not (SPLATS / SHARED[name]).exists():
            print(f"{name}: sample not found in {SPLATS}; skipped", file=sys.stderr)
            continue
        with tempfile.TemporaryDirectory() as tmp:
            mesh, cfg = cli_mesh(case_input(name, Path(tmp)), int(r), device)
        texture = cfg.texture
        if texture.max_faces is not None and mesh.num_faces > texture.max_faces:
            mesh = decimate(mesh, texture.max_faces)
        row = {"case": case, "faces": mesh.num_faces, "runs": {}}
        for dev, threads, packer in where:
            torch.set_num_threads(threads)
            seconds, layout = [], None
            for _ in range(args.repeat + 1):  # the first run warms up (allocations, kernels)
                sync()
                t = time.perf_counter()
                layout = unwrap_charts(mesh, None, texture.size, texture.padding, device=dev, packer=packer)
                sync()
                seconds.append(time.perf_counter() - t)
            key = (
                f"{dev}_{threads}threads" if dev == "cpu" else dev if packer == "auto" else f"{dev}_{packer}"
            )
            row["runs"][key] = {
                "seconds": seconds[1:],
                "median_s": statistics.median(seconds[1:]),
                "steps_s": layout.stats["seconds"]["steps"],
                "charts": layout.stats["charts"],
                "utilization": layout.stats["utilization"],
            }
            steps = " ".join(f"{k} {v:.3f}" for k, v in layout.stats["seconds"]["steps"].items())
            print(f"{case:<14}{key:<14}{statistics.median(seconds[1:]):>8.3f} s   {steps}", flush=True)
        torch.set_num_threads(threads_default)
        rows.append(row)
    if args.out:
        save_result(args.out, {"rows": rows})
    keys = list(rows[0]["runs"]) if rows else []
    print("\nmedian seconds of unwrap_charts (50k-face cap, 1024^2)")
    print(f"{'case':<14}{'faces':>8}" + "".join(f"{k:>16}" for k in keys) + f"{'charts':>8}")
    for row in rows:
        print(f"{row['case']:<14}{row['faces']:>8}" + "".join(f"{row['runs'][k]['median_s']:>16.3f}" for k in keys)
              + f"{row['runs'][keys[-1]]['charts']:>8}")  # fmt: skip


if __name__ == "__main__":
    main()
