"""Decimation of large marching-cubes meshes: edge collapse alone against clustering first (CPU and GPU).

    python benchmarks/bench_decimate.py [--cases synth1M@512,guitar@512,ghost@256] [--target 50000]
                                        [--out benchmarks/results/decimate_h200.json]

Each case ``NAME@R`` (a shared splat, or ``synthNk`` / ``synthNM``: ``make_synthetic_object`` seeded as in
bench_export) is meshed as ``microdreamer mesh`` meshes it (ExportConfig's field and mesh settings at
resolution R, on CUDA when present), then decimated to ``--target`` faces three ways:

* ``collapse``: fast_simplification's edge collapse alone (``decimate(mesh, target)``, on the CPU);
* ``cluster_cuda``: :func:`microdreamer.mesh.cluster.cluster_decimate` on the GPU to 4x the target,
  then edge collapse (``decimate(mesh, target, device="cuda")``, what the texture stage does on CUDA);
* ``cluster_cpu``: the same clustering on the CPU, then edge collapse.

Per way: seconds (median of ``--repeat``), faces, the symmetric Chamfer distance to the full mesh
(mean of both directions' nearest-point distances between 200k surface samples, in % of the full
mesh's bounding-box diagonal), and the share of edges with other than two faces.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from _common import save_result  # benchmarks/ is on sys.path when run as a script
from bench_export import SHARED, SPLATS, case_input, cli_mesh


def chamfer_percent(a, b, n: int = 200_000, seed: int = 0) -> float:
    import trimesh
    from scipy.spatial import cKDTree

    ta, tb = (
        trimesh.Trimesh(a.vertices, a.faces, process=False),
        trimesh.Trimesh(b.vertices, b.faces, process=False),
    )
    pa = trimesh.sample.sample_surface(ta, n, seed=seed)[0]
    pb = trimesh.sample.sample_surface(tb, n, seed=seed + 1)[0]
    d = 0.5 * (cKDTree(pb).query(pa)[0].mean() + cKDTree(pa).query(pb)[0].mean())
    return float(100 * d / np.linalg.norm(a.vertices.max(0) - a.vertices.min(0)))


def odd_edges(mesh) -> float:
    f = mesh.faces
    e = np.sort(np.concatenate([f[:, [0, 1]], f[:, [1, 2]], f[:, [2, 0]]]), 1)
    _, count = np.unique(e, axis=0, return_counts=True)
    return float((count != 2).mean())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="synth1M@512,guitar@512,ghost@256")
    ap.add_argument("--target", type=int, default=50_000)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    from microdreamer.mesh import decimate
    from microdreamer.mesh.cluster import cluster_decimate

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    ways = {"collapse": lambda m: decimate(m, args.target)}
    if device.type == "cuda":
        ways["cluster_cuda"] = lambda m: decimate(m, args.target, device="cuda")
    ways["cluster_cpu"] = lambda m: decimate(cluster_decimate(m, 4 * args.target, "cpu"), args.target)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for case in args.cases.split(","):
            name, r = case.split("@")
            if name in SHARED and not (SPLATS / SHARED[name]).exists():
                print(f"{name}: sample not found in {SPLATS}; skipped", file=sys.stderr)
                continue
            mesh, _ = cli_mesh(case_input(name, Path(tmp)), int(r), device)
            row = {"case": case, "faces_in": mesh.num_faces, "ways": {}}
            for way, fn in ways.items():
                fn(mesh)  # warm-up (kernels, first allocations)
                seconds = []
                for _ in range(args.repeat):
                    if device.type == "cuda":
                        torch.cuda.synchronize()
                    t = time.perf_counter()
                    out = fn(mesh)
                    seconds.append(time.perf_counter() - t)
                row["ways"][way] = {
                    "seconds": seconds,
                    "median_s": statistics.median(seconds),
                    "faces": out.num_faces,
                    "chamfer_percent": chamfer_percent(mesh, out),
                    "non_manifold_edges": odd_edges(out),
                }
                w = row["ways"][way]
                print(f"{case:<14}{way:<14}{w['median_s']:>8.3f} s {w['faces']:>8} faces  chamfer "
                      f"{w['chamfer_percent']:.4f} %  odd edges {100 * w['non_manifold_edges']:.3f} %", flush=True)  # fmt: skip
            rows.append(row)
    if args.out:
        save_result(args.out, {"rows": rows})
    print(
        f"\ndecimation to {args.target:,} faces: median seconds (Chamfer to the full mesh, % of its diagonal)"
    )
    for row in rows:
        cells = "  ".join(
            f"{k} {v['median_s']:.3f} s ({v['chamfer_percent']:.4f} %)" for k, v in row["ways"].items()
        )
        print(f"{row['case']:<14}{row['faces_in']:>10,} faces  {cells}")


if __name__ == "__main__":
    main()
