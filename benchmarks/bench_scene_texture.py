"""Per-tile UV bake of a tiled scene (:func:`microdreamer.scene.texture.texture_scene`) against the vertex
colours of the colour field: seconds per tile and in total on ``bench_scene``'s scene, and the PSNR of the
guitar alone (one tile) at ``bench_fidelity``'s held-out views.

    python benchmarks/bench_scene_texture.py [--gaussians 1000000] [--size 1024] [--skip-scene]

Writes benchmarks/results/scene_texture_<gaussians>.json with the command and the hardware.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

import torch

from _common import save_result  # benchmarks/ is on sys.path when run as a script
from bench_fidelity import eval_cameras
from bench_scene import GUITAR, scene_splat
from bench_scene_fidelity import measure

ROOT = Path(__file__).resolve().parents[1]


def peak_rss_gib() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gaussians", type=int, default=1_000_000)
    ap.add_argument("--size", type=int, default=1024, help="texture side per tile")
    ap.add_argument("--skip-scene", action="store_true", help="only the guitar's fidelity")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    from microdreamer.config import FieldConfig, MeshConfig, TextureConfig
    from microdreamer.render.gaussians import render
    from microdreamer.scene import plan_scene, scene_to_mesh
    from microdreamer.scene.texture import texture_scene
    from microdreamer.splat import read_splat

    config = TextureConfig(size=args.size)
    out = {"command": "python " + " ".join(sys.argv), "size": args.size}

    guitar = read_splat(GUITAR)
    cams = eval_cameras(guitar, 8, 256)
    with torch.no_grad():
        r = render(guitar, cams, background=(1.0, 1.0, 1.0))
    ref = {"rgb": r.rgb.cpu().float(), "alpha": r.alpha.cpu().float()}
    plan = plan_scene(guitar, FieldConfig(), tiles_along_longest=1)
    alone = scene_to_mesh(guitar, FieldConfig(), MeshConfig(threshold="auto"), colors=True, plan=plan)
    t = time.perf_counter()
    tiles = texture_scene(alone, guitar, config)
    bake_seconds = time.perf_counter() - t
    out["guitar_one_tile"] = {
        "vertex colours": measure(alone.mesh, cams, ref),
        "bake": {
            **measure(tiles[0].mesh, cams, ref),
            **tiles[0].stats,
            "wall_seconds": round(bake_seconds, 1),
        },
    }
    print("guitar, one tile:", out["guitar_one_tile"], flush=True)

    if not args.skip_scene:
        scene, _, info = scene_splat(args.gaussians)
        t = time.perf_counter()
        result = scene_to_mesh(scene, FieldConfig(), MeshConfig(threshold="auto"), colors=True)
        mesh_seconds = time.perf_counter() - t
        t = time.perf_counter()
        tiles = texture_scene(result, scene, config, progress=print)
        total = time.perf_counter() - t
        per_tile = [
            {k: s[k] for k in ("tile", "views", "cameras", "positions", "coverage", "ring_coverage", "gaussians",
                               "texels_from_views", "texels_from_field", "seconds")} | {"faces": m.num_faces}
            for m, s in ((tt.mesh, tt.stats) for tt in tiles)
        ]  # fmt: skip
        out["scene"] = {
            **info,
            "faces": result.mesh.num_faces,
            "tiles_textured": len(tiles),
            "mesh_seconds_with_vertex_colours": round(mesh_seconds, 1),
            "vertex_colour_seconds": round(result.stats["seconds"].get("colour", 0.0), 1),
            "bake_seconds_total": round(total, 1),
            "bake_seconds_per_tile": round(total / max(len(tiles), 1), 1),
            "peak_rss_GiB": peak_rss_gib(),
            "tiles": per_tile,
        }
        print({k: v for k, v in out["scene"].items() if k != "tiles"}, flush=True)
    path = args.out or ROOT / "benchmarks" / "results" / f"scene_texture_{args.gaussians // 1000}k.json"
    save_result(path, {"benchmark": "per-tile UV bake of a tiled scene against vertex colours", **out})
    print(f"-> {path}")


if __name__ == "__main__":
    main()
