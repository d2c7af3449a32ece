"""Ground-truth views of a mesh: the ``render-views`` command's stage (:func:`render_views`), writing a
``transforms.json`` dataset (:mod:`microdreamer.data.dataset`).
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import numpy as np
import torch

from microdreamer.cameras import orbit_cameras
from microdreamer.config import ViewsConfig
from microdreamer.data.dataset import Normalization, save_dataset
from microdreamer.errors import InputError

logger = logging.getLogger(__name__)


def view_angles(views: int, held_out: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Orbit angles of :func:`render_views`: ``views`` training views with azimuths 360 * i / views and
    elevations uniform in [-30, 30] degrees (NumPy generator with ``seed``), then ``held_out`` views
    at azimuths halfway between training ones, spread evenly, with random elevations too.

    Returns:
        (elevation_deg [views + held_out], azimuth_deg [same], held_out flags [same] bool).
    """
    rng = np.random.default_rng(seed)
    step = 360.0 / views
    az_train = np.arange(views) * step
    gaps = np.floor((np.arange(held_out) + 0.5) * views / max(held_out, 1)).astype(np.int64)
    az_test = (gaps + 0.5) * step
    el = rng.uniform(-30.0, 30.0, size=views + held_out)
    az = np.concatenate([az_train, az_test])
    flags = np.concatenate([np.zeros(views, bool), np.ones(held_out, bool)])
    return (
        torch.tensor(el, dtype=torch.float32),
        torch.tensor(az, dtype=torch.float32),
        torch.from_numpy(flags),
    )


def render_views(
    mesh_path: str | os.PathLike,
    out_dir: str | os.PathLike,
    config: ViewsConfig | None = None,
    texture: str | os.PathLike | None = None,
    device: str | torch.device | None = None,
) -> Path:
    """Render a dataset of ground-truth RGBA views of a mesh (the ``render-views`` command).

    The mesh is first normalised: translated so that its bounding-box centre is at the origin,
    turned so that its up axis ``config.up`` points up (+y, the orbit's axis), and scaled so that its
    farthest vertex is ``config.object_radius`` from it (0.6: the object fits the reconstruction's
    initial sphere of radius 0.5 closely and fills about 3/4 of the frame height at MicroDreamer's
    camera radius 2 and fovy 49.1 degrees). The dataset lives in that normalised frame;
    ``transforms.json`` records ``normalization`` (dataset = scale * R (mesh - center)) so that a
    reconstruction can be compared with ``load_textured_mesh(mesh_path).transformed(center, scale, R)``
    or mapped back to the mesh's own coordinates.

    Cameras: MicroDreamer's orbit (:func:`microdreamer.cameras.orbit_cameras`) at ``config.radius``,
    looking at the origin, angles from :func:`view_angles`; images are the mesh's unlit colour (texture
    or vertex colours) with alpha, antialiased by ``config.ssaa`` x ``config.ssaa`` supersampling. A mesh
    without colour is rendered grey and shaded by a fixed light (``config.light_direction``, ``ambient``:
    the same brightness from every view), and ``transforms.json`` says so (``render_views.mesh_has_color``
    false, ``render_views.shading``).

    Args:
        mesh_path: OBJ (+MTL), GLB/glTF, PLY (see :func:`microdreamer.mesh.load.load_textured_mesh`).
        out_dir: the dataset folder to write (replaced atomically).
        config: views, held-out views, size, seed, camera (defaults: :class:`ViewsConfig`).
        texture: an image to use as the mesh's texture (e.g. an OBJ without MTL).
        device: where to render; default CUDA when available, else the CPU.

    Returns:
        ``out_dir`` as a Path.
    """
    from microdreamer.mesh.load import load_textured_mesh
    from microdreamer.orient import up_rotation
    from microdreamer.render.mesh import has_color, render_mesh

    cfg = config or ViewsConfig()
    views, held_out, size, seed = cfg.views, cfg.held_out, cfg.size, cfg.seed
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    t0 = time.perf_counter()
    mesh = load_textured_mesh(mesh_path, texture)
    v = mesh.vertices.astype(np.float64)
    bad = ~np.isfinite(v).all(axis=1)
    if bad.any():
        raise InputError(
            f"mesh {mesh_path} has {int(bad.sum())} vertices with NaN or infinite coordinates (first: "
            f"{int(np.flatnonzero(bad)[0])}); fix the file"
        )
    center = 0.5 * (v.min(axis=0) + v.max(axis=0))
    extent = float(np.linalg.norm(v - center, axis=1).max())
    if not extent > 0:
        raise InputError(f"mesh {mesh_path} has no extent (all vertices coincide); give a real mesh")
    rotation = np.asarray(up_rotation(cfg.up), dtype=np.float64)
    norm = Normalization(center, cfg.object_radius / extent, rotation)
    mesh = mesh.transformed(norm.center, norm.scale, norm.rotation)
    coloured = has_color(mesh)
    if not coloured:
        logger.warning(
            "%s has no colour (no texture, no vertex colours): its views are grey, shaded by a fixed light; "
            "give --texture PNG for an OBJ whose MTL is missing",
            mesh_path,
        )

    el, az, flags = view_angles(views, held_out, seed)
    cams = orbit_cameras(el, az, radius=cfg.radius, fovy_deg=cfg.fovy_deg, width=size, height=size).to(device)
    out = render_mesh(mesh, cams, background=(0.0, 0.0, 0.0), ssaa=cfg.ssaa, light_direction=cfg.light_direction,
                      ambient=cfg.ambient)  # fmt: skip
    alpha = out.alpha
    rgb = torch.where(alpha > 0, out.rgb / alpha.clamp_min(1e-8), torch.zeros_like(out.rgb))  # un-premultiply
    images = torch.cat([rgb.clamp(0, 1), alpha], dim=-1).cpu()
    info = {
        "mesh": str(mesh_path),
        "texture": None if texture is None else str(texture),
        "views": views,
        "held_out": held_out,
        "size": size,
        "seed": seed,
        "radius": cfg.radius,
        "fovy_deg": cfg.fovy_deg,
        "object_radius": cfg.object_radius,
        "ssaa": cfg.ssaa,
        "up": cfg.up,
        "mesh_has_color": coloured,
        "shading": "unlit: the mesh's own colours"
        if coloured
        else {
            "note": "the mesh has no colour: grey (0.7) shaded by a fixed directional light plus ambient",
            "light_direction": list(cfg.light_direction),
            "ambient": cfg.ambient,
        },
        "elevation_deg": [round(float(x), 4) for x in el],
        "azimuth_deg": [round(float(x), 4) for x in az],
    }
    save_dataset(out_dir, images, cams.to("cpu"), flags, normalization=norm, extra={"render_views": info})
    logger.info("render-views: %d + %d views in %.1f s", views, held_out, time.perf_counter() - t0)
    return Path(out_dir)
