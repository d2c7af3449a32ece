"""UV unwrap benchmark: speed and texture fidelity of unwrap_charts against xatlas (and uvunwrap).

    python benchmarks/bench_unwrap.py [--device cpu|cuda] [--cases NAME ...] [--cache DIR]
                                      [--faces 50000] [--texture-size 1024] [--view-size 256]
                                      [--bake-cases NAME ...] [--bake-view-size 256] [--repeat 3] [--out FILE.json]

Cases: the four shared splats meshed at 128^3 (``creative``, ``ghost``, ``fruit``, ``guitar``), the
guitar at 256^3 (``guitar256``), and ``blob``, a synthetic noisy closed surface of ~330k faces with a
surface splat made in code (flat Gaussians at area-weighted surface samples, coloured by position).
The meshes are made with the export's mesh stage at those resolutions (:func:`microdreamer.jobs.export.
splat_to_mesh` with :class:`microdreamer.config.ExportConfig`'s mesh settings: the iso-level from the splat,
silhouette carving; the meshes ``microdreamer mesh`` unwraps) and cached in ``--cache`` (default
/tmp/microdreamer_unwrap_cache).

For each case and unwrap, with the same face cap (``--faces``, decimation timed apart):

* ``xatlas``: :func:`microdreamer.texture.unwrap` (its defaults: one chart iteration, block-aligned
  packing at the texture size);
* ``charts``: :func:`microdreamer.texture.charts.unwrap_charts` (defaults: skyline packing);
* ``charts_torch``: the same with ``backend="torch"`` (the PyTorch slab extents and row spans instead of
  the C++ CPU kernels; the same layout, checked; only its time is recorded);
* ``charts_shelf``: the same with shelf packing;
* ``charts_nocap``: unwrap_charts of the full mesh (is the decimation still needed?);
* ``uvunwrap``: uvunwrap's ``generate`` (``packing="fast"``), when it is installed.

Speed: wall and CPU seconds of the unwrap, the charts variants after one untimed call each, the median of
``--repeat`` calls (xatlas, at seconds to tens of seconds, is timed once, cold; it uses its own threads; torch ``--threads``, 1 by
default on a CPU run: on a shared 2-core machine more threads only contend). Fidelity: each layout
baked with ``mode="field"`` at ``--texture-size``^2 (texel samples, colour field, fill), the textured mesh rendered at 8 views around the object
(elevations 0 and +-30 degrees, :func:`centred_orbit_cameras` framing) with
:func:`microdreamer.render.mesh.render_mesh` and compared, on object pixels (splat alpha > 0.5),
with (a) the splat's own render (torch backend; ``psnr_vs_splat``; ``psnr_vs_splat_on_mesh`` on the
pixels the mesh covers too, as the meshes of captured splats miss parts) and (b) the colour field
evaluated at each pixel's surface point (``psnr_vs_field``: the texture's own loss, from resolution,
seams and fill, insensitive to the mesh's shape error). ``--bake-cases`` also bake with
``mode="bake"`` (splat renders of ``--bake-view-size``).
``charts_vs_xatlas_field``: the two field-baked renders against each other (seams and resolution
show there). Contact sheets (xatlas | charts | splat | their difference x8, 4 views) go to benchmarks/results/unwrap_sheet_<case>.png;
the JSON (command, hardware) to ``--out`` (default benchmarks/results/unwrap_<device>.json).
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import numpy as np
import torch

from _common import save_result  # benchmarks/ is on sys.path when run as a script

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / ".." / "shared" / "samples"
RESULTS = ROOT / "benchmarks" / "results"

SPLATS = {
    "creative": ("dg_creative_tmp_8.8k.ply", 128),
    "ghost": ("dg_ghost_amd_17k.ply", 128),
    "fruit": ("supersplat_fruit_drops_4.7k_sh3.ply", 128),
    "guitar": ("pc_guitar_91k_sh0.decoded.ply", 128),
    "guitar256": ("pc_guitar_91k_sh0.decoded.ply", 256),
}
CASES = (*SPLATS, "blob")


# ---------------------------------------------------------------------------------------------------
# inputs


def surface_splat_of(mesh, n: int, seed: int = 0):
    """Flat Gaussians at n area-weighted surface samples of ``mesh``, tangent to it, coloured by
    :func:`microdreamer.synthetic.position_color`, sized to the mean sample spacing."""
    from microdreamer.synthetic import tangent_splat

    rng = np.random.default_rng(seed)
    tri = mesh.vertices.astype(np.float64)[mesh.faces]
    cross = np.cross(tri[:, 1] - tri[:, 0], tri[:, 2] - tri[:, 0])
    area = 0.5 * np.linalg.norm(cross, axis=1)
    face = rng.choice(len(area), n, p=area / area.sum())
    r1, r2 = np.sqrt(rng.random(n)), rng.random(n)
    bary = np.stack([1 - r1, r1 * (1 - r2), r1 * r2], 1)
    means = (bary[:, :, None] * tri[face]).sum(1)
    normal = cross[face] / np.linalg.norm(cross[face], axis=1, keepdims=True)
    return tangent_splat(means, normal, math.sqrt(area.sum() / n), 0.1)


def load_case(name: str, cache: Path, device: torch.device):
    """(mesh, splat, seconds to make the mesh or None when cached) of a case."""
    from microdreamer.mesh import Mesh

    if name == "blob":
        from microdreamer.synthetic import noisy_blob

        mesh = noisy_blob(330_000)
        return mesh, surface_splat_of(mesh, 60_000), None
    from microdreamer.config import ExportConfig
    from microdreamer.field import FieldConfig
    from microdreamer.jobs.export import splat_to_mesh
    from microdreamer.splat import read_ply

    file, resolution = SPLATS[name]
    splat = read_ply(SAMPLES / "splats" / file)
    path = cache / f"{name}_export.npz"
    if path.exists():
        data = np.load(path)
        return Mesh(data["vertices"], data["faces"]), splat, None
    start = time.perf_counter()
    mesh = splat_to_mesh(splat, FieldConfig(resolution=resolution), ExportConfig().mesh, device).mesh
    seconds = time.perf_counter() - start
    cache.mkdir(parents=True, exist_ok=True)
    np.savez(path, vertices=mesh.vertices, faces=mesh.faces)
    return mesh, splat, seconds


# ---------------------------------------------------------------------------------------------------
# unwraps


def timed(fn):
    """(result, wall seconds, CPU seconds of this process) of ``fn()``."""
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - wall, time.process_time() - cpu


def uvunwrap_layout(mesh, size: int, padding: int):
    """uvunwrap's fast-packing unwrap as a UVLayout (None when uvunwrap is not installed)."""
    try:
        import uvunwrap
    except ImportError:
        return None
    from microdreamer.mesh import Mesh
    from microdreamer.texture import UVLayout

    um = uvunwrap.Mesh(mesh.vertices, mesh.faces.astype(np.uint32).ravel())
    atlas = uvunwrap.generate([um], page_size=size, padding=padding, packing="fast")
    out = atlas.meshes[0]
    source = np.frombuffer(out.xref, np.uint32).astype(np.int64)
    faces = np.frombuffer(out.indices, np.uint32).astype(np.int64).reshape(-1, 3)
    uv = np.frombuffer(out.uv, np.float32).reshape(-1, 2).copy()
    stats = {
        "charts": int(atlas.chart_count),
        "utilization": float(atlas.utilization),
        "pages": atlas.page_count,
    }
    return UVLayout(Mesh(mesh.vertices[source], faces), np.clip(uv, 0, 1), source, stats)


