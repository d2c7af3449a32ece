"""Input preparation for image-to-3D: foreground mask, recentring, white background, 256^2.

Stage function :func:`prepare_image`. The foreground comes from, in order of preference:

1. the image's own alpha channel (RGBA, LA, or a palette image with transparency), when it is not
   fully opaque;
2. ``rembg``, only if it is installed *and* its model file is already on disk (``$U2NET_HOME`` or
   ``~/.u2net/<model>.onnx``): nothing is ever downloaded;
3. OpenCV's GrabCut initialised with the frame minus a margin (the object is assumed to be inside).

The object's bounding box is then scaled so that its longer side fills ``object_fraction`` of the
output frame, centred, and composited on white (premultiplied resampling, so no dark fringes).
"""

from __future__ import annotations

import importlib.util
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from microdreamer.config import ImageConfig
from microdreamer.errors import InputError
from microdreamer.image_io import decode_errors, standard_image
from microdreamer.io_utils import check_memory

logger = logging.getLogger(__name__)

#: GrabCut's smallest input: a margin of background around a rectangle that holds both classes
GRABCUT_MIN_SIZE = 16


@dataclass
class PreparedImage:
    """A prepared input view.

    Attributes:
        rgb: [3, S, S] float32 in [0, 1], the object composited on white.
        mask: [1, S, S] float32 in [0, 1], its alpha.
        method: where the mask came from: "alpha", "rembg" or "grabcut".
    """

    rgb: torch.Tensor
    mask: torch.Tensor
    method: str

    def save(self, path: str | os.PathLike) -> Path:
        """Write the prepared view as a straight-RGBA PNG (atomically): what the model is given, with
        the mask it used as alpha."""
        from PIL import Image

        from microdreamer.io_utils import atomic_path

        path = Path(path)
        with atomic_path(path) as tmp:
            Image.fromarray(self.rgba_uint8(), "RGBA").save(tmp, format="PNG")
        return path

    def rgba_uint8(self) -> np.ndarray:
        """[S, S, 4] uint8 straight RGBA (for saving)."""
        a = self.mask[0].numpy()
        fg = np.where(a > 0, (self.rgb.numpy() - (1 - a)) / np.maximum(a, 1e-8), 1.0).clip(0, 1)
        rgba = np.concatenate([fg, a[None]], 0).transpose(1, 2, 0)
        return (rgba * 255 + 0.5).astype(np.uint8)


# ------------------------------------------------------------------------------------------- loading
def load_image(path: str | os.PathLike) -> np.ndarray:
    """[H, W, 4] float32 straight RGBA in [0, 1] (alpha 1 where the file has none), upright as its
    EXIF orientation says, 16-bit greyscale scaled from 0..65535 (:func:`~microdreamer.image_io.standard_image`).

    Raises:
        InputError: the file is missing, not an image Pillow reads, or has samples out of range.
    """
    from PIL import Image

    path = Path(path)
    if path.is_dir():
        raise InputError(f"{path}: is a folder, not an image; give a PNG or JPEG file")
    if not path.is_file():
        raise InputError(f"{path}: no such image file")
    try:
        with Image.open(path) as im:
            w, h = im.size
            # float32 RGBA, its copies in preparation (alpha, premultiplied, crop): ~5 of them
            check_memory(5 * 16 * w * h, f"{path}: an image of {w}x{h} pixels", "give a smaller image")
            # the bit depth scaled (a 16-bit greyscale PNG is not clipped to white) and the EXIF
            # orientation applied (a photo taken upright is prepared upright)
            im = standard_image(im, path, orient=True)
            arr = np.asarray(im, dtype=np.float32) / 255.0
    except InputError:
        raise
    except decode_errors() as e:
        raise InputError(
            f"{path}: cannot read the image ({e.__class__.__name__}); give a PNG or JPEG"
        ) from None
    if arr.shape[-1] == 3:
        arr = np.concatenate([arr, np.ones_like(arr[..., :1])], -1)
    return arr


