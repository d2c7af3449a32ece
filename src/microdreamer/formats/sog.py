"""PlayCanvas's SOG (SuperSplat, splat-transform), read and written: a ``meta.json`` and lossless WebP
images, either as files in a folder or bundled in one zip (``.sog``).

Version 2 (``"version": 2`` in meta.json; what splat-transform writes): pixel i of every image is
Gaussian i (row-major), and

* ``means_l.webp`` / ``means_u.webp``: the low and high bytes of 16-bit x, y, z in R, G, B, each a
  fraction of [mins, maxs] of ``sign(v) log(|v| + 1)``;
* ``quats.webp``: the smallest three components of the unit quaternion (w x y z order), each
  ``(v sqrt 2) * 0.5 + 0.5`` in 8 bits, and A = 252 + the largest component's index;
* ``scales.webp``: R, G, B index a 256-entry codebook of log-scales;
* ``sh0.webp``: R, G, B index a 256-entry codebook of f_dc; A is ``sigmoid(opacity)`` in 8 bits;
* ``shN_labels.webp`` / ``shN_centroids.webp`` (SH degree 1-3): a 16-bit palette index in R, G, and the
  palette (64 entries a row, ``K-1`` pixels an entry, R G B index a 256-entry codebook of SH values).

Version 1 (no ``version``; the first SOG files) stores linear [mins, maxs] ranges instead of codebooks;
it is read. The PLY frame. Written like splat-transform writes it (Morton order; codebooks by 1-D k-means;
the SH palette by k-means, here on a sample of up to 65536 Gaussians, then every Gaussian labelled).

Why our own code: no PyPI package reads or writes SOG (``sogs`` on PyPI writes version 1 with CUDA).

Quantisation (what the tests allow): positions 1/65535 of the log-transformed range, log-scales and f_dc
the codebook's spacing (about 1/256 of their range), opacity 1/255, quaternion components 1/180, SH the
palette's error (lossy: a nearest palette entry, like any SOG writer).
"""

from __future__ import annotations

import io
import json
import math
import os
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np

from microdreamer.errors import InputError
from microdreamer.formats.common import (
    SplatArrays,
    check_count,
    finish,
    logit,
    normalized_quats,
    sigmoid,
)

_SQRT2 = math.sqrt(2.0)
_OTHERS = np.array([[1, 2, 3], [0, 2, 3], [0, 1, 3], [0, 1, 2]])
# [largest, component]: where each quaternion component sits in (the three stored, the largest)
_FROM = np.array([[3 if c == big else list(_OTHERS[big]).index(c) for c in range(4)] for big in range(4)])
_K1 = {0: 0, 1: 3, 2: 8, 3: 15}
MAX_META_BYTES = 64 << 20
#: what zipfile raises for a damaged archive: a bad name (a flipped UTF-8 flag), an unknown compression
#: method, an encryption flag, a bad stream or size
_ZIP_ERRORS = (zipfile.BadZipFile, zlib.error, OSError, EOFError, UnicodeDecodeError, NotImplementedError,
               RuntimeError, ValueError)  # fmt: skip


