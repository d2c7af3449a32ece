"""Write a self-contained viewer folder for meshes, splats, 3D Tiles tilesets and job output folders.

Layout of the folder :func:`build_viewer` writes::

    index.html             the page; its manifest (what to show, cameras, stats) is inline JSON
    viewer.js, viewer.css  the page's code (a classic script on the global ``MDV`` of the bundle)
    vendor/                mdv-vendor.min.js (three.js + Spark), their licences, VERSIONS
    assets/<k>_<name>/     copies of the inputs (an OBJ with its MTL and textures; a tileset's
                           tileset.json and the GLBs it names, at the same relative paths)
    data.js                only when embedding: the assets again, base64, as a classic script

Served over HTTP (:func:`microdreamer.viewer.serve`) the page fetches ``assets/``. Opened from
``file://`` browsers refuse ``fetch`` (and module scripts), so when the assets are small enough
(:data:`EMBED_LIMIT_BYTES`) they are also written into ``data.js``, which a classic ``<script>``
may load from a file; the page then hands the loaders ``blob:`` URLs of those bytes.

Cameras: the page opens on the view ``microdreamer render`` draws at azimuth 0 (from +z, y up,
elevation 0, vertical field of view :data:`FOVY_DEG`, distance ``MARGIN * radius / sin(fovy / 2)``),
with each object's centre and radius computed here by the same functions as the renderer's. A
tileset's camera frames its root's bounding volume (turned from the tileset's z-up frame back to
y-up): the sphere through the box's corners, not the vertices', which are not read here.
"""

from __future__ import annotations

import base64
import html
import json
import logging
import math
import re
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

from microdreamer.errors import InputError

logger = logging.getLogger(__name__)

PACKAGE = Path(__file__).resolve().parent
VENDOR = PACKAGE / "vendor"
STATIC = PACKAGE / "static"

#: the turntable's framing (``microdreamer.jobs.turntable.turntable_frames`` defaults)
FOVY_DEG = 49.1
MARGIN = 1.1
#: embed the assets into data.js (for file://) when they total at most this many bytes
EMBED_LIMIT_BYTES = 16 << 20
#: written into index.html; a folder holding it is a viewer that may be replaced
MARKER = "microdreamer-viewer"

