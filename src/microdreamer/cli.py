"""The ``microdreamer`` command line: flags from the job configs, the jobs run, results printed.

Each command's flags set fields of its job config (:mod:`microdreamer.config`); their defaults and help
come from those fields, so the two cannot drift (:func:`synopsis` writes the README's command list from the
same table). Bad input ends with one line on stderr (``error: ...``) and exit status 2; outputs are written
to a temporary name and renamed, so a failure leaves no half-written file. This module imports no torch:
each command imports the stages it runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
import time
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from microdreamer import __version__, config
from microdreamer.errors import ConfigError, InputError

DEVICE_HELP = "where to compute: auto (CUDA when available), cpu or cuda"


@dataclass(frozen=True)
class Flag:
    """A command-line flag that sets the job config's field at ``path`` (dotted)."""

    name: str
    path: str
    metavar: str | None = None


@dataclass(frozen=True)
class Command:
    """One subcommand: its job config, positional arguments, flags and extra arguments."""

    name: str
    help: str
    job: type
    positionals: tuple[tuple[str, str, str], ...]  # (dest, metavar, help)
    output: tuple[str, bool, str]  # (metavar, required, help); default when not required: see defaults
    flags: tuple[Flag, ...]
    preset: bool = True  # --config YAML
    device: bool = True  # --device
    output_default: str | None = None


def _field_flags(prefix: str = "") -> tuple[Flag, ...]:
    p = prefix
    return (
        Flag("--resolution", f"{p}field.resolution"),
        Flag("--threshold", f"{p}mesh.threshold"),
        Flag("--mode", f"{p}field.mode"),
        Flag("--decimate", f"{p}mesh.decimate_target", "N"),
    )


COMMANDS = (
    Command(
        "demo",
        "end to end with no data: object -> views -> splat -> mesh, with metrics",
        config.DemoConfig,
        (),
        ("DIR", False, "output folder"),
        (Flag("--iters", "iters"), Flag("--size", "size"), Flag("--seed", "seed"), *_field_flags("export.")),
        output_default="out/demo",
    ),
    Command(
        "mesh",
        "convert a 3DGS .ply splat into a mesh (.glb, .obj or .ply)",
        config.ExportConfig,
        (("splat", "SPLAT.ply", "input splat, INRIA 3DGS PLY layout"),),
        ("OUT.{glb,obj,ply}", True, "output mesh: OUT.glb, OUT.obj or OUT.ply"),
        (
            *_field_flags(),
            Flag("--texture", "texture.mode"),
            Flag("--texture-size", "texture.size"),
            Flag("--refine", "texture.refine.steps", "STEPS"),
        ),
    ),
    Command(
        "render-views",
        "render a transforms.json dataset of orbit views of a mesh",
        config.ViewsConfig,
        (("mesh", "MESH", "input mesh: OBJ (with MTL, or --texture), GLB or PLY"),),
        ("DIR", True, "output dataset folder"),
        (
            Flag("--views", "views"),
            Flag("--held-out", "held_out"),
            Flag("--size", "size"),
            Flag("--seed", "seed"),
        ),
        preset=False,
    ),
    Command(
        "reconstruct",
        "reconstruct a splat (and mesh) from a transforms.json dataset",
        config.ReconstructJobConfig,
        (("data", "DIR", "dataset folder with transforms.json and RGBA PNGs"),),
        ("OUT/", True, "output folder: splat.ply, mesh.glb, metrics.json"),
        (Flag("--iters", "reconstruct.iters"),),
    ),
    Command(
        "generate",
        "image-to-3D: MicroDreamer's SIR with a Zero123 prior",
        config.GenerateConfig,
        (("image", "IMAGE", "input image: RGBA (its alpha is the mask) or RGB (background removed)"),),
        ("OUT/", True, "output folder: splat.ply, mesh.glb, views.png, timings.json"),
        (
            Flag("--model", "prior.model", "PATH|REPO_ID"),
            Flag("--iters", "sir.iterations"),
            Flag("--seed", "sir.seed"),
            Flag("--elevation", "elevation_deg"),
        ),
    ),
    Command(
        "render",
        "turntable of a mesh or splat: .mp4, .gif, or .png (8-view contact sheet)",
        config.TurntableConfig,
        (("source", "MESH_OR_SPLAT", "a mesh (GLB, OBJ, PLY) or a 3DGS splat (.ply)"),),
        ("turntable.{mp4,gif,png}", True, "turntable.mp4, turntable.gif or views.png"),
        (Flag("--frames", "frames"), Flag("--size", "size"), Flag("--elevation", "elevation_deg")),
        preset=False,
    ),
)
#: arguments that set no config field: (command, flag) -> (argparse keywords, synopsis placeholder)
EXTRA = {
    ("render-views", "--texture"): ({"default": None, "metavar": "PNG",
                                     "help": "texture image for an OBJ without an MTL"}, "PNG"),
    ("reconstruct", "--no-mesh"): ({"action": "store_true", "help": "skip the mesh export"}, None),
    ("generate", "--random-weights"): ({"choices": list(config.RANDOM_WEIGHTS), "default": None,
                                        "help": "use a randomly initialised model (timing and plumbing "
                                                "only: the output is noise)"}, "tiny|full"),
}  # fmt: skip
BY_NAME = {c.name: c for c in COMMANDS}


