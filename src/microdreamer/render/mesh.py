"""Triangle-mesh rasteriser and shader in plain PyTorch (CPU and CUDA, whichever holds the inputs).

Used for ground-truth views (``render-views``), previews and texture baking. Two layers:

* :func:`rasterize` -> :class:`Fragments`: per pixel the nearest face, its perspective-correct
  barycentrics, the camera-space depth and coverage. :func:`rasterize_reference` is the brute-force
  reference with the same signature and semantics (a ray/triangle intersection for every pixel and
  every face, float64), for tests and as the baseline of benchmarks.
* :func:`render_mesh` -> :class:`MeshRender`: colours from vertex colours or a UV texture (bilinear,
  repeating), alpha, depth and world-space normals, with optional supersampling; built from
  :func:`interpolate`, :func:`sample_texture` and :func:`shade`. A mesh without colour is shaded by
  :func:`lighting` (Lambertian, a head light or a fixed one, plus ambient) instead of rendering as a
  flat silhouette.

Semantics shared by both rasterisers
------------------------------------
* Cameras are :class:`microdreamer.cameras.Cameras` (OpenCV world-to-camera, pixel intrinsics).
  Pixel (x, y) has its centre at (x + 0.5, y + 0.5) in the intrinsics' pixel coordinates.
* A face covers a pixel when the pixel centre lies inside it or on its boundary. A pixel shows the
  covering face of smallest depth; exact ties go to the smaller face index.
* Depth is the camera-space z (distance along the optical axis), kept in [near, far].
* There is no clipping: a face with any vertex at z <= near is skipped whole, and so are faces of zero
  projected area. Faces are two-sided unless ``cull_backfaces`` (front = counter-clockwise seen from
  the camera, i.e. ``cross(v1 - v0, v2 - v0)`` points towards it, the convention of
  :class:`microdreamer.mesh.Mesh`).

How :func:`rasterize` is fast and memory-bounded
------------------------------------------------
Each (camera, face) pair is tested only against the pixels of its screen-space bounding box. Pairs are
grouped by their box size rounded up to powers of two (Bw x Bh), so that a group is one dense
[n, Bh, Bw] computation, cut into chunks of at most ``max_candidates`` pixel tests. Hits update a
per-pixel depth buffer with ``scatter_reduce(amin)`` and then the face buffer (smallest face index among
the hits at that depth), so the result does not depend on the processing order. A last pass computes
the barycentrics of the winning faces only; it is differentiable with respect to the vertices (no
gradient flows through coverage or visibility). Edge functions are evaluated with each edge's end
points in a canonical order (smaller vertex index first), so two faces sharing an edge agree exactly
on which side of it a pixel centre lies: no cracks and no gaps between them.
Memory: O(C F + C H W + max_candidates).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from microdreamer import fixed_order
from microdreamer.cameras import Cameras
from microdreamer.cpu_pool import cpu_workers, map_single_threaded

_MIN_AREA = 1e-10  # |double signed area| in pixels^2 below which a projected face is degenerate


@dataclass
class Fragments:
    """What :func:`rasterize` returns: the visible face per pixel.

    Attributes:
        face_id: [C, H, W] int64, index into ``faces`` of the visible face, -1 where empty.
        bary: [C, H, W, 3] float32, perspective-correct barycentric weights of the face's vertices
            (sum 1), 0 where empty.
        depth: [C, H, W, 1] float32, camera-space z, 0 where empty.
        alpha: [C, H, W, 1] float32, 1 where a face covers the pixel centre, else 0.
    """

    face_id: torch.Tensor
    bary: torch.Tensor
    depth: torch.Tensor
    alpha: torch.Tensor


@dataclass
class MeshRender:
    """What :func:`render_mesh` returns.

    Attributes:
        rgb: [C, H, W, 3] float32, colour composited over the background.
        alpha: [C, H, W, 1] float32 coverage (fractional at edges when supersampled).
        depth: [C, H, W, 1] float32 camera-space z, averaged over the covered samples, 0 where empty.
        normals: [C, H, W, 3] float32 world-space unit normals (outward for a consistently wound mesh),
            0 where empty.
    """

    rgb: torch.Tensor
    alpha: torch.Tensor
    depth: torch.Tensor
    normals: torch.Tensor


# ---------------------------------------------------------------------------------------------
# rasterisation


def _check_inputs(vertices: torch.Tensor, faces: torch.Tensor, cameras: Cameras) -> None:
    if vertices.dim() != 2 or vertices.shape[1] != 3 or not vertices.is_floating_point():
        raise ValueError(f"vertices must be [V, 3] float, got {tuple(vertices.shape)} {vertices.dtype}")
    if faces.dim() != 2 or faces.shape[1] != 3 or faces.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"faces must be [F, 3] int64, got {tuple(faces.shape)} {faces.dtype}")
    if vertices.device != faces.device or vertices.device != cameras.device:
        raise ValueError(
            f"vertices ({vertices.device}), faces ({faces.device}) and cameras ({cameras.device}) "
            "must be on one device"
        )
    if faces.numel():
        lo, hi = torch.stack(torch.aminmax(faces)).tolist()  # one host synchronisation
        if lo < 0 or hi >= vertices.shape[0]:
            raise ValueError(f"faces index range [{lo}, {hi}] is outside [0, {vertices.shape[0] - 1}]")


def _project(vertices: torch.Tensor, cameras: Cameras) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Vertices [V, 3] -> (pixel coords [C, V, 2], camera-space z [C, V], camera-space points [C, V, 3])."""
    vm = cameras.viewmats.to(vertices.dtype)
    K = cameras.Ks.to(vertices.dtype)
    # summed in a fixed order: a camera's points do not depend on the others in the call (see fixed_order)
    cam = fixed_order.transform_points(vm[:, :3, :3], vm[:, :3, 3], vertices)
    z = cam[..., 2]
    x, y = cam[..., 0] / z, cam[..., 1] / z
    u = K[:, 0, 0, None] * x + K[:, 0, 1, None] * y + K[:, 0, 2, None]
    v = K[:, 1, 1, None] * y + K[:, 1, 2, None]
    return torch.stack([u, v], dim=-1), z, cam


