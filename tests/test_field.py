"""The vectorised density field against the float64 brute-force reference, and the reference against
upstream's own algorithm (DreamGaussian's extract_fields, re-implemented here from its description)."""

import math

import pytest
import torch

from conftest import FIELD_REL_TOL, assert_field_matches, rel_err
from microdreamer.field import FieldConfig, GridSpec, PreparedGaussians, density_field, prepare_gaussians
from microdreamer.field.cpp_impl import density_field_cpp
from microdreamer.field.reference import (
    covariance6,
    density_field_reference,
    density_field_splat_reference,
    gaussian_3d_coeff,
)
from microdreamer.field.torch_impl import density_field_torch
from microdreamer.kernels import cpu as cpu_kernels
from microdreamer.splat import Splat
from microdreamer.synthetic import make_random_splat, make_synthetic_object


def _check(splat, cfg, **kw):
    prepared, grid = prepare_gaussians(splat, cfg)
    ref = density_field_reference(prepared, grid, cfg)
    out = density_field_torch(prepared, grid, cfg, **kw)
    assert out.shape == (cfg.resolution,) * 3 and out.dtype == torch.float32
    return assert_field_matches(out, ref)


@pytest.mark.parametrize("mode", ["exact", "upstream"])
@pytest.mark.parametrize("n,r", [(1, 16), (2, 17), (31, 33), (64, 24), (150, 30), (400, 20)])
def test_torch_matches_reference(mode, n, r):
    # r = 17, 33: not multiples of num_blocks (upstream's last block is smaller)
    splat = make_random_splat(n, seed=1000 * n + r, spread=0.8)
    _check(splat, FieldConfig(resolution=r, mode=mode))


@pytest.mark.parametrize("mode", ["exact", "upstream"])
def test_object_like_splat(mode):
    _check(make_synthetic_object(800, seed=5, scale_fraction=0.02), FieldConfig(resolution=28, mode=mode))


@pytest.mark.parametrize("mode", ["exact", "upstream"])
def test_empty_after_opacity_filter(mode):
    s = make_random_splat(5, seed=2)
    s.opacity_logits[:] = -20.0  # opacity ~2e-9 < 0.005: all dropped
    fld = density_field(s, FieldConfig(resolution=12, mode=mode))
    assert fld.num_gaussians == 0
    assert torch.equal(fld.values, torch.zeros(12, 12, 12))


@pytest.mark.parametrize("voxel_filter", [None, 0.0, 0.5])
@pytest.mark.parametrize("mode", ["exact", "upstream"])
def test_single_gaussian_is_centred_and_peaks_at_its_opacity(mode, voxel_filter):
    s = make_random_splat(1, seed=3)
    cfg = FieldConfig(
        resolution=21, mode=mode, voxel_filter=voxel_filter
    )  # odd R: the centre is a grid point
    prepared, grid = prepare_gaussians(s, cfg)
    assert torch.allclose(prepared.means, torch.zeros(1, 3))
    # no extent: the cube spans +-3 standard deviations of the largest axis
    assert math.isclose(grid.scale, cfg.extent_factor / (6 * float(s.scales().max())), rel_tol=1e-6)
    out = density_field_torch(prepared, grid, cfg)
    # the peak is the opacity, times prod_k s_k / sqrt(s_k^2 + v h^2) under the voxel filter
    sn = s.scales()[0].double() * grid.scale
    peak = float(s.opacities()[0]) * float((sn / (sn**2 + cfg.filter_variance_normalised).sqrt()).prod())
    assert math.isclose(float(out[10, 10, 10]), peak, rel_tol=1e-6)
    _check(s, cfg)


@pytest.mark.parametrize("mode", ["exact", "upstream"])
def test_gaussian_larger_than_the_grid(mode):
    s = make_random_splat(20, seed=4, spread=0.5, log_scale_mean=-2.0)
    s.log_scales[0] = math.log(5.0)  # sigma 5 world units, the cube is ~1
    _check(s, FieldConfig(resolution=19, mode=mode))


@pytest.mark.parametrize("mode", ["exact", "upstream"])
def test_nearly_degenerate_covariance(mode):
    s = make_random_splat(30, seed=6, spread=0.6)
    s.log_scales[0] = torch.log(torch.tensor([0.3, 0.25, 1e-5]))  # a flat disc, 3e4 : 1
    s.log_scales[1] = torch.log(torch.tensor([1e-5, 0.2, 1e-5]))  # a needle
    s.opacity_logits[:2] = 5.0
    err = _check(s, FieldConfig(resolution=31, mode=mode))
    assert err < FIELD_REL_TOL


