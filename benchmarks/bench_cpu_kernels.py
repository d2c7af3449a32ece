"""The C++ CPU kernels against the PyTorch / NumPy paths they replace on the CPU, interleaved in one process.

    python benchmarks/bench_cpu_kernels.py [--cases ghost@128,guitar@256] [--repeat 3]
                                           [--out benchmarks/results/cpu_kernels.json]

Cases are ``NAME@R`` as in ``bench_export.py`` (a shared splat or ``synthNk``). Per case, the median seconds of
``--repeat`` calls after a warm-up, each pair of paths run alternately (the machine's load changes between
runs), and the largest difference of their results:

* ``field exact`` / ``field upstream``: the density field, backend ``torch`` against ``cpp`` (relative to the
  field's maximum);
* ``unwrap``: ``unwrap_charts`` of the export's untextured mesh (decimated to 50k faces as the export does), packer
  ``numpy`` against ``compiled`` (the largest UV difference: 0 when the layouts are the same).

The Gaussian rasteriser has its own benchmark (``bench_render_cpu.py``); every kernel's share of the whole job is in
``bench_cli_ab.py``'s per-stage table. The table is printed last; ``--out`` writes it as JSON with the command and
the hardware.
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


def seconds(fn) -> tuple[float, object]:
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def compare(name: str, paths: dict, diff, repeat: int) -> dict:
    """Run the two ``paths`` (label -> callable) alternately, once to warm up then ``repeat`` times."""
    times = {k: [] for k in paths}
    outs = {}
    for rep in range(repeat + 1):
        for label, fn in paths.items():
            t, outs[label] = seconds(fn)
            if rep:
                times[label].append(t)
    a, b = list(paths)
    med = {k: statistics.median(v) for k, v in times.items()}
    row = {"step": name, "paths": list(paths), "seconds": times, "median_s": med,
           "speedup": med[a] / med[b], "max_diff": float(diff(outs[a], outs[b]))}  # fmt: skip
    print(f"  {name:<16} {a} {med[a]:.3f} s, {b} {med[b]:.3f} s: x{row['speedup']:.1f}, diff {row['max_diff']:.2e}",
          flush=True)  # fmt: skip
    return row


def run_case(name: str, r: int, path: Path, repeat: int) -> list[dict]:
    from microdreamer.field import FieldConfig, compute_field, prepare_gaussians
    from microdreamer.splat import read_ply
    from microdreamer.texture.charts import unwrap_charts

    splat = read_ply(path)
    rows = []
    for mode in ("exact", "upstream"):
        cfg = FieldConfig(resolution=r, mode=mode)
        prepared, grid = prepare_gaussians(splat, cfg)
        paths = {
            b: (lambda b=b, p=prepared, g=grid, c=cfg: compute_field(p, g, c, backend=b)[0])
            for b in ("torch", "cpp")
        }
        rows.append(compare(f"field {mode}", paths, lambda x, y: (x - y).abs().max() / x.abs().max(), repeat))
    mesh, _ = cli_mesh(path, r, torch.device("cpu"))
    paths = {p: (lambda p=p: unwrap_charts(mesh, texture_size=1024, max_faces=50_000, packer=p))
             for p in ("numpy", "compiled")}  # fmt: skip
    rows.append(compare("unwrap", paths, lambda x, y: float(abs(x.uv - y.uv).max()) if x.uv.shape == y.uv.shape
                        else float("inf"), repeat))  # fmt: skip
    for row in rows:
        row.update(case=f"{name}@{r}", gaussians=len(splat))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="ghost@128,guitar@256")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    from microdreamer.kernels import cpu

    if not cpu.usable():
        raise SystemExit("error: the C++ CPU kernels do not build here (no C++ compiler?)")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for case in args.cases.split(","):
            name, r = case.split("@")
            if name in SHARED and not (SPLATS / SHARED[name]).exists():
                print(f"{name}: sample not found in {SPLATS}; skipped", file=sys.stderr)
                continue
            print(f"{case}:", flush=True)
            rows += run_case(name, int(r), case_input(name, Path(tmp)), args.repeat)
    if args.out:
        save_result(args.out, {"repeat": args.repeat, "threads": torch.get_num_threads(), "rows": rows})
    print(
        f"\nCPU, {torch.get_num_threads()} threads: median seconds of {args.repeat} calls, paths run alternately"
    )
    print(f"{'case':<14}{'step':<18}{'PyTorch/NumPy':>14}{'C++':>9}{'speed-up':>10}{'max diff':>11}")
    for row in rows:
        a, b = row["paths"]
        print(f"{row['case']:<14}{row['step']:<18}{row['median_s'][a]:>14.3f}{row['median_s'][b]:>9.3f}"
              f"{row['speedup']:>10.1f}{row['max_diff']:>11.2e}")  # fmt: skip


if __name__ == "__main__":
    main()
