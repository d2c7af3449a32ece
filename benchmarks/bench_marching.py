"""Marching cubes + cleanup of a density grid: the torch path (on the grid's device) against the
scikit-image path (CPU), as ``extract_mesh`` runs them.

    python benchmarks/bench_marching.py [--device cpu|cuda] [--sizes 128,256,512] [--repeats 5]
                                        [--real 128] [--threads N] [--out benchmarks/results/marching_cpu.json]

Workloads: ``blobby`` (``tests/test_marching_torch.py::blobby_field``: a lumpy ball with 24 small
floaters, ~3.4 R^2 faces) at each ``--sizes`` R, built on the device; ``ghost`` (the exact-mode
density field of ``../shared/samples/splats/dg_ghost_amd_17k.ply`` at each ``--real`` R, computed on
the device; skipped when the sample is absent).

Per workload and path, each step is timed on its own after one warm-up call, ``--repeats`` times
(wall clock; on CUDA ``torch.cuda.synchronize()`` before the clock starts and before it stops, so a
time is the device work of the step plus its host waits):

- torch: ``marching_cubes_torch`` (values on the device), ``cleanup_mesh_torch`` (on the device),
  ``to_host`` (the cleaned mesh's arrays copied to NumPy), ``total`` (the three).
- skimage: ``to_host`` (the grid copied to NumPy; 0 on the CPU), ``marching_cubes_on_grid``
  (Lewiner), ``cleanup_mesh_with_stats`` (with the grid's merge search), ``total``.

The table gives the median (and minimum) milliseconds; the JSON also has every repeat, the mesh
counts of both paths, the CUDA allocator's peak over a torch call and the speed-up of the totals.
The two paths' meshes differ only where Lewiner's and Lorensen's triangulations differ (ambiguous
cubes); their face counts are in the JSON.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

from _common import hardware, save_result  # benchmarks/ is on sys.path when run as a script

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / ".." / "shared" / "samples"


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(device: torch.device, fn, *args):
    """(result, milliseconds) of one call, the device synchronised before and after."""
    sync(device)
    t = time.perf_counter()
    out = fn(*args)
    sync(device)
    return out, 1e3 * (time.perf_counter() - t)


def workloads(args, device: torch.device):
    """Yields (name, R, values [R, R, R] float32 on ``device``, origin, spacing)."""
    from microdreamer.synthetic import blobby_field

    for r in args.sizes:
        yield "blobby", r, blobby_field(r, seed=0, device=device), -np.ones(3), 2.0 / (r - 1)
    path = SAMPLES / "splats" / "dg_ghost_amd_17k.ply"
    if args.real and not path.exists():
        print(f"ghost: sample splat not found at {path}; skipped", file=sys.stderr)
        return
    from microdreamer.field import FieldConfig, density_field
    from microdreamer.splat import read_ply

    for r in args.real:
        fld = density_field(read_ply(path), FieldConfig(resolution=r), device=device)
        yield "ghost", r, fld.values, np.asarray(fld.grid.origin), np.asarray(fld.grid.spacing)


def run_torch(values, origin, spacing, config, device, repeats):
    from microdreamer.mesh import cleanup_mesh_torch, marching_cubes_torch

    times = {"marching_cubes": [], "cleanup": [], "to_host": [], "total": []}
    peak = None
    for rep in range(repeats + 1):
        if device.type == "cuda" and rep == 1:
            torch.cuda.reset_peak_memory_stats(device)
            base = torch.cuda.memory_allocated(device)
        (raw, grid), t_mc = timed(
            device, marching_cubes_torch, values, config.threshold, origin, spacing, config.close_boundary
        )
        (clean, stats), t_cl = timed(device, cleanup_mesh_torch, raw, config, grid)
        mesh, t_host = timed(device, clean.to_mesh)
        if device.type == "cuda" and rep == 1:
            peak = (torch.cuda.max_memory_allocated(device) - base) / 2**20
        del raw, grid, clean
        if rep == 0:
            continue  # warm-up
        for k, v in (("marching_cubes", t_mc), ("cleanup", t_cl), ("to_host", t_host)):
            times[k].append(v)
        times["total"].append(t_mc + t_cl + t_host)
    return times, stats, mesh, peak


def run_skimage(values, origin, spacing, config, device, repeats):
    from microdreamer.mesh import cleanup_mesh_with_stats, marching_cubes_on_grid

    times = {"to_host": [], "marching_cubes": [], "cleanup": [], "total": []}
    for rep in range(repeats + 1):
        host, t_host = timed(device, lambda: values.cpu().numpy())
        (raw, grid), t_mc = timed(
            device, marching_cubes_on_grid, host, config.threshold, origin, spacing, config.close_boundary
        )
        (mesh, stats), t_cl = timed(device, cleanup_mesh_with_stats, raw, config, grid)
        if rep == 0:
            continue
        for k, v in (("to_host", t_host), ("marching_cubes", t_mc), ("cleanup", t_cl)):
            times[k].append(v)
        times["total"].append(t_host + t_mc + t_cl)
    return times, stats, mesh


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--device", default="cpu", help="cpu or cuda (where the grid lives and the torch path runs)"
    )
    ap.add_argument("--sizes", default="128,256,512", help="R of the synthetic workloads")
    ap.add_argument("--real", default="128", help="R of the ghost splat's field ('' to skip)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--paths", default="torch,skimage")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    ap.add_argument(
        "--out", default=None, help="JSON path (default benchmarks/results/marching_<device>.json)"
    )
    args = ap.parse_args()
    args.sizes = [int(s) for s in args.sizes.split(",") if s]
    args.real = [int(s) for s in args.real.split(",") if s]
    paths = [p for p in args.paths.split(",") if p]
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device")
    from microdreamer.mesh import MeshConfig

    config = MeshConfig()
    rows = []
    for name, r, values, origin, spacing in workloads(args, device):
        row = {"workload": name, "R": r}
        if "torch" in paths:
            times, stats, mesh, peak = run_torch(values, origin, spacing, config, device, args.repeats)
            row["torch"] = {"ms": times, "faces_marching_cubes": stats.faces_in, "faces": mesh.num_faces,
                            "vertices": mesh.num_vertices, "components": stats.components,
                            "components_removed": stats.components_removed, "peak_MiB": peak}  # fmt: skip
        if "skimage" in paths:
            times, stats, mesh = run_skimage(values, origin, spacing, config, device, args.repeats)
            row["skimage"] = {"ms": times, "faces_marching_cubes": stats.faces_in, "faces": mesh.num_faces,
                              "vertices": mesh.num_vertices, "components": stats.components,
                              "components_removed": stats.components_removed}  # fmt: skip
        for p in paths:
            row[p]["median_ms"] = {k: round(statistics.median(v), 3) for k, v in row[p]["ms"].items()}
            row[p]["min_ms"] = {k: round(min(v), 3) for k, v in row[p]["ms"].items()}
        if len(paths) == 2:
            row["speedup_total_median"] = round(
                row["skimage"]["median_ms"]["total"] / row["torch"]["median_ms"]["total"], 2
            )
        rows.append(row)
        print(f"{name} {r}^3 done", file=sys.stderr, flush=True)
        del values
        if device.type == "cuda":
            torch.cuda.empty_cache()

    out = Path(args.out) if args.out else ROOT / "benchmarks" / "results" / f"marching_{device.type}.json"
    payload = {"device": str(device), "repeats": args.repeats, "torch_threads": torch.get_num_threads(),
               "config": vars(config), "rows": rows}  # fmt: skip
    save_result(out, payload)

    print(
        f"\nmarching cubes + cleanup, {device}, median (min) ms of {args.repeats} after warm-up; {hardware().get('gpu', hardware()['cpu'])}"
    )
    print(
        f"{'workload':>12} {'path':>8} {'faces':>9} {'to_host':>16} {'marching':>18} {'cleanup':>18} {'total':>18}"
    )
    for row in rows:
        for p in paths:
            m, n = row[p]["median_ms"], row[p]["min_ms"]
            cells = [f"{m[k]:9.1f} ({n[k]:7.1f})" for k in ("to_host", "marching_cubes", "cleanup", "total")]
            print(
                f"{row['workload'] + ' ' + str(row['R']):>12} {p:>8} {row[p]['faces']:>9} " + " ".join(cells)
            )
        if "speedup_total_median" in row:
            print(f"{'':>12} {'':>8} skimage / torch (total, median): {row['speedup_total_median']}x")
    print(f"\nwritten {out}")


if __name__ == "__main__":
    main()
