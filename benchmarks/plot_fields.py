"""Charts (PNG) of the committed density-field results: where one call's time goes, and the default
fast kernel's time per input and grid size.

    python benchmarks/plot_fields.py [--results benchmarks/results] [--out-dir benchmarks/results]

Reads ``ncu_fields_128_50k_h200.json`` (per-kernel device times of one call, Nsight Compute) and
``fields_h200_defaults.json`` (bench_fields.py with the exact-mode defaults); writes
``fields_h200_kernels_128_50k.png`` and ``fields_h200_defaults_R{128,256,512}.png``. Runs on the CPU.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from microdreamer.profiling import plot_stages


def kernel_chart(ncu: dict, out_dir: Path) -> Path:
    times = {name: k["duration_us"] for name, k in ncu["kernels"].items() if k.get("duration_us")}
    return plot_stages(
        times, out_dir / "fields_h200_kernels_128_50k.png", "fields 128^3 / 50k, kernels of one call", "us"
    )


def short(name: str) -> str:
    """An input's name, short: dg_ghost_amd_17k.ply -> dg_ghost."""
    return "_".join(name.split(".")[0].split("_")[:2])[:14]


def count(n: int) -> str:
    """Gaussians, short: 4.55k, 50k, 1M."""
    return f"{n / 1e6:.3g}M" if n >= 1_000_000 else f"{n / 1e3:.3g}k"


def default_charts(bench: dict, out_dir: Path) -> list[Path]:
    paths = []
    for r in sorted({row["R"] for row in bench["results"]}):
        rows = [
            x
            for x in bench["results"]
            if x["R"] == r and x.get("impl") == "fast" and x.get("default") and "median_ms" in x
        ]
        if not rows:
            continue
        times = {f"{short(x['input'])} {count(x['N'])}": x["median_ms"] for x in rows}
        paths.append(
            plot_stages(
                times,
                out_dir / f"fields_h200_defaults_R{r}.png",
                f"fast kernel, exact mode, defaults, {r}^3 (H200, median per call)",
                "ms",
                shares=False,
            )
        )
    return paths


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", default=str(Path(__file__).resolve().parent / "results"))
    ap.add_argument("--out-dir", default=None, help="where the PNGs go (default: --results)")
    args = ap.parse_args()
    results = Path(args.results)
    out_dir = Path(args.out_dir or results)
    out_dir.mkdir(parents=True, exist_ok=True)
    missing = [
        n
        for n in ("ncu_fields_128_50k_h200.json", "fields_h200_defaults.json")
        if not (results / n).is_file()
    ]
    if missing:
        sys.exit(f"plot_fields.py: {', '.join(missing)} not found in {results}; pass --results DIR")
    written = [kernel_chart(json.loads((results / "ncu_fields_128_50k_h200.json").read_text()), out_dir)]
    written += default_charts(json.loads((results / "fields_h200_defaults.json").read_text()), out_dir)
    for p in written:
        print(p)


if __name__ == "__main__":
    main()
