"""Splat -> density field -> mesh: the conversion every command that exports a mesh runs."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch

from microdreamer.errors import InputError
from microdreamer.field import FieldConfig, density_field
from microdreamer.profiling import StageTimer
from microdreamer.splat import Splat

logger = logging.getLogger(__name__)


@dataclass
class ConvertResult:
    """What :func:`splat_to_mesh` made, with the numbers for its summary."""

    mesh: object  # microdreamer.mesh.Mesh
    num_gaussians_in: int
    num_gaussians_kept: int
    resolution: int
    backend: str
    field_max: float
    mesh_stats: dict = field(default_factory=dict)


def resolve_device(device: str) -> torch.device:
    """``auto|cpu|cuda`` -> a torch device; a one-line InputError when CUDA is asked for and absent."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise InputError("--device cuda: no CUDA device is available here; use --device cpu or auto")
    if device not in ("cpu", "cuda"):
        raise InputError(f"--device {device}: unknown device; use auto, cpu or cuda")
    return torch.device(device)


def splat_to_mesh(
    splat: Splat,
    field_config: FieldConfig,
    mesh_config,
    device: torch.device,
    timer: StageTimer | None = None,
    progress=None,
    name: str = "splat",
) -> ConvertResult:
    """Density field on ``device`` (the fast CUDA kernel there, the tiled PyTorch path on the CPU),
    then marching cubes, cleanup and optional decimation on the CPU.

    Raises InputError when no Gaussian survives the opacity filter or the field never crosses the
    threshold (with the field's maximum, so the user can pick a threshold).
    """
    from microdreamer.mesh import extract_mesh

    timer = timer or StageTimer()
    with timer.stage("field"):
        fld = density_field(splat, field_config, backend="auto", device=device, progress=progress)
        values = fld.values.cpu()
    if fld.num_gaussians == 0:
        raise InputError(f"{name}: no Gaussian has opacity above {field_config.min_opacity}; nothing to mesh")
    vmax = float(values.max())
    if vmax <= mesh_config.threshold:
        raise InputError(
            f"{name}: the density never reaches the threshold {mesh_config.threshold:g} (its maximum is "
            f"{vmax:.3g}); pass a lower --threshold"
        )
    with timer.stage("mesh"):
        mesh, stats = extract_mesh(values.numpy(), fld.grid.origin, fld.grid.spacing, mesh_config)
    return ConvertResult(
        mesh, len(splat), fld.num_gaussians, field_config.resolution, fld.backend, vmax, stats
    )
