"""Typed configuration of every stage and every job; YAML presets load into them.

One dataclass per component (the stage modules re-export theirs: ``microdreamer.field.FieldConfig`` is
:class:`FieldConfig`), composed into one config per job (:class:`ExportConfig` for ``mesh``,
:class:`ReconstructJobConfig`, :class:`GenerateConfig`, :class:`EvaluateConfig`, :class:`DemoConfig`,
:class:`ViewsConfig`, :class:`TurntableConfig`). Defaults are the paper's settings (MicroDreamer / DreamGaussian) unless a field
says otherwise. This module imports neither torch nor NumPy, so the command line can build, validate and
print configs before any heavy import.

Validation: every config checks its fields in ``__post_init__``, first their types (from the annotations:
``float`` takes ints, never strings or bools, and must be finite; ``int`` takes no floats; ``X | None``
takes None), then the component's own rules. Every failure is one :class:`ConfigError` naming the field,
e.g. ``MeshConfig.threshold = nan: must be a finite number``. The command line turns it into a message
about the flag the user gave; :func:`load_preset` prefixes the preset file.

A preset is a YAML mapping whose keys are the dataclass's fields (nested dataclasses are nested
mappings); :func:`from_dict` builds the config, reading numbers written as strings (PyYAML reads
``1.0e9`` as a string) and rejecting unknown keys. The command line's flags then override fields
(:func:`replace_path`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from microdreamer.errors import ConfigError, InputError

T = TypeVar("T")


def setting(default: Any = dataclasses.MISSING, help: str = "", *, factory: Any = dataclasses.MISSING,
            choices: tuple | None = None):  # fmt: skip
    """A dataclass field with the help text (and choices) the command line shows for it."""
    meta = {"help": help}
    if choices is not None:
        meta["choices"] = tuple(choices)
    if factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _type_ok(value: Any, annotation: Any) -> tuple[bool, Any]:
    """(value fits annotation, value normalised: int -> float for float fields, list -> tuple)."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        for option in typing.get_args(annotation):
            if option is type(None):
                if value is None:
                    return True, None
                continue
            ok, normalised = _type_ok(value, option)
            if ok:
                return True, normalised
        return False, value
    if annotation is Any:
        return True, value
    if annotation is bool:
        return isinstance(value, bool), value
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool), value
    if annotation is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            return False, value
        return True, float(value)
    if annotation is str:
        return isinstance(value, str), value
    if origin is tuple:
        if not isinstance(value, list | tuple):
            return False, value
        args = typing.get_args(annotation)
        items = args[:1] * len(value) if len(args) == 2 and args[1] is Ellipsis else args
        if len(items) != len(value):
            return False, value
        out = []
        for v, a in zip(value, items, strict=True):
            ok, nv = _type_ok(v, a)
            if not ok:
                return False, value
            out.append(nv)
        return True, tuple(out)
    if dataclasses.is_dataclass(annotation):
        return isinstance(value, annotation), value
    return True, value


def _type_name(annotation: Any) -> str:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(annotation))
    if annotation is type(None):
        return "none"
    if typing.get_origin(annotation) is tuple:
        args = typing.get_args(annotation)
        if len(args) == 2 and args[1] is Ellipsis:
            return f"a list of {_type_name(args[0])}"
        return f"a list of {len(args)} {_type_name(args[0])}"
    return {float: "a number", int: "an integer", bool: "true or false", str: "a string"}.get(
        annotation, getattr(annotation, "__name__", str(annotation))
    )


#: the largest float32: settings reach float32 tensors, so a larger one would turn into inf there
FLOAT32_MAX = 3.4028234663852886e38
#: any integer setting fits a C int (seeds, sizes and counts have tighter bounds: :func:`int_limit`)
INT_BOUND = 2**31 - 1
#: upper bounds of integer settings by field name, checked with the types, before anything is allocated or
#: run (the defaults are far below: a preset or flag past them is a typo, e.g. ``views_size: 50000`` would
#: ask 320 GB of renders, ``--iters 1000000000`` a run without end)
INT_LIMITS = {
    "views_size": 4096,  # the preview sheet's renders
    "iterations": 10_000,  # SIR iterations (each runs the diffusion model), texture-refine rounds
    "ssaa": 16,
    "fps": 1000,
    "num_pts": 10_000_000,
    "max_gaussians": 100_000_000,
}
_COUNTS = ("views", "held_out", "frames", "azimuths", "sheet_views", "batch", "batch_views", "view_batch")
_STEPS = ("iters", "steps", "init_steps", "recon_steps", "ddim_steps", "position_lr_max_steps", "densify_end_iter",
          "densify_start_iter", "num_train_timesteps", "num_inference_steps", "grabcut_iterations",
          "chart_iterations", "position_lr_delay_steps", "opacity_reset_interval", "densify_interval", "log_every")  # fmt: skip


def int_limit(name: str) -> tuple[int, int, str]:
    """(low, high, what) of the integer setting ``name``: a seed is an unsigned 32-bit number; image sides
    (``*size``) at most 16384 pixels; view and frame counts at most 10,000; step counts at most 1,000,000;
    :data:`INT_LIMITS` by name; any other at most :data:`INT_BOUND` in size."""
    if name == "seed":
        return 0, 2**32 - 1, "a seed is 0 to 4294967295"
    if name in INT_LIMITS:
        return -INT_BOUND, INT_LIMITS[name], f"at most {INT_LIMITS[name]:,}"
    if name.endswith("size"):
        return -INT_BOUND, 16384, "at most 16384 pixels"
    if name in _COUNTS:
        return -INT_BOUND, 10_000, "at most 10,000"
    if name in _STEPS:
        return -INT_BOUND, 1_000_000, "at most 1,000,000 steps"
    return -INT_BOUND, INT_BOUND, f"at most {INT_BOUND} in size"


def _float32_check(value: Any) -> Any:
    """``value`` with every float beyond float32's range replaced by inf (for :func:`_finite`)."""
    if isinstance(value, float):
        return value if abs(value) <= FLOAT32_MAX else math.inf
    if isinstance(value, tuple):
        return tuple(_float32_check(v) for v in value)
    return value


def _finite(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, tuple):
        return all(_finite(v) for v in value)
    return True


class Config:
    """Base of every config dataclass: type checks from the annotations, then :meth:`validate`."""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            annotation = _hints(type(self))[f.name]
            ok, normalised = _type_ok(value, annotation)
            if not ok:
                self.fail(f.name, f"must be {_type_name(annotation)}")
            if not _finite(normalised):
                self.fail(f.name, "must be a finite number")
            if not _finite(_float32_check(normalised)):
                self.fail(f.name, f"must be at most {FLOAT32_MAX:.3g} in size (it becomes a float32)")
            object.__setattr__(self, f.name, normalised)
        self.validate()  # the component's own rules first: their messages are the more precise
        for f in dataclasses.fields(self):  # then the bounds every integer setting has
            value = getattr(self, f.name)
            if isinstance(value, int) and not isinstance(value, bool):
                low, high, what = int_limit(f.name)
                if not low <= value <= high:
                    self.fail(f.name, f"must be {low} to {high}" if f.name == "seed" else f"must be {what}")

    def validate(self) -> None:
        """The component's own rules (ranges, choices); raise with :meth:`fail`."""

    def fail(self, name: str, rule: str) -> typing.NoReturn:
        raise ConfigError(type(self).__name__, name, getattr(self, name, None), rule)

    def require(self, name: str, ok: bool, rule: str) -> None:
        if not ok:
            self.fail(name, rule)

    def choose(self, name: str, choices: tuple) -> None:
        value = getattr(self, name)
        if value not in choices:
            self.fail(name, f"use one of {', '.join(map(str, choices))}")


# ============================================================================ stages

FIELD_MODES = ("exact", "upstream")


#: the grids ``FieldConfig.resolution = "auto"`` chooses from (the largest where no smaller fits)
AUTO_RESOLUTIONS = (128, 192, 256)

#: the voxel filter of each field mode when ``FieldConfig.voxel_filter`` is None (squared grid spacings)
DEFAULT_VOXEL_FILTER = {"exact": 0.25, "upstream": 0.0}


