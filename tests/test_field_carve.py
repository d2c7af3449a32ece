"""Silhouette carving (microdreamer.field.carve): the projected alpha against a brute-force float64 sum
and against the rasteriser through an orthographic-like camera, the directions and windows, and the
carved field against a dense reference and known answers."""

import math

import pytest
import torch

from microdreamer.field import FieldConfig, PreparedGaussians, density_field, prepare_gaussians
from microdreamer.field.carve import (
    carve_field,
    carving_directions,
    direction_basis,
    footprints,
    plane_window,
    projected_alpha,
    projected_alphas,
)
from microdreamer.splat import Splat
from microdreamer.synthetic import make_random_splat


def _projected_alpha_brute(prepared, basis, lo, size, h, dilation):
    """float64, every Gaussian at every pixel: 1 - prod(1 - a_i), a_i = o_i exp(-q/2) clamped to 0.999,
    terms below 1/255 skipped, q from the marginal covariance E Sigma E^T + dilation h^2 I."""
    e = basis.double()
    iu = torch.arange(size[0], dtype=torch.float64) * h + lo[0]
    iv = torch.arange(size[1], dtype=torch.float64) * h + lo[1]
    uv = torch.stack(torch.meshgrid(iu, iv, indexing="ij"), -1).reshape(-1, 2)
    m = prepared.transforms.double()
    cov = torch.linalg.inv(m.transpose(1, 2) @ m)
    t = torch.ones(uv.shape[0], dtype=torch.float64)
    for i in range(len(prepared)):
        c2 = e @ cov[i] @ e.T + dilation * h * h * torch.eye(2, dtype=torch.float64)
        d = uv - e @ prepared.means.double()[i]
        q = ((d @ torch.linalg.inv(c2)) * d).sum(-1)
        a = (prepared.opacities.double()[i] * torch.exp(-0.5 * q)).clamp(max=0.999)
        t *= 1 - torch.where(a >= 1 / 255, a, torch.zeros_like(a))
    return (1 - t).reshape(size)


def test_carving_directions():
    d = carving_directions(24)
    assert d.shape == (24, 3) and d.dtype == torch.float64
    assert torch.allclose(d.norm(dim=-1), torch.ones(24, dtype=torch.float64), atol=1e-12)
    assert torch.equal(d[:3], torch.eye(3, dtype=torch.float64))  # the grid axes first
    assert bool((d[3:, 1] > 0).all())  # the rest on the hemisphere around +y
    # no two directions see the same silhouette (none equal or opposite)
    cos = (d @ d.T).abs() - torch.eye(24, dtype=torch.float64)
    assert float(cos.max()) < 0.99
    assert torch.equal(carving_directions(3), torch.eye(3, dtype=torch.float64))
    with pytest.raises(ValueError):
        carving_directions(2)


@pytest.mark.parametrize("seed", range(5))
def test_direction_basis_is_orthonormal_and_across_the_direction(seed):
    g = torch.Generator().manual_seed(seed)
    d = torch.nn.functional.normalize(torch.randn(3, generator=g, dtype=torch.float64), dim=0)
    if seed == 4:
        d = torch.tensor([0.95, 0.1, -0.3], dtype=torch.float64)  # near x: the other helper axis
    b = direction_basis(d)
    assert torch.allclose(b @ b.T, torch.eye(2, dtype=torch.float64), atol=1e-12)
    assert float((b @ torch.nn.functional.normalize(d, dim=0)).abs().max()) < 1e-12
    for axis in range(3):  # an axis: the other two in increasing order, as values.amax(axis) lays them out
        keep = [a for a in range(3) if a != axis]
        assert torch.equal(direction_basis(torch.eye(3, dtype=torch.float64)[axis]),
                           torch.eye(3, dtype=torch.float64)[keep])  # fmt: skip