@pytest.mark.parametrize("mode", ["exact", "upstream"])
def test_chunking_does_not_change_the_result(mode):
    s = make_random_splat(200, seed=7, spread=0.9)
    cfg = FieldConfig(resolution=26, mode=mode)
    prepared, grid = prepare_gaussians(s, cfg)
    whole = density_field_torch(prepared, grid, cfg)
    chunked = density_field_torch(prepared, grid, cfg, max_pairs=9973, block_bytes=4096)
    assert rel_err(chunked, whole) < 1e-6  # only the float32 summation order differs


def test_exact_cutoff_bound():
    """Exact mode drops at most cutoff_tol * opacity per Gaussian: compare with no cutoff at all."""
    s = make_random_splat(40, seed=8, spread=0.7)
    cfg = FieldConfig(resolution=24, mode="exact")
    prepared, grid = prepare_gaussians(s, cfg)
    full = density_field_reference(
        prepared, grid, FieldConfig(resolution=24, mode="exact", cutoff_tol=1e-300)
    )
    cut = density_field_reference(prepared, grid, cfg)
    assert (full - cut).min() >= 0
    assert (full - cut).max() <= cfg.cutoff_tol * float(prepared.opacities.sum())


def test_grid_maps_back_to_world():
    s = make_random_splat(50, seed=9, spread=2.0)
    s.means += torch.tensor([10.0, -3.0, 0.5])
    cfg = FieldConfig(resolution=11)
    prepared, grid = prepare_gaussians(s, cfg)
    axis = grid.axis().double()
    world = [grid.origin[a] + grid.spacing * torch.arange(11, dtype=torch.float64) for a in range(3)]
    for a in range(3):
        assert torch.allclose((world[a] - grid.center[a]) * grid.scale, axis, atol=1e-6)
    kept = s.means[s.opacities() > cfg.min_opacity].double()
    assert torch.allclose(prepared.means.double(), (kept - torch.tensor(grid.center)) * grid.scale, atol=1e-5)
    assert math.isclose(float(prepared.means.abs().amax()), 0.9, rel_tol=1e-5)  # 1.8 / extent, centred


@pytest.mark.parametrize("voxel_filter", [0.0, None, 1.0])
def test_whitening_transform_matches_covariance(voxel_filter):
    s = make_random_splat(20, seed=10)
    cfg = FieldConfig(voxel_filter=voxel_filter)
    prepared, grid = prepare_gaussians(s, cfg)
    kept = s.subset(s.opacities() > 0.005)
    cov = kept.covariances().double() * grid.scale**2
    wide = cov + cfg.filter_variance_normalised * torch.eye(3, dtype=torch.float64)  # Sigma + v h^2 I
    m = prepared.transforms.double()
    eye = torch.eye(3, dtype=torch.float64).expand(len(kept), 3, 3)
    assert torch.allclose(m.transpose(1, 2) @ m @ wide, eye, atol=1e-4)
    # the mass is kept: o' sqrt(det Sigma') = o sqrt(det Sigma)
    mass = prepared.opacities.double() / torch.linalg.det(m).abs()
    expected = kept.opacities().double() * torch.linalg.det(cov).sqrt()
    assert torch.allclose(mass, expected, rtol=1e-5)


def test_gaussian_3d_coeff_agrees_with_whitened_form():
    g = torch.Generator().manual_seed(11)
    s = make_random_splat(64, seed=11)
    prepared, _ = prepare_gaussians(s, FieldConfig())
    m = prepared.transforms.double()
    d = torch.randn(len(m), 3, generator=g, dtype=torch.float64) * 0.05
    covs = covariance6(m)
    upstream = gaussian_3d_coeff(d, covs)
    ours = torch.exp(-0.5 * ((m @ d[:, :, None])[:, :, 0] ** 2).sum(-1))
    assert torch.allclose(upstream, ours, rtol=1e-9, atol=1e-300)
    # a positive exponent (a broken inverse) counts as 0
    assert gaussian_3d_coeff(torch.ones(1, 3), -torch.tensor([[1.0, 0, 0, 1.0, 0, 1.0]]))[0] == 0