@dataclass
class FieldConfig(Config):
    """The density field (:mod:`microdreamer.field`). ``upstream`` mode's defaults are DreamGaussian's.

    Attributes:
        resolution: R, grid points per axis, or ``"auto"``: chosen from the splat before the field
            (:func:`microdreamer.field.common.auto_resolution`): the smallest of :data:`AUTO_RESOLUTIONS`
            whose voxel is no wider than the median Gaussian's largest scale (a real capture's small
            Gaussians get a finer grid than a generated object's large ones).
        mode: ``"exact"`` (every Gaussian within its cutoff, a stated error bound) or ``"upstream"``
            (DreamGaussian/MicroDreamer's ``extract_fields`` block rule).
        num_blocks: upstream: blocks per axis (block = R // num_blocks voxels).
        relax_ratio: upstream: each block's box grows by relax_ratio * (2 / num_blocks) on every side.
        min_opacity: Gaussians with opacity <= this are dropped before normalisation (both modes).
        cutoff_tol: exact: terms below cutoff_tol * opacity are dropped (bound in ``field/common.py``).
        extent_factor: the kept Gaussians' largest bounding-box extent maps to this length in [-1, 1].
        voxel_filter: v, the variance added to every Gaussian, in squared grid spacings
            (``Sigma + v h^2 I`` with its mass kept: an anti-aliasing low-pass before sampling, see
            ``field/common.py``); 0 samples points. None = the mode's default,
            :data:`DEFAULT_VOXEL_FILTER` (exact: 1/4, sigma = h / 2; upstream: 0, DreamGaussian's).
    """

    resolution: int | str = setting(128, "grid points per axis, or auto (from the splat's Gaussian sizes)")
    mode: str = setting("exact", "exact: every Gaussian within its cutoff, bounded error; upstream: "
                        "DreamGaussian/MicroDreamer's block rule", choices=FIELD_MODES)  # fmt: skip
    num_blocks: int = 16
    relax_ratio: float = 1.5
    min_opacity: float = 0.005
    cutoff_tol: float = 1e-4
    extent_factor: float = 1.8
    voxel_filter: float | None = None

    def validate(self) -> None:
        self.choose("mode", FIELD_MODES)
        self.require("voxel_filter", self.voxel_filter is None or 0.0 <= self.voxel_filter <= 100.0,
                     "must be in [0, 100] squared voxels, or none")  # fmt: skip
        if isinstance(self.resolution, str):
            self.require("resolution", self.resolution == "auto", "must be an integer or auto")
        else:
            self.require("resolution", 2 <= self.resolution <= 2048, "must be between 2 and 2048")
        self.require("cutoff_tol", 0.0 < self.cutoff_tol < 1.0, "must be in (0, 1)")
        self.require("num_blocks", self.num_blocks >= 1, "must be at least 1")
        self.require("extent_factor", self.extent_factor > 0, "must be positive")
        self.require("min_opacity", 0.0 <= self.min_opacity < 1.0, "must be in [0, 1)")

    @property
    def filter_variance(self) -> float:
        """v of the voxel filter in squared grid spacings: ``voxel_filter``, or the mode's default."""
        if self.voxel_filter is not None:
            return float(self.voxel_filter)
        return DEFAULT_VOXEL_FILTER[self.mode]

    @property
    def filter_variance_normalised(self) -> float:
        """v h^2: the variance added to every Gaussian, in normalised units (h = 2 / (R - 1))."""
        return self.filter_variance * (2.0 / (self.resolution - 1)) ** 2

    @property
    def cutoff_sq(self) -> float:
        """c^2 = 2 ln(1 / cutoff_tol): the exact mode's Mahalanobis cutoff, squared."""
        return 2.0 * math.log(1.0 / self.cutoff_tol)

    @property
    def block_voxels(self) -> int:
        """upstream: voxels per block side (R // num_blocks, at least 1)."""
        return max(1, self.resolution // self.num_blocks)

    @property
    def relax(self) -> float:
        """upstream: how far each block's box grows on every side, in normalised units."""
        return self.relax_ratio * 2.0 / self.num_blocks


MESH_BACKENDS = ("auto", "skimage", "torch")
#: the mesh files microdreamer writes (here, not in mesh/, so the command line checks -o without torch)
MESH_FORMATS = (".glb", ".obj", ".ply")


@dataclass
class MeshConfig(Config):
    """The mesh stage (:mod:`microdreamer.mesh`).

    Attributes:
        threshold: iso-level of the density field (the object is where density > threshold), or
            ``"auto"``: chosen from the splat after the field (``field.iso.resolve_iso_level``): in exact
            mode the level whose silhouettes along the grid's axes best match the splat's alpha = 0.5
            contour, in upstream mode DreamGaussian's 1.
        carve: silhouette carving (``field.carve``; exact mode): the density is cut to the splat's own
            alpha >= 0.5 silhouettes seen from this many directions before marching cubes, so that the
            mesh covers what the splat shows and nothing it does not; 0 leaves the density as it is.
        carve_level: with ``threshold = "auto"`` and carving, the density's level is this fraction of
            the chosen level: the lower density surface fills the silhouettes, which cut it back.
        close_boundary: close surfaces cut by the grid's border (see ``mesh.marching_cubes``).
        min_component_fraction: drop connected components with fewer faces than this fraction of all
            faces (the largest component is always kept); 0 keeps everything.
        remove_cavities: drop the closed components that bound an enclosed void (negative signed volume:
            their faces point into the void, away from the solid around it), e.g. the inner wall of a
            hollow splat's thick shell: no camera outside sees them, and they would take a share of the
            face budget and of the texture atlas. Only closed, consistently wound components count; the
            largest component is always kept. ``--mode upstream`` keeps them, as DreamGaussian does.
        merge_tolerance: merge vertices closer than this fraction of the bounding-box diagonal.
        decimate_target: simplify to about this many faces; None keeps the full mesh.
        backend: marching cubes and cleanup by ``"skimage"`` (scikit-image's Lewiner marching cubes and
            the NumPy/SciPy cleanup, on the CPU), ``"torch"`` (``mesh.marching_torch`` and
            ``mesh.cleanup_torch`` on the grid's device: scikit-image's Lorensen triangulation, the same
            cleanup) or ``"auto"``: torch when the grid is a CUDA tensor, else skimage. On a 2-core CPU the
            torch path measured 0.94x to 1.39x scikit-image's speed with two idle threads (128^3 to 512^3),
            0.6x to 0.8x with one (benchmarks/results/marching_cpu*.json), so the CPU keeps scikit-image.
    """

    threshold: float | str = setting(1.0, "density iso-level, or auto (from the splat's alpha)")
    carve: int = setting(0, "carve the density to the splat's silhouettes from N directions (0: off)")
    carve_level: float = 0.5
    close_boundary: bool = True
    min_component_fraction: float = 0.02
    remove_cavities: bool = True
    merge_tolerance: float = 1e-6
    decimate_target: int | None = setting(None, "simplify the mesh to about N faces")
    backend: str = "auto"

    def validate(self) -> None:
        self.choose("backend", MESH_BACKENDS)
        if isinstance(self.threshold, str):
            self.require("threshold", self.threshold == "auto", "must be a positive number or auto")
        else:
            self.require("threshold", math.isfinite(self.threshold) and self.threshold > 0.0,
                         "must be positive (the density is never negative) and finite, or auto")  # fmt: skip
        self.require("carve", self.carve == 0 or 3 <= self.carve <= 1024,
                     "must be 0 (off) or between 3 and 1024 directions")  # fmt: skip
        self.require("carve_level", 0.0 < self.carve_level <= 1.0, "must be in (0, 1]")
        self.require("min_component_fraction", 0.0 <= self.min_component_fraction <= 1.0, "must be in [0, 1]")
        self.require("merge_tolerance", self.merge_tolerance >= 0.0, "must be 0 or more")
        self.require("decimate_target", self.decimate_target is None or self.decimate_target >= 4,
                     "must be at least 4 faces, or none")  # fmt: skip


@dataclass
class BakeViewsConfig(Config):
    """The views a back-projection bake renders (:mod:`microdreamer.texture.bake`).

    Attributes:
        size: H = W of each view, pixels.
        azimuths: views per elevation ring, evenly spaced from azimuth 0.
        elevations: ring elevations in degrees (MicroDreamer's sign: negative = above).
        poles: add one view straight above and one straight below.
        fovy_deg: vertical field of view.
        margin: camera distance = margin * (bounding-sphere radius / sin(fovy / 2)); 1 = the sphere
            touches the image border.
    """

    size: int = 512
    azimuths: int = 8
    elevations: tuple[float, ...] = (0.0, 45.0, -45.0)
    poles: bool = True
    fovy_deg: float = 49.1
    margin: float = 1.05

    def validate(self) -> None:
        self.require("size", self.size >= 8, "must be at least 8 pixels")
        self.require(
            "azimuths", self.azimuths >= 1 or self.poles, "the bake needs a view: azimuths >= 1 or poles"
        )
        self.require("fovy_deg", 0.0 < self.fovy_deg < 180.0, "must be in (0, 180)")
        self.require("margin", self.margin > 0.0, "must be positive")

    @property
    def num_views(self) -> int:
        return self.azimuths * len(self.elevations) + (2 if self.poles else 0)


RENDER_BACKENDS = ("auto", "torch", "gsplat", "cpp")
PROJECT_BACKENDS = ("auto", "torch", "cpp")


@dataclass
class BakeConfig(Config):
    """The back-projection bake (:mod:`microdreamer.texture.bake`, whose docstring has the method).

    Attributes:
        views: the view set.
        cos_threshold: texels seen at a cosine at or below this are not taken from that view.
        cos_power: blending weight ``alpha * cosine ** cos_power``. 2 scored as well as or better than 4
            on every splat of ``benchmarks/bench_fidelity.py`` (held-out PSNR, ``results/fidelity_cos*_cpu.json``).
        min_alpha: the splat's looked-up alpha below which a view gives no colour.
        depth_eps: relative depth tolerance of the visibility test, added to the slope allowance.
        cull_backfaces: skip back faces when rasterising for visibility (faster; exact for closed,
            consistently wound meshes such as the mesh stage makes; set False for open meshes).
        view_batch: views rendered and rasterised at once; None = all views at once on a GPU (the
            rasteriser is bound by per-call overhead there: H200, 26 views of 512^2, 50k faces: 0.05 s
            in one batch, 0.34 s in batches of 4; peak 4.1 GB) and 4 on the CPU.
        backend: Gaussian renderer backend (``RENDER_BACKENDS``); ``"auto"``: gsplat on CUDA, the C++
            ``"cpp"`` rasteriser on the CPU (the bake needs no gradients), ``"torch"`` without a compiler.
        project_backend: the back-projection onto the texels: ``"torch"`` (the reference, any device),
            ``"cpp"`` (the C++ CPU kernel, CPU tensors only) or ``"auto"`` (the C++ kernel on the CPU when
            it builds, else PyTorch).
    """

    views: BakeViewsConfig = dataclasses.field(default_factory=BakeViewsConfig)
    cos_threshold: float = 0.1
    cos_power: float = 2.0
    min_alpha: float = 0.5
    depth_eps: float = 2e-3
    cull_backfaces: bool = True
    view_batch: int | None = None
    backend: str = "auto"
    project_backend: str = "auto"

    def validate(self) -> None:
        self.require("cos_threshold", -1.0 <= self.cos_threshold < 1.0, "must be in [-1, 1)")
        self.require("cos_power", self.cos_power >= 0, "must be 0 or more")
        self.require("min_alpha", 0.0 <= self.min_alpha <= 1.0, "must be in [0, 1]")
        self.require(
            "view_batch", self.view_batch is None or self.view_batch >= 1, "must be at least 1, or none"
        )
        self.choose("backend", RENDER_BACKENDS)
        self.choose("project_backend", PROJECT_BACKENDS)


REFINE_PARAMETRIZATIONS = ("texel", "logit")
REFINE_NORMALIZATIONS = ("covered", "image")


@dataclass
class RefineConfig(Config):
    """Stage-2 texture refinement against target images (:mod:`microdreamer.texture.refine`).

    Attributes:
        steps: optimisation steps; 0 turns refinement off.
        lr: Adam learning rate on texel values in [0, 1].
        views: size of the pool of random orbit views (rasterised once).
        batch: views per step.
        size: H = W of the views.
        elevation_range: elevations are drawn uniformly from this range (degrees, negative = above).
        fovy_deg, margin: framing, as in the bake (see :class:`BakeViewsConfig`).
        cache_targets: compute each pool view's targets once (True) or call the target function per batch.
        seed: seeds the pool's view directions and the batch order.
        parametrization: what Adam updates: ``"texel"`` the texel values (clamped to [0, 1] after each
            step) or ``"logit"`` their logits, looked up bilinearly and passed through a sigmoid
            (DreamGaussian/MicroDreamer's stage-2 ``raw_albedo``).
        normalize: the mean of the squared error: ``"covered"`` over the covered pixels (weighted), or
            ``"image"`` over every pixel of the batch's images (C H W 3: PyTorch's ``mse_loss`` of whole
            renders, MicroDreamer's stage 2; pixels outside the mesh add no gradient).
    """

    steps: int = setting(0, "stage-2 texture refinement steps against the splat's renders (0: off)")
    lr: float = 0.01
    views: int = 32
    batch: int = 4
    size: int = 512
    elevation_range: tuple[float, float] = (-60.0, 60.0)
    fovy_deg: float = 49.1
    margin: float = 1.05
    cache_targets: bool = True
    seed: int = 0
    parametrization: str = "texel"
    normalize: str = "covered"

    def validate(self) -> None:
        self.require("steps", self.steps >= 0, "must be 0 or more steps")
        self.require("lr", self.lr > 0, "must be positive")
        self.require("views", self.views >= 1, "must be at least 1")
        self.require("batch", self.batch >= 1, "must be at least 1")
        self.choose("parametrization", REFINE_PARAMETRIZATIONS)
        self.choose("normalize", REFINE_NORMALIZATIONS)


TEXTURE_UNWRAPS = ("charts", "xatlas")
TEXTURE_MODES = ("bake", "field", "none")


@dataclass
class TextureConfig(Config):
    """The texture stage (:mod:`microdreamer.texture`).

    Attributes:
        mode: ``"bake"`` (from splat renders), ``"field"`` (from the colour field) or ``"none"``.
        size: the texture is size x size texels.
        unwrap: ``"charts"`` (``texture.charts.unwrap_charts``: normal clustering and outline packing,
            vectorised in PyTorch, on the bake's device (on an H200 2.0-3.6x faster than on its host's
            CPU, benchmarks/results/unwrap_device_h200.json); 4.6x to 27x faster than xatlas at 50k faces on a
            2-core CPU at the same PSNR, benchmarks/results/unwrap_cpu_*.json) or ``"xatlas"``.
        max_faces: face cap before unwrapping (decimation); None = no cap.
        padding: texels between charts in the atlas.
        chart_iterations: (xatlas only) xatlas's chart-growing iterations (``ChartOptions.max_iterations``): 1 (its
            default) gives the fewest charts; 0 skips the refinement, ~1.4x faster on a smooth 10k-face
            mesh and ~7x on a noisy one, for ~20 % more charts (more seams) at the same atlas use.
        bake: the back-projection bake (view set, thresholds, renderer backend).
        field_cutoff_tol: the field bake's cutoff (as ``FieldConfig.cutoff_tol``); the field's other
            normalisation settings are FieldConfig's defaults.
        fill_eps: texels no view saw take the colour of a seen point at most (1 + fill_eps) times as far
            as the nearest (``texture.atlas.fill_texture``'s ``eps``; 0: the nearest, far slower when they
            lie on inner surfaces: the ``creative`` sample's fill takes 5.1 s with 0, 2.2 s with 0.5 on a 2-core CPU).
        refine: stage-2 refinement; ``refine.steps = 0`` (the default) skips it.
    """

    mode: str = setting("bake", "bake: from splat renders; field: from the splat's colour field; none",
                        choices=TEXTURE_MODES)  # fmt: skip
    size: int = setting(1024, "texture atlas side in texels")
    unwrap: str = "charts"
    max_faces: int | None = 50_000
    padding: int = 2
    chart_iterations: int = 1
    bake: BakeConfig = dataclasses.field(default_factory=BakeConfig)
    field_cutoff_tol: float = 1e-4
    fill_eps: float = 0.5
    refine: RefineConfig = dataclasses.field(default_factory=RefineConfig)

    def validate(self) -> None:
        self.choose("mode", TEXTURE_MODES)
        self.choose("unwrap", TEXTURE_UNWRAPS)
        self.require("size", 16 <= self.size <= 16384, "must be between 16 and 16384 texels")
        self.require(
            "max_faces", self.max_faces is None or self.max_faces >= 4, "must be at least 4, or none"
        )
        self.require("padding", self.padding >= 0, "must be 0 or more")
        self.require("chart_iterations", self.chart_iterations >= 0, "must be 0 or more")
        self.require("field_cutoff_tol", 0.0 < self.field_cutoff_tol < 1.0, "must be in (0, 1)")
        self.require("fill_eps", 0.0 <= self.fill_eps < math.inf, "must be a finite number >= 0")


@dataclass
class TrainConfig(Config):
    """Gaussian optimisation (:mod:`microdreamer.train`): initialisation, Adam, the position schedule,
    densification, the loss.

    The defaults are MicroDreamer's (``configs/image_sai.yaml`` and the arguments its ``main.py`` passes
    to DreamGaussian's ``GaussianModel``), including the effective values its code derives: the random
    initialisation's ``spatial_lr_scale`` of 10 multiplies the position learning rates (0.01 down to
    0.0002), and its exponential schedule is called without delay steps; densification uses ``extent =
    4`` (clone when the largest scale is <= ``percent_dense * 4`` = 0.04, split otherwise; prune opacity <
    0.005 and largest scale > ``0.1 * 4`` = 0.4); its screen-size prune is a no-op there (the 2D radii
    are zeroed by the densification that runs just before it), so ours is off; SH features of degree > 0
    learn at ``feature_lr / 20``.

    Attributes:
        num_pts: Gaussians of the random initialisation, uniform in a ball.
        init_radius: radius of that ball (world units, centred at the origin).
        sh_degree: SH degree of the optimised splat (0..3).
        init_opacity: initial opacity of every Gaussian.
        position_lr_init, position_lr_final: the position learning rate's exponential schedule, before
            multiplication by ``spatial_lr_scale``.
        position_lr_delay_steps, position_lr_delay_mult: optional warm-up (3DGS's "delay"): the rate is
            scaled by ``delay_mult`` at step 0 rising to 1 at ``delay_steps`` along a sine.
        position_lr_max_steps: the step at which the schedule reaches its final rate.
        spatial_lr_scale: multiplies both position learning rates.
        feature_lr: learning rate of the degree-0 SH (colour); higher bands use ``feature_lr *
            sh_rest_lr_factor``.
        opacity_lr, scaling_lr, rotation_lr: learning rates of the opacity logits, log-scales and
            quaternions.
        adam_eps: Adam's epsilon.
        densify_start_iter, densify_end_iter: gradients are accumulated, and densification runs, at steps
            in [start, end] (steps count from 1).
        densify_interval: densify and prune at steps that are multiples of this.
        densify_grad_threshold: a Gaussian whose mean view-space gradient norm (in NDC units: pixel
            gradient times W/2, H/2, averaged over the views that drew it) reaches this is cloned or split.
        percent_dense: clone when the largest scale <= percent_dense * scene_extent, else split.
        scene_extent: the scene size that scales the two scale thresholds.
        prune_min_opacity: prune Gaussians less opaque than this.
        prune_max_scale: prune Gaussians whose largest scale exceeds this fraction of scene_extent.
        prune_max_screen_radius: if set, also prune Gaussians whose 2D radius (pixels) exceeded this since
            the previous densification.
        opacity_reset_interval: every this many steps (while densifying) clamp opacities to
            ``opacity_reset_value``; 0 disables.
        max_gaussians: if set, densification never grows the splat beyond this (highest gradients first).
        lambda_rgb: weight of the RGB L1 term (summed over pixels and channels, divided by C).
        lambda_alpha: weight of the alpha squared-error term (summed over pixels, divided by C), used when
            targets are RGBA. MicroDreamer's novel views carry no alpha term: 0.
        background: RGB background the renders and RGBA targets are composited over.
        random_background: draw a random background colour per view and step instead (makes alpha
            observable from colour alone).
        backend: render backend: ``"auto"``, ``"torch"`` or ``"gsplat"`` (``"cpp"`` is forward only).
        seed: seeds initialisation, splitting and random backgrounds.
    """

    num_pts: int = 5000
    init_radius: float = 0.5
    sh_degree: int = 0
    init_opacity: float = 0.1
    position_lr_init: float = 0.001
    position_lr_final: float = 0.00002
    position_lr_delay_steps: int = 0
    position_lr_delay_mult: float = 0.02
    position_lr_max_steps: int = 500
    spatial_lr_scale: float = 10.0
    feature_lr: float = 0.01
    sh_rest_lr_factor: float = 1.0 / 20.0
    opacity_lr: float = 0.05
    scaling_lr: float = 0.005
    rotation_lr: float = 0.0005
    adam_eps: float = 1e-15
    densify_start_iter: int = 0
    densify_end_iter: int = 300
    densify_interval: int = 100
    densify_grad_threshold: float = 0.01
    percent_dense: float = 0.01
    scene_extent: float = 4.0
    prune_min_opacity: float = 0.005
    prune_max_scale: float = 0.1
    prune_max_screen_radius: float | None = None
    opacity_reset_interval: int = 700
    opacity_reset_value: float = 0.01
    max_gaussians: int | None = None
    lambda_rgb: float = 1.0
    lambda_alpha: float = 0.0
    background: tuple[float, float, float] = (1.0, 1.0, 1.0)
    random_background: bool = False
    backend: str = "auto"
    seed: int = 0

    def validate(self) -> None:
        self.require("sh_degree", 0 <= self.sh_degree <= 3, "must be in 0..3")
        self.require("num_pts", self.num_pts >= 1, "must be at least 1")
        self.require("densify_interval", self.densify_interval >= 1, "must be at least 1")
        self.require("max_gaussians", self.max_gaussians is None or self.max_gaussians >= 1,
                     "must be at least 1, or none")  # fmt: skip
        self.choose("backend", RENDER_BACKENDS)
        self.require("backend", self.backend != "cpp",
                     "'cpp' renders forward only and training needs gradients: use auto, torch or gsplat")  # fmt: skip


def _reconstruction_train_config() -> TrainConfig:
    return TrainConfig(
        position_lr_max_steps=2000,
        densify_start_iter=100,
        densify_end_iter=1200,
        densify_interval=100,
        opacity_reset_interval=500,
        max_gaussians=500_000,
        lambda_alpha=1.0,
        random_background=True,
    )


@dataclass
class ReconstructConfig(Config):
    """Optimising a splat to reproduce posed RGBA views (``microdreamer.train.reconstruct``).

    Attributes:
        train: the optimisation settings; the defaults differ from MicroDreamer's (which are tuned for 500
            steps against a diffusion prior) in: a 2000-step position schedule, densification from step
            100 to 1200 (threshold: see ``densify_grad_threshold_3dgs``) capped at 500k Gaussians, opacity
            resets at steps 500 and 1000 (they clear the initial ball's occluded interior, which would
            otherwise leave density ~1 inside the object), an alpha term and random backgrounds.
        iters: optimisation steps.
        batch_views: views rendered per step (MicroDreamer renders 6).
        log_every: update the progress bar's loss every this many steps.
        densify_grad_threshold_3dgs: if set, replaces ``train.densify_grad_threshold`` by this threshold in
            3DGS's convention (a per-view mean L1 loss; 3DGS uses 0.0002) converted to our per-view L1 sum:
            times ``H * W * 3 / batch_views``. MicroDreamer's 0.01 on 256^2 views is ~3e-7 in that
            convention (it densifies nearly every Gaussian, three times).
    """

    train: TrainConfig = dataclasses.field(default_factory=_reconstruction_train_config)
    iters: int = setting(2000, "optimisation steps")
    batch_views: int = 6
    log_every: int = 25
    densify_grad_threshold_3dgs: float | None = 0.0002

    def validate(self) -> None:
        self.require("iters", self.iters >= 1, "must be at least 1")
        self.require("batch_views", self.batch_views >= 1, "must be at least 1")
        self.require("log_every", self.log_every >= 1, "must be at least 1")


@dataclass
class SIRConfig(Config):
    """Score-based iterative reconstruction (:mod:`microdreamer.sir`); the defaults are MicroDreamer's
    for image-to-3D with Stable-Zero123.

    Attributes:
        iterations: K outer iterations = prior calls, upstream's ``total_steps`` (``main.py`` runs
            ``train(total_steps)``): the first from pure noise, then K - 1 annealed.
        views: C novel views per iteration.
        t_start, t_end: where the annealed t2 starts and ends, MicroDreamer's rule on the prior's DDIM grid
            (:func:`microdreamer.priors.ddim.annealed_t2`; 0.9, 0.2 on 20 steps: 901, 851, ..., 251, 201).
        init_steps: reconstruction steps of the first iteration.
        recon_steps: reconstruction steps of every later iteration.
        elevation_range: (a, b) degrees of the novel views' elevations (see
            ``priors.base.even_orbit_views``).
        radius: orbit radius of every camera.
        fovy_deg: vertical field of view of every camera.
        image_size: render and target side in pixels.
        lambda_views: weight of the novel views' L1 (summed over pixels and channels, averaged over views).
        lambda_ref_rgb: weight of the reference view's L1 (summed).
        lambda_ref_mask: weight of the reference view's alpha squared error (summed).
        final_min_opacity: the last prune drops Gaussians less opaque than this.
        white_prune: also drop large over-white Gaussians that add visible opacity.
        white_color: "over-white": every channel of ``0.5 + C0 * sh_dc`` (before clamping) above this.
        white_min_scale: "large": the largest scale above this (world units).
        white_alpha_drop: such a Gaussian goes when removing all of them lowers the alpha at its projected
            centre by more than this in one of six check views.
        white_check_size: side of the check views' renders.
        train: the Gaussian optimisation (initialisation, Adam, schedule, densification).
        seed: seeds the views, the diffusion noise and the initialisation.
    """

    iterations: int = setting(21, "SIR iterations (prior calls; the first from pure noise)")
    views: int = 6
    t_start: float = 0.9
    t_end: float = 0.2
    init_steps: int = 15
    recon_steps: int = 15
    elevation_range: tuple[float, float] = (-30.0, 30.0)
    radius: float = 2.0
    fovy_deg: float = 49.1
    image_size: int = 256
    lambda_views: float = 1.0
    lambda_ref_rgb: float = 0.3
    lambda_ref_mask: float = 0.01
    final_min_opacity: float = 0.01
    white_prune: bool = True
    white_color: float = 1.0
    white_min_scale: float = 0.01
    white_alpha_drop: float = 0.1
    white_check_size: int = 256
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    seed: int = setting(0, "random seed")

    def validate(self) -> None:
        self.require("iterations", self.iterations >= 1, "must be at least 1")
        self.require("views", self.views >= 1, "must be at least 1")
        self.require("t_start", 0.0 < self.t_start <= 1.0, "must be in (0, 1]")
        self.require("t_end", 0.0 < self.t_end <= 1.0, "must be in (0, 1]")
        self.require("init_steps", self.init_steps >= 0, "must be 0 or more")
        self.require("recon_steps", self.recon_steps >= 0, "must be 0 or more")
        self.require("image_size", self.image_size >= 8, "must be at least 8 pixels")


@dataclass
class DDIMConfig(Config):
    """The DDIM schedule (:mod:`microdreamer.priors.ddim`; MicroDreamer's and Zero123's: Stable
    Diffusion's scaled-linear betas).

    Attributes:
        num_train_timesteps: T.
        num_inference_steps: DDIM steps over [0, T) (the grid).
        beta_start, beta_end, beta_schedule: the noise schedule.
        timestep_spacing: how the grid is laid out ("leading": 0, T/steps, ...; plus ``steps_offset``).
        steps_offset: added to every grid timestep.
        clip_sample: clip the predicted clean latents to [-1, 1] (off: latents are not in [-1, 1]).
        set_alpha_to_one: alpha of the step past the last one (False: alphas_cumprod[0], SD's choice).
    """

    num_train_timesteps: int = 1000
    num_inference_steps: int = 20
    beta_start: float = 0.00085
    beta_end: float = 0.012
    beta_schedule: str = "scaled_linear"
    timestep_spacing: str = "leading"
    steps_offset: int = 1
    clip_sample: bool = False
    set_alpha_to_one: bool = False

    def validate(self) -> None:
        self.require("num_inference_steps", 1 <= self.num_inference_steps <= self.num_train_timesteps,
                     f"must be in 1..{self.num_train_timesteps}")  # fmt: skip
        self.choose("timestep_spacing", ("leading", "trailing"))

    def scheduler_kwargs(self) -> dict:
        return {
            "num_train_timesteps": self.num_train_timesteps,
            "beta_start": self.beta_start,
            "beta_end": self.beta_end,
            "beta_schedule": self.beta_schedule,
            "timestep_spacing": self.timestep_spacing,
            "steps_offset": self.steps_offset,
            "clip_sample": self.clip_sample,
            "set_alpha_to_one": self.set_alpha_to_one,
            "prediction_type": "epsilon",
        }


CAMERA_EMBEDDINGS = ("stable-zero123", "zero123-xl")
#: what a prior's VAE encoding gives: the posterior's sample (MicroDreamer's) or its mode (mean)
LATENTS = ("sample", "mode")
DEFAULT_ZERO123 = "ashawkey/stable-zero123-diffusers"
DTYPES = ("auto", "float16", "bfloat16", "float32")


@dataclass
class Zero123Config(Config):
    """The Zero123 prior (:mod:`microdreamer.priors.zero123`): which model, and MicroDreamer's sampling
    settings. The speed switches cite ``benchmarks/results/generate_h200.json``.

    Attributes:
        model: a diffusers-format folder, or a Hugging Face repo id already in the local cache.
        camera_embedding: "stable-zero123", "zero123-xl", or "auto" (the model folder's
            ``model_index.json`` says, else "stable" in the model's name picks stable-zero123).
        guidance_scale: classifier-free guidance of the denoising steps (MicroDreamer: 3.0).
        eta: DDIM eta of the denoising steps (MicroDreamer: 0.5).
        inversion_ratio: t1 = inversion_ratio * t2: noise is added up to t1, then DDIM inversion with the
            unconditional prediction runs from t1 to t2 (MicroDreamer: 0.6).
        latents: what encoding an image (the input view, the renders) gives: "sample", the VAE posterior's
            sample, drawn from the run's seeded generator (MicroDreamer's ``encode_imgs``), or "mode", its
            mean (deterministic).
        image_size: the side of the images the model sees (Zero123: 256); other sizes are resized (plain
            bilinear, upstream's).
        dtype: "auto" (float16 on CUDA, float32 on the CPU), "float16", "bfloat16" or "float32".
        cuda_graphs: replay the UNet (one graph per batch size) and the VAE's encoder and decoder from CUDA
            graphs instead of launching their kernels one by one from Python; CUDA only.
        channels_last: keep the UNet's activations in NHWC (the tensor cores' layout); CUDA only. H200,
            fp16, CUDA graphs: guided call (batch 12) 13.2 -> 11.7 ms, unconditional (batch 6) 9.8 -> 7.9 ms.
        vae_channels_last: the same for the VAE: faster only with ``fused_group_norm`` (PyTorch's
            GroupNorm has no NHWC kernel; encode of 6 views 9.9 -> 7.4 ms, decode 15.3 -> 14.8 ms).
        cudnn_benchmark: let cuDNN time its convolution algorithms per shape (inside the prior's calls
            only); CUDA only. Off: no gain measured on the H200.
        single_token_cross_attention: compute the UNet's cross-attention to its one context token as that
            token's projected value (the same result up to rounding, without the per-position
            query/key/output projections and attention). H200: diffusion 4.73 -> 4.60 s per generation.
        fused_group_norm: run the UNet's and the VAE's group norms (with the SiLU after them and the ResNet
            blocks' time-embedding and conv1-bias adds) and the UNet's GEGLU gates as Triton kernels
            (:mod:`microdreamer.priors.fused`); CUDA only, the norms only where the tensors are
            channels-last. H200: guided UNet call 11.8 -> 9.1 ms, VAE decode 23.4 -> 12.4 ms.
        hf_cache_dir: the Hugging Face cache to look repo ids up in (None: the default one).
        ddim: the DDIM schedule.
    """

    model: str = setting(
        DEFAULT_ZERO123, "diffusers-format folder or a repo id in the local Hugging Face cache"
    )
    camera_embedding: str = "auto"
    guidance_scale: float = 3.0
    eta: float = 0.5
    inversion_ratio: float = 0.6
    latents: str = "sample"
    image_size: int = 256
    dtype: str = "auto"
    cuda_graphs: bool = True
    channels_last: bool = True
    vae_channels_last: bool = True
    cudnn_benchmark: bool = False
    single_token_cross_attention: bool = True
    fused_group_norm: bool = True
    hf_cache_dir: str | None = None
    ddim: DDIMConfig = dataclasses.field(default_factory=DDIMConfig)

    def validate(self) -> None:
        self.choose("camera_embedding", ("auto", *CAMERA_EMBEDDINGS))
        self.choose("dtype", DTYPES)
        self.choose("latents", LATENTS)
        self.require("inversion_ratio", 0.0 < self.inversion_ratio <= 1.0, "must be in (0, 1]")
        self.require("image_size", self.image_size >= 8, "must be at least 8 pixels")


DEFAULT_MVDREAM = "ashawkey/mvdream-sd2.1-diffusers"
DEFAULT_IMAGEDREAM = "ashawkey/imagedream-ipmv-diffusers"
#: MicroDreamer's negative prompt of MVDream and ImageDream
NEGATIVE_PROMPT = (
    "ugly, bad anatomy, blurry, pixelated obscure, unnatural colors, poor lighting, dull, and unclear, "
    "cropped, lowres, low quality, artifacts, duplicate, morbid, mutilated, poorly drawn face, deformed, "
    "dehydrated, bad proportions"
)


def _ddim(steps: int):
    return lambda: DDIMConfig(num_inference_steps=steps)


@dataclass
class MVDreamConfig(Config):
    """The MVDream prior (:mod:`microdreamer.priors.mvdream`): which model, and the SIR sampling settings;
    where each value comes from: ``benchmarks/NOTES_mvdream.md``.

    Attributes:
        model: a diffusers-format folder, or a Hugging Face repo id already in the local cache.
        negative_prompt: the unconditional branch's text (MicroDreamer's list of defects).
        guidance_scale: classifier-free guidance of the denoising steps (ours: 7.5, MVDream's sampling
            scale; upstream's text config sets none).
        eta: DDIM eta of the denoising steps (upstream's MVDream refinement: 0).
        inversion_ratio: t1 = inversion_ratio * t2 (noise to t1, DDIM inversion t1 -> t2; upstream: 0.6).
        latents: what encoding an image gives: "sample", the VAE posterior's sample from the run's seeded
            generator (upstream's ``get_first_stage_encoding``), or "mode", its mean.
        frames: F, views per group (MVDream: 4); refine takes a multiple of F views.
        image_size: the side of the images the model sees (256); other sizes are resized (plain bilinear).
        dtype: "auto" (float16 on CUDA, float32 on the CPU), "float16", "bfloat16" or "float32".
        cuda_graphs: replay the UNet (one graph per batch) and the VAE from CUDA graphs; CUDA only.
        channels_last: keep the UNet's activations in NHWC; CUDA only.
        vae_channels_last: the same for the VAE; CUDA only.
        fused_group_norm: the group norms (with their SiLU and the time-embedding add) and GEGLU gates on
            the Triton kernels of :mod:`microdreamer.priors.fused`; CUDA (channels-last) only.
        hf_cache_dir: the Hugging Face cache to look repo ids up in (None: the default one).
        ddim: the DDIM schedule (upstream's text config: 50 steps).
    """

    model: str = DEFAULT_MVDREAM
    negative_prompt: str = NEGATIVE_PROMPT
    guidance_scale: float = 7.5
    eta: float = 0.0
    inversion_ratio: float = 0.6
    latents: str = "sample"
    frames: int = 4
    image_size: int = 256
    dtype: str = "auto"
    cuda_graphs: bool = True
    channels_last: bool = True
    vae_channels_last: bool = True
    fused_group_norm: bool = True
    hf_cache_dir: str | None = None
    ddim: DDIMConfig = dataclasses.field(default_factory=_ddim(50))

    def validate(self) -> None:
        self.choose("dtype", DTYPES)
        self.choose("latents", LATENTS)
        self.require("inversion_ratio", 0.0 < self.inversion_ratio <= 1.0, "must be in (0, 1]")
        self.require("frames", self.frames >= 1, "must be at least 1")
        self.require("image_size", self.image_size >= 8, "must be at least 8 pixels")


@dataclass
class ImageDreamConfig(MVDreamConfig):
    """The ImageDream prior (:mod:`microdreamer.priors.imagedream`); MicroDreamer's
    ``configs/imagedream.yaml`` ``cfg`` 2.0 and ``denoise_steps`` 10; eta 1.0 and inversion ratio 0.6 are
    ``imagedream_utils.train_step``'s defaults, which win: ``main.py`` passes neither (the YAML's
    ``eta: 0.0``, ``inv_r`` never reach it). Other fields as :class:`MVDreamConfig`."""

    model: str = DEFAULT_IMAGEDREAM
    guidance_scale: float = 2.0
    eta: float = 1.0
    ddim: DDIMConfig = dataclasses.field(default_factory=_ddim(10))


@dataclass
class Stage2Config(Config):
    """MicroDreamer's stage 2 (its ``main2.py``): the stage-1 textured mesh's texture refined against
    Zero123 (:func:`microdreamer.texture.refine.refine_with_prior`). The defaults are upstream's.

    Each of ``iterations`` iterations renders ``views`` views of ``size``^2 at azimuths 360 / views apart
    from a random start, refines each render once with the prior (noise to the grid timestep at index
    ``int(ddim_steps * strength)`` of a ``ddim_steps``-step DDIM grid, then the DDIM steps left: the
    last 10 of 50, t = 181 -> 0, with classifier-free guidance ``guidance_scale``, conditioned on the
    input image and the views' cameras relative to it), then takes ``steps`` Adam steps on the texture
    alone (geometry fixed) against ``lambda_views`` x the MSE to those targets plus ``lambda_ref`` x the
    MSE to the input image at the input view (on the pixels whose normal faces that camera, cosine >
    ``ref_min_cos``).

    Attributes:
        enabled: run stage 2 (``--no-refine`` turns it off).
        iterations: upstream's ``iters_refine``.
        views: views per iteration (upstream's ``batch_size``).
        size: side of their renders (upstream's ``render_resolution``).
        elevation_deg: absolute elevation of the views; upstream renders at ``opt.elevation + ver``
            with ``ver = -opt.elevation``: level views, 0, whatever the input's elevation. None: the
            input's elevation.
        strength: upstream's ``strength``: the fraction of the DDIM grid skipped (0.8: start at step 40
            of 50); NOT diffusers' img2img strength (which is the fraction run).
        ddim_steps: steps of the DDIM grid (upstream's ``steps``).
        guidance_scale: classifier-free guidance of the denoising (upstream's default 2).
        eta: DDIM eta of the denoising (upstream: the scheduler's default, 0).
        steps: Adam steps on the texture per iteration (upstream's ``recon_steps``).
        lr: Adam's learning rate on the texture's logits (upstream's ``texture_lr``).
        lambda_views: weight of the novel views' MSE (upstream's ``lambda_zero123``).
        lambda_ref: weight of the input view's MSE (upstream: 1).
        ref_min_cos: the input view's loss counts the pixels whose normal's cosine with the camera
            axis is above this (upstream: 0.5).
    """

    enabled: bool = True
    iterations: int = 1
    views: int = 8
    size: int = 512
    elevation_deg: float | None = 0.0
    strength: float = 0.8
    ddim_steps: int = 50
    guidance_scale: float = 2.0
    eta: float = 0.0
    steps: int = 30
    lr: float = 0.2
    lambda_views: float = 1.0
    lambda_ref: float = 1.0
    ref_min_cos: float = 0.5

    def validate(self) -> None:
        self.require("iterations", self.iterations >= 0, "must be 0 or more")
        self.require("views", self.views >= 1, "must be at least 1")
        self.require("size", self.size >= 8, "must be at least 8 pixels")
        self.require("strength", 0.0 <= self.strength <= 1.0, "must be in [0, 1]")
        self.require("ddim_steps", 1 <= self.ddim_steps <= 1000, "must be in 1..1000")
        self.require("eta", self.eta >= 0.0, "must be 0 or more")
        self.require("steps", self.steps >= 0, "must be 0 or more")
        self.require("lr", self.lr > 0, "must be positive")
        self.require("lambda_views", self.lambda_views >= 0, "must be 0 or more")
        self.require("lambda_ref", self.lambda_ref >= 0, "must be 0 or more")
        self.require("ref_min_cos", -1.0 <= self.ref_min_cos < 1.0, "must be in [-1, 1)")
        if self.elevation_deg is not None:
            self.require(
                "elevation_deg", -90.0 < self.elevation_deg < 90.0, "must be between -90 and 90 degrees"
            )

    def texture_refine(self, seed: int = 0) -> RefineConfig:
        """The :class:`RefineConfig` of one iteration: all ``views`` per step, targets computed once,
        Adam on logits, the MSE over whole images (upstream's)."""
        return RefineConfig(steps=self.steps, lr=self.lr, views=self.views, batch=self.views, size=self.size,
                            cache_targets=True, seed=seed, parametrization="logit", normalize="image")  # fmt: skip


MASK_METHODS = ("auto", "alpha", "rembg", "grabcut")


@dataclass
class ImageConfig(Config):
    """Input preparation for image-to-3D (:mod:`microdreamer.data.image`).

    Attributes:
        size: output side in pixels (Zero123 works at 256).
        object_fraction: the object's bounding box's longer side as a fraction of ``size``
            (DreamGaussian / MicroDreamer: 1 - border ratio 0.2 = 0.8).
        recenter: scale and centre the object; False keeps the framing (only resizes to ``size``).
        background: "auto" (alpha, else rembg if usable, else GrabCut) or one of them by name.
        rembg_model: the rembg session name (its ONNX file must be on disk).
        grabcut_margin: GrabCut's initial rectangle leaves this fraction of each side as background.
        grabcut_iterations: GrabCut iterations.
        bbox_alpha: pixels with alpha above this count towards the object's bounding box.
    """

    size: int = 256
    object_fraction: float = 0.8
    recenter: bool = True
    background: str = "auto"
    rembg_model: str = "u2net"
    grabcut_margin: float = 0.05
    grabcut_iterations: int = 5
    bbox_alpha: float = 0.5 / 255.0

    def validate(self) -> None:
        self.choose("background", MASK_METHODS)
        self.require("object_fraction", 0.0 < self.object_fraction <= 1.0, "must be in (0, 1]")
        self.require("size", self.size >= 8, "must be at least 8 pixels")
        self.require("grabcut_margin", 0.0 <= self.grabcut_margin < 0.5, "must be in [0, 0.5)")
        self.require("grabcut_iterations", self.grabcut_iterations >= 1, "must be at least 1")


# ============================================================================== jobs

DEVICES = ("auto", "cpu", "cuda")
#: the up axes ``--up`` takes (:data:`microdreamer.orient.UP_AXES`; orient imports torch, this module not)
UP_AXES = ("+y", "-y", "+z", "-z")
#: what ``--up`` takes on splat inputs: an axis, or ``auto`` (:func:`microdreamer.orient.detect_up`: a ground's
#: side when the splat has one clear ground layer, else +y)
UP_CHOICES = (*UP_AXES, "auto")
UP_HELP = "the input's up axis; the output is turned so that it points up (+y)"
UP_HELP_AUTO = (UP_HELP + "; auto: the side of the ground when the input has one clear ground layer "
                "(a floor or table under the object), else +y")  # fmt: skip


CROP_HELP = (
    "crop to a box X0,Y0,Z0,X1,Y1,Z1 (the splat's coordinates after --up: Gaussians whose centres lie "
    "in it; the grid spans it), or auto: the main object of a scene (ground and far floaters out)"
)


def parse_crop_spec(spec: str, setting: str = "--crop") -> str | tuple[tuple, tuple]:
    """``"auto"``, or the corners ``((x0, y0, z0), (x1, y1, z1))`` of ``"X0,Y0,Z0,X1,Y1,Z1"``; one
    InputError line otherwise (:func:`microdreamer.crop.parse_crop` makes the box of it)."""
    import math

    spec = str(spec).strip()
    if spec == "auto":
        return "auto"
    try:
        v = [float(s) for s in spec.split(",")]
    except ValueError:
        v = []
    if len(v) != 6 or not all(math.isfinite(x) for x in v):
        raise InputError(f"{setting} {spec}: give auto or six numbers X0,Y0,Z0,X1,Y1,Z1 (the box's corners)")
    lo, hi = tuple(v[:3]), tuple(v[3:])
    if not all(a < b for a, b in zip(lo, hi, strict=True)):
        raise InputError(f"{setting} {spec}: each of X1, Y1, Z1 must be above X0, Y0, Z0")
    return lo, hi


def _check_crop(cfg) -> None:
    """``crop``: None, ``auto`` or six numbers."""
    if cfg.crop is not None:
        parse_crop_spec(cfg.crop)


#: the export's silhouette-carving directions (``MeshConfig.carve``)
EXPORT_CARVE_DIRECTIONS = 24


#: ``SceneConfig.texture``: the tiled path's colour
TILE_TEXTURES = ("colors", "bake")
#: ``--background``: what a tiled export does with a capture's sparse far background
BACKGROUND_MODES = ("drop", "keep")


@dataclass
class SceneConfig(Config):
    """Tiled meshing of scenes (:mod:`microdreamer.scene`): the splat cut into tiles of one global grid,
    each meshed on its own, so that memory follows the tile and not the scene.

    Attributes:
        tiles: ``"off"`` (the dense grid of ``field.resolution``, for single objects), ``"auto"`` (tiles of
            ``tile`` cells a side) or N (N tiles along the grid's longest axis).
        tile: cells per tile side with ``tiles = "auto"`` (a tile's field is (tile + 1)^3 float32).
        voxel: the global grid's spacing in the splat's units, or ``"auto"``: 0.8 times the median of the
            Gaussians' largest scales (``scene.tiles.VOXEL_FACTOR``), no fixed resolution cap: grown only
            past what the plan addresses (``scene.tiles.grid_limit``: 2^20 points along an axis).
        memory: GB one tile's work may take per worker (its field, Gaussians and marching cubes' arrays),
            or ``"auto"``: a quarter of the free memory shared by the workers; the tile is made smaller
            where ``tile`` would not fit.
        threads: tiles meshed at once by this process (no Ray workers), each on its own thread, or
            ``"auto"``: 4 on a GPU (marching cubes and the cleanup on the host overlap the other tiles'
            device work: 10.08M Gaussians 17.1 -> 14.5 s on an H100, ``scene_10000k_h100.json``), 1 on a CPU
            (the field kernel already uses every core). The mesh is the same at any count; the memory
            budget is shared by the threads.
        workers: spread the tiles over this many Ray workers (None: this process).
        ray_address: the tiles' Ray cluster ("host:port" or "auto"; None: a local one).
        tileset: a folder to also write the scene into as OGC 3D Tiles 1.1 (``tileset.json``, one GLB per
            tile, :mod:`microdreamer.scene.tileset`), or None.
        texture: the tiles' colour: ``"colors"`` (vertex colours from the splat's colour field, tile by
            tile: 0.9 s for a 1M-Gaussian scene on a 2-core CPU) or ``"bake"`` (a UV texture per tile,
            :func:`microdreamer.scene.texture.texture_tile`, from views each tile chooses: about 25 s a
            tile there, ``benchmarks/results/scene_texture_1000k.json``); a bake writes a ``.glb`` (a
            material and image per tile's node) and the tileset's tiles.
        cameras: the capture's own cameras (an INRIA ``cameras.json`` or a ``transforms.json``, in the
            splat's coordinates: :mod:`microdreamer.data.capture`) as the bake's candidate views where the
            ring does not see a tile, instead of free-space positions; needs ``texture = "bake"``.
        remove_cavities: the cleanup's ``MeshConfig.remove_cavities`` for a scene. Off: a closed room's
            inner walls are a cavity (closed, wound inward) and the surface a room capture is about. No rule
            on the cavity's shape tells them from a hollow object's inner shell (measured at the defaults:
            the room of ``tests/test_scene_texture.py`` encloses 0.35-0.46 of its outer shell's volume
            behind walls 3.9-5.6 voxels thick, 27 voxels across; ``bench_fidelity``'s capture-like shell
            object 0.53-0.56 behind 3.5-4.6 voxels, 64-86 across), so a scene keeps them; on drops them as
            the object path does.
        background: ``"drop"`` (tiled mode without a crop box): the sparse far background of a capture (a
            sky dome, distant trees, far floaters) is left out, only the scene's core is meshed
            (:func:`microdreamer.crop.core_box`); ``"keep"``: every Gaussian.
    """

    tiles: int | str = setting("off", "off: one dense grid; auto or N: the scene meshed in tiles (N along "
                               "its longest axis) on one grid whose voxel follows the Gaussians")  # fmt: skip
    tile: int = 128
    voxel: float | str = setting("auto", "tiled mode's voxel size in the splat's units, or auto")
    memory: float | str = setting("auto", "tiled mode's memory budget per worker in GB, or auto (a quarter "
                                  "of the free memory shared by the workers)")  # fmt: skip
    threads: int | str = setting("auto", "tiled mode: tiles meshed at once on this process's threads, or auto "
                                 "(4 on a GPU, 1 on a CPU); the same mesh at any count")  # fmt: skip
    workers: int | None = None
    ray_address: str | None = None
    tileset: str | None = setting(None, "also write the tiled scene into this folder as OGC 3D Tiles 1.1 "
                                  "(tileset.json and one .glb per tile; needs --tiles)")  # fmt: skip
    texture: str = setting("colors", "tiled mode's colour: colors (vertex colours from the splat's colour "
                           "field, fast) or bake (a UV texture per tile from views each tile chooses, about "
                           "25 s a tile on a 2-core CPU; needs a .glb)", choices=TILE_TEXTURES)  # fmt: skip
    cameras: str | None = setting(None, "the capture's own cameras (cameras.json or transforms.json, in the "
                                  "splat's coordinates) as the bake's views of tiles the ring does not see")  # fmt: skip
    remove_cavities: bool = False
    background: str = setting("drop", "tiled mode without --crop: drop leaves the sparse far background (sky, "
                              "distant Gaussians) out and meshes the scene's core; keep meshes every Gaussian",
                              choices=BACKGROUND_MODES)  # fmt: skip

    def validate(self) -> None:
        self.choose("texture", TILE_TEXTURES)
        if self.texture == "bake":
            self.require("texture", self.enabled, "bakes a scene meshed in tiles; add --tiles auto (or N)")
        self.choose("background", BACKGROUND_MODES)
        if self.cameras is not None:
            self.require("cameras", self.cameras.strip() != "", "must name a cameras.json or transforms.json")
            self.require("cameras", self.texture == "bake", "are the bake's views; add --tile-texture bake")
        if isinstance(self.threads, str):
            self.require("threads", self.threads == "auto", "must be auto or a thread count")
        else:
            self.require("threads", 1 <= self.threads <= 256, "must be auto or between 1 and 256")
            self.require("threads", self.enabled, "meshes a scene's tiles at once; add --tiles auto (or N)")
            self.require("threads", self.workers is None and self.ray_address is None,
                         "runs the tiles in this process; with Ray workers each worker takes a tile")  # fmt: skip
        if isinstance(self.tiles, str):
            self.require("tiles", self.tiles in ("off", "auto"), "must be off, auto or a tile count")
        else:
            self.require("tiles", 1 <= self.tiles <= 4096, "must be off, auto or between 1 and 4096")
        self.require("tile", 8 <= self.tile <= 1024, "must be between 8 and 1024 cells")
        if isinstance(self.voxel, str):
            self.require("voxel", self.voxel == "auto", "must be a positive number or auto")
        else:
            self.require("voxel", self.voxel > 0.0, "must be a positive number or auto")
        if isinstance(self.memory, str):
            self.require("memory", self.memory == "auto", "must be a number of GB above 0, or auto")
        else:
            self.require("memory", 0.0 < self.memory < 1e6, "must be a number of GB above 0, or auto")
        if self.workers is not None:
            self.require("workers", self.workers >= 1, "must be at least 1")
        if self.tileset is not None:
            self.require("tileset", self.tileset.strip() != "", "must name a folder")
            self.require("tileset", self.enabled, "writes a scene meshed in tiles; add --tiles auto (or N)")

    @property
    def enabled(self) -> bool:
        return self.tiles != "off"


@dataclass
class ExportConfig(Config):
    """Splat -> density field -> mesh -> texture -> file (:func:`microdreamer.jobs.export.export_mesh`),
    the ``mesh`` command's job and every other job's mesh export.

    Its defaults (``mesh`` and ``reconstruct``) differ from the components' library defaults: the grid's
    resolution and the iso-level are chosen from the splat (``auto``), and the density is carved to the
    splat's silhouettes from :data:`EXPORT_CARVE_DIRECTIONS` directions (``benchmarks/README.md``: the
    fidelity measurements that chose them)."""

    field: FieldConfig = dataclasses.field(default_factory=lambda: FieldConfig(resolution="auto"))
    mesh: MeshConfig = dataclasses.field(
        default_factory=lambda: MeshConfig(threshold="auto", carve=EXPORT_CARVE_DIRECTIONS)
    )
    texture: TextureConfig = dataclasses.field(default_factory=TextureConfig)
    scene: SceneConfig = dataclasses.field(default_factory=SceneConfig)
    up: str = setting("+y", "the splat's up axis: the splat is turned so that it points up (+y) before "
                      "meshing, and the mesh is written in that frame; auto: the side of the ground when the "
                      "splat has one clear ground layer (a floor or table), else +y", choices=UP_CHOICES)  # fmt: skip

    crop: str | None = setting(None, CROP_HELP)
    with_splat: bool = setting(
        False, "also write the splat into the .glb (KHR_gaussian_splatting), in the mesh's frame"
    )

    def validate(self) -> None:
        self.choose("up", UP_CHOICES)
        _check_crop(self)
        if self.scene.texture == "bake" and self.texture.mode == "none":
            raise ConfigError(type(self).__name__, "scene.texture", "bake", "needs a texture; drop --texture "
                              "none, or leave the tiles uncoloured with --tile-texture colors")  # fmt: skip


FRAMES = ("input", "dataset")


def _reconstruct_export() -> ExportConfig:
    return ExportConfig()


@dataclass
class ReconstructJobConfig(Config):
    """``microdreamer reconstruct``: train on a dataset's views, evaluate on its held-out ones, export.

    Attributes:
        reconstruct: the optimisation.
        export: the mesh export, with ``mesh``'s iso-level setting (``auto``: from the splat's alpha). A
            reconstructed surface is a thin layer of partly transparent Gaussians whose summed density
            peaks near 1, so DreamGaussian's level 1 cuts inside it (Spot, H200: Chamfer-L1 0.99% of the
            diagonal at 1, 0.25% at 0.2); ``--threshold 0.2`` is MicroDreamer's ``density_thresh``.
        eval_background: background of the held-out evaluation renders and targets (PSNR, SSIM).
        mesh: write the mesh (False: splat and metrics only).
        up: the dataset frame's up axis; splat.ply and the mesh are turned so that it points up (+y).
        frame: the frame of splat.ply and the mesh: ``"input"`` (the default) maps them back from the
            dataset's normalised frame (``render-views``' centring and scaling) into the units and
            position of the mesh the dataset was rendered from (in the dataset's orientation: upright
            when ``render-views --up`` turned it); ``"dataset"`` keeps the normalised frame the
            cameras live in. A dataset without a recorded normalisation has one frame.
    """

    reconstruct: ReconstructConfig = dataclasses.field(default_factory=ReconstructConfig)
    export: ExportConfig = dataclasses.field(default_factory=_reconstruct_export)
    eval_background: tuple[float, float, float] = (1.0, 1.0, 1.0)
    mesh: bool = True
    up: str = setting("+y", UP_HELP, choices=UP_AXES)
    frame: str = setting("input", "frame of splat.ply and the mesh: input (the source mesh's units and "
                         "position) or dataset (the normalised frame of the cameras)", choices=FRAMES)  # fmt: skip

    def validate(self) -> None:
        self.choose("up", UP_AXES)
        self.choose("frame", FRAMES)
        # the job maps its mesh back through export.up's rotation: a named axis (--up is this job's)
        if self.export.up not in UP_AXES:
            raise ConfigError(
                type(self).__name__, "export.up", self.export.up, f"use one of {', '.join(UP_AXES)}"
            )


def _generate_export() -> ExportConfig:
    """generate's export: MicroDreamer's iso-level ``density_thresh`` 0.2 (``configs/image_sai.yaml``; see
    :class:`ReconstructJobConfig` for why a reconstructed surface needs it) on upstream's 128^3 grid
    (``extract_mesh``'s default), and upstream's 1024^2 texture on the texture stage's 50k-face cap
    (upstream decimates to 100k). On the H200 that export kept a whole generation at 6.8 s after load
    (``benchmarks/results/generate_h200.json``, variant ``texture_1024_50k``); upstream's 256^3 grid, as
    some of its scripts use, cost 10.5 s (variant ``upstream_export``: decimating the ~1M-face mesh)."""
    return ExportConfig(field=FieldConfig(resolution=128), mesh=MeshConfig(threshold=0.2),
                        texture=TextureConfig(chart_iterations=0))  # fmt: skip


RANDOM_WEIGHTS = ("tiny", "full")


@dataclass
class GenerateConfig(Config):
    """``microdreamer generate``: every stage's settings.

    The mode follows the inputs: an image alone is image-to-3D with ``prior`` (Zero123); a prompt alone is
    text-to-3D with ``mvdream``; both are image+text-to-3D with ``imagedream``. The two MVDream-family modes
    start from the presets ``presets/text.yaml`` and ``presets/imagedream.yaml`` (their SIR schedules), see
    :func:`microdreamer.jobs.generate.default_config`.

    Attributes:
        image: input preparation (its ``size`` must equal ``sir.image_size``).
        prior: the Zero123 prior (model, guidance, DDIM schedule) of image-to-3D.
        mvdream: the MVDream prior of text-to-3D.
        imagedream: the ImageDream prior of image+text-to-3D.
        negative_prompt: the MVDream-family priors' negative prompt (None: the prior config's).
        sir: score-based iterative reconstruction (iterations, views, losses, training, seed).
        export: the mesh export (field, mesh, texture; ``texture.mode = "none"`` exports it untextured).
        refine: stage 2, the texture refined against the prior before the mesh is written (on by default,
            as upstream's ``scripts/run_sai.sh`` runs it; skipped for an untextured export).
        elevation_deg: elevation of the input image's camera (MicroDreamer's sign: negative = above).
        views_size: side of each of the 8 preview renders in views.png.
        warmup: before the SIR loop, capture the prior's CUDA graphs (timed as its own stage).
    """

    image: ImageConfig = dataclasses.field(default_factory=ImageConfig)
    prior: Zero123Config = dataclasses.field(default_factory=Zero123Config)
    mvdream: MVDreamConfig = dataclasses.field(default_factory=MVDreamConfig)
    imagedream: ImageDreamConfig = dataclasses.field(default_factory=ImageDreamConfig)
    negative_prompt: str | None = setting(None, "what the MVDream-family priors steer away from (default: "
                                          "MicroDreamer's list of defects)")  # fmt: skip
    sir: SIRConfig = dataclasses.field(default_factory=SIRConfig)
    export: ExportConfig = dataclasses.field(default_factory=_generate_export)
    refine: Stage2Config = dataclasses.field(default_factory=Stage2Config)
    elevation_deg: float = setting(0.0, "elevation of the input view in degrees (MicroDreamer's sign: "
                                   "negative = from above)")  # fmt: skip
    views_size: int = 256
    warmup: bool = True

    def validate(self) -> None:
        self.require("elevation_deg", -90.0 < self.elevation_deg < 90.0, "must be between -90 and 90 degrees")
        self.require("views_size", self.views_size >= 8, "must be at least 8 pixels")
        if self.image.size != self.sir.image_size:
            raise ConfigError("GenerateConfig", "image.size", self.image.size,
                              f"differs from sir.image_size ({self.sir.image_size}); set both to one size")  # fmt: skip


DEFAULT_CLIP = "laion/CLIP-ViT-bigG-14-laion2B-39B-b160k"


@dataclass
class EvaluateConfig(Config):
    """``microdreamer evaluate``: the CLIP similarity of textured meshes to their input image, as
    MicroDreamer's ``scripts/cal_sim.py`` computes it (:func:`microdreamer.jobs.evaluate.evaluate`).

    The mesh is centred on its bounding box's centre and scaled so that its longest side is ``2 *
    bound`` (kiui's ``Mesh.load``, which ``cal_sim.py`` uses), rendered unlit (its texture or colours)
    on white from ``views`` azimuths 0, 360 / views, ... at ``elevation_deg``, each image is embedded
    with CLIP's image encoder (``get_image_features``, normalised), and the similarity is the mean
    cosine with the input image's embedding (the input composited on white).

    Attributes:
        model: a transformers-format CLIP folder or a repo id in the local Hugging Face cache
            (upstream's ``clip_sim.py``: ``laion/CLIP-ViT-bigG-14-laion2B-39B-b160k``).
        hf_cache_dir: the Hugging Face cache to look repo ids up in (None: the default one).
        views: renders per asset (upstream's ``num_azimuth``).
        size: their side in pixels (upstream's ``W``, ``H``).
        elevation_deg: their elevation (MicroDreamer's sign: negative = above).
        radius: camera distance (upstream's ``radius``).
        fovy_deg: vertical field of view (upstream's ``fovy``).
        bound: the mesh is scaled into [-bound, bound]^3.
        ssaa: supersampling per axis of the renders (edges antialiased, as nvdiffrast's ``antialias``).
        dtype: "auto" (float32: upstream's), "float16", "bfloat16" or "float32".
    """

    model: str = setting(DEFAULT_CLIP, "CLIP model: a transformers-format folder or a repo id in the local "
                         "Hugging Face cache")  # fmt: skip
    hf_cache_dir: str | None = None
    views: int = setting(8, "renders per asset, azimuths evenly spaced from 0")
    size: int = setting(512, "render size in pixels")
    elevation_deg: float = setting(0.0, "render elevation in degrees (negative = from above)")
    radius: float = 3.0
    fovy_deg: float = 49.0
    bound: float = 0.9
    ssaa: int = 2
    dtype: str = "auto"

    def validate(self) -> None:
        self.require("views", self.views >= 1, "must be at least 1")
        self.require("size", 16 <= self.size <= 4096, "must be between 16 and 4096 pixels")
        self.require("elevation_deg", -90.0 < self.elevation_deg < 90.0, "must be between -90 and 90 degrees")
        self.require("radius", self.radius > 0, "must be positive")
        self.require("fovy_deg", 0.0 < self.fovy_deg < 180.0, "must be in (0, 180)")
        self.require("bound", self.bound > 0, "must be positive")
        self.require("ssaa", self.ssaa >= 1, "must be at least 1")
        self.choose("dtype", DTYPES)


def _demo_export() -> ExportConfig:
    return ExportConfig(field=FieldConfig(resolution=128), mesh=MeshConfig(threshold=0.2),
                        texture=TextureConfig(size=256))  # fmt: skip


@dataclass
class DemoConfig(Config):
    """``microdreamer demo``: an object built in code -> views -> splat -> mesh, sized for a 2-core CPU.

    Attributes:
        views, held_out: training and held-out views of the object.
        size: view side in pixels (the bake renders at twice this).
        iters: reconstruction steps (the schedule scales with it).
        batch_views: views per step.
        num_pts: Gaussians of the initial ball.
        max_gaussians: cap on densification.
        seed: seeds the views' elevations and the optimisation.
        export: the mesh export (iso-level 0.2, a 256^2 texture).
    """

    views: int = 16
    held_out: int = 4
    size: int = setting(64, "view size in pixels")
    iters: int = setting(300, "reconstruction steps")
    batch_views: int = 4
    num_pts: int = 2000
    max_gaussians: int = 6000
    seed: int = setting(0, "random seed of the views and the optimisation")
    export: ExportConfig = dataclasses.field(default_factory=_demo_export)

    def validate(self) -> None:
        self.require("views", self.views >= 1, "must be at least 1")
        self.require("held_out", 0 <= self.held_out <= self.views, "must be in 0..views")
        self.require("size", 16 <= self.size <= 1024, "must be between 16 and 1024 pixels")
        self.require("iters", self.iters >= 1, "must be at least 1")
        self.require("batch_views", self.batch_views >= 1, "must be at least 1")


@dataclass
class ViewsConfig(Config):
    """``microdreamer render-views``: a transforms.json dataset of orbit views of a mesh
    (:func:`microdreamer.data.views.render_views`).

    Attributes:
        views: training views, azimuths spread evenly.
        held_out: extra held-out views, at azimuths between training ones.
        size: image width = height in pixels.
        seed: seed of the random elevations in [-30, 30] degrees.
        radius, fovy_deg: the orbit camera (MicroDreamer's 2 and 49.1 degrees).
        object_radius: the mesh is normalised so that its farthest vertex is this far from its centre.
        ssaa: supersampling factor per axis of the antialiased renders.
        up: the mesh's up axis; the dataset frame turns it to +y (recorded in its normalisation).
        light_direction, ambient: a mesh without colour (no texture, no vertex colours) is rendered
            grey, lit by this fixed directional light (dataset frame, towards the light: above, right,
            front) plus ambient (:func:`microdreamer.render.mesh.lighting`): one brightness per surface
            point from every view, so a reconstruction can fit it; transforms.json says so.
    """

    views: int = setting(32, "training views, azimuths spread evenly")
    held_out: int = setting(4, "extra held-out views")
    size: int = setting(256, "image size in pixels")
    seed: int = setting(0, "seed of the random elevations in [-30, 30]")
    radius: float = 2.0
    fovy_deg: float = 49.1
    object_radius: float = 0.6
    ssaa: int = 2
    up: str = setting("+y", "the mesh's up axis; the dataset is turned so that it points up (+y)",
                      choices=UP_AXES)  # fmt: skip
    light_direction: tuple[float, float, float] = (0.37, 0.74, 0.56)
    ambient: float = 0.3

    def validate(self) -> None:
        self.choose("up", UP_AXES)
        self.require("ambient", 0.0 <= self.ambient <= 1.0, "must be in [0, 1]")
        self.require("light_direction", any(x != 0 for x in self.light_direction), "must not be zero")
        self.require("views", self.views >= 1, "must be at least 1")
        self.require("held_out", 0 <= self.held_out <= self.views, "must be in 0..views")
        self.require("size", 16 <= self.size <= 4096, "must be between 16 and 4096 pixels")
        self.require("ssaa", self.ssaa >= 1, "must be at least 1")
        self.require("object_radius", self.object_radius > 0, "must be positive")


@dataclass
class TurntableConfig(Config):
    """``microdreamer render``: a turntable video or contact sheet of a mesh or a splat
    (:func:`microdreamer.jobs.turntable.render_turntable`).

    Attributes:
        frames: video frames over one turn.
        size: frame width and height in pixels.
        elevation_deg: camera elevation (0 = level; negative = above, MicroDreamer's sign).
        fps: video frame rate.
        sheet_views: views on a .png contact sheet (4 per row).
        up: the input's up axis; the turntable turns about it, with it up in every frame. A mesh
            without colour is shaded by a head light (:func:`microdreamer.render.mesh.lighting`).
    """

    frames: int = setting(120, "video frames")
    size: int = setting(512, "frame size in pixels")
    elevation_deg: float = setting(0.0, "camera elevation in degrees")
    fps: int = 30
    sheet_views: int = 8
    up: str = setting("+y", UP_HELP_AUTO, choices=UP_CHOICES)
    crop: str | None = setting(None, CROP_HELP)

    def validate(self) -> None:
        self.choose("up", UP_CHOICES)
        _check_crop(self)
        self.require("frames", self.frames >= 1, "must be at least 1")
        self.require("size", 16 <= self.size <= 4096, "must be between 16 and 4096 pixels")
        self.require("fps", self.fps >= 1, "must be at least 1")
        self.require("sheet_views", self.sheet_views >= 1, "must be at least 1")


# ======================================================================= loading

_NUMBER = {int: int, float: float}


def _coerce(value: Any, annotation: Any) -> Any:
    """A value read from YAML, with numbers written as strings (``1.0e9``) read as numbers."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        for option in typing.get_args(annotation):
            if option is not type(None):
                coerced = _coerce(value, option)
                if coerced is not value:
                    return coerced
        return value
    if annotation in _NUMBER and isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            return value
        if annotation is int and not number.is_integer():
            return value
        return _NUMBER[annotation](number)
    if origin is tuple and isinstance(value, list):
        return tuple(value)
    return value


def from_dict(cls: type[T], data: Any, where: str = "config", base: T | None = None) -> T:
    """Build dataclass ``cls`` from a (nested) mapping: the fields it names, the rest from ``base`` (or the
    defaults). Unknown keys, wrong types and broken rules raise one :class:`InputError` line naming
    ``where`` and the key."""
    if not isinstance(data, dict):
        raise InputError(f"{where}: expected a mapping of {cls.__name__} fields, got {type(data).__name__}")
    hints = _hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(map(str, data)) - set(names))
    if unknown:
        raise InputError(f"{where}: unknown {cls.__name__} field(s) {', '.join(unknown)}; "
                         f"valid: {', '.join(sorted(names))}")  # fmt: skip
    base = base if base is not None else cls()
    kwargs = {}
    for key, value in data.items():
        current = getattr(base, key)
        if dataclasses.is_dataclass(current) and isinstance(value, dict):
            kwargs[key] = from_dict(type(current), value, f"{where}.{key}", current)
        else:
            kwargs[key] = _coerce(value, hints[key])
    try:
        return dataclasses.replace(base, **kwargs)
    except ConfigError as e:
        raise InputError(f"{where}: {e}") from None
    except (TypeError, ValueError) as e:
        raise InputError(f"{where}: {e}") from None


#: the largest config preset read (the shipped ones are about 1 KB)
MAX_PRESET_BYTES = 256 << 10


def load_preset(cls: type[T], path: str | os.PathLike, base: T | None = None) -> T:
    """Load a YAML preset into dataclass ``cls``: the fields it names, the rest from ``base`` (default: the
    defaults)."""
    import yaml

    path = Path(path)
    if path.is_dir():
        raise InputError(f"{path}: is a folder; give the path of a YAML config preset")
    if not path.is_file():
        raise InputError(f"{path}: config preset not found; give the path of a YAML file")
    size = path.stat().st_size
    if size > MAX_PRESET_BYTES:  # presets are ~1 KB; PyYAML parses ~100 KB/s, so a 15 MB file took minutes
        raise InputError(f"{path}: is {size / 1024:.0f} KB, over the {MAX_PRESET_BYTES >> 10} KB a config preset "
                         "may have (presets are a few KB); give the right file")  # fmt: skip
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        data = yaml.load(path.read_text(), Loader=loader) or {}  # noqa: S506 (a safe loader)
    except (yaml.YAMLError, UnicodeDecodeError, RecursionError, OSError, ValueError, MemoryError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise InputError(f"{path}: not valid YAML ({first})") from None
    if not isinstance(data, dict):
        raise InputError(
            f"{path}: holds a {type(data).__name__}, not a mapping of settings; give a YAML mapping"
        )
    return from_dict(cls, data, str(path), base)


def replace_path(cfg: T, path: str, value: Any) -> T:
    """A copy of ``cfg`` with the field at dotted ``path`` (``"mesh.threshold"``) set to ``value``; every
    config on the way is rebuilt, so each validates again (a :class:`ConfigError` names the field)."""
    head, _, rest = path.partition(".")
    if rest:
        return dataclasses.replace(cfg, **{head: replace_path(getattr(cfg, head), rest, value)})
    return dataclasses.replace(cfg, **{head: value})


def get_path(cfg: Any, path: str) -> Any:
    """The value at dotted ``path`` of ``cfg``."""
    for part in path.split("."):
        cfg = getattr(cfg, part)
    return cfg


def field_at(cls: type, path: str) -> tuple[type, dataclasses.Field]:
    """The dataclass owning the field at dotted ``path`` of ``cls``, and that field."""
    *heads, last = path.split(".")
    owner = cls
    for part in heads:
        owner = type(getattr(owner(), part))
    return owner, {f.name: f for f in dataclasses.fields(owner)}[last]


def to_dict(obj: Any) -> Any:
    """A dataclass (nested) as plain dicts, e.g. to record the settings of a run in JSON."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, list | tuple):
        return [to_dict(v) for v in obj]
    return obj
