"""The mesh stage: density grid -> marching cubes -> cleanup -> optional decimation -> export.

``extract_mesh`` runs the stage with a :class:`MeshConfig`; the steps are public too:
:func:`marching_cubes`, :func:`cleanup_mesh`, :func:`decimate`, :func:`save_mesh`.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from microdreamer.errors import InputError
from microdreamer.mesh.cleanup import CleanupStats, cleanup_mesh, cleanup_mesh_with_stats, decimate
from microdreamer.mesh.export import MESH_FORMATS, save_mesh
from microdreamer.mesh.marching import GridVertices, marching_cubes, marching_cubes_on_grid
from microdreamer.mesh.types import Mesh

logger = logging.getLogger(__name__)

__all__ = [
    "MESH_FORMATS",
    "CleanupStats",
    "GridVertices",
    "Mesh",
    "MeshConfig",
    "cleanup_mesh",
    "cleanup_mesh_with_stats",
    "decimate",
    "extract_mesh",
    "marching_cubes",
    "marching_cubes_on_grid",
    "save_mesh",
]


@dataclass
class MeshConfig:
    """Settings of the mesh stage.

    Attributes:
        threshold: iso-level of the density field (the object is where density > threshold), or
            ``"auto"``: chosen from the splat by the caller that holds it, before :func:`extract_mesh`
            (:func:`microdreamer.field.iso.resolve_iso_level`: in exact mode the level whose
            silhouettes match the splat's alpha = 0.5 contour, in upstream mode DreamGaussian's 1).
        close_boundary: close surfaces cut by the grid's border (see :func:`marching_cubes`).
        min_component_fraction: drop connected components with fewer faces than this fraction of
            all faces (the largest component is always kept); 0 keeps everything.
        merge_tolerance: merge vertices closer than this fraction of the bounding-box diagonal.
        decimate_target: simplify to about this many faces; None keeps the full mesh.
    """

    threshold: float | str = 1.0
    close_boundary: bool = True
    min_component_fraction: float = 0.02
    merge_tolerance: float = 1e-6
    decimate_target: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.threshold, str):
            if self.threshold != "auto":
                raise InputError(f"mesh threshold = {self.threshold!r} is unknown; use a number or 'auto'")
        elif not math.isfinite(float(self.threshold)):
            raise InputError(f"mesh threshold = {self.threshold} is not finite; use a number or 'auto'")
        if not 0.0 <= self.min_component_fraction <= 1.0:
            value = self.min_component_fraction
            raise InputError(f"mesh min_component_fraction = {value} is out of range; use a value in [0, 1]")
        if not self.merge_tolerance >= 0.0:
            raise InputError(f"mesh merge_tolerance = {self.merge_tolerance} is negative; use 0 or more")
        if self.decimate_target is not None and self.decimate_target < 4:
            raise InputError(
                f"mesh decimate_target = {self.decimate_target} is too small; use at least 4 faces, or none"
            )


def extract_mesh(
    values, origin, spacing: float | Sequence[float], config: MeshConfig | None = None
) -> tuple[Mesh, dict[str, Any]]:
    """Turn a density grid into a clean triangle mesh: marching cubes -> cleanup -> optional decimation.

    Args:
        values: [R0, R1, R2] float density grid (NumPy or torch); sample ``[i, j, k]`` is at
            ``origin + spacing * (i, j, k)``; the object is where ``values > config.threshold``.
        origin: [3] world position of sample ``[0, 0, 0]``.
        spacing: grid step (world units).
        config: stage settings; None means the defaults.

    Returns:
        ``(mesh, stats)``. ``mesh`` is empty when the grid has no surface at the threshold (the caller
        decides whether that is an error). ``stats`` holds ints ``vertices_marching_cubes``,
        ``faces_marching_cubes``, ``faces_after_cleanup``, ``components``, ``components_removed``,
        ``vertices``, ``faces`` (final counts) and ``seconds``: a dict of wall-clock seconds for
        ``marching_cubes``, ``cleanup`` and ``decimate`` (0 when skipped).
    """
    config = MeshConfig() if config is None else config
    if config.threshold == "auto":
        raise ValueError(
            "MeshConfig.threshold 'auto' is chosen from the splat: resolve it first with "
            "microdreamer.field.iso.resolve_iso_level and pass the number"
        )
    seconds = {"marching_cubes": 0.0, "cleanup": 0.0, "decimate": 0.0}

    start = time.perf_counter()
    mesh, grid = marching_cubes_on_grid(
        values, config.threshold, origin, spacing, close_boundary=config.close_boundary
    )
    seconds["marching_cubes"] = time.perf_counter() - start
    stats: dict[str, Any] = {
        "vertices_marching_cubes": mesh.num_vertices,
        "faces_marching_cubes": mesh.num_faces,
    }

    start = time.perf_counter()
    mesh, cleanup = cleanup_mesh_with_stats(mesh, config, grid)
    seconds["cleanup"] = time.perf_counter() - start
    stats["faces_after_cleanup"] = mesh.num_faces
    stats["components"] = cleanup.components
    stats["components_removed"] = cleanup.components_removed

    if config.decimate_target is not None and not mesh.is_empty:
        start = time.perf_counter()
        mesh = decimate(mesh, config.decimate_target)
        seconds["decimate"] = time.perf_counter() - start

    stats["vertices"] = mesh.num_vertices
    stats["faces"] = mesh.num_faces
    stats["seconds"] = seconds
    logger.info(
        "mesh: %d faces from marching cubes, %d after cleanup (%d of %d components removed), %d final",
        stats["faces_marching_cubes"], stats["faces_after_cleanup"], cleanup.components_removed,
        cleanup.components, mesh.num_faces,
    )  # fmt: skip
    return mesh, stats
