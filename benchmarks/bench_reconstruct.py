"""Benchmarks of Gaussian rendering and reconstruction.

    python benchmarks/bench_reconstruct.py step [--out FILE] [--n 5000 50000] [--views 6] [--size 256]
    python benchmarks/bench_reconstruct.py spot [--out FILE] [--workdir DIR] [--iters 2000]
    python benchmarks/bench_reconstruct.py sweep --splat SPLAT.ply --data DATASET [--levels ...]

``step``: one 6-view 256^2 forward + backward of the renderer (loss = sum of RGB and alpha), per
backend and splat size, and one full :meth:`GaussianTrainer.step` (render, L1 + alpha loss, backward,
Adam, gradient statistics); CUDA-event medians after warm-up, peak memory above the inputs.

``spot``: issue 4's must-show: render 32 + 4 held-out 256^2 views of Keenan Crane's Spot (the read-only
``../shared/samples/meshes/spot``, or ``--mesh``/``--texture``), reconstruct, extract the mesh, and
compare it with the ground truth (Chamfer-L1 and F-score at 1% of the bounding-box diagonal), also
re-meshing the same splat at several iso-levels. ``sweep``: that re-meshing alone, for a saved splat.

The table is printed last; the JSON holds every number, the command line and the hardware.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]

from _common import hardware, time_ms  # noqa: E402  (benchmarks/ is on sys.path when run as a script)
from microdreamer.cameras import orbit_cameras  # noqa: E402
from microdreamer.render import render  # noqa: E402
from microdreamer.splat import Splat  # noqa: E402
from microdreamer.synthetic import random_sh_splat  # noqa: E402

SPOT = ROOT / ".." / "shared" / "samples" / "meshes" / "spot"


def time_cuda(fn, warmup: int = 10, reps: int = 50) -> dict:
    """Median/p10/p90 milliseconds of ``fn()`` by CUDA events (CPU wall clock without CUDA)."""
    times = time_ms(fn, warmup, reps)
    times.sort()
    return {
        "median_ms": statistics.median(times),
        "p10_ms": times[len(times) // 10],
        "p90_ms": times[(9 * len(times)) // 10],
        "reps": reps,
    }


def bench_step(args) -> dict:
    from microdreamer.train import GaussianTrainer, TrainConfig

    device = "cuda" if torch.cuda.is_available() else "cpu"
    el = torch.linspace(-30, 30, args.views)
    az = torch.arange(args.views) * (360.0 / args.views)
    cams = orbit_cameras(el, az, width=args.size, height=args.size).to(device)
    rows = []
    for n in args.n:
        base = random_sh_splat(n, seed=0, spread=0.4, log_scale=-4.0, device=device)
        targets = torch.rand(args.views, args.size, args.size, 4, device=device)
        for backend in args.backends:
            if backend == "gsplat" and device != "cuda":
                continue
            params = {k: v.clone().requires_grad_(True) for k, v in base.tensors().items()}

            def fwd_bwd(params=params, backend=backend):
                out = render(Splat(**params), cams, backend=backend)
                (out.rgb.sum() + out.alpha.sum()).backward()

            if device == "cuda":
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                before = torch.cuda.memory_allocated()
            reps = args.reps if backend == "gsplat" else max(5, args.reps // 5)
            row = {
                "what": "render fwd+bwd",
                "backend": backend,
                "n": n,
                "views": args.views,
                "size": args.size,
            }
            row.update(time_cuda(fwd_bwd, warmup=5, reps=reps))
            if device == "cuda":
                row["peak_mem_mb"] = (torch.cuda.max_memory_allocated() - before) / 2**20
            rows.append(row)
            print(row, flush=True)

            cfg = TrainConfig(
                backend=backend, densify_start_iter=10**9, lambda_alpha=1.0, random_background=True
            )
            trainer = GaussianTrainer(base, cfg)
            row = {"what": "trainer step", "backend": backend, "n": n, "views": args.views, "size": args.size}
            row.update(time_cuda(lambda t=trainer, x=targets: t.step(x, cams), warmup=5, reps=reps))
            rows.append(row)
            print(row, flush=True)
    return {"rows": rows}


def level_sweep(splat, gt, levels, device) -> dict:
    """Mesh metrics of one splat's density field meshed at several iso-levels."""
    from microdreamer.field import FieldConfig, density_field
    from microdreamer.mesh import MeshConfig, extract_mesh
    from microdreamer.metrics import mesh_metrics

    fld = density_field(splat, FieldConfig(), device=device)
    sweep = {}
    for level in levels:
        try:
            m, _ = extract_mesh(
                fld.values.cpu().numpy(), fld.grid.origin, fld.grid.spacing, MeshConfig(threshold=level)
            )
            sweep[str(level)] = mesh_metrics(m, gt, n=100_000, tau_fractions=(0.01,))
        except ValueError as e:  # a level the field never crosses, or an empty mesh
            sweep[str(level)] = {"error": str(e)}
    return sweep


