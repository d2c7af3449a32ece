"""Typed configuration: each component owns a dataclass; YAML presets load into them.

A preset is a YAML mapping whose keys are the dataclass's fields (nested dataclasses are nested
mappings). Unknown keys and wrong types are reported in one line naming the file and the key.
CLI flags override fields after the preset is loaded.
"""

from __future__ import annotations

import dataclasses
import os
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

from microdreamer.errors import InputError
from microdreamer.field.common import FieldConfig

T = TypeVar("T")


@dataclasses.dataclass
class MeshJobConfig:
    """``microdreamer mesh``: the density field, the mesh stage, then the texture stage."""

    field: FieldConfig = dataclasses.field(default_factory=FieldConfig)
    mesh: Any = None  # microdreamer.mesh.MeshConfig (imported lazily: scikit-image, trimesh)
    texture: Any = None  # microdreamer.texture.TextureConfig (imported lazily: xatlas)

    def __post_init__(self) -> None:
        if self.mesh is None:
            from microdreamer.mesh import MeshConfig

            self.mesh = MeshConfig()
        if self.texture is None:
            from microdreamer.texture import TextureConfig

            self.texture = TextureConfig()


def _coerce(value: Any, annotation: Any, where: str) -> Any:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(annotation) if a is not type(None)]
        if value is None:
            return None
        return _coerce(value, options[0], where) if len(options) == 1 else value
    if annotation is float and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if annotation in (int, str, bool) and not isinstance(value, annotation):
        raise InputError(f"{where}: expected {annotation.__name__}, got {value!r}")
    if origin in (tuple, list) and isinstance(value, list | tuple):
        return type(value)(value) if origin is list else tuple(value)
    return value


def from_dict(cls: type[T], data: dict, where: str = "config") -> T:
    """Build dataclass ``cls`` from a (nested) mapping, checking keys and simple types."""
    if not isinstance(data, dict):
        raise InputError(f"{where}: expected a mapping of {cls.__name__} fields, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise InputError(
            f"{where}: unknown {cls.__name__} field(s) {', '.join(unknown)}; valid: {', '.join(sorted(names))}"
        )
    kwargs = {}
    for key, value in data.items():
        ann = hints[key]
        default = getattr(cls(), key) if key in names else None
        if dataclasses.is_dataclass(ann) or (isinstance(value, dict) and dataclasses.is_dataclass(default)):
            sub = ann if dataclasses.is_dataclass(ann) else type(default)
            kwargs[key] = from_dict(sub, value, f"{where}.{key}")
        else:
            kwargs[key] = _coerce(value, ann, f"{where}.{key}")
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as e:
        raise InputError(f"{where}: {e}") from None


def load_preset(cls: type[T], path: str | os.PathLike) -> T:
    """Load a YAML preset into dataclass ``cls``."""
    import yaml

    path = Path(path)
    if not path.exists():
        raise InputError(f"{path}: config preset not found")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        first = str(e).splitlines()[0]
        raise InputError(f"{path}: not valid YAML ({first})") from None
    return from_dict(cls, data, str(path))


def to_dict(obj: Any) -> Any:
    """A dataclass (nested) as plain dicts, e.g. to record the settings of a run in JSON."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, list | tuple):
        return [to_dict(v) for v in obj]
    return obj
