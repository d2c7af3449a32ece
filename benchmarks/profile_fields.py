"""Where the fast field kernel's time goes: per-kernel device times of one ``extract_fields`` call.

    python benchmarks/profile_fields.py [--cases 50000x128,1000000x512] [--variant V] [--json FILE]

For each case (synthetic object, exact mode) it warms up, then records one call under
``torch.profiler`` and prints each CUDA kernel's device time and the call's span; with ``--ncu`` the
script is meant to run under Nsight Compute (``ncu --clock-control none -k regex:fast_kernel ...``) and
makes just one call per case after the warm-up.
"""

from __future__ import annotations

import argparse
import json

import torch

from microdreamer.field import FieldConfig, prepare_gaussians
from microdreamer.kernels import extract_fields
from microdreamer.synthetic import make_synthetic_object


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="50000x128,1000000x512")
    ap.add_argument("--variant", type=int, default=None)
    ap.add_argument("--chunks", type=int, default=None)
    ap.add_argument("--ncu", action="store_true", help="one plain call per case (for ncu)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    report = []
    for case in args.cases.split(","):
        n, r = (int(v) for v in case.split("x"))
        cfg = FieldConfig(resolution=r, mode="exact")
        prepared, grid = prepare_gaussians(make_synthetic_object(n, seed=0).to("cuda"), cfg)
        out = torch.empty((r, r, r), device="cuda")

        def call(prepared=prepared, grid=grid, cfg=cfg, out=out):
            return extract_fields(
                prepared, grid, cfg, "fast", out=out, variant=args.variant, chunks=args.chunks
            )

        for _ in range(3):
            call()
        torch.cuda.synchronize()
        if args.ncu:
            call()
            torch.cuda.synchronize()
            continue
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            call()
            torch.cuda.synchronize()
        events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        rows = [
            {
                "name": e.name[:80],
                "us": e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total,
                "start_us": e.time_range.start,
                "end_us": e.time_range.end,
            }
            for e in events
        ]
        span = max(x["end_us"] for x in rows) - min(x["start_us"] for x in rows) if rows else 0.0
        print(f"\n{case}: {len(rows)} device ops, span {span:.1f} us")
        for x in rows:
            print(f"  {x['us']:10.1f} us  {x['name']}")
        report.append({"case": case, "span_us": span, "ops": rows})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
