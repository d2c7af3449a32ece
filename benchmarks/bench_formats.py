"""Splat formats on the CPU: reading N Gaussians from each format against the PLY read, writing them, and
``microdreamer convert`` of the PLY to SPZ in a fresh process (start-up included).

    python benchmarks/bench_formats.py --n 1000000 --out benchmarks/results/formats_cpu.json

Inputs are the tests' own builder (``tests/test_formats.py``'s ``random_splat``: jittered grid centres,
every value inside each format's range), seeded, at SH degree 0 and 3, written once by our writers into a
temporary folder. Each read and write runs once to warm up, then ``--repeat`` times; medians (seconds).
One table is printed last.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import microdreamer  # noqa: E402
from _common import save_result  # noqa: E402  (benchmarks/ is on sys.path when run as a script)
from microdreamer.formats import read_splat_arrays, write_splat  # noqa: E402
from test_formats import SUFFIX, random_splat  # noqa: E402

FORMATS = {0: ["ply", "spz", "sog", "compressed_ply", "glb", "glb_spz", "ksplat", "splat"],
           3: ["ply", "spz", "sog", "compressed_ply", "glb", "glb_spz", "ksplat"]}  # fmt: skip


def seconds(fn, repeat: int) -> list[float]:
    fn()
    out = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1_000_000, help="Gaussians")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--degrees", default="0,3")
    ap.add_argument("--out", type=Path, default=None, help="JSON result")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for degree in (int(d) for d in args.degrees.split(",")):
            arrays = random_splat(args.n, degree, seed=degree)
            for fmt in FORMATS[degree]:
                path = tmp / f"d{degree}{SUFFIX[fmt]}"
                write = seconds(lambda a=arrays, p=path, f=fmt: write_splat(a, p, f), args.repeat)
                read = seconds(lambda p=path: read_splat_arrays(p), args.repeat)
                rows.append({"degree": degree, "format": fmt, "bytes": os.path.getsize(path),
                             "read_s": statistics.median(read), "write_s": statistics.median(write),
                             "read_all_s": read, "write_all_s": write})  # fmt: skip
                print(f"degree {degree} {fmt:15s} read {rows[-1]['read_s']:.3f} s  write {rows[-1]['write_s']:.3f} s",
                      flush=True)  # fmt: skip
            arrays = None  # free it before the CLI runs
            ply = next(r["read_s"] for r in rows if r["degree"] == degree and r["format"] == "ply")
            for r in rows:
                if r["degree"] == degree:
                    r["read_vs_ply"] = r["read_s"] / ply
            cli = []
            env = dict(os.environ, PYTHONPATH=str(Path(microdreamer.__file__).parents[1]))  # the tree read
            for _ in range(args.repeat):
                t = time.perf_counter()
                subprocess.run([sys.executable, "-m", "microdreamer.cli", "convert", str(tmp / f"d{degree}.ply"),
                                str(tmp / f"cli{degree}.spz")], env=env, check=True, capture_output=True)  # fmt: skip
                cli.append(time.perf_counter() - t)
            rows.append({"degree": degree, "format": "convert ply->spz (CLI wall)",
                         "wall_s": statistics.median(cli), "wall_all_s": cli})  # fmt: skip
    print(f"\n{args.n} Gaussians, medians of {args.repeat} (s)")
    print(f"{'deg':>3} {'format':28s} {'read':>7} {'x PLY':>6} {'write':>7} {'MB':>7}")
    for r in rows:
        if "wall_s" in r:
            print(f"{r['degree']:>3} {r['format']:28s} {r['wall_s']:>7.2f}")
        else:
            print(f"{r['degree']:>3} {r['format']:28s} {r['read_s']:>7.3f} {r['read_vs_ply']:>6.2f} "
                  f"{r['write_s']:>7.3f} {r['bytes'] / 1e6:>7.1f}")  # fmt: skip
    if args.out:
        save_result(args.out, {"n": args.n, "repeat": args.repeat, "rows": rows})


if __name__ == "__main__":
    main()
