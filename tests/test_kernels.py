"""CUDA kernels of the density field (microdreamer.kernels, called through microdreamer.field.cuda) against
the float64 reference and the PyTorch path; the CUDA tests skip on a machine without a GPU."""

import math
import shutil
from dataclasses import fields

import pytest
import torch

from conftest import FIELD_REL_TOL, assert_field_matches, rel_err
from microdreamer.field import FieldConfig, density_field, prepare_gaussians
from microdreamer.field.cuda import CudaFieldOptions, extract_fields
from microdreamer.field.reference import density_field_reference
from microdreamer.field.torch_impl import density_field_torch
from microdreamer.splat import Splat, read_ply
from microdreamer.synthetic import make_random_splat, make_synthetic_object

cuda = pytest.mark.cuda


def poisoned(r: int) -> torch.Tensor:
    """An output grid full of NaN: any voxel the kernel fails to write fails the check."""
    return torch.full((r, r, r), math.nan, dtype=torch.float32, device="cuda")


def run_kernel(prepared, grid, cfg, impl, **kw) -> torch.Tensor:
    out = extract_fields(
        prepared.to("cuda"), grid, cfg, CudaFieldOptions(impl=impl, **kw), out=poisoned(grid.resolution)
    )
    assert out.shape == (grid.resolution,) * 3 and out.dtype == torch.float32 and out.is_cuda
    assert torch.isfinite(out).all(), "unwritten (NaN) or non-finite voxels"
    return out


def check_against_reference(splat, cfg, impl, **kw) -> float:
    prepared, grid = prepare_gaussians(splat, cfg)
    ref = density_field_reference(prepared, grid, cfg)
    return assert_field_matches(run_kernel(prepared, grid, cfg, impl, **kw), ref)


# ----------------------------------------------------------------------------------------------
# CPU: importing never compiles, and calling without CUDA says what to do
# ----------------------------------------------------------------------------------------------


def test_import_compiles_nothing():
    import microdreamer.kernels
    from microdreamer.kernels import _backend

    assert hasattr(microdreamer.kernels, "extract_fields")
    if not torch.cuda.is_available():
        assert _backend._module is None


def test_extract_fields_needs_cuda_tensors():
    cfg = FieldConfig(resolution=8)
    prepared, grid = prepare_gaussians(make_random_splat(3), cfg)
    with pytest.raises(RuntimeError, match="CUDA device.*backend='torch'"):
        extract_fields(prepared, grid, cfg)
    with pytest.raises(ValueError, match="unknown kernel implementation"):
        CudaFieldOptions(impl="fastest")
    with pytest.raises(ValueError, match="variant"):
        CudaFieldOptions(variant=3)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised without a GPU")
def test_loader_without_cuda_raises_a_clear_error():
    from microdreamer.kernels import _backend

    with pytest.raises(RuntimeError, match="CUDA GPU.*backend='torch'"):
        _backend.load()


def test_build_folder_is_named_by_everything_the_binary_depends_on(tmp_path, monkeypatch):
    """One folder per build: a changed source (or header) gives another folder, the same ones the same;
    TORCH_EXTENSIONS_DIR is honoured."""
    import shutil

    from microdreamer.kernels import _backend

    csrc = tmp_path / "csrc"
    shutil.copytree(_backend.CSRC, csrc)
    monkeypatch.setattr(_backend, "CSRC", csrc)
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    first = _backend.build_folder()
    assert first.parent == tmp_path / "ext" and first.name.startswith(_backend.EXTENSION_NAME + "-")
    assert _backend.build_folder() == first
    header = next(csrc.glob("*.h"))
    header.write_text(header.read_text() + "\n// changed\n")
    assert _backend.build_folder() != first
    assert not (tmp_path / "ext").exists()  # finding the folder creates nothing