# ---------------------------------------------------------------- upstream's own algorithm
def _upstream_extract_fields(prepared, resolution, num_blocks=16, relax_ratio=1.5):
    """DreamGaussian's extract_fields as its description reads: split the grid points into blocks of
    R // num_blocks, and for each block evaluate every Gaussian whose centre is strictly inside the
    block's points' bounding box grown by relax_ratio * block_size, via gaussian_3d_coeff on covs.
    Written independently of our reference (float64 here)."""
    block_size = 2 / num_blocks
    split = resolution // num_blocks
    xyzs = prepared.means.double()
    covs = covariance6(prepared.transforms.double())
    opas = prepared.opacities.double()
    occ = torch.zeros([resolution] * 3, dtype=torch.float64)
    lin = GridSpec(resolution, (0, 0, 0), 1).axis().double()
    chunks = lin.split(split)
    for xi, xs in enumerate(chunks):
        for yi, ys in enumerate(chunks):
            for zi, zs in enumerate(chunks):
                xx, yy, zz = torch.meshgrid(xs, ys, zs, indexing="ij")
                pts = torch.stack([xx.reshape(-1), yy.reshape(-1), zz.reshape(-1)], -1)
                vmin, vmax = pts.amin(0) - block_size * relax_ratio, pts.amax(0) + block_size * relax_ratio
                mask = (xyzs < vmax).all(-1) & (xyzs > vmin).all(-1)
                if not mask.any():
                    continue
                g_pts = pts[:, None, :] - xyzs[mask][None]  # [M, L, 3]
                w = gaussian_3d_coeff(g_pts.reshape(-1, 3), covs[mask].repeat(len(pts), 1)).reshape(
                    len(pts), -1
                )
                val = (w * opas[mask][None]).sum(-1)
                occ[xi * split : xi * split + len(xs), yi * split : yi * split + len(ys),
                    zi * split : zi * split + len(zs)] = val.reshape(len(xs), len(ys), len(zs))  # fmt: skip
    return occ


@pytest.mark.parametrize("n,r", [(60, 32), (25, 20), (150, 40)])
def test_upstream_reference_equals_upstream_algorithm(n, r):
    s = make_random_splat(n, seed=n + r, spread=0.9, log_scale_mean=-2.2)
    cfg = FieldConfig(resolution=r, mode="upstream")
    prepared, grid = prepare_gaussians(s, cfg)
    ours = density_field_reference(prepared, grid, cfg)
    theirs = _upstream_extract_fields(prepared, r)
    assert rel_err(ours, theirs) < 1e-9


def test_config_validation():
    with pytest.raises(ValueError, match="mode"):
        FieldConfig(mode="fast")
    with pytest.raises(ValueError, match="resolution"):
        FieldConfig(resolution=1)


def test_backend_cuda_needs_cuda_tensors():
    with pytest.raises(ValueError, match="CUDA"):
        density_field(make_random_splat(3), FieldConfig(resolution=8), backend="cuda")


def test_splat_input_is_not_modified():
    s = make_random_splat(10, seed=12)
    before = {k: v.clone() for k, v in s.tensors().items()}
    density_field(s, FieldConfig(resolution=10))
    assert all(torch.equal(before[k], v) for k, v in s.tensors().items())


def test_extreme_scales_stay_finite():
    s = make_random_splat(10, seed=13)
    s.log_scales[0] = -60.0  # sigma 1e-26: 1/sigma^2 overflows float32
    s.log_scales[1] = 30.0
    fld = density_field(s, FieldConfig(resolution=12))
    assert torch.isfinite(fld.values).all()


def test_splat_type():
    assert isinstance(make_random_splat(2), Splat)


@pytest.mark.parametrize(
    "seed, n, dims, max_extent, ones_axis, start, stop",
    [(14, 9, (5, 7, 3), 3, None, 2, 8), (3, 1, (4, 4, 4), 4, None, 0, None), (5, 40, (9, 6, 1), 4, 2, 0, None),
     (6, 25, (8, 8, 8), 5, 0, 3, 25), (7, 30, (6, 5, 7), 1, None, 0, 30), (8, 12, (3, 3, 3), 3, None, 4, 4)],
)  # fmt: skip
def test_box_cells_against_loops(seed, n, dims, max_extent, ones_axis, start, stop):
    """Every cell of every box, in order (item, then x, y, z), against nested loops: empty boxes, an
    axis of extent 1 everywhere (the iso-level's columns), empty ranges of items."""
    from microdreamer.field.binning import box_cells

    g = torch.Generator().manual_seed(seed)
    first = torch.stack([torch.randint(0, d, (n,), generator=g) for d in dims], -1)
    extent = torch.randint(0, max_extent, (n, 3), generator=g)
    if ones_axis is not None:
        extent[:, ones_axis] = 1
    owner, cell = box_cells(first, extent, dims, start, stop)
    expected = [
        (i, (x * dims[1] + y) * dims[2] + z)
        for i in range(start, n if stop is None else stop)
        for x in range(first[i, 0], first[i, 0] + extent[i, 0])
        for y in range(first[i, 1], first[i, 1] + extent[i, 1])
        for z in range(first[i, 2], first[i, 2] + extent[i, 2])
    ]
    assert list(zip(owner.tolist(), cell.tolist(), strict=True)) == expected
    assert owner.dtype == cell.dtype == torch.int64