@pytest.mark.parametrize("r", [9, 16, 33])
def test_plane_window_covers_the_projected_cube(r):
    h = 2.0 / (r - 1)
    corners = torch.tensor(
        [[x, y, z] for x in (-1, 1) for y in (-1, 1) for z in (-1, 1)], dtype=torch.float64
    )
    for d in carving_directions(12):
        b = direction_basis(d)
        lo, size = plane_window(b, r)
        uv = corners @ b.T
        for k in range(2):
            assert lo[k] <= float(uv[:, k].min()) + 1e-12
            assert lo[k] + (size[k] - 1) * h >= float(uv[:, k].max()) - 1e-12
            assert lo[k] > float(uv[:, k].min()) - h - 1e-12  # at most one pixel of slack per side
    assert plane_window(torch.eye(3, dtype=torch.float64)[[0, 2]], r) == ((-1.0, -1.0), (r, r))  # the columns


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-6), (torch.float32, 1e-5)])
@pytest.mark.parametrize("n,r,dilation", [(1, 9, 0.3), (3, 12, 0.0), (40, 17, 0.3), (120, 21, 1.0)])
def test_projected_alpha_matches_brute_force(n, r, dilation, dtype, tol):
    s = make_random_splat(n, seed=7 * n + r, spread=0.9, log_scale_mean=-3.0, log_scale_std=1.0)
    if n > 2:
        s.means[0] = torch.tensor([2.0, -0.3, 0.1])  # partly off the grid
    prepared, grid = prepare_gaussians(s, FieldConfig(resolution=r, voxel_filter=0.0))
    h = 2.0 / (r - 1)
    for d in carving_directions(6)[2:]:  # z and three oblique directions
        b = direction_basis(d)
        lo, size = plane_window(b, r)
        out = projected_alpha(prepared, b, lo, size, h, dilation=dilation, max_pairs=53, dtype=dtype)
        ref = _projected_alpha_brute(prepared, b, lo, size, h, dilation)
        assert out.shape == size and out.dtype == torch.float32
        # float64 terms: the float32 output's rounding; float32 terms: each term's rounding (~6e-8 of
        # it) summed over the few dozen Gaussians a pixel sees, in log(1 - a) for a up to 0.999
        assert (out - ref).abs().max() < tol


def test_projected_alpha_is_what_the_rasteriser_shows_orthographically():
    """A camera 1e5 extents away looking along an oblique direction, one pixel per grid spacing,
    through the torch rasteriser (gsplat's rules) shows the same alpha at the same plane points."""
    from microdreamer.cameras import Cameras
    from microdreamer.render.gaussians import render

    s = make_random_splat(60, seed=41, spread=0.6, log_scale_mean=-3.0, log_scale_std=0.7)
    r = 24
    prepared, grid = prepare_gaussians(s, FieldConfig(resolution=r, voxel_filter=0.0))
    h = 2.0 / (r - 1)
    d = carving_directions(8)[5]
    b = direction_basis(d)
    lo, size = plane_window(b, r)
    # camera axes: x = e1, y = e2, z = forward = e1 x e2 (a proper rotation)
    rot = torch.stack([b[0], b[1], torch.linalg.cross(b[0], b[1])])
    dist = 1e5 * 2.0 / grid.scale
    center = torch.tensor(grid.center, dtype=torch.float64)
    view = torch.eye(4, dtype=torch.float64)
    view[:3, :3] = rot
    view[:3, 3] = -rot @ center + torch.tensor([0.0, 0.0, dist], dtype=torch.float64)
    f = dist * grid.scale / h
    # pixel (i, j) of the window is at plane point lo + (i, j) h: image column i, row j
    K = torch.tensor([[f, 0, 0.5 - lo[0] / h], [0, f, 0.5 - lo[1] / h], [0, 0, 1]], dtype=torch.float64)
    cams = Cameras(view[None].float(), K[None].float(), size[0], size[1], near=0.5 * dist, far=2 * dist)
    img = render(s, cams, background=(0.0, 0.0, 0.0), backend="torch", depth=False).alpha[0, ..., 0]
    out = projected_alpha(prepared, b, lo, size, h)
    err = float((out - img.T).abs().max())
    assert err < 2e-4, err  # float32 rasteriser; a pixel off by 0.01 would differ by ~3e-3


