"""Gaussian renderer: the tiled PyTorch rasteriser against a dense brute-force reference, gradients,
and (on CUDA) gsplat against the PyTorch rasteriser.

The reference below is written independently of the library's tiling: every Gaussian against every
pixel, in float64, a per-pixel front-to-back loop that breaks like gsplat's kernel, and no bounding
boxes at all (so it also checks that the library's opacity-aware boxes never cut anything drawn).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from microdreamer.cameras import Cameras, orbit_cameras
from microdreamer.render import _torch_raster as tr
from microdreamer.render import render
from microdreamer.render.gaussians import eval_sh, resolve_backend, view_colors
from microdreamer.splat import Splat
from microdreamer.synthetic import near_far_cameras, random_sh_splat

# ------------------------------------------------------------------ input builders (shared with benchmarks)


# ------------------------------------------------------------------ dense float64 reference
def dense_reference(splat: Splat, cams: Cameras, background, sh_degree: int | None = None):
    """Every Gaussian against every pixel, float64 numpy, gsplat's rules, no tiles and no boxes."""
    s = Splat(**{k: v.detach().double().cpu() for k, v in splat.tensors().items()})
    degree = s.sh_degree if sh_degree is None else sh_degree
    colors = view_colors(s, cams.to("cpu"), degree).expand(len(cams), -1, -1).numpy()  # [C, N, 3]
    means, covs, opac = s.means.numpy(), s.covariances().numpy(), s.opacities().numpy()
    W, H = cams.width, cams.height
    bg = np.broadcast_to(np.asarray(background, np.float64), (len(cams), 3))
    py, px = np.meshgrid(np.arange(H) + 0.5, np.arange(W) + 0.5, indexing="ij")
    rgbs, alphas, depths = [], [], []
    for c in range(len(cams)):
        V = cams.viewmats[c].double().numpy()
        K = cams.Ks[c].double().numpy()
        R, t = V[:3, :3], V[:3, 3]
        fx, fy, cx, cy = K[0, 0], K[1, 1], K[0, 2], K[1, 2]
        drawn = []
        for i in range(len(s)):
            x, y, z = R @ means[i] + t
            if z < cams.near or z > cams.far or opac[i] < 1 / 255:
                continue
            lim_x = (W - cx) / fx + 0.15 * W / fx, cx / fx + 0.15 * W / fx  # 0.3 * tan(fov/2) margin
            lim_y = (H - cy) / fy + 0.15 * H / fy, cy / fy + 0.15 * H / fy
            u = min(lim_x[0], max(-lim_x[1], x / z))
            v = min(lim_y[0], max(-lim_y[1], y / z))
            J = np.array([[fx / z, 0, -fx * u / z], [0, fy / z, -fy * v / z]])
            cov2 = J @ (R @ covs[i] @ R.T) @ J.T + 0.3 * np.eye(2)
            if np.linalg.det(cov2) <= 0:
                continue
            drawn.append((z, i, np.array([fx * x / z + cx, fy * y / z + cy]), np.linalg.inv(cov2)))
        drawn.sort(key=lambda d: (d[0], d[1]))  # front to back, ties by index
        T = np.ones((H, W))
        acc = np.zeros((H, W, 4))
        done = np.zeros((H, W), bool)
        for z, i, mu, Q in drawn:
            dx, dy = mu[0] - px, mu[1] - py
            sigma = 0.5 * (Q[0, 0] * dx * dx + Q[1, 1] * dy * dy) + Q[0, 1] * dx * dy
            alpha = np.minimum(0.999, opac[i] * np.exp(-sigma))
            active = ~done & (sigma >= 0) & (alpha >= 1 / 255)
            next_T = T * (1 - alpha)
            stop = active & (next_T <= 1e-4)
            done |= stop
            active &= ~stop
            w = np.where(active, alpha * T, 0.0)
            acc += w[..., None] * np.append(colors[c, i], z)
            T = np.where(active, next_T, T)
        a = 1 - T
        rgbs.append(acc[..., :3] + T[..., None] * bg[c])
        alphas.append(a[..., None])
        depths.append(acc[..., 3:] / np.maximum(a, 1e-10)[..., None])
    return np.stack(rgbs), np.stack(alphas), np.stack(depths)