def test_chunk_bounds_stay_within_budget():
    from microdreamer.field.binning import chunk_bounds

    counts = torch.tensor([3, 0, 7, 2, 2, 9, 1])
    bounds = chunk_bounds(counts, 5)
    assert bounds[0] == 0 and bounds[-1] == len(counts) and bounds == sorted(set(bounds))
    for b0, b1 in zip(bounds[:-1], bounds[1:], strict=True):  # within budget unless one element alone
        assert int(counts[b0:b1].sum()) <= 5 + int(counts[b0:b1].max()) or b1 - b0 == 1
    assert chunk_bounds(torch.zeros(0, dtype=torch.long), 5) == [0]


# ---------------------------------------------------------------- the voxel filter
@pytest.mark.parametrize("voxel_filter", [None, 0.0, 1.0 / 12.0, 0.25, 2.0])
@pytest.mark.parametrize("mode", ["exact", "upstream"])
@pytest.mark.parametrize("n,r", [(1, 9), (2, 16), (37, 19), (120, 24)])
def test_field_matches_splat_reference(mode, voxel_filter, n, r):
    """The tiled path (prepared Gaussians) against the field defined from the splat's own covariances."""
    s = make_random_splat(n, seed=17 * n + r, spread=0.8, log_scale_mean=-3.5, log_scale_std=1.0)
    cfg = FieldConfig(resolution=r, mode=mode, voxel_filter=voxel_filter)
    out = density_field(s, cfg).values
    assert_field_matches(out, density_field_splat_reference(s, cfg))


def test_mode_defaults_of_the_voxel_filter():
    assert FieldConfig(mode="exact").filter_variance == 0.25  # sigma = h / 2
    assert FieldConfig(mode="upstream").filter_variance == 0.0  # DreamGaussian samples points
    assert FieldConfig(mode="upstream", voxel_filter=0.5).filter_variance == 0.5
    cfg = FieldConfig(resolution=33, voxel_filter=2.0)
    assert cfg.filter_variance_normalised == pytest.approx(2.0 * (2.0 / 32) ** 2)
    with pytest.raises(ValueError, match="voxel_filter"):
        FieldConfig(voxel_filter=-0.1)


def test_upstream_mode_is_unchanged_by_the_filter_option():
    """upstream's default (None) samples points: identical prepared Gaussians to voxel_filter = 0."""
    s = make_random_splat(50, seed=21)
    a, _ = prepare_gaussians(s, FieldConfig(mode="upstream"))
    b, _ = prepare_gaussians(s, FieldConfig(mode="upstream", voxel_filter=0.0))
    for name in ("means", "opacities", "transforms", "radii"):
        assert torch.equal(getattr(a, name), getattr(b, name))


