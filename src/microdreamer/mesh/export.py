"""Write meshes as .glb, .obj or .ply (through trimesh), atomically."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from microdreamer.errors import InputError
from microdreamer.io_utils import atomic_path
from microdreamer.mesh.types import Mesh

logger = logging.getLogger(__name__)

MESH_FORMATS = (".glb", ".obj", ".ply")


def save_mesh(mesh: Mesh, path: str | os.PathLike) -> Path:
    """Write ``mesh`` to ``path``; the format follows the suffix (case-insensitive).

    * ``.ply``: binary little-endian PLY; vertex colours as uchar ``red green blue alpha``.
    * ``.obj``: Wavefront OBJ; vertex colours as ``v x y z r g b`` (no material file).
    * ``.glb``: binary glTF 2.0, one mesh node with an identity transform; vertex colours as
      ``COLOR_0``. glTF is y-up, as our world is, so positions are written unchanged.

    Colours are stored as 8-bit values (rounded). The file is written to a temporary name beside
    ``path`` and renamed on success, so a failure leaves neither a partial file nor a temporary one.

    Raises:
        InputError: the suffix is not .glb, .obj or .ply, or the output folder does not exist.
        ValueError: the mesh is empty.

    Returns:
        ``path`` as a :class:`~pathlib.Path`.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in MESH_FORMATS:
        given = path.suffix or "(none)"
        raise InputError(f"{path}: unsupported mesh format {given!r}; use .glb, .obj or .ply")
    if not path.parent.is_dir():
        raise InputError(f"{path}: the folder {path.parent} does not exist; create it or choose another path")
    if mesh.is_empty:
        raise ValueError(f"{path}: refusing to write an empty mesh (0 faces)")

    tm = mesh.to_trimesh()
    with atomic_path(path) as tmp:
        if suffix == ".obj":
            # no normals: trimesh would otherwise index positions and normals together
            tm.export(file_obj=str(tmp), file_type="obj", include_normals=False, include_texture=False)
        else:
            tm.export(file_obj=str(tmp), file_type=suffix[1:])
    logger.info("wrote %s (%d vertices, %d faces)", path, mesh.num_vertices, mesh.num_faces)
    return path
