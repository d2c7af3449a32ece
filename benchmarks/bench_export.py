"""Splat -> textured GLB, every stage timed: in-process after a warm-up, and the CLI's wall clock.

    python benchmarks/bench_export.py --device cuda --out benchmarks/results/export_h200.json
    python benchmarks/bench_export.py --device cpu --cases ghost@128,guitar@256 --out benchmarks/results/export_cpu.json

Cases are ``NAME@R``: NAME a shared splat (``creative``, ``ghost``, ``fruit``, ``guitar``, from
``../shared/samples/splats``) or ``synthNk`` / ``synthNM`` (``make_synthetic_object`` of N thousand / million
Gaussians, seeded, written to a PLY first so that reading is timed too), R the grid resolution. Each case runs
``jobs.export.export_mesh`` once to warm up (extension build, first-use allocations), then ``--repeat`` times;
the medians of: read, field (prepare + kernel), marching cubes, cleanup, decimation, unwrap, texels, bake
(render, rasterize, project; or the colour field), fill, export (GLB encode + write). Then, for the shared
splats, ``--cli-repeat`` runs of the console script ``microdreamer mesh`` in fresh processes: their wall clock
(start-up included) beside the in-process total. A table is printed last; the JSON carries the command and the
hardware; ``--chart`` writes the Amdahl chart (each stage's share, the speed-up left if it cost nothing) of one
case.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from _common import hardware  # benchmarks/ is on sys.path when run as a script

ROOT = Path(__file__).resolve().parents[1]
SPLATS = ROOT.parent / "shared" / "samples" / "splats"
SHARED = {
    "creative": "dg_creative_tmp_8.8k.ply",
    "ghost": "dg_ghost_amd_17k.ply",
    "fruit": "supersplat_fruit_drops_4.7k_sh3.ply",
    "guitar": "pc_guitar_91k_sh0.decoded.ply",
}
DEFAULT_CASES = {
    "cuda": "ghost@128,creative@128,fruit@128,guitar@256,guitar@512,synth100k@256,synth500k@512,synth1M@512",
    "cpu": "ghost@128,creative@128,fruit@128,guitar@256",
}
STAGES = ("read", "field", "iso", "carve", "marching_cubes", "cleanup", "decimate_mesh", "decimate", "unwrap", "texels",
          "render", "rasterize", "project", "field_bake", "fill", "export")  # fmt: skip


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def case_input(name: str, tmp: Path) -> Path:
    if name in SHARED:
        return SPLATS / SHARED[name]
    m = re.fullmatch(r"synth(\d+)([kM])", name)
    if not m:
        raise SystemExit(f"error: case {name!r}: use one of {', '.join(SHARED)} or synthNk / synthNM")
    n = int(m.group(1)) * (1000 if m.group(2) == "k" else 1_000_000)
    path = tmp / f"{name}.ply"
    if not path.exists():
        from microdreamer.splat import write_ply
        from microdreamer.synthetic import make_synthetic_object

        write_ply(make_synthetic_object(n, seed=0, scale_fraction=0.004), path)
    return path


def cli_mesh(path: Path, r: int, device: torch.device):
    """The untextured mesh ``microdreamer mesh`` makes of the splat at ``path`` on a grid of ``r``^3
    (ExportConfig's field and mesh settings, upright), and that config."""
    import dataclasses

    from microdreamer.config import ExportConfig
    from microdreamer.jobs.export import splat_to_mesh, upright
    from microdreamer.splat import read_ply

    cfg = ExportConfig()
    splat = upright(read_ply(path).to(device), cfg.up)
    field = dataclasses.replace(cfg.field, resolution=r)
    return splat_to_mesh(splat, field, cfg.mesh, device).mesh, cfg


def one_export(path: Path, out: Path, cfg, device: torch.device) -> dict:
    """Per-stage seconds of one in-process export of ``path``."""
    from microdreamer.jobs.export import export_mesh
    from microdreamer.profiling import StageTimer
    from microdreamer.splat import read_ply

    sync(device)
    t = time.perf_counter()
    splat = read_ply(path).to(device)
    sync(device)
    read = time.perf_counter() - t
    timer = StageTimer()
    t = time.perf_counter()
    result = export_mesh(splat, out, cfg, device, timer=timer)
    sync(device)
    total = time.perf_counter() - t + read
    mesh_s = result.convert.mesh_stats.get("seconds", {})
    tex_s = result.texture_stats.get("seconds", {})
    stages = {
        "read": read,
        "field": timer.seconds["field"],
        "iso": timer.seconds.get("iso", 0.0),
        "carve": timer.seconds.get("carve", 0.0),
        "marching_cubes": mesh_s.get("marching_cubes", 0.0),
        "cleanup": mesh_s.get("cleanup", 0.0),
        "decimate_mesh": mesh_s.get("decimate", 0.0),
        "decimate": tex_s.get("decimate", 0.0),
        "unwrap": tex_s.get("unwrap", 0.0),
        "texels": tex_s.get("texels", 0.0),
        "render": tex_s.get("render", 0.0),
        "rasterize": tex_s.get("rasterize", 0.0),
        "project": tex_s.get("project", 0.0),
        "field_bake": tex_s.get("field", 0.0),
        "fill": tex_s.get("fill", 0.0),
        "export": timer.seconds["export"],
    }
    # what the texture stage spent outside its listed steps (moves, setup) and the mesh stage likewise
    stages["other"] = max(0.0, total - sum(stages.values()))
    return {"stages": stages, "total": total, "faces": result.mesh.num_faces, "vertices": result.mesh.num_vertices,
            "gaussians": result.convert.num_gaussians_in, "mesh_backend": result.convert.mesh_stats.get("backend"),
            "field_backend": result.convert.backend, "charts": result.texture_stats.get("charts"),
            "utilization": result.texture_stats.get("utilization")}  # fmt: skip


def cli_wall(path: Path, out: Path, r: int, device: str, repeat: int, extra: list[str]) -> dict:
    exe = shutil.which("microdreamer")
    cmd = [exe or sys.executable, *([] if exe else ["-m", "microdreamer.cli"]), "mesh", str(path), "-o", str(out),
           "--resolution", str(r), "--device", device, *extra]  # fmt: skip
    walls, printed = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True)
        walls.append(time.perf_counter() - t)
        if p.returncode != 0:
            return {"command": " ".join(cmd), "error": p.stderr.strip().splitlines()[-1:]}
        line = [x for x in p.stdout.splitlines() if x.startswith("seconds:")]
        printed = line[-1] if line else None
    return {
        "command": " ".join(cmd),
        "wall_s": walls,
        "median_wall_s": statistics.median(walls),
        "printed": printed,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cpu", "cuda"]
    )
    ap.add_argument("--cases", default=None, help="NAME@R,... (default: by device, see the module docstring)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cli-repeat", type=int, default=2)
    ap.add_argument("--texture", default="bake", choices=["bake", "field", "none"])
    ap.add_argument("--unwrap", default=None, help="TextureConfig.unwrap (default: the config's)")
    ap.add_argument("--config", default=None, help="an ExportConfig preset applied to every case")
    ap.add_argument("--chart", default=None, metavar="NAME@R", help="write the Amdahl chart of this case")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    import dataclasses

    from microdreamer.config import ExportConfig, load_preset

    device = torch.device(args.device)
    base = load_preset(ExportConfig, args.config) if args.config else ExportConfig()
    texture = dataclasses.replace(base.texture, mode=args.texture)
    if args.unwrap:
        texture = dataclasses.replace(texture, unwrap=args.unwrap)
    base = dataclasses.replace(base, texture=texture)
    cases = [c.split("@") for c in (args.cases or DEFAULT_CASES[device.type]).split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        for name, r in cases:
            if name in SHARED and not (SPLATS / SHARED[name]).exists():
                print(f"{name}: sample not found in {SPLATS}; skipped", file=sys.stderr)
                continue
            path = case_input(name, tmp)
            cfg = dataclasses.replace(base, field=dataclasses.replace(base.field, resolution=int(r)))
            out = tmp / f"{name}_{r}.glb"
            one_export(path, out, cfg, device)  # warm-up
            runs = [one_export(path, out, cfg, device) for _ in range(args.repeat)]
            stages = {k: statistics.median(run["stages"][k] for run in runs) for k in runs[0]["stages"]}
            row = {"case": f"{name}@{r}", "input": str(path.name), "R": int(r), **{k: v for k, v in runs[0].items()
                   if k not in ("stages", "total")}, "stages_s": stages,
                   "total_s": statistics.median(run["total"] for run in runs)}  # fmt: skip
            if name in SHARED and args.cli_repeat > 0:
                extra = ["--texture", args.texture] + (["--config", args.config] if args.config else [])
                row["cli"] = cli_wall(
                    path, tmp / f"cli_{name}_{r}.glb", int(r), args.device, args.cli_repeat, extra
                )
            rows.append(row)
            print(f"{row['case']}: {row['total_s']:.3f} s in-process, {row['faces']} faces", flush=True)
            if args.chart == row["case"]:
                from microdreamer.profiling import write_profile

                chart_dir = args.out.parent if args.out else ROOT / "benchmarks" / "results"
                name_ = f"export_{'h200' if device.type == 'cuda' else 'cpu'}_amdahl"
                write_profile({k: v for k, v in stages.items() if v > 0}, chart_dir,
                              f"splat -> textured GLB, {row['case']} on {args.device}", name=name_)  # fmt: skip
    result = {"command": " ".join([Path(sys.executable).name, *sys.argv]), "hardware": hardware(),
              "texture": args.texture, "rows": rows}  # fmt: skip
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))
    shown = [s for s in (*STAGES, "other") if any(row["stages_s"].get(s, 0) > 5e-4 for row in rows)]
    print("\nmedian seconds per stage, in-process after warm-up (" + args.device + ")")
    print(
        f"{'case':<16}" + "".join(f"{s[:9]:>10}" for s in shown) + f"{'total':>9}{'CLI wall':>10}{'faces':>8}"
    )
    for row in rows:
        wall = row.get("cli", {}).get("median_wall_s")
        print(f"{row['case']:<16}" + "".join(f"{row['stages_s'].get(s, 0):>10.3f}" for s in shown)
              + f"{row['total_s']:>9.3f}" + (f"{wall:>10.2f}" if wall else f"{'-':>10}") + f"{row['faces']:>8}")  # fmt: skip


if __name__ == "__main__":
    main()
