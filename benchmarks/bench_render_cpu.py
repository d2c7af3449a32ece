"""CPU Gaussian renders of the bake: the torch backend against the C++ ("cpp") backend.

    python benchmarks/bench_render_cpu.py [--splat PATH] [--threads 2] [--repeat 3] [--tiles 8 16]
                                          [--out benchmarks/results/render_cpu.json]

The 26 default bake views (:class:`~microdreamer.config.BakeViewsConfig`: 512^2, framed by
:func:`~microdreamer.texture.bake.bake_cameras`) of the sample splat ``dg_ghost_amd_17k.ply``, rendered
as the bake renders them (no gradients, black background, no depth) in one call per backend, same
cameras, PyTorch at ``--threads`` threads. The framing is the bounding sphere of the Gaussians with
opacity >= 0.5 (close to the mesh's, which the texture stage frames; building the mesh is not timed here).
Each row: one warm-up, then the median wall time of ``--repeat`` renders, the process CPU time per render,
the largest difference from the torch render (rgb and alpha) and the number of pixels where it exceeds
1e-5 (tests/test_render_cpp.py's tolerance; such pixels hold a Gaussian whose alpha is within float32
rounding of 1/255, or a transmittance within rounding of 1e-4, so the two renderers' rounding decides
differently: a few pixels in millions). The load average is recorded before
and after: the machine is shared, so the walls move with it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import torch

from _common import save_result  # benchmarks/ is on sys.path when run as a script

ROOT = Path(__file__).resolve().parents[1]
SPLAT = ROOT / ".." / "shared" / "samples" / "splats" / "dg_ghost_amd_17k.ply"


def bake_views(splat):
    """The 26 default bake cameras around the splat's opaque Gaussians."""
    from microdreamer.cameras import framing
    from microdreamer.config import BakeViewsConfig
    from microdreamer.texture.bake import bake_cameras

    center, radius = framing(splat.means[splat.opacities() >= 0.5])
    return bake_cameras(BakeViewsConfig(), center, radius)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--splat", type=Path, default=SPLAT)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--tiles", type=int, nargs="+", default=[8, 16], help="tile sizes of the cpp backend")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "render_cpu.json"))
    args = ap.parse_args()

    from microdreamer.kernels import cpu
    from microdreamer.render import render
    from microdreamer.splat import read_ply

    torch.set_num_threads(args.threads)
    splat = read_ply(args.splat)
    cams = bake_views(splat)
    if not cpu.usable():
        raise SystemExit("the C++ CPU kernels do not build here (no compiler?): nothing to compare")
    load_before = list(os.getloadavg())

    def run(backend: str, tile_size: int | None):
        with torch.no_grad():
            return render(
                splat, cams, background=(0.0, 0.0, 0.0), backend=backend, tile_size=tile_size, depth=False
            )

    rows, ref = [], None
    for backend, tile in [("torch", None)] + [("cpp", t) for t in args.tiles]:
        out = run(backend, tile)  # warm-up (and the library's build, once)
        walls, cpus = [], []
        for _ in range(args.repeat):
            w0, c0 = time.perf_counter(), time.process_time()
            out = run(backend, tile)
            walls.append(time.perf_counter() - w0)
            cpus.append(time.process_time() - c0)
        if ref is None:
            ref = out
        err = torch.maximum((out.rgb - ref.rgb).abs().amax(-1), (out.alpha - ref.alpha).abs()[..., 0])
        rows.append(
            dict(
                backend=backend,
                tile_size=tile or 8,
                wall_s=statistics.median(walls),
                walls_s=walls,
                cpu_s=statistics.median(cpus),
                max_abs_diff_vs_torch=float(err.max()),
                pixels_over_1e5_vs_torch=int((err > 1e-5).sum()),
                load_average_after=list(os.getloadavg()),
            )
        )
    base = rows[0]["wall_s"]
    for r in rows:
        r["speedup_vs_torch"] = base / r["wall_s"]
    save_result(
        args.out,
        {
            "splat": args.splat.name,
            "gaussians": len(splat),
            "views": len(cams),
            "size": [cams.width, cams.height],
            "threads": args.threads,
            "repeat": args.repeat,
            "load_average_before": load_before,
            "rows": rows,
        },
    )
    print(f"{args.splat.name}: {len(splat)} Gaussians, {len(cams)} views of {cams.width}x{cams.height}, "
          f"{args.threads} threads, load average before {load_before[0]:.2f}")  # fmt: skip
    print(
        f"{'backend':8} {'tile':>4} {'wall s':>8} {'cpu s':>8} {'speedup':>8} {'max diff':>9} {'>1e-5':>6} {'load':>5}"
    )
    for r in rows:
        print(
            f"{r['backend']:8} {r['tile_size']:4d} {r['wall_s']:8.3f} {r['cpu_s']:8.3f} "
            f"{r['speedup_vs_torch']:7.2f}x {r['max_abs_diff_vs_torch']:9.2e} {r['pixels_over_1e5_vs_torch']:6d} "
            f"{r['load_average_after'][0]:5.2f}"
        )
    print(f"written {args.out}")


if __name__ == "__main__":
    main()