def _scalar_type(annotation: Any) -> type:
    """int, float or str of a field annotation (``int | None`` -> int)."""
    if typing.get_origin(annotation) is not None:
        options = [a for a in typing.get_args(annotation) if a is not type(None)]
        return _scalar_type(options[0])
    return annotation


def _default(cmd: Command, flag: Flag) -> Any:
    return config.get_path(cmd.job(), flag.path)


def _show(value: Any) -> str:
    return "none" if value is None else str(value)


def _flag_spec(cmd: Command, flag: Flag) -> dict:
    owner, f = config.field_at(cmd.job, flag.path)
    kind = _scalar_type(typing.get_type_hints(owner)[f.name])
    spec: dict = {"type": kind, "default": None, "dest": flag.path.replace(".", "__")}
    choices = f.metadata.get("choices")
    if choices:
        spec["choices"] = list(choices)
    if not choices:
        spec["metavar"] = flag.metavar or flag.name.lstrip("-").upper().replace("-", "_")
    text = f.metadata.get("help", "")
    spec["help"] = f"{text} (default {_show(_default(cmd, flag))})".strip()
    return spec


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="microdreamer",
        description="Image-to-3D with MicroDreamer (score-based iterative reconstruction) and fast, "
        "textured Gaussian-splat-to-mesh conversion.",
    )
    p.add_argument("--version", action="version", version=f"microdreamer {__version__}")
    p.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for cmd in COMMANDS:
        sp = sub.add_parser(cmd.name, help=cmd.help, description=cmd.help)
        for dest, metavar, text in cmd.positionals:
            sp.add_argument(dest, metavar=metavar, help=text)
        metavar, required, text = cmd.output
        if required:
            sp.add_argument("-o", "--output", required=True, metavar=metavar, help=text)
        else:
            sp.add_argument("-o", "--output", default=cmd.output_default, metavar=metavar,
                            help=f"{text} (default {cmd.output_default})")  # fmt: skip
        for flag in cmd.flags:
            sp.add_argument(flag.name, **_flag_spec(cmd, flag))
        for (name, option), (spec, _) in EXTRA.items():
            if name == cmd.name:
                sp.add_argument(option, **spec)
        if cmd.device:
            sp.add_argument("--device", default="auto", choices=list(config.DEVICES), help=DEVICE_HELP)
        if cmd.preset:
            sp.add_argument("--config", default=None, metavar="YAML",
                            help=f"a {cmd.job.__name__} preset (YAML); flags override it")  # fmt: skip
        sp.set_defaults(func=RUNNERS[cmd.name], command_spec=cmd)
    return p


