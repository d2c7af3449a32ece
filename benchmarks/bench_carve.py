"""Silhouette carving (``field.carve``): the seconds of its images, of its sampling and of the whole stage.

    python benchmarks/bench_carve.py [--device cpu|cuda] [--cases creative,ghost,fruit,guitar,synth50k]
                                     [--repeat 5] [--threads 2] [--compare REV] [--out benchmarks/results/carve_cpu.json]

Each case is a shared splat (``creative``, ``ghost``, ``fruit``, ``guitar``) or ``synthNk`` (bench_export's
seeded ``make_synthetic_object``), prepared as ``microdreamer mesh`` prepares it: the auto resolution
(``field.auto_resolution``), the exact-mode density field, the auto iso-level (whose three axis images carving
reuses) and ``mesh.carve`` directions at ``carve_level`` times that level. Then, per backend (CPU: ``torch``;
``--device cuda``: ``torch`` and ``cuda``), the median seconds of ``--repeat`` calls after a warm-up of:

* ``images``: ``projected_alphas`` of the D - 3 directions other than the grid axes;
* ``sampling``: ``carve_field`` with those images already made (the hull at the voxels and the carved field);
* ``carve``: the whole ``carve_field``, as the export calls it.

``--compare REV`` loads ``src/microdreamer/field/carve.py`` as it was at git revision REV beside the working tree's
and times both, interleaved in the same process (the machine's load changes between runs), and reports the largest
difference of their carved fields. ``--threads`` takes a comma-separated list of torch thread counts to run under.
The table is printed last; ``--out`` writes it as JSON with the command and the hardware.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

import torch

from _common import save_result  # benchmarks/ is on sys.path when run as a script
from bench_export import ROOT, SHARED, SPLATS, case_input

DEFAULT_CASES = "creative,ghost,fruit,guitar,synth50k"


@dataclasses.dataclass
class CarveCase:
    """One splat as the export's carve stage sees it."""

    name: str
    values: torch.Tensor
    raw: object  # PreparedGaussians, voxel_filter=0
    grid: object  # GridSpec
    level: float
    directions: int
    axis_images: list[torch.Tensor]


def carve_case(name: str, path: Path, device: torch.device) -> CarveCase:
    from microdreamer.config import ExportConfig
    from microdreamer.field import prepare_gaussians, resolve_resolution
    from microdreamer.field.iso import auto_iso_level
    from microdreamer.jobs.export import compute_field, prepare_field, upright
    from microdreamer.splat import read_ply

    cfg = ExportConfig()
    splat = upright(read_ply(path).to(device), cfg.up)
    field = resolve_resolution(splat, cfg.field)
    prepared, grid = prepare_field(splat, field, name)
    values, _ = compute_field(prepared, grid, field, backend="auto")
    iso = auto_iso_level(splat, values, grid, field)
    raw, _ = prepare_gaussians(splat, dataclasses.replace(field, voxel_filter=0.0))
    return CarveCase(
        name, values, raw, grid, iso.level * cfg.mesh.carve_level, cfg.mesh.carve, iso.column_alphas
    )


def load_carve_at(rev: str) -> ModuleType:
    """``microdreamer/field/carve.py`` as it was at git revision ``rev``, as a module of its own."""
    src = subprocess.run(["git", "show", f"{rev}:src/microdreamer/field/carve.py"], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout  # fmt: skip
    spec = importlib.util.spec_from_loader(f"carve_at_{rev}", loader=None)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    exec(compile(src, f"carve.py@{rev}", "exec"), module.__dict__)
    return module


def seconds(fn, device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t


def measure(
    module: ModuleType, case: CarveCase, backend: str, device: torch.device
) -> tuple[dict, torch.Tensor]:
    """One call of each timed step of ``module`` (a version of field.carve); the carved field."""
    r = case.grid.resolution
    h = 2.0 / (r - 1)
    bases = [module.direction_basis(d) for d in module.carving_directions(case.directions)]
    windows = [module.plane_window(b, r) for b in bases]
    out = {}
    images = []

    def make_images():
        images[:] = module.projected_alphas(case.raw, bases[3:], windows[3:], h, backend=backend)

    def carve():
        out["result"] = module.carve_field(case.values, case.raw, case.grid, case.level, case.directions,
                                           axis_images=case.axis_images, backend=backend)  # fmt: skip

    t = {"images": seconds(make_images, device)}
    original = module.projected_alphas
    module.projected_alphas = lambda *args, **kwargs: list(images)
    try:
        t["sampling"] = seconds(carve, device)
    finally:
        module.projected_alphas = original
    t["carve"] = seconds(carve, device)
    return t, out["result"].values


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--cases", default=DEFAULT_CASES)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--threads", default=None, help="comma-separated torch thread counts (default: torch's)")
    ap.add_argument("--compare", default=None, help="a git revision whose carve.py to time beside the tree's")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    from microdreamer.field import carve as current

    device = torch.device(args.device)
    backends = ["torch", "cuda"] if device.type == "cuda" else ["torch"]
    versions = {"tree": current}
    if args.compare:
        versions = {args.compare: load_carve_at(args.compare), **versions}
    threads = [int(t) for t in args.threads.split(",")] if args.threads else [torch.get_num_threads()]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.cases.split(","):
            if name in SHARED and not (SPLATS / SHARED[name]).exists():
                print(f"{name}: sample not found in {SPLATS}; skipped", file=sys.stderr)
                continue
            case = carve_case(name, case_input(name, Path(tmp)), device)
            r = case.grid.resolution
            for n_threads in threads:
                torch.set_num_threads(n_threads)
                runs = [(v, b) for v in versions for b in backends]
                times = {run: [] for run in runs}
                fields = {}
                for rep in range(args.repeat + 1):  # the first round warms up
                    for run in runs:
                        t, fields[run] = measure(versions[run[0]], case, run[1], device)
                        if rep:
                            times[run].append(t)
                ref = fields[runs[-1]]
                for v, b in runs:
                    diff = float((fields[(v, b)] - ref).abs().max()) / case.level
                    row = {"case": name, "resolution": r, "gaussians": len(case.raw), "threads": n_threads,
                           "version": v, "backend": b, "max_diff_over_level": diff}  # fmt: skip
                    for step in ("images", "sampling", "carve"):
                        row[f"{step}_s"] = [x[step] for x in times[(v, b)]]
                        row[f"{step}_median_s"] = statistics.median(row[f"{step}_s"])
                    rows.append(row)
                    print(f"{name}@{r} threads {n_threads} {v}/{b}: images {row['images_median_s']:.3f} s, "
                          f"sampling {row['sampling_median_s']:.3f} s, carve {row['carve_median_s']:.3f} s", flush=True)  # fmt: skip
    if args.out:
        save_result(args.out, {"device": args.device, "repeat": args.repeat, "rows": rows})
    print(
        f"\ncarving on {args.device}: median seconds of {args.repeat} calls (images: the directions other than the axes)"
    )
    print(f"{'case':<14}{'N':>8}{'threads':>8}  {'version/backend':<22}{'images':>9}{'sampling':>10}{'carve':>9}"
          f"{'diff/level':>12}")  # fmt: skip
    for row in rows:
        print(f"{row['case'] + '@' + str(row['resolution']):<14}{row['gaussians']:>8}{row['threads']:>8}  "
              f"{row['version'] + '/' + row['backend']:<22}{row['images_median_s']:>9.3f}"
              f"{row['sampling_median_s']:>10.3f}{row['carve_median_s']:>9.3f}{row['max_diff_over_level']:>12.2e}")  # fmt: skip


if __name__ == "__main__":
    main()