def _loader(path: Path, name: str) -> tuple[dict, Callable[[str], bytes]]:
    """(meta, load(file name) -> bytes) of a .sog bundle, a folder holding meta.json, or a meta.json."""
    if path.is_dir():
        path = path / "meta.json"
        if not path.is_file():
            raise InputError(f"{name}: the folder has no meta.json; give a SOG folder, meta.json or .sog")
    if not path.exists():
        raise InputError(f"{name}: file not found; give a SOG meta.json or .sog")
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError as e:
        raise InputError(f"{name}: cannot open ({e.strerror}); check the file's permissions") from None
    if head.startswith(b"PK"):
        try:
            archive = zipfile.ZipFile(path)
        except _ZIP_ERRORS as e:
            raise InputError(f"{name}: not a readable .sog zip ({e}); export it again") from None
        members = {i.filename: i for i in archive.infolist()}

        def load(file: str) -> bytes:
            info = members.get(file)
            if info is None:
                raise InputError(
                    f"{name}: the bundle has no {file!r}; the .sog is incomplete, export it again"
                )
            if info.file_size > (1 << 31):
                raise InputError(f"{name}: {file!r} claims {info.file_size} bytes; the .sog is corrupt")
            try:
                return archive.read(info)
            except _ZIP_ERRORS as e:
                raise InputError(
                    f"{name}: {file!r} cannot be read from the bundle ({e}); export it again"
                ) from None

        meta_bytes = load("meta.json")
    else:
        folder = path.parent

        def load(file: str) -> bytes:
            target = (folder / file).resolve()
            if folder.resolve() not in target.parents:
                raise InputError(f"{name}: meta.json names {file!r}, outside its folder; refused")
            if not target.is_file():
                raise InputError(f"{name}: meta.json names {file!r}, which is missing beside it")
            return target.read_bytes()

        if path.stat().st_size > MAX_META_BYTES:
            raise InputError(f"{name}: meta.json of {path.stat().st_size} bytes; not a SOG meta.json")
        meta_bytes = path.read_bytes()
    try:
        meta = json.loads(meta_bytes)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InputError(f"{name}: meta.json is not valid JSON ({e}); export the SOG again") from None
    if not isinstance(meta, dict) or "means" not in meta:
        raise InputError(f"{name}: meta.json has no 'means'; not a SOG splat")
    return meta, load


_QUAT_COMPONENT = (np.arange(256, dtype=np.float64) / 255.0 * 2.0 - 1.0) / _SQRT2  # float64, as built
_OPACITY = logit(np.arange(256, dtype=np.float64) / 255.0)


