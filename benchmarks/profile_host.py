"""Where the host time of one fast ``extract_fields`` call goes (the part a short call waits for).

    python benchmarks/profile_host.py [--cases 10000x128,50000x128] [--calls 200] [--json FILE]

For each case (``NxR``: the synthetic object, exact mode) it prints:

* host microseconds per call, calls issued back to back with no synchronisation (the GPU queue stays
  below its depth): through the Python wrapper, straight into the binding with the wrapper's arguments,
  and the binding's early return (N = 0: checks and the output's zeroing only);
* the call's latency as the benchmark measures it (CUDA events around one call on an idle GPU, median);
* the host-side CUDA runtime calls of one call under ``torch.profiler`` (name, count, microseconds), so that
  the launches, memsets, events and allocations can be told apart. Read the counts: the profiler's tracing
  slows the calls it records (on the H200 it showed ~50 us per ``cudaMemsetAsync``, more than a whole call's
  host time without it).
"""

from __future__ import annotations

import argparse
import collections
import statistics
import time

import torch

from _common import save_result, time_ms  # benchmarks/ is on sys.path when run as a script
from microdreamer.field import FieldConfig, prepare_gaussians
from microdreamer.kernels import _backend, extract_fields
from microdreamer.synthetic import make_synthetic_object


def host_us(fn, calls: int) -> float:
    """Mean host microseconds per call of ``calls`` calls issued without a synchronisation."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    dt = time.perf_counter() - t0
    torch.cuda.synchronize()
    return dt / calls * 1e6


def runtime_calls(fn, calls: int = 20) -> list[dict]:
    """The CPU-side events of ``calls`` calls under torch.profiler: per name, count and microseconds per call."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:  # fmt: skip
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    per = collections.defaultdict(list)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CPU:
            per[e.name].append(e.time_range.end - e.time_range.start)
    rows = [
        {"name": k, "count_per_call": len(v) / calls, "us_per_call": sum(v) / calls} for k, v in per.items()
    ]
    return sorted(rows, key=lambda x: -x["us_per_call"])


def profile_case(ext, case: str, calls: int) -> dict:
    """The numbers of one case (see the module docstring)."""
    n, r = (int(v) for v in case.split("x"))
    cfg = FieldConfig(resolution=r, mode="exact")
    prepared, grid = prepare_gaussians(make_synthetic_object(n, seed=0).to("cuda"), cfg)
    out = torch.empty((r, r, r), device="cuda")

    def wrapper():
        return extract_fields(prepared, grid, cfg, "fast", out=out)

    # the binding's arguments, as the wrapper passes them (captured once)
    captured = {}
    original = ext.extract_fields

    def spy(*a):
        captured["args"] = a
        return original(*a)

    ext.extract_fields = spy
    try:
        wrapper()
    finally:
        ext.extract_fields = original
    direct_args = captured["args"]
    empty_args = tuple(t[:0] for t in direct_args[:4]) + direct_args[4:]

    def direct():
        return original(*direct_args)

    def early():
        return original(*empty_args)

    for fn in (wrapper, direct, early):
        for _ in range(5):
            fn()
    return {
        "case": case,
        "host_us_wrapper": host_us(wrapper, calls),
        "host_us_binding": host_us(direct, calls),
        "host_us_early_return": host_us(early, calls),
        "latency_ms_wrapper": statistics.median(time_ms(wrapper, warmup=0, reps=41)),
        "latency_ms_binding": statistics.median(time_ms(direct, warmup=0, reps=41)),
        "runtime_calls": runtime_calls(wrapper),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="10000x128,50000x128")
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    ext = _backend.load()
    report = []
    for case in args.cases.split(","):
        row = profile_case(ext, case, args.calls)
        report.append(row)
        print(f"\n{case}: host us per call: wrapper {row['host_us_wrapper']:.1f}, binding "
              f"{row['host_us_binding']:.1f}, early return {row['host_us_early_return']:.1f}; latency ms: "
              f"wrapper {row['latency_ms_wrapper']:.4f}, binding {row['latency_ms_binding']:.4f}")  # fmt: skip
        for x in row["runtime_calls"][:25]:
            print(f"  {x['us_per_call']:8.1f} us  x{x['count_per_call']:4.1f}  {x['name'][:90]}")
    if args.json:
        save_result(args.json, {"cases": report})


if __name__ == "__main__":
    main()
