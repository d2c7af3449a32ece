"""CPU time of generate's last stage after the density field: mesh extraction, unwrap, GLB export.

    python benchmarks/bench_mesh_stage.py [--workloads noisy,ghost] [--repeats 7] [--device cpu]
                                          [--json benchmarks/results/mesh_stage_cpu.json --label after]

The steps and settings are generate's (``MeshConfig()``, ``generate_texture_config()``: 10k-face cap,
512^2 atlas, padding 2, xatlas without chart refinement), each timed on its own as ``extract_mesh``
and ``unwrap`` call them: marching cubes and cleanup of the 128^3 field (= ``extract_mesh``),
decimation to 10k faces and xatlas (= ``unwrap``), and ``save_mesh`` of the textured mesh as GLB.
The GPU steps between unwrap and export (texel sampling, bake renders, rasterisation) are not
timed; the texture the export writes is baked once, untimed, from the splat's colour field
(``bake_field``), so that the PNG holds realistic content.

Workloads: ``noisy`` (``tests/test_mesh_stage_fast.py::noisy_splat``: 35k Gaussians like the
random-weight model's output, ~155k marching-cubes faces in ~750 pieces) and ``ghost`` (the sample
splat ``../shared/samples/splats/dg_ghost_amd_17k.ply``; skipped when absent). Each step runs once
to warm up, then ``--repeats`` times; the table gives the minimum and the median of the wall-clock
seconds; the JSON also has the CPU seconds of the process per step (``cpu_seconds_*``). On a shared
machine the minimum and the CPU seconds are the steadier figures: other processes only add time.

With ``--json FILE --label NAME`` the results are stored under ``runs[NAME]`` of FILE (other labels
already there are kept, e.g. ``before`` and ``after``), with the command, the git commit and the
hardware; the table then also shows the other labels' figures. To time older code, run this script
with ``PYTHONPATH`` pointing at that code's ``src`` (it uses ``marching_cubes_on_grid`` where present).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from _common import hardware  # benchmarks/ is on sys.path when run as a script

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / ".." / "shared" / "samples"
sys.path.insert(0, str(ROOT / "tests"))

WORKLOADS = ("noisy", "ghost")
#: rows of the table, in order: (key, what)
STEPS = (
    ("marching_cubes", "marching cubes"),
    ("cleanup", "cleanup"),
    ("extract_mesh", "extract_mesh (mesh stage)"),
    ("decimate", "decimate to 10k"),
    ("xatlas", "xatlas"),
    ("unwrap", "unwrap (decimate + xatlas)"),
    ("export_glb", "save_mesh GLB"),
    ("total", "total"),
)


def build_splat(name: str):
    """The workload's splat, or None when its file is absent."""
    if name == "noisy":
        from test_mesh_stage_fast import noisy_splat

        return noisy_splat()
    from microdreamer.splat import read_ply

    path = SAMPLES / "splats" / "dg_ghost_amd_17k.ply"
    return read_ply(path) if path.exists() else None


def baked_texture(layout, splat, size: int, device: torch.device) -> np.ndarray:
    """[size, size, 3] uint8: the splat's colour field baked into ``layout``'s atlas (untimed)."""
    from microdreamer.field import FieldConfig
    from microdreamer.texture import bake_field, fill_texture, texel_samples

    verts = torch.as_tensor(layout.mesh.vertices, device=device)
    faces = torch.as_tensor(layout.mesh.faces, device=device)
    samples = texel_samples(verts, faces, torch.as_tensor(layout.uv, device=device), size, size)
    colors, seen, _ = bake_field(samples, splat.to(device), FieldConfig())
    return fill_texture(samples, colors, seen)[0]


def timed(fn, *args, **kwargs):
    """(result, wall seconds, CPU seconds of this process) of one call."""
    c, t = time.process_time(), time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - t, time.process_time() - c