def _carve_dense(values, raw, grid, level, directions, alpha_level=0.5):
    """The carved field at every voxel, from float64 brute-force images and float64 bilinear taps."""
    r = grid.resolution
    h = 2.0 / (r - 1)
    ax = grid.axis().double()
    pts = torch.stack(torch.meshgrid(ax, ax, ax, indexing="ij"), -1).reshape(-1, 3)
    hull = torch.ones(pts.shape[0], dtype=torch.float64)
    for d in carving_directions(directions):
        b = direction_basis(d)
        lo, size = plane_window(b, r)
        img = torch.nn.functional.pad(_projected_alpha_brute(raw, b, lo, size, h, 0.3), (1, 1, 1, 1))
        p = (pts @ b.T - torch.tensor(lo, dtype=torch.float64)) / h + 1.0
        i0 = p.floor().long()
        f = p - i0
        u0, v0 = i0[:, 0], i0[:, 1]
        top = img[u0, v0] * (1 - f[:, 1]) + img[u0, v0 + 1] * f[:, 1]
        bot = img[u0 + 1, v0] * (1 - f[:, 1]) + img[u0 + 1, v0 + 1] * f[:, 1]
        hull = torch.minimum(hull, top * (1 - f[:, 0]) + bot * f[:, 0])
    return torch.minimum(values.double().reshape(-1), level / alpha_level * hull).reshape(values.shape)


@pytest.mark.parametrize("n,r,directions", [(25, 14, 3), (80, 17, 7)])
def test_carve_field_matches_the_dense_reference(n, r, directions):
    s = make_random_splat(n, seed=100 + n, spread=0.7, log_scale_mean=-2.3, log_scale_std=0.5)
    cfg = FieldConfig(resolution=r)
    fld = density_field(s, cfg)
    raw, _ = prepare_gaussians(s, FieldConfig(resolution=r, voxel_filter=0.0))
    level = float(fld.values.quantile(0.6))  # low: the density surface bulges past the silhouettes
    got = carve_field(fld.values, raw, fld.grid, level, directions)
    ref = _carve_dense(fld.values, raw, fld.grid, level, directions)
    inside = fld.values > level
    near = torch.nn.functional.max_pool3d(inside[None, None].float(), 3, 1, 1)[0, 0] > 0
    assert got.skipped is None and got.evaluated == int(near.sum())
    # where evaluated: the reference (float32 images and taps); elsewhere: untouched, below the level
    assert float((got.values[near].double() - ref[near]).abs().max()) < 1e-5 * max(1.0, level)
    assert torch.equal(got.values[~near], fld.values[~near])
    assert not bool((ref[~near] > level).any())
    # the same voxels inside the surface as the dense reference
    assert torch.equal(got.values > level, ref > level)
    assert got.inside_before == int(inside.sum()) and got.inside_after == int((ref > level).sum())
    assert got.inside_after < got.inside_before  # random Gaussians: the hull cuts something


def test_carving_a_gaussian_keeps_the_ball_inside_its_alpha_contour():
    """One isotropic Gaussian (sigma s, opacity o) seen along any direction has alpha
    o exp(-rho^2 / (2 (s^2 + 0.3 h^2))) at distance rho from its centre, which is 0.5 at r_a; at a low
    level its density ball is wider than that, so the carved surface is the sphere of radius r_a, up to
    the directions' sampling and a voxel."""
    s = make_random_splat(1, seed=60)
    s.log_scales[0] = math.log(0.3)
    s.quats[0] = torch.tensor([1.0, 0.0, 0.0, 0.0])
    s.opacity_logits[0] = 3.0
    r = 41
    cfg = FieldConfig(resolution=r)
    fld = density_field(s, cfg)
    raw, _ = prepare_gaussians(s, FieldConfig(resolution=r, voxel_filter=0.0))
    level = 0.02
    got = carve_field(fld.values, raw, fld.grid, level, 24)
    o, h = float(s.opacities()[0]), 2.0 / (r - 1)
    sigma = 0.3 * fld.grid.scale
    r_a = math.sqrt(2 * (sigma**2 + 0.3 * h * h) * math.log(2 * o))
    ax = fld.grid.axis().double()
    rr = (ax[:, None, None] ** 2 + ax[None, :, None] ** 2 + ax[None, None, :] ** 2).sqrt()
    assert bool((fld.values[rr > r_a + 2 * h] > level).any())  # the density alone reaches further out
    kept = got.values > level
    assert not bool(kept[rr > r_a + h].any())
    assert bool(kept[rr < r_a - 2 * h].all())


