"""The bake's C++ CPU back-projection (``kernels.cpu.bake_accumulate``) against its PyTorch reference
(``texture.bake._accumulate`` with ``backend="torch"``), on fresh seeded random inputs and on a whole bake."""

from __future__ import annotations

import math

import pytest
import torch

from microdreamer.cameras import Cameras, orbit_cameras
from microdreamer.kernels import cpu
from microdreamer.texture import BakeConfig, BakeViewsConfig, TexelSamples
from microdreamer.texture.bake import _accumulate

pytestmark = pytest.mark.skipif(
    not cpu.available(), reason="no C++ compiler: the C++ CPU kernels cannot be built"
)

RADIUS = 0.5  # the sphere the texels mostly lie on

# Tolerances. The kernel runs the reference's float32 operations in the reference's order, including the
# multiply-adds of PyTorch's CPU matmul for the camera-space points, so pixel coordinates agree to the bit;
# what remains is exp/log (glibc against PyTorch's vectorised ones, an ulp) and an occasional double
# rounding: measured at most 5e-7 relative over 60 random cases of 2000 texels. Sums of non-negative
# terms keep that relative. A path that rounds the coordinates differently (another BLAS order) shows as
# 1e-5 to 1e-4: a bilinear lookup between unrelated random pixels moves by an ulp of a 64-pixel coordinate;
# this tolerance is meant to catch that. ATOL 0: a texel no view saw is exactly 0 in both.
RTOL, ATOL = 1e-5, 0.0
# A test near a threshold may go either way in float32: pairs within these margins (computed in float64)
# are ties, and texels with a tie in any view are left out of the comparison (measured: well under 1%).
TIE_PIXEL = 2e-4  # pixel coordinates (26 ulps at 64): image borders, integers (floor() picks other pixels)
TIE_REL = 1e-5  # cosines, depths and alphas, relative


def random_views(g: torch.Generator, c: int, height: int, width: int) -> Cameras:
    """c cameras looking at the origin from distances 0.7-2.5 (the nearest ones see part of the sphere),
    near plane 0.05."""
    el = -80 + 160 * torch.rand(c, generator=g)
    az = 360 * torch.rand(c, generator=g)
    dist = 0.7 + 1.8 * torch.rand(c, generator=g)
    fov = 30 + 40 * float(torch.rand(1, generator=g))
    vm, ks = [], []
    for i in range(c):
        cam = orbit_cameras([float(el[i])], [float(az[i])], float(dist[i]), fov, width, height)
        vm.append(cam.viewmats)
        ks.append(cam.Ks)
    return Cameras(torch.cat(vm), torch.cat(ks), width, height, 0.05, 100.0)


def random_texels(g: torch.Generator, t: int) -> TexelSamples:
    """t texels: most on the sphere with its outward normal; 10% inside it (hidden), 5% far out (behind
    some cameras, outside the image of others), 10% with random normals (back-facing, grazing)."""
    d = torch.randn(t, 3, generator=g)
    d = d / d.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    u = torch.rand(t, generator=g)
    r = torch.where(u < 0.1, 0.8 * RADIUS, torch.where(u > 0.95, 6 * RADIUS, RADIUS))
    normals = torch.where(
        (torch.rand(t, generator=g) < 0.1)[:, None],
        torch.nn.functional.normalize(torch.randn(t, 3, generator=g)),
        d,
    )
    return TexelSamples(
        height=1,
        width=t,
        index=torch.arange(t),
        face=torch.zeros(t, dtype=torch.int64),
        bary=torch.full((t, 3), 1 / 3),
        points=(r[:, None] * d).float(),
        normals=normals.float(),
    )


def sphere_depth(cams: Cameras) -> torch.Tensor:
    """[c H W] float32 camera-space z of the sphere at each pixel centre (float64 ray cast), +inf where
    the ray misses it."""
    h, w = cams.height, cams.width
    ks = cams.Ks.double()
    R, t = cams.viewmats[:, :3, :3].double(), cams.viewmats[:, :3, 3].double()
    origin = -(R.transpose(1, 2) @ t[..., None])[..., 0]  # [c, 3]
    jj, ii = torch.meshgrid(
        torch.arange(w, dtype=torch.float64), torch.arange(h, dtype=torch.float64), indexing="xy"
    )
    dx = (jj[None] + 0.5 - ks[:, 0, 2, None, None]) / ks[:, 0, 0, None, None]
    dy = (ii[None] + 0.5 - ks[:, 1, 2, None, None]) / ks[:, 1, 1, None, None]
    d_cam = torch.stack([dx, dy, torch.ones_like(dx)], dim=-1)  # [c, H, W, 3], z = 1: s is the depth
    d = torch.einsum("cji,chwj->chwi", R, d_cam)  # world directions
    o = origin[:, None, None, :]
    a = (d * d).sum(-1)
    b = 2 * (o * d).sum(-1)
    q = (o * o).sum(-1) - RADIUS**2
    disc = b * b - 4 * a * q
    s = (-b - disc.clamp_min(0).sqrt()) / (2 * a)
    s = torch.where((disc >= 0) & (s > 0), s, math.inf)
    return s.float().reshape(-1)


