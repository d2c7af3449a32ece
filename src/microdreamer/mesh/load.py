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
import re
from pathlib import Path

import numpy as np

from microdreamer.errors import InputError
from microdreamer.image_io import decode_errors, standard_image
from microdreamer.io_utils import to_uint8
from microdreamer.mesh import Mesh

logger = logging.getLogger(__name__)

MESH_SUFFIXES = (".obj", ".glb", ".gltf", ".ply", ".off", ".stl")


def load_texture_image(path: str | os.PathLike) -> np.ndarray:
    """[Ht, Wt, 3] float32 RGB in [0, 1] from an image file (alpha is dropped). InputError if unreadable."""
    from PIL import Image

    path = Path(path)
    if not path.is_file():
        raise InputError(f"texture image {path} does not exist; give the path of a PNG or JPEG file")
    try:
        with Image.open(path) as im:
            # pixels as stored (the UVs address them so; no EXIF orientation), bit depth scaled
            rgb = np.asarray(standard_image(im, path, orient=False).convert("RGB"), dtype=np.float32) / 255.0
    except InputError:
        raise
    except decode_errors() as e:
        raise InputError(f"cannot read texture image {path} ({e}); give a valid PNG or JPEG file") from None
    return rgb


def _image_to_rgb(image, path: Path, factor=None) -> np.ndarray:
    """PIL image (any mode) of the mesh file ``path`` and an optional RGBA factor -> [Ht, Wt, 3] float32."""
    rgb = np.asarray(standard_image(image, path, orient=False).convert("RGB"), dtype=np.float32) / 255.0
    if factor is not None:
        rgb = rgb * (np.asarray(factor, dtype=np.float32)[:3] / _color_scale(factor))
    return np.ascontiguousarray(rgb)


def _color_scale(color) -> float:
    """trimesh stores colours as uint8 (0..255) mostly, sometimes floats in [0, 1]."""
    arr = np.asarray(color)
    return 255.0 if arr.dtype.kind in "ui" or arr.max() > 1.0 else 1.0


def _visual_of(mesh, path: Path) -> tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None]:
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
        texture = _image_to_rgb(image, path, factor) if image is not None else None
        if texture is None and factor is not None:  # an untextured PBR material: one colour
            rgb = np.asarray(factor, dtype=np.float32)[:3] / _color_scale(factor)
            return None, None, np.tile(rgb, (len(mesh.vertices), 1))
        if uv is not None and np.shape(uv) != (len(mesh.vertices), 2):
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
            without UVs; or what it holds would render wrongly (:func:`check_mesh_text`,
            :func:`validate_geometry`: an OBJ face index 0, an ASCII PLY holding fewer or more lines than
            its header declares, vertices or texture coordinates that are not finite, face indices out
            of range, no extent or no area). Vertex colours outside 0..1 are clipped with a warning.
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
    check_mesh_text(path)
    try:
        # process=False keeps the file's vertices and faces; the OBJ reader still splits vertices at
        # UV seams (maintain_order=True would not, and would leave one UV per position)
        loaded = trimesh.load(path, process=False)
        # a scene's meshes are copied (visuals too: colours derived, images decoded) when dumped
        geometries = loaded.dump(concatenate=False) if isinstance(loaded, trimesh.Scene) else None
    except Exception as e:  # trimesh raises many kinds of errors for bad files
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise InputError(f"cannot read mesh file {path} ({msg}); check that it is a valid mesh file") from e
    if isinstance(loaded, trimesh.Scene):
        geometries = [g for g in geometries if isinstance(g, trimesh.Trimesh)]
        if not geometries:
            raise InputError(f"mesh file {path} contains no triangle mesh; give a file with faces")
        for g in geometries:  # before merging, which indexes the faces' colours
            validate_geometry(path, np.asarray(g.vertices), np.asarray(g.faces), surface=False)
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
    vertices = validate_geometry(path, vertices, faces)
    try:
        uv, tex, colors = _visual_of(mesh, path)
        face_colors = _face_colors(mesh)
    except InputError:
        raise
    except Exception as e:  # trimesh derives colours and decodes textures on first use
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise InputError(
            f"cannot read the colours or texture of mesh file {path} ({msg}); check the file and its textures"
        ) from None
    if uv is not None and not np.isfinite(np.asarray(uv, dtype=np.float64)).all():
        raise InputError(
            f"mesh file {path}: some texture coordinates (vt / TEXCOORD) are not finite; fix them"
        )
    if face_colors is not None:  # unshare vertices so each face keeps its colour
        vertices = vertices[faces].reshape(-1, 3)
        colors = np.repeat(_check_colors(path, face_colors), 3, axis=0)
        faces = np.arange(len(vertices)).reshape(-1, 3)
        return Mesh(vertices, faces, vertex_colors=colors)
    colors = _check_colors(path, colors)
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
    if tex is not None and uv is None:  # e.g. texture coordinates that do not match the vertices
        logger.warning("%s has a texture image but no usable UV coordinates; rendered without it", path)
        tex = None
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