def opaque_stack(n: int = 12) -> Splat:
    """N large, nearly opaque Gaussians stacked along the view axis (float64): T falls below 1e-4
    and alphas hit the 0.999 clamp."""
    z = torch.linspace(-0.4, 0.4, n)
    means = torch.stack([0.02 * torch.sin(3 * z), 0.02 * torch.cos(5 * z), z], -1)
    op = torch.full((n,), 0.9995)
    op[::3] = 0.97
    colors = torch.rand(n, 3, generator=torch.Generator().manual_seed(1))
    quats = torch.tensor([[1.0, 0.0, 0.0, 0.0]]).expand(n, 4)
    splat = Splat.from_activated(means, torch.full((n, 3), 0.12), quats, op, colors)
    return Splat(**{k: v.double() for k, v in splat.tensors().items()})


# ------------------------------------------------------------------ forward against the reference
@pytest.mark.parametrize(
    "n, sh_degree, size",
    [(0, 0, (16, 16)), (1, 0, (16, 16)), (37, 0, (37, 29)), (64, 1, (24, 40)), (50, 3, (33, 17))],
)
def test_torch_matches_dense_reference_float64(n, sh_degree, size):
    splat = random_sh_splat(n, seed=n + 7 * sh_degree, sh_degree=sh_degree, dtype=torch.float64)
    cams = near_far_cameras(*size)
    bg = (0.2, 0.5, 0.9)
    out = render(splat, cams, background=bg, backend="torch")
    rgb, alpha, depth = dense_reference(splat, cams, bg)
    # float64 on both sides, same rules: agreement to rounding (1e-9 leaves room for cumprod order)
    np.testing.assert_allclose(out.rgb.numpy(), rgb, atol=1e-9, rtol=0)
    np.testing.assert_allclose(out.alpha.numpy(), alpha, atol=1e-9, rtol=0)
    # depth divides by alpha: compare where something is drawn (alpha > 1e-3), relative
    drawn = alpha > 1e-3
    np.testing.assert_allclose(out.depth.numpy()[drawn], depth[drawn], rtol=1e-8, atol=1e-9)
    assert out.rgb.shape == (len(cams), size[1], size[0], 3)


def test_transmittance_cutoff_and_alpha_clamp_match_reference():
    splat = opaque_stack()
    cams = orbit_cameras([0.0, 0.0], [0.0, 180.0], radius=2.0, width=21, height=19)
    out = render(splat, cams, background=(0.0, 1.0, 0.0), backend="torch")
    rgb, alpha, depth = dense_reference(splat, cams, (0.0, 1.0, 0.0))
    assert (1 - alpha).min() < 1e-3  # the cutoff really fires somewhere
    np.testing.assert_allclose(out.rgb.numpy(), rgb, atol=1e-9, rtol=0)
    np.testing.assert_allclose(out.alpha.numpy(), alpha, atol=1e-9, rtol=0)
    np.testing.assert_allclose(out.depth.numpy(), depth, atol=1e-9, rtol=1e-9)


@pytest.mark.parametrize("tile_size", [4, 8, 16])
def test_float32_tiles_and_chunks_match_reference(tile_size):
    splat = random_sh_splat(80, seed=3, sh_degree=1, log_scale=-2.0)
    cams = near_far_cameras(45, 35, n=4)
    out = render(splat, cams, background=(1, 1, 1), backend="torch", tile_size=tile_size)
    rgb, alpha, _ = dense_reference(splat, cams, (1, 1, 1))
    # float32 against float64: 2e-5 covers float32 rounding of sums of up to ~100 terms
    np.testing.assert_allclose(out.rgb.numpy(), rgb, atol=2e-5, rtol=0)
    np.testing.assert_allclose(out.alpha.numpy(), alpha, atol=2e-5, rtol=0)
    # tiny chunks give the same image
    proj = tr.project(
        splat.means,
        splat.covariances(),
        splat.opacities(),
        cams.viewmats,
        cams.Ks,
        45,
        35,
        cams.near,
        cams.far,
    )
    feats = torch.rand(len(cams), len(splat), 2, generator=torch.Generator().manual_seed(0))
    a1, al1 = tr.rasterize(proj, splat.opacities(), feats, 45, 35, tile_size=tile_size)
    a2, al2 = tr.rasterize(proj, splat.opacities(), feats, 45, 35, tile_size=tile_size, chunk_elems=1)
    torch.testing.assert_close(a1, a2, atol=1e-6, rtol=0)
    torch.testing.assert_close(al1, al2, atol=1e-6, rtol=0)


