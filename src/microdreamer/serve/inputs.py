"""A request's inputs, checked before its job is queued, by the command line's own readers and configs.

* :func:`job_config` — ``options`` (JSON) -> the job's config: the CLI's flag names (``resolution``,
  ``max-faces``, ``iters``...) and the config's own fields (nested, or dotted: ``{"field": {"resolution":
  128}}``, ``{"field.resolution": 128}``), each through the config classes' checks (one line per bad one).
* :func:`check_input` — the uploaded file read as the CLI reads it: a splat by ``microdreamer mesh``'s
  reader (:func:`read_splat`), an image by ``generate``'s.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from microdreamer import config
from microdreamer.errors import ConfigError, InputError

KINDS = ("mesh", "generate")
#: option keys the server decides (the model is loaded once, at start)
FIXED = ("model", "dtype")
#: settings that name the server's own files, folders or machines (a tileset folder, a cameras file, a
#: model cache, Ray workers): a client's job reads and writes its own folder only
SERVER_SIDE = ("tileset", "cameras", "hf_cache_dir", "workers", "ray_address")
#: mesh jobs: the output's format (``mesh.<format>``)
MESH_FORMATS = tuple(s.lstrip(".") for s in config.MESH_FORMATS)


def read_splat(path: str | os.PathLike):
    """Read a splat file as ``microdreamer mesh`` does (its one reader; NumPy arrays, no torch)."""
    from microdreamer.formats import read_splat_arrays

    return read_splat_arrays(path)


def _flags(kind: str) -> dict[str, str]:
    """The command's flags by name (``resolution``, ``max-faces``, and their older names) -> field path."""
    from microdreamer.cli import BY_NAME

    out = {}
    for flag in BY_NAME[kind].flags:
        for name in (flag.name, *flag.aliases):
            out[name.lstrip("-")] = flag.path
    return out


def _nest(flat: dict, where: str) -> dict:
    """``{"a.b": 1, "a": {"c": 2}}`` -> ``{"a": {"b": 1, "c": 2}}``."""
    out: dict = {}
    for key, value in flat.items():
        *heads, last = str(key).split(".")
        node = out
        for head in heads:
            node = node.setdefault(head, {})
            if not isinstance(node, dict):
                raise InputError(
                    f"{where}: {key} sets a field inside {head}, which is not a group of settings"
                )
        if isinstance(value, dict) and isinstance(node.get(last), dict):
            node[last].update(value)
        else:
            node[last] = value
    return out


def _fixed_keys(data: Any, prefix: str = "", names: tuple[str, ...] = FIXED) -> list[str]:
    if not isinstance(data, dict):
        return []
    found = []
    for k, v in data.items():
        path = f"{prefix}{k}"
        if str(k).lstrip("-").replace("-", "_") in names:
            found.append(path)
        found += _fixed_keys(v, f"{path}.", names)
    return found


def parse_options(text: str | None) -> dict:
    """``options`` as sent: a JSON object (empty when absent)."""
    if text is None or not text.strip():
        return {}
    try:
        data = json.loads(text)
    except ValueError as e:
        raise InputError(f"options: not valid JSON ({e.msg} at line {e.lineno} column {e.colno}); send an "
                         'object such as {"resolution": 128}') from None  # fmt: skip
    if not isinstance(data, dict):
        raise InputError(f"options: expected a JSON object of settings, got {type(data).__name__}")
    return data


def job_config(kind: str, options: dict, base):
    """The job's config: ``base`` (an ExportConfig for mesh, the mode's GenerateConfig for generate) with
    ``options`` applied, plus the settings that are no config field: ``format`` (mesh) and ``refine``
    (generate, false = the CLI's ``--no-refine``). Returns ``(config, extras)``.

    Raises:
        InputError: a key that is neither a flag of the command nor a field of its config, a bad value
            (the config's rule, named by the key), or a setting the server fixes (the model).
    """
    options = dict(options)
    extras: dict[str, Any] = {}
    if kind == "mesh" and "format" in options:
        fmt = options.pop("format")
        if fmt not in MESH_FORMATS:
            raise InputError(f"options: format {fmt!r}: use one of {', '.join(MESH_FORMATS)}")
        extras["format"] = fmt
    if kind == "generate":
        for key in ("no-refine", "no_refine"):
            if key in options:
                value = options.pop(key)
                if not isinstance(value, bool):
                    raise InputError(f"options: {key} {value!r}: must be true or false")
                extras["refine"] = not value
    server_side = _fixed_keys(_nest(options, "options"), names=SERVER_SIDE)
    if server_side:
        raise InputError(f"options: {', '.join(server_side)}: names the server's own files or machines; a "
                         "job writes its own folder only (leave it out)")  # fmt: skip
    fixed = _fixed_keys(_nest(options, "options"))
    if fixed:
        raise InputError(f"options: {', '.join(fixed)}: the server loads its model once, at start "
                         "(microdreamer serve --model); leave it out")  # fmt: skip
    flags = _flags(kind)
    cfg = base
    rest = {}
    for key, value in options.items():
        name = str(key).lstrip("-")
        path = flags.get(name) or flags.get(name.replace("_", "-"))
        if path is None:
            rest[key] = value
            continue
        try:
            cfg = config.replace_path(cfg, path, value)
        except ConfigError as e:
            raise InputError(f"options: {name} {value!r}: {e.rule}") from None
    if rest:
        cfg = config.from_dict(type(cfg), _nest(rest, "options"), "options", base=cfg)
    if extras.get("refine") is False:
        cfg = config.replace_path(cfg, "refine.enabled", False)
    return cfg, extras


def base_config(kind: str, mode: str | None, preset: str | None):
    """The settings a job starts from: ``mesh``'s defaults, or the generate mode's defaults with the
    server's preset (``--generate-config``) on top, as ``generate --config`` does."""
    if kind == "mesh":
        return config.ExportConfig()
    from microdreamer.jobs.generate import default_config

    base = default_config(mode)
    return config.load_preset(config.GenerateConfig, preset, base=base) if preset else base


def generation_mode(has_image: bool, prompt: str | None) -> str:
    """generate's mode from what the request holds (the job's own rule)."""
    from microdreamer.jobs.generate import generation_mode as mode_of

    return mode_of("image" if has_image else None, prompt)


def check_input(kind: str, path: Path) -> dict:
    """Read the uploaded file as the CLI would before running: a splat for ``mesh`` (its Gaussians'
    count returned), an image for ``generate`` (its size). InputError (the reader's line) if it cannot."""
    if kind == "mesh":
        arrays = read_splat(path)
        return {"gaussians": len(arrays)}
    from microdreamer.data.image import load_image

    image = load_image(path)
    return {"width": int(image.shape[1]), "height": int(image.shape[0])}


def scrub(message: str, path: Path | None, name: str | None) -> str:
    """A message about a server-side file with the file named as the client sent it (no server paths)."""
    if path is not None and name:
        message = message.replace(str(path), name)
    return message


def to_plain(cfg) -> dict:
    return config.to_dict(cfg) if dataclasses.is_dataclass(cfg) else dict(cfg)
