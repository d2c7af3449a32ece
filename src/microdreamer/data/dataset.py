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
    from microdreamer.io_utils import check_output_folder, staged_folder

    check_output_folder(target)
    with staged_folder(target, replace=True) as tmp:
        tmp.mkdir()
        yield tmp


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


#: transforms.json files larger than this are refused before parsing (a 10k-frame dataset is ~5 MB)
MAX_JSON_BYTES = 256 << 20


#: the largest float32; a camera setting beyond it would turn into inf
FLOAT32_MAX = 3.4028234663852886e38
#: the largest transform_matrix entry taken (a camera 1e10 units from the origin is a broken file)
MAX_MATRIX_ENTRY = 1e10


def _read_json(path: Path) -> dict:
    try:
        size = path.stat().st_size
        if size > MAX_JSON_BYTES:
            raise InputError(
                f"{path} is {size / 2**20:.0f} MB; a transforms.json is a few MB at most, give the right file"
            )
        meta = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError, ValueError) as e:
        if isinstance(e, InputError):
            raise
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise InputError(f"cannot read {path} ({reason}); it must be a valid transforms.json file") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("frames"), list) or not meta["frames"]:
        raise InputError(f"{path} has no 'frames' list; a transforms.json needs one frame per image")
    return meta


def _number(
    src: dict, key: str, where: str, *, positive: bool = False, integer: bool = False, default=None
) -> float | int | None:
    """``src[key]`` as a finite number (None/``default`` when absent); InputError naming ``where`` and the
    key when it is a string, null, a bool, not finite, not positive (``positive``) or not whole
    (``integer``)."""
    if key not in src:
        return default
    value = src[key]
    kind = "a positive whole number" if integer else "a positive number" if positive else "a number"
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and abs(value) <= FLOAT32_MAX  # the cameras hold float32
    if ok and positive:
        ok = value > 0
    if ok and integer:
        ok = float(value).is_integer()
    if not ok:
        raise InputError(f"{where}: {key!r} is {json.dumps(value)[:40]}; it must be {kind}, fix the file")
    return int(value) if integer else float(value)


def _image_path(directory: Path, file_path: str, json_path: Path) -> Path:
    """The image a frame names, inside the dataset folder (an absolute name, or one that climbs out of the
    folder by ``..`` or a symlink, is refused); ``.png`` is added when the name has none."""
    from microdreamer.io_utils import resolve_inside

    for name in (file_path, file_path + ".png"):
        candidate = resolve_inside(directory, name, "image", json_path)
        if candidate.is_file():
            return candidate
    if resolve_inside(directory, file_path, "image", json_path).is_dir():
        raise InputError(f"image {file_path!r} listed in {json_path} is a folder, not an image; fix the path")
    raise InputError(
        f"image {file_path!r} listed in {json_path} does not exist in {directory}; add it or fix the path"
    )


def _image_error(path: Path, e: Exception) -> InputError:
    reason = str(e).splitlines()[0] if str(e) else type(e).__name__
    return InputError(f"cannot read image {path} ({reason}); replace it with a valid PNG")


