"""The ``microdreamer`` command line: wires the stages together, nothing more.

Bad input ends with one line on stderr (``error: ...``) and exit status 2; outputs are written to a
temporary name and renamed, so a failure leaves no half-written file.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

from microdreamer.errors import InputError


def _check_mesh_output(path: Path) -> Path:
    """Check the output before any work: suffix, not a folder; its folder is created."""
    from microdreamer.io_utils import check_output_path
    from microdreamer.mesh import MESH_FORMATS

    if path.exists() and path.is_dir():
        raise InputError(f"{path}: is a directory; give a file name ending in .glb, .obj or .ply")
    if path.suffix.lower() in MESH_FORMATS:  # a bad suffix creates nothing
        path.parent.mkdir(parents=True, exist_ok=True)
    return check_output_path(path, MESH_FORMATS, "mesh")


def _progress_bar(desc: str):
    """A tqdm bar driven by fractions in [0, 1]; returns (callback, close)."""
    from tqdm import tqdm

    bar = tqdm(
        total=100,
        desc=desc,
        unit="%",
        leave=False,
        file=sys.stderr,
        disable=None,
        bar_format="{l_bar}{bar}| {elapsed}",
    )  # no bar when stderr is not a terminal

    def update(fraction: float) -> None:
        bar.n = int(round(100 * fraction))
        bar.refresh()

    return update, bar.close


def _job_config(args: argparse.Namespace):
    """Preset (``--config``) or defaults, then the flags the user gave."""
    from microdreamer.config import MeshJobConfig, load_preset

    cfg = load_preset(MeshJobConfig, args.config) if args.config else MeshJobConfig()
    if args.resolution is not None:
        if not 2 <= args.resolution <= 2048:
            raise InputError(f"--resolution {args.resolution}: must be between 2 and 2048")
        cfg.field.resolution = args.resolution
    if args.mode is not None:
        cfg.field.mode = args.mode
    if args.threshold is not None:
        cfg.mesh.threshold = args.threshold
    if args.decimate is not None:
        if args.decimate < 4:
            raise InputError(f"--decimate {args.decimate}: must be at least 4 faces")
        cfg.mesh.decimate_target = args.decimate
    if getattr(args, "texture", None) is not None:
        cfg.texture.mode = args.texture
    if getattr(args, "texture_size", None) is not None:
        if not 16 <= args.texture_size <= 16384:
            raise InputError(f"--texture-size {args.texture_size}: must be between 16 and 16384 texels")
        cfg.texture.size = args.texture_size
    if getattr(args, "refine", None) is not None:
        if args.refine < 0:
            raise InputError(f"--refine {args.refine}: must be 0 or more steps")
        cfg.texture.refine.steps = args.refine
    return cfg


def _convert_and_save(splat, out: Path, args, name: str) -> None:
    import torch

    from microdreamer.mesh import save_mesh
    from microdreamer.pipeline import resolve_device, splat_to_mesh
    from microdreamer.profiling import StageTimer

    cfg = _job_config(args)
    device = resolve_device(args.device)
    timer = StageTimer()
    update, close = _progress_bar("density field")
    try:
        result = splat_to_mesh(splat, cfg.field, cfg.mesh, device, timer=timer, progress=update, name=name)
    finally:
        close()
    mesh = result.mesh
    if cfg.texture.mode != "none":
        from microdreamer.texture import texture_mesh

        with timer.stage("texture"):
            mesh = texture_mesh(mesh, splat.to(device), cfg.texture, device=device, progress=True).mesh
    with timer.stage("export"):
        save_mesh(mesh, out)
    m = mesh
    gpu = f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else ""
    print(f"Gaussians: {result.num_gaussians_in} read, {result.num_gaussians_kept} kept "
          f"(opacity > {cfg.field.min_opacity})")  # fmt: skip
    print(f"grid: {result.resolution}^3, mode {cfg.field.mode}, backend {result.backend} on {device}{gpu}")
    tex = (
        f", {cfg.texture.mode} texture {cfg.texture.size}^2"
        if getattr(m, "texture", None) is not None
        else ""
    )
    print(f"mesh: {m.num_vertices} vertices, {m.num_faces} faces{tex} -> {out}")
    print("seconds: " + ", ".join(f"{k} {v:.3f}" for k, v in timer.seconds.items()))


def cmd_mesh(args: argparse.Namespace) -> None:
    from microdreamer.splat import read_ply

    out = _check_mesh_output(Path(args.output))
    _job_config(args)  # check the settings before reading anything
    t = time.perf_counter()
    splat = read_ply(args.splat)
    logging.getLogger(__name__).info("read %s in %.3f s", args.splat, time.perf_counter() - t)
    _convert_and_save(splat, out, args, name=str(args.splat))


def cmd_demo(args: argparse.Namespace) -> None:
    from microdreamer.demo import DemoConfig, run_demo
    from microdreamer.pipeline import resolve_device

    device = resolve_device(args.device)
    cfg = DemoConfig(seed=args.seed)
    if args.iters is not None:
        if args.iters < 1:
            raise InputError(f"--iters {args.iters}: must be at least 1")
        cfg.iters = args.iters
    if args.size is not None:
        if not 16 <= args.size <= 1024:
            raise InputError(f"--size {args.size}: must be between 16 and 1024 pixels")
        cfg.size = args.size
    job = _job_config(args)
    print(f"demo on {device}: a coloured object built in code -> {cfg.views} + {cfg.held_out} held-out views at "
          f"{cfg.size}^2 -> {cfg.iters} reconstruction steps -> mesh")  # fmt: skip
    m = run_demo(args.output, cfg, device, field_config=job.field,
                 mesh_config=job.mesh if args.threshold is not None or args.config else None)  # fmt: skip
    q = m["mesh_quality"]
    print(f"held-out views: PSNR {m['psnr']:.2f} dB, SSIM {m['ssim']:.4f}; {m['num_gaussians']} Gaussians")
    print(f"mesh vs the object: Chamfer-L1 {100 * q['chamfer_l1_rel']:.2f}% of its diagonal, "
          f"F-score@1% {q['fscore@0.01']:.3f}")  # fmt: skip
    print("seconds: " + ", ".join(f"{k} {v:.2f}" for k, v in m["seconds"].items()))
    for name, path in m["paths"].items():
        print(f"  {name:<8} {path}")


def cmd_render_views(args: argparse.Namespace) -> None:
    from microdreamer.data import render_views
    from microdreamer.pipeline import resolve_device

    if args.views < 1 or args.held_out < 0:
        raise InputError(
            f"--views {args.views} / --held-out {args.held_out}: need at least 1 view and 0 held out"
        )
    if not 16 <= args.size <= 4096:
        raise InputError(f"--size {args.size}: must be between 16 and 4096 pixels")
    device = resolve_device(args.device)
    t = time.perf_counter()
    out = render_views(args.mesh, args.output, views=args.views, size=args.size, seed=args.seed,
                       texture=args.texture, held_out=args.held_out, device=device)  # fmt: skip
    print(f"rendered {args.views} training + {args.held_out} held-out views at {args.size}^2 "
          f"in {time.perf_counter() - t:.2f} s -> {out / 'transforms.json'}")  # fmt: skip


def cmd_reconstruct(args: argparse.Namespace) -> None:
    from microdreamer.config import load_preset
    from microdreamer.pipeline import resolve_device
    from microdreamer.train.config import ReconstructConfig
    from microdreamer.train.reconstruct import reconstruct_dataset

    cfg = load_preset(ReconstructConfig, args.config) if args.config else ReconstructConfig()
    if args.iters is not None:
        if args.iters < 1:
            raise InputError(f"--iters {args.iters}: must be at least 1")
        cfg.iters = args.iters
    device = resolve_device(args.device)
    metrics = reconstruct_dataset(args.data, args.output, cfg, device=device, mesh=not args.no_mesh)
    out = Path(args.output)
    psnr = metrics.get("psnr")
    print(f"Gaussians: {metrics.get('num_gaussians')}")
    if psnr is not None:
        print(f"held-out views: PSNR {psnr:.2f} dB, SSIM {metrics.get('ssim'):.4f}")
    print("seconds: " + ", ".join(f"{k} {v:.2f}" for k, v in metrics.get("seconds", {}).items()))
    files = ["splat.ply", "metrics.json"] + ([] if args.no_mesh else ["mesh.glb"])
    print("wrote " + ", ".join(str(out / f) for f in files))


def cmd_generate(args: argparse.Namespace) -> None:
    from microdreamer.config import load_preset
    from microdreamer.generate import GenerateConfig, generate

    cfg = load_preset(GenerateConfig, args.config) if args.config else GenerateConfig()
    if args.iters is not None:
        if args.iters < 1:
            raise InputError(f"--iters {args.iters}: must be at least 1")
        cfg.sir.iterations = args.iters
    if args.seed is not None:
        cfg.sir.seed = args.seed
    if args.elevation is not None:
        if not -90 < args.elevation < 90:
            raise InputError(f"--elevation {args.elevation}: must be between -90 and 90 degrees")
        cfg.elevation_deg = args.elevation
    if args.random_weights:
        print(f"WARNING: --random-weights {args.random_weights}: the diffusion model has RANDOM weights; "
              "the output is noise, useful only for timing and plumbing", file=sys.stderr)  # fmt: skip
    update, close = _progress_bar("SIR iterations")
    try:
        report = generate(args.image, args.output, cfg, model=args.model, random_weights=args.random_weights,
                          device=args.device, progress=update)  # fmt: skip
    finally:
        close()
    stages = report.get("stages", {})
    print("seconds: " + ", ".join(f"{k} {v:.2f}" for k, v in stages.items())
          + f" (after model load {report.get('seconds_after_load', float('nan')):.2f})")  # fmt: skip
    print(f"Gaussians: {report.get('num_gaussians')}, mesh: {report.get('mesh_vertices')} vertices, "
          f"{report.get('mesh_faces')} faces")  # fmt: skip
    out = Path(args.output)
    print("wrote " + ", ".join(str(out / f) for f in ("splat.ply", "mesh.glb", "views.png", "timings.json")))


def cmd_render(args: argparse.Namespace) -> None:
    from microdreamer.pipeline import resolve_device
    from microdreamer.turntable import render_turntable

    if args.frames < 1 or not 16 <= args.size <= 4096:
        raise InputError(f"--frames {args.frames} / --size {args.size}: need >= 1 frame and 16-4096 pixels")
    device = resolve_device(args.device)
    t = time.perf_counter()
    out = render_turntable(args.source, args.output, frames=args.frames, size=args.size,
                           elevation_deg=args.elevation, device=device)  # fmt: skip
    print(f"rendered {args.source} -> {out} in {time.perf_counter() - t:.2f} s")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="microdreamer",
        description="Image-to-3D with MicroDreamer (score-based iterative reconstruction) and fast, "
        "textured Gaussian-splat-to-mesh conversion.",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    sub = p.add_subparsers(dest="command", required=True)

    def add_field_args(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--resolution", type=int, default=None, help="grid points per axis (default 128)")
        sp.add_argument("--threshold", type=float, default=None, help="density iso-level (default 1.0)")
        sp.add_argument(
            "--mode",
            choices=["exact", "upstream"],
            default=None,
            help="exact: every Gaussian within its cutoff, bounded error (default); "
            "upstream: DreamGaussian/MicroDreamer's block rule",
        )
        sp.add_argument("--decimate", type=int, default=None, metavar="N", help="decimate to about N faces")
        sp.add_argument(
            "--device",
            default="auto",
            choices=["auto", "cpu", "cuda"],
            help="where to compute the field (default auto)",
        )
        sp.add_argument(
            "--config", default=None, metavar="YAML", help="a preset (field/mesh settings); flags override it"
        )

    sp = sub.add_parser("mesh", help="convert a 3DGS .ply splat into a mesh (.glb, .obj or .ply)")
    sp.add_argument("splat", help="input splat, INRIA 3DGS PLY layout")
    sp.add_argument("-o", "--output", required=True, help="output mesh: OUT.glb, OUT.obj or OUT.ply")
    add_field_args(sp)
    sp.add_argument("--texture", choices=["bake", "field", "none"], default=None,
                    help="bake: from splat renders (default); field: from the splat's colour field; none")  # fmt: skip
    sp.add_argument(
        "--texture-size", type=int, default=None, help="texture atlas side in texels (default 1024)"
    )
    sp.add_argument("--refine", type=int, default=None, metavar="STEPS",
                    help="stage-2 texture refinement steps against the splat's renders (default 0: off)")  # fmt: skip
    sp.set_defaults(func=cmd_mesh)

    sp = sub.add_parser(
        "demo", help="end to end with no data: object -> views -> splat -> mesh, with metrics"
    )
    sp.add_argument("-o", "--output", default="out/demo", help="output folder (default out/demo)")
    sp.add_argument("--iters", type=int, default=None, help="reconstruction steps (default 300)")
    sp.add_argument("--size", type=int, default=None, help="view size in pixels (default 64)")
    sp.add_argument("--seed", type=int, default=0)
    add_field_args(sp)
    sp.set_defaults(func=cmd_demo)

    sp = sub.add_parser("render-views", help="render a transforms.json dataset of orbit views of a mesh")
    sp.add_argument("mesh", help="input mesh: OBJ (with MTL, or --texture), GLB or PLY")
    sp.add_argument("-o", "--output", required=True, help="output dataset folder")
    sp.add_argument(
        "--views", type=int, default=32, help="training views, azimuths spread evenly (default 32)"
    )
    sp.add_argument("--held-out", type=int, default=4, help="extra held-out views (default 4)")
    sp.add_argument("--size", type=int, default=256, help="image size in pixels (default 256)")
    sp.add_argument("--seed", type=int, default=0, help="seed of the random elevations in [-30, 30]")
    sp.add_argument("--texture", default=None, help="texture image for an OBJ without an MTL")
    sp.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    sp.set_defaults(func=cmd_render_views)

    sp = sub.add_parser("reconstruct", help="reconstruct a splat (and mesh) from a transforms.json dataset")
    sp.add_argument("data", help="dataset folder with transforms.json and RGBA PNGs")
    sp.add_argument("-o", "--output", required=True, help="output folder: splat.ply, mesh.glb, metrics.json")
    sp.add_argument("--iters", type=int, default=None, help="optimisation steps (default 2000)")
    sp.add_argument("--no-mesh", action="store_true", help="skip the mesh export")
    sp.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    sp.add_argument("--config", default=None, metavar="YAML", help="a ReconstructConfig preset")
    sp.set_defaults(func=cmd_reconstruct)

    sp = sub.add_parser("generate", help="image-to-3D: MicroDreamer's SIR with a Zero123 prior")
    sp.add_argument("image", help="input image: RGBA (its alpha is the mask) or RGB (background removed)")
    sp.add_argument(
        "-o", "--output", required=True, help="output folder: splat.ply, mesh.glb, views.png, timings.json"
    )
    sp.add_argument("--model", default=None, help="diffusers-format folder or a repo id in the local Hugging Face cache "
                    "(default ashawkey/stable-zero123-diffusers)")  # fmt: skip
    sp.add_argument("--iters", type=int, default=None, help="SIR iterations (default 20)")
    sp.add_argument("--seed", type=int, default=None, help="random seed (default 0)")
    sp.add_argument("--elevation", type=float, default=None, help="elevation of the input view in degrees "
                    "(MicroDreamer's sign: negative = from above; default 0)")  # fmt: skip
    sp.add_argument("--random-weights", choices=["tiny", "full"], default=None,
                    help="use a randomly initialised model (timing and plumbing only: the output is noise)")  # fmt: skip
    sp.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    sp.add_argument("--config", default=None, metavar="YAML", help="a GenerateConfig preset")
    sp.set_defaults(func=cmd_generate)

    sp = sub.add_parser(
        "render", help="turntable of a mesh or splat: .mp4, .gif, or .png (8-view contact sheet)"
    )
    sp.add_argument("source", help="a mesh (GLB, OBJ, PLY) or a 3DGS splat (.ply)")
    sp.add_argument("-o", "--output", required=True, help="turntable.mp4, turntable.gif or views.png")
    sp.add_argument("--frames", type=int, default=120, help="video frames (default 120)")
    sp.add_argument("--size", type=int, default=512, help="frame size in pixels (default 512)")
    sp.add_argument("--elevation", type=float, default=0.0, help="camera elevation in degrees (default 0)")
    sp.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    sp.set_defaults(func=cmd_render)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s")
    try:
        args.func(args)
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