def random_inputs(seed: int, t: int, c: int, height: int, width: int):
    g = torch.Generator().manual_seed(seed)
    cams = random_views(g, c, height, width)
    samples = random_texels(g, t)
    depth = sphere_depth(cams)
    far = torch.rand(depth.shape, generator=g) < 0.1  # occluders and holes: visibility fails there
    depth = torch.where(far, depth * 1.3, depth)
    depth = torch.where(torch.rand(depth.shape, generator=g) < 0.02, math.inf, depth)
    u = torch.rand(depth.shape[0], 1, generator=g)
    # 15% uncovered by the splat, 45% opaque, the rest partly covered
    alpha = torch.where(u < 0.15, 0.0, torch.where(u < 0.6, 1.0, torch.rand(u.shape, generator=g)))
    rgba = torch.cat([torch.rand(depth.shape[0], 3, generator=g) * alpha, alpha], dim=-1)  # premultiplied
    return samples, cams, rgba.contiguous(), depth


def ties(samples: TexelSamples, cams: Cameras, rgba: torch.Tensor, depth: torch.Tensor, config: BakeConfig):
    """[T] bool: texels with a (view, texel) pair within the tie margins of any of the bake's tests,
    recomputed in float64 (a detector of near-threshold pairs, not a second reference: it never gives
    a colour)."""
    c, h, w = len(cams), cams.height, cams.width
    p, n = samples.points.double(), samples.normals.double()
    R, t = cams.viewmats[:, :3, :3].double(), cams.viewmats[:, :3, 3].double()
    ks = cams.Ks.double()
    centre = -(R.transpose(1, 2) @ t[..., None])[..., 0]
    to_cam = centre[:, None] - p[None]
    cos = (n[None] * to_cam).sum(-1) / to_cam.norm(dim=-1)
    pc = torch.einsum("cij,tj->cti", R, p) + t[:, None]
    z = pc[..., 2]
    x = ks[:, 0, 0, None] * pc[..., 0] / z + ks[:, 0, 2, None] - 0.5
    y = ks[:, 1, 1, None] * pc[..., 1] / z + ks[:, 1, 2, None] - 0.5
    tie = ((cos - config.cos_threshold).abs() < TIE_REL) | (cos.abs() < TIE_REL)
    tie |= (z - cams.near).abs() < TIE_REL * z.abs()
    for v, size in ((x, w), (y, h)):
        tie |= (
            (v.abs() < TIE_PIXEL) | ((v - (size - 1)).abs() < TIE_PIXEL) | ((v - v.round()).abs() < TIE_PIXEL)
        )
    # the rest only where the cheap tests pass clearly
    inside = (cos > config.cos_threshold) & (cos > 0) & (z > cams.near)
    inside &= (x >= 0) & (y >= 0) & (x <= w - 1) & (y <= h - 1)
    x0 = x.clamp(0, max(w - 2, 0)).floor().long()
    y0 = y.clamp(0, max(h - 2, 0)).floor().long()
    fx, fy = (x - x0).clamp(0, 1), (y - y0).clamp(0, 1)
    cpos = cos.clamp_min(1e-6)
    tol = z * (
        config.depth_eps + 1.5 * (1 - cpos * cpos).clamp_min(0).sqrt() / cpos / ks[:, 1, 1, None].abs()
    )
    base = (torch.arange(c)[:, None] * h + y0) * w + x0
    x1 = (x0 + 1).clamp(max=w - 1) - x0
    y1 = ((y0 + 1).clamp(max=h - 1) - y0) * w
    pix = torch.stack([base, base + x1, base + y1, base + y1 + x1], -1)
    gap = (depth.double()[pix] - z[..., None]).abs() - tol[..., None]  # inf - inf: nan, not a tie
    tie |= inside & (gap.abs() < TIE_REL * (z.abs() + tol)[..., None]).any(-1)
    visible = inside & (gap <= 0).all(-1)
    wts = torch.stack([(1 - fx) * (1 - fy), fx * (1 - fy), (1 - fx) * fy, fx * fy], -1)
    a = (wts * rgba[:, 3].double()[pix]).sum(-1)
    tie |= visible & (((a - config.min_alpha).abs() < TIE_REL) | (a.abs() < TIE_REL) & (a > 0))
    return tie.any(0)


def both(samples, cams, rgba, depth, config, workers=1):
    sums = {}
    for backend in ("torch", "cpp"):
        num, den = torch.zeros(len(samples), 3), torch.zeros(len(samples))
        _accumulate(samples, cams, rgba, depth, config, num, den, workers=workers, backend=backend)
        sums[backend] = (num, den)
    return sums["torch"], sums["cpp"]


CONFIGS = {
    "default": BakeConfig(),
    "power0": BakeConfig(cos_power=0.0),
    "power4": BakeConfig(cos_power=4.0, cos_threshold=0.3),
    "negative_threshold": BakeConfig(cos_threshold=-0.5, depth_eps=0.0),
    "min_alpha0": BakeConfig(min_alpha=0.0, depth_eps=0.05),
    "min_alpha_high": BakeConfig(min_alpha=0.9),
}