@pytest.mark.parametrize("voxel_filter", [1.0 / 12.0, 0.25, 1.0])
def test_voxel_filter_keeps_each_gaussians_mass(voxel_filter):
    """The widened field integrates to the same mass as the splat: o (2 pi)^(3/2) prod s_k per Gaussian.

    Gaussians prepared for a coarse grid (R = 16, where the filter is wide) are integrated on a finer
    grid (R = 72) by the float64 reference with no cutoff: a Riemann sum of Gaussians of sigma >= 1.3
    fine steps, 6 sigma from the cube's faces, whose error is far below 1e-6 relative, and far below what
    a wrong opacity factor would give (the filter lowers these peaks by up to 40x)."""
    s = make_random_splat(6, seed=22)
    s.means[:] = torch.tensor([[-0.5, -0.5, -0.5], [0.5, 0.5, 0.5],  # the cube spans [-0.5, 0.5]
                               [0.05, -0.1, 0.0], [-0.1, 0.1, 0.08], [0.0, 0.0, -0.1], [0.1, 0.03, 0.1]])  # fmt: skip
    s.log_scales[2:] = torch.log(torch.tensor([
        [0.001, 0.01, 0.02], [0.003, 0.003, 0.003], [0.02, 0.002, 0.0005], [0.01, 0.012, 0.009],
    ]))  # fmt: skip
    cfg = FieldConfig(resolution=16, voxel_filter=voxel_filter, cutoff_tol=1e-300)
    prepared, grid = prepare_gaussians(s, cfg)
    sn = s.scales().double() * grid.scale
    assert float((sn / (sn**2 + cfg.filter_variance_normalised).sqrt()).prod(-1).min()) < 0.025
    fine = GridSpec(72, grid.center, grid.scale)
    h = 2.0 / 71
    for i in range(2, 6):
        one = PreparedGaussians(*(t[i : i + 1] for t in (prepared.means, prepared.opacities,
                                                          prepared.transforms, prepared.radii)))  # fmt: skip
        integral = float(density_field_reference(one, fine, cfg).sum()) * h**3
        mass = float(s.opacities()[i]) * (2 * math.pi) ** 1.5 * float(sn[i].prod())
        assert integral == pytest.approx(mass, rel=1e-6)


# ---------------------------------------------------------------- the iso-level chosen from the splat
def _column_alpha_brute(prepared, grid, axis, dilation):
    """Every Gaussian at every column, float64: 1 - prod (1 - min(0.999, o exp(-q/2))), terms < 1/255
    dropped; q from the 2D marginal covariance plus dilation h^2 I (written from the definition)."""
    r = grid.resolution
    h = 2.0 / (r - 1)
    keep = [a for a in range(3) if a != axis]
    ax = grid.axis().double()
    uv = torch.stack(torch.meshgrid(ax, ax, indexing="ij"), -1).reshape(-1, 2)
    cov = torch.linalg.inv(prepared.transforms.double().transpose(1, 2) @ prepared.transforms.double())
    t = torch.ones(r * r, dtype=torch.float64)
    for i in range(len(prepared)):
        c2 = cov[i][keep][:, keep] + dilation * h * h * torch.eye(2, dtype=torch.float64)
        d = uv - prepared.means.double()[i, keep]
        q = ((d @ torch.linalg.inv(c2)) * d).sum(-1)
        a = (prepared.opacities.double()[i] * torch.exp(-0.5 * q)).clamp(max=0.999)
        t *= 1 - torch.where(a >= 1 / 255, a, torch.zeros_like(a))
    return (1 - t).reshape(r, r)


@pytest.mark.parametrize("axis", [0, 1, 2])
@pytest.mark.parametrize("n,r,dilation", [(1, 9, 0.3), (2, 16, 0.0), (37, 19, 0.3), (150, 24, 1.0)])
def test_column_alpha_matches_brute_force(axis, n, r, dilation):
    from microdreamer.field.iso import column_alpha

    s = make_random_splat(n, seed=31 * n + r, spread=0.9, log_scale_mean=-3.0, log_scale_std=1.0)
    if n > 2:
        s.means[0] = torch.tensor([2.0, -0.3, 0.1])  # partly off the grid across some axes
    prepared, grid = prepare_gaussians(s, FieldConfig(resolution=r, voxel_filter=0.0))
    out = column_alpha(prepared, grid, axis, dilation=dilation, max_pairs=97)  # many chunks
    ref = _column_alpha_brute(prepared, grid, axis, dilation)
    assert out.shape == (r, r) and out.dtype == torch.float32
    assert (out - ref).abs().max() < 1e-6  # float32 output of a float64 computation


