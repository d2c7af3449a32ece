"""Fidelity of the splat -> mesh conversion: does the mesh look like its splat?

    python benchmarks/bench_fidelity.py [--splats creative ghost fruit guitar shell] [--resolution auto 256 ...]
        [--voxel-filter default 0 ...] [--iso auto 1.0 0.2 ...] [--carve 24 0 ...] [--carve-level 0.5 ...]
        [--texture field|bake|none] [--texture-size 1024] [--bake-size 512] [--bake-azimuths 8]
        [--bake-elevations 0 45 -45] [--bake-no-poles] [--cos-power P] [--refine STEPS] [--views 8]
        [--high-views] [--size 256]
        [--device cpu|cuda] [--name NAME]

For each splat and each combination of ``--resolution`` x ``--voxel-filter`` x ``--iso`` x ``--carve`` x
``--carve-level``: the export's own mesh stages (:func:`microdreamer.jobs.export.splat_to_mesh`: the
density field in exact mode, the iso-level, silhouette carving, marching cubes and cleanup at the
defaults), the texture stage (``--texture``; the default 50k-face cap), then renders of the mesh and of
the splat from ``--views`` held-out cameras around the object (framed on the splat as ``microdreamer
render`` frames it; azimuths 22.5 + 360 k / views degrees, elevations cycling 10, -25, -10, 25 degrees,
so that no camera is one the export itself renders; white background; the mesh with 2x supersampling)
and:

* silhouette IoU: mesh coverage (alpha > 0.5) against the splat's alpha > 0.5, per view, mean and min,
  and the pixels each covers alone;
* PSNR of the textured mesh against the splat's renders over the object's pixels (either alpha > 0.5),
  mean over views (not with ``--texture none``), and over the pixels both cover;
* the silhouette's bound on that PSNR: the same measure of the mesh's coverage filled with the splat's
  own (un-premultiplied) colours, i.e. what a perfect texture would reach on this geometry;
* faces, seconds per stage.

Splats: the four samples of ``../shared/samples/splats`` (``creative``, ``ghost``: DreamGaussian
outputs; ``fruit``: a SuperSplat sample, SH degree 3; ``guitar``: a real capture, y-down) and
``shell``: a capture-like splat built here (:func:`make_thin_shell`: small, flat, partly transparent
Gaussians in a fuzzy layer on a bumpy closed object standing on a thin pole over a ground plate, with a
thin fin), to test what the samples do not cover.

Writes ``benchmarks/results/fidelity_NAME.json`` (with the command and hardware) and one contact sheet
per splat, ``fidelity_NAME_SPLAT.png``: a row per setting, splat | mesh per view.
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch

from _common import save_result  # benchmarks/ is on sys.path when run as a script

ROOT = Path(__file__).resolve().parents[1]
SPLATS = ROOT / ".." / "shared" / "samples" / "splats"
SAMPLE_FILES = {
    "creative": "dg_creative_tmp_8.8k.ply",
    "ghost": "dg_ghost_amd_17k.ply",
    "fruit": "supersplat_fruit_drops_4.7k_sh3.ply",
    "guitar": "pc_guitar_91k_sh0.decoded.ply",
}


# ------------------------------------------------------------------------------------ inputs
def _tangent_quats(normals: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """[N, 4] (w, x, y, z) rotations taking +z to each unit normal, with a random spin about it."""
    n = torch.nn.functional.normalize(normals, dim=-1)
    # the shortest arc from +z to n: (1 + n_z, -n_y, n_x, 0), normalised (n = -z: turn about x)
    q = torch.stack([1 + n[:, 2], -n[:, 1], n[:, 0], torch.zeros_like(n[:, 0])], -1)
    flip = q[:, 0] < 1e-6
    q[flip] = torch.tensor([0.0, 1.0, 0.0, 0.0])
    q = torch.nn.functional.normalize(q, dim=-1)
    half = torch.rand(n.shape[0], generator=g) * math.pi
    spin = torch.stack([torch.cos(half), torch.zeros_like(half), torch.zeros_like(half), torch.sin(half)], -1)
    w1, x1, y1, z1 = q.unbind(-1)
    w2, x2, y2, z2 = spin.unbind(-1)
    return torch.stack([
        w1 * w2 - x1 * x2 - y1 * y2 - z1 * z2,
        w1 * x2 + x1 * w2 + y1 * z2 - z1 * y2,
        w1 * y2 - x1 * z2 + y1 * w2 + z1 * x2,
        w1 * z2 + x1 * y2 - y1 * x2 + z1 * w2,
    ], -1)  # fmt: skip


def make_thin_shell(n: int = 60_000, seed: int = 0):
    """A capture-like splat (y up, extent about 2): flat discs (in-plane sigma ~0.008-0.02, normal sigma
    1/15 of that) tangent to the surfaces, centres jittered along the normal (a fuzzy layer ~0.004 deep),
    opacities from a mixture (60 % in [0.05, 0.5], 40 % in [0.5, 1]), plus 3 % faint, larger fuzz.

    Surfaces (by share of Gaussians): a bumpy closed body of radius ~0.5 centred 0.9 above the ground
    (55 %), a ground plate 2 x 2 (25 %), a pole of radius 0.02 from the ground to the body (8 %), a fin
    (a 0.5 x 0.3 plate, both sides, no thickness) on the body's side (9 %). Colours vary smoothly.
    """
    from microdreamer.splat import Splat

    g = torch.Generator().manual_seed(seed)
    shares = {"body": 0.55, "ground": 0.25, "pole": 0.08, "fin": 0.09}
    counts = {k: int(n * v) for k, v in shares.items()}
    fuzz = n - sum(counts.values())
    pts, nrm = [], []
    # body: a bumpy sphere r(theta, phi)
    m = counts["body"]
    u = torch.rand(m, generator=g) * 2 - 1
    phi = torch.rand(m, generator=g) * 2 * math.pi
    theta = torch.acos(u)
    d = torch.stack(
        [torch.sin(theta) * torch.cos(phi), torch.cos(theta), torch.sin(theta) * torch.sin(phi)], -1
    )
    r = 0.5 * (0.88 + 0.08 * torch.sin(3 * theta) * torch.cos(2 * phi))
    pts.append(d * r[:, None] + torch.tensor([0.0, 0.9, 0.0]))
    nrm.append(d)  # close enough to the bumpy surface's normal for the discs' orientation
    # ground plate at y = 0
    m = counts["ground"]
    xz = torch.rand(m, 2, generator=g) * 2 - 1
    pts.append(torch.stack([xz[:, 0], torch.zeros(m), xz[:, 1]], -1))
    nrm.append(torch.tensor([0.0, 1.0, 0.0]).expand(m, 3))
    # pole: a cylinder of radius 0.02 from y = 0 to 0.45
    m = counts["pole"]
    a = torch.rand(m, generator=g) * 2 * math.pi
    radial = torch.stack([torch.cos(a), torch.zeros(m), torch.sin(a)], -1)
    pts.append(
        radial * 0.02 + torch.stack([torch.zeros(m), torch.rand(m, generator=g) * 0.45, torch.zeros(m)], -1)
    )
    nrm.append(radial)
    # fin: a flat plate in the plane z = 0, x in [0.4, 0.9], y in [0.8, 1.1], seen from both sides
    m = counts["fin"]
    fx = 0.4 + 0.5 * torch.rand(m, generator=g)
    fy = 0.8 + 0.3 * torch.rand(m, generator=g)
    pts.append(torch.stack([fx, fy, torch.zeros(m)], -1))
    side = torch.where(torch.rand(m, generator=g) < 0.5, -1.0, 1.0)
    nrm.append(torch.stack([torch.zeros(m), torch.zeros(m), side], -1))
    means = torch.cat(pts)
    normals = torch.cat(nrm)
    k = means.shape[0]
    tangential = 0.012 * torch.exp(0.35 * torch.randn(k, 2, generator=g))
    scales = torch.cat([tangential, tangential.amin(-1, keepdim=True) / 15.0], -1)
    means = means + normals * (0.002 * torch.randn(k, 1, generator=g))
    quats = _tangent_quats(normals, g)
    mix = torch.rand(k, generator=g) < 0.6
    opac = torch.where(mix, 0.05 + 0.45 * torch.rand(k, generator=g), 0.5 + 0.5 * torch.rand(k, generator=g))
    # faint fuzz: larger, nearly isotropic, low opacity, near the surfaces
    pick = torch.randint(0, k, (fuzz,), generator=g)
    f_means = means[pick] + 0.01 * torch.randn(fuzz, 3, generator=g)
    f_scales = 0.02 * torch.exp(0.3 * torch.randn(fuzz, 3, generator=g))
    f_quats = torch.nn.functional.normalize(torch.randn(fuzz, 4, generator=g), dim=-1)
    f_opac = 0.02 + 0.1 * torch.rand(fuzz, generator=g)
    means = torch.cat([means, f_means])
    colors = 0.5 + 0.35 * torch.stack(
        [torch.sin(4 * means[:, 0]), torch.cos(3 * means[:, 1]), torch.sin(5 * means[:, 2] + means[:, 1])], -1
    )
    return Splat.from_activated(
        means,
        torch.cat([scales, f_scales]),
        torch.cat([quats, f_quats]),
        torch.cat([opac, f_opac]),
        colors.clamp(0.0, 1.0),
    )


def load_splat(name: str):
    from microdreamer.splat import read_ply

    if name == "shell":
        return make_thin_shell()
    path = SPLATS / SAMPLE_FILES[name]
    if not path.exists():
        sys.exit(f"error: {path}: not found (the sample splats live in ../shared/samples/splats)")
    return read_ply(path)


EVAL_ELEVATIONS = (10.0, -25.0, -10.0, 25.0)
HIGH_ELEVATIONS = (40.0, -50.0, 55.0, -35.0)


def eval_cameras(splat, views: int, size: int, elevations=EVAL_ELEVATIONS, azimuth0: float = 22.5):
    """The held-out cameras: framed on the splat (turntable's framing), azimuths ``azimuth0`` + 360 k /
    views degrees, elevations cycling ``elevations`` (default 10, -25, -10, 25 degrees): none of them is a
    view the export renders (the bake's rings at 0 and +-45 degrees every 45 degrees from azimuth 0, and
    its poles); the carving's directions are orthographic and fixed in the grid's frame. The
    ``--high-views`` set (40, -50, 55, -35 degrees from azimuth 10) looks from above and below the bake's
    rings instead."""
    from microdreamer.cameras import centred_orbit_cameras
    from microdreamer.jobs.turntable import splat_framing

    center, radius = splat_framing(splat)
    az = torch.tensor([azimuth0 + 360.0 * k / views for k in range(views)])
    el = torch.tensor([elevations[k % len(elevations)] for k in range(views)])
    return centred_orbit_cameras(el, az, center, radius, 49.1, size, 1.1)


# ------------------------------------------------------------------------------------ measures
def silhouette_iou(mesh_alpha: torch.Tensor, splat_alpha: torch.Tensor) -> torch.Tensor:
    """[C] IoU of ``mesh_alpha > 0.5`` and ``splat_alpha > 0.5`` (both [C, H, W, 1])."""
    a, b = mesh_alpha[..., 0] > 0.5, splat_alpha[..., 0] > 0.5
    union = (a | b).sum((1, 2)).clamp_min(1)
    return (a & b).sum((1, 2)).double() / union.double()


def object_psnr(pred: torch.Tensor, ref: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[C] PSNR over the pixels of ``mask`` [C, H, W] of two [C, H, W, 3] images in [0, 1]."""
    se = (pred.clamp(0, 1) - ref.clamp(0, 1)).square().sum(-1)
    mse = (se * mask).sum((1, 2)) / (3.0 * mask.sum((1, 2)).clamp_min(1))
    return -10.0 * torch.log10(mse.double().clamp_min(1e-12))


def contact_rows(splat_rgb: torch.Tensor, mesh_rgb: torch.Tensor, tile: int = 128) -> np.ndarray:
    """[2 * tile, 4 * 2 * tile, 3] uint8: splat | mesh per view, four views per row (two rows; extra
    views are left out)."""

    def small(x):
        x = x.permute(0, 3, 1, 2).float()
        return torch.nn.functional.interpolate(x, size=(tile, tile), mode="area").permute(0, 2, 3, 1)

    s, m = small(splat_rgb[:8]), small(mesh_rgb[:8])
    pairs = [torch.cat([s[i], m[i]], 1) for i in range(s.shape[0])]
    while len(pairs) < 8:
        pairs.append(torch.ones_like(pairs[0]))
    rows = [torch.cat(pairs[r * 4 : (r + 1) * 4], 1) for r in range(2)]
    return (torch.cat(rows, 0).clamp(0, 1) * 255).round().to(torch.uint8).numpy()


def labelled(image: np.ndarray, text: str) -> np.ndarray:
    from PIL import Image, ImageDraw

    pil = Image.fromarray(image)
    ImageDraw.Draw(pil).text((4, 2), text, fill=(200, 0, 0))
    return np.asarray(pil)


def compare_renders(mesh_rgb, mesh_alpha, ref_rgb, ref_alpha) -> dict:
    """The measures of a mesh's renders ([C, H, W, 3] and [C, H, W, 1], white background) against the
    splat's at the same cameras: silhouette IoU per view, mean and min; the pixels each covers alone;
    PSNR on object pixels (either covers) per view and mean, on the pixels both cover, and the
    silhouette's bound."""
    iou = silhouette_iou(mesh_alpha, ref_alpha)
    a, b = mesh_alpha[..., 0] > 0.5, ref_alpha[..., 0] > 0.5
    union = (a | b).float()
    # the silhouette's bound: the mesh's coverage with the splat's own (un-premultiplied) colours, per
    # pixel and view (more than one texture can hold)
    splat_colour = ((ref_rgb - (1.0 - ref_alpha)) / ref_alpha.clamp_min(1e-4)).clamp(0.0, 1.0)
    bound = mesh_alpha * splat_colour + (1.0 - mesh_alpha)
    p = object_psnr(mesh_rgb, ref_rgb, union)
    return {
        "iou_per_view": [round(float(x), 4) for x in iou],
        "iou_mean": float(iou.mean()),
        "iou_min": float(iou.min()),
        "mesh_only_pixels": int((a & ~b).sum()),
        "splat_only_pixels": int((b & ~a).sum()),
        "psnr_silhouette_bound": float(object_psnr(bound, ref_rgb, union).mean()),
        "psnr_per_view": [round(float(x), 3) for x in p],
        "psnr_mean": float(p.mean()),
        "psnr_both": float(object_psnr(mesh_rgb, ref_rgb, (a & b).float()).mean()),
    }


# ------------------------------------------------------------------------------------ one setting
def run_setting(splat, ref, cams, setting, args, device) -> tuple[dict, np.ndarray]:
    """One (resolution, voxel filter, iso, carve, carve level) setting through the export's own stages:
    :func:`microdreamer.jobs.export.splat_to_mesh` (field, iso-level, carving, marching cubes, cleanup),
    then :func:`microdreamer.texture.texture_mesh`; renders of the mesh from ``cams`` against ``ref``."""
    from microdreamer.field import FieldConfig
    from microdreamer.jobs.export import splat_to_mesh
    from microdreamer.mesh import MeshConfig
    from microdreamer.profiling import StageTimer
    from microdreamer.render.mesh import render_mesh

    resolution, voxel_filter, iso, carve, carve_level = setting
    fcfg = FieldConfig(resolution=resolution if resolution == "auto" else int(resolution),
                       voxel_filter=None if voxel_filter == "default" else float(voxel_filter))  # fmt: skip
    mcfg = MeshConfig(
        threshold=iso if iso == "auto" else float(iso), carve=int(carve), carve_level=float(carve_level)
    )
    timer = StageTimer()
    row = {"resolution": resolution, "voxel_filter": voxel_filter, "iso": iso, "carve": int(carve),
           "carve_level": float(carve_level)}  # fmt: skip
    try:
        conv = splat_to_mesh(splat.to(device), fcfg, mcfg, device, timer=timer)
    except Exception as exc:  # a setting with no surface is a result, not a crash
        row.update(faces=0, iou_mean=0.0, iou_min=0.0, seconds=timer.seconds, note=str(exc))
        return row, None
    mesh = conv.mesh
    row.update(grid=conv.resolution, level=conv.iso_level, predicted_iou=conv.iso_iou, carved=conv.carve,
               faces_mesh=mesh.num_faces, components=conv.mesh_stats.get("components"),
               components_removed=conv.mesh_stats.get("components_removed"))  # fmt: skip
    seconds = dict(timer.seconds)
    if args.texture != "none":
        from microdreamer.texture import BakeConfig, BakeViewsConfig, TextureConfig, texture_mesh

        t = time.perf_counter()
        tcfg = TextureConfig(mode=args.texture, size=args.texture_size)
        views = {}
        if args.bake_size is not None:
            views["size"] = args.bake_size
        if args.bake_azimuths is not None:
            views["azimuths"] = args.bake_azimuths
        if args.bake_elevations is not None:
            views["elevations"] = tuple(args.bake_elevations)
        if args.bake_no_poles:
            views["poles"] = False
        if views or args.cos_power is not None:
            tcfg.bake = BakeConfig(views=BakeViewsConfig(**views))
        if args.cos_power is not None:
            tcfg.bake.cos_power = args.cos_power
        tcfg.refine.steps = args.refine
        mesh = texture_mesh(mesh, splat.to(device), tcfg, device).mesh
        seconds["texture"] = time.perf_counter() - t
    row["faces"] = mesh.num_faces
    t = time.perf_counter()
    with torch.no_grad():
        out = render_mesh(mesh, cams.to(device), background=(1.0, 1.0, 1.0), ssaa=2)
    seconds["render_mesh"] = time.perf_counter() - t
    mesh_rgb, mesh_alpha = out.rgb.cpu(), out.alpha.cpu()
    measured = compare_renders(mesh_rgb, mesh_alpha, ref["rgb"], ref["alpha"])
    if args.texture == "none":  # an untextured mesh's colours say nothing
        measured = {k: v for k, v in measured.items() if k not in ("psnr_per_view", "psnr_mean", "psnr_both")}
    row.update(measured)
    row["seconds"] = seconds
    label = (f"R{conv.resolution} carve {carve}x{carve_level} iso {iso} -> {conv.iso_level:.4g}: "
             f"IoU {row['iou_mean']:.3f}, bound {row['psnr_silhouette_bound']:.1f}")  # fmt: skip
    if "psnr_mean" in row:
        label += f", PSNR {row['psnr_mean']:.2f}"
    return row, labelled(contact_rows(ref["rgb"], mesh_rgb), label)


def _line(name: str, row: dict) -> str:
    psnr = f"{row['psnr_mean']:6.2f}" if "psnr_mean" in row else "     -"
    secs = ", ".join(f"{k} {v:.2f}" for k, v in row["seconds"].items())
    return (f"{name:<9} R{row.get('grid', row['resolution'])!s:<4} carve {row['carve']:>2} x{row['carve_level']:<4} "
            f"level {row.get('level') or 0:<8.4g} IoU {row['iou_mean']:.3f} (min {row['iou_min']:.3f}) "
            f"bound {row.get('psnr_silhouette_bound', 0):5.2f} PSNR {psnr} faces {row.get('faces', 0):>7}  s: {secs}")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--splats", nargs="+", default=["creative", "ghost", "fruit", "guitar", "shell"],
                    choices=[*SAMPLE_FILES, "shell"])  # fmt: skip
    ap.add_argument("--resolution", nargs="+", default=["auto"], help="grid points per axis, or auto")
    ap.add_argument(
        "--voxel-filter", nargs="+", default=["default"], help="default or squared voxels, e.g. 0"
    )
    ap.add_argument("--iso", nargs="+", default=["auto"], help="auto or a density level")
    ap.add_argument("--carve", nargs="+", default=["24"], help="carving directions (0: off)")
    ap.add_argument("--carve-level", nargs="+", default=["0.5"], help="MeshConfig.carve_level values")
    ap.add_argument("--texture", choices=["field", "bake", "none"], default="field")
    ap.add_argument("--texture-size", type=int, default=1024)
    ap.add_argument(
        "--refine",
        type=int,
        default=0,
        help="texture refinement steps against the splat's renders (TextureConfig.refine.steps)",
    )
    ap.add_argument("--bake-size", type=int, default=None, help="bake view size (default: the bake's, 512)")
    ap.add_argument("--bake-azimuths", type=int, default=None, help="bake views per ring (default: 8)")
    ap.add_argument("--bake-elevations", type=float, nargs="+", default=None,
                    help="bake ring elevations (default: 0 45 -45)")  # fmt: skip
    ap.add_argument("--bake-no-poles", action="store_true", help="no bake views straight above and below")
    ap.add_argument(
        "--cos-power", type=float, default=None, help="the bake's blending power (default: BakeConfig's)"
    )
    ap.add_argument("--views", type=int, default=8)
    ap.add_argument("--high-views", action="store_true", help="held-out views at elevations 40, -50, 55, -35")
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument(
        "--name", default="cpu", help="results go to fidelity_NAME.json / fidelity_NAME_SPLAT.png"
    )
    args = ap.parse_args()
    device = torch.device(args.device)
    from PIL import Image

    from microdreamer.render.gaussians import render

    out_dir = ROOT / "benchmarks" / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    results = {}
    for name in args.splats:
        splat = load_splat(name)
        cams = (eval_cameras(splat, args.views, args.size, HIGH_ELEVATIONS, 10.0) if args.high_views
                else eval_cameras(splat, args.views, args.size))  # fmt: skip
        t = time.perf_counter()
        with torch.no_grad():
            r = render(splat.to(device), cams.to(device), background=(1.0, 1.0, 1.0))
        ref = {"rgb": r.rgb.cpu().float(), "alpha": r.alpha.cpu().float()}
        render_seconds = time.perf_counter() - t
        rows, sheets = [], []
        grid = itertools.product(args.resolution, args.voxel_filter, args.iso, args.carve, args.carve_level)
        for setting in grid:
            if int(setting[3]) == 0 and setting[4] != args.carve_level[0]:
                continue  # the carve level means nothing without carving
            row, sheet = run_setting(splat, ref, cams, setting, args, device)
            rows.append(row)
            if sheet is not None:
                sheets.append(sheet)
            print(_line(name, row), flush=True)
        results[name] = {
            "gaussians": len(splat),
            "render_splat_seconds": render_seconds,
            "settings": rows,
        }
        if sheets:
            Image.fromarray(np.concatenate(sheets, 0)).save(out_dir / f"fidelity_{args.name}_{name}.png")
    save_result(out_dir / f"fidelity_{args.name}.json", {
        "benchmark": "splat -> mesh fidelity: silhouette IoU and object PSNR of the mesh against the splat",
        "views": args.views, "high_views": args.high_views, "size": args.size, "texture": args.texture, "texture_size": args.texture_size,
        "bake_size": args.bake_size, "bake_azimuths": args.bake_azimuths, "bake_elevations": args.bake_elevations,
        "bake_poles": not args.bake_no_poles, "cos_power": args.cos_power, "refine_steps": args.refine,
        "device": args.device, "results": results,
    })  # fmt: skip
    for name, res in results.items():
        for row in res["settings"]:
            print(_line(name, row))
    print(f"wrote {out_dir / f'fidelity_{args.name}.json'}")


if __name__ == "__main__":
    main()
