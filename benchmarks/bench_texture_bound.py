"""How far is the baked texture from the best texture the mesh's geometry allows?

    python benchmarks/bench_texture_bound.py [--splats creative ghost fruit guitar] [--fit-size 768]
        [--steps 400] [--lr 0.03] [--device cpu|cuda] [--out benchmarks/results/texture_bound_cpu.json]

For each splat, the mesh at ``microdreamer mesh``'s defaults (:class:`~microdreamer.config.ExportConfig`:
auto grid, auto iso-level, carving) and its default texture (the 26-view bake, 1024^2), measured as
``bench_fidelity.py`` measures it: PSNR over the object's pixels at 8 held-out views (256^2, white
background, the mesh with 2x supersampling), the pixels both cover, and the silhouette's bound (the mesh's
coverage filled with the splat's own colours). Then a fitted texture: the baked one optimised
(:func:`~microdreamer.texture.refine_texture`, Adam on the texels) against the splat's renders *at those
same 8 held-out views*, rendered at ``--fit-size`` over white. It has seen the test views, so it is not a
method; it estimates the most any texture on this geometry can score on them (an estimate from below:
the optimisation stops after ``--steps``). Where the fitted texture stays far below a PSNR target, no
texture and no bake reaches it on that mesh: the geometry does. A second fit, to the splat's colour
without its background (weighted by its alpha, as ``mesh --refine`` weights it), keeps white out of the
texels at the silhouette: what a texture shown on any background could reach.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from _common import save_result  # benchmarks/ is on sys.path when run as a script
from bench_fidelity import SAMPLE_FILES, compare_renders, eval_cameras, load_splat

ROOT = Path(__file__).resolve().parents[1]


def measures(mesh, splat_ref, cams, device) -> dict:
    """PSNR (object pixels, pixels both cover), the silhouette's bound and IoU of ``mesh`` against
    ``splat_ref`` (rgb, alpha over white) at ``cams``."""
    from microdreamer.render.mesh import render_mesh

    with torch.no_grad():
        out = render_mesh(mesh, cams.to(device), background=(1.0, 1.0, 1.0), ssaa=2)
    m = compare_renders(out.rgb.cpu(), out.alpha.cpu(), *splat_ref)
    return {"psnr": m["psnr_mean"], "psnr_both": m["psnr_both"],
            "psnr_silhouette_bound": m["psnr_silhouette_bound"], "iou": m["iou_mean"]}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--splats", nargs="+", default=["creative", "ghost", "fruit", "guitar"], choices=[*SAMPLE_FILES]
    )
    ap.add_argument(
        "--fit-size", type=int, default=768, help="size of the held-out views the texture is fitted to"
    )
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--lr", type=float, default=0.03)
    ap.add_argument("--views", type=int, default=8)
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    device = torch.device(args.device)

    from microdreamer.config import ExportConfig, RefineConfig
    from microdreamer.jobs.export import splat_to_mesh
    from microdreamer.render.gaussians import render
    from microdreamer.texture import refine_texture, splat_targets, texture_mesh

    export = ExportConfig()
    rows = []
    for name in args.splats:
        splat = load_splat(name).to(device)
        cams = eval_cameras(splat, args.views, args.size)
        with torch.no_grad():
            r = render(splat, cams.to(device), background=(1.0, 1.0, 1.0))
        ref = (r.rgb.cpu().float(), r.alpha.cpu().float())
        conv = splat_to_mesh(splat, export.field, export.mesh, device)
        t = time.perf_counter()
        baked = texture_mesh(conv.mesh, splat, export.texture, device)
        bake_s = time.perf_counter() - t
        row = {"splat": name, "grid": conv.resolution, "faces": baked.mesh.num_faces, "bake_seconds": bake_s,
               "bake": measures(baked.mesh, ref, cams, device)}  # fmt: skip
        fit_cams = eval_cameras(splat, args.views, args.fit_size)
        with torch.no_grad():
            targets = render(splat, fit_cams.to(device), background=(1.0, 1.0, 1.0)).rgb.float()
        # one batch of every view, so the pool's targets are these renders in this order
        config = RefineConfig(steps=args.steps, batch=args.views, lr=args.lr)
        t = time.perf_counter()
        fitted, stats = refine_texture(baked.mesh, lambda c, t=targets: t, config, device, cameras=fit_cams)
        row["fit_seconds"] = time.perf_counter() - t
        row["fit_loss_first_last"] = [stats["loss_first"], stats["loss_last"]]
        row["fitted_to_the_test_views"] = measures(fitted, ref, cams, device)
        # the same fit to the splat's colour without its background, weighted by its alpha: no white
        # blended into the texels at the silhouette, so what a texture for any background could reach
        colour = splat_targets(splat)(fit_cams.to(device))
        fitted, _ = refine_texture(baked.mesh, lambda c, t=colour: t, config, device, cameras=fit_cams)
        row["fitted_colour_only"] = measures(fitted, ref, cams, device)
        rows.append(row)
        b, f, o = row["bake"], row["fitted_to_the_test_views"], row["fitted_colour_only"]
        print(f"{name:<9} R{row['grid']:<4} IoU {b['iou']:.3f}  silhouette bound {b['psnr_silhouette_bound']:.2f}  "
              f"bake {b['psnr']:.2f} (both {b['psnr_both']:.2f})  fitted to the test views {f['psnr']:.2f} "
              f"(both {f['psnr_both']:.2f}), colour only {o['psnr']:.2f} (both {o['psnr_both']:.2f})",
              flush=True)  # fmt: skip
    out = args.out or ROOT / "benchmarks" / "results" / f"texture_bound_{args.device}.json"
    save_result(out, {
        "benchmark": "held-out PSNR of the baked texture against a texture fitted to the held-out views themselves",
        "views": args.views, "size": args.size, "fit_size": args.fit_size, "steps": args.steps, "lr": args.lr,
        "device": args.device, "rows": rows,
    })  # fmt: skip
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