def test_column_alpha_of_nothing_is_zero():
    from microdreamer.field.iso import column_alpha

    empty = PreparedGaussians(torch.zeros(0, 3), torch.zeros(0), torch.zeros(0, 3, 3), torch.zeros(0, 3))
    assert torch.equal(column_alpha(empty, GridSpec(7, (0.0, 0.0, 0.0), 1.0), 1), torch.zeros(7, 7))


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_column_alpha_is_what_the_rasteriser_shows_orthographically(axis):
    """A near-orthographic camera (1e5 extents away, one pixel per grid column) through the torch
    rasteriser (gsplat's rules: 0.3 px^2 dilation, 1/255 skip, 0.999 clamp) shows the same alpha."""
    from microdreamer.cameras import Cameras
    from microdreamer.field.iso import column_alpha
    from microdreamer.render.gaussians import render

    s = make_random_splat(60, seed=40 + axis, spread=0.6, log_scale_mean=-3.0, log_scale_std=0.7)
    r = 24
    prepared, grid = prepare_gaussians(s, FieldConfig(resolution=r, voxel_filter=0.0))
    h = 2.0 / (r - 1)
    # camera axes (x right, y down, z forward) as world axes, a proper rotation per view axis
    rows = {0: (1, 2, 0), 1: (2, 0, 1), 2: (0, 1, 2)}[axis]
    rot = torch.eye(3, dtype=torch.float64)[list(rows)]
    dist = 1e5 * 2.0 / grid.scale
    center = torch.tensor(grid.center, dtype=torch.float64)
    view = torch.eye(4, dtype=torch.float64)
    view[:3, :3] = rot
    view[:3, 3] = -rot @ center + torch.tensor([0.0, 0.0, dist], dtype=torch.float64)
    f = dist * grid.scale / h
    K = torch.tensor([[f, 0, r / 2], [0, f, r / 2], [0, 0, 1]], dtype=torch.float64)
    cams = Cameras(view[None].float(), K[None].float(), r, r, near=0.5 * dist, far=2 * dist)
    img = render(s, cams, background=(0.0, 0.0, 0.0), backend="torch", depth=False).alpha[0, ..., 0]
    # image [row, col] = (camera y, camera x) = (world axis rows[1], world axis rows[0])
    expected = img.T if rows[0] < rows[1] else img
    out = column_alpha(prepared, grid, axis)
    err = float((out - expected).abs().max())
    assert err < 2e-4, err  # float32 rasteriser; a column off by 0.01 pixel would differ by ~3e-3


def test_choose_iso_level_known_answer():
    """Column maxima exp(-r^2) and a disc of radius 0.6 as the splat's silhouette: the best level
    separates the columns inside the disc from those outside, at IoU 1, in the middle of their gap."""
    from microdreamer.field.iso import choose_iso_level

    ax = torch.linspace(-1, 1, 41, dtype=torch.float64)
    r2 = ax[:, None] ** 2 + ax[None, :] ** 2
    column_max = torch.exp(-r2)
    alpha = (r2 < 0.36).float() * 0.9
    got = choose_iso_level([column_max, column_max.T, column_max], [alpha, alpha.T, alpha])
    inside, outside = float(column_max[alpha > 0.5].min()), float(column_max[alpha <= 0.5].max())
    assert outside <= got.level < inside and got.iou == 1.0 and got.iou_per_axis == (1.0, 1.0, 1.0)
    assert got.level == pytest.approx((inside + outside) / 2, rel=1e-12)  # the middle of the gap
    # nothing covered, or no field: DreamGaussian's level
    assert choose_iso_level([column_max], [alpha * 0]).level == 1.0
    assert choose_iso_level([column_max * 0], [alpha]).iou is None
    flat = choose_iso_level([torch.full((5, 5), 2.0)], [torch.ones(5, 5)])  # one value: half of it
    assert (flat.level, flat.iou) == (1.0, 1.0)


@pytest.mark.parametrize("voxel_filter", [0.0, 0.25])
def test_auto_iso_level_of_one_gaussian_known_answer(voxel_filter):
    """One isotropic Gaussian (sigma s, opacity o): the splat's alpha is 0.5 at radius r_a with
    o exp(-r_a^2 / (2 (s^2 + 0.3 h^2))) = 0.5, and the field's column maxima are
    o' exp(-r^2 / (2 s'^2)) (s'^2 = s^2 + v h^2): the level is that value at r_a, up to the columns'
    spacing (the level lies between the maxima of the columns just outside and just inside)."""
    from microdreamer.field.iso import auto_iso_level

    s = make_random_splat(1, seed=50)
    s.log_scales[0] = math.log(0.2)
    s.quats[0] = torch.tensor([1.0, 0.0, 0.0, 0.0])
    s.opacity_logits[0] = 2.0  # o = 0.88
    cfg = FieldConfig(resolution=33, voxel_filter=voxel_filter)
    fld = density_field(s, cfg)
    got = auto_iso_level(s, fld.values, fld.grid, cfg)
    o, h = float(s.opacities()[0]), 2.0 / 32
    sigma = 0.2 * fld.grid.scale
    r_a2 = 2 * (sigma**2 + 0.3 * h * h) * math.log(2 * o)
    column = fld.values.amax(2).double()
    ax = fld.grid.axis().double()
    rr = ax[:, None] ** 2 + ax[None, :] ** 2
    lo, hi = float(column[rr > r_a2].max()), float(column[rr < r_a2].min())
    assert lo <= got.level <= hi
    sw2 = sigma**2 + cfg.filter_variance_normalised
    expected = o * (sigma**2 / sw2) ** 1.5 * math.exp(-r_a2 / (2 * sw2))
    assert lo <= expected <= hi  # the analytic answer lies in the same gap
    assert got.iou == 1.0 and got.method == "auto"


