"""Splat -> density field -> mesh -> texture -> file: the one export every job runs.

:func:`export_mesh` is what ``microdreamer mesh`` does, and what ``reconstruct``, ``generate`` and
``demo`` do after making their splat. :func:`splat_to_mesh` is its first half (field, marching cubes,
cleanup, decimation), for callers that want the mesh in memory.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from microdreamer.config import ExportConfig, FieldConfig, MeshConfig
from microdreamer.errors import InputError
from microdreamer.field import density_field
from microdreamer.mesh import Mesh, extract_mesh, save_mesh
from microdreamer.profiling import StageTimer
from microdreamer.splat import Splat

logger = logging.getLogger(__name__)


@dataclass
class ConvertResult:
    """What :func:`splat_to_mesh` made, with the numbers for its summary."""

    mesh: Mesh
    num_gaussians_in: int
    num_gaussians_kept: int
    resolution: int
    backend: str
    field_max: float
    mesh_stats: dict = field(default_factory=dict)


@dataclass
class ExportResult:
    """What :func:`export_mesh` wrote.

    Attributes:
        path: the mesh file.
        mesh: the mesh as written (textured when the texture stage ran).
        convert: the field and mesh stages' result (counts, backend, the untextured mesh's stats).
        texture_stats: the texture stage's stats (empty for ``texture.mode = "none"``).
    """

    path: Path
    mesh: Mesh
    convert: ConvertResult
    texture_stats: dict = field(default_factory=dict)

    def summary(self) -> dict:
        """The numbers a job records about its mesh."""
        return {
            "path": self.path.name,
            "vertices": self.mesh.num_vertices,
            "faces": self.mesh.num_faces,
            "texture": {k: self.texture_stats[k] for k in ("mode", "size") if k in self.texture_stats}
            or None,
            "field_resolution": self.convert.resolution,
            "field_backend": self.convert.backend,
        }


def upright(splat: Splat, up: str) -> Splat:
    """``splat`` turned so that its up axis ``up`` (``+y``, ``-y``, ``+z``, ``-z``) points up (+y);
    the splat itself for ``+y``."""
    if up == "+y":
        return splat
    from microdreamer.orient import up_rotation

    return splat.transformed(up_rotation(up))


def splat_to_mesh(
    splat: Splat,
    field_config: FieldConfig,
    mesh_config: MeshConfig,
    device: torch.device,
    timer: StageTimer | None = None,
    progress: Callable[[float], None] | None = None,
    name: str = "splat",
) -> ConvertResult:
    """Density field on ``device`` (the fast CUDA kernel there, the tiled PyTorch path on the CPU),
    then marching cubes and cleanup on the field where it is (``mesh_config.backend``: on a GPU the
    PyTorch path, on the CPU scikit-image's), and optional decimation (stages ``field`` and ``mesh``).

    Raises InputError when no Gaussian survives the opacity filter or the field never crosses the
    threshold (with the field's maximum, so the user can pick a threshold).
    """
    timer = timer or StageTimer()
    with timer.stage("field"):
        fld = density_field(splat, field_config, backend="auto", device=device, progress=progress)
        values = fld.values  # stays on the device for marching cubes there
        vmax = float(values.max()) if values.numel() else 0.0
    if fld.num_gaussians == 0:
        raise InputError(f"{name}: no Gaussian has opacity above {field_config.min_opacity}; nothing to mesh")
    if vmax <= mesh_config.threshold:
        raise InputError(
            f"{name}: the density never reaches the iso-level {mesh_config.threshold:g} (its maximum is "
            f"{vmax:.3g}); use a lower threshold"
        )
    with timer.stage("mesh"):
        mesh, stats = extract_mesh(values if values.is_cuda else values.numpy(), fld.grid.origin,
                                   fld.grid.spacing, mesh_config)  # fmt: skip
    return ConvertResult(
        mesh, len(splat), fld.num_gaussians, field_config.resolution, fld.backend, vmax, stats
    )


def export_mesh(
    splat: Splat,
    path: str | os.PathLike,
    config: ExportConfig,
    device: torch.device,
    timer: StageTimer | None = None,
    progress: Callable[[float], None] | None = None,
    name: str = "splat",
    texture_progress: bool = False,
    post_texture: Callable[[Mesh], Mesh] | None = None,
    stage: Callable[[str], None] | None = None,
) -> ExportResult:
    """Mesh ``splat`` and write it to ``path`` (.glb, .obj or .ply, atomically), textured unless
    ``config.texture.mode == "none"``; stages ``field``, ``mesh``, ``texture`` and ``export`` on ``timer``.
    The splat is first turned so that its up axis ``config.up`` points up (+y): the mesh is written in
    the splat's units and position, in that orientation.

    Args:
        splat: N Gaussians (any device; moved to ``device``).
        path: the mesh file.
        config: field, mesh and texture settings.
        device: where the field and the texture bake run.
        timer: per-stage seconds (a new one when None).
        progress: ``progress(fraction)`` of the density field.
        name: how messages name the splat.
        texture_progress: progress bars of the texture bake.
        post_texture: applied to the textured mesh before it is written (generate's stage 2, which
            times itself); not called for an untextured export.
        stage: called with a one-line message as each stage starts (a caller shows it).

    An explicit ``mesh.decimate_target`` is honoured when texturing: the texture stage's own face cap
    (``texture.max_faces``, there to bound xatlas's time) is raised to it, and ``stage`` says so.
    """
    from microdreamer.texture import texture_mesh

    say = stage or (lambda message: None)
    timer = timer or StageTimer()
    splat = upright(splat.to(device), config.up)
    say(f"density field: {len(splat):,} Gaussians on a {config.field.resolution}^3 grid")
    conv = splat_to_mesh(splat, config.field, config.mesh, device, timer=timer, progress=progress, name=name)
    mesh, texture_stats = conv.mesh, {}
    say(f"marching cubes and cleanup: {mesh.num_faces:,} faces" + (
        f" (decimated to about {config.mesh.decimate_target:,})" if config.mesh.decimate_target else ""))  # fmt: skip
    if config.texture.mode != "none":
        texture = texture_config_for(config)
        if texture.max_faces != config.texture.max_faces:
            say(f"texture: --decimate {config.mesh.decimate_target:,} is above the texture stage's face cap "
                f"({config.texture.max_faces:,}, texture.max_faces): the mesh keeps the faces asked for "
                "(the UV unwrap takes longer)")  # fmt: skip
        with timer.stage("texture"):
            textured = texture_mesh(
                mesh, splat, texture, device=device, progress=texture_progress, stage=stage
            )
            mesh, texture_stats = textured.mesh, textured.stats
        if post_texture is not None:
            mesh = post_texture(mesh)
    what = written_as(Path(path), mesh)
    say(f"writing {path}" + (f" ({what})" if what else ""))
    with timer.stage("export"):
        written = save_mesh(mesh, path)
    return ExportResult(written, mesh, conv, texture_stats)


def texture_config_for(config: ExportConfig):
    """The texture settings an export runs with: ``config.texture``, its face cap raised to an explicit
    ``mesh.decimate_target`` above it (the user asked for that many faces)."""
    from dataclasses import replace

    tex, target = config.texture, config.mesh.decimate_target
    if target is not None and tex.max_faces is not None and target > tex.max_faces:
        return replace(tex, max_faces=target)
    return tex


def written_as(path: Path, mesh: Mesh) -> str | None:
    """How a format stores the mesh's colour when that differs from the mesh: a PLY keeps no texture,
    so a textured mesh is written with the texture sampled at its vertices. None when nothing changes."""
    if path.suffix.lower() == ".ply" and mesh.texture is not None:
        return "PLY stores no texture: the texture is sampled into vertex colours"
    return None
