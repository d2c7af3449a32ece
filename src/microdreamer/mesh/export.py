"""Write meshes as .glb, .obj (+ .mtl + .png when textured) or .ply, atomically."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from microdreamer.config import MESH_FORMATS
from microdreamer.errors import InputError
from microdreamer.io_utils import atomic_path, check_output_path
from microdreamer.mesh.types import Mesh

logger = logging.getLogger(__name__)


def save_mesh(mesh: Mesh, path: str | os.PathLike) -> Path:
    """Write ``mesh`` to ``path``; the format follows the suffix (case-insensitive).

    * ``.ply``: binary little-endian PLY; vertex colours as uchar ``red green blue alpha``. A textured
      mesh is written with vertex colours sampled from its texture at each vertex's UV (bilinear), and
      the copies of a vertex made at UV seams merged back into one (their colours averaged).
    * ``.obj``: Wavefront OBJ; vertex colours as ``v x y z r g b`` (no material file). A textured
      mesh writes three files: ``NAME.obj`` (``v``, ``vt``, ``f a/a b/b c/c``; ``mtllib NAME.mtl``),
      ``NAME.mtl`` (material ``material0``, ``map_Kd NAME.png``) and ``NAME.png``.
    * ``.glb``: binary glTF 2.0, one mesh node with an identity transform; vertex colours as
      ``COLOR_0``, or, when textured, ``TEXCOORD_0`` and a matte PBR material whose base-colour
      texture is the PNG, embedded in the file. glTF is y-up, as our world is, so positions are
      written unchanged; glTF's v axis points down the image, so ``TEXCOORD_0 = (u, 1 - v)``.
      Written directly by :func:`glb_bytes` (PNG with :data:`PNG_OPTIONS`); PLY and OBJ go
      through trimesh.

    Colours are stored as 8-bit values (rounded). Every file is written to a temporary name beside its
    target and renamed only once all of them are complete (for OBJ the image and material first, the
    OBJ last), so a failure leaves neither a partial file nor a temporary one.

    Raises:
        InputError: the suffix is not .glb, .obj or .ply, the output folder does not exist, or a .glb
            would pass :data:`GLB_MAX_BYTES`.
        ValueError: the mesh is empty.

    Returns:
        ``path`` as a :class:`~pathlib.Path`.
    """
    path = check_output_path(path, MESH_FORMATS, "mesh")
    suffix = path.suffix.lower()
    if mesh.is_empty:
        raise ValueError(f"{path}: refusing to write an empty mesh (0 faces)")

    if mesh.has_texture and suffix == ".obj":
        _save_textured_obj(mesh, path)
        logger.info("wrote %s (+ .mtl, .png; %d vertices, %d faces)", path, mesh.num_vertices, mesh.num_faces)
        return path
    if suffix == ".glb":
        data = glb_or_one_line(lambda: glb_bytes(mesh), path)
        with atomic_path(path) as tmp:
            tmp.write_bytes(data)
        logger.info("wrote %s (%d vertices, %d faces)", path, mesh.num_vertices, mesh.num_faces)
        return path
    if mesh.has_texture and suffix == ".ply":
        mesh = _vertex_colored(mesh)
    tm = mesh.to_trimesh()
    with atomic_path(path) as tmp:
        if suffix == ".obj":
            # no normals: trimesh would otherwise index positions and normals together
            tm.export(file_obj=str(tmp), file_type="obj", include_normals=False, include_texture=False)
        else:
            tm.export(file_obj=str(tmp), file_type="ply")
    logger.info("wrote %s (%d vertices, %d faces)", path, mesh.num_vertices, mesh.num_faces)
    return path


#: PNG compression of textures: zlib's run-length strategy (Z_RLE) after PNG's row filters. On baked
#: atlases (flat gutters, detailed charts) and painted textures it gives files within 1 % of the
#: default strategy's (level 6) at a third of the encoding time (512^2 atlas: ~30 ms instead of ~95 ms
#: on the dev CPU); smooth synthetic gradients compress worse (up to 2.5x).
PNG_OPTIONS = {"compress_level": 6, "compress_type": 3}

#: a .glb's length is a uint32 (glTF 2.0's binary header): 4 GiB at most
GLB_MAX_BYTES = 2**32 - 1

_FLOAT, _UINT8, _UINT32 = 5126, 5121, 5125  # glTF component types
_ARRAY_BUFFER, _ELEMENT_ARRAY_BUFFER = 34962, 34963


def png_bytes(image: np.ndarray) -> bytes:
    """[H, W, 3] uint8 RGB -> PNG file bytes (lossless; :data:`PNG_OPTIONS`)."""
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(image, dtype=np.uint8)).save(buffer, format="PNG", **PNG_OPTIONS)
    return buffer.getvalue()


class GlbTooLarge(ValueError):
    """The meshes would make a .glb longer than :data:`GLB_MAX_BYTES`."""


def glb_or_one_line(make, path: str | os.PathLike) -> bytes:
    """``make()``'s .glb bytes for the file ``path``; :class:`GlbTooLarge` as one InputError line naming
    ``path``, with what to do."""
    try:
        return make()
    except GlbTooLarge as e:
        raise InputError(f"{path}: {e}; write OUT.ply (no such limit), or mesh it coarser (a larger --voxel, "
                         "or --max-faces)") from None  # fmt: skip


def glb_bytes(mesh: Mesh) -> bytes:
    """The binary glTF 2.0 file of ``mesh`` (see :func:`save_mesh`): :func:`glb_nodes_bytes` of the one
    mesh, named ``"mesh"``."""
    return glb_nodes_bytes([mesh], ["mesh"])


def glb_nodes_bytes(meshes: Sequence[Mesh], names: Sequence[str] | None = None) -> bytes:
    """The binary glTF 2.0 file of several meshes, each its own node, written directly with NumPy.

    One scene whose nodes are the meshes, in order (no transforms: the meshes are in one frame). Each
    node has its own mesh with one triangle primitive: ``POSITION`` (float32, with its bounds), uint32
    indices, and ``TEXCOORD_0`` ((u, 1 - v), float32) with its own matte PBR material (``material<i>``,
    ``i`` counting the textured meshes) whose base-colour texture is its embedded PNG, or ``COLOR_0``
    (normalised uint8 RGBA, alpha 255) for vertex colours.

    Args:
        meshes: the meshes, none empty.
        names: a name for each node and its mesh (default ``mesh<i>``).
    """
    import json
    import struct

    if not meshes:
        raise ValueError("a glTF file needs at least one mesh")
    names = [f"mesh{i}" for i in range(len(meshes))] if names is None else list(names)
    if len(names) != len(meshes):
        raise ValueError(f"{len(names)} names for {len(meshes)} meshes")
    chunks: list[bytes] = []
    views: list[dict] = []
    offset = 0

    def add_view(data: bytes, target: int | None) -> int:
        nonlocal offset
        view = {"buffer": 0, "byteOffset": offset, "byteLength": len(data)}
        if target is not None:
            view["target"] = target
        views.append(view)
        pad = (-len(data)) % 4  # every view starts on a 4-byte boundary
        chunks.append(data + b"\0" * pad)
        offset += len(data) + pad
        return len(views) - 1

    accessors: list[dict] = []
    images: list[dict] = []
    materials: list[dict] = []
    gltf_meshes: list[dict] = []
    for mesh, name in zip(meshes, names, strict=True):
        if mesh.is_empty:
            raise ValueError(f"{name}: refusing to write an empty mesh (0 faces)")
        vertices = np.ascontiguousarray(mesh.vertices, dtype=np.float32)
        indices = np.ascontiguousarray(mesh.faces, dtype=np.uint32).reshape(-1)
        first = len(accessors)
        accessors += [
            {"bufferView": add_view(indices.tobytes(), _ELEMENT_ARRAY_BUFFER), "componentType": _UINT32,
             "count": int(indices.size), "type": "SCALAR"},
            {"bufferView": add_view(vertices.tobytes(), _ARRAY_BUFFER), "componentType": _FLOAT,
             "count": mesh.num_vertices, "type": "VEC3",
             "min": [float(vertices[:, a].min()) for a in range(3)],
             "max": [float(vertices[:, a].max()) for a in range(3)]},
        ]  # fmt: skip
        primitive: dict = {"attributes": {"POSITION": first + 1}, "indices": first, "mode": 4}
        if mesh.has_texture:
            texcoord = np.empty((mesh.num_vertices, 2), np.float32)
            texcoord[:, 0] = mesh.uv[:, 0]
            texcoord[:, 1] = 1.0 - mesh.uv[:, 1].astype(np.float64)  # glTF's v points down the image
            accessors.append({"bufferView": add_view(texcoord.tobytes(), _ARRAY_BUFFER), "componentType": _FLOAT,
                              "count": mesh.num_vertices, "type": "VEC2"})  # fmt: skip
            primitive["attributes"]["TEXCOORD_0"] = len(accessors) - 1
            primitive["material"] = len(materials)
            images.append({"bufferView": add_view(png_bytes(mesh.texture), None), "mimeType": "image/png"})
            materials.append({"name": f"material{len(materials)}", "doubleSided": False, "pbrMetallicRoughness": {
                "baseColorTexture": {"index": len(images) - 1}, "metallicFactor": 0.0, "roughnessFactor": 1.0}})  # fmt: skip
        elif mesh.vertex_colors is not None:
            rgba = np.full((mesh.num_vertices, 4), 255, np.uint8)
            rgba[:, :3] = np.round(np.clip(mesh.vertex_colors, 0.0, 1.0) * 255.0)
            accessors.append({"bufferView": add_view(rgba.tobytes(), _ARRAY_BUFFER), "componentType": _UINT8,
                              "normalized": True, "count": mesh.num_vertices, "type": "VEC4"})  # fmt: skip
            primitive["attributes"]["COLOR_0"] = len(accessors) - 1
        gltf_meshes.append({"name": name, "primitives": [primitive]})
    doc: dict = {"asset": {"version": "2.0", "generator": "microdreamer"}}
    if images:
        doc["images"] = images
        doc["textures"] = [{"source": i} for i in range(len(images))]
        doc["materials"] = materials
    doc.update(
        scene=0,
        scenes=[{"nodes": list(range(len(meshes)))}],
        nodes=[{"name": name, "mesh": i} for i, name in enumerate(names)],
        meshes=gltf_meshes,
        accessors=accessors,
        bufferViews=views,
        buffers=[{"byteLength": offset}],
    )
    text = json.dumps(doc, separators=(",", ":")).encode("utf-8")
    text += b" " * ((-len(text)) % 4)
    total = 12 + 8 + len(text) + 8 + offset
    if total > GLB_MAX_BYTES:
        raise GlbTooLarge(
            f"{sum(m.num_faces for m in meshes):,} faces need a {total / 2**30:.2f} GiB .glb, and a .glb holds "
            "at most 4 GiB"
        )
    binary = b"".join(chunks)
    header = struct.pack("<4sII", b"glTF", 2, total)
    return b"".join(
        [
            header,
            struct.pack("<I4s", len(text), b"JSON"),
            text,
            struct.pack("<I4s", len(binary), b"BIN\0"),
            binary,
        ]
    )


def save_glb_nodes(
    meshes: Sequence[Mesh], path: str | os.PathLike, names: Sequence[str] | None = None
) -> Path:
    """Write ``meshes`` as one .glb, one node each (:func:`glb_nodes_bytes`), atomically.

    Raises:
        InputError: the suffix is not .glb, the output folder does not exist, or the file would pass
            :data:`GLB_MAX_BYTES`.
        ValueError: no mesh, or an empty one.
    """
    path = check_output_path(path, (".glb",), "mesh")
    data = glb_or_one_line(lambda: glb_nodes_bytes(meshes, names), path)
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    logger.info("wrote %s (%d nodes, %d faces)", path, len(meshes), sum(m.num_faces for m in meshes))
    return path


def _vertex_colored(mesh: Mesh) -> Mesh:
    """A textured mesh as a vertex-coloured one: texture sampled at the vertices, seam copies merged."""
    colors = mesh.colors_at_vertices()
    _, first, inverse = np.unique(mesh.vertices, axis=0, return_index=True, return_inverse=True)
    inverse = inverse.reshape(-1)
    # keep the order of first appearance, so an unsplit mesh keeps its vertex order
    order = np.argsort(first, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    new_index = rank[inverse]
    count = np.bincount(new_index, minlength=order.size).astype(np.float64)
    merged = np.zeros((order.size, 3), np.float64)
    np.add.at(merged, new_index, colors)
    merged /= count[:, None]
    return Mesh(mesh.vertices[first[order]], new_index[mesh.faces], merged.astype(np.float32))


def _save_textured_obj(mesh: Mesh, path: Path) -> None:
    """OBJ + MTL + PNG beside each other, all three renamed into place only after all are written."""
    from PIL import Image

    mtl_path, png_path = path.with_suffix(".mtl"), path.with_suffix(".png")
    with contextlib.ExitStack() as stack:
        # entered first = renamed last: the OBJ appears only after its material and image
        tmp_obj = stack.enter_context(atomic_path(path))
        tmp_mtl = stack.enter_context(atomic_path(mtl_path))
        tmp_png = stack.enter_context(atomic_path(png_path))
        Image.fromarray(mesh.texture, mode="RGB").save(tmp_png, format="PNG")
        tmp_mtl.write_text(
            "# microdreamer\nnewmtl material0\nKa 1 1 1\nKd 1 1 1\nKs 0 0 0\nd 1\nillum 1\n"
            f"map_Kd {png_path.name}\n"
        )
        with open(tmp_obj, "w") as f:
            f.write(f"# microdreamer\nmtllib {mtl_path.name}\n")
            np.savetxt(f, mesh.vertices, fmt="v %.9g %.9g %.9g")
            np.savetxt(f, mesh.uv, fmt="vt %.9g %.9g")
            f.write("usemtl material0\n")
            idx = mesh.faces + 1
            np.savetxt(f, np.repeat(idx, 2, axis=1), fmt="f %d/%d %d/%d %d/%d")