def synopsis(width: int = 110) -> str:
    """Every command's usage line, as the README's command-line section shows it."""
    lines = []
    for cmd in COMMANDS:
        parts = [meta for _, meta, _ in cmd.positionals]
        metavar, required, _ = cmd.output
        parts.append(f"-o {metavar}" if required else f"[-o {cmd.output_default}]")
        for flag in cmd.flags:
            spec = _flag_spec(cmd, flag)
            value = (
                "|".join(spec["choices"]) if "choices" in spec else flag.metavar or _show(_default(cmd, flag))
            )
            parts.append(f"[{flag.name} {value}]")
        for (name, option), (_, placeholder) in EXTRA.items():
            if name == cmd.name:
                parts.append(f"[{option} {placeholder}]" if placeholder else f"[{option}]")
        if cmd.device:
            parts.append("[--device auto|cpu|cuda]")
        if cmd.preset:
            parts.append("[--config YAML]")
        head = f"microdreamer {cmd.name:<13} "
        line = head
        for part in parts:
            if len(line) + len(part) + 1 > width and line.strip() != head.strip():
                lines.append(line.rstrip())
                line = " " * len(head)
            line += part + " "
        lines.append(line.rstrip())
    return "\n".join(lines)


def job_config(args: argparse.Namespace):
    """The command's job config: its preset (``--config``) or defaults, then the flags the user gave.

    Raises:
        InputError: a bad preset, or a flag whose value breaks its field's rule (named by the flag).
    """
    cmd: Command = args.command_spec
    cfg = config.load_preset(cmd.job, args.config) if cmd.preset and args.config else cmd.job()
    for flag in cmd.flags:
        value = getattr(args, flag.path.replace(".", "__"))
        if value is None:
            continue
        try:
            cfg = config.replace_path(cfg, flag.path, value)
        except ConfigError as e:
            raise InputError(f"{flag.name} {value}: {e.rule}") from None
    return cfg


def _progress_bar(desc: str):
    """Progress of a step driven by fractions in [0, 1]: a bar on a terminal, coarse lines otherwise
    (:mod:`microdreamer.progress`); returns (callback, close)."""
    from microdreamer import progress

    report = progress.reporter(desc)
    return report, report.close


class Terminated(BaseException):
    """SIGTERM, raised in the main thread so that every ``finally`` (temporary files) runs."""


def _on_sigterm(signum, frame) -> None:
    raise Terminated()


# ------------------------------------------------------------------------------------ input/output checks


def _check_mesh_output(args: argparse.Namespace, cfg) -> Path:
    """``mesh -o``: suffix, a writable folder (missing folders are made later, and removed on failure),
    not the input, and no file written beside it (a textured OBJ's .mtl and .png) that microdreamer did
    not write."""
    from microdreamer.io_utils import check_companions, check_output_path, textured_obj_companions
    from microdreamer.mesh import MESH_FORMATS

    out = check_output_path(args.output, MESH_FORMATS, "mesh", inputs=[args.splat], create_parents=True)
    if out.suffix.lower() == ".obj" and cfg.texture.mode != "none":
        companions, ours = textured_obj_companions(out)
        check_companions(out, companions, ours)
        from microdreamer.io_utils import check_not_input

        for c in companions:
            check_not_input(c, [args.splat])
    return out


def _written(out: Path, textured: bool) -> str:
    """The files a mesh output consists of, as printed."""
    if textured and out.suffix.lower() == ".obj":
        return f"{out} (+ {out.with_suffix('.mtl').name}, {out.with_suffix('.png').name})"
    return str(out)


def _job_folder(args: argparse.Namespace, outputs: tuple[str, ...], inputs: list):
    """Checks a job's output folder and gives the staged folder the job writes into (moved into place only
    when the job succeeds; see :func:`microdreamer.io_utils.staged_folder`)."""
    from microdreamer.io_utils import check_output_folder, staged_folder

    check_output_folder(args.output, outputs, inputs)
    return staged_folder(args.output)


def _seconds(seconds: dict[str, float], digits: int = 3) -> str:
    return "seconds: " + ", ".join(f"{k} {v:.{digits}f}" for k, v in seconds.items())


# ------------------------------------------------------------------------------------------- commands


