"""Does the order of the Gaussians change the fast field call's time? (benchmarks/NOTES_fields.md, round 11)

    python benchmarks/probe_order.py [--json FILE]

For the synthetic object (10k, 50k at 128^3) and two sample splats (128^3, 256^3): the call's median time
(CUDA events, 20 calls after 3 warm-up calls) with the Gaussians in their own order, a random permutation, and
Morton order of their centres' 4^3- and 8^3-voxel cells; with and without ``overlap``. The field must not
depend on the order beyond rounding (the relative difference to the first is printed).
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch

from _common import save_result  # benchmarks/ is on sys.path when run as a script
from microdreamer.field import FieldConfig, prepare_gaussians
from microdreamer.field.common import PreparedGaussians
from microdreamer.kernels import extract_fields
from microdreamer.splat import read_ply
from microdreamer.synthetic import make_synthetic_object

SAMPLES = Path(__file__).resolve().parents[1] / ".." / "shared" / "samples" / "splats"


def permuted(p: PreparedGaussians, idx: torch.Tensor) -> PreparedGaussians:
    return PreparedGaussians(
        means=p.means[idx].contiguous(),
        opacities=p.opacities[idx].contiguous(),
        transforms=p.transforms[idx].contiguous(),
        radii=p.radii[idx].contiguous(),
    )


def morton_order(p: PreparedGaussians, r: int, cell: int) -> torch.Tensor:
    """Indices sorting the Gaussians by the Morton code of their centres' cells of cell^3 voxels."""
    k = ((p.means + 1) * (r - 1) / 2 / cell).long().clamp(0, 1023)
    code = torch.zeros(len(k), dtype=torch.long, device=k.device)
    for b in range(10):
        for a in range(3):
            code |= ((k[:, a] >> b) & 1) << (3 * b + a)
    return torch.argsort(code)


def median_ms(p: PreparedGaussians, grid, cfg: FieldConfig, **kw) -> tuple[float, torch.Tensor]:
    r = cfg.resolution
    out = torch.empty((r, r, r), device="cuda")
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(3):
        extract_fields(p, grid, cfg, out=out, **kw)
    times = []
    for _ in range(20):
        start.record()
        extract_fields(p, grid, cfg, out=out, **kw)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times), out.clone()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    cases = [("synthetic 50k", make_synthetic_object(50_000, seed=0), 128)]
    cases.append(("synthetic 10k", make_synthetic_object(10_000, seed=0), 128))
    for name in ("pc_guitar_91k_sh0.decoded.ply", "dg_ghost_amd_17k.ply"):
        if (SAMPLES / name).exists():
            cases += [(name, read_ply(SAMPLES / name), 128), (name, read_ply(SAMPLES / name), 256)]
    report = []
    for name, splat, r in cases:
        cfg = FieldConfig(resolution=r, mode="exact")
        prepared, grid = prepare_gaussians(splat, cfg)
        prepared = prepared.to("cuda")
        g = torch.Generator().manual_seed(1)
        orders = {
            "own": torch.arange(len(prepared.means), device="cuda"),
            "random": torch.randperm(len(prepared.means), generator=g).cuda(),
            "morton4": morton_order(prepared, r, 4),
            "morton8": morton_order(prepared, r, 8),
        }
        first = None
        row = {"input": name, "R": r, "ms": {}, "rel_diff": {}}
        for order, idx in orders.items():
            for overlap in (True, False):
                ms, out = median_ms(permuted(prepared, idx), grid, cfg, overlap=overlap)
                first = out if first is None else first
                key = order if overlap else f"{order}/one stream"
                row["ms"][key] = ms
                row["rel_diff"][key] = float((out.double() - first.double()).norm() / first.double().norm())
        print(f"{name} @ {r}: " + "; ".join(f"{k} {v:.3f} ms" for k, v in row["ms"].items()), flush=True)
        report.append(row)
    if args.json:
        save_result(args.json, {"cases": report})


if __name__ == "__main__":
    main()
