"""A capture's own cameras, read from the files that 3DGS trainers keep beside the splat.

Two layouts are read, both in the splat's own coordinates (the frame it was trained in):

* the INRIA trainer's ``cameras.json`` (``gaussian-splatting``'s output folder, also written by gsplat's
  and other trainers' exports): a list of ``{"position": [3], "rotation": [3][3], "fx", "fy", "width",
  "height", ...}``, ``rotation`` and ``position`` the camera-to-world rotation and the camera centre, camera
  axes as OpenCV's (x right, y down, z forward);
* ``transforms.json`` (nerfstudio, instant-ngp, the NeRF synthetic scenes): ``frames`` of
  ``transform_matrix`` (camera-to-world, OpenGL axes: x right, y up, z backward) with the intrinsics
  ``fl_x``, ``fl_y``, ``cx``, ``cy``, ``w``, ``h`` at the top or per frame, or ``camera_angle_x`` (and
  ``camera_angle_y``); without ``w`` and ``h`` the image is taken as square (only the field of view
  matters: the bake sizes its own renders).

:class:`~microdreamer.cameras.Cameras` holds one image size: frames of another size are scaled to the
first frame's, each axis by its own ratio (the same frustum). Distortion terms are ignored.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import torch

from microdreamer.cameras import Cameras
from microdreamer.errors import InputError

#: the size taken for a transforms.json that gives a field of view and no image size
SQUARE_SIZE = 800
#: how far a rotation may be from orthonormal (float32 files round their matrices)
ROTATION_TOL = 1e-3
_GL_TO_CV = np.diag([1.0, -1.0, -1.0])


def read_capture_cameras(path: str | os.PathLike) -> Cameras:
    """The cameras in ``path`` (an INRIA ``cameras.json`` or a ``transforms.json``, told apart by their
    content), world-to-camera in OpenCV axes, in the file's order.

    Raises:
        InputError: one line naming ``path``: unreadable, not JSON, neither layout, no camera, or a
            camera with a missing or non-finite value, a rotation that is not one, or a size below 1.
    """
    path = Path(path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"{path}: no such file; give a capture's cameras.json or transforms.json") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InputError(
            f"{path}: not a readable JSON file ({e}); give a cameras.json or transforms.json"
        ) from None
    try:
        if isinstance(doc, list):
            c2w, intr = _inria(doc)
        elif isinstance(doc, dict) and isinstance(doc.get("frames"), list):
            c2w, intr = _transforms(doc)
        else:
            raise ValueError(
                "neither an INRIA cameras.json (a list of cameras) nor a transforms.json (frames)"
            )
        if not c2w:
            raise ValueError("it holds no camera")
        return _cameras(np.stack(c2w), np.array(intr, dtype=np.float64))
    except (ValueError, TypeError, KeyError, IndexError) as e:
        detail = f"missing {e}" if isinstance(e, KeyError) else str(e)
        raise InputError(f"{path}: {detail}; give a capture's cameras.json or transforms.json") from None


def _number(value, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{what} must be a finite number, got {value!r}")
    return float(value)


def _matrix(value, shape: tuple[int, int], what: str) -> np.ndarray:
    m = np.array(value, dtype=object)
    if m.shape != shape:
        raise ValueError(f"{what} must be {shape[0]} x {shape[1]}, got shape {m.shape}")
    return np.array([[_number(x, what) for x in row] for row in m], dtype=np.float64)


def _rotation(r: np.ndarray, what: str) -> np.ndarray:
    if np.abs(r @ r.T - np.eye(3)).max() > ROTATION_TOL or abs(np.linalg.det(r) - 1.0) > ROTATION_TOL:
        raise ValueError(f"{what} is not a rotation (a scaled or mirrored matrix)")
    return r


def _size(value, what: str) -> int:
    v = _number(value, what)
    if v < 1 or v != int(v):
        raise ValueError(f"{what} must be a whole number of pixels >= 1, got {value!r}")
    return int(v)


def _inria(doc: list) -> tuple[list[np.ndarray], list[list[float]]]:
    c2w, intr = [], []
    for i, cam in enumerate(doc):
        if not isinstance(cam, dict):
            raise ValueError(f"camera {i} is not an object")
        name = f"camera {i}"
        rot = _rotation(_matrix(cam["rotation"], (3, 3), f"{name}'s rotation"), f"{name}'s rotation")
        pos = _matrix([cam["position"]], (1, 3), f"{name}'s position")[0]
        m = np.eye(4)
        m[:3, :3], m[:3, 3] = rot, pos
        w, h = _size(cam["width"], f"{name}'s width"), _size(cam["height"], f"{name}'s height")
        fx, fy = _number(cam["fx"], f"{name}'s fx"), _number(cam["fy"], f"{name}'s fy")
        c2w.append(m)
        intr.append([fx, fy, w / 2, h / 2, w, h])
    return c2w, intr


def _transforms(doc: dict) -> tuple[list[np.ndarray], list[list[float]]]:
    c2w, intr = [], []
    for i, frame in enumerate(doc["frames"]):
        if not isinstance(frame, dict):
            raise ValueError(f"frame {i} is not an object")
        name = f"frame {i}"
        gl = _matrix(frame["transform_matrix"], (4, 4), f"{name}'s transform_matrix")
        rot = _rotation(gl[:3, :3], f"{name}'s transform_matrix")
        m = np.eye(4)
        m[:3, :3], m[:3, 3] = rot @ _GL_TO_CV, gl[:3, 3]

        def get(key, frame=frame):
            return frame.get(key, doc.get(key))

        w, h = get("w"), get("h")
        if w is None or h is None:
            w = h = SQUARE_SIZE
        w, h = _size(w, f"{name}'s w"), _size(h, f"{name}'s h")
        fx, fy = get("fl_x"), get("fl_y")
        if fx is None and get("camera_angle_x") is not None:
            fx = 0.5 * w / math.tan(0.5 * _number(get("camera_angle_x"), "camera_angle_x"))
        if fy is None and get("camera_angle_y") is not None:
            fy = 0.5 * h / math.tan(0.5 * _number(get("camera_angle_y"), "camera_angle_y"))
        fx = fy if fx is None else fx
        fy = fx if fy is None else fy
        if fx is None:
            raise ValueError(f"{name} has no focal length (fl_x, fl_y or camera_angle_x)")
        fx, fy = _number(fx, f"{name}'s fl_x"), _number(fy, f"{name}'s fl_y")
        cx = _number(get("cx"), f"{name}'s cx") if get("cx") is not None else w / 2
        cy = _number(get("cy"), f"{name}'s cy") if get("cy") is not None else h / 2
        c2w.append(m)
        intr.append([fx, fy, cx, cy, w, h])
    return c2w, intr


def _cameras(c2w: np.ndarray, intr: np.ndarray) -> Cameras:
    """[C, 4, 4] OpenCV camera-to-world and [C, 6] (fx, fy, cx, cy, w, h) -> Cameras at the first size."""
    if (intr[:, :2] <= 0).any():
        raise ValueError("a focal length is not positive")
    w0, h0 = int(intr[0, 4]), int(intr[0, 5])
    sx, sy = w0 / intr[:, 4], h0 / intr[:, 5]
    Ks = np.zeros((len(intr), 3, 3))
    Ks[:, 0, 0], Ks[:, 1, 1] = intr[:, 0] * sx, intr[:, 1] * sy
    Ks[:, 0, 2], Ks[:, 1, 2] = intr[:, 2] * sx, intr[:, 3] * sy
    Ks[:, 2, 2] = 1.0
    viewmats = np.linalg.inv(c2w)
    return Cameras(torch.tensor(viewmats, dtype=torch.float32), torch.tensor(Ks, dtype=torch.float32), w0, h0)


def rotated(cameras: Cameras, rotation: torch.Tensor) -> Cameras:
    """``cameras`` in the world mapped by ``x -> R x`` (the splat's ``--up`` turn): the same views of
    the turned scene."""
    r = torch.eye(4, dtype=torch.float64)
    r[:3, :3] = torch.as_tensor(rotation, dtype=torch.float64)
    viewmats = (cameras.viewmats.double() @ r.T).float()
    return Cameras(viewmats, cameras.Ks, cameras.width, cameras.height, cameras.near, cameras.far)
