"""``microdreamer reconstruct``: a posed dataset -> splat -> mesh, with held-out metrics.

:func:`reconstruct_dataset` reads a ``transforms.json`` dataset (:mod:`microdreamer.data`), trains a splat
on its training views (:func:`microdreamer.train.reconstruct.reconstruct`), and writes ``OUT/splat.ply``,
``OUT/mesh.glb`` (:func:`microdreamer.jobs.export.export_mesh`) and ``OUT/metrics.json`` (PSNR and SSIM on
the held-out views, the Gaussian count, seconds per stage).
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from pathlib import Path

import numpy as np
import torch

from microdreamer.config import ReconstructJobConfig, to_dict
from microdreamer.errors import InputError
from microdreamer.io_utils import atomic_path
from microdreamer.splat import write_ply
from microdreamer.train.reconstruct import evaluate_views, reconstruct

logger = logging.getLogger(__name__)


def _finite(x):
    return x if x is None or math.isfinite(x) else (1e9 if x > 0 else -1e9)


#: the smallest image side reconstruct takes: the SSIM window of the loss and the metrics
MIN_IMAGE_SIZE = 11


def check_image_size(ds, data_dir) -> None:
    """InputError when the dataset's images are smaller than :data:`MIN_IMAGE_SIZE` a side."""
    w, h = ds.cameras.width, ds.cameras.height
    if min(w, h) < MIN_IMAGE_SIZE:
        raise InputError(
            f"{data_dir}: the images are {w}x{h} pixels; reconstruct needs at least "
            f"{MIN_IMAGE_SIZE}x{MIN_IMAGE_SIZE} (the SSIM window), give larger images"
        )


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def output_frame(normalization, config: ReconstructJobConfig) -> dict:
    """Where splat.ply and the mesh go: the similarity ``x_out = scale * R x_dataset + translation`` and
    a sentence naming the frame.

    ``config.frame = "input"`` undoes the dataset's normalisation (``render-views``: dataset =
    s_n R_n (mesh - c)) up to its rotation: ``x_dataset / s_n + R_n c``, the source mesh's units and
    position, in the dataset's orientation; ``"dataset"`` (or a dataset without a normalisation) keeps
    the dataset frame. ``config.up`` then turns the result so that its up axis points up.

    Returns:
        {"name": "input" or "dataset", "note": str, "rotation": [3, 3], "scale": float, "translation":
        [3]} (NumPy float64).
    """
    from microdreamer.orient import up_rotation

    U = np.asarray(up_rotation(config.up), dtype=np.float64)
    turned = "" if config.up == "+y" else f", turned so that its {config.up} axis points up (+y)"
    if config.frame == "input" and normalization is not None:
        scale, shift = normalization.upright_similarity()
        rotated = not np.array_equal(normalization.rotation, np.eye(3))
        note = ("the source mesh's units and position" + (" (turned upright as render-views did)" if rotated else "")
                + turned)  # fmt: skip
        return {"name": "input", "note": note, "rotation": U, "scale": scale, "translation": U @ shift}
    if config.frame == "input":
        note = "the dataset's own frame (it records no normalisation to undo)" + turned
    else:
        note = "the dataset's normalised frame (the cameras' frame; see normalization)" + turned
    return {"name": "dataset", "note": note, "rotation": U, "scale": 1.0, "translation": np.zeros(3)}