@pytest.mark.parametrize(
    "seed, t, c, height, width, config, workers",
    [
        (0, 0, 3, 16, 16, "default", 1),
        (1, 1, 1, 16, 16, "default", 1),
        (2, 7, 2, 9, 13, "power0", 1),
        (3, 3000, 1, 32, 32, "default", 2),
        (4, 2049, 3, 23, 31, "power4", 3),
        (5, 3001, 4, 64, 64, "default", 2),
        (6, 3001, 4, 64, 48, "power0", 1),
        (7, 1500, 5, 40, 40, "negative_threshold", 2),
        (8, 1500, 4, 33, 33, "min_alpha0", 2),
        (9, 1500, 4, 33, 33, "min_alpha_high", 1),
        (10, 500, 2, 2, 3, "default", 1),  # images of 2 x 3 pixels
        (11, 400, 70, 16, 16, "default", 2),  # more views than the kernel holds at once (64)
    ],
)
def test_cpp_accumulation_matches_the_torch_reference(seed, t, c, height, width, config, workers):
    cfg = CONFIGS[config]
    samples, cams, rgba, depth = random_inputs(seed, t, c, height, width)
    (num_t, den_t), (num_c, den_c) = both(samples, cams, rgba, depth, cfg, workers)
    keep = ~ties(samples, cams, rgba, depth, cfg)
    assert int((~keep).sum()) <= max(1, t * c // 100)  # ties are rare (under 1% of the pairs)
    seen_t, seen_c = den_t > 0, den_c > 0
    assert torch.equal(seen_t[keep], seen_c[keep])
    torch.testing.assert_close(den_c[keep], den_t[keep], rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(num_c[keep], num_t[keep], rtol=RTOL, atol=ATOL)
    if t >= 1000:  # the inputs exercise both outcomes
        assert 20 <= int(seen_t.sum()) <= t - 20


def test_cpp_accumulation_adds_to_the_sums():
    samples, cams, rgba, depth = random_inputs(12, 800, 3, 32, 32)
    cfg = BakeConfig()
    num, den = torch.full((800, 3), 0.25), torch.full((800,), 2.0)
    _accumulate(samples, cams, rgba, depth, cfg, num, den, backend="cpp")
    num0, den0 = torch.zeros(800, 3), torch.zeros(800)
    _accumulate(samples, cams, rgba, depth, cfg, num0, den0, backend="cpp")
    torch.testing.assert_close(num, num0 + 0.25, rtol=1e-6, atol=1e-6)  # one float32 addition each
    torch.testing.assert_close(den, den0 + 2.0, rtol=1e-6, atol=1e-6)


def test_cpp_accumulation_rejects_bad_inputs():
    samples, cams, rgba, depth = random_inputs(13, 10, 2, 8, 8)
    cfg = BakeConfig()
    num, den = torch.zeros(10, 3), torch.zeros(10)
    with pytest.raises(ValueError, match="rgba"):
        _accumulate(samples, cams, rgba[:-1], depth, cfg, num, den, backend="cpp")
    with pytest.raises(ValueError, match="depth"):
        _accumulate(samples, cams, rgba, depth.double(), cfg, num, den, backend="cpp")
    with pytest.raises(ValueError, match="num"):
        _accumulate(samples, cams, rgba, depth, cfg, num.t().contiguous().t(), den, backend="cpp")
    with pytest.raises(ValueError, match="unknown"):
        _accumulate(samples, cams, rgba, depth, cfg, num, den, backend="numba")


def test_whole_bake_with_the_cpp_projection_matches_torch():
    """bake_views on a small real mesh with its raster depth and rendered colours, both projections."""
    pytest.importorskip("xatlas", reason="the texture stage needs xatlas (pip install xatlas)")
    from microdreamer.cameras import framing
    from microdreamer.mesh import Mesh
    from microdreamer.synthetic import position_colored_sphere
    from microdreamer.texture import bake_cameras, bake_views, mesh_render_fn, texel_samples, unwrap

    gt = position_colored_sphere(3)
    layout = unwrap(Mesh(gt.vertices, gt.faces), max_faces=None, texture_size=128)
    verts, faces = torch.from_numpy(layout.mesh.vertices), torch.from_numpy(layout.mesh.faces)
    samples = texel_samples(verts, faces, torch.from_numpy(layout.uv), 128, 128)
    center, radius = framing(verts)
    out = {}
    for backend in ("torch", "cpp"):
        config = BakeConfig(views=BakeViewsConfig(size=64), project_backend=backend)
        cams = bake_cameras(config.views, center, radius)
        out[backend] = bake_views(samples, verts, faces, cams, mesh_render_fn(gt), config)
    (col_t, seen_t, _), (col_c, seen_c, _) = out["torch"], out["cpp"]
    assert torch.equal(seen_c, seen_t) and float(seen_t.float().mean()) > 0.99
    # colours are ratios of the sums (clamped to [0, 1]): the sums' RTOL, relative to at most 1
    torch.testing.assert_close(col_c, col_t, rtol=0.0, atol=2 * RTOL)