def _thin_shell(n, seed):
    """Flat discs (normal sigma 1/15 of the in-plane one, ~0.15 of a 32^3 voxel) tangent to a sphere of
    radius 0.5, opacities in [0.1, 0.9]: a capture-like surface."""
    g = torch.Generator().manual_seed(seed)
    d = torch.nn.functional.normalize(torch.randn(n, 3, generator=g), dim=-1)
    # the rotation taking +z to d (shortest arc), w = 1 + d_z
    q = torch.nn.functional.normalize(
        torch.stack([1 + d[:, 2], -d[:, 1], d[:, 0], torch.zeros(n)], -1), dim=-1
    )
    scales = torch.stack([torch.full((n,), 0.04), torch.full((n,), 0.04), torch.full((n,), 0.04 / 15)], -1)
    opac = 0.1 + 0.8 * torch.rand(n, generator=g)
    return Splat.from_activated(0.5 * d, scales, q, opac, torch.rand(n, 3, generator=g))


def test_auto_iso_level_on_a_thin_shell():
    """DreamGaussian's level 1 misses most of a capture-like thin shell; the chosen level is below it
    and its silhouettes match the splat's."""
    from microdreamer.field.iso import auto_iso_level, column_alpha

    s = _thin_shell(3000, seed=51)
    cfg = FieldConfig(resolution=32)
    fld = density_field(s, cfg)
    got = auto_iso_level(s, fld.values, fld.grid, cfg)
    assert got.level < 0.5 and got.iou > 0.95
    raw, _ = prepare_gaussians(s, FieldConfig(resolution=32, voxel_filter=0.0))
    alpha = column_alpha(raw, fld.grid, 1) > 0.5
    at_one = fld.values.amax(1) > 1.0
    assert float((at_one & alpha).sum()) / float((at_one | alpha).sum()) < 0.8


def test_resolve_iso_level():
    from microdreamer.field.iso import resolve_iso_level

    s = _thin_shell(500, seed=52)
    for mode in ("exact", "upstream"):
        cfg = FieldConfig(resolution=16, mode=mode)
        fld = density_field(s, cfg)
        fixed = resolve_iso_level(0.3, s, fld.values, fld.grid, cfg)
        assert (fixed.level, fixed.method) == (0.3, "fixed")
        auto = resolve_iso_level("auto", s, fld.values, fld.grid, cfg)
        # upstream keeps DreamGaussian's density_thresh exactly
        assert (auto.level, auto.method) == (
            (1.0, "upstream") if mode == "upstream" else (auto.level, "auto")
        )
    with pytest.raises(ValueError, match="field of this splat"):
        from microdreamer.field.iso import auto_iso_level

        auto_iso_level(s, fld.values[:8], fld.grid, cfg)


def test_mesh_threshold_auto_is_resolved_before_the_mesh_stage():
    from microdreamer.errors import InputError
    from microdreamer.field.iso import resolve_iso_level
    from microdreamer.mesh import MeshConfig, extract_mesh

    s = _thin_shell(800, seed=53)
    cfg = FieldConfig(resolution=20)
    fld = density_field(s, cfg)
    mesh_cfg = MeshConfig(threshold="auto")
    with pytest.raises(ValueError, match="resolve_iso_level"):
        extract_mesh(fld.values, fld.grid.origin, fld.grid.spacing, mesh_cfg)
    level = resolve_iso_level(mesh_cfg.threshold, s, fld.values, fld.grid, cfg).level
    mesh, _ = extract_mesh(fld.values, fld.grid.origin, fld.grid.spacing, MeshConfig(threshold=level))
    assert mesh.num_faces > 0
    for bad in ("high", float("nan")):
        with pytest.raises(InputError, match="threshold"):
            MeshConfig(threshold=bad)