def _canonical_edges(p: torch.Tensor, vid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Edges opposite each vertex, with end points in canonical (smaller vertex index first) order.

    Args:
        p: [n, 3, 2] projected vertices of n faces; vid: [n, 3] their vertex indices.

    Returns:
        (start [n, 3, 2], direction [n, 3, 2], sign [n, 3]); the edge function of edge k at q is
        ``sign * cross(direction, q - start)``, positive inside a counter-clockwise (in pixel
        coordinates) face, and equal to the signed double area at the opposite vertex k.
    """

    def rot(t: torch.Tensor, k: int) -> torch.Tensor:  # t[:, [k, k+1, k+2] mod 3], without indexing
        return torch.cat([t[:, k:], t[:, :k]], dim=1)

    pa, pb = rot(p, 1), rot(p, 2)  # edge k runs from vertex (k+1)%3 to (k+2)%3
    swap = rot(vid, 1) > rot(vid, 2)
    start = torch.where(swap[..., None], pb, pa)
    sign = torch.where(swap, -1.0, 1.0).to(p.dtype)
    # end - start: pb - pa, or pa - pb = -(pb - pa) exactly when swapped
    return start, (pb - pa) * sign[..., None], sign


def _edge_values(start, direction, sign, qx, qy) -> torch.Tensor:
    """Edge functions at points (qx, qy) of shape [n, ...]: returns [n, ..., 3].

    start/direction [n, 3, 2] and sign [n, 3] are broadcast over the trailing point dimensions.
    """
    extra = qx.dim() - 1
    shape = (start.shape[0],) + (1,) * extra + (3,)
    sx, sy = start[..., 0].reshape(shape), start[..., 1].reshape(shape)
    dx, dy = direction[..., 0].reshape(shape), direction[..., 1].reshape(shape)
    return sign.reshape(shape) * (dx * (qy[..., None] - sy) - dy * (qx[..., None] - sx))


def _perspective(w: torch.Tensor, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Edge functions w [..., 3] and vertex depths z [..., 3] -> (barycentrics [..., 3], depth [...])."""
    lin = w / fixed_order.total(w)[..., None]  # screen-space barycentrics
    q = lin / z
    inv_z = fixed_order.total(q)  # (q0 + q1) + q2 as the C++ kernel adds them
    return q / inv_z[..., None], 1.0 / inv_z


def _valid_faces(zf: torch.Tensor, camf: torch.Tensor, pf: torch.Tensor, cameras: Cameras, cull: bool):
    """[C, F] bool: faces in front of the near plane, not all beyond far, with nonzero area, facing
    the camera when ``cull``. zf [C, F, 3], camf [C, F, 3, 3] camera-space vertices, pf [C, F, 3, 2]."""
    ok = (zf > cameras.near).all(dim=-1) & (zf < cameras.far).any(dim=-1)
    d1, d2 = pf[..., 1, :] - pf[..., 0, :], pf[..., 2, :] - pf[..., 0, :]
    area2 = d1[..., 0] * d2[..., 1] - d1[..., 1] * d2[..., 0]
    ok &= area2.abs() > _MIN_AREA
    if cull:
        n = torch.linalg.cross(camf[..., 1, :] - camf[..., 0, :], camf[..., 2, :] - camf[..., 0, :])
        ok &= fixed_order.dot(n, camf[..., 0, :]) < 0  # normal points towards the camera at the origin
    return ok


def rasterize(
    vertices: torch.Tensor,
    faces: torch.Tensor,
    cameras: Cameras,
    cull_backfaces: bool = False,
    max_candidates: int = 1 << 22,
    workers: int | None = None,
) -> Fragments:
    """Rasterise a triangle mesh into C views (see the module docstring for the exact semantics).

    Args:
        vertices: [V, 3] float32, world space, on the cameras' device. May require grad: the
            barycentrics and depth are differentiable with respect to it (not the coverage).
        faces: [F, 3] int64 vertex indices.
        cameras: C cameras of H x W pixels.
        cull_backfaces: skip faces seen from behind.
        max_candidates: the most pixel tests computed at once; bounds the temporary memory to about
            1 byte per candidate plus about 60 bytes per candidate that the face covers.
        workers: on the CPU without gradients, rasterise groups of cameras on this many threads that
            run PyTorch single-threaded (:mod:`microdreamer.cpu_pool`; the views are independent);
            None = :func:`~microdreamer.cpu_pool.cpu_workers`; 1 = this thread.

    Returns:
        :class:`Fragments` with face_id [C, H, W], bary [C, H, W, 3], depth [C, H, W, 1], alpha
        [C, H, W, 1].
    """
    faces = faces.long()
    _check_inputs(vertices, faces, cameras)
    grad = torch.is_grad_enabled() and vertices.requires_grad
    parts = _camera_groups(
        lambda cams: rasterize(vertices, faces, cams, cull_backfaces, max_candidates, workers=1),
        vertices,
        cameras,
        1 if grad else workers,
    )
    if parts is not None:
        return Fragments(
            *(torch.cat([getattr(p, k) for p in parts]) for k in ("face_id", "bary", "depth", "alpha"))
        )
    C, H, W, F = len(cameras), cameras.height, cameras.width, faces.shape[0]
    device = vertices.device
    _, fbuf, big = _depth_test(vertices, faces, cameras, cull_backfaces, max_candidates)
    covered = (fbuf < big).nonzero().squeeze(1)
    ci = torch.div(covered, H * W, rounding_mode="floor")
    fi = fbuf.index_select(0, covered) - ci * F
    rem = covered - ci * H * W
    qy = torch.div(rem, W, rounding_mode="floor").float() + 0.5
    qx = (rem % W).float() + 0.5

    # last pass: barycentrics and depth of the winning faces, with autograd through the vertices
    pix_g, z_g, _ = _project(vertices.float(), cameras)
    V = vertices.shape[0]
    fv = faces.index_select(0, fi)
    corner = (ci[:, None] * V + fv).reshape(-1)  # flat (camera, vertex) of each winning face's corners
    start, direction, sign = _canonical_edges(
        pix_g.reshape(C * V, 2).index_select(0, corner).view(-1, 3, 2), fv
    )
    w = _edge_values(start, direction, sign, qx, qy)
    bary, depth = _perspective(w, z_g.reshape(C * V).index_select(0, corner).view(-1, 3))

    face_id = torch.full((C * H * W,), -1, device=device, dtype=torch.int64).index_copy_(0, covered, fi)
    bary_img = torch.zeros(C * H * W, 3, device=device, dtype=torch.float32).index_copy(0, covered, bary)
    depth_img = torch.zeros(C * H * W, device=device, dtype=torch.float32).index_copy(0, covered, depth)
    alpha = (face_id >= 0).float()
    return Fragments(
        face_id.view(C, H, W),
        bary_img.view(C, H, W, 3),
        depth_img.view(C, H, W, 1),
        alpha.view(C, H, W, 1),
    )


def rasterize_depth(
    vertices: torch.Tensor,
    faces: torch.Tensor,
    cameras: Cameras,
    cull_backfaces: bool = False,
    max_candidates: int = 1 << 22,
    workers: int | None = None,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`rasterize`'s depth and alpha alone, without its last pass (the barycentrics of the
    visible faces): (depth [C, H, W, 1] float32, 0 where empty; alpha [C, H, W, 1] float32). The depth
    is the depth test's buffer, which holds the visible face's depth computed as the last pass computes
    it: the same values as :func:`rasterize` (tested). No gradients. Arguments as :func:`rasterize`, and
    ``backend``: ``"torch"`` (this module's rasteriser, any device), ``"cpp"`` (the C++ CPU kernel
    :func:`microdreamer.kernels.cpu.raster_depth`, the same rules and float32 operations one face and
    pixel at a time; CPU tensors only) or ``"auto"`` (``"cpp"`` on the CPU when the kernels build)."""
    if backend not in ("auto", "torch", "cpp"):
        raise ValueError(f"rasterize_depth backend {backend!r} is unknown; use auto, torch or cpp")
    faces = faces.long()
    _check_inputs(vertices, faces, cameras)
    on_cpu = vertices.device.type == "cpu"
    if backend == "auto":
        from microdreamer.kernels import cpu

        backend = "cpp" if on_cpu and cpu.usable() else "torch"
    if backend == "cpp":
        return _rasterize_depth_cpp(vertices, faces, cameras, cull_backfaces, workers)
    parts = _camera_groups(
        lambda cams: rasterize_depth(vertices, faces, cams, cull_backfaces, max_candidates, 1, "torch"),
        vertices,
        cameras,
        workers,
    )
    if parts is not None:
        return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
    C, H, W = len(cameras), cameras.height, cameras.width
    zbuf, fbuf, big = _depth_test(vertices, faces, cameras, cull_backfaces, max_candidates)
    hit = fbuf < big
    depth = torch.where(hit, zbuf, torch.zeros_like(zbuf))
    return depth.view(C, H, W, 1), hit.float().view(C, H, W, 1)


def _rasterize_depth_cpp(
    vertices: torch.Tensor, faces: torch.Tensor, cameras: Cameras, cull_backfaces: bool, workers: int | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`rasterize_depth` through the C++ CPU kernel: the projection is this module's."""
    from microdreamer.kernels import cpu

    if vertices.device.type != "cpu":
        raise ValueError(
            f"the cpp rasterize_depth backend runs on CPU tensors; these are on {vertices.device}"
        )
    C, H, W = len(cameras), cameras.height, cameras.width
    zbuf = torch.full((C, H, W), math.inf, dtype=torch.float32)
    with torch.no_grad():
        pix, _, cam = _project(vertices.detach().float(), cameras)
    workers = cpu_workers(vertices.device, C) if workers is None else workers
    cpu.raster_depth(
        pix.contiguous(), cam.contiguous(), faces.contiguous(), H, W, cameras.near, cameras.far,
        cull_backfaces, zbuf, workers,
    )  # fmt: skip
    hit = zbuf < math.inf
    depth = torch.where(hit, zbuf, torch.zeros_like(zbuf))
    return depth.view(C, H, W, 1), hit.float().view(C, H, W, 1)


def _camera_groups(fn, vertices: torch.Tensor, cameras: Cameras, workers: int | None) -> list | None:
    """``fn`` of groups of the cameras on :func:`~microdreamer.cpu_pool.map_single_threaded` threads
    (CPU only), in order; None when it runs in one piece (one worker, one camera or not the CPU)."""
    C = len(cameras)
    workers = min(cpu_workers(vertices.device, C) if workers is None else workers, C)
    if workers <= 1 or vertices.device.type != "cpu":
        return None
    bounds = [C * i // workers for i in range(workers + 1)]
    return map_single_threaded(lambda i: fn(cameras[bounds[i] : bounds[i + 1]]), range(workers), workers)


def _depth_test(
    vertices: torch.Tensor, faces: torch.Tensor, cameras: Cameras, cull_backfaces: bool, max_candidates: int
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The depth test of every face in every camera: (zbuf [C H W] float32 nearest depth, +inf where
    empty; fbuf [C H W] int64 the visible face's global id camera * F + face, ``big`` where empty; big)."""
    C, H, W, F = len(cameras), cameras.height, cameras.width, faces.shape[0]
    device = vertices.device
    big = C * F  # sentinel "no face" in the face buffer (global id = camera * F + face)
    zbuf = torch.full((C * H * W,), math.inf, device=device, dtype=torch.float32)
    fbuf = torch.full((C * H * W,), big, device=device, dtype=torch.int64)
    with torch.no_grad():
        pix, z, cam = _project(vertices.detach().float(), cameras)
        if F > 0 and C > 0:
            # gathers through index_select: advanced indexing is several times slower on the CPU
            fl = faces.reshape(-1)
            pf = pix.index_select(1, fl).view(C, F, 3, 2)
            zf = z.index_select(1, fl).view(C, F, 3)
            camf = cam.index_select(1, fl).view(C, F, 3, 3)
            valid = _valid_faces(zf, camf, pf, cameras, cull_backfaces)
            pair = valid.reshape(-1).nonzero().squeeze(1)  # flat camera * F + face
            ci = torch.div(pair, F, rounding_mode="floor")
            fi = pair - ci * F
            _rasterize_pairs(
                pf.reshape(C * F, 3, 2).index_select(0, pair),
                zf.reshape(C * F, 3).index_select(0, pair),
                faces.index_select(0, fi),
                ci,
                pair,
                cameras,
                zbuf,
                fbuf,
                big,
                max_candidates,
            )
    return zbuf, fbuf, big


def _rasterize_pairs(
    pf: torch.Tensor,
    zf: torch.Tensor,
    vid: torch.Tensor,
    cam_idx: torch.Tensor,
    gid: torch.Tensor,
    cameras: Cameras,
    zbuf: torch.Tensor,
    fbuf: torch.Tensor,
    big: int,
    max_candidates: int,
) -> None:
    """Depth-test n (camera, face) pairs into the buffers (in place).

    pf [n, 3, 2] pixel coords, zf [n, 3] depths, vid [n, 3] vertex indices, cam_idx [n] camera,
    gid [n] global face id (camera * F + face); zbuf [C H W] float32, fbuf [C H W] int64 with ``big``
    meaning "no face".
    """
    H, W = cameras.height, cameras.width
    if pf.shape[0] == 0:
        return
    # pixel-index bounding boxes: pixel x is covered only if x + 0.5 lies in [min_x, max_x]
    lo = pf.amin(dim=1).clamp(-2.0, max(W, H) + 2.0)
    hi = pf.amax(dim=1).clamp(-2.0, max(W, H) + 2.0)
    x0 = torch.ceil(lo[:, 0] - 0.5).long().clamp_min(0)
    y0 = torch.ceil(lo[:, 1] - 0.5).long().clamp_min(0)
    x1 = torch.floor(hi[:, 0] - 0.5).long().clamp_max(W - 1)
    y1 = torch.floor(hi[:, 1] - 0.5).long().clamp_max(H - 1)
    keep = (x1 >= x0) & (y1 >= y0)
    if not bool(keep.all()):
        kept = keep.nonzero().squeeze(1)
        pf, zf, vid, cam_idx, gid, x0, y0, x1, y1 = (
            t.index_select(0, kept) for t in (pf, zf, vid, cam_idx, gid, x0, y0, x1, y1)
        )
    if pf.shape[0] == 0:
        return
    # bucket by box size rounded up to powers of two
    lw = torch.ceil(torch.log2((x1 - x0 + 1).double())).long()
    lh = torch.ceil(torch.log2((y1 - y0 + 1).double())).long()
    key = lw * 64 + lh
    order = torch.argsort(key, stable=True)
    uniq, counts = torch.unique_consecutive(key[order], return_counts=True)
    # Edge k at pixel centre q: w_k = cy_k (q_y - s_yk) - cx_k (q_x - s_xk), oriented so that the
    # inside of every face has all w_k >= 0. The two terms are separable (one depends on the row, one
    # on the column), so the [n, bh, bw] test is a comparison of an [n, bh] and an [n, bw] array.
    # Only signs change between two faces sharing an edge, so they agree exactly on its pixels.
    start, direction, sign = _canonical_edges(pf, vid)
    d1, d2 = pf[:, 1] - pf[:, 0], pf[:, 2] - pf[:, 0]
    orient = torch.sign(d1[:, 0] * d2[:, 1] - d1[:, 1] * d2[:, 0])
    sgn = sign * orient[:, None]  # [n, 3], entries +-1
    cy, cx = sgn * direction[..., 0], sgn * direction[..., 1]
    begin = 0
    for k, count in zip(uniq.tolist(), counts.tolist(), strict=True):
        bw, bh = 1 << (k // 64), 1 << (k % 64)
        group = order[begin : begin + count]
        begin += count
        chunk = max(1, max_candidates // (bw * bh))
        offx = torch.arange(bw, device=pf.device)
        offy = torch.arange(bh, device=pf.device)
        for s in range(0, count, chunk):
            idx = group[s : s + chunk]
            n = idx.numel()

            def at(t: torch.Tensor, i: torch.Tensor = idx) -> torch.Tensor:
                return t.index_select(0, i)

            py = at(y0)[:, None] + offy  # [n, bh] pixel rows
            px = at(x0)[:, None] + offx  # [n, bw] pixel columns
            st = at(start)
            ta = at(cy)[:, None, :] * ((py.float() + 0.5)[..., None] - st[:, None, :, 1])  # [n, bh, 3]
            tb = at(cx)[:, None, :] * ((px.float() + 0.5)[..., None] - st[:, None, :, 0])  # [n, bw, 3]
            ta[..., 0].masked_fill_(py > at(y1)[:, None], -math.inf)  # rows outside the box
            tb[..., 0].masked_fill_(px > at(x1)[:, None], math.inf)  # columns outside the box
            inside = ta[:, :, None, 0] >= tb[:, None, :, 0]  # w_0 >= 0
            inside &= ta[:, :, None, 1] >= tb[:, None, :, 1]
            inside &= ta[:, :, None, 2] >= tb[:, None, :, 2]
            hit = inside.reshape(-1).nonzero().squeeze(1)  # flat (n, bh, bw)
            if hit.numel() == 0:
                continue
            row = torch.div(hit, bw, rounding_mode="floor")  # flat (n, bh)
            n_idx = torch.div(row, bh, rounding_mode="floor")
            yy, xx = row - n_idx * bh, hit - row * bw
            w = at(ta.reshape(n * bh, 3), row) - at(tb.reshape(n * bw, 3), n_idx * bw + xx)
            sel = at(idx, n_idx)
            _, depth = _perspective(w, at(zf, sel))
            ok = ((depth >= cameras.near) & (depth <= cameras.far)).nonzero().squeeze(1)
            sel, depth, yy, xx = at(sel, ok), at(depth, ok), at(yy, ok), at(xx, ok)
            p = (at(cam_idx, sel) * H + at(y0, sel) + yy) * W + at(x0, sel) + xx
            g = at(gid, sel)
            prev = at(zbuf, p)
            zbuf.scatter_reduce_(0, p, depth, reduce="amin")
            cur = at(zbuf, p)
            fbuf.index_fill_(0, p[cur < prev], big)  # a nearer hit arrived: forget the old face
            win = (depth == cur).nonzero().squeeze(1)
            fbuf.scatter_reduce_(0, at(p, win), at(g, win), reduce="amin")


def rasterize_reference(
    vertices: torch.Tensor,
    faces: torch.Tensor,
    cameras: Cameras,
    cull_backfaces: bool = False,
    max_candidates: int = 0,
) -> Fragments:
    """Brute-force reference of :func:`rasterize`: same signature, semantics and outputs.

    For every camera, pixel and face it intersects the pixel's ray with the face in camera space
    (Moller-Trumbore, float64), so the barycentrics come from 3D geometry rather than from
    screen-space interpolation. O(C H W F) time and memory: tiny inputs only. ``max_candidates`` is
    ignored. Not differentiable.
    """
    faces = faces.long()
    _check_inputs(vertices, faces, cameras)
    C, H, W, F = len(cameras), cameras.height, cameras.width, faces.shape[0]
    dev = vertices.device
    v = vertices.detach().double()
    vm, K = cameras.viewmats.double(), cameras.Ks.double()
    ys, xs = torch.meshgrid(
        torch.arange(H, device=dev, dtype=torch.float64) + 0.5,
        torch.arange(W, device=dev, dtype=torch.float64) + 0.5,
        indexing="ij",
    )
    face_id = torch.full((C, H, W), -1, dtype=torch.int64, device=dev)
    bary = torch.zeros(C, H, W, 3, dtype=torch.float32, device=dev)
    depth = torch.zeros(C, H, W, 1, dtype=torch.float32, device=dev)
    for c in range(C):
        cam = v @ vm[c, :3, :3].T + vm[c, :3, 3]  # [V, 3]
        tri = cam[faces]  # [F, 3, 3]
        # ray through the pixel centre, scaled so that its z component is 1 (then t = depth)
        pix = torch.stack([xs, ys, torch.ones_like(xs)], dim=-1).reshape(-1, 3)  # [P, 3]
        d = torch.linalg.solve(K[c], pix.T).T  # [P, 3]
        d = d / d[:, 2:3]
        e1, e2 = tri[:, 1] - tri[:, 0], tri[:, 2] - tri[:, 0]  # [F, 3]
        pvec = torch.linalg.cross(d[:, None, :].expand(-1, F, 3), e2[None].expand(d.shape[0], -1, 3))
        det = (e1[None] * pvec).sum(-1)  # [P, F]
        tvec = -tri[:, 0]  # ray origin (0) - v0
        u = (tvec[None] * pvec).sum(-1) / det
        qvec = torch.linalg.cross(tvec, e1)  # [F, 3]
        w = (d @ qvec.T) / det
        t = (e2 * qvec).sum(-1)[None] / det
        hit = (det.abs() > 1e-30) & (u >= 0) & (w >= 0) & (u + w <= 1)
        hit &= (t >= cameras.near) & (t <= cameras.far)
        face_ok = (tri[..., 2] > cameras.near).all(-1) & (tri[..., 2] < cameras.far).any(-1)
        if cull_backfaces:
            n = torch.linalg.cross(e1, e2)
            face_ok &= (n * tri[:, 0]).sum(-1) < 0
        hit &= face_ok[None]
        t = torch.where(hit, t, torch.full_like(t, math.inf))
        tmin = t.amin(dim=1, keepdim=True) if F else torch.full((d.shape[0], 1), math.inf, device=dev)
        any_hit = torch.isfinite(tmin[:, 0])
        first = (t == tmin).to(torch.int8).argmax(dim=1) if F else torch.zeros(d.shape[0], dtype=torch.int64)
        rows = any_hit.nonzero(as_tuple=True)[0]
        f = first[rows]
        b = torch.stack([1 - u[rows, f] - w[rows, f], u[rows, f], w[rows, f]], dim=-1)
        face_id[c].view(-1)[rows] = f
        bary[c].view(-1, 3)[rows] = b.float()
        depth[c].view(-1)[rows] = t[rows, f].float()
    return Fragments(face_id, bary, depth, (face_id >= 0).float()[..., None])


# ---------------------------------------------------------------------------------------------
# shading


def interpolate(attributes: torch.Tensor, fragments: Fragments, faces: torch.Tensor) -> torch.Tensor:
    """Interpolate vertex attributes at every pixel with the fragments' barycentrics.

    Args:
        attributes: [V, D] per-vertex values, or [F, 3, D] values per face corner.
        fragments: from :func:`rasterize` with these faces.
        faces: [F, 3] int64.

    Returns:
        [C, H, W, D], 0 where empty. Differentiable with respect to ``attributes`` and the barycentrics.
    """
    idx, fid = _covered(fragments)
    values = _interpolate_at(attributes, faces, fid, fragments.bary.reshape(-1, 3)[idx])
    return _scatter_pixels(values, idx, fragments.face_id.shape)


def _covered(fragments: Fragments) -> tuple[torch.Tensor, torch.Tensor]:
    """(flat indices [P] of the covered pixels, their face ids [P])."""
    flat = fragments.face_id.reshape(-1)
    idx = (flat >= 0).nonzero(as_tuple=True)[0]
    return idx, flat[idx]


def _interpolate_at(attributes: torch.Tensor, faces: torch.Tensor, fid: torch.Tensor, bary: torch.Tensor):
    """[P, D] attributes ([V, D] per vertex or [F, 3, D] per corner) at P points (faces fid, bary [P, 3])."""
    if attributes.dim() == 2:
        corner = _gather(attributes, faces[fid])  # [P, 3, D]
    else:
        corner = _gather(attributes.reshape(attributes.shape[0], -1), fid).view(-1, 3, attributes.shape[-1])
    return (bary[..., None] * corner).sum(dim=-2)


def _gather(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``table[index]`` ([*index.shape, D] from [R, D]) through ``index_select``: its backward
    (``index_add_``) is deterministic on the CPU with several threads, advanced indexing's is not."""
    return table.index_select(0, index.reshape(-1)).view(*index.shape, table.shape[-1])


def _scatter_pixels(values: torch.Tensor, idx: torch.Tensor, shape) -> torch.Tensor:
    """[P, D] values at flat pixel indices -> [*shape, D] image, 0 elsewhere (differentiable)."""
    n = math.prod(shape)
    out = torch.zeros(n, values.shape[-1], dtype=values.dtype, device=values.device)
    return out.index_put((idx,), values).view(*shape, values.shape[-1])


def sample_texture(texture: torch.Tensor, uv: torch.Tensor) -> torch.Tensor:
    """Bilinear texture lookup with repeat wrapping.

    Args:
        texture: [Ht, Wt, D] float, row 0 at the top of the image.
        uv: [..., 2] float texture coordinates in the OBJ / trimesh convention: u to the right, v up
            (v = 0 at the bottom row, 1 at the top); texel (i, j) has its centre at
            u = (j + 0.5) / Wt, v = 1 - (i + 0.5) / Ht. Values outside [0, 1] repeat.

    Returns:
        [..., D], differentiable with respect to ``texture`` and ``uv``.
    """
    Ht, Wt, D = texture.shape
    x = uv[..., 0] * Wt - 0.5
    y = (1.0 - uv[..., 1]) * Ht - 0.5
    x0f, y0f = torch.floor(x), torch.floor(y)
    fx, fy = (x - x0f)[..., None], (y - y0f)[..., None]
    x0 = x0f.long() % Wt
    y0 = y0f.long() % Ht
    x1, y1 = (x0 + 1) % Wt, (y0 + 1) % Ht
    flat = texture.reshape(-1, D)

    def at(yi, xi):
        return _gather(flat, yi * Wt + xi)

    top = at(y0, x0) * (1 - fx) + at(y0, x1) * fx
    bottom = at(y1, x0) * (1 - fx) + at(y1, x1) * fx
    return top * (1 - fy) + bottom * fy


def bilinear_taps(uv: torch.Tensor, height: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The four texels and weights of :func:`sample_texture`'s bilinear lookup, for lookups repeated at
    fixed coordinates (a texture optimised on fixed geometry): ``sample_taps(texture, *taps)`` equals
    ``sample_texture(texture, uv)`` (same weights; the four terms summed in another order).

    Args:
        uv: [..., 2] float texture coordinates (:func:`sample_texture`'s convention, repeat wrapping).
        height, width: the texture's Ht, Wt.

    Returns:
        ``(index, weight)``: [..., 4] int64 flat (row-major) texel indices and [..., 4] float weights
        summing to 1, in the order (y0, x0), (y0, x1), (y1, x0), (y1, x1).
    """
    x = uv[..., 0] * width - 0.5
    y = (1.0 - uv[..., 1]) * height - 0.5
    x0f, y0f = torch.floor(x), torch.floor(y)
    fx, fy = x - x0f, y - y0f
    x0, y0 = x0f.long() % width, y0f.long() % height
    x1, y1 = (x0 + 1) % width, (y0 + 1) % height
    index = torch.stack([y0 * width + x0, y0 * width + x1, y1 * width + x0, y1 * width + x1], dim=-1)
    weight = torch.stack([(1 - fx) * (1 - fy), fx * (1 - fy), (1 - fx) * fy, fx * fy], dim=-1)
    return index, weight


def sample_taps(texture: torch.Tensor, index: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """[..., D] bilinear lookups of texture [Ht, Wt, D] at :func:`bilinear_taps` ``(index, weight)``:
    one gather of every tap (differentiable with respect to ``texture``)."""
    D = texture.shape[-1]
    taps = _gather(texture.reshape(-1, D), index)  # [..., 4, D]
    return (taps * weight[..., None].to(taps.dtype)).sum(dim=-2)


def _as_tensor(x: Any, device, dtype=None) -> torch.Tensor | None:
    if x is None:
        return None
    return torch.as_tensor(x, device=device, dtype=dtype)


def vertex_normals(vertices: torch.Tensor, faces: torch.Tensor) -> torch.Tensor:
    """[V, 3] unit area-weighted vertex normals; vertices at identical positions (copies made at UV
    seams) share one normal. Faces wound counter-clockwise from outside give outward normals."""
    uniq, inverse = torch.unique(vertices.detach(), dim=0, return_inverse=True)
    tri = vertices[faces]
    fn = torch.linalg.cross(tri[:, 1] - tri[:, 0], tri[:, 2] - tri[:, 0])  # length = 2 * area
    acc = torch.zeros(uniq.shape[0], 3, device=vertices.device, dtype=vertices.dtype)
    acc = acc.index_add(0, inverse[faces].reshape(-1), fn.repeat_interleave(3, dim=0))
    return torch.nn.functional.normalize(acc, dim=-1)[inverse]


#: the share of a lit surface's brightness that does not depend on its normal
AMBIENT = 0.3
LIGHTING = ("auto", "unlit", "lit")


def has_color(mesh: Any) -> bool:
    """True when the mesh carries colour: a UV texture (``uv`` and ``texture``) or ``vertex_colors``."""
    textured = getattr(mesh, "uv", None) is not None and getattr(mesh, "texture", None) is not None
    return textured or getattr(mesh, "vertex_colors", None) is not None


def _view_directions(cameras: Cameras) -> torch.Tensor:
    """[C, H, W, 3] world-space unit directions from each pixel's surface point towards its camera
    (minus the ray through the pixel centre)."""
    H, W = cameras.height, cameras.width
    dev = cameras.device
    ys, xs = torch.meshgrid(
        torch.arange(H, device=dev, dtype=torch.float32) + 0.5,
        torch.arange(W, device=dev, dtype=torch.float32) + 0.5,
        indexing="ij",
    )
    # K^-1 (x, y, 1) of a pinhole K (as _project applies it), then R^T d in a fixed order: a view's
    # directions do not depend on the other cameras in the call (see fixed_order)
    K = cameras.Ks.float()[:, None, None]  # [C, 1, 1, 3, 3]
    dy = (ys - K[..., 1, 2]) / K[..., 1, 1]  # [C, H, W]
    dx = (xs - K[..., 0, 2] - K[..., 0, 1] * dy) / K[..., 0, 0]
    rays_cam = torch.stack([dx, dy, torch.ones_like(dx)], -1)[..., None]  # [C, H, W, 3, 1]
    r_t = cameras.viewmats[:, None, None, :3, :3].float().transpose(-1, -2)
    rays = fixed_order.matmul(r_t, rays_cam)[..., 0]  # R^T d
    return -rays / fixed_order.norm(rays).clamp_min(1e-12)[..., None]


def lighting(
    normals: torch.Tensor,
    cameras: Cameras,
    light_direction: Sequence[float] | torch.Tensor | None = None,
    ambient: float = AMBIENT,
) -> torch.Tensor:
    """[C, H, W, 1] Lambertian brightness in [ambient, 1] of surface points with ``normals``.

    ``ambient + (1 - ambient) * max(0, n . l)``, two-sided: each normal is first turned towards the
    camera (so a mesh's winding does not matter). ``l`` is the unit direction towards the light: with
    ``light_direction`` None, a head light (the light sits at each camera: ``l`` is the direction to the
    camera, so faces seen head-on are brightest and grazing ones darkest); else that fixed world-space
    direction (the same light in every view, so a surface's brightness does not depend on the view:
    what a reconstruction from the views needs).

    Args:
        normals: [C, H, W, 3] world-space unit normals (0 where empty: brightness ``ambient`` there).
        cameras: the C cameras of H x W pixels the normals were rendered from.
        light_direction: None, or 3 values (world space, towards the light; normalised here).
        ambient: the share of brightness given regardless of the normal.
    """
    view = _view_directions(cameras).to(normals.device)
    n = torch.where(fixed_order.dot(normals, view)[..., None] < 0, -normals, normals)
    if light_direction is None:
        light = view
    else:
        light = torch.nn.functional.normalize(
            torch.as_tensor(light_direction, dtype=torch.float32, device=normals.device), dim=-1
        )
    cos = fixed_order.dot(n, light)[..., None].clamp_min(0.0)
    return ambient + (1.0 - ambient) * cos


def shade(
    mesh: Any,
    fragments: Fragments,
    default_color: Sequence[float] = (0.7, 0.7, 0.7),
    brightness: torch.Tensor | None = None,
) -> torch.Tensor:
    """Surface colour per pixel: the UV texture when the mesh has ``uv`` and ``texture``, else its
    ``vertex_colors``, else ``default_color``; times ``brightness`` when given (see :func:`lighting`).

    Args:
        mesh: an object with ``faces`` [F, 3] and optionally ``uv`` [V, 2] (OBJ convention, see
            :func:`sample_texture`), ``texture`` [Ht, Wt, 3] (uint8, read as value / 255, as a
            :class:`microdreamer.mesh.Mesh` holds it; or float in [0, 1], e.g. a tensor being
            optimised), ``vertex_colors`` [V, 3] float in [0, 1] (NumPy arrays or tensors).
        fragments: from :func:`rasterize` of this mesh.
        brightness: [C, H, W, 1] factor per pixel (e.g. from :func:`lighting`); None: unlit.

    Returns:
        [C, H, W, 3] float32 colour, 0 where empty.
    """
    dev = fragments.bary.device
    faces = _as_tensor(mesh.faces, dev, torch.int64)
    uv = _as_tensor(getattr(mesh, "uv", None), dev, torch.float32)
    texture = _as_tensor(getattr(mesh, "texture", None), dev)
    if texture is not None:
        texture = texture.float() / 255.0 if texture.dtype == torch.uint8 else texture.float()
    colors = _as_tensor(getattr(mesh, "vertex_colors", None), dev, torch.float32)
    idx, fid = _covered(fragments)
    bary = fragments.bary.reshape(-1, 3)[idx]
    if uv is not None and texture is not None:
        values = sample_texture(texture[..., :3], _interpolate_at(uv, faces, fid, bary))
    elif colors is not None:
        values = _interpolate_at(colors[:, :3], faces, fid, bary)
    else:
        values = torch.as_tensor(default_color, dtype=torch.float32, device=dev).expand(idx.shape[0], 3)
    if brightness is not None:
        values = values * brightness.reshape(-1, 1)[idx]
    return _scatter_pixels(values, idx, fragments.face_id.shape)


def render_mesh(
    mesh: Any,
    cameras: Cameras,
    background: Sequence[float] | torch.Tensor = (1.0, 1.0, 1.0),
    ssaa: int = 1,
    cull_backfaces: bool = False,
    smooth_normals: bool = True,
    default_color: Sequence[float] = (0.7, 0.7, 0.7),
    camera_batch: int | None = None,
    max_candidates: int = 1 << 22,
    lighting_mode: str = "auto",
    light_direction: Sequence[float] | None = None,
    ambient: float = AMBIENT,
) -> MeshRender:
    """Render a mesh's colour, coverage, depth and normals from C cameras.

    Args:
        mesh: ``vertices`` [V, 3], ``faces`` [F, 3] and optional ``uv``, ``texture``,
            ``vertex_colors`` (see :func:`shade`): a :class:`microdreamer.mesh.Mesh` or anything
            alike; moved to the cameras' device.
        cameras: C cameras of H x W pixels.
        background: RGB in [0, 1], three values or [C, 3].
        ssaa: supersampling factor s: rasterise at (s H) x (s W) and average s x s blocks (colours
            premultiplied by coverage), for antialiased edges and texture minification.
        cull_backfaces, max_candidates: passed to :func:`rasterize`.
        smooth_normals: interpolate vertex normals (True) or use the face normals.
        camera_batch: cameras rasterised at once; default: as many as keep about 4M supersampled
            pixels per batch.
        lighting_mode: ``"auto"`` (the default): a mesh with colour (texture or vertex colours) renders
            unlit, its colours as they are; a mesh without colour is shaded with :func:`lighting`
            (``default_color`` times Lambertian brightness), so its shape shows instead of a flat
            silhouette. ``"unlit"`` or ``"lit"`` force one or the other.
        light_direction, ambient: the light (see :func:`lighting`): None = a head light at each camera.

    Returns:
        :class:`MeshRender` (rgb, alpha, depth, normals at H x W).
    """
    dev = cameras.device
    vertices = _as_tensor(mesh.vertices, dev, torch.float32)
    faces = _as_tensor(mesh.faces, dev, torch.int64)
    C, H, W = len(cameras), cameras.height, cameras.width
    bg = torch.as_tensor(background, dtype=torch.float32, device=dev)
    bg = bg.expand(C, 3) if bg.dim() <= 1 else bg
    if bg.shape != (C, 3):
        raise ValueError(f"background must be 3 values or [C, 3] = [{C}, 3], got {tuple(bg.shape)}")
    if ssaa < 1:
        raise ValueError(f"ssaa must be >= 1, got {ssaa}")
    if lighting_mode not in LIGHTING:
        raise ValueError(f"lighting_mode must be one of {', '.join(LIGHTING)}, got {lighting_mode!r}")
    lit = lighting_mode == "lit" or (lighting_mode == "auto" and not has_color(mesh))
    if camera_batch is None:
        camera_batch = max(1, (4 << 20) // (H * W * ssaa * ssaa))
    normals_v = vertex_normals(vertices, faces) if smooth_normals and faces.shape[0] else None
    if normals_v is None and faces.shape[0]:
        tri = vertices[faces]
        normals_f = torch.nn.functional.normalize(
            torch.linalg.cross(tri[:, 1] - tri[:, 0], tri[:, 2] - tri[:, 0]), dim=-1
        )
    outs = []
    for b in range(0, C, camera_batch):
        cams = cameras[b : b + camera_batch]
        big = Cameras(cams.viewmats, cams.Ks.clone(), W * ssaa, H * ssaa, cams.near, cams.far)
        big.Ks[:, :2] *= ssaa  # fx, fy, cx, cy in supersampled pixels
        frags = rasterize(vertices, faces, big, cull_backfaces=cull_backfaces, max_candidates=max_candidates)
        if faces.shape[0] == 0:
            normal = torch.zeros(*frags.face_id.shape, 3, device=dev)
        elif normals_v is not None:
            normal = interpolate(normals_v, frags, faces)
        else:
            normal = normals_f[frags.face_id.clamp_min(0)] * frags.alpha
        brightness = None
        if lit:
            unit = torch.nn.functional.normalize(normal.detach(), dim=-1)
            brightness = lighting(unit, big, light_direction, ambient)
        color = shade(mesh, frags, default_color, brightness)
        # channels-first [c, 8, sH, sW], all premultiplied by coverage, averaged over s x s blocks
        parts = (color, frags.alpha, frags.depth, normal)
        stacked = torch.cat([x.permute(0, 3, 1, 2) for x in parts], dim=1)
        pooled = torch.nn.functional.avg_pool2d(stacked, ssaa) if ssaa > 1 else stacked
        outs.append(pooled.permute(0, 2, 3, 1))
    if not outs:
        pooled = torch.zeros(0, H, W, 8, device=dev)
    else:
        pooled = torch.cat(outs, dim=0)
    alpha = pooled[..., 3:4]
    rgb = pooled[..., :3] + bg[:, None, None, :] * (1 - alpha)
    depth = torch.where(alpha > 0, pooled[..., 4:5] / alpha.clamp_min(1e-12), torch.zeros_like(alpha))
    normals = torch.nn.functional.normalize(pooled[..., 5:8], dim=-1)
    return MeshRender(rgb, alpha, depth, normals)
