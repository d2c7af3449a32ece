"""Turntable renders of a mesh or a splat: .mp4 / .gif videos and a .png contact sheet.

:func:`render_turntable` renders ``frames`` views on a circle at one elevation (the camera orbits the
object's bounding-box centre, framed so its bounding sphere fills the view) and writes:

* ``.mp4``: H.264 through imageio with the imageio-ffmpeg backend (optional packages: without them a
  one-line error suggests ``.gif``);
* ``.gif``: through Pillow (looping, 256-colour palette per frame);
* ``.png``: a contact sheet of ``sheet_views`` views (default 8, as 2 rows of 4), azimuths spread
  evenly from 0.

The file is written to a temporary name and renamed when complete. :func:`load_renderable` opens
what ``microdreamer render`` is given: a 3DGS PLY as a :class:`~microdreamer.splat.Splat`, anything
else (OBJ, GLB, a mesh PLY) as a :class:`~microdreamer.mesh.Mesh`.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np
import torch

from microdreamer.config import TurntableConfig
from microdreamer.errors import InputError
from microdreamer.formats import is_splat
from microdreamer.io_utils import atomic_path, check_output_path

logger = logging.getLogger(__name__)

FORMATS = (".mp4", ".gif", ".png")


def load_renderable(path: str | os.PathLike):
    """A splat (any format :mod:`microdreamer.formats` reads) or a mesh (OBJ, GLB/glTF, mesh PLY, OFF,
    STL) to render.

    Raises:
        InputError: the file is missing or unreadable (from the loaders).
    """
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path} does not exist; give a splat .ply or a mesh (.glb, .obj, .ply)")
    if is_splat(path):
        from microdreamer.splat import read_splat

        return read_splat(path)
    from microdreamer.mesh.load import load_textured_mesh

    return load_textured_mesh(path)


def turn_upright(source, up: str):
    """A splat or a mesh turned so that its up axis ``up`` (``+y``, ``-y``, ``+z``, ``-z``, or ``auto``:
    :func:`microdreamer.orient.resolve_up`) points up (+y: the turntable's axis and the image's up);
    ``source`` itself for ``+y``."""
    from microdreamer.orient import resolve_up, up_rotation

    up = resolve_up(source, up)[0]
    if up == "+y":
        return source
    from microdreamer.splat import Splat

    rotation = np.asarray(up_rotation(up), dtype=np.float64)
    if isinstance(source, Splat):
        return source.transformed(rotation)
    return source.transformed(np.zeros(3), 1.0, rotation)


def splat_framing(splat) -> tuple[torch.Tensor, float]:
    """Centre and radius of a splat: robust to floaters (0.5% / 99.5% quantiles of the visible centres)."""
    with torch.no_grad():
        opac = splat.opacities().float()
        means = splat.means.float()[opac > 0.005]
        if means.shape[0] == 0:
            means = splat.means.float()
        if means.shape[0] == 0:
            return torch.zeros(3), 1.0
        lo = torch.quantile(means.cpu(), 0.005, dim=0)
        hi = torch.quantile(means.cpu(), 0.995, dim=0)
        center = (lo + hi) / 2
        inside = ((means.cpu() >= lo) & (means.cpu() <= hi)).all(-1)
        radius = float((means.cpu()[inside] - center).norm(dim=-1).max()) if inside.any() else 1.0
        radius += 2.0 * float(splat.scales().float().median())
    return center, max(radius, 1e-6)


def turntable_frames(
    source,
    azimuths_deg: Sequence[float],
    elevation_deg: float = 0.0,
    size: int = 512,
    fovy_deg: float = 49.1,
    margin: float = 1.1,
    background: Sequence[float] = (1.0, 1.0, 1.0),
    device: str | torch.device = "cpu",
    backend: str = "auto",
    ssaa: int = 2,
    batch: int = 4,
    frame: tuple[torch.Tensor, float] | None = None,
) -> Iterator[np.ndarray]:
    """Render ``source`` from each azimuth; yields [H, W, 3] uint8 frames (H = W = size).

    Args:
        source: a :class:`~microdreamer.splat.Splat` or a :class:`~microdreamer.mesh.Mesh`.
        azimuths_deg: one frame per azimuth (0 = from +z).
        elevation_deg: MicroDreamer's sign (negative = above).
        fovy_deg, margin: framing (camera distance = margin * radius / sin(fovy / 2)).
        background: RGB in [0, 1].
        device: where to render.
        backend: Gaussian renderer backend (splats).
        ssaa: supersampling of the mesh renderer (antialiased edges).
        batch: views rendered at once.
        frame: (centre [3], radius) of the sphere the views frame; None: the source's own (so two
            sources rendered with one ``frame`` are seen from the same cameras).
    """
    from microdreamer.cameras import centred_orbit_cameras, framing
    from microdreamer.splat import Splat

    device = torch.device(device)
    if isinstance(source, Splat):
        splat = source.to(device)
        center, radius = splat_framing(splat)
        mesh = None
    else:
        mesh = source
        if mesh.num_faces == 0:
            raise InputError("the mesh to render has no faces; give a triangle mesh")
        center, radius = framing(torch.as_tensor(mesh.vertices))
        splat = None
    if frame is not None:
        center, radius = torch.as_tensor(frame[0], dtype=torch.float32), float(frame[1])
    az = torch.as_tensor(list(azimuths_deg), dtype=torch.float32)
    cams = centred_orbit_cameras(
        torch.full_like(az, float(elevation_deg)), az, center, radius, fovy_deg, size, margin
    ).to(device)
    for b in range(0, len(cams), batch):
        part = cams[b : b + batch]
        with torch.no_grad():
            if splat is not None:
                from microdreamer.render.gaussians import render

                rgb = render(splat, part, background=background, backend=backend).rgb
            else:
                from microdreamer.render.mesh import render_mesh

                rgb = render_mesh(mesh, part, background=background, ssaa=ssaa).rgb
        frames = (rgb.clamp(0, 1) * 255.0).round().to(torch.uint8).cpu().numpy()
        yield from frames


def contact_sheet(
    frames: Sequence[np.ndarray], columns: int = 4, fill: Sequence[int] | None = None
) -> np.ndarray:
    """Tile equally sized [H, W, 3] uint8 frames into a grid ``columns`` wide (row-major), filling a
    short last row with ``fill`` (default: the first frame's corner colour)."""
    n = len(frames)
    h, w = frames[0].shape[:2]
    rows = -(-n // columns)
    sheet = np.empty((rows * h, columns * w, 3), np.uint8)
    sheet[:] = frames[0][0, 0] if fill is None else fill
    for i, frame in enumerate(frames):
        r, c = divmod(i, columns)
        sheet[r * h : (r + 1) * h, c * w : (c + 1) * w] = frame
    return sheet


def _mp4_available() -> bool:
    return (
        importlib.util.find_spec("imageio") is not None
        and importlib.util.find_spec("imageio_ffmpeg") is not None
    )


def render_turntable(
    source,
    output: str | os.PathLike,
    config: TurntableConfig | None = None,
    background: Sequence[float] = (1.0, 1.0, 1.0),
    device: str | torch.device = "cpu",
    backend: str = "auto",
    ssaa: int = 2,
    progress: bool = True,
    say: Callable[[str], None] | None = None,
) -> Path:
    """Render a turntable of ``source`` to ``output`` (.mp4, .gif or .png contact sheet); a splat is
    cropped to ``config.crop`` after it is turned upright (``say`` gets the line naming the box).

    Args:
        source: a path (see :func:`load_renderable`), a Splat or a Mesh.
        output: the file to write; its suffix picks the format.
        config: frames (over one full turn, azimuth 0 to 360 - 360 / frames), size, elevation, fps,
            contact-sheet views, the input's up axis (defaults:
            :class:`~microdreamer.config.TurntableConfig`). A mesh without colour is shaded by a head
            light (Lambertian plus ambient) instead of rendering as a flat silhouette.
        background: RGB in [0, 1].
        device, backend, ssaa: see :func:`turntable_frames`.
        progress: show a tqdm bar over the frames.

    Returns:
        ``output`` as a Path.

    Raises:
        InputError: unknown suffix, missing output folder, .mp4 without imageio-ffmpeg, unreadable
            input.
    """
    output = check_output_path(output, FORMATS, "turntable")
    suffix = output.suffix.lower()
    if suffix == ".mp4" and not _mp4_available():
        raise InputError(
            f"{output}: writing .mp4 needs imageio and imageio-ffmpeg (pip install imageio imageio-ffmpeg); "
            "or write a .gif instead"
        )
    config = config or TurntableConfig()
    if isinstance(source, str | os.PathLike):
        source = load_renderable(source)
    source = turn_upright(source, config.up)
    if config.crop:
        from microdreamer.crop import crop_splat, resolve_crop

        if not hasattr(source, "means"):
            raise InputError(f"--crop {config.crop}: crops a splat; {output.name}'s input is a mesh")
        box = resolve_crop(source, config.crop)
        (say or logger.info)(box.describe())
        source = crop_splat(source, box)
    count = config.sheet_views if suffix == ".png" else config.frames
    azimuths = [360.0 * k / count for k in range(count)]
    it = turntable_frames(
        source,
        azimuths,
        config.elevation_deg,
        config.size,
        background=background,
        device=device,
        backend=backend,
        ssaa=ssaa,
    )
    if progress:
        from tqdm.auto import tqdm

        it = tqdm(it, total=count, desc="render", unit="frame", leave=False)
    with atomic_path(output) as tmp:
        if suffix == ".mp4":
            import imageio.v2 as imageio

            writer = imageio.get_writer(
                str(tmp),
                format="FFMPEG",
                fps=config.fps,
                codec="libx264",
                quality=8,
                pixelformat="yuv420p",
                macro_block_size=2,
            )
            try:
                for frame in it:
                    writer.append_data(frame)
            finally:
                writer.close()
        else:
            from PIL import Image

            images = list(it)
            if suffix == ".gif":
                pil = [Image.fromarray(f) for f in images]
                pil[0].save(
                    tmp,
                    format="GIF",
                    save_all=True,
                    append_images=pil[1:],
                    duration=max(1, round(1000 / config.fps)),
                    loop=0,
                )
            else:
                Image.fromarray(contact_sheet(images)).save(tmp, format="PNG")
    logger.info("wrote %s (%d %s)", output, count, "views" if suffix == ".png" else "frames")
    return output


def orbit_previews(
    splat,
    elevation_deg: float,
    size: int = 256,
    count: int = 8,
    radius: float = 2.0,
    fovy_deg: float = 49.1,
    backend: str = "auto",
    start_deg: float = 0.0,
) -> np.ndarray:
    """[count, size, size, 3] uint8 renders of a splat on white from MicroDreamer's orbit (around the
    origin at ``radius``, as SIR sees it) at azimuths ``start_deg`` + 0, 360 / count, ... and one elevation."""
    from microdreamer.cameras import orbit_cameras
    from microdreamer.render.gaussians import render

    az = float(start_deg) + torch.arange(count, dtype=torch.float32) * (360.0 / count)
    el = torch.full((count,), float(elevation_deg))
    cams = orbit_cameras(el, az, torch.full((count,), float(radius)), fovy_deg, size, size)
    with torch.no_grad():
        out = render(splat, cams.to(splat.device), background=(1.0, 1.0, 1.0), backend=backend)
    return (out.rgb.clamp(0, 1).cpu().numpy() * 255 + 0.5).astype(np.uint8)


def save_contact_sheet(frames: np.ndarray, path: str | os.PathLike, columns: int = 4) -> Path:
    """Write [C, H, W, 3] uint8 frames as one PNG grid ``columns`` wide, a short row filled white
    (atomically; zlib level 1: 4x faster than the default, ~20 % larger)."""
    from PIL import Image

    path = Path(path)
    with atomic_path(path) as tmp:
        Image.fromarray(contact_sheet(list(frames), columns, fill=(255, 255, 255))).save(
            tmp, format="PNG", compress_level=1
        )
    return path


def labelled_sheet(
    rows: Sequence[Sequence[np.ndarray]],
    row_labels: Sequence[str] | None = None,
    column_labels: Sequence[str] | None = None,
    title: str | None = None,
    font_size: int = 14,
) -> np.ndarray:
    """A grid of equally sized [H, W, 3] uint8 images on white, labelled: ``column_labels`` above the
    columns, ``row_labels`` left of the rows, an optional ``title`` line on top. Returns the
    [H', W', 3] uint8 sheet."""
    from PIL import Image, ImageDraw, ImageFont

    font = ImageFont.load_default(font_size)
    h, w = rows[0][0].shape[:2]
    n_cols = max(len(r) for r in rows)
    pad = max(4, font_size // 3)
    line = font_size + 2 * pad

    def text_width(text: str) -> int:
        box = font.getbbox(text)
        return int(box[2] - box[0])

    left = max((text_width(t) for t in row_labels), default=0) + 2 * pad if row_labels else 0
    top = (line if title else 0) + (line if column_labels else 0)
    sheet = Image.new("RGB", (left + n_cols * w, top + len(rows) * h), (255, 255, 255))
    draw = ImageDraw.Draw(sheet)
    if title:
        draw.text((pad, pad), title, fill=(0, 0, 0), font=font)
    for c, text in enumerate(column_labels or ()):
        x = left + c * w + max(0, (w - text_width(text)) // 2)
        draw.text((x, top - line + pad), text, fill=(0, 0, 0), font=font)
    for r, images in enumerate(rows):
        for c, image in enumerate(images):
            sheet.paste(Image.fromarray(np.ascontiguousarray(image)), (left + c * w, top + r * h))
        if row_labels:
            draw.text((pad, top + r * h + (h - font_size) // 2), row_labels[r], fill=(0, 0, 0), font=font)
    return np.asarray(sheet)


def save_labelled_sheet(
    path: str | os.PathLike, rows, row_labels=None, column_labels=None, title=None
) -> Path:
    """:func:`labelled_sheet` written as a PNG (atomically)."""
    from PIL import Image

    path = Path(path)
    with atomic_path(path) as tmp:
        Image.fromarray(labelled_sheet(rows, row_labels, column_labels, title)).save(tmp, format="PNG")
    return path
