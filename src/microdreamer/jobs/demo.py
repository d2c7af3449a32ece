"""The built-in end-to-end default (``microdreamer demo``): no data files, no weights.

Builds a small coloured object in code, renders a posed dataset of it, reconstructs a splat from the
training views, extracts the mesh, and measures the result: PSNR/SSIM on held-out views, Chamfer-L1
and F-score of the mesh against the object it came from. The defaults finish on a 2-core CPU in a
few minutes; on a GPU they take seconds.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from microdreamer.cameras import framing
from microdreamer.config import (
    DemoConfig,
    ReconstructConfig,
    ReconstructJobConfig,
    TrainConfig,
    ViewsConfig,
)
from microdreamer.io_utils import atomic_path


def make_demo_object(subdivisions: int = 4):
    """A closed, bumpy, vertex-coloured object about 1 unit across (a trimesh.Trimesh)."""
    import trimesh

    sphere = trimesh.creation.icosphere(subdivisions=subdivisions, radius=1.0)
    v = np.asarray(sphere.vertices, dtype=np.float64)
    theta = np.arccos(np.clip(v[:, 1], -1, 1))
    phi = np.arctan2(v[:, 2], v[:, 0])
    radius = 0.5 * (0.86 + 0.1 * np.sin(3 * theta) * np.cos(2 * phi) + 0.04 * np.cos(5 * phi))
    verts = v * radius[:, None] * np.array([1.0, 1.15, 0.9])
    # bands of colour around the vertical axis and a darker cap: features a reconstruction must place
    hue = 0.5 + 0.5 * np.sin(4 * phi)
    rgb = np.stack([0.9 * hue + 0.1, 0.3 + 0.5 * (1 - hue), 0.25 + 0.5 * (v[:, 1] > 0.6)], 1)
    colors = np.concatenate([np.clip(rgb, 0, 1) * 255, np.full((len(v), 1), 255)], 1).astype(np.uint8)
    return trimesh.Trimesh(verts, sphere.faces, vertex_colors=colors, process=False)


def write_demo_sheet(path: Path, truth, mesh, device: torch.device, metrics: dict, size: int = 160,
                     views: int = 8) -> Path:  # fmt: skip
    """The demo's picture: the object (ground truth) above the reconstructed mesh, from ``views``
    azimuths at 20 degrees above, both seen by the same cameras (framing the object), labelled, with
    the held-out PSNR and the mesh's Chamfer distance in the title."""
    from microdreamer.jobs.turntable import save_labelled_sheet, turntable_frames

    az = [360.0 * k / views for k in range(views)]
    frame = framing(torch.as_tensor(truth.vertices, dtype=torch.float32))
    rows = [list(turntable_frames(m, az, -20.0, size, device=device, frame=frame)) for m in (truth, mesh)]
    q = metrics.get("mesh_quality", {})
    title = f"demo: held-out PSNR {metrics.get('psnr', float('nan')):.2f} dB"
    if q.get("chamfer_l1_rel") is not None:
        title += f"; mesh Chamfer-L1 {100 * q['chamfer_l1_rel']:.2f}% of the diagonal, F-score@1% {q['fscore@0.01']:.3f}"
    return save_labelled_sheet(path, rows, ["object (truth)", "mesh"], [f"az {a:.0f}" for a in az], title)


def run_demo(out_dir: str | Path, config: DemoConfig, device: torch.device) -> dict:
    """Object -> views -> splat -> mesh, with metrics. Writes everything under ``out_dir``.

    Returns the reconstruction's metrics plus ``mesh_quality`` (Chamfer-L1 relative to the object's
    bounding-box diagonal, F-score at 1% of it) and the paths written.
    """
    from microdreamer.data import render_views
    from microdreamer.jobs.reconstruct import reconstruct_dataset
    from microdreamer.mesh.load import load_textured_mesh
    from microdreamer.metrics import mesh_metrics

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    seconds: dict[str, float] = {}

    t = time.perf_counter()
    obj_path = out / "object.ply"
    with atomic_path(obj_path) as tmp:
        make_demo_object().export(tmp, file_type="ply")
    views = ViewsConfig(views=config.views, held_out=config.held_out, size=config.size, seed=config.seed)
    render_views(obj_path, out / "views", views, device=device)
    seconds["object_and_views"] = time.perf_counter() - t

    n = config.iters
    train = TrainConfig(
        num_pts=config.num_pts,
        position_lr_max_steps=n,
        densify_start_iter=max(1, n // 6),
        densify_end_iter=int(0.75 * n),
        densify_interval=max(1, n // 6),
        opacity_reset_interval=max(1, n // 2),
        max_gaussians=config.max_gaussians,
        lambda_alpha=1.0,
        random_background=True,
        seed=config.seed,
    )
    export = config.export
    texture = replace(export.texture, bake=replace(export.texture.bake, views=replace(
        export.texture.bake.views, size=2 * config.size)))  # fmt: skip
    job = ReconstructJobConfig(
        reconstruct=ReconstructConfig(train=train, iters=n, batch_views=config.batch_views),
        export=replace(export, texture=texture),
    )
    t = time.perf_counter()
    metrics = reconstruct_dataset(out / "views", out, job, device=device)
    seconds["reconstruct_total"] = time.perf_counter() - t

    gt = load_textured_mesh(obj_path)  # reconstruct writes the mesh in the object's own coordinates
    import trimesh

    pred = trimesh.load(out / "mesh.glb", force="mesh", process=False)
    quality = mesh_metrics(pred, gt, n=50_000, tau_fractions=(0.01,))
    metrics["mesh_quality"] = {
        k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in quality.items()
    }

    t = time.perf_counter()
    write_demo_sheet(out / "mesh_views.png", gt, load_textured_mesh(out / "mesh.glb"), device, metrics)
    seconds["contact_sheet"] = time.perf_counter() - t
    metrics["demo_seconds"] = seconds
    with atomic_path(out / "metrics.json") as tmp:
        tmp.write_text(json.dumps(metrics, indent=2))
    metrics["paths"] = {
        "object": str(obj_path),
        "views": str(out / "views"),
        "splat": str(out / "splat.ply"),
        "mesh": str(out / "mesh.glb"),
        "pictures": str(out / "mesh_views.png"),
        "held_out": str(out / "held_out_views.png"),
        "metrics": str(out / "metrics.json"),
    }
    return metrics