# ----------------------------------------------------------------------------------------- foreground
def rembg_model_path(model: str = "u2net") -> Path:
    """Where rembg keeps ``model``'s ONNX file."""
    home = os.environ.get("U2NET_HOME", os.path.join(os.path.expanduser("~"), ".u2net"))
    return Path(home) / f"{model}.onnx"


def rembg_usable(model: str = "u2net") -> bool:
    """rembg is installed and ``model`` is on disk (so using it downloads nothing)."""
    return importlib.util.find_spec("rembg") is not None and rembg_model_path(model).is_file()


def mask_rembg(rgb: np.ndarray, model: str = "u2net") -> np.ndarray:
    """[H, W] float32 alpha from rembg. ``rgb``: [H, W, 3] float32 in [0, 1]."""
    from PIL import Image
    from rembg import new_session, remove

    pil = Image.fromarray((rgb * 255 + 0.5).astype(np.uint8))
    out = remove(pil, session=new_session(model))
    return np.asarray(out.convert("RGBA"), dtype=np.float32)[..., 3] / 255.0


def mask_grabcut(rgb: np.ndarray, margin: float = 0.05, iterations: int = 5) -> np.ndarray:
    """[H, W] float32 {0, 1} foreground by GrabCut from the rectangle that leaves ``margin`` of each side.

    ``rgb``: [H, W, 3] float32 in [0, 1].
    """
    import cv2

    h, w = rgb.shape[:2]
    bgr = np.ascontiguousarray((rgb[..., ::-1] * 255 + 0.5).astype(np.uint8))
    mx, my = max(1, int(round(margin * w))), max(1, int(round(margin * h)))
    rect = (mx, my, max(1, w - 2 * mx), max(1, h - 2 * my))
    mask = np.zeros((h, w), np.uint8)
    bgd, fgd = np.zeros((1, 65), np.float64), np.zeros((1, 65), np.float64)
    cv2.grabCut(bgr, mask, rect, bgd, fgd, iterations, cv2.GC_INIT_WITH_RECT)
    return ((mask == cv2.GC_FGD) | (mask == cv2.GC_PR_FGD)).astype(np.float32)


def foreground(rgba: np.ndarray, config: ImageConfig, name: str = "image") -> tuple[np.ndarray, str]:
    """[H, W] float32 alpha of the object and the method used (see the module docstring)."""
    alpha = rgba[..., 3]
    method = config.background
    if method in ("auto", "alpha") and alpha.min() < 1.0:
        return alpha, "alpha"
    if method == "alpha":
        raise InputError(
            f"{name}: has no transparency to use as the mask; give an RGBA image or use another method"
        )
    rgb = rgba[..., :3]
    if method == "rembg" or (method == "auto" and rembg_usable(config.rembg_model)):
        if not rembg_usable(config.rembg_model):
            raise InputError(
                f"{name}: rembg is not installed or its model {rembg_model_path(config.rembg_model)} is not on disk; "
                f"install it with the model, or use another background method"
            )
        return mask_rembg(rgb, config.rembg_model), "rembg"
    if importlib.util.find_spec("cv2") is None:
        raise InputError(
            f"{name}: has no alpha channel and no background remover is available; give an RGBA PNG, or "
            f"pip install opencv-python-headless (GrabCut) or rembg with its model on disk"
        )
    h, w = rgb.shape[:2]
    if min(h, w) < GRABCUT_MIN_SIZE:
        raise InputError(
            f"{name}: is {w}x{h} pixels with no alpha channel; GrabCut needs at least "
            f"{GRABCUT_MIN_SIZE}x{GRABCUT_MIN_SIZE} to tell the object from the background, give a larger "
            "image or an RGBA one"
        )
    logger.warning("%s: no alpha channel: the foreground is estimated with GrabCut (a rough cut; give an RGBA "
                   "image, or install rembg with its model, for a better mask)", name)  # fmt: skip
    import cv2

    try:
        return mask_grabcut(rgb, config.grabcut_margin, config.grabcut_iterations), "grabcut"
    except cv2.error as e:
        reason = str(e).strip().splitlines()[-1][:80] if str(e).strip() else "cv2.error"
        raise InputError(
            f"{name}: GrabCut could not separate the object ({reason}); give an RGBA image with the object's mask"
        ) from None