def cmd_mesh(args: argparse.Namespace) -> None:
    cfg = job_config(args)  # checked before reading anything
    out = _check_mesh_output(args, cfg)

    import torch

    from microdreamer.io_utils import made_parents
    from microdreamer.jobs import resolve_device
    from microdreamer.jobs.export import check_grid_memory, export_mesh
    from microdreamer.profiling import StageTimer
    from microdreamer.splat import read_ply

    device = resolve_device(args.device)
    check_grid_memory(cfg.field.resolution, device)
    t = time.perf_counter()
    splat = read_ply(args.splat)
    logging.getLogger(__name__).info("read %s in %.3f s", args.splat, time.perf_counter() - t)
    timer = StageTimer()
    update, close = _progress_bar("density field")
    try:
        with made_parents(out.parent):
            result = export_mesh(splat, out, cfg, device, timer=timer, progress=update, name=str(args.splat),
                                 texture_progress=True)  # fmt: skip
    finally:
        close()
    conv, mesh = result.convert, result.mesh
    gpu = f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else ""
    print(f"Gaussians: {conv.num_gaussians_in} read, {conv.num_gaussians_kept} kept "
          f"(opacity > {cfg.field.min_opacity})")  # fmt: skip
    print(f"grid: {conv.resolution}^3, mode {cfg.field.mode}, backend {conv.backend} on {device}{gpu}")
    tex = f", {cfg.texture.mode} texture {cfg.texture.size}^2" if mesh.has_texture else ""
    print(
        f"mesh: {mesh.num_vertices} vertices, {mesh.num_faces} faces{tex} -> {_written(out, mesh.has_texture)}"
    )
    print(_seconds(timer.seconds))


def cmd_demo(args: argparse.Namespace) -> None:
    cfg = job_config(args)
    from microdreamer.jobs import resolve_device
    from microdreamer.jobs.demo import run_demo

    device = resolve_device(args.device)
    from microdreamer.jobs.export import check_grid_memory

    check_grid_memory(cfg.export.field.resolution, device)
    staged = _job_folder(args, (), [])
    print(f"demo on {device}: a coloured object built in code -> {cfg.views} + {cfg.held_out} held-out views at "
          f"{cfg.size}^2 -> {cfg.iters} reconstruction steps -> mesh")  # fmt: skip
    with staged as stage:
        m = run_demo(stage, cfg, device)
    m["paths"] = {k: Path(args.output) / Path(v).relative_to(stage) for k, v in m["paths"].items()}
    q = m["mesh_quality"]
    print(f"held-out views: PSNR {m['psnr']:.2f} dB, SSIM {m['ssim']:.4f}; {m['num_gaussians']} Gaussians")
    print(f"mesh vs the object: Chamfer-L1 {100 * q['chamfer_l1_rel']:.2f}% of its diagonal, "
          f"F-score@1% {q['fscore@0.01']:.3f}")  # fmt: skip
    print(_seconds(m["seconds"], 2))
    for name, path in m["paths"].items():
        print(f"  {name:<8} {path}")


def cmd_render_views(args: argparse.Namespace) -> None:
    from microdreamer.io_utils import check_input

    cfg = job_config(args)
    check_input(args.mesh, "file", "mesh")
    if args.texture is not None:
        check_input(args.texture, "file", "texture image")
    _check_not_inside(Path(args.output), [args.mesh, args.texture])
    from microdreamer.data import render_views
    from microdreamer.jobs import resolve_device

    device = resolve_device(args.device)
    t = time.perf_counter()
    out = render_views(args.mesh, args.output, cfg, texture=args.texture, device=device)
    print(f"rendered {cfg.views} training + {cfg.held_out} held-out views at {cfg.size}^2 "
          f"in {time.perf_counter() - t:.2f} s -> {out / 'transforms.json'}")  # fmt: skip