def test_carving_removes_a_faint_blob_and_keeps_an_opaque_one():
    """Two Gaussians: an opaque one, and a faint one (opacity 0.4: its alpha never reaches 0.5 from any
    direction) whose density is above the level all the same. Carving drops the faint one only."""
    means = torch.tensor([[-0.5, 0.0, 0.0], [0.5, 0.0, 0.0]])
    scales = torch.full((2, 3), 0.12)
    quats = torch.tensor([[1.0, 0.0, 0.0, 0.0]] * 2)
    s = Splat.from_activated(means, scales, quats, torch.tensor([0.95, 0.4]), torch.rand(2, 3))
    cfg = FieldConfig(resolution=33)
    fld = density_field(s, cfg)
    raw, _ = prepare_gaussians(s, FieldConfig(resolution=33, voxel_filter=0.0))
    level = 0.2
    got = carve_field(fld.values, raw, fld.grid, level, 12)
    half = fld.values.shape[0] // 2
    assert bool((fld.values[half + 1 :] > level).any())  # the faint blob is in the density's surface
    assert not bool((got.values[half + 1 :] > level).any())  # and carved away
    assert bool((got.values[:half] > level).any())


def test_carving_empty_silhouettes_is_skipped():
    """A splat whose alpha never reaches 0.5 anywhere (one faint Gaussian) keeps its field, and says so."""
    s = Splat.from_activated(torch.zeros(1, 3), torch.full((1, 3), 0.2), torch.tensor([[1.0, 0, 0, 0]]),
                             torch.tensor([0.4]), torch.rand(1, 3))  # fmt: skip
    fld = density_field(s, FieldConfig(resolution=17))
    raw, _ = prepare_gaussians(s, FieldConfig(resolution=17, voxel_filter=0.0))
    got = carve_field(fld.values, raw, fld.grid, 0.1, 6)
    assert got.skipped is not None and torch.equal(got.values, fld.values)
    none = carve_field(fld.values, raw, fld.grid, 1.0, 6)  # nothing above the level at all
    assert none.skipped is not None and none.inside_before == 0


def test_carve_field_reuses_the_iso_stages_axis_images():
    """The iso-level stage's column alphas are the carving's axis images: passing them changes nothing."""
    from microdreamer.field.iso import auto_iso_level

    s = make_random_splat(60, seed=70, spread=0.7, log_scale_mean=-2.3, log_scale_std=0.5)
    cfg = FieldConfig(resolution=15)
    fld = density_field(s, cfg)
    iso = auto_iso_level(s, fld.values, fld.grid, cfg)
    raw, _ = prepare_gaussians(s, FieldConfig(resolution=15, voxel_filter=0.0))
    a = carve_field(fld.values, raw, fld.grid, iso.level * 0.5, 6)
    b = carve_field(fld.values, raw, fld.grid, iso.level * 0.5, 6, axis_images=iso.column_alphas)
    assert len(iso.column_alphas) == 3
    assert float((a.values - b.values).abs().max()) < 1e-5 * iso.level  # float32 vs float64 axis terms
    assert torch.equal(a.values > iso.level * 0.5, b.values > iso.level * 0.5)