def _projected(splat: Splat, cams: Cameras) -> tr.Projection:
    return tr.project(
        splat.means,
        splat.covariances(),
        splat.opacities(),
        cams.viewmats.to(splat.means.dtype),
        cams.Ks.to(splat.means.dtype),
        cams.width,
        cams.height,
        cams.near,
        cams.far,
    )


@pytest.mark.parametrize("seed, n, log_scale, size, tile_size", [
    (0, 1, -1.5, (16, 16), 8), (1, 40, -2.0, (37, 29), 8), (2, 90, -2.5, (64, 48), 8),
    (3, 60, -1.2, (33, 17), 4), (4, 25, -1.8, (50, 41), 16),
])  # fmt: skip
def test_tile_intersections_keep_every_tile_a_gaussian_draws_in(seed, n, log_scale, size, tile_size):
    """Every (Gaussian, tile) pair with a pixel centre where the alpha reaches 1/255 (float64, every
    pixel of every tile of the box) is listed; every listed pair lies in the box and its ellipse
    reaches the tile's rectangle of centres (closest point by dense sampling: no pair far outside); and
    each tile's list is front to back (ties by index)."""
    splat = random_sh_splat(n, seed=seed, log_scale=log_scale, dtype=torch.float64)
    cams = near_far_cameras(*size)
    proj = _projected(splat, cams)
    op = splat.opacities()
    W, H = size
    tw, th = math.ceil(W / tile_size), math.ceil(H / tile_size)
    isect, per_tile = tr.tile_intersections(proj, op, W, H, tile_size)
    assert per_tile.shape == (len(cams) * th * tw,) and int(per_tile.sum()) == isect.numel()
    tile_of = torch.repeat_interleave(torch.arange(per_tile.numel()), per_tile)
    listed = set(zip(tile_of.tolist(), isect.tolist(), strict=True))
    N = len(splat)
    # per tile, its pixel centres and 4x denser samples of its rectangle of centres
    fine = torch.linspace(0.5, tile_size - 0.5, 4 * tile_size - 3, dtype=torch.float64)
    xs = (torch.arange(tw, dtype=torch.float64)[:, None] * tile_size + fine).reshape(-1)  # [tw * S]
    ys = (torch.arange(th, dtype=torch.float64)[:, None] * tile_size + fine).reshape(-1)
    S = fine.numel()
    required = 0
    for c in range(len(cams)):
        for i in range(N):
            rx, ry = proj.radii[c, i].tolist()
            mine = {t for t, gid in listed if gid == c * N + i}
            if rx <= 0 or ry <= 0:
                assert not mine
                continue
            mx, my = proj.means2d[c, i].tolist()
            a, b, cc = proj.conics[c, i].tolist()
            dx, dy = (xs - mx)[None, :], (ys - my)[:, None]
            q = (0.5 * (a * dx * dx + cc * dy * dy) + b * dx * dy).reshape(th, S, tw, S)  # [th, S, tw, S]
            drawn = (op[i] * torch.exp(-q[:, ::4, :, ::4]) >= 1 / 255).any(3).any(1)  # [th, tw]
            q_min = q.amin(dim=(1, 3))  # [th, tw]
            box = torch.zeros(th, tw, dtype=torch.bool)
            tx0, tx1 = max(0, math.floor((mx - rx) / tile_size)), min(tw, math.ceil((mx + rx) / tile_size))
            ty0, ty1 = max(0, math.floor((my - ry) / tile_size)), min(th, math.ceil((my + ry) / tile_size))
            box[ty0:ty1, tx0:tx1] = True
            want = {(c * th + y) * tw + x for y, x in torch.nonzero(box & drawn).tolist()}
            required += len(want)
            assert want <= mine, sorted(want - mine)
            for t in mine:
                y, x = divmod(t - c * th * tw, tw)
                assert bool(box[y, x]), t
                # the ellipse at 1/255 (plus the margin) reaches the rectangle; the sampled minimum
                # exceeds the true one by a sampling step's worth at most
                assert float(q_min[y, x]) <= math.log(op[i] * 255) + tr.REACH_MARGIN + 0.5, t
    assert required > 0
    # front to back inside each tile
    depth = proj.depths.reshape(-1)[isect]
    same = tile_of[1:] == tile_of[:-1]
    assert bool((depth[1:][same] > depth[:-1][same]).logical_or(
        (depth[1:][same] == depth[:-1][same]) & (isect[1:][same] > isect[:-1][same])).all())  # fmt: skip


