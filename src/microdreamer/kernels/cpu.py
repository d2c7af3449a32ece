"""Thin wrappers of the C++ CPU kernels (``csrc/cpu/``, loaded by :mod:`._cpu_backend`).

Tensors and plain numbers in, tensors out. Every wrapper checks devices, dtypes, contiguity and shapes
before a pointer reaches C++ (the C functions trust their inputs), and splits its work into independent
parts that run on Python threads (a ctypes call releases the GIL). The semantics, the PyTorch paths and
the choice between them live in the stage modules that call these: :mod:`microdreamer.field` (its
``"cpp"`` backend), :mod:`microdreamer.render.gaussians`
(its ``"cpp"`` backend), :mod:`microdreamer.render.mesh` (``rasterize_depth``'s ``"cpp"`` backend),
:mod:`microdreamer.texture.bake` (its ``"cpp"`` projection backend), :mod:`microdreamer.texture.charts` (the
packer, the ``"cpp"`` backend of its slab extents, row spans and their overlaps, and of its connected components)
and :mod:`microdreamer.mesh.cleanup` (the ``"cpp"`` backend of its vertex components). Importing this module
compiles nothing.
"""

from __future__ import annotations

import logging

import torch

from microdreamer.kernels import _cpu_backend

__all__ = [
    "available",
    "bake_accumulate",
    "face_components",
    "field_scatter",
    "raster_depth",
    "rasterize",
    "row_spans",
    "run_conflicts",
    "skyline_pack",
    "slab_extents",
    "usable",
    "vertex_components",
]

logger = logging.getLogger(__name__)


def available() -> bool:
    """True when the C++ CPU kernels are built or can be built here (a C++ compiler is found); builds
    nothing."""
    return _cpu_backend.available()


def usable() -> bool:
    """True when the kernels load (building them now if needed, about a second once); False, with one
    warning per process, when there is no compiler or the build fails: for ``"auto"`` choices, which
    then take the PyTorch or NumPy path."""
    if not _cpu_backend.available():
        return False
    try:
        _cpu_backend.load()
    except RuntimeError as e:
        logger.warning("%s; using the PyTorch paths instead", e)
        return False
    return True


def _check(t: torch.Tensor, name: str, dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    if t.device.type != "cpu":
        raise ValueError(f"{name} must be a CPU tensor, got one on {t.device}")
    if t.dtype != dtype:
        raise ValueError(f"{name} must be {dtype}, got {t.dtype}")
    if tuple(t.shape) != shape:
        raise ValueError(f"{name} must have shape {list(shape)}, got {list(t.shape)}")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous")


def _run_parts(fn, parts: list, workers: int) -> None:
    """``fn(part)`` for every part, on ``workers`` Python threads (in this thread when 1). The C calls
    release the GIL and use no PyTorch threads, so the threads run in parallel."""
    workers = max(1, min(workers, len(parts)))
    if workers == 1:
        for p in parts:
            fn(p)
        return
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(fn, parts))


def field_scatter(
    means: torch.Tensor,
    transforms: torch.Tensor,
    opacities: torch.Tensor,
    box: torch.Tensor,
    axis: torch.Tensor,
    limit: float,
    out: torch.Tensor,
    workers: int = 1,
) -> torch.Tensor:
    """Add ``opacity * exp(-q / 2)`` of N Gaussians to the voxels of their boxes where ``q <= limit``.

    Args:
        means: [N, 3] float64; transforms: [N, 3, 3] float64 whitening transforms M,
            ``q = |M (x - mean)|^2``; opacities: [N] float32.
        box: [N, 3, 2] int64 first and last voxel index per axis (inclusive; clipped to the grid here;
            last < first: none).
        axis: [R] float64, the grid's coordinates along every axis (evenly spaced, ascending).
        limit: terms with q above it are dropped.
        out: [R, R, R] float32, added to in place (index [i, j, k] is (axis[i], axis[j], axis[k])).
        workers: threads, each owning slabs of i (every voxel's sum runs in Gaussian order).

    Returns:
        ``out``.
    """
    n, r = means.shape[0], axis.shape[0]
    _check(means, "means", torch.float64, (n, 3))
    _check(transforms, "transforms", torch.float64, (n, 3, 3))
    _check(opacities, "opacities", torch.float32, (n,))
    _check(box, "box", torch.int64, (n, 3, 2))
    _check(axis, "axis", torch.float64, (r,))
    _check(out, "out", torch.float32, (r, r, r))
    if n == 0 or r == 0:
        return out
    args = (means.data_ptr(), transforms.data_ptr(), opacities.data_ptr(), box.data_ptr(), axis.data_ptr())
    _scatter_slabs(_cpu_backend.load().md_field_scatter, n, args, limit, r, out, workers)
    return out