def write_comparison_sheet(
    path: Path,
    views,
    splat,
    mesh,
    background,
    backend: str,
    kind: str = "held-out",
    max_views: int = 4,
    min_size: int = 128,
) -> Path:
    """A labelled PNG: per view (at most ``max_views`` of the dataset ``views``), its ground truth, the
    splat and the mesh (when not None) from that view's camera, all over ``background``. Images
    smaller than ``min_size`` are enlarged (nearest) by an integer factor to reach it."""
    from microdreamer.jobs.turntable import save_labelled_sheet
    from microdreamer.render import render
    from microdreamer.render.mesh import render_mesh

    n = min(max_views, len(views))
    cams = views.cameras[:n]
    bg = torch.tensor(background, dtype=torch.float32)
    gt = views.images[:n].float()
    gt = gt[..., :3] * gt[..., 3:] + bg * (1 - gt[..., 3:]) if gt.shape[-1] == 4 else gt
    columns = [("ground truth", gt)]
    with torch.no_grad():
        columns.append(("splat", render(splat, cams.to(splat.device), background=bg.to(splat.device),
                                        backend=backend).rgb.cpu()))  # fmt: skip
        if mesh is not None:
            columns.append(("mesh", render_mesh(mesh, cams, background=tuple(background), ssaa=2).rgb))
    factor = max(1, -(-min_size // cams.width))

    def to_u8(x: torch.Tensor) -> np.ndarray:
        a = (x.clamp(0, 1).numpy() * 255 + 0.5).astype(np.uint8)
        return a.repeat(factor, 0).repeat(factor, 1)

    rows = [[to_u8(images[i]) for _, images in columns] for i in range(n)]
    labels = [f"{kind} {i}" for i in range(n)]
    return save_labelled_sheet(path, rows, labels, [name for name, _ in columns])


def reconstruct_dataset(
    data_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    config: ReconstructJobConfig | None = None,
    device: str | torch.device = "cpu",
    progress: bool = True,
) -> dict:
    """Reconstruct a ``transforms.json`` dataset: train on its training views, evaluate on the held-out
    ones, write ``OUT/splat.ply``, ``OUT/mesh.glb`` (when ``config.mesh``), ``OUT/held_out_views.png``
    (ground truth, splat and mesh from up to 4 held-out cameras; training cameras when none is held
    out) and ``OUT/metrics.json``. The splat and the mesh are written in the frame of
    :func:`output_frame` (by default the source mesh's own coordinates); metrics.json records it.

    Args:
        data_dir: the dataset folder (see :mod:`microdreamer.data`).
        out_dir: created if needed; files are written atomically.
        config: the job's settings (optimisation, export, evaluation background).
        device: where to train and render.
        progress: show a progress bar over the optimisation steps.

    Returns:
        The metrics written to ``metrics.json``: {"psnr", "ssim" (held-out means, None without held-out
        views), "train_psnr", "num_gaussians", "seconds": {stage: s}, "mesh", ...}.
    """
    from microdreamer.data import load_dataset
    from microdreamer.jobs.export import PRESET_SETTINGS, export_mesh
    from microdreamer.render.gaussians import resolve_backend

    config = config or ReconstructJobConfig()
    recon = config.reconstruct
    device = torch.device(device)
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise InputError(f"{out}: exists and is not a folder; give a folder for the outputs")
    out.mkdir(parents=True, exist_ok=True)
    seconds: dict[str, float] = {}

    t = time.perf_counter()
    ds = load_dataset(data_dir)
    train, test = ds.train(), ds.test()
    if len(train) == 0:
        raise InputError(f"{data_dir}: every frame is held out; nothing to train on")
    check_image_size(ds, data_dir)
    seconds["load"] = time.perf_counter() - t

    splat, stats = reconstruct(train.images, train.cameras, recon, device=device, progress=progress)
    seconds["train"] = stats["seconds"]

    t = time.perf_counter()
    frame = output_frame(ds.normalization, config)
    out_splat = splat.transformed(frame["rotation"], frame["scale"], frame["translation"])
    write_ply(out_splat, out / "splat.ply")
    seconds["write_splat"] = time.perf_counter() - t

    t = time.perf_counter()
    backend = recon.train.backend
    background = config.eval_background
    held = evaluate_views(splat, test.images, test.cameras, background, backend) if len(test) else {}
    train_eval = evaluate_views(splat, train.images, train.cameras, background, backend)
    _sync(device)
    seconds["evaluate"] = time.perf_counter() - t

    mesh_info, mesh = None, None
    if config.mesh:
        t = time.perf_counter()
        result = export_mesh(out_splat, out / "mesh.glb", config.export, device, name="reconstruction",
                             settings=PRESET_SETTINGS)  # fmt: skip
        mesh_info = {**result.summary(), "threshold": config.export.mesh.threshold}
        mesh = result.mesh
        seconds["mesh"] = time.perf_counter() - t

    t = time.perf_counter()
    pictures = out / "held_out_views.png"
    views = test if len(test) else train
    mesh_ds = None
    if mesh is not None:  # the mesh as written, mapped back into the cameras' (dataset) frame
        if config.export.up != "+y":  # export_mesh turned the splat once more
            from microdreamer.orient import up_rotation

            mesh = mesh.transformed(np.zeros(3), 1.0, np.asarray(up_rotation(config.export.up)).T)
        mesh_ds = mesh.transformed(frame["translation"], 1.0 / frame["scale"], frame["rotation"].T)
    write_comparison_sheet(pictures, views, splat, mesh_ds, background, backend,
                           "held-out" if len(test) else "training")  # fmt: skip
    seconds["pictures"] = time.perf_counter() - t

    metrics = {
        "psnr": _finite(held.get("psnr")),
        "ssim": held.get("ssim"),
        "psnr_per_view": [_finite(x) for x in held.get("psnr_per_view", [])],
        "ssim_per_view": held.get("ssim_per_view", []),
        "train_psnr": _finite(train_eval["psnr"]),
        "train_ssim": train_eval["ssim"],
        "num_gaussians": len(splat),
        "num_train_views": len(train),
        "num_held_out_views": len(test),
        "image_size": [ds.cameras.width, ds.cameras.height],
        "eval_background": list(background),
        "final_loss": stats["loss"],
        "densify_grad_threshold": stats["densify_grad_threshold"],
        "seconds": seconds,
        "device": str(device),
        "render_backend": resolve_backend(backend, device),
        "mesh": mesh_info,
        "normalization": ds.normalization.to_json() if ds.normalization is not None else None,
        "output_frame": {
            "name": frame["name"],
            "note": frame["note"],
            "dataset_to_output": {
                "rotation": frame["rotation"].tolist(),
                "scale": frame["scale"],
                "translation": frame["translation"].tolist(),
            },
        },
        "pictures": pictures.name,
        "config": to_dict(config),
    }
    with atomic_path(out / "metrics.json") as tmp:
        tmp.write_text(json.dumps(metrics, indent=2))
    return metrics