@pytest.mark.parametrize("dtype, atol", [(torch.float64, 1e-12), (torch.float32, 2e-6)])
@pytest.mark.parametrize("depth_slice, chunk", [(1, None), (3, 1), (5, 777), (32, None)])
def test_depth_slices_match_whole_lists(dtype, atol, depth_slice, chunk):
    """Without gradients, compositing in depth slices (tiles leave once every pixel stopped) gives the
    whole lists' image: the same running transmittance, sums in another order (float64 1e-12;
    float32 2e-6, its rounding of ~100-term sums). A dense, opaque random splat (whole tiles stop
    early: 38 with slices of 3) and the opaque stack; chunks of one tile and of odd sizes."""
    splat = random_sh_splat(120, seed=9, log_scale=-1.6, spread=0.4, dtype=dtype)
    splat.opacity_logits = splat.opacity_logits.abs() + 2.0
    stack = Splat(**{k: v.to(dtype) for k, v in opaque_stack(15).tensors().items()})
    for s, cams in ((splat, near_far_cameras(45, 38, n=3)), (stack, near_far_cameras(21, 19, n=2))):
        proj = _projected(s, cams)
        g = torch.Generator().manual_seed(1)
        feats = torch.rand(len(cams), len(s), 3, generator=g, dtype=dtype)
        W, H = cams.width, cams.height
        with torch.no_grad():
            want, want_a = tr.rasterize(proj, s.opacities(), feats, W, H, depth_slice=None)
            for chunk in (None, 1, 777):
                got, got_a = tr.rasterize(
                    proj, s.opacities(), feats, W, H, chunk_elems=chunk, depth_slice=depth_slice
                )
                torch.testing.assert_close(got, want, atol=atol, rtol=0)
                torch.testing.assert_close(got_a, want_a, atol=atol, rtol=0)
        assert float(want_a.max()) > 1 - 1e-3  # nearly opaque pixels


