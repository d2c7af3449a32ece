"""Multi-view back-projection bake: colour every texel of a UV atlas from renders of the splat.

The bake is texel-centric. Every covered texel has a surface point and a face normal
(:func:`~microdreamer.texture.atlas.texel_samples`). For each view:

1. the splat is rendered (premultiplied colour over black, and alpha) and the mesh is rasterised
   with :func:`microdreamer.render.mesh.rasterize_depth` (its depth is the visibility buffer);
2. each texel's point is projected into the view. It counts only if it faces the camera (the cosine
   between its normal and the direction to the camera is above ``cos_threshold``) and is visible: at
   each of the four pixels its bilinear lookup touches, the mesh covers the pixel and the rasterised
   depth matches the point's depth within a tolerance that allows for the surface's slope over 1.5
   pixels (so grazing surfaces are not rejected by their own depth gradient) plus ``depth_eps``
   relative;
3. its colour is the bilinear lookup of the premultiplied render divided by that of alpha (the
   splat's colour without the background), kept where the looked-up alpha is at least ``min_alpha``,
   and blended over views with weight ``alpha * cosine ** cos_power`` (a high power favours the most
   frontal view; 0 is a plain average; 2, the default, scored as well as or better than 4 on held-out views).

Steps 2 and 3 have two implementations (``BakeConfig.project_backend``): the PyTorch one over [c, T]
tensors (:func:`_accumulate_texels`, the reference, on any device) and the C++ CPU kernel
(:func:`microdreamer.kernels.cpu.bake_accumulate`), one (view, texel) pair at a time with the same
tests and float32 arithmetic; ``"auto"`` takes the kernel on the CPU when it builds.

Texels no view saw, and the gutters between charts, are then filled
(:func:`~microdreamer.texture.atlas.fill_texture`). The default view set is the issue's: 8 azimuths
at elevations 0 and +-45 degrees, plus straight above and below, 512 x 512 pixels, framed so that the
mesh's bounding sphere fills the field of view.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

import torch

from microdreamer import fixed_order
from microdreamer.cameras import Cameras, centred_orbit_cameras
from microdreamer.config import PROJECT_BACKENDS, BakeConfig, BakeViewsConfig
from microdreamer.cpu_pool import cpu_workers, map_single_threaded
from microdreamer.texture.atlas import TexelSamples

logger = logging.getLogger(__name__)

# render_fn(cameras) -> (premultiplied rgb [C, H, W, 3], alpha [C, H, W, 1]) on the cameras' device
RenderFn = Callable[[Cameras], tuple[torch.Tensor, torch.Tensor]]


def bake_cameras(config: BakeViewsConfig, center: torch.Tensor, bound_radius: float) -> Cameras:
    """The C = ``config.num_views`` cameras of the view set, framing the given bounding sphere."""
    els, azs = [], []
    for el in config.elevations:
        for k in range(config.azimuths):
            els.append(el)
            azs.append(360.0 * k / config.azimuths)
    if config.poles:
        els += [-90.0, 90.0]
        azs += [0.0, 0.0]
    return centred_orbit_cameras(els, azs, center, bound_radius, config.fovy_deg, config.size, config.margin)


def splat_render_fn(splat, backend: str = "auto") -> RenderFn:
    """A :data:`RenderFn` rendering ``splat`` (premultiplied colour over black, and alpha)."""
    from microdreamer.render.gaussians import render

    def fn(cameras: Cameras) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.no_grad():
            out = render(
                splat, cameras.to(splat.device), background=(0.0, 0.0, 0.0), backend=backend, depth=False
            )
        return out.rgb.float(), out.alpha.float()

    return fn


def mesh_render_fn(mesh, ssaa: int = 1) -> RenderFn:
    """A :data:`RenderFn` rendering a textured or coloured mesh (``vertices``, ``faces``, ``uv`` +
    float ``texture`` or ``vertex_colors``, as :func:`microdreamer.render.mesh.render_mesh` takes)."""
    from microdreamer.render.mesh import render_mesh

    def fn(cameras: Cameras) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.no_grad():
            out = render_mesh(mesh, cameras, background=(0.0, 0.0, 0.0), ssaa=ssaa)
        return out.rgb, out.alpha

    return fn


def bake_views(
    samples: TexelSamples,
    vertices: torch.Tensor,
    faces: torch.Tensor,
    cameras: Cameras,
    render_fn: RenderFn,
    config: BakeConfig | None = None,
    progress: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """Back-project C views onto the covered texels.

    Args:
        samples: T covered texels (points and normals) of the mesh ``vertices``, ``faces``.
        vertices: [V, 3] float32, faces: [F, 3] int64, on the device the bake runs on.
        cameras: C views (H x W).
        render_fn: what is baked: cameras -> (premultiplied rgb [C, H, W, 3], alpha [C, H, W, 1]).
        config: thresholds and batching (its ``views`` is not used here).
        progress: show a tqdm progress bar over the views.

    Returns:
        ``(colors [T, 3] float32, seen [T] bool, stats)``; stats holds ``seconds`` {``render``,
        ``rasterize``, ``project``} and ``views``.
    """
    from microdreamer.render.mesh import rasterize_depth

    config = config or BakeConfig()
    device = vertices.device
    cameras = cameras.to(device)
    T = len(samples)
    num = torch.zeros(T, 3, device=device)
    den = torch.zeros(T, device=device)
    seconds = {"render": 0.0, "rasterize": 0.0, "project": 0.0}
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(cameras), desc="bake", unit="view", leave=False)
    batch = config.view_batch or (max(1, len(cameras)) if device.type == "cuda" else 4)
    for b in range(0, len(cameras), batch):
        cams = cameras[b : b + batch]
        start = time.perf_counter()
        rgb, alpha = render_fn(cams)
        rgb, alpha = rgb.to(device), alpha.to(device)
        _sync(device)
        seconds["render"] += time.perf_counter() - start
        start = time.perf_counter()
        with torch.no_grad():
            mesh_depth, covered = rasterize_depth(vertices, faces, cams, cull_backfaces=config.cull_backfaces)
        _sync(device)
        seconds["rasterize"] += time.perf_counter() - start
        start = time.perf_counter()
        rgba = torch.cat([rgb, alpha], dim=-1).reshape(-1, 4)
        depth = torch.where(covered > 0, mesh_depth, torch.full_like(mesh_depth, math.inf))
        _accumulate(samples, cams, rgba, depth.reshape(-1), config, num, den, backend=config.project_backend)
        _sync(device)
        seconds["project"] += time.perf_counter() - start
        if bar is not None:
            bar.update(len(cams))
    if bar is not None:
        bar.close()
    seen = den > 0
    colors = num / den.clamp_min(1e-12)[:, None]
    return colors.clamp(0.0, 1.0), seen, {"seconds": seconds, "views": len(cameras)}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _accumulate(
    samples: TexelSamples,
    cams: Cameras,
    rgba: torch.Tensor,
    depth: torch.Tensor,
    config: BakeConfig,
    num: torch.Tensor,
    den: torch.Tensor,
    compact: bool | None = None,
    workers: int | None = None,
    backend: str = "auto",
) -> None:
    """Add the weighted colours of c views to num [T, 3] and den [T] (in place).

    rgba: [c H W, 4] premultiplied colour and alpha of the renders; depth: [c H W] camera-space z of
    the mesh raster, +inf where the mesh does not cover the pixel.

    backend: ``"torch"`` (:func:`_accumulate_texels`, the reference), ``"cpp"``
    (:func:`microdreamer.kernels.cpu.bake_accumulate`: the same tests and float32 arithmetic per
    (view, texel) pair, CPU tensors only; ``compact`` does not apply) or ``"auto"`` (``"cpp"`` on
    the CPU when the kernels build, else ``"torch"``).

    compact: after the cheap tests (facing, in front, inside the image), evaluate the rest only for
    the (view, texel) pairs that passed and scatter their weights and colours back: the same
    operations on the same values, so the same sums to the bit (on the ghost's bake, a third of the
    pairs pass). Its ``nonzero`` synchronises with the host, so on a GPU all c x T pairs are
    evaluated with masks instead. None = compact on the CPU.
    workers: on the CPU, ranges of texels on this many threads that run PyTorch single-threaded
    (:mod:`microdreamer.cpu_pool`; every texel's sum over the views is its own); None =
    :func:`~microdreamer.cpu_pool.cpu_workers`.
    """
    if backend not in PROJECT_BACKENDS:
        raise ValueError(f"project backend {backend!r} is unknown; use one of {', '.join(PROJECT_BACKENDS)}")
    on_cpu = rgba.device.type == "cpu"
    if backend == "auto":
        from microdreamer.kernels import cpu

        backend = "cpp" if on_cpu and cpu.usable() else "torch"
    if compact is None:
        compact = on_cpu
    T = len(samples)
    if workers is None:
        workers = cpu_workers(rgba.device, T)
    if backend == "cpp":
        from microdreamer.kernels import cpu

        if not on_cpu:
            raise ValueError(f"the cpp project backend runs on CPU tensors; these are on {rgba.device}")
        cpu.bake_accumulate(
            samples.points.contiguous(), samples.normals.contiguous(), cams.viewmats.contiguous(),
            cams.Ks.contiguous(), cams.height, cams.width, cams.near, rgba.contiguous(), depth.contiguous(),
            config.cos_threshold, config.cos_power, config.min_alpha, config.depth_eps, num, den, workers,
        )  # fmt: skip
        return
    bounds = [T * i // max(1, workers) for i in range(max(1, workers) + 1)]

    def part(i: int) -> None:
        a, b = bounds[i], bounds[i + 1]
        _accumulate_texels(
            samples.points[a:b], samples.normals[a:b], cams, rgba, depth, config, num[a:b], den[a:b], compact
        )

    map_single_threaded(part, range(len(bounds) - 1), workers)


def _accumulate_texels(
    points: torch.Tensor,
    normals: torch.Tensor,
    cams: Cameras,
    rgba: torch.Tensor,
    depth: torch.Tensor,
    config: BakeConfig,
    num: torch.Tensor,
    den: torch.Tensor,
    compact: bool,
) -> None:
    """:func:`_accumulate` for T texels at ``points`` [T, 3] with ``normals`` [T, 3], in this thread."""
    c, H, W = len(cams), cams.height, cams.width
    T = points.shape[0]
    R, t = cams.viewmats[:, :3, :3], cams.viewmats[:, :3, 3]  # [c, 3, 3], [c, 3]
    fx_, fy_ = cams.Ks[:, 0, 0, None], cams.Ks[:, 1, 1, None]  # [c, 1]
    cx_, cy_ = cams.Ks[:, 0, 2, None], cams.Ks[:, 1, 2, None]
    # every product and sum below runs in a fixed order on elementwise kernels, never the BLAS, whose
    # blocking depends on the batch: a texel's sums are the same bits in any range of texels (see
    # fixed_order), so the threads' ranges do not change the bake
    centre = -fixed_order.matmul(R.transpose(1, 2), t[:, :, None])[..., 0]  # [c, 3]
    # facing: cos = n . (centre - p) / |centre - p|
    to_cam = centre[:, None, :] - points[None]  # [c, T, 3]
    cos = fixed_order.dot(normals[None], to_cam) / fixed_order.norm(to_cam).clamp_min(1e-12)  # [c, T]
    pc = fixed_order.transform_points(R, t, points)  # camera space [c, T, 3]
    z = pc[..., 2]
    zs = z.clamp_min(1e-9)
    x = fx_ * pc[..., 0] / zs + cx_ - 0.5  # continuous pixel index (centres at integers)
    y = fy_ * pc[..., 1] / zs + cy_ - 0.5
    ok = (cos > config.cos_threshold) & (cos > 0) & (z > cams.near)
    ok &= (x >= 0) & (y >= 0) & (x <= W - 1) & (y <= H - 1)
    view = torch.arange(c, device=z.device)[:, None].expand(c, T)
    fy_t = fy_.expand(c, T)
    if compact:
        pairs = torch.nonzero(ok.reshape(-1)).squeeze(1)  # flat (view, texel)

        def take(v: torch.Tensor) -> torch.Tensor:
            return v.reshape(-1).index_select(0, pairs)

        cos, z, x, y, view, fy_t = (take(v) for v in (cos, z, x, y, view, fy_t))
        weight, colour, ok_p = _pair_colours(cos, z, x, y, view, fy_t, H, W, rgba, depth, config)
        weight = (
            torch.zeros(c * T, device=z.device, dtype=weight.dtype).index_copy_(0, pairs, weight).view(c, T)
        )
        colour = torch.where(ok_p[:, None], colour, 0.0)
        colour = torch.zeros(c * T, 3, device=z.device, dtype=colour.dtype).index_copy_(0, pairs, colour)
        colour = colour.view(c, T, 3)
    else:
        weight, colour, ok_all = _pair_colours(cos, z, x, y, view, fy_t, H, W, rgba, depth, config, ok)
        colour = torch.where(ok_all[..., None], colour, 0.0)
    # each texel sums its views in view order, then adds that sum once (as the C++ kernel does)
    num += fixed_order.total(weight[..., None] * colour, dim=0)
    den += fixed_order.total(weight, dim=0)


def _pair_colours(
    cos: torch.Tensor,
    z: torch.Tensor,
    x: torch.Tensor,
    y: torch.Tensor,
    view: torch.Tensor,
    fy: torch.Tensor,
    H: int,
    W: int,
    rgba: torch.Tensor,
    depth: torch.Tensor,
    config: BakeConfig,
    ok: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Visibility, the bilinear lookup and the blending weight of (view, texel) pairs, any shape S.

    Args:
        cos, z: [S] the texel's facing cosine and camera depth; x, y: [S] its continuous pixel index
            (inside the image); view: [S] int64 its view; fy: [S] that view's focal length in pixels.
        rgba: [c H W, 4]; depth: [c H W] (see :func:`_accumulate`).
        ok: [S] bool, the pairs that passed the cheap tests (None: all of them).

    Returns:
        (weight [S], 0 where not ok; colour [S, 3], undefined where not ok; ok [S] bool).
    """
    x0 = x.nan_to_num(0.0).clamp(0, max(W - 2, 0)).floor().long()
    y0 = y.nan_to_num(0.0).clamp(0, max(H - 2, 0)).floor().long()
    fx, fy_frac = (x - x0).clamp(0, 1), (y - y0).clamp(0, 1)
    # depth tolerance: the surface's depth change over 1.5 pixels at this slope, plus depth_eps
    cpos = cos.clamp_min(1e-6)
    tan = (1.0 - cpos * cpos).clamp_min(0.0).sqrt() / cpos
    tol = z * (config.depth_eps + 1.5 * tan / fy.abs())
    base = (view * H + y0) * W + x0
    x1 = (x0 + 1).clamp(max=W - 1) - x0
    y1 = ((y0 + 1).clamp(max=H - 1) - y0) * W
    pix = torch.stack([base, base + x1, base + y1, base + y1 + x1], dim=-1)  # [S, 4]
    flat = pix.reshape(-1)
    visible = (depth.index_select(0, flat).view(pix.shape) - z[..., None]).abs() <= tol[..., None]
    vis = visible.all(dim=-1)  # inf depth: not covered
    ok = vis if ok is None else ok & vis
    wts = torch.stack(
        [(1 - fx) * (1 - fy_frac), fx * (1 - fy_frac), (1 - fx) * fy_frac, fx * fy_frac], dim=-1
    )  # [S, 4]
    sample = fixed_order.total(wts[..., None] * rgba.index_select(0, flat).view(*pix.shape, 4), -2)  # [S, 4]
    a = sample[..., 3]
    ok &= (a >= config.min_alpha) & (a > 0)
    # cos ** power as exp(power * log(cos)): pow with a float exponent takes another code path for
    # the last few elements of a CPU loop (1 ulp apart), exp and log do not, so the weights do not
    # depend on how the pairs are split or compacted
    weight = torch.where(ok, a * torch.exp(config.cos_power * torch.log(cpos)), 0.0)
    colour = sample[..., :3] / a.clamp_min(1e-12)[..., None]
    return weight, colour, ok