def export_variants(splat, gt, device) -> dict:
    """Mesh metrics of one splat meshed as the export meshes it (:func:`splat_to_mesh`: iso-level auto),
    with and without silhouette carving, at the auto and the 128^3 grid."""
    from microdreamer.field import FieldConfig
    from microdreamer.jobs.export import splat_to_mesh
    from microdreamer.mesh import MeshConfig
    from microdreamer.metrics import mesh_metrics

    out = {}
    for resolution in ("auto", 128):
        for carve, level in ((0, 1.0), (24, 0.5), (24, 0.75), (24, 1.0)):
            key = f"R{resolution}_carve{carve}_level{level}"
            conv = splat_to_mesh(splat.to(device), FieldConfig(resolution=resolution),
                                 MeshConfig(threshold="auto", carve=carve, carve_level=level), torch.device(device))  # fmt: skip
            out[key] = {"grid": conv.resolution, "iso_level": conv.iso_level, "faces": conv.mesh.num_faces,
                        **mesh_metrics(conv.mesh, gt, n=100_000, tau_fractions=(0.01,))}  # fmt: skip
    return out


def bench_sweep(args) -> dict:
    """Re-mesh a saved splat (e.g. the H200 spot reconstruction) at several iso-levels."""
    from microdreamer.data import load_dataset
    from microdreamer.mesh.load import load_textured_mesh
    from microdreamer.splat import read_ply

    mesh_path = Path(args.mesh) if args.mesh else SPOT / "spot_triangulated.obj"
    texture = Path(args.texture) if args.texture else SPOT / "spot_texture.png"
    norm = load_dataset(args.data).normalization
    gt = load_textured_mesh(mesh_path, texture).transformed(norm.center, norm.scale, norm.rotation)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    sweep = level_sweep(read_ply(args.splat), gt, args.levels, device)
    print(json.dumps(sweep, indent=2), flush=True)
    return {"splat": str(args.splat), "mesh_metrics_by_threshold": sweep}


