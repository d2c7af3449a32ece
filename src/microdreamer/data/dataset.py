"""Posed-image datasets: the ``transforms.json`` folder format, and ground-truth views rendered from a mesh.

Folder format (NeRF-synthetic / instant-ngp convention)
-------------------------------------------------------
::

    DIR/transforms.json
    DIR/images/r_000.png ...   RGBA PNGs, 8 bit, straight (not premultiplied) colour

``transforms.json`` holds

* ``camera_angle_x`` (horizontal field of view, radians) and, as instant-ngp writes them,
  ``camera_angle_y``, ``fl_x``, ``fl_y``, ``cx``, ``cy`` (pixels, image centre = ``w / 2``), ``w``, ``h``;
* ``frames``: a list of ``{"file_path": ..., "transform_matrix": ...}`` where ``file_path`` is relative
  to DIR, with or without the ``.png`` suffix, and ``transform_matrix`` is the 4 x 4 camera-to-world
  matrix in OpenGL axes (x right, y up, z backward). A frame may override ``fl_x``, ``fl_y``, ``cx``,
  ``cy``;
* our additions, ignored by other readers: ``"held_out": true`` on frames kept for evaluation (not
  for training); ``"normalization": {"center": [x, y, z], "scale": s[, "rotation": R]}`` when the scene
  is a normalised copy of a mesh: dataset coordinates = ``scale * R (mesh coordinates - center)`` (R, a
  3 x 3 rotation that turned the mesh's up axis to +y, only when it is not the identity); ``near``, ``far``;
  ``render_views``: how :func:`render_views` made it.

:func:`load_dataset` also reads the NeRF-synthetic split layout (``transforms_train.json`` and
``transforms_test.json`` without ``transforms.json``): train frames are for training, test frames
are held out.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from microdreamer.cameras import Cameras, cameras_from_c2w_opengl
from microdreamer.errors import InputError
from microdreamer.io_utils import to_uint8

logger = logging.getLogger(__name__)

IMAGE_DIR = "images"


@dataclass
class Normalization:
    """The similarity that maps a mesh into a dataset's frame:
    ``x_dataset = scale * R (x_mesh - center)``, R the rotation that turns the mesh's up axis to +y
    (``render-views --up``; the identity for a y-up mesh).

    Attributes:
        center: [3] float64, in mesh coordinates (the bounding-box centre for :func:`render_views`).
        scale: positive float.
        rotation: [3, 3] float64 proper rotation (default the identity).
    """

    center: np.ndarray
    scale: float
    rotation: np.ndarray | None = None

    def __post_init__(self) -> None:
        self.center = np.asarray(self.center, dtype=np.float64).reshape(3)
        self.scale = float(self.scale)
        self.rotation = (
            np.eye(3) if self.rotation is None else np.asarray(self.rotation, np.float64).reshape(3, 3)
        )
        if (
            not np.allclose(self.rotation @ self.rotation.T, np.eye(3), atol=1e-6)
            or np.linalg.det(self.rotation) < 0
        ):
            raise ValueError("Normalization.rotation must be a proper rotation matrix")

    def apply(self, points: np.ndarray) -> np.ndarray:
        """[..., 3] mesh coordinates -> dataset coordinates."""
        return ((np.asarray(points, dtype=np.float64) - self.center) @ self.rotation.T) * self.scale

    def invert(self, points: np.ndarray) -> np.ndarray:
        """[..., 3] dataset coordinates -> mesh coordinates."""
        return (np.asarray(points, dtype=np.float64) / self.scale) @ self.rotation + self.center

    def upright(self, points: np.ndarray) -> np.ndarray:
        """[..., 3] dataset coordinates -> the mesh's own units and position, in the dataset's
        orientation: ``R x_mesh``, what ``microdreamer mesh --up`` writes for a splat in the mesh's
        coordinates (equal to :meth:`invert` when the rotation is the identity)."""
        return np.asarray(points, dtype=np.float64) / self.scale + self.rotation @ self.center

    def upright_similarity(self) -> tuple[float, np.ndarray]:
        """(s, t) with ``upright(x) = s x + t``: the map :meth:`upright` as a scale and translation."""
        return 1.0 / self.scale, self.rotation @ self.center

    def to_json(self) -> dict:
        out = {"center": [float(x) for x in self.center], "scale": self.scale}
        if not np.array_equal(self.rotation, np.eye(3)):
            out["rotation"] = [[float(x) for x in row] for row in self.rotation]
        return out


@dataclass
class Dataset:
    """C posed RGBA images.

    Attributes:
        images: [C, H, W, 4] float32 in [0, 1], straight RGBA.
        cameras: C cameras of H x W pixels (:class:`microdreamer.cameras.Cameras`).
        held_out: [C] bool, True for frames kept for evaluation.
        names: C frame names (the image file stems).
        normalization: the mesh-to-dataset map when the dataset was rendered from a mesh, else None.
    """

    images: torch.Tensor
    cameras: Cameras
    held_out: torch.Tensor
    names: list[str]
    normalization: Normalization | None = None

    def __len__(self) -> int:
        return self.images.shape[0]

    def subset(self, index: torch.Tensor) -> Dataset:
        """The frames selected by ``index`` ([C] bool or integer indices)."""
        index = torch.as_tensor(index)
        if index.dtype == torch.bool:
            index = index.nonzero(as_tuple=True)[0]
        cams = Cameras(
            self.cameras.viewmats[index],
            self.cameras.Ks[index],
            self.cameras.width,
            self.cameras.height,
            self.cameras.near,
            self.cameras.far,
        )
        names = [self.names[i] for i in index.tolist()]
        return Dataset(self.images[index], cams, self.held_out[index], names, self.normalization)

    def train(self) -> Dataset:
        """The frames for training (not held out)."""
        return self.subset(~self.held_out)

    def test(self) -> Dataset:
        """The held-out frames."""
        return self.subset(self.held_out)


# ---------------------------------------------------------------------------------------------
# writing


@contextlib.contextmanager
def _atomic_dir(target: Path) -> Iterator[Path]:
    """Yield a temporary folder beside ``target``; on success it replaces ``target``.

    ``target`` may be absent, an empty folder, or a dataset folder (with ``transforms.json``), which is
    replaced whole; any other existing path is refused with InputError before anything is written.
    """
    if target.exists():
        if not target.is_dir():
            raise InputError(f"output path {target} exists and is not a folder; choose a new folder name")
        if any(target.iterdir()) and not (target / "transforms.json").is_file():
            raise InputError(
                f"output folder {target} is not empty and holds no dataset; choose a new or empty folder"
            )
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    old = target.with_name(f".{target.name}.old-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        yield tmp
        if target.exists():
            os.replace(target, old)
        os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)


def save_dataset(
    directory: str | os.PathLike,
    images: torch.Tensor,
    cameras: Cameras,
    held_out: torch.Tensor | Sequence[bool] | None = None,
    names: Sequence[str] | None = None,
    normalization: Normalization | None = None,
    extra: dict | None = None,
) -> Path:
    """Write a dataset folder (format in the module docstring), atomically.

    Everything is written into a temporary folder beside ``directory`` which then replaces it, so a
    failure leaves no half-written dataset. An existing dataset folder is replaced; an existing
    non-empty folder without ``transforms.json`` is refused (InputError).

    Args:
        directory: the dataset folder.
        images: [C, H, W, 4] (or [C, H, W, 3], written as opaque) float in [0, 1], straight RGBA;
            quantised to 8 bits.
        cameras: the C cameras (H x W must match the images).
        held_out: [C] bool; default all False.
        names: C image file stems; default ``r_000``, ``r_001``, ...
        normalization: the mesh-to-dataset map to record, if any.
        extra: more top-level JSON fields (must not clash with the standard ones).

    Returns:
        The folder's path.
    """
    from PIL import Image

    directory = Path(directory)
    C = images.shape[0]
    if images.dim() != 4 or images.shape[-1] not in (3, 4):
        raise ValueError(f"images must be [C, H, W, 4], got {tuple(images.shape)}")
    if len(cameras) != C or (images.shape[1], images.shape[2]) != (cameras.height, cameras.width):
        raise ValueError(
            f"images {tuple(images.shape)} do not match "
            f"{len(cameras)} cameras of {cameras.height}x{cameras.width}"
        )
    held = torch.zeros(C, dtype=torch.bool) if held_out is None else torch.as_tensor(held_out).bool().cpu()
    names = [f"r_{i:03d}" for i in range(C)] if names is None else list(names)
    if held.shape != (C,) or len(names) != C or len(set(names)) != C:
        raise ValueError(f"held_out and names must have C = {C} entries, names unique")

    W, H = cameras.width, cameras.height
    Ks = cameras.Ks.detach().cpu().double()
    c2w = cameras.c2w_opengl().detach().cpu().double()
    fx, fy, cx, cy = (float(Ks[0, 0, 0]), float(Ks[0, 1, 1]), float(Ks[0, 0, 2]), float(Ks[0, 1, 2]))
    shared_K = bool(torch.allclose(Ks, Ks[0].expand_as(Ks), rtol=0, atol=1e-9))
    meta: dict = {
        "camera_angle_x": 2 * math.atan(W / (2 * fx)),
        "camera_angle_y": 2 * math.atan(H / (2 * fy)),
        "fl_x": fx,
        "fl_y": fy,
        "cx": cx,
        "cy": cy,
        "w": W,
        "h": H,
        "near": cameras.near,
        "far": cameras.far,
    }
    if normalization is not None:
        meta["normalization"] = normalization.to_json()
    for key, value in (extra or {}).items():
        if key in meta or key == "frames":
            raise ValueError(f"extra field {key!r} clashes with a standard transforms.json field")
        meta[key] = value
    frames = []
    for i in range(C):
        frame = {
            "file_path": f"{IMAGE_DIR}/{names[i]}.png",
            "transform_matrix": c2w[i].tolist(),
            "held_out": bool(held[i]),
        }
        if not shared_K:
            frame.update(
                fl_x=float(Ks[i, 0, 0]), fl_y=float(Ks[i, 1, 1]), cx=float(Ks[i, 0, 2]), cy=float(Ks[i, 1, 2])
            )
        frames.append(frame)
    meta["frames"] = frames

    pixels = to_uint8(images.detach().float().cpu().numpy())
    with _atomic_dir(directory) as tmp:
        (tmp / IMAGE_DIR).mkdir()
        for i in range(C):
            mode = "RGBA" if pixels.shape[-1] == 4 else "RGB"
            Image.fromarray(pixels[i], mode=mode).save(tmp / IMAGE_DIR / f"{names[i]}.png")
        (tmp / "transforms.json").write_text(json.dumps(meta, indent=2))
    logger.info("wrote %d views (%d held out) of %dx%d to %s", C, int(held.sum()), W, H, directory)
    return directory


# ---------------------------------------------------------------------------------------------
# reading


def _read_json(path: Path) -> dict:
    try:
        meta = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InputError(f"cannot read {path} ({e}); it must be a valid transforms.json file") from e
    if not isinstance(meta, dict) or not isinstance(meta.get("frames"), list) or not meta["frames"]:
        raise InputError(f"{path} has no 'frames' list; a transforms.json needs one frame per image")
    return meta


def _image_path(directory: Path, file_path: str, json_path: Path) -> Path:
    p = directory / file_path
    for candidate in (p, Path(str(p) + ".png")):
        if candidate.is_file():
            return candidate
    raise InputError(
        f"image {file_path!r} listed in {json_path} does not exist in {directory}; add it or fix the path"
    )


def _read_image(path: Path) -> np.ndarray:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as im:
            if im.mode in ("I;16", "I;16B", "I"):  # 16-bit greyscale
                arr = np.asarray(im, dtype=np.float32) / 65535.0
                return np.concatenate([np.repeat(arr[..., None], 3, -1), np.ones_like(arr)[..., None]], -1)
            return np.asarray(im.convert("RGBA"), dtype=np.float32) / 255.0
    except (UnidentifiedImageError, OSError) as e:
        raise InputError(f"cannot read image {path} ({e}); replace it with a valid PNG") from e


def _frame_matrix(frame: dict, i: int, json_path: Path) -> np.ndarray:
    try:
        m = np.asarray(frame["transform_matrix"], dtype=np.float64)
    except (KeyError, TypeError, ValueError) as e:
        raise InputError(
            f"frame {i} of {json_path} has no valid 'transform_matrix'; give a 4x4 matrix"
        ) from e
    if m.shape == (3, 4):
        m = np.concatenate([m, [[0.0, 0.0, 0.0, 1.0]]], axis=0)
    if m.shape != (4, 4) or not np.isfinite(m).all():
        raise InputError(
            f"frame {i} of {json_path} has a 'transform_matrix' of shape {m.shape}; give a 4x4 matrix"
        )
    return m


def _load_frames(directory: Path, json_path: Path, held_out_default: bool):
    meta = _read_json(json_path)
    records = []
    for i, frame in enumerate(meta["frames"]):
        if not isinstance(frame, dict) or not isinstance(frame.get("file_path"), str):
            raise InputError(f"frame {i} of {json_path} has no 'file_path'; give each frame its image path")
        path = _image_path(directory, frame["file_path"], json_path)
        records.append(
            {
                "path": path,
                "c2w": _frame_matrix(frame, i, json_path),
                "held_out": bool(frame.get("held_out", held_out_default)),
                "frame": frame,
            }
        )
    return meta, records


def load_dataset(directory: str | os.PathLike) -> Dataset:
    """Read a dataset folder (format in the module docstring).

    Returns:
        :class:`Dataset` on the CPU: images [C, H, W, 4] float32 in [0, 1] (RGB images get alpha 1),
        cameras from the matrices and intrinsics (``fl_x`` ... if present, else ``camera_angle_x``
        with the principal point at the image centre), held_out flags, names and normalization.

    Raises:
        InputError: missing folder, JSON or image; invalid JSON; images of different sizes or not of
            the size the JSON states; no field of view.
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise InputError(f"dataset folder {directory} does not exist; give a folder with a transforms.json")
    main = directory / "transforms.json"
    if main.is_file():
        meta, records = _load_frames(directory, main, held_out_default=False)
        json_path = main
    elif (directory / "transforms_train.json").is_file():
        json_path = directory / "transforms_train.json"
        meta, records = _load_frames(directory, json_path, held_out_default=False)
        test = directory / "transforms_test.json"
        if test.is_file():
            records += [
                {**r, "held_out": True} for r in _load_frames(directory, test, held_out_default=True)[1]
            ]
    else:
        raise InputError(
            f"{directory} has no transforms.json; give a dataset folder (see `microdreamer render-views`)"
        )

    images = []
    for r in records:
        img = _read_image(r["path"])
        if images and img.shape != images[0].shape:
            raise InputError(
                f"image {r['path']} is {img.shape[1]}x{img.shape[0]} but {records[0]['path']} is "
                f"{images[0].shape[1]}x{images[0].shape[0]}; all images of a dataset must have one size"
            )
        images.append(img)
    H, W = images[0].shape[:2]
    if ("w" in meta and int(meta["w"]) != W) or ("h" in meta and int(meta["h"]) != H):
        raise InputError(
            f"{json_path} says images are {meta.get('w')}x{meta.get('h')} "
            f"but {records[0]['path']} is {W}x{H}; fix 'w'/'h' or the images"
        )

    c2w = torch.tensor(np.stack([r["c2w"] for r in records]), dtype=torch.float32)
    if "camera_angle_x" in meta:
        cams = cameras_from_c2w_opengl(c2w, float(meta["camera_angle_x"]), W, H, axis="x")
    elif "fl_x" in meta:
        cams = cameras_from_c2w_opengl(c2w, 2 * math.atan(W / (2 * float(meta["fl_x"]))), W, H, axis="x")
    else:
        raise InputError(f"{json_path} has neither 'camera_angle_x' nor 'fl_x'; give the field of view")
    Ks = cams.Ks.clone()
    for i, r in enumerate(records):
        src = {**{k: meta[k] for k in ("fl_x", "fl_y", "cx", "cy") if k in meta}, **r["frame"]}
        if "fl_x" in src:
            Ks[i, 0, 0] = float(src["fl_x"])
            Ks[i, 1, 1] = float(src.get("fl_y", src["fl_x"]))
        if "cx" in src:
            Ks[i, 0, 2] = float(src["cx"])
        if "cy" in src:
            Ks[i, 1, 2] = float(src["cy"])
    cams = Cameras(
        cams.viewmats, Ks, W, H, near=float(meta.get("near", cams.near)), far=float(meta.get("far", cams.far))
    )
    norm = None
    if isinstance(meta.get("normalization"), dict):
        try:
            n = meta["normalization"]
            norm = Normalization(n["center"], n["scale"], n.get("rotation"))
        except (KeyError, TypeError, ValueError) as e:
            raise InputError(
                f"{json_path} has an invalid 'normalization'; give center [x, y, z], scale and optionally "
                "rotation (3 x 3, proper)"
            ) from e
    return Dataset(
        images=torch.from_numpy(np.stack(images)).float(),
        cameras=cams,
        held_out=torch.tensor([r["held_out"] for r in records], dtype=torch.bool),
        names=[r["path"].stem for r in records],
        normalization=norm,
    )
