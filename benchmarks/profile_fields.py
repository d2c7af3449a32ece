"""Where the fast field kernel's time goes: per-kernel device times of one ``extract_fields`` call.

    python benchmarks/profile_fields.py [--cases 50000x128,1000000x512,pc_guitar_91k.ply@512] [--variant V]
        [--json FILE] [--kw name=value ...] [--calls K]

For each case (``NxR``: the synthetic object; ``FILE.ply@R``: a sample splat from ../shared/samples/splats;
exact mode) it warms up, then records one call under
``torch.profiler`` and prints each CUDA kernel's device time and the call's span (with ``--calls K``: K
calls, each kernel's median), then the host time per call (calls issued without a synchronisation).
``--kw`` passes further keyword arguments to ``extract_fields`` (values parsed as Python literals, e.g.
``--kw splits=1``); with ``--ncu`` the script is meant to run under Nsight Compute
(``ncu --clock-control none -k regex:fast_kernel ...``) and makes just one call per case after the warm-up.
"""

from __future__ import annotations

import argparse
import ast
import statistics
import time
from pathlib import Path

import torch

from _common import save_result  # benchmarks/ is on sys.path when run as a script
from microdreamer.field import FieldConfig, prepare_gaussians
from microdreamer.kernels import extract_fields
from microdreamer.splat import read_ply
from microdreamer.synthetic import make_synthetic_object

HOST_CALLS = 30
SAMPLES = Path(__file__).resolve().parents[1] / ".." / "shared" / "samples" / "splats"


def load_case(case: str):
    """``NxR`` -> (the synthetic object with N Gaussians, R); ``FILE.ply@R`` -> (that sample splat, R)."""
    if "@" in case:
        name, r = case.rsplit("@", 1)
        path = SAMPLES / name
        if not path.is_file():
            raise SystemExit(
                f"profile_fields.py: no sample splat {path}; pass one of {sorted(SAMPLES.glob('*.ply'))}"
            )
        return read_ply(path), int(r)
    n, r = (int(v) for v in case.split("x"))
    return make_synthetic_object(n, seed=0), r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="50000x128,1000000x512")
    ap.add_argument("--variant", type=int, default=None)
    ap.add_argument("--chunks", type=int, default=None)
    ap.add_argument("--ncu", action="store_true", help="one plain call per case (for ncu)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--kw", action="append", default=[], help="name=value for extract_fields (repeatable)")
    ap.add_argument("--calls", type=int, default=1, help="profiled calls (per-kernel medians)")
    args = ap.parse_args()
    extra = {k: ast.literal_eval(v) for k, v in (x.split("=", 1) for x in args.kw)}
    report = []
    for case in args.cases.split(","):
        splat, r = load_case(case)
        cfg = FieldConfig(resolution=r, mode="exact")
        prepared, grid = prepare_gaussians(splat.to("cuda"), cfg)
        out = torch.empty((r, r, r), device="cuda")

        def call(prepared=prepared, grid=grid, cfg=cfg, out=out):
            return extract_fields(
                prepared, grid, cfg, "fast", out=out, variant=args.variant, chunks=args.chunks, **extra
            )

        for _ in range(3):
            call()
        torch.cuda.synchronize()
        if args.ncu:
            call()
            torch.cuda.synchronize()
            continue
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(args.calls):
                call()
            torch.cuda.synchronize()
        events = sorted(
            (e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
            key=lambda e: e.time_range.start,
        )
        per_call = len(events) // args.calls
        calls = [events[k * per_call : (k + 1) * per_call] for k in range(args.calls)]
        rows = []
        for pos in range(per_call):
            ops = [c[pos] for c in calls]
            us = [e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total for e in ops]
            rows.append({"name": ops[0].name[:80], "us": statistics.median(us), "us_each": us})
        spans = [c[-1].time_range.end - c[0].time_range.start for c in calls if c]
        span = statistics.median(spans) if spans else 0.0
        print(
            f"\n{case} {extra or ''}: {per_call} device ops per call, span {span:.1f} us (median of {args.calls})"
        )
        for x in rows:
            print(f"  {x['us']:10.1f} us  {x['name']}")
        # host time per call: calls issued back to back without a synchronisation (the GPU queue stays
        # below its depth), so this is the Python wrapper, the binding and the launches
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(HOST_CALLS):
            call()
        host_us = (time.perf_counter() - t0) / HOST_CALLS * 1e6
        torch.cuda.synchronize()
        print(f"  host: {host_us:.1f} us per call (mean of {HOST_CALLS} calls issued without a sync)")
        report.append({"case": case, "kwargs": extra, "calls": args.calls, "span_us": span, "spans_us": spans,
                       "host_us_per_call": host_us, "ops": rows})  # fmt: skip
    if args.json:
        save_result(args.json, {"cases": report})


if __name__ == "__main__":
    main()