def bench_spot(args) -> dict:
    from microdreamer.config import ReconstructJobConfig, ViewsConfig
    from microdreamer.data import load_dataset, render_views
    from microdreamer.jobs.reconstruct import reconstruct_dataset
    from microdreamer.mesh.load import load_textured_mesh
    from microdreamer.metrics import mesh_metrics
    from microdreamer.train import ReconstructConfig

    device = "cuda" if torch.cuda.is_available() else "cpu"
    mesh_path = Path(args.mesh) if args.mesh else SPOT / "spot_triangulated.obj"
    texture = Path(args.texture) if args.texture else SPOT / "spot_texture.png"
    if not mesh_path.exists():
        raise SystemExit(f"{mesh_path} not found: give --mesh and --texture")
    work = Path(args.workdir)
    data = work / "spot_views"
    t = time.perf_counter()
    render_views(mesh_path, data, ViewsConfig(views=32, size=256, seed=0), texture=texture, device=device)
    t_views = time.perf_counter() - t
    config = ReconstructConfig(iters=args.iters, densify_grad_threshold_3dgs=args.grad_3dgs)
    config.train.backend = args.backend
    config.train.opacity_reset_interval = args.reset
    out_dir = work / "spot_out"
    job = ReconstructJobConfig(reconstruct=config, frame="dataset")  # the defaults' export (iso auto)
    metrics = reconstruct_dataset(data, out_dir, job, device=device, progress=False)
    norm = load_dataset(data).normalization
    gt = load_textured_mesh(mesh_path, texture).transformed(norm.center, norm.scale, norm.rotation)
    import trimesh

    pred = trimesh.load(out_dir / "mesh.glb", force="mesh")
    mm = mesh_metrics(pred, gt, n=100_000, tau_fractions=(0.01,))
    # the same splat's field meshed at fixed iso-levels (the reconstruction's default is auto)
    from microdreamer.splat import read_ply

    sweep = level_sweep(read_ply(out_dir / "splat.ply"), gt, args.levels, device)
    variants = export_variants(read_ply(out_dir / "splat.ply"), gt, device)
    result = {
        "render_views_s": t_views,
        "psnr_held_out": metrics["psnr"],
        "ssim_held_out": metrics["ssim"],
        "train_psnr": metrics["train_psnr"],
        "num_gaussians": metrics["num_gaussians"],
        "seconds": metrics["seconds"],
        "mesh": metrics["mesh"],
        "mesh_metrics": mm,
        "mesh_metrics_by_threshold": sweep,
        "mesh_metrics_by_export_setting": variants,
        "densify_grad_threshold": metrics["densify_grad_threshold"],
        "densify_grad_threshold_3dgs": args.grad_3dgs,
        "opacity_reset_interval": args.reset,
        "iters": args.iters,
        "backend": metrics["render_backend"],
    }
    print(json.dumps(result, indent=2), flush=True)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=["step", "spot", "sweep"])
    ap.add_argument("--out", default=None, help="JSON file to write")
    ap.add_argument("--n", type=int, nargs="+", default=[5000, 50000])
    ap.add_argument("--views", type=int, default=6)
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--backends", nargs="+", default=["gsplat", "torch"])
    ap.add_argument("--workdir", default="/tmp/bench_reconstruct")
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--mesh", default=None)
    ap.add_argument("--texture", default=None)
    ap.add_argument("--backend", default="auto", help="spot: render backend of the reconstruction")
    ap.add_argument("--splat", default=None, help="sweep: the splat PLY to re-mesh")
    ap.add_argument("--data", default=None, help="sweep: its render-views dataset (for the normalisation)")
    ap.add_argument(
        "--grad-3dgs", type=float, default=0.0002, help="spot: densification threshold (3DGS units)"
    )
    ap.add_argument("--reset", type=int, default=500, help="spot: opacity reset interval (0: none)")
    ap.add_argument(
        "--levels", type=float, nargs="*", default=[0.5, 1.0, 2.0], help="spot: iso-levels to sweep"
    )
    args = ap.parse_args()
    result = {"step": bench_step, "spot": bench_spot, "sweep": bench_sweep}[args.mode](args)
    doc = {"command": "python " + shlex.join(sys.argv), "hardware": hardware(), **result}
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(doc, indent=2))
    if args.mode == "step":
        print(f"\n{'what':<16} {'backend':<8} {'N':>7} {'median ms':>10} {'p90 ms':>8} {'peak MB':>8}")
        for r in result["rows"]:
            peak = r.get("peak_mem_mb", float("nan"))
            print(
                f"{r['what']:<16} {r['backend']:<8} {r['n']:>7} {r['median_ms']:>10.3f} {r['p90_ms']:>8.3f} {peak:>8.1f}"
            )


if __name__ == "__main__":
    main()
