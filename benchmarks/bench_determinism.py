"""The PyTorch Gaussian rasteriser's forward + backward on the CPU: the cost of a deterministic backward.

Three ways to gather a chunk's per-Gaussian rows (``render/_torch_raster.gather_rows``):

* ``index_select`` (the code): backward by ``index_add_``, deterministic with any thread count;
* ``advanced``: ``table[index]`` (the code before), backward by ``index_put_(accumulate=True)``, whose
  float32 atomics make the gradients differ run to run with more than one thread;
* ``advanced+deterministic``: the same under ``torch.use_deterministic_algorithms(True)``.

For each: the median wall time of forward + backward (the demo's sizes: 4 views, synthetic object;
the variants timed in turn, round robin, so a shared machine's changing load hits them alike), and
whether the gradients of ``repeats`` calls are bitwise identical to the first.

    python benchmarks/bench_determinism.py --threads 2 --out benchmarks/results/determinism_cpu.json
"""

from __future__ import annotations

import argparse
import statistics

import torch

from _common import save_result, time_ms
from microdreamer.cameras import orbit_cameras
from microdreamer.render import _torch_raster, render
from microdreamer.splat import Splat
from microdreamer.synthetic import make_synthetic_object

VARIANTS = ("index_select", "advanced", "advanced+deterministic")


def _advanced(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    return table[index]


def step_and_grads(splat: Splat, cams):
    """(a function running forward + backward, one returning the gradients of one call)."""

    def grads() -> dict[str, torch.Tensor]:
        params = {k: v.clone().requires_grad_(True) for k, v in splat.tensors().items()}
        out = render(Splat(**params), cams, background=(1.0, 1.0, 1.0), backend="torch")
        (out.rgb.square().sum() + out.alpha.sum()).backward()
        return {k: v.grad for k, v in params.items() if v.grad is not None}

    return grads


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--gaussians", type=int, nargs="+", default=[3000, 6000])
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--views", type=int, default=4)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--repeats", type=int, default=5, help="calls compared bitwise with the first")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    az = torch.arange(args.views, dtype=torch.float32) * (360.0 / args.views)
    cams = orbit_cameras(torch.full_like(az, 15.0), az, 2.0, 49.1, args.size, args.size)
    rows = []
    original = _torch_raster.gather_rows

    def use(variant: str) -> None:
        _torch_raster.gather_rows = original if variant == "index_select" else _advanced
        torch.use_deterministic_algorithms(variant.endswith("deterministic"))

    try:
        for n in args.gaussians:
            splat = make_synthetic_object(n, seed=1)
            grads = step_and_grads(splat, cams)
            times: dict[str, list[float]] = {v: [] for v in VARIANTS}
            for variant in VARIANTS:  # warm-up
                use(variant)
                grads()
            for _ in range(args.reps):  # round robin: a shared machine's load drifts alike for all three
                for variant in VARIANTS:
                    use(variant)
                    times[variant] += time_ms(grads, warmup=0, reps=1)
            for variant in VARIANTS:
                use(variant)
                first = grads()
                same = all(
                    all(torch.equal(first[k], g[k]) for k in first)
                    for g in (grads() for _ in range(args.repeats))
                )
                t = times[variant]
                rows.append({"gaussians": n, "variant": variant, "median_ms": statistics.median(t),
                             "min_ms": min(t), "identical": same})  # fmt: skip
    finally:
        _torch_raster.gather_rows = original
        torch.use_deterministic_algorithms(False)
    print(f"{'N':>6} {'variant':<24} {'median ms':>10} {'min ms':>9}  identical over {args.repeats} calls")
    for r in rows:
        print(
            f"{r['gaussians']:>6} {r['variant']:<24} {r['median_ms']:>10.1f} {r['min_ms']:>9.1f}  {r['identical']}"
        )
    if args.out:
        save_result(args.out, {"views": args.views, "size": args.size, "rows": rows})


if __name__ == "__main__":
    main()