def cmd_reconstruct(args: argparse.Namespace) -> None:
    from microdreamer.io_utils import check_input

    cfg = job_config(args)
    check_input(args.data, "folder", "dataset")
    if args.no_mesh:
        cfg = dataclasses.replace(cfg, mesh=False)
    from microdreamer.jobs import resolve_device
    from microdreamer.jobs.reconstruct import reconstruct_dataset

    device = resolve_device(args.device)
    if cfg.mesh:
        from microdreamer.jobs.export import PRESET_SETTINGS, check_grid_memory

        check_grid_memory(cfg.export.field.resolution, device, PRESET_SETTINGS["resolution"])
    staged = _job_folder(args, ("splat.ply", "mesh.glb", "metrics.json"), [])
    with staged as stage:
        metrics = reconstruct_dataset(args.data, stage, cfg, device=device)
    out = Path(args.output)
    psnr = metrics.get("psnr")
    print(f"Gaussians: {metrics.get('num_gaussians')}")
    if psnr is not None:
        print(f"held-out views: PSNR {psnr:.2f} dB, SSIM {metrics.get('ssim'):.4f}")
    print(_seconds(metrics.get("seconds", {}), 2))
    files = ["splat.ply", "metrics.json"] + (["mesh.glb"] if cfg.mesh else [])
    print("wrote " + ", ".join(str(out / f) for f in files))


def cmd_generate(args: argparse.Namespace) -> None:
    from microdreamer.io_utils import check_input

    cfg = job_config(args)
    check_input(args.image, "file", "image")
    from microdreamer.jobs.generate import generate

    staged = _job_folder(args, ("splat.ply", "mesh.glb", "views.png", "timings.json"), [args.image])

    if args.random_weights:
        print(f"WARNING: --random-weights {args.random_weights}: the diffusion model has RANDOM weights; "
              "the output is noise, useful only for timing and plumbing", file=sys.stderr)  # fmt: skip
    update, close = _progress_bar("SIR iterations")
    try:
        with staged as stage:
            report = generate(args.image, stage, cfg, random_weights=args.random_weights, device=args.device,
                              progress=update)  # fmt: skip
    finally:
        close()
    stages = report.get("stages", {})
    print(_seconds(stages, 2) + f" (after model load {report.get('seconds_after_load', float('nan')):.2f})")
    print(f"Gaussians: {report.get('num_gaussians')}, mesh: {report.get('mesh_vertices')} vertices, "
          f"{report.get('mesh_faces')} faces")  # fmt: skip
    out = Path(args.output)
    print("wrote " + ", ".join(str(out / f) for f in ("splat.ply", "mesh.glb", "views.png", "timings.json")))


def cmd_render(args: argparse.Namespace) -> None:
    from microdreamer.io_utils import check_input, check_not_input

    cfg = job_config(args)
    check_input(args.source, "file", "mesh or splat")
    check_not_input(Path(args.output), [args.source])
    from microdreamer.jobs import resolve_device
    from microdreamer.jobs.turntable import render_turntable

    device = resolve_device(args.device)
    t = time.perf_counter()
    out = render_turntable(args.source, args.output, cfg, device=device)
    print(f"rendered {args.source} -> {out} in {time.perf_counter() - t:.2f} s")


RUNNERS = {
    "demo": cmd_demo,
    "mesh": cmd_mesh,
    "render-views": cmd_render_views,
    "reconstruct": cmd_reconstruct,
    "generate": cmd_generate,
    "render": cmd_render,
}


def _check_not_inside(folder: Path, inputs: list) -> None:
    """An output folder replaced whole must not hold one of the inputs."""
    for inp in inputs:
        if inp is None or not folder.is_dir():
            continue
        try:
            Path(inp).resolve().relative_to(folder.resolve())
        except ValueError:
            continue
        raise InputError(
            f"{folder}: holds the input {inp}, and the folder is replaced whole; choose another folder"
        )


def main(argv: list[str] | None = None) -> int:
    import signal
    import threading

    from microdreamer import progress

    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s")
    progress.configure("auto")
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        args.func(args)
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except Terminated:
        print("error: terminated", file=sys.stderr)
        return 143
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        progress.reset()
    return 0


if __name__ == "__main__":
    sys.exit(main())
