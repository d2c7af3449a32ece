"""The ``microdreamer`` command line: flags from the job configs, the jobs run, results printed.

Each command's flags set fields of its job config (:mod:`microdreamer.config`); their defaults and help
come from those fields, so the two cannot drift (:func:`synopsis` writes the README's command list from the
same table). Bad input ends with one line on stderr (``error: ...``) and exit status 2; outputs are written
to a temporary name and renamed, so a failure leaves no half-written file. This module imports no torch:
each command imports the stages it runs.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import os
import sys
import time
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from microdreamer import __version__, config
from microdreamer.errors import ConfigError, InputError

DEVICE_HELP = "where to compute: auto (CUDA when available), cpu or cuda"
_STARTED = (
    time.perf_counter()
)  # this module's import: what a command pays before its job starts is timed from here


@dataclass(frozen=True)
class Flag:
    """A command-line flag that sets the job config's field at ``path`` (dotted)."""

    name: str
    path: str
    metavar: str | None = None
    aliases: tuple[str, ...] = ()  # older names that still work (help lists them, the synopsis does not)


@dataclass(frozen=True)
class Command:
    """One subcommand: its job config, positional arguments, flags and extra arguments."""

    name: str
    help: str
    job: type | None  # None: the command has no job config (view, profile)
    positionals: tuple[tuple, ...]  # (dest, metavar, help[, nargs])
    output: tuple[str, bool, str] | None  # (metavar, required, help); default when not required: see defaults
    flags: tuple[Flag, ...]
    preset: bool = True  # --config YAML
    device: bool = True  # --device
    output_default: str | None = None
    batch: bool = False  # the first positional takes several inputs or a folder (jobs/batch.py)


def _field_flags(prefix: str = "") -> tuple[Flag, ...]:
    p = prefix
    return (
        Flag("--resolution", f"{p}field.resolution"),
        Flag("--threshold", f"{p}mesh.threshold"),
        Flag("--carve", f"{p}mesh.carve"),
        Flag("--mode", f"{p}field.mode"),
        _max_faces(p),
    )


def _serve_config() -> type:
    from microdreamer.serve.config import ServeConfig  # no FastAPI, no torch

    return ServeConfig


def _max_faces(prefix: str) -> Flag:
    """``--max-faces N``: the mesh simplified to about N faces (``--decimate``, its first name, still works)."""
    return Flag("--max-faces", f"{prefix}mesh.decimate_target", "N", aliases=("--decimate",))


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
        "convert a splat (3DGS PLY, compressed PLY, SPZ, SOG, .splat, .ksplat, glTF) into a mesh (.glb, .obj or .ply)",
        config.ExportConfig,
        (("splat", "SPLAT", "input splat(s) in any splat format, or a folder of them (a batch)"),),
        (
            "OUT.{glb,obj,ply}|DIR/",
            True,
            "output mesh: OUT.glb, OUT.obj or OUT.ply; for a batch a folder "
            "(OUT/<stem>.glb per splat, summary.json)",
        ),
        (
            *_field_flags(),
            Flag("--texture", "texture.mode"),
            Flag("--texture-size", "texture.size"),
            Flag("--refine", "texture.refine.steps", "STEPS"),
            Flag("--up", "up"),
            Flag("--tiles", "scene.tiles", "off|auto|N"),
            Flag("--voxel", "scene.voxel", "SIZE|auto"),
            Flag("--memory", "scene.memory", "GB|auto"),
            Flag("--tile-threads", "scene.threads", "N|auto"),
            Flag("--tileset", "scene.tileset", "DIR"),
            Flag("--tile-texture", "scene.texture", "colors|bake"),
            Flag("--cameras", "scene.cameras", "JSON"),
            Flag("--background", "scene.background"),
            Flag("--crop", "crop", "BOX|auto"),
        ),
        batch=True,
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
            Flag("--up", "up"),
        ),
        preset=False,
    ),
    Command(
        "reconstruct",
        "reconstruct a splat (and mesh) from a transforms.json dataset",
        config.ReconstructJobConfig,
        (("data", "DIR", "dataset folder with transforms.json and RGBA PNGs"),),
        ("OUT/", True, "output folder: splat.ply, mesh.glb, held_out_views.png, metrics.json"),
        (
            Flag("--iters", "reconstruct.iters"),
            Flag("--up", "up"),
            Flag("--frame", "frame"),
            _max_faces("export."),
        ),
    ),
    Command(
        "generate",
        "image-to-3D (Zero123), text-to-3D (--prompt, MVDream) or image+text-to-3D (both, ImageDream) with "
        "MicroDreamer's SIR",
        config.GenerateConfig,
        (
            (
                "image",
                "[IMAGE...|DIR]",
                "input image(s): RGBA (its alpha is the mask) or RGB (background removed), or a folder of them "
                "(a batch); leave it out for text-to-3D (--prompt)",
                "*",
            ),
        ),
        (
            "OUT/",
            True,
            "output folder: input_rgba.png (with an image), splat.ply, mesh.glb, views.png, timings.json; for a "
            "batch "
            "OUT/<stem>/ per image and OUT/summary.json",
        ),
        (
            Flag("--negative-prompt", "negative_prompt", "TEXT"),
            Flag("--iters", "sir.iterations"),
            Flag("--seed", "sir.seed"),
            Flag("--elevation", "elevation_deg"),
            _max_faces("export."),
        ),
        batch=True,
    ),
    Command(
        "render",
        "turntable of a mesh or splat: .mp4, .gif, or .png (8-view contact sheet)",
        config.TurntableConfig,
        (("source", "MESH_OR_SPLAT", "a mesh (GLB, OBJ, PLY) or a splat in any splat format"),),
        ("turntable.{mp4,gif,png}", True, "turntable.mp4, turntable.gif or views.png"),
        (
            Flag("--frames", "frames"),
            Flag("--size", "size"),
            Flag("--elevation", "elevation_deg"),
            Flag("--up", "up"),
            Flag("--crop", "crop", "BOX|auto"),
        ),
        preset=False,
    ),
    Command(
        "view",
        "a self-contained web viewer of meshes, splats, 3D Tiles tilesets and output folders (works offline)",
        None,
        (
            (
                "paths",
                "PATH...",
                "meshes (.glb, .obj), splats (any splat format), tileset folders (mesh --tileset) or output "
                "folders of mesh/reconstruct/generate",
                "+",
            ),
        ),
        ("DIR", False, "viewer folder (default: PATH_viewer beside the first input)"),
        (),
        preset=False,
        device=False,
    ),
    Command(
        "profile",
        "Gustafson's view: field, mesh and texture seconds of one splat against the grid resolution",
        config.ExportConfig,
        (
            ("what", "scaling", "what to profile: scaling (stage seconds against the grid resolution)"),
            ("splat", "SPLAT", "input splat, any splat format"),
        ),
        ("DIR", False, "output folder: scaling.json, scaling.png"),
        (Flag("--texture", "texture.mode"),),
        output_default="out/profile",
    ),
    Command(
        "convert",
        "convert a splat between formats: 3DGS PLY, compressed PLY, SPZ, SOG, .splat, .ksplat, glTF",
        None,
        (
            ("source", "SPLAT", "input splat in any format (chosen by its content)"),
            ("target", "OUT", "output splat (or give it as -o OUT)", "?"),
        ),
        (
            "OUT.{ply,compressed.ply,spz,sog,splat,ksplat,glb,gltf,spz.glb}|DIR/meta.json",
            False,
            "output splat, in the format its name says (.spz.glb: glTF with SPZ compression; meta.json: "
            "a SOG folder)",
        ),
        (),
        preset=False,
        device=False,
    ),
    Command(
        "evaluate",
        "CLIP similarity of textured meshes to their input image (MicroDreamer's scripts/cal_sim.py)",
        config.EvaluateConfig,
        (("assets", "OUT_OR_MESH...", "output folders of generate (their mesh.glb) or mesh files", "+"),),
        ("DIR", True, "output folder: <name>.json and <name>.png per asset, summary.json"),
        (Flag("--model", "model", "PATH|REPO_ID"), Flag("--views", "views"), Flag("--size", "size")),
        preset=False,
    ),
    Command(
        "serve",
        "a warm service: a web page and an HTTP API that queue mesh and generate jobs (the model loaded once)",
        _serve_config(),
        (),
        None,
        (
            Flag("--host", "host"),
            Flag("--port", "port"),
            Flag("--model", "model", "PATH|REPO_ID"),
            Flag("--random-weights", "random_weights"),
            Flag("--workers", "workers", "N"),
            Flag("--ray-address", "ray_address", "ADDR"),
            Flag("--jobs-dir", "jobs_dir", "DIR"),
            Flag("--token", "token", "TOKEN"),
            Flag("--config", "generate_config", "YAML"),
            Flag("--max-upload-mb", "max_upload_mb", "MB"),
            Flag("--job-timeout", "job_timeout_s", "S"),
            Flag("--keep-jobs", "keep_jobs", "N"),
            Flag("--keep-hours", "keep_hours", "H"),
            Flag("--device", "device"),
        ),
        preset=False,
        device=False,
    ),
)