MESH_SUFFIXES = (".glb", ".obj")
#: images of a job folder shown below its 3D views, in this order
FOLDER_IMAGES = ("profile.png", "views.png")
#: a folder holding this file is a 3D Tiles tileset (``microdreamer mesh --tileset DIR``)
TILESET = "tileset.json"
_MIME = {".glb": "model/gltf-binary", ".obj": "text/plain", ".mtl": "text/plain", ".ply": "application/octet-stream",
         ".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".json": "application/json"}  # fmt: skip


@dataclass
class Camera:
    """The opening view: ``position`` looks at ``target`` with y up."""

    position: list[float]
    target: list[float]
    fovy_deg: float
    near: float
    far: float


@dataclass
class View:
    """One 3D panel: a mesh, a splat or a tileset, its camera and the stats known before loading."""

    kind: str  # "mesh" | "splat" | "tiles"
    name: str
    url: str  # relative to index.html
    format: str  # "glb" | "obj" | "ply" | "3dtiles"
    camera: Camera
    stats: dict
    mtl: str | None = None  # OBJ: its material library, relative to index.html
    files: list[str] = field(default_factory=list)  # every asset this view loads


@dataclass
class Group:
    """What one input path shows: its views side by side, the job's seconds and scalars, images."""

    name: str
    source: str
    kind: str  # "mesh" | "splat" | "tileset" | "folder"
    views: list[View]
    seconds: dict[str, dict[str, float]] = field(default_factory=dict)  # json file -> stage -> s
    scalars: dict[str, dict] = field(default_factory=dict)  # json file -> key -> value
    images: list[dict] = field(default_factory=list)  # {"name", "url"}


def _camera(center, radius: float) -> Camera:
    """The turntable's azimuth-0 camera for a sphere (``center``, ``radius``): from +z, level."""
    distance = MARGIN * radius / math.sin(math.radians(FOVY_DEG) / 2)
    c = [float(v) for v in center]
    return Camera(
        position=[c[0], c[1], c[2] + distance],
        target=c,
        fovy_deg=FOVY_DEG,
        near=max(1e-3, 0.05 * (distance - radius)),
        far=2.0 * (distance + radius) * 4.0,  # room to zoom out
    )


def _ply_header(path: Path) -> tuple[str, int]:
    """(format, vertex count) from a PLY header."""
    fmt, count = "", 0
    with open(path, "rb") as f:
        for _ in range(4096):
            line = f.readline()
            if not line or line.strip() == b"end_header":
                break
            parts = line.decode("ascii", errors="replace").split()
            if parts[:1] == ["format"] and len(parts) > 1:
                fmt = parts[1]
            elif parts[:2] == ["element", "vertex"] and len(parts) == 3 and parts[2].isdigit():
                count = int(parts[2])
    return fmt, count


def _splat_view(path: Path, asset_dir: Path, rel: str, crop: str | None = None, say=None) -> View:
    """Copy a 3DGS PLY (re-written as binary little-endian when it is not, and any other splat format
    re-written as a 3DGS PLY: the browser's reader takes that one) and frame it; cropped to ``crop``
    (:mod:`microdreamer.crop`, the splat's own coordinates; ``say`` gets the line naming the box)."""
    from microdreamer.formats import detect_format
    from microdreamer.jobs.turntable import splat_framing
    from microdreamer.splat import read_splat

    splat = read_splat(path)
    if crop:
        from microdreamer.crop import crop_splat, resolve_crop

        box = resolve_crop(splat, crop)
        (say or logger.info)(f"{path.name}: {box.describe()}")
        splat = crop_splat(splat, box, str(path))
    center, radius = splat_framing(splat)
    plain = detect_format(path) == "ply" and not crop
    target = asset_dir / (path.name if plain else f"{path.name.split('.')[0] or 'splat'}.ply")
    fmt, _ = _ply_header(path) if plain else (None, None)
    if fmt == "binary_little_endian":
        shutil.copyfile(path, target)
    else:  # the browser's reader takes binary little-endian only
        from microdreamer.splat import write_ply

        write_ply(splat, target)
    stats = {"gaussians": len(splat), "sh_degree": splat.sh_degree, "bytes": target.stat().st_size}
    url = f"{rel}/{target.name}"
    return View("splat", path.name, url, "ply", _camera(center, radius), stats, files=[url])


_MTLLIB = re.compile(r"^\s*mtllib\s+(.+?)\s*$", re.MULTILINE)
_MAPS = re.compile(r"^\s*(?:map_\w+|bump|disp|decal|norm)\s+(?:-\S+\s+\S+\s+)*(.+?)\s*$", re.MULTILINE)


def _copy_relative(src_root: Path, name: str, dst_root: Path, source: Path, what: str) -> str | None:
    """Copy ``src_root / name`` to ``dst_root / name``; returns the relative name copied, or None (with a
    warning) when there is no such file. A name that leads out of ``src_root`` (absolute, ``..``, a
    symlink) is refused (InputError naming ``source``, the file that names it): the viewer reads only
    inside an input's folder and writes only inside its own."""
    from microdreamer.io_utils import resolve_inside

    src = resolve_inside(src_root, name, what, source)
    if not src.is_file():
        logger.warning("%s: referenced file %s not found beside it; the view goes without it", src_root, name)
        return None
    dst = dst_root / Path(name)
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dst)
    return Path(name).as_posix()