@pytest.mark.cuda
@pytest.mark.parametrize("seed", [0, 1])
def test_auto_iso_level_on_cuda_matches_the_cpu(seed):
    """On a GPU the axis images come from the carving kernel (float32 terms): the same level."""
    from microdreamer.field.iso import auto_iso_level

    s = make_synthetic_object(3000, seed=seed, scale_fraction=0.02)
    cfg = FieldConfig(resolution=40)
    fld = density_field(s, cfg)
    cpu = auto_iso_level(s, fld.values, fld.grid, cfg)
    gpu = auto_iso_level(s.to("cuda"), fld.values.cuda(), fld.grid, cfg)
    for a, b in zip(gpu.column_alphas, cpu.column_alphas, strict=True):
        assert a.is_cuda and float((a.cpu() - b).abs().max()) < 2e-6
    assert gpu.level == pytest.approx(cpu.level, rel=1e-6) and gpu.iou == pytest.approx(cpu.iou, abs=1e-9)


# ---------------------------------------------------------------------------------------------------
# the C++ CPU kernel (backend "cpp") against the same float64 reference

needs_cpp = pytest.mark.skipif(not cpu_kernels.available(), reason="no C++ compiler for the CPU kernels")


def _check_cpp(splat, cfg, workers=None):
    prepared, grid = prepare_gaussians(splat, cfg)
    ref = density_field_reference(prepared, grid, cfg)
    out = density_field_cpp(prepared, grid, cfg, workers=workers)
    assert out.shape == (cfg.resolution,) * 3 and out.dtype == torch.float32
    return assert_field_matches(out, ref)


@needs_cpp
@pytest.mark.parametrize("mode", ["exact", "upstream"])
@pytest.mark.parametrize("n,r", [(1, 16), (2, 17), (31, 33), (64, 24), (150, 30), (400, 20)])
def test_cpp_matches_reference(mode, n, r):
    splat = make_random_splat(n, seed=1000 * n + r + 7, spread=0.8)
    _check_cpp(splat, FieldConfig(resolution=r, mode=mode))


@needs_cpp
@pytest.mark.parametrize("mode", ["exact", "upstream"])
def test_cpp_edge_cases_match_reference(mode):
    # an object, a Gaussian larger than the grid, a flat disc and a needle (the row interval's
    # quadratic is nearly degenerate), Gaussians partly and wholly outside the cube
    _check_cpp(make_synthetic_object(800, seed=5, scale_fraction=0.02), FieldConfig(resolution=28, mode=mode))
    s = make_random_splat(30, seed=6, spread=0.6)
    s.log_scales[0] = torch.log(torch.tensor([0.3, 0.25, 1e-5]))
    s.log_scales[1] = torch.log(torch.tensor([1e-5, 0.2, 1e-5]))
    s.log_scales[2] = math.log(5.0)
    s.opacity_logits[:3] = 5.0
    _check_cpp(s, FieldConfig(resolution=31, mode=mode))
    # every Gaussian e^60 wide: clamped by prepare_gaussians to 1e18 of the grid, the row interval's ends far
    # beyond int64 (the CLI then reports a field above the level everywhere)
    s = make_synthetic_object(40, seed=1)
    s.log_scales[:] = 60.0
    _check_cpp(s, FieldConfig(resolution=12, mode=mode))


@needs_cpp
@pytest.mark.parametrize("mode", ["exact", "upstream"])
def test_cpp_is_the_same_on_any_number_of_threads(mode):
    # each voxel's terms are added in Gaussian order whatever slab a thread owns: bit for bit
    s = make_random_splat(300, seed=11, spread=0.9)
    cfg = FieldConfig(resolution=37, mode=mode)
    prepared, grid = prepare_gaussians(s, cfg)
    one = density_field_cpp(prepared, grid, cfg, workers=1)
    for workers in (2, 3, 8):
        assert torch.equal(density_field_cpp(prepared, grid, cfg, workers=workers), one)


@needs_cpp
def test_cpp_of_nothing_is_zero_and_auto_picks_it_on_the_cpu():
    s = make_random_splat(5, seed=2)
    s.opacity_logits[:] = -20.0
    fld = density_field(s, FieldConfig(resolution=12), backend="cpp")
    assert fld.num_gaussians == 0 and torch.equal(fld.values, torch.zeros(12, 12, 12))
    fld = density_field(make_random_splat(20, seed=3), FieldConfig(resolution=12))
    assert fld.backend == "cpp"
