"""Image pixels as the file means them: one conversion for every reader of image files.

Pillow opens files in many modes, and ``convert("RGB")`` does not honour them all: a 16-bit greyscale
PNG (mode ``I;16``) converts by clipping each value to 255, so anything brighter than 255/65535 comes
out white; a JPEG's EXIF orientation is not applied, so a photo taken upright arrives on its side.
:func:`standard_image` turns any opened image into 8-bit ``RGB`` or ``RGBA`` with the bit depth scaled
(16- and 32-bit integers divided by 65535 after a range check, floats checked to lie in [0, 1]) and,
where asked, the EXIF orientation applied. Images a reader cannot honour (negative or out-of-range
samples, unknown modes) raise :class:`~microdreamer.errors.InputError` naming the file.

Orientation is applied to input images (the picture a user means: ``generate``'s input, ``evaluate``'s
reference image), not to mesh textures, whose pixels the UV coordinates address as stored.
"""

from __future__ import annotations

import os

import numpy as np

from microdreamer.errors import InputError

#: modes converted by Pillow as they are (8 bits per channel; "1" and "P" expand to them)
_EIGHT_BIT = ("1", "L", "P", "RGB", "RGBA", "LA", "PA", "RGBX", "RGBa", "La", "CMYK", "YCbCr")
#: integer modes of more than 8 bits: 16-bit greyscale (PNG, TIFF), and 32-bit as Pillow widens them
_WIDE_INT = ("I;16", "I;16L", "I;16B", "I;16N", "I")


def decode_errors() -> tuple[type[BaseException], ...]:
    """What Pillow raises for a file it cannot read, as readers catch it to raise one InputError line:
    unidentified or truncated data (OSError), a broken PNG (SyntaxError), bad header fields (ValueError,
    struct.error, IndexError, TypeError, KeyError, ZeroDivisionError, EOFError) and a decompression bomb.
    :class:`~microdreamer.errors.InputError` is a ValueError: catch it first and let it through."""
    import struct

    from PIL import Image

    return (
        OSError,
        ValueError,
        SyntaxError,
        EOFError,
        struct.error,
        IndexError,
        TypeError,
        KeyError,
        ZeroDivisionError,
        Image.DecompressionBombError,
    )


def _has_alpha(im) -> bool:
    return im.mode in ("RGBA", "LA", "PA", "RGBa", "La") or "transparency" in im.info


def standard_image(im, path: str | os.PathLike, orient: bool = True):
    """An opened Pillow image as 8-bit ``RGBA`` (when it has alpha or a transparent colour) or ``RGB``.

    Args:
        im: a ``PIL.Image.Image`` (decoded here if it is not yet).
        path: the file it came from, for messages.
        orient: apply the EXIF orientation (``ImageOps.exif_transpose``).

    Returns:
        A ``PIL.Image.Image`` of mode ``RGB`` or ``RGBA``: 16- and 32-bit integer greyscale scaled from
        0..65535 with rounding, float greyscale from 0..1, everything else as Pillow converts it.

    Raises:
        InputError: more pixels than ``PIL.Image.MAX_IMAGE_PIXELS`` (checked before decoding), samples
            outside the range the mode allows (negative, above 65535, not finite or outside [0, 1] for
            floats), or a mode this cannot convert.
    """
    from PIL import Image, ImageOps

    w, h = im.size
    if w * h > Image.MAX_IMAGE_PIXELS:  # before decoding: a 100-byte file may declare gigapixels
        raise InputError(
            f"{path}: is {w}x{h} pixels, more than the {Image.MAX_IMAGE_PIXELS} an image may have here "
            "(Pillow's decompression-bomb limit); give a smaller image"
        )
    if orient:
        try:
            im = ImageOps.exif_transpose(im)
        except (ValueError, TypeError, KeyError, SyntaxError, OSError) as e:  # a malformed EXIF block
            raise InputError(
                f"{path}: cannot apply the image's EXIF orientation ({type(e).__name__}); save the image "
                "again without EXIF data, or upright"
            ) from None
    if im.mode in _EIGHT_BIT:
        return im.convert("RGBA" if _has_alpha(im) else "RGB")
    if im.mode in _WIDE_INT or im.mode == "F":
        values = np.asarray(im)
        kind = "16-bit" if im.mode.startswith("I;16") else "32-bit integer" if im.mode == "I" else "float"
        if im.mode == "F":
            ok = bool(np.isfinite(values).all()) and (
                values.size == 0 or (values.min() >= 0 and values.max() <= 1)
            )
            top = 1.0
        else:
            ok = values.size == 0 or (int(values.min()) >= 0 and int(values.max()) <= 65535)
            top = 65535.0
        if not ok:
            rng = "0 to 1" if im.mode == "F" else "0 to 65535"
            raise InputError(
                f"{path}: a {kind} greyscale image with samples outside {rng}; save it as an 8- or 16-bit PNG"
            )
        grey = np.floor(values.astype(np.float64) * (255.0 / top) + 0.5).astype(np.uint8)
        return Image.fromarray(grey, "L").convert("RGB")
    try:
        return im.convert("RGBA" if _has_alpha(im) else "RGB")
    except (ValueError, OSError) as e:
        raise InputError(
            f"{path}: cannot convert an image of mode {im.mode} to RGB ({e}); save it as an 8-bit RGB(A) PNG"
        ) from None