def _mesh_view(path: Path, asset_dir: Path, rel: str) -> View:
    """Copy a GLB, or an OBJ with its MTL and textures, and frame it."""
    import numpy as np
    import torch
    import trimesh

    from microdreamer.cameras import framing
    from microdreamer.mesh.load import check_mesh_text, check_references, validate_geometry

    check_references(path)  # trimesh would read what an OBJ or glTF names, wherever it is
    check_mesh_text(path)  # what trimesh would read wrongly without a word (an OBJ face index 0)
    try:
        loaded = trimesh.load(path, process=False)
    except Exception as e:  # trimesh raises many kinds of errors for bad files
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise InputError(f"cannot read mesh file {path} ({msg}); check that it is a valid GLB or OBJ") from e
    meshes = loaded.dump(concatenate=False) if isinstance(loaded, trimesh.Scene) else [loaded]
    meshes = [m for m in meshes if isinstance(m, trimesh.Trimesh) and len(m.faces)]
    if not meshes:
        raise InputError(f"mesh file {path} has no triangles; give a triangle mesh (GLB or OBJ)")
    # finite, faces in range, an extent and an area: no blank view and no NaN in the page's JSON
    parts = [(np.asarray(m.vertices), np.asarray(m.faces)) for m in meshes]
    for v, f in parts:
        if f.size and (f.min() < 0 or f.max() >= len(v)):
            validate_geometry(path, v, f)  # raises, naming the range
    offsets = np.cumsum([0] + [len(v) for v, _ in parts[:-1]])
    vertices = validate_geometry(
        path,
        np.concatenate([v for v, _ in parts]),
        np.concatenate([f + o for (_, f), o in zip(parts, offsets, strict=True)]),
    )
    center, radius = framing(torch.from_numpy(vertices))
    textured = any(getattr(m.visual, "kind", None) == "texture" for m in meshes)
    stats = {
        "vertices": int(sum(len(m.vertices) for m in meshes)),
        "faces": int(sum(len(m.faces) for m in meshes)),
        "textured": bool(textured),
    }
    shutil.copyfile(path, asset_dir / path.name)
    url = f"{rel}/{path.name}"
    files, mtl = [url], None
    if path.suffix.lower() == ".obj":
        libs = _MTLLIB.findall(path.read_text(errors="replace"))
        for lib in libs[:1]:  # three's OBJ loader takes one material library
            copied = _copy_relative(path.parent, lib, asset_dir, path, "material library")
            if copied is None:
                continue
            mtl = f"{rel}/{copied}"
            files.append(mtl)
            for tex in _MAPS.findall((path.parent / lib).read_text(errors="replace")):
                name = (Path(lib).parent / tex).as_posix()
                copied_tex = _copy_relative(path.parent, name, asset_dir, path.parent / lib, "texture")
                if copied_tex is not None:
                    files.append(f"{rel}/{copied_tex}")
    stats["bytes"] = int(sum((asset_dir.parent.parent / f).stat().st_size for f in files))
    kind = path.suffix.lower()[1:]
    return View("mesh", path.name, url, kind, _camera(center, radius), stats, mtl=mtl, files=files)


def _tileset_frame(volume, transform, source: Path):
    """(centre [3], radius) in y-up world units of a tileset root's bounding volume (a ``box`` or a
    ``sphere`` in the tileset's z-up frame, under the root's ``transform``, 16 numbers column-major)."""
    import numpy as np

    from microdreamer.scene.tileset import Y_UP_TO_Z_UP

    def numbers(value, count: int, what: str) -> np.ndarray:
        ok = isinstance(value, list) and len(value) == count
        ok = ok and all(isinstance(v, int | float) and not isinstance(v, bool) for v in value)
        out = np.asarray(value if ok else [], np.float64)
        if not ok or not np.isfinite(out).all():
            raise InputError(f"{source}: the root's {what} is not {count} finite numbers; fix the tileset")
        return out

    matrix = np.eye(4) if transform is None else numbers(transform, 16, "transform").reshape(4, 4).T
    volume = volume if isinstance(volume, dict) else {}
    if "box" in volume:
        box = numbers(volume["box"], 12, "bounding box")
        signs = np.array([[i, j, k] for i in (-1, 1) for j in (-1, 1) for k in (-1, 1)], np.float64)
        points = box[:3] + signs @ box[3:].reshape(3, 3)  # [8, 3] the corners
    elif "sphere" in volume:
        sphere = numbers(volume["sphere"], 4, "bounding sphere")
        points = sphere[:3] + abs(sphere[3]) * np.concatenate([np.eye(3), -np.eye(3)])  # [6, 3]
    else:
        raise InputError(f"{source}: the root's bounding volume is neither a box nor a sphere (a geographic "
                         "region?); the viewer shows tilesets in their own frame, as mesh --tileset writes")  # fmt: skip
    points = points @ matrix[:3, :3].T + matrix[:3, 3]
    points = points @ Y_UP_TO_Z_UP  # z-up -> y-up: the rotation's inverse is its transpose
    lo, hi = points.min(0), points.max(0)
    centre = (lo + hi) / 2
    return centre, max(float(np.linalg.norm(points - centre, axis=1).max()), 1e-30)


