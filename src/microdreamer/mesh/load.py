"""Loading meshes to render them: OBJ (+MTL or a texture given explicitly), GLB/glTF, PLY (and OFF, STL).

:func:`load_textured_mesh` returns a :class:`microdreamer.mesh.Mesh`: one indexed triangle mesh with at
most one texture (uint8, as the mesh stage's own meshes hold it) or vertex colours, ready for
:func:`microdreamer.render.mesh.render_mesh`.

UV convention (the OBJ one, which trimesh uses for every format): u to the right, v up; v = 0 is the
bottom row of the texture image and v = 1 the top. glTF stores v downward; trimesh flips it on load
(``v = 1 - v``), so glTF and OBJ files come out alike. Vertices are split at UV seams (trimesh does
this when it loads an OBJ with ``vt``), so ``uv`` is per vertex.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np

from microdreamer.errors import InputError
from microdreamer.io_utils import to_uint8
from microdreamer.mesh import Mesh

logger = logging.getLogger(__name__)

MESH_SUFFIXES = (".obj", ".glb", ".gltf", ".ply", ".off", ".stl")


def load_texture_image(path: str | os.PathLike) -> np.ndarray:
    """[Ht, Wt, 3] float32 RGB in [0, 1] from an image file (alpha is dropped). InputError if unreadable."""
    from PIL import Image, UnidentifiedImageError

    path = Path(path)
    if not path.is_file():
        raise InputError(f"texture image {path} does not exist; give the path of a PNG or JPEG file")
    try:
        with Image.open(path) as im:
            rgb = np.asarray(im.convert("RGB"), dtype=np.float32) / 255.0
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as e:
        raise InputError(f"cannot read texture image {path} ({e}); give a valid PNG or JPEG file") from None
    return rgb


def _image_to_rgb(image, factor=None) -> np.ndarray:
    """PIL image (any mode) and an optional RGBA factor -> [Ht, Wt, 3] float32."""
    rgb = np.asarray(image.convert("RGB"), dtype=np.float32) / 255.0
    if factor is not None:
        rgb = rgb * (np.asarray(factor, dtype=np.float32)[:3] / _color_scale(factor))
    return np.ascontiguousarray(rgb)


def _color_scale(color) -> float:
    """trimesh stores colours as uint8 (0..255) mostly, sometimes floats in [0, 1]."""
    arr = np.asarray(color)
    return 255.0 if arr.dtype.kind in "ui" or arr.max() > 1.0 else 1.0


def _visual_of(mesh) -> tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None]:
    """(uv [V, 2], texture [Ht, Wt, 3], vertex_colors [V, 3]) of one trimesh.Trimesh; None if absent."""
    visual = mesh.visual
    kind = getattr(visual, "kind", None)
    if kind == "texture":
        uv = getattr(visual, "uv", None)
        material = getattr(visual, "material", None)
        image, factor = None, None
        if material is not None:
            image = getattr(material, "baseColorTexture", None)
            factor = getattr(material, "baseColorFactor", None)
            if image is None:
                image = getattr(material, "image", None)
                factor = None
        texture = _image_to_rgb(image, factor) if image is not None else None
        if texture is None and factor is not None:  # an untextured PBR material: one colour
            rgb = np.asarray(factor, dtype=np.float32)[:3] / _color_scale(factor)
            return None, None, np.tile(rgb, (len(mesh.vertices), 1))
        if uv is not None and len(uv) != len(mesh.vertices):
            uv = None
        return uv, texture, None
    if kind == "vertex":
        colors = np.asarray(visual.vertex_colors)
        return None, None, colors[:, :3].astype(np.float32) / _color_scale(colors)
    return None, None, None


def _face_colors(mesh) -> np.ndarray | None:
    visual = mesh.visual
    if getattr(visual, "kind", None) == "face":
        colors = np.asarray(visual.face_colors)
        return colors[:, :3].astype(np.float32) / _color_scale(colors)
    return None


def load_textured_mesh(path: str | os.PathLike, texture: str | os.PathLike | None = None) -> Mesh:
    """Load a mesh file for rendering.

    Args:
        path: OBJ (its MTL's diffuse texture is used when present), GLB/glTF (base-colour texture
            times base-colour factor; every mesh of the scene, with its node transform, merged into one;
            several textures are packed by trimesh into one atlas), PLY (vertex or face colours),
            OFF or STL (geometry only).
        texture: an image to use as the texture instead of the file's own (e.g. an OBJ without MTL);
            the mesh must have UV coordinates.

    Returns:
        :class:`~microdreamer.mesh.Mesh` (texture as uint8, rounded after the base-colour factor). Face
        colours become vertex colours on unshared vertices.

    Raises:
        InputError: the file is missing, unreadable, has no faces, or ``texture`` is given for a mesh
            without UVs.
    """
    import trimesh

    path = Path(path)
    if not path.is_file():
        raise InputError(f"mesh file {path} does not exist; give the path of an OBJ, GLB or PLY file")
    if path.suffix.lower() not in MESH_SUFFIXES:
        raise InputError(
            f"mesh file {path} has an unsupported suffix {path.suffix!r}; "
            f"use one of {', '.join(MESH_SUFFIXES)}"
        )
    tex_image = load_texture_image(texture) if texture is not None else None
    check_references(path)
    try:
        # process=False keeps the file's vertices and faces; the OBJ reader still splits vertices at
        # UV seams (maintain_order=True would not, and would leave one UV per position)
        loaded = trimesh.load(path, process=False)
    except Exception as e:  # trimesh raises many kinds of errors for bad files
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise InputError(f"cannot read mesh file {path} ({msg}); check that it is a valid mesh file") from e
    if isinstance(loaded, trimesh.Scene):
        geometries = [g for g in loaded.dump(concatenate=False) if isinstance(g, trimesh.Trimesh)]
        if not geometries:
            raise InputError(f"mesh file {path} contains no triangle mesh; give a file with faces")
        mesh = geometries[0] if len(geometries) == 1 else _concatenate(geometries, path)
    elif isinstance(loaded, trimesh.Trimesh):
        mesh = loaded
    else:
        raise InputError(
            f"mesh file {path} contains no triangle mesh (a {type(loaded).__name__}); give a file with faces"
        )
    if len(mesh.faces) == 0:
        raise InputError(f"mesh file {path} has no faces; give a triangle mesh, not a point cloud")

    from PIL import Image

    try:
        return _to_mesh(mesh, path, texture, tex_image)
    except InputError:
        raise
    except (
        ValueError,
        TypeError,
        IndexError,
        OSError,
        EOFError,
        SyntaxError,
        Image.DecompressionBombError,
    ) as e:
        # trimesh decodes a texture on first use (Pillow's errors, a decompression bomb); the Mesh
        # constructor refuses indices out of range
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise InputError(f"cannot read mesh file {path} ({msg}); check the file and its textures") from None


def _to_mesh(mesh, path: Path, texture, tex_image) -> Mesh:
    """The trimesh ``mesh`` read from ``path`` as a :class:`Mesh` (``tex_image``: the texture given)."""
    vertices, faces = np.asarray(mesh.vertices), np.asarray(mesh.faces)
    face_colors = _face_colors(mesh)
    if face_colors is not None:  # unshare vertices so each face keeps its colour
        vertices = vertices[faces].reshape(-1, 3)
        colors = np.repeat(face_colors, 3, axis=0)
        faces = np.arange(len(vertices)).reshape(-1, 3)
        return Mesh(vertices, faces, vertex_colors=colors)
    uv, tex, colors = _visual_of(mesh)
    if tex is not None and path.suffix.lower() == ".obj" and not _obj_names_a_material(path):
        tex = None  # trimesh's placeholder image for an OBJ with UVs and no MTL: the mesh has no colour
    if tex_image is not None:
        if uv is None:
            raise InputError(
                f"mesh file {path} has no UV coordinates, so texture {texture} cannot be applied; "
                "give a mesh with UVs or leave out the texture"
            )
        tex = tex_image
    if uv is not None and tex is None:
        logger.warning("%s has UV coordinates but no texture image; pass texture= to use one", path)
        uv = None
    logger.info(
        "loaded %s: %d vertices, %d faces, %s",
        path,
        len(vertices),
        len(faces),
        "texture" if tex is not None else "vertex colours" if colors is not None else "no colours",
    )
    if tex is None:
        return Mesh(vertices, faces, colors)
    return Mesh(vertices, faces, colors, uv, to_uint8(tex))


#: the statements of an OBJ / MTL that name another file (the name is the statement's last word)
_OBJ_REFS = (b"mtllib",)
_MTL_REFS = (b"map_", b"bump", b"disp", b"decal", b"norm", b"refl")


def _named_files(path: Path, statements: tuple[bytes, ...]) -> list[str]:
    names = []
    with open(path, "rb") as f:
        for line in f:
            words = line.split()
            if words and words[0].lower().startswith(statements) and len(words) > 1:
                names.append(line.strip()[len(words[0]) :].strip().decode("utf-8", "replace").split()[-1])
    return names


def check_references(path: str | os.PathLike) -> None:
    """InputError when a mesh file names another file outside its own folder: an OBJ's ``mtllib``, its
    MTL's texture maps, a glTF's buffer and image ``uri``s (absolute, ``..``, a symlink out). trimesh
    would read them wherever they are; a mesh is read only with the files beside it."""
    from microdreamer.io_utils import resolve_inside

    path = Path(path)
    suffix = path.suffix.lower()
    try:
        if suffix == ".obj":
            for lib in _named_files(path, _OBJ_REFS):
                mtl = resolve_inside(path.parent, lib, "material library", path)
                if mtl.is_file():
                    for tex in _named_files(mtl, _MTL_REFS):
                        resolve_inside(path.parent, (Path(lib).parent / tex).as_posix(), "texture", mtl)
        elif suffix == ".gltf":
            import json

            data = json.loads(path.read_bytes()[: 64 << 20])
            for key in ("buffers", "images"):
                for item in data.get(key) or [] if isinstance(data, dict) else []:
                    uri = item.get("uri") if isinstance(item, dict) else None
                    if isinstance(uri, str) and not uri.startswith("data:"):
                        from urllib.parse import unquote

                        resolve_inside(path.parent, unquote(uri), "file", path)
    except (OSError, ValueError) as e:
        if isinstance(e, InputError):
            raise
        raise InputError(f"cannot read mesh file {path} ({e}); check that it is a valid mesh file") from None


def _obj_names_a_material(path: Path) -> bool:
    """Whether an OBJ file has an ``mtllib`` statement (a material library, which may hold its texture)."""
    with open(path, "rb") as f:
        for line in f:
            if line.lstrip().startswith(b"mtllib"):
                return True
    return False


def _concatenate(geometries, path: Path):
    """Merge several trimesh meshes; textures are packed into one atlas by trimesh when possible,
    otherwise colours are baked to vertices."""
    import trimesh

    try:
        return trimesh.util.concatenate(geometries)
    except Exception as e:  # texture packing can fail for unusual materials
        logger.warning(
            "%s: cannot merge the textures of %d meshes (%s); using vertex colours", path, len(geometries), e
        )
        for g in geometries:
            g.visual = g.visual.to_color()
        return trimesh.util.concatenate(geometries)