def _ranged(low: int, high: int, what: str):
    """An argparse type: an integer in [low, high] (argparse's one-line error otherwise)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number; give {what}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{text} is out of range; {what} is {low} to {high}")
        return value

    parse.__name__ = what
    return parse


#: arguments that set no config field: (command, flag) -> (argparse keywords, synopsis placeholder)
EXTRA = {
    ("render-views", "--texture"): ({"default": None, "metavar": "PNG",
                                     "help": "texture image for an OBJ without an MTL"}, "PNG"),
    ("reconstruct", "--no-mesh"): ({"action": "store_true", "help": "skip the mesh export"}, None),
    ("generate", "--prompt"): ({"default": None, "metavar": "TEXT", "help": "the object to make: text-to-3D "
                                "without an image (MVDream), image+text-to-3D with one (ImageDream)"}, "TEXT"),
    ("generate", "--model"): ({"default": None, "metavar": "PATH|REPO_ID", "help": "a diffusers-format folder or a "
                               "repo id in the local Hugging Face cache (default: the mode's, "
                               f"{config.DEFAULT_ZERO123}, {config.DEFAULT_MVDREAM} or {config.DEFAULT_IMAGEDREAM})"},
                              "PATH|REPO_ID"),
    ("generate", "--random-weights"): ({"choices": list(config.RANDOM_WEIGHTS), "default": None,
                                        "help": "use a randomly initialised model (timing and plumbing "
                                                "only: the output is noise)"}, "tiny|full"),
    ("mesh", "--with-splat"): ({"action": "store_true", "help": "also write the splat into OUT.glb "
                                "(KHR_gaussian_splatting, in the mesh's frame): splat viewers show it, others the mesh"}, None),
    ("mesh", "--profile"): ({"action": "store_true", "help": "also write OUT.profile.json and OUT.profile.png: "
                             "seconds per stage and each stage's Amdahl bound"}, None),
    ("reconstruct", "--profile"): ({"action": "store_true", "help": "also write profile.json and profile.png "
                                    "(seconds per stage, Amdahl bounds) into OUT/"}, None),
    ("generate", "--profile"): ({"action": "store_true", "help": "also write profile.json and profile.png "
                                 "(seconds per stage, Amdahl bounds) into OUT/"}, None),
    ("generate", "--splat-formats"): ({"default": None, "metavar": "EXT,...", "help": "also write the splat "
                                       "beside splat.ply in these formats (spz, sog, compressed.ply, splat, "
                                       "ksplat, glb)"}, "EXT,..."),
    ("reconstruct", "--splat-formats"): ({"default": None, "metavar": "EXT,...", "help": "also write the splat "
                                          "beside splat.ply in these formats (spz, sog, compressed.ply, splat, "
                                          "ksplat, glb)"}, "EXT,..."),
    ("demo", "--splat-formats"): ({"default": None, "metavar": "EXT,...", "help": "also write the splat beside "
                                   "splat.ply in these formats (spz, sog, compressed.ply, splat, ksplat, glb)"},
                                  "EXT,..."),
    ("view", "--serve"): ({"action": "store_true", "help": "serve the folder on 127.0.0.1 and print its address "
                           "(Ctrl-C stops)"}, None),
    ("view", "--crop"): ({"default": None, "metavar": "BOX|auto", "help": "crop splats to a box X0,Y0,Z0,X1,Y1,Z1 "
                          "(their own coordinates) or auto: the main object of a scene (ground and far floaters "
                          "out)"}, "BOX|auto"),
    ("view", "--port"): ({"type": _ranged(0, 65535, "a TCP port"), "default": 0, "metavar": "N", "help": "the server's port (default 0: a "
                          "free one)"}, "N"),
    ("profile", "--resolutions"): ({"default": "128,256,384,512,768,1024", "metavar": "R,R,...",
                                    "help": "grid resolutions, as memory allows (default 128,256,384,512,768,1024)"},
                                   "R,R,..."),
    **{(name, flag): spec for name in ("mesh", "generate") for flag, spec in {
        "--overwrite": ({"action": "store_true", "help": "batches: redo inputs whose outputs exist (default: "
                                                         "skip them)"}, None),
        "--workers": ({"type": _ranged(1, 4096, "a worker count"), "default": None, "metavar": "N",
                       "help": "batches (and mesh --tiles: the tiles): run on N Ray workers (a local "
                               "cluster: one per GPU, or CPU workers when there is no GPU); needs the "
                               "distributed extra"}, "N"),
        "--ray-address": ({"default": None, "metavar": "ADDR",
                           "help": "batches (and mesh --tiles): run on the existing Ray cluster at ADDR "
                                   "(host:port or auto); --workers defaults to its GPUs"}, "ADDR"),
    }.items()},
    ("generate", "--no-refine"): ({"action": "store_true",
                                   "help": "skip stage 2 (the texture refined against the prior)"}, None),
    ("evaluate", "--image"): ({"action": "append", "default": [], "metavar": "INPUT",
                               "help": "the input image: once for all assets, or once per asset in order "
                                       "(default: each folder's timings.json records it)"}, "INPUT"),
}  # fmt: skip
BY_NAME = {c.name: c for c in COMMANDS}


def _number_or_word(text: str) -> float | str:
    """A ``float | str`` setting's value: a number when it reads as one (``0.2``), else the word (``auto``)."""
    try:
        return float(text)
    except ValueError:
        return text