def _tileset_view(folder: Path, asset_dir: Path, rel: str) -> View:
    """Copy a 3D Tiles tileset (``tileset.json`` and the GLB each tile names, inside ``folder``) and frame
    its root's bounding volume."""
    from urllib.parse import unquote, urlsplit

    from microdreamer.io_utils import resolve_inside

    source = folder / TILESET
    try:
        doc = json.loads(source.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise InputError(f"{source}: not readable JSON ({e}); give a tileset.json of OGC 3D Tiles") from None
    root = doc.get("root") if isinstance(doc, dict) else None
    if not isinstance(root, dict) or not isinstance(doc.get("asset"), dict):
        raise InputError(f"{source}: no 'asset' and 'root' tile; give a tileset.json of OGC 3D Tiles")
    center, radius = _tileset_frame(root.get("boundingVolume"), root.get("transform"), source)
    uris, leaves, stack = [], 0, [root]
    while stack:
        tile = stack.pop()
        contents = [tile["content"]] if isinstance(tile.get("content"), dict) else []
        contents += [c for c in tile.get("contents") or [] if isinstance(c, dict)]
        for content in contents:
            uri = content.get("uri", content.get("url"))
            name = unquote(urlsplit(uri).path) if isinstance(uri, str) else uri
            if not isinstance(name, str) or not name.lower().endswith(".glb"):
                raise InputError(f"{source}: a tile's content is {uri!r}; the viewer takes tilesets whose tiles "
                                 "are GLB files (as mesh --tileset writes)")  # fmt: skip
            uris.append(name)
        children = [c for c in tile.get("children") or [] if isinstance(c, dict)]
        leaves += not children and bool(contents)
        stack.extend(children)
    files = [f"{rel}/{TILESET}"]
    shutil.copyfile(source, asset_dir / TILESET)
    for name in dict.fromkeys(uris):
        if not resolve_inside(folder, name, "tile", source).is_file():
            raise InputError(
                f"{source}: names tile {name}, which is not in {folder}; write the tileset again"
            )
        files.append(f"{rel}/{_copy_relative(folder, name, asset_dir, source, 'tile')}")
    stats = {
        "tiles": len(files) - 1,
        "leaves": leaves,
        "refine": root.get("refine", ""),
        "bytes": int(sum((asset_dir.parent.parent / f).stat().st_size for f in files)),
    }
    return View("tiles", folder.name, files[0], "3dtiles", _camera(center, radius), stats, files=files)


def _flat_scalars(data: dict, prefix: str = "", depth: int = 0) -> dict:
    """Numbers, strings and booleans of a JSON object, nested objects flattened as ``a.b`` (two levels)."""
    out: dict = {}
    for k, v in data.items():
        if isinstance(v, dict) and depth < 1:
            out.update(_flat_scalars(v, f"{prefix}{k}.", depth + 1))
        elif isinstance(v, bool | int | float | str) and not (isinstance(v, float) and not math.isfinite(v)):
            out[f"{prefix}{k}"] = v
    return out


def _folder_json(folder: Path) -> tuple[dict, dict]:
    """Per-stage seconds (each JSON's ``seconds`` / ``stages`` object of numbers) and the other scalars."""
    seconds, scalars = {}, {}
    for path in sorted(folder.glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            logger.warning("%s: not readable JSON (%s); left out of the viewer", path, e)
            continue
        if not isinstance(data, dict):
            continue
        for key in ("seconds", "stages"):
            part = data.get(key)
            if isinstance(part, dict):
                nums = {
                    k: float(v) for k, v in part.items() if isinstance(v, int | float) and math.isfinite(v)
                }
                if nums:
                    seconds[f"{path.name}: {key}"] = nums
        rest = {k: v for k, v in data.items() if k not in ("seconds", "stages")}
        flat = _flat_scalars(rest)
        if flat:
            scalars[path.name] = flat
    return seconds, scalars


def _input_group(index: int, path: Path, root: Path, crop: str | None = None, say=None) -> Group:
    """Copy one input into ``root / assets`` and describe what the page shows of it (splats cropped to
    ``crop``)."""
    from microdreamer.formats import SPLAT_SUFFIXES, is_splat

    rel = f"assets/{index}_{re.sub(r'[^A-Za-z0-9._-]+', '_', path.stem or 'input')}"
    asset_dir = root / rel
    asset_dir.mkdir(parents=True)
    tileset = path if path.is_dir() else path.parent if path.name == TILESET else None
    if tileset is not None and (tileset / TILESET).is_file():
        return Group(tileset.name, str(path), "tileset", [_tileset_view(tileset, asset_dir, rel)])
    if path.is_dir():
        meshes = [p for s in MESH_SUFFIXES for p in sorted(path.glob(f"*{s}"))]
        splats = [p for s in SPLAT_SUFFIXES for p in sorted(path.glob(f"*{s}")) if is_splat(p)]
        views = [_mesh_view(p, asset_dir, rel) for p in meshes[:1]]
        views += [_splat_view(p, asset_dir, rel, crop, say) for p in splats[:1]]
        seconds, scalars = _folder_json(path)
        images = []
        for name in FOLDER_IMAGES:
            if (path / name).is_file():
                shutil.copyfile(path / name, asset_dir / name)
                images.append({"name": name, "url": f"{rel}/{name}"})
        if not views and not images and not seconds:
            raise InputError(
                f"{path}: no mesh (.glb/.obj), splat (.ply), {TILESET}, {'/'.join(FOLDER_IMAGES)} or timings "
                "JSON found; give an output folder of mesh, reconstruct or generate, or a file"
            )
        return Group(path.name, str(path), "folder", views, seconds, scalars, images)
    if is_splat(path):
        return Group(path.name, str(path), "splat", [_splat_view(path, asset_dir, rel, crop, say)])
    if path.suffix.lower() in MESH_SUFFIXES:
        return Group(path.name, str(path), "mesh", [_mesh_view(path, asset_dir, rel)])
    if path.suffix.lower() == ".ply":
        raise InputError(
            f"{path}: a PLY without 3DGS properties (f_dc_0, opacity); the viewer shows 3DGS splats, "
            "GLB and OBJ meshes: convert a mesh PLY to GLB first"
        )
    raise InputError(f"{path}: unsupported input {path.suffix!r}; give a .glb or .obj mesh, a 3DGS .ply, "
                     f"a tileset folder ({TILESET}) or an output folder")  # fmt: skip


def _write_embedded(root: Path, groups: list[Group]) -> None:
    """data.js: every asset of the views as ``MD_EMBED[url] = {mime, b64}`` (a classic script)."""
    urls = [u for g in groups for v in g.views for u in v.files] + [
        i["url"] for g in groups for i in g.images
    ]
    with open(root / "data.js", "w") as f:
        f.write("window.MD_EMBED = window.MD_EMBED || {};\n")
        for url in dict.fromkeys(urls):
            data = base64.b64encode((root / url).read_bytes()).decode("ascii")
            mime = _MIME.get(Path(url).suffix.lower(), "application/octet-stream")
            f.write(f'window.MD_EMBED[{json.dumps(url)}] = {{mime: {json.dumps(mime)}, b64: "{data}"}};\n')


def _index_html(title: str, manifest: dict) -> str:
    # "</" cannot end the inline JSON early once every "<" is escaped
    payload = json.dumps(manifest, indent=1).replace("<", "\\u003c")
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="generator" content="{MARKER}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{html.escape(title)}</title>
<link rel="icon" href="data:,">
<link rel="stylesheet" href="viewer.css">
</head>
<body>
<header><h1>{html.escape(title)}</h1><p id="md-message" class="message" hidden></p></header>
<main id="md-groups"></main>
<details class="page-stats"><summary>page stats (JSON)</summary><pre id="md-stats" data-state="loading">{{}}</pre></details>
<script type="application/json" id="md-manifest">{payload}</script>
<script src="vendor/mdv-vendor.min.js"></script>
<script src="viewer.js"></script>
</body>
</html>
"""


def _check_out_dir(out_dir: Path) -> None:
    if out_dir.exists():
        if not out_dir.is_dir():
            raise InputError(f"{out_dir}: exists and is not a folder; choose another output folder")
        index = out_dir / "index.html"
        is_viewer = index.is_file() and MARKER in index.read_text(errors="replace")[:2000]
        if any(out_dir.iterdir()) and not is_viewer:
            raise InputError(f"{out_dir}: exists and is not empty (and not a viewer); choose a new folder")
    if not out_dir.parent.is_dir():
        raise InputError(f"{out_dir}: the folder {out_dir.parent} does not exist; create it first")


def build_viewer(
    paths: list[Path],
    out_dir: Path,
    title: str | None = None,
    *,
    embed: bool | None = None,
    crop: str | None = None,
    say=None,
) -> Path:
    """Write a viewer folder for ``paths`` into ``out_dir`` (replacing an earlier viewer there).

    Args:
        paths: each a GLB/OBJ mesh (an OBJ with its MTL and textures), a 3DGS splat PLY, a 3D Tiles
            tileset of GLB tiles (a folder holding ``tileset.json``, or that file: ``mesh --tileset``),
            or an output folder of ``mesh`` / ``reconstruct`` / ``generate`` (its mesh and splat side by
            side, the per-stage seconds and scalars of its JSON files, ``profile.png`` and ``views.png``).
        out_dir: the folder to write; it must not exist, be empty, or hold an earlier viewer.
        title: the page's title (default: the inputs' names).
        embed: also write the assets into ``data.js`` so the page works from ``file://``; default:
            when they total at most :data:`EMBED_LIMIT_BYTES`.
        crop: splats cropped to this box (``X0,Y0,Z0,X1,Y1,Z1`` or ``auto``: :mod:`microdreamer.crop`).
        say: gets the line naming each crop's box (default: the log).

    Returns:
        The path of ``index.html``.

    Raises:
        InputError: no input, a missing or unsupported input, an unreadable file, or an output folder
            that would overwrite something else. Nothing is left behind then.
    """
    paths = [Path(p) for p in paths]
    out_dir = Path(out_dir)
    if not paths:
        raise InputError("no input given; give meshes (.glb/.obj), splats (.ply) or output folders to view")
    for p in paths:
        if not p.exists():
            raise InputError(f"{p} does not exist; give a mesh, a splat or an output folder")
    if not (VENDOR / "mdv-vendor.min.js").is_file():
        raise InputError(f"the viewer's JavaScript is missing from {VENDOR}; run scripts/vendor_viewer.sh")
    from microdreamer.io_utils import check_output_folder, staged_folder

    check_output_folder(out_dir)
    _check_out_dir(out_dir)
    with staged_folder(out_dir, replace=True) as tmp:  # a viewer folder is replaced whole, or not at all
        tmp.mkdir()
        groups = [_input_group(i, p, tmp, crop, say) for i, p in enumerate(paths)]
        total = sum(f.stat().st_size for f in (tmp / "assets").rglob("*") if f.is_file())
        embedded = total <= EMBED_LIMIT_BYTES if embed is None else bool(embed)
        if embedded:
            _write_embedded(tmp, groups)
        title = title or " + ".join(p.name for p in paths)
        manifest = {
            "title": title,
            "embedded": embedded,
            "groups": [asdict(g) for g in groups],
        }
        (tmp / "index.html").write_text(_index_html(title, manifest))
        shutil.copytree(VENDOR, tmp / "vendor")
        for name in ("viewer.js", "viewer.css"):
            shutil.copyfile(STATIC / name, tmp / name)
    logger.info("wrote viewer %s (%d inputs, %.1f MB of assets%s)", out_dir, len(paths), total / 1e6,
                ", embedded" if embedded else "")  # fmt: skip
    return out_dir / "index.html"
