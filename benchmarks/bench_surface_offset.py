"""Where the splat's colour lies against the mesh's surface, and what moving the surface there costs.

    python benchmarks/bench_surface_offset.py [--splats creative ghost fruit guitar shell]
        [--shift 0 0.25 0.5] [--views 8] [--size 256] [--name NAME]

A question the fidelity benchmark (``bench_fidelity.py``) raises: its PSNR on the pixels that both the
mesh and the splat cover stops well short of the bars, while a texture cannot be sharper than the views
it is baked from agree. This measures one cause. For each splat, the mesh of the export's defaults
(:func:`microdreamer.jobs.export.splat_to_mesh` with :class:`microdreamer.config.ExportConfig`'s field
and mesh settings), then:

* **the offset**: the splat's expected depth (the alpha-weighted mean z its renders give) against the
  mesh's rasterised depth at the bake's 26 views (:func:`microdreamer.texture.bake.bake_cameras`), at
  each mesh vertex that a view sees frontally (facing cosine > 0.3, the splat's alpha > 0.95 there),
  turned into a distance along the vertex normal (``(z_splat - z_mesh) * cosine``), averaged over views
  with weight ``cosine ** 2``, then smoothed over the 1-ring three times. Reported per splat in grid
  voxels: the fraction of vertices with an estimate, median and 90th percentile.
* **the trade-off** (``moved``): the mesh decimated to the texture stage's face cap, each vertex moved
  inwards by ``shift x`` its offset (0 = the export's mesh), then the default texture stage and
  ``bench_fidelity``'s measures at its held-out views: silhouette IoU, PSNR over the object's pixels
  (either covers: the issue's measure), PSNR over the pixels both cover (the texture's colour alone) and
  the silhouette's bound.
* **the texture alone** (``transfer``, shifts above 0): the texture baked on the moved surface, shown on
  the unmoved one (same faces and UVs). It separates the bake's blending (views that disagree because
  the surface is in front of the colour) from the held-out views' own parallax.

A positive offset means the colour a view sees comes from behind the mesh's surface: baked from several
views, each texel mixes colours from points up to ``offset x tan(angle)`` apart. The expected depth is a
mean over a translucent layer, so it sits behind the first surface; the offset is an upper estimate.

Writes ``benchmarks/results/surface_offset_NAME.json`` (with the command and hardware).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time

import torch

import bench_fidelity as bf  # benchmarks/ is on sys.path when run as a script
from _common import save_result


def colour_offset(splat, vertices: torch.Tensor, faces: torch.Tensor, normals: torch.Tensor):
    """Per-vertex distance along the normal from the mesh's surface to the splat's expected depth, seen
    from the bake's views (see the module docstring).

    Returns:
        (offset [V] float32, 0 where no view gave an estimate; seen [V] bool).
    """
    from microdreamer.cameras import framing
    from microdreamer.config import BakeViewsConfig
    from microdreamer.render import render
    from microdreamer.render.mesh import rasterize_depth
    from microdreamer.texture.bake import bake_cameras

    center, radius = framing(vertices)
    cams = bake_cameras(BakeViewsConfig(), center, radius)
    with torch.no_grad():
        out = render(splat, cams, background=(0.0, 0.0, 0.0), depth=True)
    splat_depth, splat_alpha = out.depth[..., 0], out.alpha[..., 0]
    mesh_depth = rasterize_depth(vertices, faces, cams)[0][..., 0]
    C, H, W = splat_depth.shape
    num = torch.zeros(len(vertices))
    den = torch.zeros(len(vertices))
    for c in range(C):
        rot, trans, K = cams.viewmats[c, :3, :3], cams.viewmats[c, :3, 3], cams.Ks[c]
        p = vertices @ rot.T + trans
        z = p[:, 2]
        x = K[0, 0] * p[:, 0] / z + K[0, 2]
        y = K[1, 1] * p[:, 1] / z + K[1, 2]
        inside = (x >= 0) & (x < W) & (y >= 0) & (y < H) & (z > 0)
        xi, yi = x.floor().long().clamp(0, W - 1), y.floor().long().clamp(0, H - 1)
        to_cam = -rot.T @ trans - vertices
        cos = (to_cam / to_cam.norm(dim=1, keepdim=True) * normals).sum(1)
        # visible: the vertex is the mesh's nearest surface at its pixel (1 % of depth + 1 % of the radius)
        visible = (mesh_depth[c, yi, xi] - z).abs() <= 0.01 * (z + radius)
        ok = inside & visible & (cos > 0.3) & (splat_alpha[c, yi, xi] > 0.95)
        w = torch.where(ok, cos.square(), 0.0)
        num += w * ((splat_depth[c, yi, xi] - z) * cos).nan_to_num(0.0)
        den += w
    seen = den > 0
    offset = torch.where(seen, num / den.clamp_min(1e-12), 0.0)
    for _ in range(3):  # smooth over the 1-ring: half the vertex, half its neighbours' mean
        acc, cnt = torch.zeros_like(offset), torch.zeros_like(offset)
        for a, b in ((0, 1), (1, 2), (2, 0)):
            acc.index_add_(0, faces[:, a], offset[faces[:, b]])
            cnt.index_add_(0, faces[:, a], torch.ones(len(faces)))
        offset = 0.5 * offset + 0.5 * acc / cnt.clamp_min(1)
    return offset, seen


def measure(mesh, cams, ref) -> dict:
    """``bench_fidelity``'s measures of a textured ``mesh`` at ``cams`` against the splat's renders ``ref``."""
    from microdreamer.render.mesh import render_mesh

    with torch.no_grad():
        out = render_mesh(mesh, cams, background=(1.0, 1.0, 1.0), ssaa=2)
    m = bf.compare_renders(out.rgb, out.alpha, ref.rgb.float(), ref.alpha.float())
    return {k: m[k] for k in ("iou_mean", "psnr_mean", "psnr_both", "psnr_silhouette_bound", "psnr_per_view")}


def run_splat(name: str, args) -> dict:
    from microdreamer.config import ExportConfig
    from microdreamer.jobs.export import splat_to_mesh
    from microdreamer.mesh.cleanup import decimate
    from microdreamer.render import render
    from microdreamer.render.mesh import vertex_normals
    from microdreamer.texture import texture_mesh

    splat = bf.load_splat(name)
    config = ExportConfig()
    t = time.perf_counter()
    conv = splat_to_mesh(splat, config.field, config.mesh, torch.device("cpu"))
    # decimated first (as the texture stage would), so that every shift textures the same faces
    mesh = decimate(conv.mesh, config.texture.max_faces)
    vertices = torch.as_tensor(mesh.vertices, dtype=torch.float32)
    faces = torch.as_tensor(mesh.faces, dtype=torch.int64)
    normals = vertex_normals(vertices, faces)
    offset, seen = colour_offset(splat, vertices, faces, normals)
    # about the grid's spacing: the mesh's extent over the resolution (the field's box is a little larger)
    voxel = float((vertices.max(0).values - vertices.min(0).values).max()) / conv.resolution
    row = {
        "gaussians": len(splat),
        "grid": conv.resolution,
        "level": conv.iso_level,
        "faces_mesh": conv.mesh.num_faces,
        "faces": mesh.num_faces,
        "voxel_estimate": voxel,
        "vertices_seen": float(seen.float().mean()),
        "offset_voxels": {
            "median": float(offset[seen].median()) / voxel,
            "p90": float(offset[seen].quantile(0.9)) / voxel,
        },
        "seconds_mesh_and_offset": time.perf_counter() - t,
        "shifts": [],
    }
    cams = bf.eval_cameras(splat, args.views, args.size)
    with torch.no_grad():
        ref = render(splat, cams, background=(1.0, 1.0, 1.0))
    for shift in args.shift:
        moved = vertices - normals * (shift * offset.clamp_min(0.0))[:, None]
        textured = texture_mesh(dataclasses.replace(mesh, vertices=moved.numpy()), splat, config.texture).mesh
        entry = {"shift": shift, "moved": measure(textured, cams, ref)}
        if shift > 0:
            # the texture baked on the moved surface, shown on the export's: the UV unwrap splits vertices
            # at chart seams, each a copy of a moved vertex, found again by exact match
            index = {tuple(v): i for i, v in enumerate(moved.numpy().tolist())}
            back = [index[tuple(v)] for v in textured.vertices.tolist()]
            entry["transfer"] = measure(
                dataclasses.replace(textured, vertices=mesh.vertices[back]), cams, ref
            )
        row["shifts"].append(entry)
        for kind in ("moved", "transfer"):
            if kind in entry:
                m = entry[kind]
                print(f"{name:9s} offset median {row['offset_voxels']['median']:5.2f} vox, p90 "
                      f"{row['offset_voxels']['p90']:5.2f}; shift {shift:4.2f} {kind:8s}: IoU {m['iou_mean']:.3f} "
                      f"PSNR {m['psnr_mean']:5.2f} both {m['psnr_both']:5.2f} bound {m['psnr_silhouette_bound']:5.2f}",
                      flush=True)  # fmt: skip
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--splats", nargs="+", default=["creative", "ghost", "fruit", "guitar", "shell"],
                        choices=["creative", "ghost", "fruit", "guitar", "shell"])  # fmt: skip
    parser.add_argument("--shift", nargs="+", type=float, default=[0.0, 0.25, 0.5],
                        help="fractions of the offset the vertices are moved inwards")  # fmt: skip
    parser.add_argument("--views", type=int, default=8)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--name", default="cpu")
    args = parser.parse_args()
    torch.manual_seed(0)
    results = {name: run_splat(name, args) for name in args.splats}
    out = bf.ROOT / "benchmarks" / "results" / f"surface_offset_{args.name}.json"
    save_result(out, {"benchmark": "the splat's colour depth against the mesh's surface", "views": args.views,
                      "size": args.size, "results": results})  # fmt: skip
    print(f"wrote {out}")


if __name__ == "__main__":
    sys.exit(main())