@pytest.mark.parametrize("workers", [2, 3])
def test_camera_groups_on_threads_match_one_thread(workers):
    """Groups of cameras composited on threads (PyTorch single-threaded) against all cameras in this
    thread: each camera's image is its own (float32, 1e-6: sums of chunks of other shapes)."""
    splat = random_sh_splat(200, seed=12, log_scale=-2.0, spread=0.5)
    cams = near_far_cameras(40, 31, n=4)
    proj = _projected(splat, cams)
    feats = torch.rand(len(cams), len(splat), 3, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want, want_a = tr.rasterize(proj, splat.opacities(), feats, 40, 31, workers=1)
        got, got_a = tr.rasterize(proj, splat.opacities(), feats, 40, 31, workers=workers)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
    torch.testing.assert_close(got_a, want_a, atol=1e-6, rtol=0)
    assert float(want_a.max()) > 0.5


def test_weights_continue_from_a_carried_transmittance():
    """Two halves of a list, the second started from the first's T, give the whole list's T and
    weights: the running product continues (float64: equal to rounding)."""
    g = torch.Generator().manual_seed(4)
    B, M, P = 5, 23, 16
    coef = torch.randn(B, M, 6, generator=g, dtype=torch.float64) * 0.2
    coef[..., 0] = 1.5 * torch.rand(B, M, generator=g, dtype=torch.float64) - 1.0  # some alphas clamp
    basis = torch.randn(P, 6, generator=g, dtype=torch.float64) * 0.3
    alpha, t_before, weights, _, t_end = tr._weights(coef.clone(), basis)
    k = 9
    _, t1, w1, _, t_mid = tr._weights(coef[:, :k].clone(), basis)
    _, t2, w2, _, t_end2 = tr._weights(coef[:, k:].clone(), basis, t_start=t_mid)
    torch.testing.assert_close(torch.cat([t1, t2], 1), t_before, atol=1e-15, rtol=1e-13)
    torch.testing.assert_close(torch.cat([w1, w2], 1), weights, atol=1e-15, rtol=1e-13)
    torch.testing.assert_close(t_end2, t_end, atol=1e-15, rtol=1e-13)
    assert float(weights.sum(1).max()) > 0.9 and bool((weights == 0).any())


def test_empty_splat_renders_background():
    splat = random_sh_splat(0)
    cams = near_far_cameras(8, 6, n=2)
    out = render(splat, cams, background=(0.1, 0.2, 0.3))
    assert torch.equal(out.rgb, torch.tensor([0.1, 0.2, 0.3]).expand(2, 6, 8, 3))
    assert out.alpha.abs().max() == 0 and out.depth.abs().max() == 0


def test_backend_resolution():
    assert resolve_backend("auto", torch.device("cpu")) == "torch"
    with pytest.raises(ValueError, match="CUDA"):
        resolve_backend("gsplat", torch.device("cpu"))
    with pytest.raises(ValueError, match="unknown"):
        resolve_backend("vulkan", torch.device("cpu"))


# ------------------------------------------------------------------ spherical harmonics
def test_sh_basis_is_orthonormal():
    """Gauss-Legendre in cos(theta) x uniform phi integrates degree <= 6 products exactly."""
    nodes, weights = np.polynomial.legendre.leggauss(12)
    n_phi = 24
    phi = (np.arange(n_phi) + 0.5) * 2 * math.pi / n_phi
    ct, ph = np.meshgrid(nodes, phi, indexing="ij")
    st = np.sqrt(1 - ct**2)
    dirs = torch.from_numpy(np.stack([st * np.cos(ph), st * np.sin(ph), ct], -1).reshape(-1, 3))
    w = torch.from_numpy(np.repeat(weights, n_phi) * (2 * math.pi / n_phi))
    # basis function j: coefficients one-hot at j (same for the three channels)
    basis = torch.stack(
        [eval_sh(3, dirs, torch.eye(16, dtype=torch.float64)[j][None, :, None].expand(len(dirs), 16, 3))[:, 0]
         for j in range(16)], -1,
    )  # fmt: skip
    gram = basis.T @ (basis * w[:, None])
    torch.testing.assert_close(gram, torch.eye(16, dtype=torch.float64), atol=1e-12, rtol=0)


def test_sh_degree1_signs():
    """3DGS convention: Y_1 = (-C1 y, C1 z, -C1 x)."""
    d = torch.tensor([[0.6, 0.0, 0.8]], dtype=torch.float64)
    coeffs = torch.zeros(1, 4, 3, dtype=torch.float64)
    coeffs[0, 1:4, 0] = torch.tensor([1.0, 2.0, 3.0])
    got = eval_sh(1, d, coeffs)[0, 0].item()
    c1 = 0.4886025119029199
    assert got == pytest.approx(-c1 * 0.0 * 1 + c1 * 0.8 * 2 - c1 * 0.6 * 3, abs=1e-15)


# ------------------------------------------------------------------ gradients
def _param_fn(splat: Splat, cams: Cameras, bg, names):
    def fn(*tensors):
        params = splat.tensors()
        params.update(dict(zip(names, tensors, strict=True)))
        out = render(Splat(**params), cams, background=bg, backend="torch")
        return out.rgb, out.alpha, out.depth

    return fn


def test_gradcheck_all_parameters():
    splat = random_sh_splat(4, seed=11, sh_degree=1, spread=0.3, log_scale=-1.6, dtype=torch.float64)
    splat.opacity_logits = torch.tensor([0.3, -0.5, 1.0, 0.1], dtype=torch.float64)  # away from 0.999
    cams = near_far_cameras(9, 7, n=2)
    names = ["means", "sh_dc", "sh_rest", "opacity_logits", "log_scales", "quats"]
    inputs = [splat.tensors()[k].clone().requires_grad_(True) for k in names]
    fn = _param_fn(splat, cams, torch.tensor([[0.3, 0.6, 0.1], [1.0, 1.0, 1.0]], dtype=torch.float64), names)
    # float64 central differences; a pixel crossing the 1/255 cut within eps would be a (rare) jump
    assert torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-5, rtol=1e-4)