@pytest.mark.cuda
def test_carve_field_on_cuda_matches_the_cpu():
    s = make_random_splat(300, seed=80, spread=0.7, log_scale_mean=-2.6, log_scale_std=0.6)
    cfg = FieldConfig(resolution=40)
    fld = density_field(s, cfg)
    raw, _ = prepare_gaussians(s, FieldConfig(resolution=40, voxel_filter=0.0))
    level = float(fld.values.quantile(0.6))
    cpu = carve_field(fld.values, raw, fld.grid, level, 24)
    gpu = carve_field(fld.values.cuda(), raw.to("cuda"), fld.grid, level, 24)
    assert gpu.values.is_cuda and gpu.inside_after == cpu.inside_after
    # float32 terms summed in another order (atomics): the images agree to ~1e-6
    assert float((gpu.values.cpu() - cpu.values).abs().max()) < 1e-4 * level


def _direction_set(r, count):
    bases = [direction_basis(d) for d in carving_directions(count)]
    return bases, [plane_window(b, r) for b in bases]


def test_projected_alphas_torch_is_projected_alpha_per_direction():
    s = make_random_splat(30, seed=90, spread=0.8, log_scale_mean=-2.8)
    prepared, _ = prepare_gaussians(s, FieldConfig(resolution=13, voxel_filter=0.0))
    bases, windows = _direction_set(13, 6)
    got = projected_alphas(prepared, bases, windows, 2.0 / 12, backend="torch")
    for image, b, (lo, size) in zip(got, bases, windows, strict=True):
        assert torch.equal(image, projected_alpha(prepared, b, lo, size, 2.0 / 12, dtype=torch.float32))
    with pytest.raises(ValueError):
        projected_alphas(prepared, bases, windows, 2.0 / 12, backend="cuda")  # CPU tensors


def _splat_for_images(n, r, seed):
    """n random Gaussians on an r^3 grid (small and large ones), one partly off the grid and a needle
    wider than the grid among them when n > 2; n = 0: no Gaussian."""
    if n == 0:
        z = torch.zeros(0)
        return PreparedGaussians(z.reshape(0, 3), z, z.reshape(0, 3, 3), z.reshape(0, 3))
    s = make_random_splat(n, seed=seed, spread=0.9, log_scale_mean=-2.6, log_scale_std=1.0)
    if n > 2:
        s.means[0] = torch.tensor([2.5, 0.1, -0.2])
        s.log_scales[1] = torch.tensor([0.5, -6.0, -6.0])
    return prepare_gaussians(s, FieldConfig(resolution=r, voxel_filter=0.0))[0]


def _kernel_terms_alpha(prepared, bases, windows, h):
    """Per direction, 1 - exp(sum of log1p(-a)) with every term in float32 as carve.cu computes it
    (du = iu + offset_u, q = ((a du) du + ((2 b) du) dv) + (c dv) dv, a = min(0.999, o exp(-0.5 q)), kept
    when a >= 1/255), one (direction, Gaussian) box at a time, summed in float64."""
    fp = footprints(prepared, bases, windows, h, dtype=torch.float32)
    out = []
    for k, (_, size) in enumerate(windows):
        log_t = torch.zeros(size, dtype=torch.float64)
        for i in range(len(prepared)):
            (fu, fv), (eu, ev) = fp.first[k, i].tolist(), fp.extent[k, i].tolist()
            if eu * ev == 0:
                continue
            pa, pb, pc = fp.precision[k, i]
            du = torch.arange(eu, dtype=torch.float32)[:, None] + fp.offset[k, i, 0]
            dv = torch.arange(ev, dtype=torch.float32)[None, :] + fp.offset[k, i, 1]
            q = ((pa * du) * du + ((2.0 * pb) * du) * dv) + (pc * dv) * dv
            a = (fp.opacity[i] * torch.exp(-0.5 * q)).clamp(max=0.999)
            a = torch.where(a >= torch.tensor(1 / 255, dtype=torch.float32), a, 0.0)
            log_t[fu : fu + eu, fv : fv + ev] += torch.log1p(-a).double()
        out.append(-torch.expm1(log_t))
    return out