def _image(load: Callable[[str], bytes], file: str, name: str, count: int) -> np.ndarray:
    """[H * W, 4] uint8 RGBA pixels of the WebP ``file`` (at least ``count`` of them)."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(load(file))) as im:
            w, h = im.size
            if w * h < count:
                raise InputError(
                    f"{name}: {file} holds {w * h} pixels for {count} Gaussians; the SOG is corrupt"
                )
            if w * h > 4 * count + (1 << 20):
                raise InputError(f"{name}: {file} is {w} x {h} for {count} Gaussians; the SOG is corrupt")
            rgba = np.asarray(im.convert("RGBA"))
    except InputError:
        raise
    except Exception as e:  # Pillow raises many kinds for a bad image
        raise InputError(f"{name}: {file} is not a readable WebP image ({e}); export the SOG again") from None
    return rgba.reshape(-1, 4)


def _files(meta: dict, key: str, n: int, name: str) -> list[str]:
    files = meta.get(key, {}).get("files") if isinstance(meta.get(key), dict) else None
    if not isinstance(files, list) or len(files) < n or not all(isinstance(f, str) for f in files[:n]):
        raise InputError(f"{name}: meta.json's {key!r} has no {n} file name(s); the SOG is corrupt")
    return files


def _floats(meta: dict, key: str, field: str, n: int, name: str) -> np.ndarray:
    try:
        v = np.asarray(meta[key][field], np.float64).reshape(-1)
    except (KeyError, TypeError, ValueError):
        raise InputError(
            f"{name}: meta.json's {key}.{field} is missing or not numbers; the SOG is corrupt"
        ) from None
    if v.size < n or not np.isfinite(v).all():
        raise InputError(f"{name}: meta.json's {key}.{field} needs {n} finite numbers; the SOG is corrupt")
    return v


def read(path: str | os.PathLike, progress=None) -> SplatArrays:
    """Read a SOG splat (a ``.sog`` bundle, a ``meta.json`` or the folder holding it; versions 1-2)."""
    path = Path(path)
    name = str(path)
    meta, load = _loader(path, name)
    version = meta.get("version")
    if version not in (None, 2):
        raise InputError(f"{name}: SOG version {version!r}; this reads versions 1 and 2")
    if version == 2:
        count = meta.get("count")
    else:
        shape = meta["means"].get("shape") if isinstance(meta["means"], dict) else None
        count = shape[0] if isinstance(shape, list) and shape else None
    if not isinstance(count, int):
        raise InputError(f"{name}: meta.json has no Gaussian count; the SOG is corrupt")
    count = check_count(name, count)
    if count == 0:
        raise InputError(f"{name}: the splat is empty (0 Gaussians); nothing to convert")
    lo = _image(load, _files(meta, "means", 2, name)[0], name, count)[:count]
    hi = _image(load, _files(meta, "means", 2, name)[1], name, count)[:count]
    mins, maxs = _floats(meta, "means", "mins", 3, name)[:3], _floats(meta, "means", "maxs", 3, name)[:3]
    # every code is decoded through a table of its values (float64, rounded to float32 once: the values
    # decoding each Gaussian in float64 gives), 65536 entries an axis for the 16-bit positions
    q16 = np.arange(65536, dtype=np.float64)[:, None] / 65535.0
    v = mins + np.where(maxs - mins == 0, 1.0, maxs - mins) * q16
    with np.errstate(over="ignore"):  # beyond float32: inf, which finish() refuses naming the Gaussians
        axis_values = (np.sign(v) * (np.exp(np.abs(v)) - 1.0)).astype(np.float32)  # [65536, 3]
    code = lo[:, :3].astype(np.intp) | (hi[:, :3].astype(np.intp) << 8)
    means = np.stack([axis_values[code[:, i], i] for i in range(3)], -1)
    qpix = _image(load, _files(meta, "quats", 1, name)[0], name, count)[:count]
    tag = qpix[:, 3].astype(np.int64)
    valid = (tag >= 252) & (tag <= 255)
    largest = np.clip(tag - 252, 0, 3)
    parts = np.empty((count, 4))  # the three stored components, then the largest
    parts[:, :3] = _QUAT_COMPONENT[qpix[:, :3]]
    r = parts[:, :3]
    parts[:, 3] = np.sqrt(np.maximum(0.0, 1.0 - (r[:, 0] * r[:, 0] + r[:, 1] * r[:, 1] + r[:, 2] * r[:, 2])))
    quats = np.take_along_axis(parts, _FROM[largest], axis=1).astype(np.float32)
    quats[~valid] = (1.0, 0.0, 0.0, 0.0)
    spix = _image(load, _files(meta, "scales", 1, name)[0], name, count)[:count]
    cpix = _image(load, _files(meta, "sh0", 1, name)[0], name, count)[:count]
    if version == 2:
        scode = _floats(meta, "scales", "codebook", 256, name)
        ccode = _floats(meta, "sh0", "codebook", 256, name)
        log_scales = scode.astype(np.float32)[spix[:, :3]]
        sh_dc = ccode.astype(np.float32)[cpix[:, :3]]
        opacity = _OPACITY[cpix[:, 3]]
    else:
        smin, smax = (
            _floats(meta, "scales", "mins", 3, name)[:3],
            _floats(meta, "scales", "maxs", 3, name)[:3],
        )
        cmin, cmax = _floats(meta, "sh0", "mins", 4, name)[:4], _floats(meta, "sh0", "maxs", 4, name)[:4]
        log_scales = smin + (smax - smin) * spix[:, :3] / 255.0
        c = cmin + (cmax - cmin) * cpix / 255.0
        sh_dc, opacity = c[:, :3], c[:, 3]
    sh_rest = np.zeros((count, 0, 3))
    if isinstance(meta.get("shN"), dict):
        sh_rest = _read_shn(meta, load, name, count, version)
    return finish(name, means, sh_dc, sh_rest, opacity, log_scales, quats)


def _read_shn(meta: dict, load, name: str, count: int, version) -> np.ndarray:
    files = _files(meta, "shN", 2, name)
    from PIL import Image

    try:
        with Image.open(io.BytesIO(load(files[0]))) as im:
            cw, ch = im.size
            if cw * ch > (1 << 26):
                raise InputError(f"{name}: {files[0]} is {cw} x {ch}; the SOG is corrupt")
            centroids = np.asarray(im.convert("RGBA"))
    except InputError:
        raise
    except Exception as e:
        raise InputError(
            f"{name}: {files[0]} is not a readable WebP image ({e}); export the SOG again"
        ) from None
    if version == 2:
        bands = meta["shN"].get("bands")
        if bands not in (1, 2, 3):
            raise InputError(f"{name}: meta.json's shN.bands is {bands!r}; expected 1-3")
        k1 = _K1[bands]
        palette = meta["shN"].get("count")
        if not isinstance(palette, int) or palette < 0:
            raise InputError(f"{name}: meta.json's shN.count is {palette!r}; the SOG is corrupt")
        code = _floats(meta, "shN", "codebook", 256, name)

        def dequant(b: np.ndarray) -> np.ndarray:
            return code[b]
    else:
        k1 = {192: 3, 512: 8, 960: 15}.get(cw)
        if k1 is None:
            raise InputError(f"{name}: {files[0]} is {cw} wide; expected 192, 512 or 960 (SOG version 1)")
        palette = (cw // k1) * ch
        lo_v = float(_floats(meta, "shN", "mins", 1, name)[0])
        hi_v = float(_floats(meta, "shN", "maxs", 1, name)[0])

        def dequant(b: np.ndarray) -> np.ndarray:
            return lo_v + (hi_v - lo_v) * b / 255.0

    if cw != 64 * k1:
        raise InputError(f"{name}: {files[0]} is {cw} wide, expected {64 * k1} for {k1} SH coefficients")
    labels = _image(load, files[1], name, count)[:count]
    label = labels[:, 0].astype(np.intp) | (labels[:, 1].astype(np.intp) << 8)
    # the palette decoded once (entry e's coefficients are pixels 64 e .. 64 e + K-2 of the rows laid
    # end to end), in float64 and rounded to float32 once, then gathered: the values of decoding each
    # Gaussian's pixels; labels beyond the palette get the zero entry appended at its end
    entries = min(palette, 64 * ch, 1 << 16)  # labels are 16 bits
    table = np.zeros((entries + 1, k1, 3), np.float32)
    table[:entries] = dequant(centroids[:, :, :3].reshape(ch * 64, k1, 3)[:entries])
    return table[np.where(label < entries, label, entries)]


# ----------------------------------------------------------------------------------------------- writing
def quantize_1d(values: np.ndarray, k: int = 256, iterations: int = 12) -> tuple[np.ndarray, np.ndarray]:
    """(codebook [k] float32 sorted, labels like ``values`` uint8): 1-D k-means of ``values``."""
    flat = np.asarray(values, np.float64).reshape(-1)
    order = np.sort(flat)
    centres = np.quantile(order, (np.arange(k) + 0.5) / k)
    csum = np.concatenate([[0.0], np.cumsum(order)])
    for _ in range(iterations):
        centres = np.unique(centres)
        bounds = np.searchsorted(order, (centres[1:] + centres[:-1]) / 2)
        edges = np.concatenate([[0], bounds, [order.size]])
        sizes = np.diff(edges)
        sums = csum[edges[1:]] - csum[edges[:-1]]
        keep = sizes > 0
        centres = sums[keep] / sizes[keep]
    centres = np.unique(centres)
    if centres.size < k:  # fewer distinct values than entries: pad beyond the top (never chosen)
        centres = np.concatenate([centres, centres[-1] + 1.0 + np.arange(k - centres.size)])
    mids = (centres[1:] + centres[:-1]) / 2
    labels = np.searchsorted(mids, flat).astype(np.uint8).reshape(np.shape(values))
    return centres.astype(np.float32), labels


def _nearest(x: np.ndarray, centres: np.ndarray, block: int = 16384) -> np.ndarray:
    """[N] the index of each row of ``x`` [N, D]'s nearest row of ``centres`` [K, D] (float32 BLAS)."""
    c = centres.astype(np.float32)
    cc = np.square(c).sum(-1)
    out = np.empty(len(x), np.int64)
    for s in range(0, len(x), block):
        xb = x[s : s + block].astype(np.float32)
        out[s : s + block] = (cc[None] - 2.0 * xb @ c.T).argmin(-1)
    return out