def test_gradcheck_rasterize_small_chunks():
    splat = random_sh_splat(5, seed=2, spread=0.3, log_scale=-1.7, dtype=torch.float64)
    cams = near_far_cameras(10, 9, n=1)
    op = splat.opacities().detach()
    proj = tr.project(splat.means, splat.covariances(), op, cams.viewmats.double(), cams.Ks.double(), 10, 9)
    m2 = proj.means2d.detach().clone().requires_grad_(True)
    con = proj.conics.detach().clone().requires_grad_(True)
    feats = torch.rand(1, 5, 3, dtype=torch.float64, requires_grad=True)
    opr = op.clone().requires_grad_(True)

    def fn(m2, con, opr, feats):
        p = tr.Projection(means2d=m2, conics=con, depths=proj.depths.detach(), radii=proj.radii)
        return tr.rasterize(p, opr, feats, 10, 9, tile_size=4, chunk_elems=256)

    assert torch.autograd.gradcheck(fn, (m2, con, opr, feats), eps=1e-6, atol=1e-5, rtol=1e-4)


def test_means2d_grad_is_retained_and_zero_for_culled():
    splat = random_sh_splat(30, seed=5)
    splat.means.requires_grad_(True)
    cams = near_far_cameras(20, 16)
    out = render(splat, cams, backend="torch", retain_means2d_grad=True)
    (out.rgb.sum() + out.alpha.sum()).backward()
    g = out.means2d.grad
    assert g is not None and g.shape == (len(cams), 30, 2)
    assert g[~out.visible].abs().max() == 0
    assert g[out.visible].abs().max() > 0
    # the opacity-culled Gaussians never draw
    assert not out.visible[:, :2].any()


