"""Charts (PNG) of the committed density-field results: where one call's time goes, and the default
fast kernel's time per input and grid size.

    python benchmarks/plot_fields.py [--results benchmarks/results] [--out-dir benchmarks/results]

Reads ``fields_h200_profile_round10.json`` (profile_fields.py: per-kernel device times of one default call, medians)
and ``fields_h200_round10_defaults.json`` (bench_fields.py with the exact-mode defaults); writes
``fields_h200_kernels_{R}_{N}.png`` per profiled case and ``fields_h200_defaults_R{128,256,512}.png``. Runs
on the CPU.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from microdreamer.profiling import plot_stages

PROFILE, DEFAULTS = "fields_h200_profile_round10.json", "fields_h200_round10_defaults.json"


def kernel_name(name: str) -> str:
    """A device op's name, short: 'void ns::(anonymous namespace)::fast_kernel_v2<4, ...>(...)' ->
    'fast_kernel_v2', 'Memset (Device)' -> 'Memset'."""
    match = re.search(r"(\w+)\s*[<(]", name)
    return match.group(1) if match else name


def kernel_charts(profile: dict, out_dir: Path) -> list[Path]:
    paths = []
    for case in profile["cases"]:
        n, r = (int(v) for v in case["case"].split("x"))
        times: dict[str, float] = {}
        for op in case["ops"]:
            key = kernel_name(op["name"])
            times[key] = times.get(key, 0.0) + op["us"]
        paths.append(
            plot_stages(
                times,
                out_dir / f"fields_h200_kernels_{r}_{count(n)}.png",
                f"fields {r}^3 / {count(n)}, kernels of one default call (H200, span {case['span_us']:.0f} us; "
                "scatter kernels on a second stream)",
                "us",
            )
        )
    return paths


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
    missing = [n for n in (PROFILE, DEFAULTS) if not (results / n).is_file()]
    if missing:
        sys.exit(f"plot_fields.py: {', '.join(missing)} not found in {results}; pass --results DIR")
    written = kernel_charts(json.loads((results / PROFILE).read_text()), out_dir)
    written += default_charts(json.loads((results / DEFAULTS).read_text()), out_dir)
    for p in written:
        print(p)


if __name__ == "__main__":
    main()