def kmeans(
    x: np.ndarray, k: int, iterations: int = 10, sample: int = 65536, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """(centres [k', D], labels [N]) of k-means on the rows of ``x`` [N, D] (k' <= k): Lloyd iterations
    on a random sample of at most ``sample`` rows, then every row labelled with its nearest centre."""
    n = len(x)
    rng = np.random.default_rng(seed)
    pts = x if n <= sample else x[rng.choice(n, sample, replace=False)]
    pts = pts.astype(np.float32)
    k = min(k, len(pts))
    centres = pts[rng.choice(len(pts), k, replace=False)].copy()
    # as many centres as sampled rows: every row is a centre and its own nearest, so Lloyd's steps would
    # leave the centres as they are (a million-row SOG's 64k palette from a 64k sample): skipped
    for _ in range(iterations if k < len(pts) else 0):
        lab = _nearest(pts, centres)
        counts = np.bincount(lab, minlength=k)
        sums = np.zeros_like(centres, dtype=np.float64)
        np.add.at(sums, lab, pts)
        filled = counts > 0
        centres[filled] = (sums[filled] / counts[filled, None]).astype(np.float32)
    return centres, (
        _nearest(x, centres) if len(centres) <= EXACT_LABELS else _nearest_grouped(x, centres, seed)
    )


#: palettes up to this many centres label every row with its exact nearest centre; larger ones search the
#: centres of a few groups only (:func:`_nearest_grouped`)
EXACT_LABELS = 4096


def _nearest_grouped(x: np.ndarray, centres: np.ndarray, seed: int = 0, probes: int = 8) -> np.ndarray:
    """[N] a near (not always the nearest) centre of ``centres`` [K, D] for each row of ``x`` [N, D]:
    the centres are grouped by k-means into sqrt(K) groups; the rows nearest a group search the centres
    of the ``probes`` groups nearest that group's mean. N K D work becomes about N (sqrt(K) + probes K /
    sqrt(K)) D: for a million rows and a 64k palette, a fortieth. (The palette is lossy either way; the
    test bounds the error against the exact search.)"""
    k = len(centres)
    groups = max(2, int(math.sqrt(k)))
    means, member = kmeans(centres, groups, iterations=6, sample=k, seed=seed)
    means = means.astype(np.float32)
    near = np.argsort(((means[:, None] - means[None]) ** 2).sum(-1), axis=1)[:, :probes]  # [G, probes]
    row_group = _nearest(x, means)
    out = np.empty(len(x), np.int64)
    order = np.argsort(member, kind="stable")
    starts = np.searchsorted(member[order], np.arange(len(means) + 1))
    for g in range(len(means)):
        rows = np.flatnonzero(row_group == g)
        if rows.size == 0:
            continue
        cand = np.concatenate([order[starts[h] : starts[h + 1]] for h in near[g]])
        if cand.size == 0:  # groups without centres (an empty k-means cluster): every centre
            cand = np.arange(k)
        out[rows] = cand[_nearest(x[rows], centres[cand])]
    return out


def _webp(rgba: np.ndarray, width: int, height: int) -> bytes:
    from PIL import Image

    pixels = np.zeros((width * height, 4), np.uint8)
    pixels[: len(rgba)] = rgba
    buf = io.BytesIO()
    Image.fromarray(pixels.reshape(height, width, 4), "RGBA").save(
        buf, "WEBP", lossless=True, quality=20, method=1, exact=True
    )
    return buf.getvalue()


def encode(arrays: SplatArrays) -> dict[str, bytes]:
    """The files of a version-2 SOG of ``arrays``: ``{"meta.json": ..., "means_l.webp": ..., ...}``."""
    from microdreamer.formats.compressed_ply import morton_order

    a = arrays.subset(morton_order(arrays.means))
    n = len(a)
    width = int(math.ceil(math.sqrt(n) / 4) * 4)
    height = int(math.ceil(n / width / 4) * 4)
    files: dict[str, bytes] = {}

    v = np.sign(a.means.astype(np.float64)) * np.log1p(np.abs(a.means.astype(np.float64)))
    mins, maxs = v.min(0), v.max(0)
    q16 = np.clip(np.round((v - mins) / np.where(maxs > mins, maxs - mins, 1.0) * 65535), 0, 65535)
    q16 = q16.astype(np.uint16)
    full = np.full((n, 1), 255, np.uint8)
    files["means_l.webp"] = _webp(np.concatenate([(q16 & 0xFF).astype(np.uint8), full], 1), width, height)
    files["means_u.webp"] = _webp(np.concatenate([(q16 >> 8).astype(np.uint8), full], 1), width, height)

    q = normalized_quats(a.quats)
    largest = np.abs(q).argmax(-1)
    q *= np.where(q[np.arange(n), largest] < 0, -1.0, 1.0)[:, None]
    rest = np.take_along_axis(q, _OTHERS[largest], axis=1) * _SQRT2
    qpix = np.concatenate(
        [np.clip(np.round(255 * (rest * 0.5 + 0.5)), 0, 255), (252 + largest)[:, None]], 1
    ).astype(np.uint8)
    files["quats.webp"] = _webp(qpix, width, height)

    scode, slab = quantize_1d(a.log_scales)
    files["scales.webp"] = _webp(np.concatenate([slab, full], 1), width, height)
    ccode, clab = quantize_1d(a.sh_dc)
    alpha = np.clip(np.round(sigmoid(a.opacity_logits) * 255), 0, 255).astype(np.uint8)[:, None]
    files["sh0.webp"] = _webp(np.concatenate([clab, alpha], 1), width, height)

    meta: dict = {
        "version": 2,
        "asset": {"generator": "microdreamer"},
        "count": n,
        "means": {"mins": mins.tolist(), "maxs": maxs.tolist(), "files": ["means_l.webp", "means_u.webp"]},
        "scales": {"codebook": scode.tolist(), "files": ["scales.webp"]},
        "quats": {"files": ["quats.webp"]},
        "sh0": {"codebook": ccode.tolist(), "files": ["sh0.webp"]},
    }
    k1 = a.sh_rest.shape[1]
    if k1:
        bands = {3: 1, 8: 2, 15: 3}[k1]
        x = a.sh_rest.transpose(0, 2, 1).reshape(n, 3 * k1)  # channel-major, as the PLY
        palette = int(min(64, 2 ** math.floor(math.log2(max(n / 1024, 0.5)))) * 1024)
        centres, labels = kmeans(x, min(palette, n))
        shcode, shlab = quantize_1d(centres)
        k = len(centres)
        rows = int(math.ceil(k / 64))
        cpix = np.zeros((rows * 64 * k1, 4), np.uint8)
        per = shlab.reshape(k, 3, k1).transpose(0, 2, 1).reshape(k * k1, 3)  # entry-major, coefficient, rgb
        cpix[: k * k1, :3] = per
        cpix[:, 3] = 255
        files["shN_centroids.webp"] = _webp(cpix, 64 * k1, rows)
        lab = np.stack([labels & 0xFF, labels >> 8, np.zeros(n, np.int64), np.full(n, 255)], 1).astype(
            np.uint8
        )
        files["shN_labels.webp"] = _webp(lab, width, height)
        meta["shN"] = {"count": k, "bands": bands, "codebook": shcode.tolist(),
                       "files": ["shN_centroids.webp", "shN_labels.webp"]}  # fmt: skip
    files["meta.json"] = json.dumps(meta).encode()
    return files


def write(arrays: SplatArrays, path: str | os.PathLike) -> Path:
    """Write ``arrays`` as a SOG: a zip bundle for ``.sog``, else ``meta.json`` with its WebP images
    beside it (``path`` a ``meta.json``, or a folder). Atomically: a bundle by temp + rename, a folder's
    images first and its meta.json last, each by temp + rename."""
    from microdreamer.io_utils import atomic_path

    path = Path(path)
    files = encode(arrays)
    if path.suffix.lower() == ".sog":
        with atomic_path(path) as tmp, zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED) as z:
            for file, data in files.items():
                z.writestr(file, data)
        return path
    meta = path if path.name.lower().endswith(".json") else path / "meta.json"
    meta.parent.mkdir(parents=True, exist_ok=True)
    for file, data in files.items():
        if file != "meta.json":
            with atomic_path(meta.parent / file) as tmp:
                tmp.write_bytes(data)
    with atomic_path(meta) as tmp:
        tmp.write_bytes(files["meta.json"])
    return meta