# an OBJ face (f) line's index token that is zero (``0``, ``-0``, ``0/1``, ``1/0/2``): OBJ indices start at 1
_OBJ_ZERO_INDEX = re.compile(rb"(?m)^[ \t]*f[ \t][^\n#]*?(?<=[ \t/])[+-]?0+(?=[/ \t\r#]|$)")
#: the most lines of a PLY header read (a header is a few dozen lines)
_PLY_HEADER_LINES = 4096


def check_mesh_text(path: Path) -> None:
    """What a mesh reader would accept silently and read wrongly, checked in the file itself.

    OBJ: a face index 0 (OBJ counts from 1; trimesh would read 0 as -1, the last vertex). ASCII PLY:
    the data lines must be as many as the header's elements declare (one line each); trimesh reads
    fewer faces, or vertices, than declared without a word. Binary PLY sizes are checked by trimesh.

    Raises:
        InputError: naming the file, the line and what to do.
    """
    suffix = path.suffix.lower()
    if suffix == ".obj":
        data = path.read_bytes()
        m = _OBJ_ZERO_INDEX.search(data)
        if m is not None:
            line = data.count(b"\n", 0, m.start()) + 1
            raise InputError(
                f"mesh file {path}: the face on line {line} uses index 0, which names nothing (OBJ indices "
                "start at 1, or -1 for the last one); fix that face's indices"
            )
    elif suffix == ".ply":
        _check_ascii_ply_counts(path)


def _check_ascii_ply_counts(path: Path) -> None:
    counts: list[tuple[str, int]] = []
    with open(path, "rb") as f:
        if f.readline().strip() != b"ply":
            return  # not a PLY: trimesh says so
        ascii_format = False
        for _ in range(_PLY_HEADER_LINES):
            line = f.readline()
            if not line:
                return  # no end_header: trimesh says so
            parts = line.split()
            if parts[:1] == [b"end_header"]:
                break
            if parts[:1] == [b"format"] and len(parts) > 1:
                ascii_format = parts[1] == b"ascii"
            elif parts[:1] == [b"element"] and len(parts) == 3 and parts[2].isdigit():
                counts.append((parts[1].decode("ascii", "replace"), int(parts[2])))
        else:
            return
        if not ascii_format:
            return
        held = sum(1 for line in f if line.strip())
    declared = sum(n for _, n in counts)
    if held != declared:
        what = ", ".join(f"{n} {name}" for name, n in counts)
        raise InputError(
            f"mesh file {path}: its header declares {declared} data lines ({what}) but the file holds {held}; "
            "the file is truncated or its header is wrong, export it again"
        )


#: the largest vertex coordinate rendered: float32 squares it (distances) and 1e18^2 is far from overflow
MAX_COORDINATE = 1e18
#: the smallest size (bounding-box diagonal) rendered: its square stays above float32's normal range
MIN_EXTENT = 1e-15
#: the smallest size relative to the largest coordinate: a few hundred float32 steps across the object
MIN_RELATIVE_EXTENT = 1e-5