@pytest.mark.parametrize("n,r,count", [(0, 9, 4), (1, 9, 4), (2, 12, 5), (57, 20, 9), (161, 33, 6)])
def test_projected_alphas_torch_terms_are_the_kernels(n, r, count):
    """The grouped, padded evaluation of the PyTorch path gives the images of the kernel's float32 terms
    taken one box at a time; its sums are float32 in another order: the images agree to float32 rounding."""
    prepared = _splat_for_images(n, r, seed=300 + n)
    bases, windows = _direction_set(r, count)
    h = 2.0 / (r - 1)
    ref = _kernel_terms_alpha(prepared, bases, windows, h)
    for max_pairs in (1, 53, 1 << 18):  # one box at a time, chunks across boxes, all at once
        got = projected_alphas(prepared, bases, windows, h, backend="torch", max_pairs=max_pairs)
        for a, b, (_, size) in zip(got, ref, windows, strict=True):
            assert a.shape == size and a.dtype == torch.float32
            # float32 sums of up to a few hundred terms of at most |log(0.001)| = 6.9
            assert float((a.double() - b).abs().max()) < 2e-6


def test_projected_alphas_torch_does_not_depend_on_the_chunking():
    """Chunks split the groups of boxes without reordering their terms: bit for bit the same images."""
    prepared = _splat_for_images(90, 30, seed=310)
    bases, windows = _direction_set(30, 6)
    h = 2.0 / 29
    ref = projected_alphas(prepared, bases, windows, h, backend="torch")
    for max_pairs in (1, 97, 4096):
        got = projected_alphas(prepared, bases, windows, h, backend="torch", max_pairs=max_pairs)
        assert all(torch.equal(a, b) for a, b in zip(got, ref, strict=True))


@pytest.mark.parametrize("seed", range(3))
def test_footprints_boxes_hold_every_pixel_a_gaussian_reaches(seed):
    """Every pixel where a Gaussian's float64 alpha (the brute force's) is at least 1/255 lies in its box."""
    r = 17
    prepared = _splat_for_images(40, r, seed=320 + seed)
    bases, windows = _direction_set(r, 7)
    h = 2.0 / (r - 1)
    fp = footprints(prepared, bases, windows, h)
    n = len(prepared)
    assert fp.precision.shape == (7, n, 3) and fp.offset.shape == (7, n, 2) and fp.opacity.shape == (n,)
    assert fp.first.shape == fp.extent.shape == (7, n, 2) and fp.first.dtype == fp.extent.dtype == torch.int64
    m = prepared.transforms.double()
    cov = torch.linalg.inv(m.transpose(1, 2) @ m)
    for k, (b, (lo, size)) in enumerate(zip(bases, windows, strict=True)):
        iu = torch.arange(size[0], dtype=torch.float64) * h + lo[0]
        iv = torch.arange(size[1], dtype=torch.float64) * h + lo[1]
        uv = torch.stack(torch.meshgrid(iu, iv, indexing="ij"), -1)
        for i in range(n):
            c2 = b @ cov[i] @ b.T + 0.3 * h * h * torch.eye(2, dtype=torch.float64)
            d = uv - b @ prepared.means.double()[i]
            q = ((d @ torch.linalg.inv(c2)) * d).sum(-1)
            reached = prepared.opacities.double()[i] * torch.exp(-0.5 * q) >= 1 / 255 * (1 + 1e-9)
            box = torch.zeros(size, dtype=torch.bool)
            (fu, fv), (eu, ev) = fp.first[k, i].tolist(), fp.extent[k, i].tolist()
            box[fu : fu + eu, fv : fv + ev] = True
            assert not bool((reached & ~box).any())


def _bilinear64(image, pix):
    """float64 ``image`` [U, V] at pixel positions ``pix`` [M, 2], linear between pixel centres, 0 outside."""
    img = torch.nn.functional.pad(image.double(), (1, 1, 1, 1))
    p = pix + 1.0
    i0 = p.floor().long()
    f = p - i0
    u0, v0 = i0[:, 0], i0[:, 1]
    top = img[u0, v0] * (1 - f[:, 1]) + img[u0, v0 + 1] * f[:, 1]
    bottom = img[u0 + 1, v0] * (1 - f[:, 1]) + img[u0 + 1, v0 + 1] * f[:, 1]
    return top * (1 - f[:, 0]) + bottom * f[:, 0]