# ----------------------------------------------------------------------------------------- recentring
def _resize(channels: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """[h, w, K] float32 -> [size[1], size[0], K], antialiased bilinear (Pillow, per channel)."""
    from PIL import Image

    out = [
        np.asarray(
            Image.fromarray(np.ascontiguousarray(channels[..., k])).resize(size, Image.Resampling.BILINEAR)
        )
        for k in range(channels.shape[-1])
    ]
    return np.stack(out, -1)


def recenter(
    rgb: np.ndarray, alpha: np.ndarray, config: ImageConfig, name: str = "image"
) -> tuple[np.ndarray, np.ndarray]:
    """Crop to the object, scale its longer side to ``object_fraction * size``, centre it.

    Args:
        rgb: [H, W, 3] float32 straight colour in [0, 1].
        alpha: [H, W] float32 in [0, 1].

    Returns:
        ([S, S, 3] colour composited on white, [S, S] alpha), float32.
    """
    S = config.size
    prem = np.concatenate([rgb * alpha[..., None], alpha[..., None]], -1)  # premultiplied RGBA
    if config.recenter:
        ys, xs = np.nonzero(alpha > config.bbox_alpha)
        if ys.size == 0:
            raise InputError(
                f"{name}: the foreground mask is empty (no object found); give an RGBA image of the object"
            )
        y0, y1, x0, x1 = ys.min(), ys.max() + 1, xs.min(), xs.max() + 1
        crop = prem[y0:y1, x0:x1]
        h, w = y1 - y0, x1 - x0
        scale = config.object_fraction * S / max(h, w)
        nh, nw = max(1, min(S, int(round(h * scale)))), max(1, min(S, int(round(w * scale))))
        canvas = np.zeros((S, S, 4), np.float32)
        top, left = (S - nh) // 2, (S - nw) // 2
        canvas[top : top + nh, left : left + nw] = _resize(crop, (nw, nh))
    else:
        canvas = _resize(prem, (S, S))
    a = canvas[..., 3].clip(0, 1)
    color = np.minimum(canvas[..., :3], a[..., None]).clip(0, None)  # premultiplied colour <= alpha
    return color + (1.0 - a[..., None]), a


def prepare_image(image: str | os.PathLike | np.ndarray, config: ImageConfig | None = None) -> PreparedImage:
    """Load (or take) an image, find the object, recentre it and composite it on white.

    Args:
        image: a path, or an [H, W, 3|4] array (uint8 0..255 or float 0..1, straight alpha).
        config: :class:`ImageConfig`.

    Returns:
        :class:`PreparedImage` (rgb [3, S, S], mask [1, S, S], method).
    """
    config = config or ImageConfig()
    if isinstance(image, np.ndarray):
        name = "image"
        arr = image.astype(np.float32) / (255.0 if image.dtype == np.uint8 else 1.0)
        if arr.ndim != 3 or arr.shape[-1] not in (3, 4):
            raise InputError(f"image: expected an [H, W, 3|4] array, got shape {arr.shape}")
        if arr.shape[-1] == 3:
            arr = np.concatenate([arr, np.ones_like(arr[..., :1])], -1)
    else:
        name = str(image)
        arr = load_image(image)
    alpha, method = foreground(arr, config, name)
    rgb, a = recenter(arr[..., :3], alpha.astype(np.float32), config, name)
    return PreparedImage(
        rgb=torch.from_numpy(np.ascontiguousarray(rgb.transpose(2, 0, 1))).float(),
        mask=torch.from_numpy(np.ascontiguousarray(a[None])).float(),
        method=method,
    )