def run_workload(name: str, repeats: int, device: torch.device, tmp: Path) -> dict | None:
    import microdreamer.mesh as mesh_stage
    from microdreamer.field import FieldConfig, density_field
    from microdreamer.generate import generate_texture_config
    from microdreamer.texture import unwrap

    splat = build_splat(name)
    if splat is None:
        print(f"{name}: sample splat not found under {SAMPLES}; skipped", file=sys.stderr)
        return None
    fld = density_field(splat, FieldConfig(), device=device)
    values, origin, spacing = fld.values.cpu().numpy(), fld.grid.origin, fld.grid.spacing
    config, tex = mesh_stage.MeshConfig(), generate_texture_config()

    # the steps as extract_mesh and unwrap run them (the grid-restricted merge search where the code
    # has it), each timed on its own
    on_grid = getattr(mesh_stage, "marching_cubes_on_grid", None)

    def marching_cubes():
        if on_grid is None:
            return mesh_stage.marching_cubes(
                values, config.threshold, origin, spacing, config.close_boundary
            ), None
        return on_grid(values, config.threshold, origin, spacing, config.close_boundary)

    def cleanup(mesh, grid):
        if grid is None:
            return mesh_stage.cleanup_mesh_with_stats(mesh, config)
        return mesh_stage.cleanup_mesh_with_stats(mesh, config, grid)

    wall: dict[str, list[float]] = {k: [] for k, _ in STEPS}
    cpu: dict[str, list[float]] = {k: [] for k, _ in STEPS}
    texture = None
    for rep in range(repeats + 1):
        row = {}
        (mesh, grid), *row["marching_cubes"] = timed(marching_cubes)
        (mesh, cstats), *row["cleanup"] = timed(cleanup, mesh, grid)
        small, *row["decimate"] = timed(mesh_stage.decimate, mesh, tex.max_faces)
        layout, *row["xatlas"] = timed(unwrap, small, None, tex.size, tex.padding, tex.chart_iterations)
        if texture is None:
            texture = baked_texture(layout, splat, tex.size, device)
        textured = layout.with_texture(texture)
        _, *row["export_glb"] = timed(mesh_stage.save_mesh, textured, tmp / f"{name}.glb")
        if rep == 0:
            continue  # warm-up
        for i, acc in ((0, wall), (1, cpu)):
            r = {k: v[i] for k, v in row.items()}
            r["extract_mesh"] = r["marching_cubes"] + r["cleanup"]
            r["unwrap"] = r["decimate"] + r["xatlas"]
            r["total"] = r["extract_mesh"] + r["unwrap"] + r["export_glb"]
            for k, v in r.items():
                acc[k].append(v)
    counts = {
        "gaussians": len(splat),
        "faces_marching_cubes": cstats.faces_in,
        "faces_after_cleanup": cstats.faces_out,
        "components": cstats.components,
        "components_removed": cstats.components_removed,
        "vertices_after_cleanup": cstats.vertices_out,
        "faces_unwrapped": layout.stats["faces"],
        "vertices_unwrapped": layout.stats["vertices"],
        "charts": layout.stats["charts"],
        "utilization": round(layout.stats["utilization"], 4),
        "glb_bytes": (tmp / f"{name}.glb").stat().st_size,
    }
    return {
        "counts": counts,
        "seconds_median": {k: statistics.median(v) for k, v in wall.items()},
        "seconds_min": {k: min(v) for k, v in wall.items()},
        "cpu_seconds_median": {k: statistics.median(v) for k, v in cpu.items()},
        "cpu_seconds_min": {k: min(v) for k, v in cpu.items()},
        "seconds_all": wall,
    }


def summarise(runs: dict) -> dict:
    """Per workload and step: the minimum and median wall seconds of every ``before*`` and ``after*``
    run pooled (the best of all repetitions, the median of the per-run medians), and after - before."""
    out = {}
    names = sorted({w for r in runs.values() for w in r["workloads"]})
    for name in names:
        pools = {}
        for side in ("before", "after"):
            rs = [
                r["workloads"][name]
                for lb, r in runs.items()
                if lb.startswith(side) and name in r["workloads"]
            ]
            if rs:
                pools[side] = {k: (min(r["seconds_min"][k] for r in rs),
                                   statistics.median(r["seconds_median"][k] for r in rs)) for k, _ in STEPS}  # fmt: skip
        if len(pools) == 2:
            out[name] = {k: {"before_min": round(pools["before"][k][0], 4), "after_min": round(pools["after"][k][0], 4),
                             "before_median": round(pools["before"][k][1], 4),
                             "after_median": round(pools["after"][k][1], 4),
                             "saved_min": round(pools["before"][k][0] - pools["after"][k][0], 4),
                             "saved_median": round(pools["before"][k][1] - pools["after"][k][1], 4)}
                         for k, _ in STEPS}  # fmt: skip
    return out


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=10)  # fmt: skip
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--", "src"], capture_output=True,
                               text=True, timeout=10).stdout.strip()  # fmt: skip
        return out.stdout.strip() + (" + uncommitted changes under src/" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated: noisy, ghost")
    ap.add_argument("--repeats", type=int, default=7, help="timed runs per workload (after one warm-up)")
    ap.add_argument("--device", default="cpu", help="where the (untimed) field and texture bake run")
    ap.add_argument("--json", type=Path, default=None, help="store the results in this JSON file")
    ap.add_argument("--label", default="run", help="key of this run under runs[] in the JSON file")
    ap.add_argument("--note", default=None, help="free text stored with the run (e.g. which code ran)")
    args = ap.parse_args()
    names = [w for w in args.workloads.split(",") if w]
    unknown = sorted(set(names) - set(WORKLOADS))
    if unknown:
        sys.exit(f"error: --workloads: unknown {', '.join(unknown)}; use {', '.join(WORKLOADS)}")
    device = torch.device(args.device)

    load_before = list(__import__("os").getloadavg())
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            res = run_workload(name, args.repeats, device, Path(tmp))
            if res is not None:
                results[name] = res
    run = {
        "command": "python " + " ".join(sys.argv),
        "commit": git_commit(),
        "hardware": hardware(load_average_at_start=load_before),  # its load_average: at the end
        "repeats": args.repeats,
        "note": args.note,
        "workloads": results,
    }
    doc = {}
    if args.json is not None and args.json.exists():
        doc = json.loads(args.json.read_text())
    doc.setdefault("benchmark", __doc__.splitlines()[0])
    doc.setdefault("runs", {})[args.label] = run
    doc["summary"] = summarise(doc["runs"])
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, indent=1) + "\n")

    labels = [lb for lb in doc["runs"] if lb != args.label] + [args.label]
    for name in results:
        print(f"\n{name}: {json.dumps(results[name]['counts'])}")
        cols = [lb for lb in labels if name in doc["runs"][lb]["workloads"]]
        print(f"{'step: wall s, min (median)':<30}" + "".join(f"{lb:>22}" for lb in cols))
        for key, what in STEPS:
            cells = []
            for lb in cols:
                w = doc["runs"][lb]["workloads"][name]
                cells.append(f"{w['seconds_min'][key]:.4f} ({w['seconds_median'][key]:.4f})")
            print(f"{what:<30}" + "".join(f"{c:>22}" for c in cells))
    if args.json is not None:
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
