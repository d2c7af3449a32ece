"""glTF 2.0 splats (``KHR_gaussian_splatting``: CesiumJS, Babylon.js, three.js, PlayCanvas), read and
written, as ``.glb`` or ``.gltf``.

A splat is a ``POINTS`` primitive carrying the ``KHR_gaussian_splatting`` extension, with the attributes
``POSITION``, ``KHR_gaussian_splatting:ROTATION`` (x y z w), ``:SCALE`` (linear; older writers, among
them splat-transform before mid-2026, stored log-scales: a negative scale tells them apart),
``:OPACITY`` (a fraction), ``:SH_DEGREE_0_COEF_0`` (f_dc; ``COLOR_0`` when it is absent) and
``:SH_DEGREE_l_COEF_n`` (RGB of SH coefficient n of band l). Quantised accessors (normalised bytes and
shorts) are read. With ``KHR_gaussian_splatting_compression_spz_2`` inside the extension, the Gaussians
come from the SPZ blob its ``bufferView`` names (:mod:`microdreamer.formats.spz`).

glTF's frame is LUF (x left, y up, z forward); the reader turns every splat primitive into the PLY frame
(180 degrees about z) after the transforms of the nodes that place it, and the writer turns it back, as
splat-transform does; so a PLY converted to ``.glb`` and read again lands where it started.

Why our own code: ``pygltflib`` parses the JSON but knows nothing of the extension's attributes or
quantised accessors, and 150 lines of NumPy read the accessors directly.

Quantisation (what the tests allow): none for float accessors (the base colour of ``COLOR_0``, only a
fallback, is 1/255); through SPZ, SPZ's.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import struct
from pathlib import Path

import numpy as np

from microdreamer.errors import InputError
from microdreamer.formats.common import (
    FLIP_LUF,
    SH_C0,
    SplatArrays,
    finish,
    logit,
    normalized_quats,
    read_file,
    sigmoid,
    transform_arrays,
)

logger = logging.getLogger(__name__)

EXT = "KHR_gaussian_splatting"
SPZ_EXT = "KHR_gaussian_splatting_compression_spz_2"
_OLD_SPZ_EXTS = ("KHR_spz_gaussian_splats_compression", "KHR_spz_compression")
_COMPONENTS = {5120: "i1", 5121: "u1", 5122: "<i2", 5123: "<u2", 5125: "<u4", 5126: "<f4"}
_WIDTH = {"SCALAR": 1, "VEC2": 2, "VEC3": 3, "VEC4": 4, "MAT4": 16}
_GLB_MAGIC, _JSON, _BIN = 0x46546C67, 0x4E4F534A, 0x004E4942
_BANDS = {1: 3, 2: 5, 3: 7}


def is_splat(path: str | os.PathLike) -> bool:
    """True when the glTF at ``path`` declares ``KHR_gaussian_splatting`` (a mesh glTF is False)."""
    try:
        doc, _ = _parse(Path(path), str(path), header_only=True)
    except (InputError, OSError):
        return False
    return EXT in (doc.get("extensionsUsed") or [])


def _parse(path: Path, name: str, header_only: bool = False) -> tuple[dict, bytes | None]:
    """(the JSON document, the GLB's binary chunk or None)."""
    if header_only:
        with open(path, "rb") as f:
            data = f.read(20)
            if data[:4] == b"glTF" and len(data) == 20:
                (json_len,) = struct.unpack("<I", data[12:16])
                if json_len > 64 << 20:
                    raise InputError(f"{name}: GLB JSON chunk of {json_len} bytes")
                data += f.read(json_len)
            elif path.stat().st_size <= 64 << 20:
                data += f.read()
            else:
                raise InputError(f"{name}: too large a .gltf JSON")
    else:
        data = read_file(path, "glTF splat")
    if data[:4] == b"glTF":
        if len(data) < 20:
            raise InputError(f"{name}: truncated GLB ({len(data)} bytes)")
        _, version, length = struct.unpack("<III", data[:12])
        if version != 2:
            raise InputError(f"{name}: GLB version {version}; this reads glTF 2.0")
        json_len, json_type = struct.unpack("<II", data[12:20])
        if json_type != _JSON or 20 + json_len > len(data):
            raise InputError(f"{name}: truncated or malformed GLB: its JSON chunk does not fit the file")
        doc_bytes = data[20 : 20 + json_len]
        binary = None
        at = 20 + json_len
        if not header_only and at + 8 <= len(data):
            bin_len, bin_type = struct.unpack("<II", data[at : at + 8])
            if bin_type == _BIN:
                if at + 8 + bin_len > len(data):
                    raise InputError(
                        f"{name}: truncated GLB: its binary chunk declares {bin_len} bytes, the file holds "
                        f"{len(data) - at - 8}; export it again"
                    )
                binary = data[at + 8 : at + 8 + bin_len]
    else:
        doc_bytes, binary = data, None
    try:
        doc = json.loads(doc_bytes)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InputError(f"{name}: not a glTF file (its JSON does not parse: {e})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("asset"), dict):
        raise InputError(f"{name}: not a glTF file (no 'asset' object)")
    return doc, binary


class _Buffers:
    """The bytes of buffers, buffer views and accessors, every offset checked against what exists."""

    def __init__(self, doc: dict, binary: bytes | None, folder: Path, name: str):
        self.doc, self.binary, self.folder, self.name = doc, binary, folder, name
        self._cache: dict[int, bytes] = {}

    def _list(self, key: str) -> list:
        v = self.doc.get(key) or []
        if not isinstance(v, list):
            raise InputError(f"{self.name}: glTF '{key}' is not a list")
        return v

    def _item(self, key: str, index) -> dict:
        items = self._list(key)
        if not isinstance(index, int) or not 0 <= index < len(items) or not isinstance(items[index], dict):
            raise InputError(f"{self.name}: glTF names {key}[{index!r}], which does not exist")
        return items[index]

    def buffer(self, index: int) -> bytes:
        if isinstance(index, int) and index in self._cache:
            return self._cache[index]
        buf = self._item("buffers", index)
        uri = buf.get("uri")
        if uri is None:
            if self.binary is None or index != 0:
                raise InputError(f"{self.name}: buffer {index} has no uri and there is no GLB binary chunk")
            data = self.binary
        elif isinstance(uri, str) and uri.startswith("data:"):
            try:
                data = base64.b64decode(uri.split(",", 1)[1], validate=True)
            except (IndexError, ValueError):
                raise InputError(f"{self.name}: buffer {index}'s data URI is not base64") from None
        elif isinstance(uri, str):
            from urllib.parse import unquote

            target = (self.folder / unquote(uri)).resolve()
            if self.folder.resolve() not in target.parents or not target.is_file():
                raise InputError(f"{self.name}: buffer {index}'s file {uri!r} is not a file beside the glTF")
            data = target.read_bytes()
        else:
            raise InputError(f"{self.name}: buffer {index}'s uri is not a string")
        length = buf.get("byteLength")
        if not isinstance(length, int) or length > len(data):
            raise InputError(
                f"{self.name}: buffer {index} declares {length!r} bytes but holds {len(data)}; the file is "
                "truncated or corrupt"
            )
        self._cache[index] = data[:length]
        return self._cache[index]

    def view(self, index: int) -> tuple[bytes, int, int, int]:
        """(buffer bytes, offset, length, stride or 0) of buffer view ``index``."""
        v = self._item("bufferViews", index)
        data = self.buffer(v.get("buffer"))
        offset, length = v.get("byteOffset", 0), v.get("byteLength")
        if (
            not isinstance(offset, int)
            or not isinstance(length, int)
            or offset < 0
            or offset + length > len(data)
        ):
            raise InputError(f"{self.name}: bufferView {index} runs past its buffer; the file is truncated")
        stride = v.get("byteStride", 0) or 0
        if not isinstance(stride, int) or stride < 0:
            raise InputError(
                f"{self.name}: bufferView {index} has byteStride {stride!r}; the file is corrupt"
            )
        return data, offset, length, stride

    def accessor(self, index: int, width: int | None = None) -> np.ndarray:
        """[count, width] float64 values of accessor ``index`` (normalised integers as fractions)."""
        acc = self._item("accessors", index)
        comp, kind, count = acc.get("componentType"), acc.get("type"), acc.get("count")
        known = isinstance(comp, int) and comp in _COMPONENTS and isinstance(kind, str) and kind in _WIDTH
        if not known or not isinstance(count, int) or count < 0:
            raise InputError(
                f"{self.name}: accessor {index} has an unknown type ({comp!r}, {kind!r}, {count!r})"
            )
        w = _WIDTH[kind]
        if width is not None and w != width:
            raise InputError(f"{self.name}: accessor {index} is {kind}, expected {width} components")
        if "sparse" in acc:
            raise InputError(f"{self.name}: accessor {index} is sparse; sparse splat attributes are not read")
        dtype = np.dtype(_COMPONENTS[comp])
        if "bufferView" not in acc:
            return np.zeros((count, w))
        data, offset, length, stride = self.view(acc["bufferView"])
        start = acc.get("byteOffset", 0)
        elem = dtype.itemsize * w
        stride = stride or elem
        if (
            not isinstance(start, int)
            or start < 0
            or (count and start + stride * (count - 1) + elem > length)
        ):
            raise InputError(
                f"{self.name}: accessor {index} ({count} x {kind}) runs past its bufferView; the file is "
                "truncated or corrupt"
            )
        if count == 0:
            return np.zeros((0, w))
        raw = np.ndarray(
            (count, w), dtype, buffer=data, offset=offset + start, strides=(stride, dtype.itemsize)
        )
        out = raw.astype(np.float64)
        if acc.get("normalized") and dtype.kind in "iu":
            top = float(np.iinfo(dtype).max)
            out = np.maximum(out / top, -1.0) if dtype.kind == "i" else out / top
        return out


def _node_matrix(node: dict) -> np.ndarray:
    if "matrix" in node:
        m = np.asarray(node["matrix"], np.float64)
        return m.reshape(4, 4).T  # column-major
    t = np.asarray(node.get("translation", [0, 0, 0]), np.float64)
    x, y, z, w = np.asarray(node.get("rotation", [0, 0, 0, 1]), np.float64)
    s = np.asarray(node.get("scale", [1, 1, 1]), np.float64)
    R = np.array([
        [1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
        [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
        [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)],
    ])  # fmt: skip
    m = np.eye(4)
    m[:3, :3] = R * s[None, :]
    m[:3, 3] = t
    return m


def _placements(doc: dict, name: str) -> list[tuple[int, np.ndarray]]:
    """(mesh index, world matrix) of every node that shows a mesh, in the default scene (or every root)."""
    nodes = doc.get("nodes") or []
    scenes = doc.get("scenes") or []
    scene = doc.get("scene", 0)
    if scenes and isinstance(scene, int) and 0 <= scene < len(scenes):
        roots = scenes[scene].get("nodes") or []
    else:
        children = {c for n in nodes if isinstance(n, dict) for c in n.get("children", [])}
        roots = [i for i in range(len(nodes)) if i not in children]
    out: list[tuple[int, np.ndarray]] = []
    stack = [(r, np.eye(4), 0) for r in roots]
    while stack:
        i, parent, depth = stack.pop()
        if not isinstance(i, int) or not 0 <= i < len(nodes) or depth > 64:
            raise InputError(f"{name}: glTF node {i!r} does not exist, or the node tree loops")
        node = nodes[i]
        try:
            world = parent @ _node_matrix(node)
        except (ValueError, TypeError):
            raise InputError(f"{name}: glTF node {i} has a malformed transform") from None
        if isinstance(node.get("mesh"), int):
            out.append((node["mesh"], world))
        stack += [(c, world, depth + 1) for c in node.get("children", [])]
    return out


def read(path: str | os.PathLike, progress=None) -> SplatArrays:
    """Read the Gaussians of every ``KHR_gaussian_splatting`` primitive of a glTF (``.glb``/``.gltf``)
    into PLY-frame :class:`SplatArrays`, each placed by its nodes' transforms."""
    path = Path(path)
    name = str(path)
    doc, binary = _parse(path, name)
    buffers = _Buffers(doc, binary, path.parent, name)
    meshes = doc.get("meshes") or []
    placements = _placements(doc, name) or [(i, np.eye(4)) for i in range(len(meshes))]
    parts: list[SplatArrays] = []
    for mesh_index, world in placements:
        if not isinstance(mesh_index, int) or not 0 <= mesh_index < len(meshes):
            raise InputError(f"{name}: a node shows mesh {mesh_index!r}, which does not exist")
        for prim in meshes[mesh_index].get("primitives") or []:
            ext = (prim.get("extensions") or {}).get(EXT)
            old = next((e for e in _OLD_SPZ_EXTS if e in (prim.get("extensions") or {})), None)
            if ext is None and old is None:
                continue
            part = _primitive(prim, ext or {}, old, buffers, name)
            parts.append(_place(part, world, name))
    if not parts:
        raise InputError(f"{name}: the glTF holds no {EXT} primitive; it is a mesh, not a splat")
    degree = min(p.sh_degree for p in parts)
    parts = [p.with_degree(degree) for p in parts]
    return SplatArrays(*[np.concatenate([getattr(p, f) for p in parts]) for f in (
        "means", "sh_dc", "sh_rest", "opacity_logits", "log_scales", "quats")])  # fmt: skip


def _place(arrays: SplatArrays, world: np.ndarray, name: str) -> SplatArrays:
    """A primitive's PLY-frame Gaussians placed by its node's world matrix (given in glTF's frame)."""
    if np.allclose(world, np.eye(4)):
        return arrays
    A = world[:3, :3]
    s = np.cbrt(abs(np.linalg.det(A)))
    if s == 0 or not np.allclose(A.T @ A, s * s * np.eye(3), atol=1e-5 * s * s):
        raise InputError(
            f"{name}: a splat's node has a non-uniform scale or shear; Gaussians cannot follow it"
        )
    M_ply = FLIP_LUF @ (A / s) @ FLIP_LUF  # the node's map in the PLY frame
    return transform_arrays(arrays, M_ply, s, FLIP_LUF @ world[:3, 3])


def _primitive(prim: dict, ext: dict, old: str | None, buffers: _Buffers, name: str) -> SplatArrays:
    spz_ext = (ext.get("extensions") or {}).get(SPZ_EXT)
    if old is not None:
        spz_ext = prim["extensions"][old]
    if spz_ext is not None:
        from microdreamer.formats import spz

        data, offset, length, _ = buffers.view(spz_ext.get("bufferView"))
        # SPZ in glTF is packed from LUF and unpacked to LUF; our decoder unpacks RUB to RDF, which is
        # the same map composed with LUF -> RDF: its result is already in the PLY frame
        return spz.decode(bytes(data[offset : offset + length]), name)
    if prim.get("mode", 4) != 0:
        logger.warning(
            "%s: a %s primitive of mode %s (not POINTS); read as points", name, EXT, prim.get("mode")
        )
    attrs = prim.get("attributes") or {}

    def get(key: str, width: int, required: bool = True) -> np.ndarray | None:
        if key not in attrs:
            if required:
                raise InputError(f"{name}: a {EXT} primitive has no {key} attribute; the file is incomplete")
            return None
        return buffers.accessor(attrs[key], width)

    means = get("POSITION", 3)
    n = len(means)
    xyzw = get(f"{EXT}:ROTATION", 4)
    scale = get(f"{EXT}:SCALE", 3)
    opacity = get(f"{EXT}:OPACITY", 1, required=False)
    dc = get(f"{EXT}:SH_DEGREE_0_COEF_0", 3, required=False)
    color = None
    if "COLOR_0" in attrs:
        acc = buffers._item("accessors", attrs["COLOR_0"])
        kind = acc.get("type")
        color = buffers.accessor(attrs["COLOR_0"], _WIDTH.get(kind, 4) if isinstance(kind, str) else 4)
    if dc is None:
        if color is None:
            raise InputError(f"{name}: a {EXT} primitive has neither SH_DEGREE_0_COEF_0 nor COLOR_0")
        dc = (color[:, :3] - 0.5) / SH_C0
    if opacity is None:
        if color is None or color.shape[1] < 4:
            raise InputError(f"{name}: a {EXT} primitive has no OPACITY attribute (nor an alpha in COLOR_0)")
        opacity = color[:, 3:4]
    for key, arr in (("ROTATION", xyzw), ("SCALE", scale), ("OPACITY", opacity), ("SH_DEGREE_0_COEF_0", dc)):
        if len(arr) != n:
            raise InputError(
                f"{name}: {EXT}:{key} has {len(arr)} values for {n} positions; the file is corrupt"
            )
    with np.errstate(invalid="ignore"):
        negative = bool((scale < 0).any())
    if negative:
        logger.warning(
            "%s: negative %s:SCALE values: read as log-scales (an older writer's layout)", name, EXT
        )
        log_scales = scale
    else:
        with np.errstate(divide="ignore"):
            log_scales = np.log(np.maximum(scale, 1e-38))
    rest = []
    for band in (1, 2, 3):
        keys = [f"{EXT}:SH_DEGREE_{band}_COEF_{c}" for c in range(_BANDS[band])]
        present = [k in attrs for k in keys]
        if not any(present):
            break
        if not all(present):
            raise InputError(
                f"{name}: SH band {band} is partly defined; every coefficient of a band is needed"
            )
        coeffs = [get(k, 3) for k in keys]
        if any(len(c) != n for c in coeffs):
            raise InputError(f"{name}: SH band {band} has the wrong number of values; the file is corrupt")
        rest += coeffs
    sh_rest = np.stack(rest, 1) if rest else np.zeros((n, 0, 3))
    arrays = finish(name, means, dc, sh_rest, logit(opacity[:, 0]), log_scales, xyzw[:, [3, 0, 1, 2]])
    return transform_arrays(arrays, FLIP_LUF)


def _pad4(b: bytes, fill: bytes = b"\0") -> bytes:
    return b + fill * (-len(b) % 4)


def encode(arrays: SplatArrays, compress_spz: bool = False) -> bytes:
    """GLB bytes of ``arrays`` as one ``KHR_gaussian_splatting`` POINTS primitive (in glTF's frame).

    Args:
        arrays: the splat.
        compress_spz: store the Gaussians as an SPZ blob (``KHR_gaussian_splatting_compression_spz_2``,
            SPZ version 3, the version its spec names) instead of float accessors.
    """
    g = transform_arrays(arrays, FLIP_LUF)
    n, k1 = len(g), g.sh_rest.shape[1]
    lo, hi = g.means.min(0).tolist(), g.means.max(0).tolist()
    segments: list[tuple[str, np.ndarray | None, int, str, bool]] = []  # name, data, component, type, norm
    rgb = np.clip(np.round((g.sh_dc * SH_C0 + 0.5) * 255), 0, 255)
    alpha = np.clip(np.round(sigmoid(g.opacity_logits) * 255), 0, 255)[:, None]
    segments.append(("POSITION", g.means.astype("<f4"), 5126, "VEC3", False))
    segments.append(("COLOR_0", np.concatenate([rgb, alpha], 1).astype(np.uint8), 5121, "VEC4", True))
    segments.append(
        (f"{EXT}:ROTATION", normalized_quats(g.quats)[:, [1, 2, 3, 0]].astype("<f4"), 5126, "VEC4", False)
    )
    segments.append(
        (f"{EXT}:SCALE", np.exp(g.log_scales.astype(np.float64)).astype("<f4"), 5126, "VEC3", False)
    )
    segments.append(
        (f"{EXT}:OPACITY", sigmoid(g.opacity_logits).astype("<f4")[:, None], 5126, "SCALAR", False)
    )
    segments.append((f"{EXT}:SH_DEGREE_0_COEF_0", g.sh_dc.astype("<f4"), 5126, "VEC3", False))
    at = 0
    for band in (1, 2, 3):
        for c in range(_BANDS.get(band, 0)):
            if at + c >= k1:
                break
            segments.append(
                (f"{EXT}:SH_DEGREE_{band}_COEF_{c}", g.sh_rest[:, at + c].astype("<f4"), 5126, "VEC3", False)
            )
        at += _BANDS[band]
        if at >= k1:
            break
    blob = b""
    views, accessors, attributes = [], [], {}
    spz_view = None
    if compress_spz:
        from microdreamer.formats import spz

        data = spz.encode(arrays, version=3)
        views.append({"buffer": 0, "byteOffset": 0, "byteLength": len(data)})
        spz_view = 0
        blob = _pad4(data)
    for key, data, comp, kind, norm in segments:
        acc: dict = {"componentType": comp, "count": n, "type": kind}
        if not compress_spz:
            raw = np.ascontiguousarray(data).tobytes()
            acc["bufferView"] = len(views)
            views.append({"buffer": 0, "byteOffset": len(blob), "byteLength": len(raw), "target": 34962})
            blob = _pad4(blob + raw)
        if norm:
            acc["normalized"] = True
        if key == "POSITION":
            acc["min"], acc["max"] = lo, hi
        attributes[key] = len(accessors)
        accessors.append(acc)
    ext: dict = {"kernel": "ellipse", "colorSpace": "srgb_rec709_display", "projection": "perspective",
                 "sortingMethod": "cameraDistance"}  # fmt: skip
    used = [EXT]
    doc: dict = {"asset": {"version": "2.0", "generator": "microdreamer"}}
    if compress_spz:
        ext["extensions"] = {SPZ_EXT: {"bufferView": spz_view}}
        used.append(SPZ_EXT)
        doc["extensionsRequired"] = [SPZ_EXT]
    doc.update({
        "extensionsUsed": used,
        "scene": 0, "scenes": [{"nodes": [0]}], "nodes": [{"mesh": 0}],
        "meshes": [{"primitives": [{"attributes": attributes, "mode": 0, "extensions": {EXT: ext}}]}],
        "buffers": [{"byteLength": len(blob)}], "bufferViews": views, "accessors": accessors,
    })  # fmt: skip
    js = _pad4(json.dumps(doc, separators=(",", ":")).encode(), b" ")
    total = 12 + 8 + len(js) + 8 + len(blob)
    return (
        struct.pack("<III", _GLB_MAGIC, 2, total)
        + struct.pack("<II", len(js), _JSON)
        + js
        + struct.pack("<II", len(blob), _BIN)
        + blob
    )


def write(arrays: SplatArrays, path: str | os.PathLike, compress_spz: bool = False) -> Path:
    """Write ``arrays`` as a ``.glb`` (or, for a ``.gltf`` path, JSON with the buffer embedded as a data
    URI), atomically."""
    from microdreamer.io_utils import atomic_path

    path = Path(path)
    glb = encode(arrays, compress_spz)
    if path.suffix.lower() == ".gltf":
        (json_len,) = struct.unpack("<I", glb[12:16])
        doc = json.loads(glb[20 : 20 + json_len])
        blob = glb[28 + json_len :]
        doc["buffers"][0]["uri"] = "data:application/octet-stream;base64," + base64.b64encode(blob).decode()
        out = json.dumps(doc).encode()
    else:
        out = glb
    with atomic_path(path) as tmp:
        tmp.write_bytes(out)
    return path


def _glb_parts(glb: bytes, name: str) -> tuple[dict, bytes]:
    """(JSON document, BIN chunk or b"") of GLB bytes."""
    if glb[:4] != b"glTF" or len(glb) < 20:
        raise InputError(f"{name}: not a GLB file")
    (json_len,) = struct.unpack("<I", glb[12:16])
    doc = json.loads(glb[20 : 20 + json_len])
    at = 20 + json_len
    blob = b""
    if at + 8 <= len(glb):
        blob_len, kind = struct.unpack("<II", glb[at : at + 8])
        if kind == _BIN:
            blob = glb[at + 8 : at + 8 + blob_len]
    return doc, blob


def add_splat(mesh_glb: bytes, arrays: SplatArrays, name: str = "mesh.glb") -> bytes:
    """GLB bytes holding the mesh GLB ``mesh_glb`` (one buffer, its scene's nodes) and the splat
    ``arrays`` as one more node: a ``KHR_gaussian_splatting`` POINTS primitive laid out as :func:`encode`
    writes it (splat-transform's own ``.glb`` layout), its float accessors after the mesh's data in the
    one buffer.

    Args:
        mesh_glb: a GLB of one buffer (what :func:`microdreamer.mesh.save_mesh` writes).
        arrays: the splat in the PLY frame (:func:`encode` turns it into glTF's); to place it where the
            mesh's vertices are, pass it mapped by ``FLIP_LUF`` from the mesh's coordinates.
    """
    doc, blob = _glb_parts(mesh_glb, name)
    splat_doc, splat_blob = _glb_parts(encode(arrays), "splat")
    if len(doc.get("buffers", [])) > 1:
        raise InputError(
            f"{name}: a GLB of {len(doc['buffers'])} buffers; the splat is added to one-buffer GLBs"
        )
    base = len(_pad4(blob))
    views, accessors = doc.setdefault("bufferViews", []), doc.setdefault("accessors", [])
    view0, acc0 = len(views), len(accessors)
    for v in splat_doc["bufferViews"]:
        views.append({**v, "byteOffset": v.get("byteOffset", 0) + base})
    for a in splat_doc["accessors"]:
        accessors.append({**a, **({"bufferView": a["bufferView"] + view0} if "bufferView" in a else {})})
    prim = splat_doc["meshes"][0]["primitives"][0]
    prim["attributes"] = {k: v + acc0 for k, v in prim["attributes"].items()}
    meshes, nodes = doc.setdefault("meshes", []), doc.setdefault("nodes", [])
    meshes.append({"name": "splat", "primitives": [prim]})
    nodes.append({"name": "splat", "mesh": len(meshes) - 1})
    scenes = doc.setdefault("scenes", [{"nodes": []}])
    scenes[doc.get("scene", 0)].setdefault("nodes", []).append(len(nodes) - 1)
    doc.setdefault("scene", 0)
    used = doc.setdefault("extensionsUsed", [])
    used += [e for e in splat_doc["extensionsUsed"] if e not in used]
    blob = _pad4(blob) + splat_blob
    doc["buffers"] = [{**(doc.get("buffers") or [{}])[0], "byteLength": len(blob)}]
    doc["buffers"][0].pop("uri", None)
    js = _pad4(json.dumps(doc, separators=(",", ":")).encode(), b" ")
    return (
        struct.pack("<III", _GLB_MAGIC, 2, 12 + 8 + len(js) + 8 + len(blob))
        + struct.pack("<II", len(js), _JSON)
        + js
        + struct.pack("<II", len(blob), _BIN)
        + blob
    )