def run_unwraps(mesh, args, device) -> dict:
    """{name: (layout, record)} for every unwrap of one mesh."""
    from microdreamer.mesh import decimate
    from microdreamer.texture import unwrap
    from microdreamer.texture.charts import unwrap_charts

    capped, t_dec, _ = timed(lambda: decimate(mesh, args.faces) if mesh.num_faces > args.faces else mesh)
    size, pad = args.texture_size, args.padding
    runs = {
        "charts": lambda: unwrap_charts(capped, None, size, pad, device=device),
        "charts_torch": lambda: unwrap_charts(capped, None, size, pad, device=device, backend="torch"),
        "charts_shelf": lambda: unwrap_charts(capped, None, size, pad, packing="shelf", device=device),
        "charts_nocap": lambda: unwrap_charts(mesh, None, size, pad, device=device),
        "xatlas": lambda: unwrap(capped, None, size, pad),
        "uvunwrap": lambda: uvunwrap_layout(capped, size, pad),
    }
    out = {}
    for name in args.unwraps:
        if name.startswith("charts"):
            # warm-up (the first call in a process also pays PyTorch's and the kernels' first use), then
            # the median of --repeat calls: a single call of well under a second swings with the load
            runs[name]()
            calls = sorted((timed(runs[name]) for _ in range(args.repeat)), key=lambda r: r[1])
            layout, wall, cpu = calls[len(calls) // 2]
        else:
            layout, wall, cpu = timed(runs[name])
        if layout is None:
            continue
        rec = {"wall_s": round(wall, 3), "cpu_s": round(cpu, 3), "faces": layout.mesh.num_faces}
        if name.startswith("charts"):
            rec["wall_s_calls"] = [round(c[1], 3) for c in calls]
        rec.update(
            {k: v for k, v in layout.stats.items() if k in ("charts", "utilization", "split_rounds", "packs")}
        )
        if "seconds" in layout.stats and "steps" in layout.stats["seconds"]:
            rec["steps_s"] = {k: round(v, 3) for k, v in layout.stats["seconds"]["steps"].items()}
        if name == "charts_torch" and "charts" in out:
            rec["same_layout_as_charts"] = bool(np.array_equal(layout.uv, out["charts"][0].uv))
        out[name] = (layout, rec)
        print(f"  {name:13s} {wall:7.2f} s wall {cpu:7.2f} s cpu  {rec.get('charts')} charts  "
              f"{100 * rec.get('utilization', 0):.0f}% used", flush=True)  # fmt: skip
    out["_decimate_s"] = round(t_dec, 3)
    return out


# ---------------------------------------------------------------------------------------------------
# fidelity


def views(mesh, size: int, device):
    from microdreamer.cameras import centred_orbit_cameras, framing

    center, radius = framing(torch.as_tensor(mesh.vertices))
    el = [0.0] * 4 + [-30.0] * 2 + [30.0] * 2
    az = [0.0, 90.0, 180.0, 270.0, 45.0, 225.0, 135.0, 315.0]
    return centred_orbit_cameras(el, az, center, radius, 49.1, size, 1.05).to(device)


def field_bake(layout, splat, size: int, device):
    """The layout's mesh textured from the splat's colour field (texel samples, field, fill)."""
    from microdreamer.texture import bake_field, fill_texture, texel_samples

    v = torch.as_tensor(layout.mesh.vertices, device=device)
    f = torch.as_tensor(layout.mesh.faces, device=device)
    uv = torch.as_tensor(layout.uv, device=device)
    samples = texel_samples(v, f, uv, size, size)
    colors, seen, _ = bake_field(samples, splat)
    texture, _ = fill_texture(samples, colors, seen)
    return layout.with_texture(texture)


def views_bake(layout, splat, size: int, view_size: int, device):
    """The layout's mesh textured by back-projecting splat renders (the default view set)."""
    from microdreamer.cameras import framing
    from microdreamer.config import BakeViewsConfig
    from microdreamer.texture import (
        BakeConfig,
        bake_cameras,
        bake_views,
        fill_texture,
        splat_render_fn,
        texel_samples,
    )

    v = torch.as_tensor(layout.mesh.vertices, device=device)
    f = torch.as_tensor(layout.mesh.faces, device=device)
    samples = texel_samples(v, f, torch.as_tensor(layout.uv, device=device), size, size)
    config = BakeConfig(views=BakeViewsConfig(size=view_size))
    center, radius = framing(v)
    cams = bake_cameras(config.views, center, radius)
    colors, seen, _ = bake_views(samples, v, f, cams, splat_render_fn(splat, config.backend), config)
    texture, _ = fill_texture(samples, colors, seen)
    return layout.with_texture(texture)


def field_on_surface(mesh, splat, cams):
    """[C, H, W, 3] the colour field at the surface point of every pixel the mesh covers (0 elsewhere),
    and the [C, H, W] coverage."""
    from microdreamer.render.mesh import rasterize
    from microdreamer.texture import bake_field
    from microdreamer.texture.atlas import TexelSamples

    dev = cams.device
    v = torch.as_tensor(mesh.vertices, device=dev)
    f = torch.as_tensor(mesh.faces, device=dev)
    frags = rasterize(v, f, cams)
    fid = frags.face_id.reshape(-1)
    idx = (fid >= 0).nonzero(as_tuple=True)[0]
    points = (frags.bary.reshape(-1, 3)[idx][:, :, None] * v[f[fid[idx]]]).sum(1)
    fake = TexelSamples(
        1, len(idx), idx, fid[idx], frags.bary.reshape(-1, 3)[idx], points, torch.zeros_like(points)
    )
    colour, _, _ = bake_field(fake, splat)
    out = torch.zeros(fid.numel(), 3, device=dev)
    out[idx] = colour
    return out.view(*frags.face_id.shape, 3), frags.face_id >= 0


def psnr(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> float:
    mse = ((a - b) ** 2).mean(-1)[mask].mean()
    return round(float(-10 * torch.log10(mse.clamp_min(1e-12))), 3)


def contact_sheet(path: Path, rows: list[list[np.ndarray]], labels: list[str]) -> None:
    """A PNG grid: one row per view, one column per image ([H, W, 3] float in [0, 1])."""
    from PIL import Image, ImageDraw

    h, w = rows[0][0].shape[:2]
    sheet = Image.new("RGB", (w * len(rows[0]), h * len(rows) + 16), "white")
    draw = ImageDraw.Draw(sheet)
    for c, label in enumerate(labels):
        draw.text((c * w + 4, 2), label, fill=(0, 0, 0))
    for r, row in enumerate(rows):
        for c, img in enumerate(row):
            tile = Image.fromarray(np.round(np.clip(img, 0, 1) * 255).astype(np.uint8))
            sheet.paste(tile, (c * w, 16 + r * h))
    sheet.save(path)


def fidelity(name, mesh, splat, unwraps, args, device) -> dict:
    from microdreamer.render.gaussians import render
    from microdreamer.render.mesh import render_mesh

    cams = views(mesh, args.view_size, device)
    splat = splat.to(device)
    with torch.no_grad():
        ref = render(splat, cams, background=(1.0, 1.0, 1.0), backend="torch")
    mask = ref.alpha[..., 0] > 0.5
    out, images = {}, {}
    for uname, entry in unwraps.items():
        if (
            uname.startswith("_")
            or uname == "charts_torch"
            or uname == "charts_shelf"
            and not args.all_fidelity
        ):
            continue
        layout = entry[0]
        modes = [("field", lambda layout=layout: field_bake(layout, splat, args.texture_size, device))]
        if name in args.bake_cases and uname in ("charts", "xatlas"):
            modes.append(
                (
                    "bake",
                    lambda layout=layout: views_bake(
                        layout, splat, args.texture_size, args.bake_view_size, device
                    ),
                )
            )
        for mode, make in modes:
            textured, wall, _ = timed(make)
            r = render_mesh(textured, cams, background=(1.0, 1.0, 1.0))
            key = f"{uname}_{mode}"
            both = mask & (r.alpha[..., 0] > 0.5)
            rec = {"psnr_vs_splat": psnr(r.rgb, ref.rgb, mask), "psnr_vs_splat_on_mesh": psnr(r.rgb, ref.rgb, both),
                   "bake_s": round(wall, 2)}  # fmt: skip
            if mode == "field":
                want, covered = field_on_surface(layout.mesh, splat, cams)
                rec["psnr_vs_field"] = psnr(r.rgb, want, covered & both)
            out[key] = rec
            images[key] = r.rgb.cpu().numpy()
            print(f"  {key:20s} PSNR vs splat {rec['psnr_vs_splat']:.2f} dB (on the mesh {rec['psnr_vs_splat_on_mesh']:.2f})"
                  + (f", vs field {rec['psnr_vs_field']:.2f} dB" if "psnr_vs_field" in rec else ""), flush=True)  # fmt: skip
    if "charts_field" in images and "xatlas_field" in images:
        # seams: the two textured renders against each other where both cover the object (the same
        # mesh shape, so only the textures differ), and their difference x8 in the sheet
        a, b = images["charts_field"], images["xatlas_field"]
        out["charts_vs_xatlas_field"] = {"psnr": psnr(torch.from_numpy(a), torch.from_numpy(b), mask.cpu())}
        picks = [0, 1, 4, 6]
        rows = [
            [images["xatlas_field"][i], images["charts_field"][i], ref.rgb[i].cpu().numpy(),
             1.0 - 8.0 * np.abs(a[i] - b[i]).max(-1, keepdims=True).repeat(3, -1)]
            for i in picks
        ]  # fmt: skip
        contact_sheet(
            RESULTS / f"unwrap_sheet_{name}.png",
            rows,
            ["xatlas (field bake)", "charts (field bake)", "splat", "|charts - xatlas| x 8 (dark)"],
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=CASES)
    parser.add_argument(
        "--unwraps",
        nargs="+",
        default=["charts", "charts_torch", "charts_shelf", "charts_nocap", "xatlas", "uvunwrap"],
    )
    parser.add_argument("--cache", default="/tmp/microdreamer_unwrap_cache")
    parser.add_argument("--faces", type=int, default=50_000)
    parser.add_argument("--texture-size", type=int, default=1024)
    parser.add_argument("--padding", type=int, default=2)
    parser.add_argument("--view-size", type=int, default=256)
    parser.add_argument("--bake-cases", nargs="*", default=["creative", "fruit", "guitar"])
    parser.add_argument("--bake-view-size", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=3, help="timed calls of each charts variant (median)")
    parser.add_argument("--all-fidelity", action="store_true", help="also bake charts_shelf")
    parser.add_argument("--no-fidelity", action="store_true")
    parser.add_argument(
        "--threads", type=int, default=None, help="torch CPU threads (default: 1 on a CPU run)"
    )
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    device = torch.device(args.device)
    threads = args.threads or (1 if device.type == "cpu" else torch.get_num_threads())
    torch.set_num_threads(threads)
    RESULTS.mkdir(parents=True, exist_ok=True)
    results = {}
    for name in args.cases:
        mesh, splat, t_mesh = load_case(name, Path(args.cache), device)
        print(
            f"{name}: {mesh.num_faces} faces" + (f" (meshed in {t_mesh:.1f} s)" if t_mesh else ""), flush=True
        )
        unwraps = run_unwraps(mesh, args, device)
        rec = {"faces": mesh.num_faces, "decimate_s": unwraps["_decimate_s"]}
        rec["unwrap"] = {k: v[1] for k, v in unwraps.items() if not k.startswith("_")}
        if "xatlas" in rec["unwrap"]:
            for v in rec["unwrap"].values():
                v["speedup_vs_xatlas_wall"] = round(
                    rec["unwrap"]["xatlas"]["wall_s"] / max(v["wall_s"], 1e-9), 1
                )
        if not args.no_fidelity:
            rec["fidelity"] = fidelity(name, mesh, splat, unwraps, args, device)
        results[name] = rec
    print(
        "\ncase        faces   unwrap         wall s   cpu s  speedup  charts  used   PSNR splat  PSNR field"
    )
    for name, rec in results.items():
        for uname, u in rec["unwrap"].items():
            fid = rec.get("fidelity", {}).get(f"{uname}_field", {})
            print(f"{name:10s} {rec['faces']:7d}   {uname:13s} {u['wall_s']:7.2f} {u['cpu_s']:7.2f} "
                  f"{u.get('speedup_vs_xatlas_wall', float('nan')):7.1f}  {u.get('charts', 0):6d} {100 * u.get('utilization', 0):4.0f}%"
                  f"   {fid.get('psnr_vs_splat', float('nan')):9.2f}  {fid.get('psnr_vs_field', float('nan')):9.2f}")  # fmt: skip
    out = Path(args.out) if args.out else RESULTS / f"unwrap_{device.type}.json"
    save_result(out, {"args": vars(args), "results": results})
    print(f"-> {out}")


if __name__ == "__main__":
    main()