def _integer_or_word(text: str) -> int | str:
    """An ``int | str`` setting's value: an integer when it reads as one (``256``), else the word
    (``auto``; a number that is not an integer stays text, which the config then refuses)."""
    try:
        return int(text)
    except ValueError:
        return text


def _scalar_type(annotation: Any) -> Any:
    """int, float or str of a field annotation (``int | None`` -> int); ``float | str`` -> a number or
    a word (:func:`_number_or_word`)."""
    if typing.get_origin(annotation) is not None:
        options = [a for a in typing.get_args(annotation) if a is not type(None)]
        if float in options and str in options:
            return _number_or_word
        if int in options and str in options:
            return _integer_or_word
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


class _StoreNamed(argparse.Action):
    """Stores the value and the option string it came with (``--decimate`` or ``--max-faces``), so that
    :func:`job_config` names a bad value by the flag the user typed."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        setattr(namespace, self.dest, values)
        typed = dict(getattr(namespace, "typed_flags", None) or {})
        typed[self.dest] = option_string
        namespace.typed_flags = typed


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="microdreamer",
        description="Image-to-3D with MicroDreamer (score-based iterative reconstruction) and fast, "
        "textured Gaussian-splat-to-mesh conversion.",
    )
    p.add_argument("--version", action="version", version=f"microdreamer {__version__}")
    p.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for cmd in COMMANDS:
        sp = sub.add_parser(cmd.name, help=cmd.help, description=cmd.help)
        for i, (dest, metavar, text, *nargs) in enumerate(cmd.positionals):
            if not nargs and cmd.batch and i == 0:
                nargs = ["+"]
            sp.add_argument(dest, metavar=metavar, help=text, **({"nargs": nargs[0]} if nargs else {}))
        metavar, required, text = cmd.output or ("", False, "")
        if cmd.output is None:
            pass
        elif required:
            sp.add_argument("-o", "--output", required=True, metavar=metavar, help=text)
        else:
            default = f" (default {cmd.output_default})" if cmd.output_default else ""
            sp.add_argument(
                "-o", "--output", default=cmd.output_default, metavar=metavar, help=text + default
            )
        for flag in cmd.flags:
            spec = _flag_spec(cmd, flag)
            if flag.aliases:  # errors name the flag as typed
                spec["action"] = _StoreNamed
            sp.add_argument(flag.name, *flag.aliases, **spec)
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
        parts = [
            meta + ("...|DIR" if cmd.batch and i == 0 and not nargs else "")
            for i, (_, meta, _, *nargs) in enumerate(cmd.positionals)
        ]
        if cmd.output is not None:
            metavar, required, _ = cmd.output
            parts.append(f"-o {metavar}" if required else f"[-o {cmd.output_default or metavar}]")
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


def job_config(args: argparse.Namespace, base=None):
    """The command's job config: its preset (``--config``) or ``base`` (default: the job config's defaults),
    then the flags the user gave.

    Raises:
        InputError: a bad preset, or a flag whose value breaks its field's rule (named by the flag).
    """
    cmd: Command = args.command_spec
    if cmd.job is None:
        return None
    if cmd.preset and args.config:
        cfg = config.load_preset(cmd.job, args.config, base=base)
    else:
        cfg = base if base is not None else cmd.job()
    typed = getattr(args, "typed_flags", None) or {}
    for flag in cmd.flags:
        dest = flag.path.replace(".", "__")
        value = getattr(args, dest)
        if value is None:
            continue
        try:
            cfg = config.replace_path(cfg, flag.path, value)
        except ConfigError as e:
            raise InputError(f"{typed.get(dest) or flag.name} {value}: {e.rule}") from None
    return cfg


def _minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


def _progress_bar(
    desc: str, total: int | None = None, weights: list[float] | None = None, file=None, lines: bool = True
):
    """Progress of a long step on stderr, driven by fractions in [0, 1]; returns (update, close).

    On a terminal: a tqdm bar. Elsewhere (a log file, a pipe, a test's captured stderr): log lines, the
    first update's, then one per 10 % or 30 s and the last: ``SIR iterations: 5/20 (25%) after 61 s,
    about 3.2 min left``. ``total`` shows the fraction as steps done out of ``total``; ``weights`` (one
    per step) are the steps' relative costs, so the time left counts what the remaining steps cost
    (default: equal); ``lines=False``: no log lines (a bar on a terminal only). An ``update(0.0)``
    restarts the clock (a job calls it when the step begins, after
    its set-up). The lead can re-point this at a shared progress module: the interface is the pair.
    """
    out = file if file is not None else sys.stderr
    terminal = hasattr(out, "isatty") and out.isatty()
    start = [time.perf_counter()]
    last = {"fraction": -1.0, "time": 0.0}
    costs = None
    if total and weights and len(weights) == total and sum(weights) > 0:
        costs = [sum(weights[:k]) / sum(weights) for k in range(total + 1)]

    def done_share(fraction: float) -> float:
        if costs is None:
            return fraction
        return costs[max(0, min(total, int(round(fraction * total))))]

    def left(fraction: float, elapsed: float) -> str:
        share = done_share(fraction)
        if share <= 0 or fraction >= 1:
            return ""
        return f", about {_minutes(elapsed * (1 - share) / share)} left"

    def where(fraction: float) -> str:
        pct = f"{100 * fraction:.0f}%"
        return f"{int(round(fraction * total))}/{total} ({pct})" if total else pct

    if terminal:
        from tqdm import tqdm

        bar = tqdm(
            total=100,
            desc=desc,
            unit="%",
            leave=False,
            file=out,
            bar_format="{l_bar}{bar}| {elapsed}{postfix}",
        )

        def update(fraction: float) -> None:
            if fraction == 0.0:
                start[0] = time.perf_counter()
            bar.n = int(round(100 * fraction))
            bar.set_postfix_str(left(fraction, time.perf_counter() - start[0]).lstrip(", "), refresh=False)
            bar.refresh()

        return update, bar.close

    if not lines:
        return (lambda fraction: None), (lambda: None)

    def log_line(fraction: float) -> None:
        now = time.perf_counter()
        if fraction == 0.0:
            start[0] = now
            if last["fraction"] < 0:
                print(f"{desc}: started", file=out, flush=True)
                last.update(fraction=0.0, time=now)
            return
        due = fraction >= 1 or last["fraction"] < 0 or fraction - last["fraction"] >= 0.1 - 1e-9
        if due or now - last["time"] >= 30:
            elapsed = now - start[0]
            print(
                f"{desc}: {where(fraction)} after {_minutes(elapsed)}{left(fraction, elapsed)}",
                file=out,
                flush=True,
            )
            last.update(fraction=fraction, time=now)

    return log_line, lambda: None


def _stage_printer(file=None):
    """A ``stage(message)`` callback for the jobs' long steps: prints ``  <message>`` on stderr with the
    seconds since the command started, so no stage runs silently."""
    out = file if file is not None else sys.stderr
    start = time.perf_counter()

    def stage(message: str) -> None:
        print(f"[{time.perf_counter() - start:6.1f} s] {message}", file=out, flush=True)

    return stage


def _mesh_stages(file=None):
    """The stage callback of ``mesh``: :func:`_stage_printer` minus the density-field line (its bar
    shows it; before it only bad input can end the command, with its one error line)."""
    printer = _stage_printer(file)

    def stage(message: str) -> None:
        if not message.startswith("density field"):
            printer(message)

    return stage


def _sir_weights(cfg) -> tuple[list[float], int, int]:
    """Each SIR iteration's relative cost for the time-left estimate, and the UNet calls of the run
    (guided, unconditional): iteration k denoises from its t2 (guided calls, twice the views' batch) after
    inverting from t1 (unconditional calls), on the DDIM grid of ``cfg.prior.ddim``
    (:func:`microdreamer.priors.ddim.sir_timesteps`)."""
    from microdreamer.priors.ddim import ddim_calls, sir_timesteps

    s, p = cfg.sir, cfg.prior
    weights, guided, uncond = [], 0, 0
    for t1, t2 in sir_timesteps(s.iterations, s.t_start, s.t_end, p.inversion_ratio, p.ddim):
        u, g = ddim_calls(t1, t2, p.ddim)
        guided, uncond = guided + g, uncond + u
        weights.append(2.0 * g + u + 1.0)  # + 1: the reconstruction steps, rendering, VAE
    return weights, guided, uncond


#: seconds of one guided (batch 12) call of the full-size Zero123 UNet at 256^2 in float32, measured on
#: the 2-core development CPU (load ~3-4): 15.2 s, one run with no result file kept (an estimate's scale)
CPU_GUIDED_CALL_S = 15.0


def _cpu_estimate(cfg, random_weights: str | None) -> str | None:
    """The warning generate prints before a full-size model runs on the CPU, with a time estimate."""
    if random_weights == "tiny":
        return None
    _, guided, uncond = _sir_weights(cfg)
    views = cfg.sir.views
    seconds = CPU_GUIDED_CALL_S * (views / 6) * (guided + 0.5 * uncond)
    return (f"note: generate on the CPU with a full-size Zero123 is slow: {cfg.sir.iterations} SIR iterations make "
            f"{guided} guided and {uncond} unconditional UNet calls ({2 * views} and {views} images each); at "
            f"~{CPU_GUIDED_CALL_S:.0f} s a guided call (a 2-core CPU) that is about {_minutes(seconds)} (a GPU: "
            "~5 s in all). The time left is re-estimated after each iteration.")  # fmt: skip


class Terminated(BaseException):
    """SIGTERM, SIGHUP (a closed terminal) or SIGQUIT, raised in the main thread so that every ``finally``
    (temporary files, staging folders) runs; ``signum`` is the signal."""

    def __init__(self, signum: int = 15) -> None:
        super().__init__(signum)
        self.signum = signum


def _on_sigterm(signum, frame) -> None:
    raise Terminated(signum)


class _Parser(argparse.ArgumentParser):
    """argparse's own errors as the one line every other error is: ``error: ...`` (exit status 2)."""

    def error(self, message: str) -> typing.NoReturn:
        hint = f"; see {self.prog} --help"
        self.exit(2, f"error: {self.prog}: {message}{hint}\n")


# ------------------------------------------------------------------------------------ input/output checks


def _check_mesh_output(args: argparse.Namespace, cfg) -> Path:
    """``mesh -o``: suffix, a writable folder (missing folders are made later, and removed on failure),
    not the input, and no file written beside it (a textured OBJ's .mtl and .png) that microdreamer did
    not write."""
    from microdreamer.io_utils import check_companions, check_output_path, textured_obj_companions

    out = check_output_path(
        args.output, config.MESH_FORMATS, "mesh", inputs=[args.splat], create_parents=True
    )
    if cfg.scene.tileset is not None:
        from microdreamer.io_utils import check_output_folder
        from microdreamer.jobs.scene import TILESET_OUTPUTS

        check_output_folder(cfg.scene.tileset, TILESET_OUTPUTS, [args.splat])
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


#: the files a profiled run adds to its folder
PROFILE_FILES = ("profile.json", "profile.png")


def _job_folder(
    args: argparse.Namespace, outputs: tuple[str, ...], inputs: list, owned: tuple[str, ...] = ()
):
    """Checks a job's output folder and gives the staged folder the job writes into (moved into place as
    one only when the job succeeds, ``outputs`` and ``owned`` of an earlier run replaced, the user's other
    files kept; see :func:`microdreamer.io_utils.staged_folder`)."""
    from microdreamer.io_utils import check_output_folder, staged_folder

    check_output_folder(args.output, outputs, inputs)
    return staged_folder(args.output, owned=(*outputs, *owned, *PROFILE_FILES))


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


def _seconds(seconds: dict[str, float], digits: int = 3) -> str:
    return "seconds: " + ", ".join(f"{k} {v:.{digits}f}" for k, v in seconds.items())


# ------------------------------------------------------------------------------------------- commands


def _batch_requested(
    args: argparse.Namespace, sources: list[str], folder_output: bool = False, tiles: bool | None = None
) -> bool:
    """A batch: several inputs, a folder, or (mesh) an output folder; else today's single-input command.
    ``--workers`` / ``--ray-address`` need a batch, or (mesh, ``tiles`` not None) a scene in tiles."""
    batch = len(sources) > 1 or any(Path(s).is_dir() for s in sources) or folder_output
    if not batch and not tiles and (args.workers is not None or args.ray_address):
        flag = "--workers" if args.workers is not None else "--ray-address"
        if tiles is None:
            raise InputError(f"{flag}: runs batches; give several inputs or a folder (one input runs here)")
        raise InputError(f"{flag}: runs batches or a scene's tiles; give several inputs, a folder, or "
                         "--tiles auto|N (--tiles off runs here)")  # fmt: skip
    return batch


class _BatchProgress:
    """Progress over a batch's inputs: a bar when stderr is a terminal, else one line per input."""

    def __init__(self, total: int, what: str) -> None:
        self.bar = None
        if sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit=what, file=sys.stderr, leave=False)

    def __call__(self, result, done: int, total: int) -> None:
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix_str(f"{result.name}: {result.status}")
            return
        more = f", {result.num_gaussians} Gaussians" if result.num_gaussians is not None else ""
        tail = f": {result.error}" if result.error else ""
        print(f"[{done}/{total}] {result.name}: {result.status} ({result.seconds:.2f} s{more}){tail}",
              file=sys.stderr, flush=True)  # fmt: skip

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _run_batch(args: argparse.Namespace, job, sources: list[str], cfg) -> int:
    """Run ``job`` over ``sources`` into the folder ``args.output`` (jobs/batch.py), print the table and
    write summary.json; exit status 1 when any input failed."""
    from microdreamer.jobs import batch

    distributed = args.workers is not None or bool(args.ray_address)
    if distributed:
        batch.import_ray("--workers" if args.workers is not None else "--ray-address")  # one line, first
    if args.ray_address:
        batch.check_ray_address(args.ray_address)  # bounded, before any input is read
    items = batch.plan(batch.collect_inputs(sources, job.suffixes, f"{job.what} files"), args.output, job)
    from microdreamer.io_utils import made_parents, run_lock

    progress = _BatchProgress(len(items), job.what)
    # one batch at a time writes OUT (each input's folder is staged and locked as a single run's is)
    with made_parents(Path(os.path.abspath(args.output)).parent), run_lock(args.output):
        try:
            if distributed:
                report = batch.run_ray(job, items, args.overwrite, progress, workers=args.workers,
                                       address=args.ray_address)  # fmt: skip
            else:
                report = batch.run_local(job, items, args.overwrite, progress)
        finally:
            progress.close()
        extra = {"command": "microdreamer " + " ".join(sys.argv[1:]), "config": config.to_dict(cfg)}
        summary = batch.write_summary(report, args.output, extra)
    print(batch.table(report))
    setup = max((sum(v for v in s.values() if isinstance(v, float)) for s in report.setup), default=0.0)
    print(f"{report.count('ok')} ok, {report.count('failed')} failed, {report.count('skipped')} skipped of "
          f"{len(items)} in {report.wall:.2f} s ({report.workers} worker(s), setup {setup:.2f} s) -> {summary}")  # fmt: skip
    return 1 if report.failed else 0


def _read_splat_before_torch(path: str):
    """Read and check the splat at ``path`` with NumPy alone (torch, ~1 s to import, is not loaded yet):
    ``(arrays, None, seconds, started)``, or ``(None, error, seconds, started)`` for bad input, whose
    one-line error the caller raises after its own checks (device, grid memory); ``started`` is the
    :func:`time.perf_counter` at which the read began."""
    from microdreamer.formats import read_splat_arrays

    started = time.perf_counter()
    try:
        arrays, error = read_splat_arrays(path), None
    except InputError as e:
        arrays, error = None, e
    return arrays, error, time.perf_counter() - started, started


def cmd_mesh(args: argparse.Namespace) -> int | None:
    sources = list(args.splat)
    folder_output = args.output.endswith(("/", os.sep)) or (
        Path(args.output).is_dir() and Path(args.output).suffix.lower() not in config.MESH_FORMATS
    )  # a folder named x.glb is refused as the output of one conversion, not taken for a batch
    tiles = job_config(args).scene.enabled
    if _batch_requested(args, sources, folder_output, tiles):
        if Path(args.output).suffix.lower() in config.MESH_FORMATS and not folder_output:
            raise InputError(f"-o {args.output}: a batch writes one mesh per splat; give an output folder "
                             "(-o DIR/)")  # fmt: skip
        cfg = dataclasses.replace(job_config(args), with_splat=args.with_splat)
        if cfg.scene.tileset is not None:
            raise InputError(f"--tileset {cfg.scene.tileset}: writes one scene; give one splat (a batch writes "
                             "one mesh per splat)")  # fmt: skip
        if cfg.scene.cameras is not None:
            raise InputError(f"--cameras {cfg.scene.cameras}: one capture's cameras; give that capture's splat "
                             "alone (a batch meshes several)")  # fmt: skip
        from microdreamer.jobs.batch import MeshJob

        return _run_batch(args, MeshJob(cfg, args.device), sources, cfg)
    args.splat = sources[0]
    cfg = dataclasses.replace(job_config(args), with_splat=args.with_splat)  # checked before reading anything
    if args.workers is not None or args.ray_address:  # the scene's tiles on Ray workers
        from microdreamer.jobs import batch

        batch.import_ray("--workers" if args.workers is not None else "--ray-address")  # one line, first
        if args.ray_address:
            batch.check_ray_address(args.ray_address)  # bounded, before the splat is read
        scene = dataclasses.replace(cfg.scene, workers=args.workers, ray_address=args.ray_address)
        cfg = dataclasses.replace(cfg, scene=scene)
    out = _check_mesh_output(args, cfg)
    if cfg.scene.cameras is not None and cfg.scene.texture == "bake":  # a bad file before the splat is read
        from microdreamer.data.capture import read_capture_cameras

        read_capture_cameras(cfg.scene.cameras)
    arrays, bad_input, read_s, started = _read_splat_before_torch(args.splat)
    t = time.perf_counter()
    import torch

    from microdreamer.io_utils import made_parents
    from microdreamer.jobs import resolve_device
    from microdreamer.jobs.export import check_grid_memory, export_mesh
    from microdreamer.profiling import StageTimer
    from microdreamer.splat import Splat

    import_s = time.perf_counter() - t
    device = resolve_device(args.device)
    check_grid_memory(cfg.field.resolution, device)
    if bad_input is not None:  # after the device and grid checks, which come first as they always have
        raise bad_input
    splat = Splat.from_arrays(arrays)
    logging.getLogger(__name__).info("read %s in %.3f s; torch and the stages imported in %.3f s", args.splat,
                                     read_s, import_s)  # fmt: skip
    timer = StageTimer()
    from microdreamer import progress

    update = progress.reporter("density field")  # a bar on a terminal, coarse lines in a log
    close = update.close
    try:
        with made_parents(out.parent):
            result = export_mesh(splat, out, cfg, device, timer=timer, progress=update, name=str(args.splat),
                                 texture_progress=True, stage=_mesh_stages())  # fmt: skip
    finally:
        close()
    conv, mesh = result.convert, result.mesh
    gpu = f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else ""
    print(f"Gaussians: {conv.num_gaussians_in} read, {conv.num_gaussians_kept} kept "
          f"(opacity > {cfg.field.min_opacity})")  # fmt: skip
    grid_note = " (auto: from the splat's Gaussian sizes)" if cfg.field.resolution == "auto" else ""
    carve = conv.carve or {}
    carved = carve.get("skipped") is None and carve.get("directions")
    iso_note = " (auto: from the splat's alpha)" if conv.iso_method == "auto" else ""
    if carved and conv.iso_method == "auto":
        iso_note = f" (auto: {cfg.mesh.carve_level:g} x the level that matches the splat's alpha)"
    if conv.backend.endswith("-tiles"):
        st = conv.mesh_stats
        shape = "x".join(map(str, st["grid_shape"]))
        grid_note = (f" in {st['tiles_with_gaussians']} tiles of {st['tile_cells']}^3 cells, voxel {st['voxel']:.4g}"
                     + (f" (resumed: {st['tiles_resumed']} meshed tiles, {st['fields_resumed']} fields)"
                        if st["tiles_resumed"] or st["fields_resumed"] else ""))  # fmt: skip
        tex_stats = result.texture_stats
        colour = "; coloured per vertex from the splat's colour field" if tex_stats else ""
        if "views" in tex_stats:  # --tile-texture bake
            kinds = ", ".join(f"{n} {kind}" for kind, n in tex_stats["views"].items())
            colour = (
                f"; a {tex_stats['size']}^2 texture per tile baked in {tex_stats['tiles']} tiles ({kinds})"
            )
        print(f"grid: {shape}{grid_note}, tiles on {st['device']}{gpu} ({st['backend']}); "
              f"iso-level {conv.iso_level:.3g}{iso_note}{colour}")  # fmt: skip
        peaks = ", ".join(f"{k} {v:.2f}" for k, v in st["peak_rss_GiB_after"].items())
        gpu_peak = f"; peak GPU memory {st['peak_gpu_GiB']:.2f} GiB" if "peak_gpu_GiB" in st else ""
        print(f"peak RSS (GiB) after: {peaks}{gpu_peak}")
    else:
        print(f"grid: {conv.resolution}^3{grid_note}, mode {cfg.field.mode}, backend {conv.backend} on {device}{gpu}; "
          f"iso-level {conv.iso_level:.3g}{iso_note}"
          + (f"; carved to the splat's silhouettes from {carve['directions']} directions" if carved else ""))  # fmt: skip
    tex = f", {cfg.texture.mode} texture {cfg.texture.size}^2" if mesh.has_texture else ""
    from microdreamer.jobs.export import written_as

    if (how := written_as(out, mesh)) is not None:
        tex += f" ({how})"
    elif "views" in result.texture_stats:
        tex += (" (a texture per tile's node)" if out.suffix.lower() == ".glb"
                else " (one mesh: the tiles' textures sampled into vertex colours)")  # fmt: skip
    print(
        f"mesh: {mesh.num_vertices} vertices, {mesh.num_faces} faces{tex} -> {_written(out, mesh.has_texture)}"
    )
    print(_seconds(timer.seconds))
    if args.profile:
        seconds = {"start-up": started - _STARTED, "read": read_s, "import": import_s, **timer.seconds}
        _write_profile(texture_parts(seconds, result.texture_stats), out.parent,
                       f"microdreamer mesh {Path(args.splat).name}", name=f"{out.stem}.profile")  # fmt: skip


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
    _check_splat_formats(args)
    with staged as stage:
        m = run_demo(stage, cfg, device)
        extra = _write_splat_formats(args, stage)
    m["paths"] = {k: Path(args.output) / Path(v).relative_to(stage) for k, v in m["paths"].items()}
    q = m["mesh_quality"]
    print(f"held-out views: PSNR {m['psnr']:.2f} dB, SSIM {m['ssim']:.4f}; {m['num_gaussians']} Gaussians")
    print(f"mesh vs the object: Chamfer-L1 {100 * q['chamfer_l1_rel']:.2f}% of its diagonal, "
          f"F-score@1% {q['fscore@0.01']:.3f}")  # fmt: skip
    print(_seconds(m["seconds"], 2))
    for name, path in m["paths"].items():
        print(f"  {name:<8} {path}")
    for name in extra:
        print(f"  {'splat':<8} {Path(args.output) / name}")


def cmd_render_views(args: argparse.Namespace) -> None:
    from microdreamer.io_utils import check_input

    cfg = job_config(args)
    check_input(args.mesh, "file", "mesh")
    if args.texture is not None:
        check_input(args.texture, "file", "texture image")
    _check_not_inside(Path(args.output), [args.mesh, args.texture])
    from microdreamer.io_utils import check_output_folder

    check_output_folder(args.output)  # before any render: the folder, the one above it (staging), the name
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
    staged = _job_folder(args, ("splat.ply", "mesh.glb", "held_out_views.png", "metrics.json"), [])
    _check_splat_formats(args)
    out = Path(args.output)
    with staged as stage:
        metrics = reconstruct_dataset(args.data, stage, cfg, device=device)
        extra = _write_splat_formats(args, stage)
        if args.profile:  # into the stage: the run's files move in together
            _write_profile(metrics.get("seconds", {}), stage, f"microdreamer reconstruct {Path(args.data).name}",
                           shown=out)  # fmt: skip
    psnr = metrics.get("psnr")
    print(f"Gaussians: {metrics.get('num_gaussians')}")
    if psnr is not None:
        print(f"held-out views: PSNR {psnr:.2f} dB, SSIM {metrics.get('ssim'):.4f}")
    print(_seconds(metrics.get("seconds", {}), 2))
    files = (
        ["splat.ply", *extra] + (["mesh.glb"] if cfg.mesh else []) + [metrics.get("pictures"), "metrics.json"]
    )
    if args.profile:
        files += list(PROFILE_FILES)
    print("wrote " + ", ".join(str(out / f) for f in files if f))
    frame = metrics.get("output_frame") or {}
    if frame:
        print(
            f"frame of splat.ply{' and mesh.glb' if cfg.mesh else ''}: {frame['note']} (--frame {frame['name']})"
        )


def cmd_generate(args: argparse.Namespace) -> int | None:
    sources = list(args.image or [])
    if args.prompt and len(sources) > 1:
        raise InputError("--prompt: batches take images alone; give one image with a prompt")
    batch = _batch_requested(args, sources) if sources else False
    if not batch and sources and not Path(sources[0]).is_file():  # before torch is imported: fails at once
        raise InputError(f"{sources[0]}: no such image file")
    from microdreamer.jobs.generate import default_config, generation_mode

    mode = generation_mode(sources[0] if sources else None, args.prompt)
    cfg = job_config(args, base=default_config(mode))
    if args.no_refine:
        cfg = config.replace_path(cfg, "refine.enabled", False)
    if batch:
        if args.random_weights:
            print(f"WARNING: --random-weights {args.random_weights}: the diffusion model has RANDOM weights; "
                  "the output is noise, useful only for timing and plumbing", file=sys.stderr)  # fmt: skip
        from microdreamer.jobs.batch import GenerateJob

        job = GenerateJob(cfg, model=args.model, random_weights=args.random_weights, device=args.device)
        return _run_batch(args, job, sources, cfg)
    args.image = sources[0] if sources else None
    from microdreamer.jobs import resolve_device
    from microdreamer.jobs.generate import generate

    staged = _job_folder(args, ("input_rgba.png", "splat.ply", "mesh.glb", "views.png", "timings.json"),
                         [args.image])  # fmt: skip

    device = resolve_device(args.device)  # the random-weights warning comes from the job, once
    if device.type == "cpu" and (note := _cpu_estimate(cfg, args.random_weights)):
        print(note, file=sys.stderr)
    weights, _, _ = _sir_weights(cfg)
    update, close = _progress_bar("SIR iterations", cfg.sir.iterations, weights)
    out = Path(args.output)
    try:
        _check_splat_formats(args)
        with staged as folder:
            report = generate(args.image, folder, cfg, model=args.model, random_weights=args.random_weights,
                              device=device, progress=update, prompt=args.prompt, stage=_stage_printer())  # fmt: skip
            extra = _write_splat_formats(args, folder)
            if args.profile:  # into the stage: the run's files move in together
                _write_profile(texture_parts(report.get("seconds", {}), report.get("texture") or {}), folder,
                               f"microdreamer generate {Path(args.image or 'text').name}",
                               extra={"device": report.get("device"), "random_weights": report.get("random_weights")},
                               shown=out)  # fmt: skip
    finally:
        close()
    stages = report.get("stages", {})
    print(_seconds(stages, 2) + f" (after model load {report.get('seconds_after_load', float('nan')):.2f})")
    print(f"Gaussians: {report.get('num_gaussians')}, mesh: {report.get('mesh_vertices')} vertices, "
          f"{report.get('mesh_faces')} faces")  # fmt: skip
    files = (["input_rgba.png"] if args.image else []) + [
        "splat.ply",
        *extra,
        "mesh.glb",
        "views.png",
        "timings.json",
    ]
    if args.profile:
        files += list(PROFILE_FILES)
    print("wrote " + ", ".join(str(out / f) for f in files))


def cmd_render(args: argparse.Namespace) -> None:
    from microdreamer.io_utils import check_input, check_not_input, check_output_path

    cfg = job_config(args)
    check_input(args.source, "file", "mesh or splat")
    check_not_input(Path(args.output), [args.source])
    from microdreamer.formats import SplatArrays, is_splat

    source, bad_input = args.source, None
    if is_splat(args.source):  # a splat is read before torch is imported (a mesh: by trimesh, after)
        source, bad_input, _, _ = _read_splat_before_torch(args.source)
    from microdreamer.jobs import resolve_device
    from microdreamer.jobs.turntable import FORMATS, render_turntable

    device = resolve_device(args.device)
    if bad_input is not None:
        check_output_path(args.output, FORMATS, "turntable")  # as render_turntable does, before its input
        raise bad_input
    if isinstance(source, SplatArrays):
        from microdreamer.splat import Splat

        source = Splat.from_arrays(source)
    t = time.perf_counter()
    if cfg.up == "auto":
        from microdreamer.jobs.turntable import load_renderable
        from microdreamer.orient import describe_up, resolve_up

        source = load_renderable(source) if isinstance(source, str | Path) else source
        up, how = resolve_up(source, "auto")
        print(describe_up(up, how))
        cfg = dataclasses.replace(cfg, up=up)
    out = render_turntable(source, args.output, cfg, device=device, say=print)
    print(f"rendered {args.source} -> {out} in {time.perf_counter() - t:.2f} s")


def texture_parts(seconds: dict, texture_stats: dict) -> dict:
    """``seconds`` with its ``texture`` stage split into the texture stage's own parts (decimation,
    unwrap, texels, bake, fill, ...: ``texture_stats["seconds"]``), each ``texture: PART``, and
    ``texture: other`` for the rest; unchanged when the texture stage reported no parts."""
    parts = {
        k: float(v) for k, v in (texture_stats.get("seconds") or {}).items() if isinstance(v, (int, float))
    }
    if "texture" not in seconds or not parts:
        return dict(seconds)
    out: dict = {}
    for key, value in seconds.items():
        if key != "texture":
            out[key] = value
            continue
        out.update({f"texture: {k}": v for k, v in parts.items()})
        out["texture: other"] = max(0.0, float(value) - sum(parts.values()))
    return out


def _write_profile(
    seconds: dict,
    folder: Path,
    title: str,
    extra: dict | None = None,
    name: str = "profile",
    shown: Path | None = None,
) -> None:
    """profile.json and profile.png into ``folder`` (a run's stage: ``shown`` is where they will be)."""
    from microdreamer.profiling import write_profile

    seconds = {k: float(v) for k, v in seconds.items() if v > 0}
    json_path, png_path = write_profile(seconds, folder, title, extra, name=name)
    if shown is not None:
        png_path = Path(shown) / Path(png_path).name
    total = sum(seconds.values())
    top = max(seconds, key=seconds.get)
    print(f"profile: {total:.2f} s in {len(seconds)} stages, the largest {top} ({100 * seconds[top] / total:.0f}%) "
          f"-> {png_path}")  # fmt: skip


def cmd_view(args: argparse.Namespace) -> None:
    from microdreamer.viewer import build_viewer, serve
    from microdreamer.viewer.server import bind

    first = Path(args.paths[0])
    out = Path(args.output) if args.output else first.parent / f"{first.stem or first.name}_viewer"
    server = bind(out, port=args.port) if args.serve else None  # the port first: nothing built if it is taken
    try:
        if args.crop:
            from microdreamer.crop import parse_crop

            parse_crop(args.crop)
        index = build_viewer([Path(p) for p in args.paths], out, crop=args.crop, say=print)
    except BaseException:
        if server is not None:
            server.server_close()
        raise
    print(f"viewer: {index}")
    if not args.serve:
        print(f"open it in a browser, or serve it: microdreamer view {' '.join(args.paths)} -o {out} --serve")
        return
    url, server = serve(out, server=server)
    print(f"serving {out} at {url} (Ctrl-C stops)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        print("stopped")
    finally:
        server.shutdown()
        server.server_close()


def cmd_profile(args: argparse.Namespace) -> None:
    import dataclasses as dc
    import json
    import tempfile

    if args.what != "scaling":
        raise InputError(f"profile {args.what}: unknown; use scaling")
    try:
        resolutions = sorted({int(r) for r in args.resolutions.split(",") if r.strip()})
    except ValueError:
        raise InputError(f"--resolutions {args.resolutions}: give grid sizes like 128,256,512") from None
    if not resolutions or resolutions[0] < 2:
        raise InputError(f"--resolutions {args.resolutions}: give grid sizes of at least 2")
    cfg = job_config(args)
    import torch

    from microdreamer.io_utils import atomic_path
    from microdreamer.jobs import resolve_device
    from microdreamer.jobs.export import export_mesh
    from microdreamer.profiling import StageTimer, plot_scaling
    from microdreamer.splat import read_splat

    device = resolve_device(args.device)
    out = Path(args.output)
    staged = _job_folder(args, ("scaling.json", "scaling.png"), [args.splat])
    splat = read_splat(args.splat).to(device)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in resolutions:
            try:
                run = dc.replace(cfg, field=dc.replace(cfg.field, resolution=r))
            except InputError as e:
                print(f"{r}^3: skipped ({e})")
                continue
            timer = StageTimer()
            try:
                export_mesh(
                    splat, Path(tmp) / f"mesh_{r}.glb", run, device, timer=timer, name=str(args.splat)
                )
            except (torch.OutOfMemoryError, MemoryError):
                print(f"{r}^3: out of memory on {device}; larger grids skipped")
                break
            rows.append({"resolution": r, "seconds": dict(timer.seconds)})
            print(f"{r}^3: " + _seconds(timer.seconds))
    if not rows:
        raise InputError(f"{args.splat}: no grid resolution could be run; give smaller --resolutions")
    with staged as stage:  # written, then moved in: a refusal above leaves no folder
        stage.mkdir()
        plot_scaling(rows, stage / "scaling.png", title=f"{Path(args.splat).name}: seconds against grid size")
        with atomic_path(stage / "scaling.json") as tmp:
            tmp.write_text(
                json.dumps({"splat": str(args.splat), "device": str(device), "rows": rows}, indent=2)
            )
    print(f"wrote {out / 'scaling.json'}, {out / 'scaling.png'}")


def cmd_convert(args: argparse.Namespace) -> None:
    from microdreamer.formats import NAMES, detect_format, output_format, read_splat_arrays, write_splat
    from microdreamer.io_utils import check_not_input

    if (args.target is None) == (args.output is None):
        raise InputError("convert: give the output once, as OUT or as -o OUT")
    args.output = args.target or args.output
    fmt = output_format(args.output)
    if fmt is None:
        raise InputError(f"{args.output}: name a splat format by the ending: .ply, .compressed.ply, .spz, "
                         ".sog, .splat, .ksplat, .glb, .gltf, .spz.glb or DIR/meta.json")  # fmt: skip
    check_not_input(Path(args.output), [args.source])
    t = time.perf_counter()
    arrays = read_splat_arrays(args.source)
    source_fmt = detect_format(args.source)
    read_s = time.perf_counter() - t
    t = time.perf_counter()
    out = write_splat(arrays, args.output, fmt)
    print(f"{args.source} ({NAMES.get(source_fmt, source_fmt)}, {len(arrays)} Gaussians, SH degree "
          f"{arrays.sh_degree}) -> {out} ({NAMES[fmt]}) in {read_s:.2f} + {time.perf_counter() - t:.2f} s")  # fmt: skip


def _write_splat_formats(args: argparse.Namespace, folder: Path) -> list[str]:
    """``--splat-formats``: the run's ``splat.ply`` also written as ``splat.<ext>`` for each format named;
    the names of the files written."""
    spec = getattr(args, "splat_formats", None)
    if not spec or not (folder / "splat.ply").is_file():
        return []
    from microdreamer.formats import output_format, read_splat_arrays, write_splat

    arrays = read_splat_arrays(folder / "splat.ply")
    written = []
    for ext in (e.strip().lstrip(".").lower() for e in spec.split(",") if e.strip()):
        target = folder / f"splat.{ext}"
        if output_format(target) is None:
            raise InputError(f"--splat-formats {spec}: {ext!r} is no splat format; use spz, sog, "
                             "compressed.ply, splat, ksplat, glb")  # fmt: skip
        write_splat(arrays, target)
        written.append(target.name)
    return written


def _check_splat_formats(args: argparse.Namespace) -> None:
    """``--splat-formats`` checked before any work."""
    spec = getattr(args, "splat_formats", None)
    if not spec:
        return
    from microdreamer.formats import output_format

    for ext in (e.strip().lstrip(".").lower() for e in spec.split(",") if e.strip()):
        if ext == "ply" or output_format(f"splat.{ext}") is None:
            raise InputError(f"--splat-formats {spec}: {ext!r} is no extra splat format; use spz, sog, "
                             "compressed.ply, splat, ksplat, glb")  # fmt: skip


def cmd_evaluate(args: argparse.Namespace) -> None:
    cfg = job_config(args)
    from microdreamer.io_utils import check_output_folder

    check_output_folder(args.output, (), [*args.assets, *args.image])  # before any model is loaded
    from microdreamer.jobs.evaluate import evaluate

    summary = evaluate(args.assets, args.image, args.output, cfg, device=args.device)
    width = max(len(a["name"]) for a in summary["assets"])
    for a in summary["assets"]:
        print(
            f"{a['name']:<{width}}  CLIP similarity {a['clip_similarity']:.4f}  ({a['mesh']} vs {a['image']})"
        )
    print(f"mean of {summary['count']}: {summary['mean']:.4f} ({summary['model']}); wrote {summary['path']}")


def cmd_serve(args: argparse.Namespace) -> None:
    cfg = job_config(args)
    from microdreamer.serve import serve

    if not cfg.loopback:
        print(f"WARNING: --host {cfg.host}: the service is reachable from other machines"
              + ("" if cfg.token else "; anyone who reaches it can run jobs (set --token)"), file=sys.stderr)  # fmt: skip
    if cfg.generate_config is not None:  # a bad preset: one line, before the start
        config.load_preset(config.GenerateConfig, cfg.generate_config)
    if cfg.random_weights:
        print(f"WARNING: --random-weights {cfg.random_weights}: the diffusion model has RANDOM weights; generate "
              "jobs make noise, useful only for timing and plumbing", file=sys.stderr)  # fmt: skip
    try:
        serve(cfg, announce=lambda line: print(line, flush=True))
    except KeyboardInterrupt:
        print("stopped")


RUNNERS = {
    "convert": cmd_convert,
    "demo": cmd_demo,
    "mesh": cmd_mesh,
    "render-views": cmd_render_views,
    "reconstruct": cmd_reconstruct,
    "generate": cmd_generate,
    "render": cmd_render,
    "view": cmd_view,
    "profile": cmd_profile,
    "evaluate": cmd_evaluate,
    "serve": cmd_serve,
}


def _join_up_values(argv: list[str]) -> list[str]:
    """``--up -y`` -> ``--up=-y``: argparse reads a value starting with ``-`` as an option."""
    out: list[str] = []
    for i, arg in enumerate(argv):
        if i and argv[i - 1] == "--up" and arg in config.UP_CHOICES:
            out[-1] = f"--up={arg}"
        else:
            out.append(arg)
    return out


def _write_error(e: OSError, args) -> str | None:
    """The one line for an OSError of a write that no stage turned into an InputError (a full disk names
    no file), or None when it is not one."""
    import errno

    from microdreamer.io_utils import DISK_ERRNOS

    if e.errno == errno.ENAMETOOLONG:  # Path.exists() and is_dir() raise it for any path given
        name = os.fsdecode(e.filename) if e.filename else getattr(args, "output", None) or "a path"
        return f"{name}: a name in it is longer than the system allows (255 bytes); choose a shorter name"
    if e.errno not in DISK_ERRNOS:
        return None
    where = getattr(args, "output", None) or (e.filename and os.fsdecode(e.filename)) or "the output"
    return f"{where}: cannot be written ({e.strerror or type(e).__name__}); free space or choose another path"


def main(argv: list[str] | None = None) -> int:
    import signal
    import threading

    from microdreamer import progress
    from microdreamer.io_utils import remove_in_flight

    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(_join_up_values(argv))
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s")
    progress.configure("auto")
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for name in ("SIGTERM", "SIGHUP", "SIGQUIT"):  # a closed terminal, Ctrl-\\: clean up as for SIGTERM
            if hasattr(signal, name):
                previous[getattr(signal, name)] = signal.signal(getattr(signal, name), _on_sigterm)
    message, code = None, 0
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()
    except InputError as e:
        message, code = str(e), 2
    except KeyboardInterrupt:
        message, code = "interrupted", 130
    except Terminated as e:
        message, code = "terminated", 128 + e.signum
    except BrokenPipeError:  # the reader of stdout went away (| head): stop quietly
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        message, code = "standard output was closed (a broken pipe); the run stopped", 1
    except OSError as e:
        if (message := _write_error(e, args)) is None:
            raise
        code = 2
    finally:
        remove_in_flight()  # what a second signal during a clean-up left, with signals held off
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        progress.reset()
    if message is not None:
        print(f"error: {' '.join(message.split())}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
