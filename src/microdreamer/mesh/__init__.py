"""The mesh stage: density grid -> marching cubes -> cleanup -> optional decimation -> export.

``extract_mesh`` runs the stage with a :class:`MeshConfig`; the steps are public too:
:func:`marching_cubes`, :func:`cleanup_mesh`, :func:`decimate`, :func:`save_mesh`, and the torch
implementations that run on the grid's device (the GPU path): :func:`marching_cubes_torch`,
:func:`cleanup_mesh_torch` (both on :class:`TensorMesh`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from microdreamer.config import MESH_BACKENDS, MeshConfig
from microdreamer.mesh.cleanup import CleanupStats, cleanup_mesh, cleanup_mesh_with_stats, decimate
from microdreamer.mesh.cleanup_torch import cleanup_mesh_torch
from microdreamer.mesh.export import MESH_FORMATS, save_glb_nodes, save_mesh
from microdreamer.mesh.marching import GridVertices, marching_cubes, marching_cubes_on_grid
from microdreamer.mesh.marching_torch import TensorGridVertices, TensorMesh, marching_cubes_torch
from microdreamer.mesh.types import Mesh

logger = logging.getLogger(__name__)

__all__ = [
    "MESH_BACKENDS",
    "MESH_FORMATS",
    "CleanupStats",
    "GridVertices",
    "Mesh",
    "MeshConfig",
    "TensorGridVertices",
    "TensorMesh",
    "cleanup_mesh",
    "cleanup_mesh_torch",
    "cleanup_mesh_with_stats",
    "decimate",
    "extract_mesh",
    "marching_cubes",
    "marching_cubes_on_grid",
    "marching_cubes_torch",
    "resolve_mesh_backend",
    "save_glb_nodes",
    "save_mesh",
]


def resolve_mesh_backend(backend: str, values) -> str:
    """``"skimage"`` or ``"torch"``: ``backend`` itself, or for ``"auto"`` torch when ``values`` is a
    CUDA tensor and skimage otherwise (NumPy arrays and CPU tensors)."""
    if backend not in MESH_BACKENDS:
        raise ValueError(f"unknown mesh backend {backend!r}; use one of {', '.join(MESH_BACKENDS)}")
    if backend != "auto":
        return backend
    device = getattr(values, "device", None)
    return "torch" if device is not None and getattr(device, "type", None) == "cuda" else "skimage"


def extract_mesh(
    values, origin, spacing: float | Sequence[float], config: MeshConfig | None = None
) -> tuple[Mesh, dict[str, Any]]:
    """Turn a density grid into a clean triangle mesh: marching cubes -> cleanup -> optional decimation.

    Args:
        values: [R0, R1, R2] float density grid (NumPy or torch); sample ``[i, j, k]`` is at
            ``origin + spacing * (i, j, k)``; the object is where ``values > config.threshold``.
        origin: [3] world position of sample ``[0, 0, 0]``.
        spacing: grid step (world units).
        config: stage settings; None means the defaults. ``config.backend`` picks the
            implementation of marching cubes and cleanup (:func:`resolve_mesh_backend`); the torch
            one runs on the device of ``values`` and copies only the cleaned mesh to the host.

    Returns:
        ``(mesh, stats)``. ``mesh`` is empty when the grid has no surface at the threshold (the caller
        decides whether that is an error). ``stats`` holds ints ``vertices_marching_cubes``,
        ``faces_marching_cubes``, ``faces_after_cleanup``, ``components``, ``components_removed``
        (floaters), ``cavities_removed``, ``faces_in_cavities``, ``vertices``, ``faces`` (final counts)
        and ``seconds``: a dict of wall-clock seconds for
        ``marching_cubes``, ``cleanup`` and ``decimate`` (0 when skipped) (the torch backend's
        counts and stats synchronise with the device, so its times are the work's), and
        ``backend``: the implementation that ran (``"skimage"`` or ``"torch"``).
    """
    config = MeshConfig() if config is None else config
    if config.threshold == "auto":
        raise ValueError(
            "MeshConfig.threshold 'auto' is chosen from the splat: resolve it first with "
            "microdreamer.field.iso.resolve_iso_level and pass the number"
        )
    seconds = {"marching_cubes": 0.0, "cleanup": 0.0, "decimate": 0.0}
    backend = resolve_mesh_backend(config.backend, values)

    start = time.perf_counter()
    if backend == "torch":
        mesh, grid = marching_cubes_torch(
            values, config.threshold, origin, spacing, close_boundary=config.close_boundary
        )
    else:
        mesh, grid = marching_cubes_on_grid(
            values, config.threshold, origin, spacing, close_boundary=config.close_boundary
        )
    seconds["marching_cubes"] = time.perf_counter() - start
    stats: dict[str, Any] = {
        "vertices_marching_cubes": mesh.num_vertices,
        "faces_marching_cubes": mesh.num_faces,
    }

    start = time.perf_counter()
    if backend == "torch":
        device_mesh, cleanup = cleanup_mesh_torch(mesh, config, grid)
        mesh = device_mesh.to_mesh()
    else:
        mesh, cleanup = cleanup_mesh_with_stats(mesh, config, grid)
    seconds["cleanup"] = time.perf_counter() - start
    stats["faces_after_cleanup"] = mesh.num_faces
    stats["components"] = cleanup.components
    stats["components_removed"] = cleanup.components_removed
    stats["cavities_removed"] = cleanup.cavities_removed
    stats["faces_in_cavities"] = cleanup.faces_in_cavities

    if config.decimate_target is not None and not mesh.is_empty:
        start = time.perf_counter()
        mesh = decimate(mesh, config.decimate_target)
        seconds["decimate"] = time.perf_counter() - start

    stats["vertices"] = mesh.num_vertices
    stats["faces"] = mesh.num_faces
    stats["seconds"] = seconds
    stats["backend"] = backend
    logger.info(
        "mesh (%s): %d faces from marching cubes, %d after cleanup (%d of %d components removed, %d of them "
        "cavities), %d final",
        backend, stats["faces_marching_cubes"], stats["faces_after_cleanup"],
        cleanup.components_removed + cleanup.cavities_removed, cleanup.components, cleanup.cavities_removed,
        mesh.num_faces,
    )  # fmt: skip
    return mesh, stats