@pytest.mark.parametrize("r,count,chunk", [(9, 3, 1), (14, 7, 5), (33, 24, 1 << 15)])
def test_hull_is_the_least_bilinear_tap(r, count, chunk):
    """The hull at points of the cube (its corners included) is the least of the images' float64 bilinear
    taps at the points' pixel positions, rounded to float32; images of different sizes share a canvas."""
    from microdreamer.field.carve import _hull

    g = torch.Generator().manual_seed(r)
    bases, windows = _direction_set(r, count)
    images = [torch.rand(size, generator=g) for _, size in windows]
    corners = torch.tensor(
        [[x, y, z] for x in (-1, 1) for y in (-1, 1) for z in (-1, 1)], dtype=torch.float64
    )
    points = torch.cat([corners, torch.rand(200, 3, generator=g, dtype=torch.float64) * 2 - 1])
    h = 2.0 / (r - 1)
    got = _hull(points, bases, windows, images, h, chunk=chunk)
    ref = torch.stack([_bilinear64(img, (points @ b.T - torch.tensor(lo, dtype=torch.float64)) / h)
                       for b, (lo, _), img in zip(bases, windows, images, strict=True)]).amin(0)  # fmt: skip
    assert got.dtype == torch.float32 and got.shape == (points.shape[0],)
    assert float((got.double() - ref).abs().max()) < 1e-7  # float32 rounding of values in [0, 1]


@pytest.mark.parametrize("seed", range(4))
def test_near_is_the_3x3x3_dilation(seed):
    from microdreamer.field.carve import _near

    g = torch.Generator().manual_seed(seed)
    r = 12
    inside = torch.rand(r, r, r, generator=g) > 0.97
    if seed == 1:
        inside = torch.zeros(r, r, r, dtype=torch.bool)
        inside[0, 5, r - 1] = True  # one voxel on the grid's faces
    if seed == 2:
        inside = torch.zeros(r, r, r, dtype=torch.bool)
        inside[3:5, 4, 6] = True
    box, near = _near(inside)
    ref = torch.nn.functional.max_pool3d(inside[None, None].float(), 3, stride=1, padding=1)[0, 0] > 0
    full = torch.zeros_like(inside)
    full[box] = near
    assert torch.equal(full, ref)


@pytest.mark.cuda
@pytest.mark.parametrize("n,r,count", [(1, 9, 4), (57, 20, 9), (2000, 48, 24)])
def test_projected_alphas_cuda_kernel_matches_torch(n, r, count):
    """The kernel's float32 terms are the torch path's; its sums are fixed point (2^-32 per term) where
    torch adds float32 in another order: the images agree to float32 rounding."""
    s = make_random_splat(n, seed=91 + n, spread=0.9, log_scale_mean=-3.0, log_scale_std=1.0)
    if n > 2:
        s.means[0] = torch.tensor([2.5, 0.1, -0.2])  # partly off the grid
        s.log_scales[1] = torch.tensor([0.5, -6.0, -6.0])  # a needle wider than the grid
    prepared, _ = prepare_gaussians(s, FieldConfig(resolution=r, voxel_filter=0.0))
    bases, windows = _direction_set(r, count)
    h = 2.0 / (r - 1)
    ref = projected_alphas(prepared, bases, windows, h, backend="torch")
    got = projected_alphas(prepared.to("cuda"), bases, windows, h, backend="cuda")
    for a, b, (_, size) in zip(got, ref, windows, strict=True):
        assert a.is_cuda and a.shape == size and a.dtype == torch.float32
        assert float((a.cpu() - b).abs().max()) < 2e-6
    again = projected_alphas(prepared.to("cuda"), bases, windows, h, backend="cuda")
    assert all(torch.equal(a, b) for a, b in zip(got, again, strict=True))  # fixed point: deterministic
