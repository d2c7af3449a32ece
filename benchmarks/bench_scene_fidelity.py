"""Is every copy of a tiled scene meshed as well as the guitar alone? Silhouette IoU and PSNR at the
fidelity benchmark's held-out views.

    python benchmarks/bench_scene_fidelity.py [--gaussians 200000] [--views 8] [--size 256]

Rows, each against the guitar's own splat rendered from ``bench_fidelity.eval_cameras`` (8 views, 256 px):
``dense``: the guitar alone through the dense export at its defaults (auto grid, auto level, carving from 24
directions) with the colour-field texture; ``tiles alone``: the guitar alone through
:func:`microdreamer.scene.scene_to_mesh` (``--tiles auto``, vertex colours); ``copy k``: copy k of the
scene (``bench_scene.scene_splat``) meshed in tiles as one scene, its connected components taken by the
copy centre they lie nearest to and moved back into the guitar's frame. Writes
benchmarks/results/scene_fidelity.json with the command and the hardware.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch

from _common import save_result  # benchmarks/ is on sys.path when run as a script
from bench_fidelity import compare_renders, eval_cameras
from bench_scene import GUITAR, scene_splat

ROOT = Path(__file__).resolve().parents[1]


def measure(mesh, cams, ref) -> dict:
    from microdreamer.render.mesh import render_mesh

    with torch.no_grad():
        out = render_mesh(mesh, cams, background=(1.0, 1.0, 1.0), ssaa=2)
    m = compare_renders(out.rgb.cpu(), out.alpha.cpu(), ref["rgb"], ref["alpha"])
    keep = ("iou_mean", "iou_min", "psnr_mean", "psnr_silhouette_bound")
    return {"faces": mesh.num_faces, **{k: round(m[k], 4) for k in keep}}


def copies_of(mesh, transforms, centre_xz: np.ndarray) -> list:
    """The scene mesh cut into its copies, each moved back into the guitar's frame: a connected component
    goes to the copy whose inverse transform takes its centroid nearest (in x-z) to the guitar's centre
    ``centre_xz``."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    from microdreamer.mesh import Mesh

    f, v = mesh.faces, mesh.num_vertices
    graph = coo_matrix((np.ones(2 * len(f)), (f[:, :2].ravel(), f[:, 1:].ravel())), shape=(v, v))
    n, label = connected_components(graph, directed=False)
    centroid = np.zeros((n, 3))
    np.add.at(centroid, label, mesh.vertices.astype(np.float64))
    centroid /= np.maximum(np.bincount(label, minlength=n), 1)[:, None]
    # R^T (x - t) row-wise is (x - t) @ R
    dist = np.stack([np.linalg.norm(((centroid - t.numpy()) @ r.numpy())[:, [0, 2]] - centre_xz, axis=1)
                     for r, t in transforms])  # fmt: skip
    owner = np.argmin(dist, axis=0)[label[f[:, 0]]]
    out = []
    for k, (rot, trans) in enumerate(transforms):
        part = Mesh(mesh.vertices, f[owner == k], mesh.vertex_colors).subset_faces(slice(None))
        back = (part.vertices.astype(np.float64) - trans.numpy()) @ rot.numpy()
        out.append(Mesh(back.astype(np.float32), part.faces, part.vertex_colors))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gaussians", type=int, default=200_000)
    ap.add_argument("--views", type=int, default=8)
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "scene_fidelity.json")
    args = ap.parse_args()
    from microdreamer.config import ExportConfig, FieldConfig, MeshConfig, TextureConfig
    from microdreamer.jobs.export import export_mesh
    from microdreamer.render.gaussians import render
    from microdreamer.scene import scene_to_mesh
    from microdreamer.splat import read_splat

    guitar = read_splat(GUITAR)
    keep = guitar.opacities() > 0.005
    lo, hi = guitar.means[keep].amin(0), guitar.means[keep].amax(0)
    centre_xz = ((lo + hi) / 2).double().numpy()[[0, 2]]
    cams = eval_cameras(guitar, args.views, args.size)
    with torch.no_grad():
        r = render(guitar, cams, background=(1.0, 1.0, 1.0))
    ref = {"rgb": r.rgb.cpu().float(), "alpha": r.alpha.cpu().float()}
    rows = {}
    cpu = torch.device("cpu")

    t = time.perf_counter()
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        dense = export_mesh(
            guitar, Path(tmp) / "g.glb", ExportConfig(texture=TextureConfig(mode="field")), cpu
        )
    rows["dense"] = {**measure(dense.mesh, cams, ref), "seconds": round(time.perf_counter() - t, 1)}
    print("dense", rows["dense"], flush=True)

    t = time.perf_counter()
    alone = scene_to_mesh(guitar, FieldConfig(), MeshConfig(threshold="auto"), colors=True)
    rows["tiles alone"] = {**measure(alone.mesh, cams, ref), "level": alone.level,
                           "seconds": round(time.perf_counter() - t, 1)}  # fmt: skip
    print("tiles alone", rows["tiles alone"], flush=True)

    scene, transforms, info = scene_splat(args.gaussians)
    t = time.perf_counter()
    result = scene_to_mesh(scene, FieldConfig(), MeshConfig(threshold="auto"), colors=True)
    seconds = round(time.perf_counter() - t, 1)
    for k, part in enumerate(copies_of(result.mesh, transforms, centre_xz)):
        rows[f"copy {k}"] = {**measure(part, cams, ref), "level": result.level}
        print(f"copy {k}", rows[f"copy {k}"], flush=True)
    save_result(args.out, {
        "benchmark": "each copy of a tiled scene against the guitar alone: silhouette IoU and PSNR at 8 held-out views",
        "scene": {**info, "tiles_with_gaussians": result.stats["tiles_with_gaussians"], "seconds": seconds},
        "rows": rows,
    })  # fmt: skip
    print(f"\n{'':<12}{'faces':>10}{'IoU':>8}{'min':>8}{'PSNR':>8}{'bound':>8}")
    for name, row in rows.items():
        print(f"{name:<12}{row['faces']:>10}{row['iou_mean']:8.3f}{row['iou_min']:8.3f}{row['psnr_mean']:8.2f}"
              f"{row['psnr_silhouette_bound']:8.2f}")  # fmt: skip
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