def _scatter_slabs(fn, n: int, args: tuple, limit: float, r: int, out: torch.Tensor, workers: int) -> None:
    """``fn(n, *args, limit, r, x_begin, x_end, out)`` over slabs of i, ``4 * workers`` of them on
    ``workers`` threads (each voxel written by one slab's call: the same sums however they are cut)."""
    slabs = max(1, min(r, 4 * workers))
    bounds = [r * s // slabs for s in range(slabs + 1)]

    def part(s: int) -> None:
        fn(n, *args, float(limit), r, bounds[s], bounds[s + 1], out.data_ptr())

    _run_parts(part, list(range(slabs)), workers)


def field_scatter_channels(
    means: torch.Tensor,
    transforms: torch.Tensor,
    weights: torch.Tensor,
    box: torch.Tensor,
    axis: torch.Tensor,
    limit: float,
    out: torch.Tensor,
    workers: int = 1,
) -> torch.Tensor:
    """:func:`field_scatter` with C weights a Gaussian into C grids at once: ``out[c]`` gets exactly what
    :func:`field_scatter` with ``weights[:, c]`` as the opacities adds (the same terms, products and sums,
    in the same order), each term's exponential computed once.

    Args:
        weights: [N, C] float32; out: [C, R, R, R] float32, added to in place; the rest as
            :func:`field_scatter`'s.

    Returns:
        ``out``.
    """
    n, r = means.shape[0], axis.shape[0]
    c = weights.shape[1] if weights.dim() == 2 else -1
    _check(means, "means", torch.float64, (n, 3))
    _check(transforms, "transforms", torch.float64, (n, 3, 3))
    _check(weights, "weights", torch.float32, (n, max(c, 0)))
    _check(box, "box", torch.int64, (n, 3, 2))
    _check(axis, "axis", torch.float64, (r,))
    _check(out, "out", torch.float32, (c, r, r, r))
    if n == 0 or r == 0 or c == 0:
        return out
    args = (means.data_ptr(), transforms.data_ptr(), weights.data_ptr(), c, box.data_ptr(), axis.data_ptr())
    _scatter_slabs(_cpu_backend.load().md_field_scatter_channels, n, args, limit, r, out, workers)
    return out


def bake_accumulate(
    points: torch.Tensor,
    normals: torch.Tensor,
    viewmats: torch.Tensor,
    Ks: torch.Tensor,
    height: int,
    width: int,
    near: float,
    rgba: torch.Tensor,
    depth: torch.Tensor,
    cos_threshold: float,
    cos_power: float,
    min_alpha: float,
    depth_eps: float,
    num: torch.Tensor,
    den: torch.Tensor,
    workers: int = 1,
) -> None:
    """Add the weighted colours of c views to the sums of T texels, in place: the back-projection of
    :func:`microdreamer.texture.bake._accumulate` (its PyTorch path is the reference; the rules are in
    its docstrings and ``csrc/cpu/bake.cpp``).

    Args:
        points: [T, 3] float32 texel surface points; normals: [T, 3] float32 their unit normals.
        viewmats: [c, 4, 4] float32 world -> camera; Ks: [c, 3, 3] float32 intrinsics (pixels).
        height, width: H x W of every view; near: the cameras' near distance.
        rgba: [c H W, 4] float32 premultiplied colour and alpha of the renders.
        depth: [c H W] float32 camera-space z of the mesh raster, +inf where it does not cover the pixel.
        cos_threshold, cos_power, min_alpha, depth_eps: as in :class:`~microdreamer.config.BakeConfig`.
        num: [T, 3] float32, weight * colour added; den: [T] float32, weight added.
        workers: threads, each owning ranges of texels (every texel sums its views in view order).
    """
    t, c = points.shape[0], viewmats.shape[0]
    if height < 1 or width < 1:
        raise ValueError(f"the views must have at least one pixel, got {height} x {width}")
    _check(points, "points", torch.float32, (t, 3))
    _check(normals, "normals", torch.float32, (t, 3))
    _check(viewmats, "viewmats", torch.float32, (c, 4, 4))
    _check(Ks, "Ks", torch.float32, (c, 3, 3))
    _check(rgba, "rgba", torch.float32, (c * height * width, 4))
    _check(depth, "depth", torch.float32, (c * height * width,))
    _check(num, "num", torch.float32, (t, 3))
    _check(den, "den", torch.float32, (t,))
    if t == 0 or c == 0:
        return
    fn = _cpu_backend.load().md_bake_accumulate
    parts = max(1, min(t, 4 * workers))
    bounds = [t * s // parts for s in range(parts + 1)]
    args = (
        points.data_ptr(),
        normals.data_ptr(),
        c,
        viewmats.data_ptr(),
        Ks.data_ptr(),
        int(height),
        int(width),
    )
    args += (float(near), rgba.data_ptr(), depth.data_ptr())
    args += (float(cos_threshold), float(cos_power), float(min_alpha), float(depth_eps))

    def part(s: int) -> None:
        fn(bounds[s], bounds[s + 1], *args, num.data_ptr(), den.data_ptr())

    _run_parts(part, list(range(parts)), workers)


def raster_depth(
    pix: torch.Tensor,
    cam: torch.Tensor,
    faces: torch.Tensor,
    height: int,
    width: int,
    near: float,
    far: float,
    cull_backfaces: bool,
    zbuf: torch.Tensor,
    workers: int = 1,
) -> torch.Tensor:
    """The depth test of :func:`microdreamer.render.mesh.rasterize_depth` (its PyTorch path is the
    reference; the rules are in ``render/mesh.py``'s docstring and ``csrc/cpu/mesh_raster.cpp``).

    Args:
        pix: [C, V, 2] float32 projected vertices (pixel coordinates); cam: [C, V, 3] float32 camera-space
            vertices (both as ``render.mesh._project`` gives them).
        faces: [F, 3] int64 vertex indices in [0, V).
        height, width: H x W; near, far: the cameras' depth range.
        cull_backfaces: skip faces seen from behind.
        zbuf: [C, H, W] float32, lowered in place to the nearest covering face's depth (+inf: none yet).
        workers: threads, each owning whole cameras.

    Returns:
        ``zbuf``.
    """
    c, v, f = pix.shape[0], pix.shape[1], faces.shape[0]
    _check(pix, "pix", torch.float32, (c, v, 2))
    _check(cam, "cam", torch.float32, (c, v, 3))
    _check(faces, "faces", torch.int64, (f, 3))
    _check(zbuf, "zbuf", torch.float32, (c, height, width))
    if c == 0 or f == 0 or height == 0 or width == 0:
        return zbuf
    if v == 0 or int(faces.min()) < 0 or int(faces.max()) >= v:
        raise ValueError(f"faces must index the {v} vertices")
    fn = _cpu_backend.load().md_raster_depth
    bounds = [c * s // max(1, min(c, workers)) for s in range(max(1, min(c, workers)) + 1)]
    args = (pix.data_ptr(), cam.data_ptr(), v, faces.data_ptr(), f, int(height), int(width))
    args += (float(near), float(far), int(bool(cull_backfaces)), zbuf.data_ptr())

    def part(s: int) -> None:
        fn(bounds[s], bounds[s + 1], *args)

    _run_parts(part, list(range(len(bounds) - 1)), workers)
    return zbuf


#: the largest tile edge the rasteriser takes (its per-tile buffers are on the stack)
MAX_TILE_SIZE = 32


def rasterize(
    means2d: torch.Tensor,
    conics: torch.Tensor,
    radii: torch.Tensor,
    log_opacities: torch.Tensor,
    order: torch.Tensor,
    feats: torch.Tensor,
    width: int,
    height: int,
    tile_size: int = 8,
    workers: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Alpha-composite projected Gaussians into C images, forward only: the rules of
    :func:`microdreamer.render._torch_raster.rasterize` (its reference), without gradients.

    Args:
        means2d: [C, N, 2] float32 pixel centres; conics: [C, N, 3] float32 inverse 2D covariances
            (xx, xy, yy); radii: [C, N, 2] int32 box half-widths, 0 where culled (all three as
            :func:`~microdreamer.render._torch_raster.project` gives them).
        log_opacities: [N] float32 ``ln(opacity)``.
        order: [C, N] int64 each camera's Gaussians by depth, front to back, ties by index (a stable
            sort of the depths).
        feats: [C, N, K] float32 per-camera features to composite, or [N, K] shared by every camera.
        width, height: image size W x H.
        tile_size: tile edge in pixels, 1..32 (the image does not depend on it beyond float rounding).
        workers: threads; each renders whole (camera, band of tile rows) parts.

    Returns:
        (accumulated features [C, H, W, K] float32 = sum_i w_i f_i with no background,
        accumulated alpha [C, H, W, 1] float32 = sum_i w_i).
    """
    c, n = order.shape
    k = feats.shape[-1]
    _check(means2d, "means2d", torch.float32, (c, n, 2))
    _check(conics, "conics", torch.float32, (c, n, 3))
    _check(radii, "radii", torch.int32, (c, n, 2))
    _check(log_opacities, "log_opacities", torch.float32, (n,))
    _check(order, "order", torch.int64, (c, n))
    shared = feats.dim() == 2
    _check(feats, "feats", torch.float32, (n, k) if shared else (c, n, k))
    if not 1 <= tile_size <= MAX_TILE_SIZE:
        raise ValueError(f"tile_size must be in 1..{MAX_TILE_SIZE}, got {tile_size}")
    if width < 0 or height < 0:
        raise ValueError(f"image size must not be negative, got {width} x {height}")
    out = torch.zeros(c, height, width, k, dtype=torch.float32)
    alpha = torch.zeros(c, height, width, 1, dtype=torch.float32)
    if c == 0 or n == 0 or width == 0 or height == 0:
        return out, alpha
    if int(order.min()) < 0 or int(order.max()) >= n:
        raise ValueError(f"order must hold indices in 0..{n - 1}, got {int(order.min())}..{int(order.max())}")
    fn = _cpu_backend.load().md_raster_forward
    rows = -(-height // tile_size)
    # about 4 parts per thread or more, for balance (each band bins all N Gaussians again: one band alone)
    bands = 1 if workers <= 1 else max(1, min(rows, -(-4 * workers // c)))
    bounds = [rows * b // bands for b in range(bands + 1)]
    parts = [(cam, b) for cam in range(c) for b in range(bands)]

    def at(t: torch.Tensor, cam: int) -> int:  # address of camera cam's slice of t
        return t.data_ptr() + cam * t.stride(0) * t.element_size()

    def part(item: tuple[int, int]) -> None:
        cam, b = item
        f = feats.data_ptr() if shared else at(feats, cam)
        status = fn(
            n, k, int(width), int(height), int(tile_size), at(means2d, cam), at(conics, cam), at(radii, cam),
            log_opacities.data_ptr(), at(order, cam), f, bounds[b], bounds[b + 1], at(out, cam), at(alpha, cam),
        )  # fmt: skip
        if status < 0:
            raise RuntimeError(f"md_raster_forward failed ({status}) on camera {cam}")

    _run_parts(part, parts, workers)
    return out, alpha


def skyline_pack(
    bottom: torch.Tensor,
    top: torch.Tensor,
    col_offset: torch.Tensor,
    left: torch.Tensor,
    right: torch.Tensor,
    row_offset: torch.Tensor,
    turnable: torch.Tensor,
    width: int,
    padding: int,
    orientations: int,
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The skyline packer of :func:`microdreamer.kernels.skyline_pack` (same arguments and results: chart
    profiles as int64 CPU tensors), from the CPU library instead of the CUDA extension."""
    c = turnable.shape[0]
    _check(turnable, "turnable", torch.bool, (c,))
    _check(col_offset, "col_offset", torch.int64, (c + 1,))
    _check(row_offset, "row_offset", torch.int64, (c + 1,))
    co, ro = col_offset.tolist(), row_offset.tolist()
    if co[0] != 0 or ro[0] != 0:
        raise ValueError("col_offset and row_offset must start at 0")
    for i in range(c):
        if not (co[i + 1] > co[i] and ro[i + 1] > ro[i]):
            raise ValueError(
                f"chart {i} has no column or no row (offsets {co[i]}..{co[i + 1]}, {ro[i]}..{ro[i + 1]})"
            )
    for t, name, size in (
        (bottom, "bottom", co[c]),
        (top, "top", co[c]),
        (left, "left", ro[c]),
        (right, "right", ro[c]),
    ):
        _check(t, name, torch.int64, (size,))
    if not (padding >= 0 and width > 2 * padding):
        raise ValueError(f"width {width} must exceed twice the padding {padding}")
    if orientations not in (2, 4):
        raise ValueError(f"orientations must be 2 or 4, got {orientations}")
    corner = torch.zeros(c, 2, dtype=torch.int64)
    turns = torch.zeros(c, dtype=torch.int64)
    if c == 0:
        return corner, turns, int(padding)
    height = _cpu_backend.load().md_skyline_pack(
        bottom.data_ptr(), top.data_ptr(), col_offset.data_ptr(), left.data_ptr(), right.data_ptr(),
        row_offset.data_ptr(), turnable.data_ptr(), c, int(width), int(padding), int(orientations),
        corner.data_ptr(), turns.data_ptr(),
    )  # fmt: skip
    return corner, turns, int(height)


def _check_faces(faces: torch.Tensor, vertices: int) -> int:
    """Checks ``faces`` ([F, 3] int64 CPU, contiguous, indices in 0..vertices - 1); returns F."""
    if faces.dim() != 2 or faces.shape[1] != 3:
        raise ValueError(f"faces must have shape [F, 3], got {list(faces.shape)}")
    f = faces.shape[0]
    _check(faces, "faces", torch.int64, (f, 3))
    if f and (int(faces.min()) < 0 or int(faces.max()) >= vertices):
        raise ValueError(
            f"faces must hold indices in 0..{vertices - 1}, got {int(faces.min())}..{int(faces.max())}"
        )
    return f


def slab_extents(
    uv: torch.Tensor, faces: torch.Tensor, fchart: torch.Tensor, size: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`microdreamer.texture.charts.slab_extents` in C++ (the same arguments, results to the bit).

    Args:
        uv: [V, 2] float64 CPU; faces: [F, 3] int64 into ``uv``; fchart: [F] int64 in 0..C - 1;
        size: [C, 2] int64, each at least 1.

    Returns:
        (ymin, ymax [sum W_c], xmin, xmax [sum H_c]) float64.
    """
    v = uv.shape[0]
    _check(uv, "uv", torch.float64, (v, 2))
    f = _check_faces(faces, v)
    _check(fchart, "fchart", torch.int64, (f,))
    c = size.shape[0]
    _check(size, "size", torch.int64, (c, 2))
    if c and int(size.min()) < 1:
        raise ValueError(f"size must be at least 1 slab per chart, got {int(size.min())}")
    if f and (int(fchart.min()) < 0 or int(fchart.max()) >= c):
        raise ValueError(
            f"fchart must hold charts in 0..{c - 1}, got {int(fchart.min())}..{int(fchart.max())}"
        )
    fn = _cpu_backend.load().md_slab_extents if f else None
    out = []
    for axis in (0, 1):
        n = size[:, axis].contiguous()
        offset = (torch.cumsum(n, 0) - n).contiguous()
        total = int(n.sum())
        lo = torch.full((total,), float("inf"), dtype=torch.float64)
        hi = torch.full((total,), float("-inf"), dtype=torch.float64)
        if fn is not None:
            fn(axis, uv.data_ptr(), faces.data_ptr(), fchart.data_ptr(), size.data_ptr(), offset.data_ptr(), f,
               lo.data_ptr(), hi.data_ptr())  # fmt: skip
        out += [lo, hi]
    return out[0], out[1], out[2], out[3]


def row_spans(
    uv_px: torch.Tensor, faces: torch.Tensor, width: int, height: int, margin: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`microdreamer.texture.charts.row_spans` in C++ (the same arguments and runs, in the same
    order).

    Args:
        uv_px: [V, 2] float64 CPU texel coordinates; faces: [F, 3] int64 into ``uv_px``.
        width, height: the grid (at least 0); margin: as in the PyTorch path.

    Returns:
        (row [P], x0 [P], x1 [P], face [P]) int64.
    """
    v = uv_px.shape[0]
    _check(uv_px, "uv_px", torch.float64, (v, 2))
    f = _check_faces(faces, v)
    if width < 0 or height < 0:
        raise ValueError(f"the grid must not be negative, got {width} x {height}")
    empty = torch.zeros(0, dtype=torch.int64)
    if f == 0 or width == 0 or height == 0:
        return empty, empty.clone(), empty.clone(), empty.clone()
    fn = _cpu_backend.load().md_row_spans
    args = (uv_px.data_ptr(), faces.data_ptr(), f, int(width), int(height), float(margin))
    bound = fn(*args, None, None, None, None, 0)  # the rows the triangles span: at least the runs
    out = [torch.empty(bound, dtype=torch.int64) for _ in range(4)]
    written = fn(*args, *(t.data_ptr() for t in out), bound)
    if written < 0:
        raise RuntimeError(f"md_row_spans found more runs than its bound of {bound}")
    return out[0][:written], out[1][:written], out[2][:written], out[3][:written]


def run_conflicts(
    row: torch.Tensor, x0: torch.Tensor, x1: torch.Tensor, face: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`microdreamer.texture.charts._conflicts` in C++: the same pairs in the same order.

    Args:
        row, x0, x1, face: [P] int64 CPU runs as :func:`row_spans` gives them (rows from 0, x0 <= x1).

    Returns:
        (fa [Q], fb [Q]) int64.
    """
    p = row.shape[0]
    for t, name in ((row, "row"), (x0, "x0"), (x1, "x1"), (face, "face")):
        _check(t, name, torch.int64, (p,))
    if p < 2:
        return face[:0].clone(), face[:0].clone()
    if int(row.min()) < 0:
        raise ValueError(f"rows must not be negative, got {int(row.min())}")
    if bool((x1 < x0).any()):
        raise ValueError("every run needs x0 <= x1")
    height = int(row.max()) + 1
    order = torch.empty(p, dtype=torch.int64)
    start = torch.empty(height + 1, dtype=torch.int64)
    fa, fb = torch.empty(p, dtype=torch.int64), torch.empty(p, dtype=torch.int64)
    count = _cpu_backend.load().md_run_conflicts(
        row.data_ptr(), x0.data_ptr(), x1.data_ptr(), face.data_ptr(), p, height, order.data_ptr(),
        start.data_ptr(), fa.data_ptr(), fb.data_ptr(),
    )  # fmt: skip
    return fa[:count].clone(), fb[:count].clone()


def face_components(neighbours: torch.Tensor, same: torch.Tensor) -> torch.Tensor:
    """:func:`microdreamer.texture.charts.connected_components` in C++ (union-find): the same labels.

    Args:
        neighbours: [F, 3] int64 CPU, the face across each edge, -1 where none (any other value in 0..F - 1).
        same: [F, 3] bool CPU, which of those edges join their faces.

    Returns:
        [F] int64: the smallest face index of each face's component.
    """
    if neighbours.dim() != 2 or neighbours.shape[1] != 3:
        raise ValueError(f"neighbours must have shape [F, 3], got {list(neighbours.shape)}")
    f = neighbours.shape[0]
    _check(neighbours, "neighbours", torch.int64, (f, 3))
    _check(same, "same", torch.bool, (f, 3))
    if f and (int(neighbours.min()) < -1 or int(neighbours.max()) >= f):
        raise ValueError(
            f"neighbours must hold faces in 0..{f - 1} or -1, got {int(neighbours.min())}..{int(neighbours.max())}"
        )
    root = torch.empty(f, dtype=torch.int64)
    if f:
        _cpu_backend.load().md_face_components(neighbours.data_ptr(), same.data_ptr(), f, root.data_ptr())
    return root


def vertex_components(faces: torch.Tensor, num_vertices: int) -> tuple[int, torch.Tensor]:
    """:func:`microdreamer.mesh.cleanup._vertex_components` in C++ (union-find): the same count and labels.

    Args:
        faces: [F, 3] int64 CPU, each in 0..num_vertices - 1.
        num_vertices: V, below 2^31.

    Returns:
        ``(count, labels)``: labels [V] int32, the components numbered in the order of their smallest vertex
        (a vertex no face uses is a component of its own).
    """
    if faces.dim() != 2 or faces.shape[1] != 3:
        raise ValueError(f"faces must have shape [F, 3], got {list(faces.shape)}")
    f = faces.shape[0]
    _check(faces, "faces", torch.int64, (f, 3))
    if not 0 <= num_vertices < 2**31:
        raise ValueError(f"num_vertices must be in 0..2^31 - 1, got {num_vertices}")
    if f and (int(faces.min()) < 0 or int(faces.max()) >= num_vertices):
        raise ValueError(
            f"faces must hold vertices in 0..{num_vertices - 1}, got {int(faces.min())}..{int(faces.max())}"
        )
    labels = torch.empty(num_vertices, dtype=torch.int32)
    if num_vertices == 0:
        return 0, labels
    count = _cpu_backend.load().md_vertex_components(faces.data_ptr(), f, num_vertices, labels.data_ptr())
    return int(count), labels