# ------------------------------------------------------------------ gsplat against the reference (CUDA)
@pytest.mark.cuda
@pytest.mark.parametrize("sh_degree", [0, 3])
def test_gsplat_matches_torch_backend(sh_degree):
    pytest.importorskip("gsplat")
    splat = random_sh_splat(3000, seed=21 + sh_degree, sh_degree=sh_degree, log_scale=-3.0, device="cuda")
    cams = near_far_cameras(96, 80, n=4).to("cuda")
    bg = (0.3, 0.6, 0.9)
    params = {k: v.clone().requires_grad_(True) for k, v in splat.tensors().items()}
    outs = {}
    for backend in ("torch", "gsplat"):
        p = {k: v.detach().clone().requires_grad_(True) for k, v in params.items()}
        out = render(Splat(**p), cams, background=bg, backend=backend, retain_means2d_grad=True)
        g = torch.Generator(device="cuda").manual_seed(0)
        w_rgb = torch.rand(out.rgb.shape, device="cuda", generator=g)
        w_a = torch.rand(out.alpha.shape, device="cuda", generator=g)
        drawn = out.alpha.detach() > 0.05
        loss = (w_rgb * out.rgb).sum() + (w_a * out.alpha).sum() + (out.depth * drawn).sum() * 0.1
        loss.backward()
        outs[backend] = (out, {k: v.grad for k, v in p.items()})
    (ot, gt), (og, gg) = outs["torch"], outs["gsplat"]
    # images: both float32, but gsplat's exp is fast-math (~1e-6 relative), so a pixel-Gaussian pair
    # sitting exactly at the 1/255 cut can fall on either side: that changes one pixel by at most
    # 1/255. Everywhere else 1e-4; such flips must stay rare (< 0.1% of values).
    for a, b in ((og.rgb, ot.rgb), (og.alpha, ot.alpha)):
        diff = (a - b).abs()
        assert diff.max() <= 1 / 255 + 1e-4, diff.max()
        assert (diff > 1e-4).float().mean() < 1e-3, (diff > 1e-4).float().mean()
    drawn = ot.alpha > 0.05
    rel = (og.depth[drawn] - ot.depth[drawn]).abs() / ot.depth[drawn].abs()
    assert (rel > 1e-3).float().mean() < 1e-3, rel.max()
    assert torch.equal(og.radii > 0, ot.radii > 0) or (og.visible != ot.visible).float().mean() < 1e-3
    # gradients: float32 sums over thousands of pixels in a different order; compare each
    # parameter's gradient relative to its largest entry (2e-3) and its overall direction
    for name in gt:
        if params[name].numel() == 0:
            continue  # degree 0: no higher SH bands (autograd gives None or an empty gradient)
        a, b = gg[name].flatten(), gt[name].flatten()
        scale = b.abs().max().clamp_min(1e-12)
        assert ((a - b).abs().max() / scale) < 2e-3, name
        assert torch.nn.functional.cosine_similarity(a, b, dim=0) > 0.9999, name
    m_t, m_g = ot.means2d.grad, og.means2d.grad
    assert ((m_t - m_g).abs().max() / m_t.abs().max()) < 2e-3


def test_torch_backward_is_deterministic_with_two_threads():
    """With two threads the CPU backward must give bitwise identical gradients call after call (it did
    not while the chunks gathered with advanced indexing, whose backward accumulates with float32
    atomics: 1e-6 differences, then diverging training runs)."""
    from microdreamer.synthetic import make_synthetic_object

    splat = make_synthetic_object(3000, seed=1)
    az = torch.tensor([0.0, 90.0, 180.0, 270.0])
    cams = orbit_cameras(torch.full_like(az, 15.0), az, 2.0, 49.1, 48, 48)

    def grads() -> dict[str, torch.Tensor]:
        params = {k: v.clone().requires_grad_(True) for k, v in splat.tensors().items()}
        out = render(Splat(**params), cams, background=(1.0, 1.0, 1.0), backend="torch")
        (out.rgb.square().sum() + out.alpha.sum() + out.depth.sum()).backward()
        return {k: v.grad for k, v in params.items() if v.grad is not None}

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        first = grads()
        for _ in range(3):
            again = grads()
            for k in first:
                assert torch.equal(first[k], again[k]), (k, (first[k] - again[k]).abs().max())
    finally:
        torch.set_num_threads(threads)


def test_gather_rows_matches_indexing_forward_and_backward():
    g = torch.Generator().manual_seed(3)
    for rows, shape in ((1, (1,)), (7, (3, 5)), (50, (4, 0)), (200, (16, 33))):
        table = torch.randn(rows, 6, generator=g, requires_grad=True)
        index = torch.randint(0, rows, shape, generator=g)
        weight = torch.randn(*shape, 6, generator=g)
        out = tr.gather_rows(table, index)
        (got,) = torch.autograd.grad((out * weight).sum(), table)
        ref = table.detach().clone().requires_grad_(True)
        (want,) = torch.autograd.grad((ref[index] * weight).sum(), ref)
        assert out.shape == (*shape, 6)
        torch.testing.assert_close(out, table[index], rtol=0, atol=0)
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)  # float32 sums in another order