@pytest.mark.cuda
def test_a_finished_build_is_imported_without_cpp_extension():
    """After the first load, a fresh interpreter imports the finished build directly."""
    import subprocess
    import sys

    from microdreamer.kernels import _backend

    _backend.load()
    assert (_backend.build_folder() / _backend.FINISHED).is_file()
    code = (
        "import sys; from microdreamer.kernels import _backend; m = _backend.load(); "
        "assert 'torch.utils.cpp_extension' not in sys.modules; assert hasattr(m, 'carve_alpha')"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# ----------------------------------------------------------------------------------------------
# extract_fields against the float64 reference
# ----------------------------------------------------------------------------------------------

# (impl, chunks, variant, scatter_voxels, splits, scatter_precise): the naive kernel, and the fast kernel at
# every tile depth in its two variants (1: host-sized lists; 2: fixed-capacity lists, no host sync), each with no scatter kernel (0: every Gaussian tiled) and with the default split
# (None: small Gaussians scattered, exact mode); EVERYTHING: every non-degenerate Gaussian scattered. The
# Gaussians too thin for float32 go to the float64 scatter kernel by default (exact mode), to the tiled
# kernels' float64 path with scatter_precise=False
EVERYTHING = 1 << 40
IMPL_VARIANTS = (
    [("naive", None, None, None, None, None)]
    + [("fast", c, v, s, None, None) for v in (1, 2) for c in (1, 2, 4) for s in (0, None)]
    + [("fast", 1, v, EVERYTHING, None, None) for v in (1, 2)]
    # variant 2 with one block per tile, and with every list longer than 3 entries cut into 2 or 5 slices
    # (partial tiles added with atomics into the zeroed grid)
    + [("fast", c, 2, None, sp, None) for c in (1, 2, 4) for sp in (1, 2, 5)]
    # the thin Gaussians in the tiled kernels' float64 path
    + [("fast", c, v, s, None, False) for v in (1, 2) for c in (1, 4) for s in (0, None)]
)


def _variants(mode):
    return [
        (i, c, v, dict(chunks=c, variant=v, scatter_voxels=s, **_split_kw(sp), **_precise_kw(pr)))
        for i, c, v, s, sp, pr in IMPL_VARIANTS
        if not (mode == "upstream" and c == 4)
    ]


def _precise_kw(precise):
    return {} if precise is None else dict(scatter_precise=precise)


def _split_kw(splits):
    if splits is None:
        return {}
    return dict(splits=splits, split_min_entries=4 if splits > 1 else 128)


@cuda
@pytest.mark.parametrize("mode", ["exact", "upstream"])
@pytest.mark.parametrize("n,r", [(1, 16), (2, 17), (31, 33), (150, 30), (400, 20), (300, 40), (700, 37)])
def test_matches_reference(mode, n, r):
    # r = 17, 33, 37: odd and not multiples of num_blocks or of the 16-voxel tile
    splat = make_random_splat(n, seed=1000 * n + r, spread=0.8)
    for impl, _, _, kw in _variants(mode):
        check_against_reference(splat, FieldConfig(resolution=r, mode=mode), impl, **kw)


@cuda
@pytest.mark.parametrize("mode", ["exact", "upstream"])
def test_wide_gaussians_take_the_recurrence(mode):
    # sigma >= 2 voxels: the fast kernel's z recurrence (exact mode); a mix of sizes and opacities
    splat = make_random_splat(300, seed=21, spread=0.9, log_scale_mean=-1.6, log_scale_std=0.6)
    for impl, _, _, kw in _variants(mode):
        check_against_reference(splat, FieldConfig(resolution=45, mode=mode), impl, **kw)


@cuda
@pytest.mark.parametrize("mode", ["exact", "upstream"])
def test_object_like_splat(mode):
    splat = make_synthetic_object(1500, seed=5, scale_fraction=0.03)
    for impl, _, _, kw in _variants(mode):
        check_against_reference(splat, FieldConfig(resolution=40, mode=mode), impl, **kw)


@cuda
@pytest.mark.parametrize("impl,variant", [("naive", None), ("fast", 1), ("fast", 2)])
@pytest.mark.parametrize("mode", ["exact", "upstream"])
def test_no_gaussians_gives_zeros(impl, variant, mode):
    s = make_random_splat(5, seed=2)
    s.opacity_logits[:] = -20.0  # all below min_opacity
    cfg = FieldConfig(resolution=12, mode=mode)
    prepared, grid = prepare_gaussians(s, cfg)
    assert len(prepared) == 0
    out = extract_fields(
        prepared.to("cuda"), grid, cfg, CudaFieldOptions(impl=impl, variant=variant), out=poisoned(12)
    )
    assert torch.equal(out.cpu(), torch.zeros(12, 12, 12))


@cuda
@pytest.mark.parametrize("mode", ["exact", "upstream"])
def test_single_gaussian_peaks_at_its_opacity(mode):
    s = make_random_splat(1, seed=3)
    cfg = FieldConfig(resolution=21, mode=mode)  # odd R: the centre is a grid point
    prepared, grid = prepare_gaussians(s, cfg)
    # the peak is the opacity, times prod_k s_k / sqrt(s_k^2 + v h^2) under the voxel filter (exact mode's
    # default; upstream mode has none)
    sn = s.scales()[0].double() * grid.scale
    peak = float(s.opacities()[0]) * float((sn / (sn**2 + cfg.filter_variance_normalised).sqrt()).prod())
    for impl, _, _, kw in _variants(mode):
        out = run_kernel(prepared, grid, cfg, impl, **kw)
        assert math.isclose(float(out[10, 10, 10]), peak, rel_tol=1e-6)
        check_against_reference(s, cfg, impl, **kw)


@cuda
@pytest.mark.parametrize("mode", ["exact", "upstream"])
def test_gaussian_larger_than_the_grid(mode):
    s = make_random_splat(20, seed=4, spread=0.5, log_scale_mean=-2.0)
    s.log_scales[0] = math.log(5.0)  # sigma 5 world units, the cube is ~1
    for impl, _, _, kw in _variants(mode):
        check_against_reference(s, FieldConfig(resolution=19, mode=mode), impl, **kw)


@cuda
@pytest.mark.parametrize("mode", ["exact", "upstream"])
def test_nearly_degenerate_covariance(mode):
    s = make_random_splat(30, seed=6, spread=0.6)
    s.log_scales[0] = torch.log(torch.tensor([0.3, 0.25, 1e-5]))  # a flat disc, 3e4 : 1
    s.log_scales[1] = torch.log(torch.tensor([1e-5, 0.2, 1e-5]))  # a needle
    s.log_scales[2] = torch.log(torch.tensor([0.2, 0.2, 2e-3]))  # 100 : 1, thinner than a voxel
    s.opacity_logits[:3] = 5.0
    for impl, _, _, kw in _variants(mode):
        check_against_reference(s, FieldConfig(resolution=31, mode=mode), impl, **kw)


@cuda
def test_extreme_scales_stay_finite():
    s = make_random_splat(10, seed=13)
    s.log_scales[0] = -60.0  # sigma 1e-26: 1/sigma^2 overflows float32
    s.log_scales[1] = 30.0
    for mode in ("exact", "upstream"):
        cfg = FieldConfig(resolution=12, mode=mode)
        prepared, grid = prepare_gaussians(s, cfg)
        for impl, _, _, kw in _variants(mode):
            run_kernel(prepared, grid, cfg, impl, **kw)  # asserts every voxel finite


@cuda
@pytest.mark.parametrize("mode", ["exact", "upstream"])
def test_z_slab_chunking(mode):
    # a tiny list budget forces one launch per z-slab of tiles (and single slabs over the budget)
    splat = make_random_splat(400, seed=8, spread=0.9)
    cfg = FieldConfig(resolution=50, mode=mode)
    prepared, grid = prepare_gaussians(splat, cfg)
    whole = run_kernel(prepared, grid, cfg, "fast", chunks=1)
    for budget in (1, 100, 5000):
        sliced = run_kernel(prepared, grid, cfg, "fast", chunks=1, max_list_entries=budget)
        assert rel_err(sliced, whole) < 1e-6  # only the summation order may differ
    check_against_reference(splat, cfg, "fast", chunks=1, max_list_entries=100)


@cuda
@pytest.mark.parametrize("variant", [2])
@pytest.mark.parametrize("mode", ["exact", "upstream"])
def test_list_capacity_overflow_scans_every_gaussian(variant, mode):
    # variant 2 bins into one list of fixed capacity; tiles whose entries do not fit scan all N
    # Gaussians (budget 1: every tile but maybe the first; 5000: some tiles each way)
    splat = make_synthetic_object(3000, seed=31, scale_fraction=0.03)
    cfg = FieldConfig(resolution=50, mode=mode)
    prepared, grid = prepare_gaussians(splat, cfg)
    whole = run_kernel(prepared, grid, cfg, "fast", chunks=1, variant=variant)
    for budget in (1, 5000):
        for chunks in (1, 2):
            part = run_kernel(
                prepared, grid, cfg, "fast", chunks=chunks, variant=variant, max_list_entries=budget
            )
            assert rel_err(part, whole) < 1e-6  # only the summation order may differ
    check_against_reference(splat, cfg, "fast", chunks=2, variant=variant, max_list_entries=5000)


@cuda
@pytest.mark.parametrize("variant", [2])
def test_sized_list_grows_past_the_fixed_capacity(variant):
    # 400 Gaussians wider than the grid: each is binned to all 256 tiles of 128^3 (depth 32), 102400 entries
    # against a fixed capacity of max(96 N, 65536) = 65536. Without sized_list the tiles past the capacity
    # scan every Gaussian; with it the list is grown to 102400 (and variant 2's split plan redone for it)
    splat = make_random_splat(400, seed=41, spread=0.3, log_scale_mean=-1.2, log_scale_std=0.2)
    cfg = FieldConfig(resolution=128, mode="exact")
    prepared, grid = prepare_gaussians(splat, cfg)
    ref = density_field_torch(prepared.to("cuda"), grid, cfg)
    for sized in (False, True):
        for splits in (1, None):
            out = run_kernel(
                prepared, grid, cfg, "fast", chunks=4, variant=variant, sized_list=sized, **_split_kw(splits)
            )
            assert rel_err(out, ref) <= FIELD_REL_TOL


@cuda
@pytest.mark.parametrize("r", [64, 66])
def test_precise_scatter_agrees_with_the_tiled_float64_path(r):
    # thin discs and needles in random orientations (the float64 class): added by the float64 scatter kernel
    # (default) or by the tiled kernels' float64 path; both evaluate q in float64, so only the summation
    # order differs. R = 64: four-wide vector atomics; R = 66: scalar atomics
    splat = make_random_splat(300, seed=50 + r, spread=0.7, log_scale_mean=-2.5, log_scale_std=0.3)
    splat.log_scales[:, 2] = math.log(2e-4)  # every Gaussian 100x thinner than a voxel along one axis
    cfg = FieldConfig(resolution=r, mode="exact")
    prepared, grid = prepare_gaussians(splat, cfg)
    ref = density_field_reference(prepared, grid, cfg)
    tiled = run_kernel(prepared, grid, cfg, "fast", scatter_precise=False)
    for variant in (1, 2):
        out = run_kernel(prepared, grid, cfg, "fast", variant=variant)
        assert_field_matches(out, ref)
        assert rel_err(out, tiled) <= 2e-6


@cuda
def test_thin_discs_wider_than_the_grid_take_many_slices():
    # thin discs wider than the grid: each box holds all 70 x 70 = 4900 columns, 20 work items of 256 columns
    # for the float64 scatter kernel (and, binned, 5 x 5 x 9 = 225 tiles each: the warp-wide binning)
    splat = make_random_splat(40, seed=52, spread=0.6, log_scale_mean=-3.0, log_scale_std=0.3)
    splat.log_scales[:6, :2] = math.log(1.5)
    splat.log_scales[:6, 2] = math.log(2e-4)
    cfg = FieldConfig(resolution=70, mode="exact")
    prepared, grid = prepare_gaussians(splat, cfg)
    ref = density_field_reference(prepared, grid, cfg)
    tiled = run_kernel(prepared, grid, cfg, "fast", scatter_precise=False)
    assert_field_matches(tiled, ref)
    for variant in (1, 2):
        out = run_kernel(prepared, grid, cfg, "fast", variant=variant)
        assert_field_matches(out, ref)
        assert rel_err(out, tiled) <= 2e-6


@cuda
@pytest.mark.parametrize("capacity", [0, 7, 60])
def test_precise_items_past_the_capacity_stay_in_the_tiles(capacity):
    # the float64 scatter's list holds `capacity` items; Gaussians whose items do not all fit fall back to the
    # tiled kernels' float64 path (0: all of them; 7 and 60: some each way, with slots marked unused)
    splat = make_random_splat(200, seed=53, spread=0.7, log_scale_mean=-2.5, log_scale_std=0.3)
    splat.log_scales[:, 2] = math.log(2e-4)
    cfg = FieldConfig(resolution=64, mode="exact")
    prepared, grid = prepare_gaussians(splat, cfg)
    ref = density_field_reference(prepared, grid, cfg)
    tiled = run_kernel(prepared, grid, cfg, "fast", scatter_precise=False)
    for variant in (1, 2):
        out = run_kernel(prepared, grid, cfg, "fast", variant=variant, max_precise_items=capacity)
        assert_field_matches(out, ref)
        assert rel_err(out, tiled) <= 2e-6


@cuda
@pytest.mark.parametrize("mode", ["exact", "upstream"])
def test_wide_boxes_are_binned_by_the_whole_warp(mode):
    # boxes of more than 16 tiles are binned (counted and listed) by all 32 lanes of their warp: a mix of
    # Gaussians wider than the grid (up to 5 x 5 x 9 tiles at depth 8) and small ones in the same warps
    splat = make_random_splat(90, seed=54, spread=0.8, log_scale_mean=-2.6, log_scale_std=0.4)
    splat.log_scales[::7] = math.log(0.6)
    for impl, _, _, kw in _variants(mode):
        check_against_reference(splat, FieldConfig(resolution=70, mode=mode), impl, **kw)


@cuda
@pytest.mark.parametrize("capacity", [0, 5])
def test_wide_items_past_the_capacity_are_binned_by_their_warp(capacity):
    # boxes of more than 128 tiles (here 5 x 5 x 9 = 225 at depth 8, two items each) are binned through the
    # wide-box list; those whose items do not fit (0: all; 5: some, with slots marked unused) by their warp
    splat = make_random_splat(90, seed=55, spread=0.8, log_scale_mean=-2.6, log_scale_std=0.4)
    splat.log_scales[::5] = math.log(0.6)
    cfg = FieldConfig(resolution=70, mode="exact")
    prepared, grid = prepare_gaussians(splat, cfg)
    ref = density_field_reference(prepared, grid, cfg)
    for variant in (1, 2):
        listed = run_kernel(prepared, grid, cfg, "fast", chunks=1, variant=variant)
        out = run_kernel(prepared, grid, cfg, "fast", chunks=1, variant=variant, max_wide_items=capacity)
        assert_field_matches(out, ref)
        assert rel_err(out, listed) < 1e-6  # only the summation order may differ
    # variant 1 in z-slab chunks: each launch lists the wide items' tiles of its slabs only
    sliced = run_kernel(prepared, grid, cfg, "fast", chunks=1, variant=1, max_list_entries=500)
    assert rel_err(sliced, listed) < 1e-6


@cuda
def test_defaults_at_large_resolution_match_host_sized_lists():
    # R = 400: from R = 384 on the defaults size variant 2's list from the counts (here 384k entries against
    # a fixed capacity of 144k) and give each tile 16 blocks; variant 1 (lists sized on the host, one block
    # per tile) and variant 2 with the fixed capacity differ from them by the summation order only
    splat = make_random_splat(1500, seed=43, spread=0.7, log_scale_mean=-3.0, log_scale_std=0.2)
    cfg = FieldConfig(resolution=400, mode="exact")
    prepared, grid = prepare_gaussians(splat, cfg)
    default = run_kernel(prepared, grid, cfg, "fast")
    host_sized = run_kernel(prepared, grid, cfg, "fast", variant=1)
    fixed = run_kernel(prepared, grid, cfg, "fast", sized_list=False, splits=1)
    assert float(host_sized.abs().sum()) > 0
    assert rel_err(default, host_sized) <= 2e-6
    assert rel_err(fixed, host_sized) <= 2e-6


@cuda
@pytest.mark.parametrize("r", [64, 66])
def test_scatter_kernel_agrees_with_the_tiles(r):
    # R = 64: four-wide vector atomics; R = 66: scalar atomics. The split moves Gaussians between two
    # evaluation paths (the tiled kernel's z recurrence, the scatter kernel's direct exponentials), so
    # the fields differ by rounding only
    splat = make_synthetic_object(20_000, seed=r, scale_fraction=0.01)
    cfg = FieldConfig(resolution=r, mode="exact")
    prepared, grid = prepare_gaussians(splat, cfg)
    tiled = run_kernel(prepared, grid, cfg, "fast", scatter_voxels=0)
    ref = density_field_torch(prepared.to("cuda"), grid, cfg)
    assert rel_err(tiled, ref) <= FIELD_REL_TOL
    for scatter in (64, 4096, EVERYTHING):
        for variant in (1, 2):
            out = run_kernel(prepared, grid, cfg, "fast", variant=variant, scatter_voxels=scatter)
            assert rel_err(out, ref) <= FIELD_REL_TOL
            assert rel_err(out, tiled) <= 2e-6  # rounding of two float32 paths (observed ~1e-7)


@cuda
@pytest.mark.parametrize("r", [64, 66])
def test_overlapped_scatter_matches_one_stream(r):
    # small Gaussians (scatter kernel), thin discs (float64 scatter kernel) and wide ones (tiles) together;
    # with splits the scatter kernels run on a second stream while the tiles are binned and evaluated, every
    # tile then added into the zeroed grid (also a tile's only slice). Called from a user stream whose result
    # is read right after: the call's stream must wait for the second one. Only the summation order differs.
    small = make_synthetic_object(6000, seed=r, scale_fraction=0.01)
    wide = make_random_splat(200, seed=r, spread=0.6, log_scale_mean=-2.0, log_scale_std=0.3)
    thin = make_random_splat(200, seed=r + 1, spread=0.7, log_scale_mean=-2.5, log_scale_std=0.3)
    thin.log_scales[:, 2] = math.log(2e-4)
    splat = Splat(
        **{f.name: torch.cat([getattr(p, f.name) for p in (small, wide, thin)]) for f in fields(Splat)}
    )
    cfg = FieldConfig(resolution=r, mode="exact")
    prepared, grid = prepare_gaussians(splat, cfg)
    ref = density_field_torch(prepared.to("cuda"), grid, cfg)
    for kw in (dict(), dict(splits=5, split_min_entries=4), dict(splits=64, split_min_entries=1)):
        one = run_kernel(prepared, grid, cfg, "fast", variant=2, overlap=False, **kw)
        assert rel_err(one, ref) <= FIELD_REL_TOL
        user = torch.cuda.Stream()
        with torch.cuda.stream(user):
            both = run_kernel(prepared, grid, cfg, "fast", variant=2, overlap=True, **kw)
            total = both.double().sum()  # on the user stream, right after the call
        user.synchronize()
        assert rel_err(both, ref) <= FIELD_REL_TOL
        assert rel_err(both, one) <= 2e-6
        assert abs(float(total) - float(one.double().sum())) <= 1e-5 * float(one.double().sum())


def test_scatter_options_must_be_non_negative():
    for name in ("scatter_voxels", "max_precise_items", "max_wide_items"):
        with pytest.raises(ValueError, match=name):
            CudaFieldOptions(**{name: -1})


def test_splits_must_be_in_range():
    for kw in (dict(splits=0), dict(splits=65), dict(splits=2, split_min_entries=0)):
        with pytest.raises(ValueError, match="split"):
            CudaFieldOptions(**kw)


@cuda
def test_real_sized_split_lists_match_one_block_per_tile():
    # wide Gaussians on a coarse grid: every tile list is long, so the default splits cut them
    splat = make_synthetic_object(20_000, seed=3, scale_fraction=0.04)
    cfg = FieldConfig(resolution=64, mode="exact")
    prepared, grid = prepare_gaussians(splat, cfg)
    ref = density_field_torch(prepared.to("cuda"), grid, cfg)
    whole = run_kernel(prepared, grid, cfg, "fast", variant=2, splits=1)
    for splits in (2, 8, 64):
        out = run_kernel(prepared, grid, cfg, "fast", variant=2, splits=splits)
        assert rel_err(out, whole) < 1e-6  # only the summation order differs
        assert rel_err(out, ref) <= FIELD_REL_TOL


@cuda
def test_density_field_dispatches_to_the_fast_kernel():
    splat = make_random_splat(100, seed=9).to("cuda")
    fld = density_field(splat, FieldConfig(resolution=24), backend="auto")
    assert fld.backend == "cuda" and fld.values.is_cuda
    prepared, grid = prepare_gaussians(splat, FieldConfig(resolution=24))
    assert (
        rel_err(fld.values, density_field_reference(prepared, grid, FieldConfig(resolution=24)))
        <= FIELD_REL_TOL
    )


# ----------------------------------------------------------------------------------------------
# real sizes: N >= 100k against the vectorised PyTorch path (float64 q). The CPU takes minutes per
# case at these sizes (64-205 s on 2 cores), so it runs on the GPU here: the same code, q in float64.
# ----------------------------------------------------------------------------------------------


@cuda
@pytest.mark.parametrize("r,scale", [(128, 0.01), (200, 0.006), (256, 0.005)])
def test_large_against_torch_path(r, scale):
    splat = make_synthetic_object(100_000, seed=r, scale_fraction=scale)
    cfg = FieldConfig(resolution=r, mode="exact")
    prepared, grid = prepare_gaussians(splat, cfg)
    ref = density_field_torch(prepared.to("cuda"), grid, cfg)
    for chunks in (1, 2, 4):
        for variant in (1, 2):
            for scatter in (0, None):
                out = run_kernel(
                    prepared, grid, cfg, "fast", chunks=chunks, variant=variant, scatter_voxels=scatter
                )
                assert rel_err(out, ref) <= FIELD_REL_TOL
    out = run_kernel(prepared, grid, cfg, "fast", scatter_voxels=EVERYTHING)
    assert rel_err(out, ref) <= FIELD_REL_TOL
    if r == 128:
        out = run_kernel(prepared, grid, cfg, "naive")
        assert rel_err(out, ref) <= FIELD_REL_TOL


@cuda
@pytest.mark.parametrize("r,n", [(64, 5000), (128, 2000)])
def test_upstream_gpu_equals_cpu(r, n):
    splat = make_synthetic_object(n, seed=n, scale_fraction=0.012)
    cfg = FieldConfig(resolution=r, mode="upstream")
    prepared, grid = prepare_gaussians(splat, cfg)
    cpu = density_field_torch(prepared, grid, cfg)  # the CPU path
    for impl, _, _, kw in _variants("upstream"):
        out = run_kernel(prepared, grid, cfg, impl, **kw)
        assert rel_err(out, cpu) <= FIELD_REL_TOL


def _sample_splat(name: str):
    from conftest import sample

    return read_ply(sample(f"splats/{name}"))


@cuda
@pytest.mark.parametrize("mode", ["exact", "upstream"])
@pytest.mark.parametrize("name", ["dg_creative_tmp_8.8k.ply", "pc_guitar_91k_sh0.decoded.ply"])
def test_real_splats_against_torch_path(mode, name):
    splat = _sample_splat(name)
    cfg = FieldConfig(resolution=128, mode=mode)
    prepared, grid = prepare_gaussians(splat, cfg)
    ref = density_field_torch(prepared.to("cuda"), grid, cfg)
    for impl, _, _, kw in _variants(mode):
        if impl == "naive" and len(prepared) > 20_000:
            continue
        out = run_kernel(prepared, grid, cfg, impl, **kw)
        assert rel_err(out, ref) <= FIELD_REL_TOL


# ----------------------------------------------------------------------------------------------
# the C++ CPU library's loader (its kernels are tested in test_field.py, test_field_carve.py,
# test_charts.py against their references)
# ----------------------------------------------------------------------------------------------


@pytest.fixture
def fresh_cpu_loader(tmp_path, monkeypatch):
    """The CPU loader with no library loaded, no failure recorded and its cache under tmp_path."""
    from microdreamer.kernels import _cpu_backend

    monkeypatch.setattr(_cpu_backend, "_library", None)
    monkeypatch.setattr(_cpu_backend, "_failure", None)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return _cpu_backend


def test_cpu_import_compiles_nothing():
    import subprocess
    import sys

    code = (
        "import microdreamer.kernels.cpu, microdreamer.field, microdreamer.texture.charts; "
        "from microdreamer.kernels import _cpu_backend; assert _cpu_backend._library is None"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.skipif(shutil.which("c++") is None, reason="no C++ compiler")
def test_cpu_library_builds_once_into_a_folder_named_by_its_sources(fresh_cpu_loader, tmp_path, monkeypatch):
    loader = fresh_cpu_loader
    cxx = loader.compiler()
    key = loader.build_key(cxx)
    lib = loader.load()
    assert (tmp_path / "cache" / "microdreamer" / "cpu_kernels" / key / loader.LIBRARY).is_file()
    assert all(hasattr(lib, name) for name in loader.SIGNATURES)
    assert not list((tmp_path / "cache").rglob(".build-*"))  # the temporary file was renamed
    assert loader.load() is lib
    csrc = tmp_path / "csrc"
    shutil.copytree(loader.CSRC, csrc)
    monkeypatch.setattr(loader, "CSRC", csrc)
    assert loader.build_key(cxx) == key
    (csrc / loader.SOURCES[0]).write_text((csrc / loader.SOURCES[0]).read_text() + "\n// changed\n")
    assert loader.build_key(cxx) != key


def test_without_a_compiler_auto_choices_take_the_pytorch_paths(fresh_cpu_loader, monkeypatch, caplog):
    from microdreamer.field import density_field
    from microdreamer.kernels import cpu

    monkeypatch.setenv("CXX", "/nonexistent/c++")
    assert not cpu.available() and not cpu.usable()
    with pytest.raises(RuntimeError, match="no C\\+\\+ compiler found.*set CXX"):
        fresh_cpu_loader.load()
    fld = density_field(make_random_splat(10, seed=1), FieldConfig(resolution=10))
    assert fld.backend == "torch"


@pytest.mark.skipif(shutil.which("c++") is None, reason="no C++ compiler")
def test_a_failing_build_is_one_clear_error_and_the_auto_paths_fall_back(fresh_cpu_loader, tmp_path, monkeypatch,
                                                                          caplog):  # fmt: skip
    from microdreamer.kernels import cpu

    csrc = tmp_path / "csrc"
    shutil.copytree(fresh_cpu_loader.CSRC, csrc)
    monkeypatch.setattr(fresh_cpu_loader, "CSRC", csrc)
    (csrc / "cpu" / "field.cpp").write_text("this is not C++\n")
    with caplog.at_level("WARNING"):
        assert not cpu.usable()
    assert "building the microdreamer C++ CPU kernels failed" in caplog.text
    assert not cpu.available()  # a failed build is not retried in this process
    with pytest.raises(RuntimeError, match="failed"):
        fresh_cpu_loader.load()