def _image_size(path: Path) -> tuple[int, int]:
    """(W, H) from the image's header, without decoding it."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as im:
            return im.size
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as e:
        raise _image_error(path, e) from None


def _read_image(path: Path) -> np.ndarray:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as im:
            if im.mode in ("I;16", "I;16B", "I"):  # 16-bit greyscale
                arr = np.asarray(im, dtype=np.float32) / 65535.0
                return np.concatenate([np.repeat(arr[..., None], 3, -1), np.ones_like(arr)[..., None]], -1)
            return np.asarray(im.convert("RGBA"), dtype=np.float32) / 255.0
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as e:
        raise _image_error(path, e) from None


def _frame_matrix(frame: dict, i: int, json_path: Path) -> np.ndarray:
    """The frame's 4x4 camera-to-world matrix: numbers, finite, bottom row (0, 0, 0, 1), and a rotation
    part that can be inverted (a camera needs three independent axes)."""
    where = f"frame {i} of {json_path}"
    try:
        m = np.asarray(frame["transform_matrix"], dtype=np.float64)
    except (KeyError, TypeError, ValueError) as e:
        raise InputError(f"{where} has no valid 'transform_matrix'; give a 4x4 matrix of numbers") from e
    if m.shape == (3, 4):
        m = np.concatenate([m, [[0.0, 0.0, 0.0, 1.0]]], axis=0)
    if m.shape != (4, 4):
        raise InputError(f"{where} has a 'transform_matrix' of shape {m.shape}; give a 4x4 matrix")
    if not np.isfinite(m).all():
        raise InputError(f"{where} has a 'transform_matrix' with NaN or infinite entries; fix the matrix")
    if np.abs(m).max() > MAX_MATRIX_ENTRY:  # float32 cameras: products of such entries overflow
        raise InputError(f"{where} has a 'transform_matrix' entry of {np.abs(m).max():.3g}; entries must be at "
                         f"most {MAX_MATRIX_ENTRY:g} in size, fix the matrix")  # fmt: skip
    if not np.allclose(m[3], [0.0, 0.0, 0.0, 1.0], atol=1e-6):
        raise InputError(
            f"{where} has a 'transform_matrix' whose last row is {m[3].tolist()}, not [0, 0, 0, 1]; "
            "give a camera-to-world matrix"
        )
    s = np.linalg.svd(m[:3, :3], compute_uv=False)
    if not s[-1] > 1e-6 * max(s[0], 1e-300):
        raise InputError(
            f"{where} has a singular 'transform_matrix' (its rotation part has no inverse: singular values "
            f"{', '.join(f'{v:.3g}' for v in s)}); give a camera-to-world matrix"
        )
    return m


def _load_frames(directory: Path, json_path: Path, held_out_default: bool):
    meta = _read_json(json_path)
    records = []
    for i, frame in enumerate(meta["frames"]):
        if not isinstance(frame, dict) or not isinstance(frame.get("file_path"), str):
            raise InputError(f"frame {i} of {json_path} has no 'file_path'; give each frame its image path")
        held = frame.get("held_out", held_out_default)
        if not (isinstance(held, bool) or (type(held) is int and held in (0, 1))):
            raise InputError(
                f"frame {i} of {json_path}: 'held_out' is {json.dumps(held)[:40]}; use true or false"
            )
        path = _image_path(directory, frame["file_path"], json_path)
        records.append(
            {"path": path, "c2w": _frame_matrix(frame, i, json_path), "held_out": bool(held), "frame": frame}
        )
    return meta, records


def _check_images(records: list[dict], meta: dict, json_path: Path) -> tuple[int, int]:
    """(W, H) of the dataset from the image headers: one size for all, the size the JSON states, and
    memory for all of them, checked before any image is decoded."""
    from microdreamer.io_utils import check_memory

    sizes = [_image_size(r["path"]) for r in records]
    W, H = sizes[0]
    for r, (w, h) in zip(records, sizes, strict=True):
        if (w, h) != (W, H):
            raise InputError(
                f"image {r['path']} is {w}x{h} but {records[0]['path']} is {W}x{H}; all images of a "
                "dataset must have one size"
            )
    mw = _number(meta, "w", str(json_path), positive=True, integer=True)
    mh = _number(meta, "h", str(json_path), positive=True, integer=True)
    if (mw is not None and mw != W) or (mh is not None and mh != H):
        raise InputError(
            f"{json_path} says images are {meta.get('w')}x{meta.get('h')} "
            f"but {records[0]['path']} is {W}x{H}; fix 'w'/'h' or the images"
        )
    # float32 RGBA per image, the list and the stacked copy
    check_memory(3 * 16 * W * H * len(records), f"{json_path}: {len(records)} images of {W}x{H}",
                 "use fewer or smaller images")  # fmt: skip
    return W, H


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

    W, H = _check_images(records, meta, json_path)
    images = [_read_image(r["path"]) for r in records]
    for r, img in zip(records, images, strict=True):
        if img.shape[:2] != (H, W):  # a header that lied about the size
            raise InputError(
                f"image {r['path']} decodes to {img.shape[1]}x{img.shape[0]}, not {W}x{H}; replace it"
            )

    where = str(json_path)
    c2w = torch.tensor(np.stack([r["c2w"] for r in records]), dtype=torch.float32)
    angle = _number(meta, "camera_angle_x", where, positive=True)
    if angle is not None:
        if not angle < math.pi:
            raise InputError(f"{where}: 'camera_angle_x' is {angle:g} radians; it must be in (0, pi), fix it")
        fov = angle
    elif "fl_x" in meta:
        fov = 2 * math.atan(W / (2 * _number(meta, "fl_x", where, positive=True)))
    else:
        raise InputError(f"{json_path} has neither 'camera_angle_x' nor 'fl_x'; give the field of view")
    cams = cameras_from_c2w_opengl(c2w, fov, W, H, axis="x")
    Ks = cams.Ks.clone()
    for i, r in enumerate(records):
        src = {**{k: meta[k] for k in ("fl_x", "fl_y", "cx", "cy") if k in meta}, **r["frame"]}
        frame_where = f"frame {i} of {json_path}"
        fl_x = _number(src, "fl_x", frame_where, positive=True)
        if fl_x is not None:
            Ks[i, 0, 0] = fl_x
            Ks[i, 1, 1] = _number(src, "fl_y", frame_where, positive=True, default=fl_x)
        if "cx" in src:
            Ks[i, 0, 2] = _number(src, "cx", frame_where)
        if "cy" in src:
            Ks[i, 1, 2] = _number(src, "cy", frame_where)
    near = _number(meta, "near", where, positive=True, default=cams.near)
    far = _number(meta, "far", where, positive=True, default=cams.far)
    if not near < far:
        raise InputError(f"{where}: 'near' {near:g} is not below 'far' {far:g}; fix them")
    cams = Cameras(cams.viewmats, Ks, W, H, near=near, far=far)
    norm = None
    if isinstance(meta.get("normalization"), dict):
        try:
            n = meta["normalization"]
            norm = Normalization(n["center"], n["scale"], n.get("rotation"))
            if not (np.isfinite(norm.center).all() and math.isfinite(norm.scale) and norm.scale > 0):
                raise ValueError("not finite and positive")
        except (KeyError, TypeError, ValueError) as e:
            raise InputError(
                f"{json_path} has an invalid 'normalization'; give center [x, y, z], a positive scale and "
                "optionally rotation (3 x 3, proper)"
            ) from e
    return Dataset(
        images=torch.from_numpy(np.stack(images)).float(),
        cameras=cams,
        held_out=torch.tensor([r["held_out"] for r in records], dtype=torch.bool),
        names=[r["path"].stem for r in records],
        normalization=norm,
    )