def validate_geometry(path: Path, vertices: np.ndarray, faces: np.ndarray, surface: bool = True):
    """Check what a mesh reader returns before anything renders or frames it.

    Args:
        path: the file, for messages.
        vertices: [V, 3] float (any precision; checked as float32, what rendering uses).
        faces: [F, 3] integer.
        surface: also check the extent, size and area (False for one part of several).

    Returns:
        vertices as [V, 3] float32.

    Raises:
        InputError: a vertex is not finite (NaN, infinite, or beyond float32's range), a face index is
            outside 0..V-1, the faces have no extent (all their corners at one point), a size or
            position rendering cannot resolve (:data:`MAX_COORDINATE`, :data:`MIN_EXTENT`,
            :data:`MIN_RELATIVE_EXTENT`) or no area (every face degenerate).
    """
    with np.errstate(over="ignore", invalid="ignore"):
        v32 = np.asarray(vertices, dtype=np.float32).reshape(-1, 3)
    bad = ~np.isfinite(v32).all(axis=1)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise InputError(
            f"mesh file {path}: {int(bad.sum())} of its {len(v32)} vertices are not finite numbers (NaN, "
            f"infinite or beyond float32's range; vertex {i} is {tuple(float(x) for x in vertices[i])}); fix "
            "or remove them"
        )
    faces = np.asarray(faces).reshape(-1, 3)
    if faces.size and (faces.min() < 0 or faces.max() >= len(v32)):
        raise InputError(
            f"mesh file {path}: its faces index vertices {int(faces.min())}..{int(faces.max())}, outside the "
            f"{len(v32)} it has; fix the face indices"
        )
    if faces.size and surface:
        corners = v32[faces].astype(np.float64)  # [F, 3, 3]
        lo, hi = corners.reshape(-1, 3).min(axis=0), corners.reshape(-1, 3).max(axis=0)
        extent = hi - lo
        if not extent.any():
            raise InputError(
                f"mesh file {path}: has no extent (every face's corners are the point "
                f"{tuple(float(x) for x in corners[0, 0])}); give a mesh with a size"
            )
        far = float(np.abs(np.concatenate([lo, hi])).max())
        size = float(np.linalg.norm(extent))
        if far > MAX_COORDINATE or size < MIN_EXTENT:
            raise InputError(
                f"mesh file {path}: its faces span {size:.3g} units with coordinates up to {far:.3g}; rendering "
                f"takes sizes of {MIN_EXTENT:g} to {MAX_COORDINATE:g} (float32 squares them), rescale the mesh"
            )
        if size < MIN_RELATIVE_EXTENT * far:
            raise InputError(
                f"mesh file {path}: its faces span {size:.3g} units {far:.3g} from the origin, below float32's "
                "resolution there; move the mesh near the origin"
            )
        area2 = np.linalg.norm(np.cross(corners[:, 1] - corners[:, 0], corners[:, 2] - corners[:, 0]), axis=1)
        if not (area2 > 0).any():
            raise InputError(
                f"mesh file {path}: every one of its {len(faces)} faces is degenerate (zero area: its corners "
                "lie on a line), so nothing would be drawn; give a mesh with surface"
            )
    return v32


def _check_colors(path: Path, colors: np.ndarray | None) -> np.ndarray | None:
    """Vertex colours finite (else InputError) and in [0, 1] (clipped, with a warning)."""
    if colors is None:
        return None
    colors = np.asarray(colors, dtype=np.float32)
    if not np.isfinite(colors).all():
        raise InputError(f"mesh file {path}: some vertex colours are not finite (NaN or infinite); fix them")
    if colors.size and (colors.min() < 0.0 or colors.max() > 1.0):
        logger.warning(
            "%s: vertex colours span %.3g..%.3g, outside 0..1; clipped", path, colors.min(), colors.max()
        )
        colors = colors.clip(0.0, 1.0)
    return colors


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
