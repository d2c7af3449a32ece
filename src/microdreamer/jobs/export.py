"""Splat -> density field -> mesh -> texture -> file: the one export every job runs.

:func:`export_mesh` is what ``microdreamer mesh`` does, and what ``reconstruct``, ``generate`` and
``demo`` do after making their splat. :func:`splat_to_mesh` is its first half (field, marching cubes,
cleanup, decimation), for callers that want the mesh in memory.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from microdreamer.config import ExportConfig, FieldConfig, MeshConfig
from microdreamer.errors import InputError
from microdreamer.field import (
    DensityField,
    GridSpec,
    PreparedGaussians,
    compute_field,
    prepare_gaussians,
    resolve_resolution,
)
from microdreamer.field.carve import carve_field
from microdreamer.field.iso import IsoLevel, resolve_iso_level
from microdreamer.mesh import Mesh, extract_mesh, save_mesh
from microdreamer.profiling import StageTimer
from microdreamer.progress import stage as progress_stage
from microdreamer.splat import LOG_SCALE_MIN, Splat

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
    iso_level: float | None = None
    iso_method: str = "fixed"
    iso_iou: float | None = None
    carve: dict | None = None


@dataclass
class ExportResult:
    """What :func:`export_mesh` wrote.

    Attributes:
        path: the mesh file.
        mesh: the mesh as written (textured when the texture stage ran).
        convert: the field and mesh stages' result (counts, backend, the untextured mesh's stats).
        texture_stats: the texture stage's stats (empty for ``texture.mode = "none"``).
        up: the splat's up axis the mesh was turned by (``config.up``, or what ``"auto"`` found).
    """

    path: Path
    mesh: Mesh
    convert: ConvertResult
    texture_stats: dict = field(default_factory=dict)
    up: str = "+y"

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
            "iso_level": self.convert.iso_level,
            "iso_method": self.convert.iso_method,
            "carve": self.convert.carve,
        }


def upright(splat: Splat, up: str) -> Splat:
    """``splat`` turned so that its up axis ``up`` (``+y``, ``-y``, ``+z``, ``-z``) points up (+y);
    the splat itself for ``+y``."""
    if up == "+y":
        return splat
    from microdreamer.orient import up_rotation

    return splat.transformed(up_rotation(up))


#: how the ``mesh`` command's user sets what the messages mention; jobs pass their own
SETTINGS = {"threshold": "--threshold", "resolution": "--resolution"}
#: what a job without those flags says instead (``reconstruct``, ``generate``)
PRESET_SETTINGS = {
    "threshold": "export.mesh.threshold (in a --config preset)",
    "resolution": "export.field.resolution (in a --config preset)",
}

# ------------------------------------------------------------------------------------ input checks
#: memory of the grid stages per voxel and per R^2 (the surface), measured on the CPU with
#: benchmarks/bench_large.py and the ghost sample at 128^3-384^3: the float32 field (4 B), scikit-image's
#: marching cubes and the cleanup's masks (~4-8 B), the mesh (~2 KB per R^2 of surface), plus the
#: field's bounded work buffers; the CUDA field needs its grid and about as much again on the device.
HOST_BYTES_PER_VOXEL = 12
HOST_BYTES_PER_SURFACE = 2000
HOST_FIXED_BYTES = 512 << 20
DEVICE_BYTES_PER_VOXEL = 8
DEVICE_FIXED_BYTES = 1 << 30
#: share of the free memory a grid may plan to use
MEMORY_SHARE = 0.9


def grid_memory(resolution: int, device: torch.device) -> dict[str, int]:
    """Bytes the field and mesh stages of an R^3 grid need: ``{"host": ..., "device": ...}`` (the
    device entry only on CUDA; the mesh stage always runs on the host)."""
    r = int(resolution)
    need = {"host": HOST_BYTES_PER_VOXEL * r**3 + HOST_BYTES_PER_SURFACE * r**2 + HOST_FIXED_BYTES}
    if torch.device(device).type == "cuda":
        need["device"] = DEVICE_BYTES_PER_VOXEL * r**3 + DEVICE_FIXED_BYTES
    return need


def free_memory(device: torch.device) -> dict[str, int]:
    """Free bytes: ``{"host": ...}`` (:func:`~microdreamer.io_utils.free_host_memory`) and, on CUDA,
    ``"device"``."""
    from microdreamer.io_utils import free_host_memory

    free = {"host": free_host_memory()}
    device = torch.device(device)
    if device.type == "cuda":
        free["device"] = int(torch.cuda.mem_get_info(device)[0])
    return free


def check_grid_memory(resolution: int | str, device: torch.device, setting: str = "--resolution") -> None:
    """InputError, before any work, when an R^3 grid would not fit the free memory of ``device`` (and
    of the host, where the mesh stage runs), with the largest resolution that would. ``"auto"`` is
    weighed as the largest grid it can choose (:data:`~microdreamer.config.AUTO_RESOLUTIONS`)."""
    if resolution == "auto":
        from microdreamer.config import AUTO_RESOLUTIONS

        resolution = AUTO_RESOLUTIONS[-1]
    need, free = grid_memory(resolution, device), free_memory(device)
    short = [k for k in need if need[k] > MEMORY_SHARE * free[k]]
    if not short:
        return
    fit = resolution
    while fit > 2 and any(grid_memory(fit, device)[k] > MEMORY_SHARE * free[k] for k in need):
        fit = int(fit * 0.97) if fit > 64 else fit - 1
    where = "host memory" if short == ["host"] else f"memory on {device}"
    k = short[0]
    advice = f"use {setting} {fit} or less" if fit > 2 else "free some memory"
    raise InputError(
        f"{setting} {resolution}: the {resolution}^3 grid needs about {need[k] / 2**30:.1f} GB of {where} "
        f"but {free[k] / 2**30:.1f} GB are free; {advice}"
    )


#: normalised scales (grid cube = [-1, 1]) are clamped to this range: a Gaussian thinner than 1e-18 of
#: the grid adds nothing at any grid point farther than 1e-17 from its centre either way, one wider than
#: 1e18 adds its opacity everywhere either way (to float32 precision), and inside the range every
#: backend's float32 arithmetic stays finite (squares below 1e36)
FIELD_SCALE_RANGE = (1e-18, 1e18)


def _rows(mask: torch.Tensor, k: int = 5) -> str:
    idx = torch.nonzero(mask.reshape(mask.shape[0], -1).any(-1)).flatten()[: k + 1].tolist()
    return ", ".join(f"#{i}" for i in idx[:k]) + (", ..." if len(idx) > k else "")


def prepare_field(
    splat: Splat, config: FieldConfig, name: str = "splat"
) -> tuple[PreparedGaussians, GridSpec]:
    """:func:`~microdreamer.field.prepare_gaussians`, after checking that the field can be computed:
    InputError naming the Gaussians with non-finite parameters; scales outside
    :data:`FIELD_SCALE_RANGE` of the grid clamped into it, with a warning naming them."""
    finite = torch.ones(len(splat), dtype=torch.bool, device=splat.device)
    for t in (splat.means, splat.opacity_logits, splat.log_scales, splat.quats):
        finite &= torch.isfinite(t.reshape(len(splat), -1)).all(-1)
    if not bool(finite.all()):
        raise InputError(
            f"{name}: {int((~finite).sum())} Gaussians have non-finite parameters (NaN or inf: "
            f"{_rows(~finite)}); fix or drop them"
        )
    for _ in range(3):
        prepared, grid = prepare_gaussians(splat, config)
        if len(prepared) == 0:
            return prepared, grid
        lo = max(math.log(FIELD_SCALE_RANGE[0] / grid.scale), LOG_SCALE_MIN)
        hi = math.log(FIELD_SCALE_RANGE[1] / grid.scale)
        kept = splat.opacities() > config.min_opacity
        outside = ((splat.log_scales < lo) | (splat.log_scales > hi)) & kept[:, None]
        if not bool(outside.any()):
            break
        logger.warning(
            "%s: %d Gaussians (%s) are thinner or wider than float32 can evaluate on this grid (scales "
            "outside %.0e..%.0e of the grid's size); clamped into that range, which leaves the field unchanged",
            name, int(outside.any(-1).sum()), _rows(outside), *FIELD_SCALE_RANGE,
        )  # fmt: skip
        splat = Splat(**{**splat.tensors(), "log_scales": splat.log_scales.clamp(lo, hi)})
    bad = ~torch.isfinite(prepared.transforms.reshape(len(prepared), -1)).all(-1)
    bad |= ~torch.isfinite(prepared.radii).all(-1) | ~torch.isfinite(prepared.means).all(-1)
    if bool(bad.any()):
        raise InputError(
            f"{name}: {int(bad.sum())} Gaussians cannot be evaluated on the grid (their shapes overflow "
            f"float32 after normalisation; kept Gaussians {_rows(bad)}); fix or drop them"
        )
    return prepared, grid


def check_precision(grid: GridSpec, name: str = "splat") -> None:
    """InputError when the grid lies so far from the origin that float32 positions (the mesh's) cannot
    resolve an eighth of its voxel: such a mesh would collapse onto a few representable points."""
    import numpy as np

    reach = max(abs(c) for c in grid.center) + 1.0 / grid.scale
    ulp = float(np.spacing(np.float32(min(reach, 3.4e38))))
    if not ulp <= grid.spacing / 8:
        raise InputError(
            f"{name}: the Gaussians lie {reach:.3g} from the origin, where float32 positions cannot resolve the "
            f"grid's {grid.spacing:.3g}-wide voxels; translate the splat towards the origin"
        )


def _far_gaussians(means: torch.Tensor) -> tuple[torch.Tensor, float, float] | None:
    """Centres far from the bulk: (mask [N], full extent, extent of the central 98 % (at least all but
    2 at each end)), or None when the
    bounding box is not dominated by a few far Gaussians (full extent < 100x the bulk's)."""
    import numpy as np

    m = means.detach().double().cpu().numpy()
    if m.shape[0] < 2:
        return None
    q = max(0.01, min(0.1, 2.0 / m.shape[0]))  # the central 98 %, leaving out at least 2 at each end
    lo, hi = np.quantile(m, q, axis=0, method="higher"), np.quantile(m, 1.0 - q, axis=0, method="lower")
    bulk = float((hi - lo).max())
    full = float((m.max(0) - m.min(0)).max())
    if not full > 100.0 * bulk:
        return None
    margin = 10.0 * max(bulk, 1e-30)
    far = ((m < lo - margin) | (m > hi + margin)).any(-1)
    return torch.from_numpy(far), full, bulk


def no_surface_error(
    splat: Splat,
    fld: DensityField,
    vmin: float,
    vmax: float,
    field_config: FieldConfig,
    mesh_config: MeshConfig,
    name: str,
    settings: dict[str, str] | None = None,
) -> InputError:
    """The message when the field has no crossing of the iso-level, saying what would help: removing
    far Gaussians that squeeze the rest into a few voxels, Gaussians wider than the grid, a higher
    resolution when the density is zero at every grid point, or another threshold."""
    settings = {**SETTINGS, **(settings or {})}
    threshold_setting = settings["threshold"]
    t = mesh_config.threshold
    kept = splat.opacities().cpu() > field_config.min_opacity
    means = splat.means.detach().cpu()[kept]
    index = torch.nonzero(kept).flatten()
    far = _far_gaussians(means) if vmax <= t else None
    if far is not None:
        mask, full, bulk = far
        rows = index[mask][:3].tolist()
        where = ", ".join(f"#{i} at ({', '.join(f'{float(c):.3g}' for c in splat.means[i])})" for i in rows)
        voxels = bulk / full * (field_config.resolution - 1)
        return InputError(
            f"{name}: {int(mask.sum())} Gaussians lie far from the others ({where}{', ...' if mask.sum() > 3 else ''}): "
            f"the grid spans {full:.3g} and the other Gaussians fit in {voxels:.2g} voxels of it, so the "
            f"density never reaches the iso-level {t:g}; remove the far Gaussians (crop the splat)"
        )
    if vmax <= t:
        if vmax == 0.0:
            widest = float((splat.scales().detach().cpu().amax(-1)[kept]).max()) * fld.grid.scale
            voxels = widest * (field_config.resolution - 1) / 2.0  # the largest scale in grid spacings
            if voxels < 1e-2:
                return InputError(
                    f"{name}: the density is 0 at every grid point: the widest Gaussian spans {voxels:.2g} of "
                    "a voxel, so no grid can sample them; check the splat's scale_* values"
                )
            return InputError(
                f"{name}: the density is 0 at every grid point (the Gaussians are smaller than the grid's "
                f"spacing); use a higher {settings['resolution']}"
            )
        return InputError(
            f"{name}: the density never reaches the iso-level {t:g} (its maximum is {vmax:.3g}); use a lower "
            f"{threshold_setting} (below {vmax:.3g})"
        )
    wide = (splat.scales().detach().cpu().amax(-1) * fld.grid.scale > 1.0) & kept
    because = ""
    if bool(wide.any()):
        because = (
            f"; {int(wide.sum())} Gaussians are wider than the whole grid ({_rows(wide)}): drop them, or"
        )
    else:
        because = ";"
    return InputError(
        f"{name}: the density is above the iso-level {t:g} everywhere on the grid (its minimum is {vmin:.3g}), "
        f"so there is no surface{because} use a higher {threshold_setting} (above {vmin:.3g})"
    )


def splat_to_mesh(
    splat: Splat,
    field_config: FieldConfig,
    mesh_config: MeshConfig,
    device: torch.device,
    timer: StageTimer | None = None,
    progress: Callable[[float], None] | None = None,
    name: str = "splat",
    settings: dict[str, str] | None = None,
    box=None,
) -> ConvertResult:
    """Density field on ``device`` (the fast CUDA kernel there, the tiled PyTorch path on the CPU) at
    the configured resolution (``"auto"``: from the splat, :func:`~microdreamer.field.auto_resolution`),
    the iso-level (``"auto"``: from the splat's alpha, stage ``iso``), silhouette carving in exact mode
    (``mesh_config.carve`` directions, :mod:`microdreamer.field.carve`, stage ``carve``; with an auto
    level the density is meshed at ``carve_level`` times it), then marching cubes and cleanup on the
    field where it is (``mesh_config.backend``: on a GPU the PyTorch path, on the CPU scikit-image's),
    and optional decimation (stages ``field`` and ``mesh``).

    Before any work the grid is weighed against the memory of ``device`` (:func:`check_grid_memory`);
    Gaussians too thin or too wide for float32 on this grid are clamped (:func:`prepare_field`).
    Raises InputError when no Gaussian survives the opacity filter, the field never crosses the
    threshold (with what would help: :func:`no_surface_error`) or no surface survives cleanup.
    ``settings`` says how the user sets ``"threshold"`` and ``"resolution"`` (default: the ``mesh``
    command's flags), for the messages. ``box`` (a :class:`~microdreamer.crop.CropBox`, the splat already
    cropped to it): the density outside it is zeroed and the mesh's vertices clamped into it.
    """
    timer = timer or StageTimer()
    hints = {**SETTINGS, **(settings or {})}
    field_config = resolve_resolution(splat, field_config)
    check_grid_memory(field_config.resolution, device, hints["resolution"])
    with timer.stage("field"):
        prepared, grid = prepare_field(splat.to(device), field_config, name)
        check_precision(grid, name)
        values, backend = compute_field(prepared, grid, field_config, backend="auto", progress=progress)
        if box is not None:
            from microdreamer.crop import mask_outside

            values = mask_outside(values, grid.origin, grid.spacing, box)
        fld = DensityField(values, grid, len(prepared), field_config.mode, backend)
        values = fld.values  # stays on the device for marching cubes there
    if fld.num_gaussians == 0:
        raise InputError(f"{name}: no Gaussian has opacity above {field_config.min_opacity}; nothing to mesh")
    iso = IsoLevel(float(mesh_config.threshold)) if mesh_config.threshold != "auto" else None
    if iso is None:
        with timer.stage("iso"), progress_stage("iso-level from the splat's alpha"):
            iso = resolve_iso_level("auto", splat.to(device), values, grid, field_config)
    carved = None
    if mesh_config.carve and field_config.mode == "exact":
        level = iso.level * (mesh_config.carve_level if iso.method == "auto" else 1.0)
        with (
            timer.stage("carve"),
            progress_stage(f"carving to the splat's silhouettes from {mesh_config.carve} directions"),
        ):
            raw, _ = prepare_gaussians(splat.to(device), replace(field_config, voxel_filter=0.0))
            result = carve_field(
                values, raw, fld.grid, level, mesh_config.carve, axis_images=iso.column_alphas
            )
        if result.skipped is not None:
            logger.warning("%s: silhouette carving skipped: %s", name, result.skipped)
        else:
            values = result.values
            iso = replace(iso, level=level)
        carved = {"directions": result.directions, "level": level, "inside_before": result.inside_before,
                  "inside_after": result.inside_after, "skipped": result.skipped}  # fmt: skip
    mesh_config = replace(mesh_config, threshold=iso.level)
    if field_config.mode != "exact":  # upstream: DreamGaussian's mesh, its enclosed voids' walls included
        mesh_config = replace(mesh_config, remove_cavities=False)
    vmin, vmax = (float(v) for v in torch.aminmax(values))
    if not vmin <= mesh_config.threshold < vmax:
        raise no_surface_error(splat, fld, vmin, vmax, field_config, mesh_config, name, hints)
    r = field_config.resolution
    with timer.stage("mesh"), progress_stage(f"marching cubes and cleanup of the {r}^3 grid"):
        mesh, stats = extract_mesh(values if values.is_cuda else values.numpy(), fld.grid.origin,
                                   fld.grid.spacing, mesh_config)  # fmt: skip
    if box is not None and not mesh.is_empty:
        from microdreamer.crop import clamp_into

        mesh = replace(mesh, vertices=clamp_into(mesh.vertices, box))
    if mesh.is_empty:
        raise InputError(
            f"{name}: no surface is left after marching cubes and cleanup at the iso-level "
            f"{mesh_config.threshold:g} (the density spans {vmin:.3g} to {vmax:.3g}); try another {hints['threshold']}"
        )
    return ConvertResult(mesh, len(splat), fld.num_gaussians, field_config.resolution, fld.backend, vmax, stats,
                         iso.level, iso.method, iso.iou, carved)  # fmt: skip


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
    settings: dict[str, str] | None = None,
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
        settings: how the user sets ``"threshold"`` and ``"resolution"``, for messages
            (:data:`SETTINGS` by default, :data:`PRESET_SETTINGS` for jobs without those flags).

    An explicit ``mesh.decimate_target`` is honoured when texturing: the texture stage's own face cap
    (``texture.max_faces``, there to bound xatlas's time) is raised to it, and ``stage`` says so.
    """
    from microdreamer.texture import texture_mesh

    say = stage or (lambda message: None)
    timer = timer or StageTimer()
    if config.with_splat and Path(path).suffix.lower() != ".glb":
        raise InputError(f"{path}: --with-splat writes the splat into a .glb; name the output OUT.glb")
    up = config.up
    if up == "auto":
        from microdreamer.orient import describe_up, resolve_up

        up, how = resolve_up(splat, "auto")
        say(describe_up(up, how))
    splat = upright(splat.to(device), up)
    box = None
    if config.crop:
        from microdreamer.crop import crop_splat, resolve_crop

        box = resolve_crop(splat, config.crop)
        say(box.describe())
        splat = crop_splat(splat, box, name)
    elif config.scene.enabled and config.scene.background == "drop":
        from microdreamer.jobs.scene import drop_background

        splat = drop_background(splat, config.field.min_opacity, say)
    if config.scene.enabled:  # a scene in tiles: microdreamer.scene
        from microdreamer.jobs.scene import export_scene

        return export_scene(splat, path, config, device, timer=timer, name=name, stage=stage, up=up)
    from microdreamer.jobs.scene import SCENE_HINT_GAUSSIANS

    if len(splat) >= SCENE_HINT_GAUSSIANS:
        say(f"{len(splat):,} Gaussians on one dense grid: for a scene, --tiles auto meshes it in tiles, in "
            "memory that follows the tile")  # fmt: skip
    config = replace(config, field=resolve_resolution(splat, config.field))
    say(f"density field: {len(splat):,} Gaussians on a {config.field.resolution}^3 grid")
    conv = splat_to_mesh(splat, config.field, config.mesh, device, timer=timer, progress=progress, name=name,
                         settings=settings, box=box)  # fmt: skip
    mesh, texture_stats = conv.mesh, {}
    say(f"marching cubes and cleanup: {mesh.num_faces:,} faces" + (
        f" (decimated to about {config.mesh.decimate_target:,})" if config.mesh.decimate_target else ""))  # fmt: skip
    if config.texture.mode != "none":
        texture = texture_config_for(config)
        if texture.max_faces != config.texture.max_faces:
            say(f"texture: --max-faces {config.mesh.decimate_target:,} is above the texture stage's face cap "
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
        if config.with_splat:  # the mesh's file with every Gaussian added, in the mesh's frame
            from microdreamer.formats.common import FLIP_LUF, transform_arrays
            from microdreamer.formats.gltf import add_splat
            from microdreamer.io_utils import atomic_path

            say(f"adding the splat's {len(splat):,} Gaussians to {path} (KHR_gaussian_splatting)")
            glb = add_splat(written.read_bytes(), transform_arrays(splat.to_arrays(), FLIP_LUF), str(path))
            with atomic_path(written) as tmp:
                tmp.write_bytes(glb)
    return ExportResult(written, mesh, conv, texture_stats, up)


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
