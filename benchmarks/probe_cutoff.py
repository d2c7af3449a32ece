"""How the fast kernel's time follows the exact mode's cutoff (the number of in-cutoff pairs).

    python benchmarks/probe_cutoff.py [--cases 50000x128,1000000x512] [--tols 1e-4,0.011,0.026] [--json FILE]

Issue 3's targets assumed ~1e10 exponentials at 512^3 / 1M; the default ``cutoff_tol = 1e-4`` (c = 4.29)
holds 4.0e10 in-cutoff pairs there. For each case (``NxR``: the synthetic object) and tolerance this prints
the in-cutoff pairs (the sum over Gaussians of the cutoff ellipsoid's volume in voxels,
``4/3 pi c^3 / |det M| / h^3``), the fast kernel's median time with its defaults (CUDA events around one
call, as bench_fields.py times it), and at R <= 128 the largest difference from the naive kernel relative to
the field's maximum. A diagnostic of the targets' premise, not a change of the default tolerance.
"""

from __future__ import annotations

import argparse
import math
import statistics

import torch

from _common import save_result, time_ms  # benchmarks/ is on sys.path when run as a script
from microdreamer.field import FieldConfig, prepare_gaussians
from microdreamer.kernels import extract_fields
from microdreamer.synthetic import make_synthetic_object


def probe(n: int, r: int, tol: float) -> dict:
    """The numbers of one case and tolerance (see the module docstring)."""
    cfg = FieldConfig(resolution=r, mode="exact", cutoff_tol=tol)
    prepared, grid = prepare_gaussians(make_synthetic_object(n, seed=0).to("cuda"), cfg)
    c = math.sqrt(cfg.cutoff_sq)
    h = 2.0 / (r - 1)
    det = torch.linalg.det(prepared.transforms.double()).abs()
    pairs = float((4.0 / 3.0 * math.pi * c**3 / det).sum()) / h**3
    out = torch.empty((r, r, r), device="cuda")
    ms = statistics.median(
        time_ms(
            lambda: extract_fields(prepared, grid, cfg, "fast", out=out), warmup=2, reps=21 if r <= 256 else 7
        )
    )
    row = {"case": f"{n}x{r}", "cutoff_tol": tol, "c": c, "pairs": pairs, "fast_ms": ms}
    if r <= 128:
        fast = extract_fields(prepared, grid, cfg, "fast")
        naive = extract_fields(prepared, grid, cfg, "naive")
        row["max_diff_rel_to_max"] = float((fast - naive).abs().max() / naive.abs().max())
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="50000x128,1000000x512")
    ap.add_argument("--tols", default="1e-4,0.011,0.026")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rows = []
    for case in args.cases.split(","):
        n, r = (int(v) for v in case.split("x"))
        for tol in (float(t) for t in args.tols.split(",")):
            row = probe(n, r, tol)
            rows.append(row)
            extra = (
                f", max diff from naive {row['max_diff_rel_to_max']:.2e}"
                if "max_diff_rel_to_max" in row
                else ""
            )
            print(f"{case} cutoff_tol {tol:g} (c = {row['c']:.2f}): {row['pairs']:.3g} pairs, "
                  f"fast {row['fast_ms']:.4f} ms{extra}", flush=True)  # fmt: skip
    if args.json:
        save_result(args.json, {"rows": rows})


if __name__ == "__main__":
    main()
