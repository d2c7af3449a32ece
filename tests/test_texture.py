"""Tests of the texture stage: unwrap, texel sampling, fill/dilation, both bakes, refinement (CPU, fast)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from microdreamer.cameras import centred_orbit_cameras, framing, orbit_cameras
from microdreamer.errors import InputError
from microdreamer.field import FieldConfig
from microdreamer.mesh import Mesh
from microdreamer.splat import Splat
from microdreamer.synthetic import (
    CUBE_SIDE_COLORS,
    cube_side_of_vertices,
    position_color,
    position_colored_sphere,
    sphere_mesh,
    surface_splat,
    textured_cube,
)
from microdreamer.texture import (
    BakeConfig,
    BakeViewsConfig,
    RefineConfig,
    TexelSamples,
    TextureConfig,
    bake_cameras,
    bake_field,
    bake_views,
    colour_field,
    colour_field_reference,
    fill_texture,
    mesh_render_fn,
    refine_texture,
    texel_samples,
    texture_mesh,
    unwrap,
)
from microdreamer.texture.atlas import rasterize_uv
from microdreamer.texture.field_bake import prepared_with_colors

pytest.importorskip("xatlas", reason="the texture stage needs xatlas (pip install xatlas)")

# ---------------------------------------------------------------------------------------------------
# input builders (shared with benchmarks/bench_bake.py)


def random_splat(n: int, seed: int) -> Splat:
    g = torch.Generator().manual_seed(seed)
    return Splat.from_activated(
        torch.rand(n, 3, generator=g) - 0.5,
        0.02 + 0.15 * torch.rand(n, 3, generator=g),
        torch.randn(n, 4, generator=g),
        0.1 + 0.85 * torch.rand(n, generator=g),
        torch.rand(n, 3, generator=g),
    )


def as_tensors(mesh: Mesh, uv: np.ndarray):
    return torch.from_numpy(mesh.vertices), torch.from_numpy(mesh.faces), torch.from_numpy(uv)


def heldout_cameras(center, radius, size: int, n: int = 8, seed: int = 5):
    g = torch.Generator().manual_seed(seed)
    el = -30 + 60 * torch.rand(n, generator=g)
    az = 360 * torch.rand(n, generator=g)
    return centred_orbit_cameras(el, az, center, radius, 49.1, size, 1.05)


def masked_psnr(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> float:
    """PSNR (dB) over the pixels where mask > 0, all views together."""
    m = (mask[..., 0] > 0).float()
    mse = ((a - b) ** 2).mean(-1).mul(m).sum() / m.sum()
    return float(-10 * torch.log10(mse))


# ---------------------------------------------------------------------------------------------------
# unwrap


def coverage_counts(uv: np.ndarray, faces: np.ndarray, size: int, margin: float = 1e-3) -> np.ndarray:
    """[size, size] how many UV triangles strictly contain each texel centre (brute force, float64):
    every edge function must exceed ``margin`` texels, so texels on shared edges count once or not."""
    p = uv.astype(np.float64) * [size, size]
    p[:, 1] = size - p[:, 1]  # row coordinate: v up
    counts = np.zeros((size, size), np.int64)
    ys, xs = np.mgrid[0:size, 0:size] + 0.5
    for tri in p[faces]:
        lo = np.floor(tri.min(0)).astype(int).clip(0, size - 1)
        hi = np.ceil(tri.max(0)).astype(int).clip(0, size - 1)
        qx, qy = xs[lo[1] : hi[1] + 1, lo[0] : hi[0] + 1], ys[lo[1] : hi[1] + 1, lo[0] : hi[0] + 1]
        area = (tri[1, 0] - tri[0, 0]) * (tri[2, 1] - tri[0, 1]) - (tri[1, 1] - tri[0, 1]) * (
            tri[2, 0] - tri[0, 0]
        )
        if abs(area) < 1e-12:
            continue
        inside = np.ones_like(qx, dtype=bool)
        for k in range(3):
            a, b = tri[k], tri[(k + 1) % 3]
            e = ((b[0] - a[0]) * (qy - a[1]) - (b[1] - a[1]) * (qx - a[0])) * np.sign(area)
            inside &= e / np.hypot(*(b - a)) > margin
        counts[lo[1] : hi[1] + 1, lo[0] : hi[0] + 1] += inside
    return counts


@pytest.mark.parametrize("chart_iterations", [0, 1])
def test_unwrap_gives_uvs_in_the_unit_square_without_overlaps(chart_iterations):
    mesh = sphere_mesh(2)
    layout = unwrap(mesh, max_faces=None, texture_size=256, chart_iterations=chart_iterations)
    out = layout.mesh
    assert out.num_faces == mesh.num_faces
    assert layout.uv.shape == (out.num_vertices, 2) and layout.uv.dtype == np.float32
    assert layout.uv.min() >= 0.0 and layout.uv.max() <= 1.0
    # same faces, same order and winding; vertices are copies of the input's
    np.testing.assert_array_equal(layout.source_vertex[out.faces], mesh.faces)
    np.testing.assert_array_equal(out.vertices, mesh.vertices[layout.source_vertex])
    # no texel centre lies strictly inside two UV triangles
    counts = coverage_counts(layout.uv, out.faces, 256)
    assert counts.max() == 1
    assert counts.sum() > 0.3 * 256 * 256  # charts cover a fair share of the atlas
    # no degenerate (zero-area) UV triangles
    tri = layout.uv[out.faces].astype(np.float64)
    e1, e2 = tri[:, 1] - tri[:, 0], tri[:, 2] - tri[:, 0]
    area = np.abs(e1[:, 0] * e2[:, 1] - e1[:, 1] * e2[:, 0]) / 2
    assert area.min() > 0


def test_unwrap_caps_the_face_count_first():
    mesh = sphere_mesh(4)  # 5120 faces
    layout = unwrap(mesh, max_faces=600, texture_size=128)
    assert layout.stats["faces_in"] == 5120
    assert 500 <= layout.mesh.num_faces <= 600  # decimation lands a little under its target
    assert layout.stats["charts"] >= 1


def test_unwrap_rejects_an_empty_mesh():
    with pytest.raises(ValueError, match="empty"):
        unwrap(Mesh.empty())


# ---------------------------------------------------------------------------------------------------
# texel samples


@pytest.mark.parametrize("size", [(64, 64), (37, 53)])
def test_texel_samples_match_a_brute_force_reference(size):
    h, w = size
    mesh = sphere_mesh(1)
    layout = unwrap(mesh, max_faces=None, texture_size=64)
    verts, faces, uv = as_tensors(layout.mesh, layout.uv)
    samples = texel_samples(verts, faces, uv, h, w)

    # reference: barycentrics of every texel centre in every UV triangle, float64
    ys, xs = np.mgrid[0:h, 0:w] + 0.5
    q = np.stack([xs.ravel() / w, 1.0 - ys.ravel() / h], -1)  # texel centres in UV
    tri = layout.uv.astype(np.float64)[layout.mesh.faces]  # [F, 3, 2]
    v0, e1, e2 = tri[:, 0], tri[:, 1] - tri[:, 0], tri[:, 2] - tri[:, 0]
    det = e1[:, 0] * e2[:, 1] - e1[:, 1] * e2[:, 0]
    d = q[:, None, :] - v0[None]
    b1 = (d[..., 0] * e2[:, 1] - d[..., 1] * e2[:, 0]) / det
    b2 = (e1[:, 0] * d[..., 1] - e1[:, 1] * d[..., 0]) / det
    bary = np.stack([1 - b1 - b2, b1, b2], -1)  # [P, F, 3]
    strictly = (bary > 1e-4).all(-1)  # clearly inside
    nearby = (bary > -1e-4).all(-1)  # inside or within rounding of an edge
    fid = np.full(h * w, -1)
    fid[samples.index.numpy()] = samples.face.numpy()
    clear = strictly.sum(1) == 1
    assert clear.sum() > 0.2 * h * w
    want = strictly.argmax(1)
    np.testing.assert_array_equal(fid[clear], want[clear])
    outside = ~nearby.any(1)
    assert (fid[outside] == -1).all()
    # barycentrics and surface points of the clear texels
    pos = {int(t): k for k, t in enumerate(samples.index.tolist())}
    rows = np.array([pos[t] for t in np.nonzero(clear)[0]])
    ref_bary = bary[np.nonzero(clear)[0], want[clear]]
    np.testing.assert_allclose(samples.bary.numpy()[rows], ref_bary, atol=1e-4)  # float32 edge functions
    ref_pts = (ref_bary[:, :, None] * layout.mesh.vertices[layout.mesh.faces[want[clear]]]).sum(1)
    np.testing.assert_allclose(samples.points.numpy()[rows], ref_pts, atol=1e-4)
    # normals: unit, outward on a sphere centred at the origin
    n = samples.normals.numpy()
    np.testing.assert_allclose(np.linalg.norm(n, axis=1), 1.0, atol=1e-5)
    assert ((n * samples.points.numpy()).sum(1) > 0).all()


def test_rasterize_uv_of_an_empty_layout():
    frags = rasterize_uv(torch.zeros(0, 2), torch.zeros(0, 3, dtype=torch.int64), 8, 8)
    assert (frags.face_id == -1).all()


# ---------------------------------------------------------------------------------------------------
# fill and dilation


def synthetic_samples(h: int, w: int, seed: int) -> TexelSamples:
    """A blob of covered texels (two discs) in an h x w atlas with random 3D points."""
    rng = np.random.default_rng(seed)
    ys, xs = np.mgrid[0:h, 0:w]
    covered = ((ys - h * 0.3) ** 2 + (xs - w * 0.3) ** 2 < (0.2 * h) ** 2) | (
        (ys - h * 0.7) ** 2 + (xs - w * 0.65) ** 2 < (0.15 * h) ** 2
    )
    index = torch.from_numpy(np.nonzero(covered.ravel())[0])
    t = index.numel()
    return TexelSamples(
        h, w, index, torch.zeros(t, dtype=torch.int64), torch.full((t, 3), 1 / 3),
        torch.from_numpy(rng.random((t, 3)).astype(np.float32)), torch.zeros(t, 3),
    )  # fmt: skip


@pytest.mark.parametrize("size", [(24, 20), (33, 47)])
def test_fill_texture_leaves_no_empty_texel(size):
    h, w = size
    samples = synthetic_samples(h, w, seed=h)
    t = len(samples)
    rng = np.random.default_rng(1)
    colors = torch.from_numpy(rng.random((t, 3)).astype(np.float32))
    seen = torch.from_numpy(rng.random(t) < 0.6)
    texture, stats = fill_texture(samples, colors, seen, eps=0.0)  # exact (the default is approximate)
    assert texture.shape == (h, w, 3) and texture.dtype == np.uint8
    assert stats["texels_covered"] == t and stats["texels_seen"] == int(seen.sum())
    assert stats["texels_filled_3d"] == t - int(seen.sum())
    assert stats["texels_dilated"] == h * w - t

    c8 = np.round(colors.numpy() * 255).astype(np.uint8)
    flat = texture.reshape(-1, 3)
    index, s = samples.index.numpy(), seen.numpy()
    np.testing.assert_array_equal(flat[index[s]], c8[s])  # seen texels keep their colour
    # covered but unseen: the colour of the nearest seen surface point (brute-force 3D search)
    pts = samples.points.numpy()
    dist = ((pts[~s, None, :] - pts[None, s, :]) ** 2).sum(-1)
    np.testing.assert_array_equal(flat[index[~s]], c8[s][dist.argmin(1)])
    # outside the charts: the colour of a nearest covered texel in the atlas (ties: any of them)
    covered = np.zeros(h * w, bool)
    covered[index] = True
    cy, cx = np.divmod(index, w)
    for k in np.nonzero(~covered)[0]:
        y, x = divmod(k, w)
        d2 = (cy - y) ** 2 + (cx - x) ** 2
        nearest = index[d2 == d2.min()]
        assert any((flat[k] == flat[j]).all() for j in nearest)


@pytest.mark.parametrize("backend", ["scipy", "torch"])
def test_fill_texture_with_nothing_seen_uses_the_default_colour(backend):
    samples = synthetic_samples(16, 16, seed=0)
    t = len(samples)
    texture, stats = fill_texture(
        samples, torch.zeros(t, 3), torch.zeros(t, dtype=torch.bool), (0.2, 0.4, 0.6), backend=backend
    )
    assert (texture == np.round(np.array([0.2, 0.4, 0.6]) * 255).astype(np.uint8)).all()
    assert stats == {"texels_covered": t, "texels_seen": 0, "texels_filled_3d": t, "texels_dilated": 256 - t}


# ---------------------------------------------------------------------------------------------------
# colour field


def _points_off_the_cutoff(prepared, cutoff_sq: float, n: int, seed: int) -> torch.Tensor:
    """Random points around the Gaussians, dropping those with any q within 1e-3 relative of the
    cutoff: there float32 and float64 may disagree on which side a term falls, which is rounding, not
    an error (each such term is below cutoff_tol * opacity)."""
    g = torch.Generator().manual_seed(seed)
    pts = torch.rand(n, 3, generator=g) * 2.4 - 1.2
    if len(prepared) == 0:
        return pts
    # half of them near Gaussian centres, so that most points reach some Gaussian
    near_mean = prepared.means[torch.randint(len(prepared), (n // 2,), generator=g)]
    pts[: n // 2] = near_mean + 0.15 * torch.randn(n // 2, 3, generator=g)
    d = pts[:, None, :].double() - prepared.means.double()[None]
    u = torch.einsum("nij,pnj->pni", prepared.transforms.double(), d)
    q = (u * u).sum(-1)
    near = ((q - cutoff_sq).abs() < 1e-3 * cutoff_sq).any(1)
    return pts[~near]


@pytest.mark.parametrize("n", [0, 1, 37, 300])
@pytest.mark.parametrize("cell,max_pairs", [(None, 1 << 20), (0.05, 97)])
def test_colour_field_matches_the_float64_reference(n, cell, max_pairs):
    config = FieldConfig()
    splat = random_splat(n, seed=n + 11)
    prepared, grid, colors = prepared_with_colors(splat, config)
    pts = _points_off_the_cutoff(prepared, config.cutoff_sq, 2000, seed=n)
    colour, weight = colour_field(pts, prepared, colors, config.cutoff_sq, cell=cell, max_pairs=max_pairs)
    ref_colour, ref_weight = colour_field_reference(pts, prepared, colors, config.cutoff_sq)
    if n > 0:
        assert (ref_weight > 0).float().mean() > 0.3  # the test points reach many Gaussians
    # float32 sums of at most a few hundred terms: relative 1e-5 of the weight, colours 1e-5 absolute
    np.testing.assert_allclose(weight.double(), ref_weight, rtol=1e-5, atol=1e-7)
    has = ref_weight > 1e-3
    np.testing.assert_allclose(colour.double()[has], ref_colour[has], rtol=0, atol=1e-5)
    assert (colour[ref_weight == 0] == 0).all()


def test_field_bake_reproduces_position_colours():
    splat = surface_splat()
    mesh = sphere_mesh(3)
    layout = unwrap(mesh, max_faces=None, texture_size=128)
    samples = texel_samples(*as_tensors(layout.mesh, layout.uv), 128, 128)
    colors, seen, stats = bake_field(samples, splat)
    assert seen.all() and stats["gaussians"] == 3000
    err = np.abs(colors.numpy() - position_color(samples.points.numpy()))
    # the field blurs the colour over a Gaussian's footprint (sigma 0.025 on a 0.5 sphere): small error
    assert err.mean() < 0.01 and err.max() < 0.05


# ---------------------------------------------------------------------------------------------------
# back-projection bake


def test_bake_reproduces_a_textured_object_from_its_renders():
    gt = position_colored_sphere(3)
    mesh = Mesh(gt.vertices, gt.faces)
    layout = unwrap(mesh, max_faces=None, texture_size=256)
    verts, faces, uv = as_tensors(layout.mesh, layout.uv)
    samples = texel_samples(verts, faces, uv, 256, 256)
    center, radius = framing(verts)
    config = BakeConfig(views=BakeViewsConfig(size=96), view_batch=13)
    cams = bake_cameras(config.views, center, radius)
    assert len(cams) == 26
    colors, seen, stats = bake_views(samples, verts, faces, cams, mesh_render_fn(gt), config)
    assert seen.float().mean() > 0.99  # a convex object: every texel is seen from some view
    texture, _ = fill_texture(samples, colors, seen)
    baked = layout.with_texture(texture)

    held = heldout_cameras(center, radius, 96, n=4)
    from microdreamer.render.mesh import render_mesh

    want = render_mesh(gt, held)
    got = render_mesh(baked, held)
    # measured 61.5 dB (8-bit rounding of the texture alone allows about 59 dB): the floor leaves
    # room for resampling differences, and fails on any misplaced or blurred colour
    assert masked_psnr(got.rgb, want.rgb, want.alpha) > 45.0


@pytest.mark.parametrize("seed, size, views", [(0, 48, 4), (1, 33, 3), (2, 64, 1)])
def test_compacted_accumulation_equals_the_masked_one_to_the_bit(seed, size, views):
    """The CPU's compacted accumulation (only the pairs that pass the cheap tests), on 1-3 threads of
    texel ranges, against the masked one over all c x T pairs (the GPU's): the same sums to the bit,
    on a real mesh's texels with the mesh's raster depth (some of it pushed away, so visibility fails
    there) and random RGBA renders (alpha 0 to 1, some under min_alpha)."""
    from microdreamer.render.mesh import rasterize
    from microdreamer.texture.bake import _accumulate

    gt = position_colored_sphere(3)
    layout = unwrap(Mesh(gt.vertices, gt.faces), max_faces=None, texture_size=96)
    verts, faces, uv = as_tensors(layout.mesh, layout.uv)
    samples = texel_samples(verts, faces, uv, 96, 96)
    center, radius = framing(verts)
    cams = bake_cameras(BakeViewsConfig(size=size), center, radius)[seed : seed + views]
    g = torch.Generator().manual_seed(seed)
    frags = rasterize(verts, faces, cams)
    depth = torch.where(frags.alpha > 0, frags.depth, torch.full_like(frags.depth, math.inf)).reshape(-1)
    depth = depth * torch.where(torch.rand(depth.shape, generator=g) < 0.1, 1.05, 1.0)
    rgba = torch.rand(views * size * size, 4, generator=g)
    rgba[:, :3] *= rgba[:, 3:]  # premultiplied
    config = BakeConfig()
    sums = []
    for compact, workers in ((False, 1), (True, 1), (True, 2), (True, 3)):
        num, den = torch.zeros(len(samples), 3), torch.zeros(len(samples))
        _accumulate(
            samples, cams, rgba, depth, config, num, den, compact=compact, workers=workers, backend="torch"
        )
        sums.append((num, den))
    num_m, den_m = sums[0]
    for num, den in sums[1:]:
        assert torch.equal(num, num_m) and torch.equal(den, den_m)
    assert 0 < int((den_m > 0).sum()) < len(samples)  # some texels seen, some not


def test_bake_puts_each_side_of_an_asymmetric_object_on_the_right_side():

    cube = textured_cube()
    gt = cube
    layout = unwrap(Mesh(cube.vertices, cube.faces), max_faces=None, texture_size=128)
    verts, faces, uv = as_tensors(layout.mesh, layout.uv)
    samples = texel_samples(verts, faces, uv, 128, 128)
    center, radius = framing(verts)
    config = BakeConfig(views=BakeViewsConfig(size=64))
    colors, seen, _ = bake_views(
        samples, verts, faces, bake_cameras(config.views, center, radius), mesh_render_fn(gt), config
    )
    texture, _ = fill_texture(samples, colors, seen)
    baked = layout.with_texture(texture)
    # the colour at each face's centroid UV is the colour of that face's side
    side = cube_side_of_vertices(baked)[baked.faces[:, 0]]
    from microdreamer.mesh.types import sample_texture_numpy

    centroid_uv = baked.uv[baked.faces].mean(1)
    got = sample_texture_numpy(baked.texture_float(), centroid_uv) * 255
    np.testing.assert_allclose(got, CUBE_SIDE_COLORS[side], atol=2.0)  # flat colours: rounding only


def test_bake_config_rejects_bad_values():
    with pytest.raises(ValueError):
        BakeConfig(cos_threshold=1.0)
    with pytest.raises(ValueError):
        BakeViewsConfig(azimuths=0, poles=False)
    with pytest.raises(InputError):
        TextureConfig(mode="paint")
    with pytest.raises(InputError):
        TextureConfig(size=8)
    with pytest.raises(InputError, match="chart_iterations"):
        TextureConfig(chart_iterations=-1)
    assert BakeViewsConfig().num_views == 26


def test_bake_cameras_frame_an_off_centre_object():
    center = torch.tensor([3.0, -1.0, 2.0])
    cams = bake_cameras(BakeViewsConfig(size=64), center, 0.5)
    # the centre projects to the image centre in every view, in front of the camera
    pc = cams.viewmats[:, :3, :3] @ center + cams.viewmats[:, :3, 3]
    pix = (cams.Ks @ pc[:, :, None])[:, :, 0]
    np.testing.assert_allclose((pix[:, :2] / pix[:, 2:]).numpy(), 32.0, atol=1e-3)
    assert (pc[:, 2] > 0).all()


# ---------------------------------------------------------------------------------------------------
# the stage, refinement


def test_texture_mesh_bakes_a_splat_end_to_end():
    splat = surface_splat(2000, scale=0.03)
    mesh = sphere_mesh(3)
    config = TextureConfig(
        size=128, bake=BakeConfig(views=BakeViewsConfig(size=64, azimuths=4, elevations=(0.0,)))
    )
    result = texture_mesh(mesh, splat, config)
    out = result.mesh
    assert out.has_texture and out.texture.shape == (128, 128, 3)
    assert result.stats["views"] == 6 and result.stats["texels_seen"] > 0.9 * result.stats["texels_covered"]
    assert {"unwrap", "texels", "render", "rasterize", "project", "fill"} <= set(result.stats["seconds"])
    # colours at the texels' surface points follow the splat's colour function
    samples = texel_samples(*as_tensors(out, out.uv), 128, 128)
    got = out.texture.reshape(-1, 3)[samples.index.numpy()] / 255.0
    err = np.abs(got - position_color(samples.points.numpy()))
    assert np.median(err) < 0.03  # measured 0.011: blur of splat rendering at 64^2

    none = texture_mesh(mesh, splat, TextureConfig(mode="none"))
    assert none.mesh is mesh


def test_texture_mesh_field_mode_and_refinement_against_the_splat():
    splat = surface_splat(2000, scale=0.03)
    mesh = sphere_mesh(2)
    config = TextureConfig(
        mode="field", size=64, refine=RefineConfig(steps=6, lr=0.02, views=2, batch=1, size=32)
    )
    result = texture_mesh(mesh, splat, config)
    assert result.mesh.texture.shape == (64, 64, 3)
    assert result.stats["refine"]["steps"] == 6 and "refine" in result.stats["seconds"]
    assert "field" in result.stats["seconds"] and "render" not in result.stats["seconds"]
    # refining against the splat's own renders keeps the texture close to the field bake's colours
    samples = texel_samples(*as_tensors(result.mesh, result.mesh.uv), 64, 64)
    got = result.mesh.texture.reshape(-1, 3)[samples.index.numpy()] / 255.0
    assert np.median(np.abs(got - position_color(samples.points.numpy()))) < 0.03


def test_refine_moves_the_texture_towards_the_targets():
    gt = position_colored_sphere(3)
    layout = unwrap(Mesh(gt.vertices, gt.faces), max_faces=None, texture_size=64)
    start = layout.with_texture(np.full((64, 64, 3), 128, np.uint8))  # a wrong, grey texture
    from microdreamer.render.mesh import render_mesh

    def targets(cameras):
        out = render_mesh(gt, cameras, background=(0.0, 0.0, 0.0))
        return torch.cat([out.rgb, out.alpha], -1)

    config = RefineConfig(steps=25, lr=0.05, views=6, batch=2, size=48)
    refined, stats = refine_texture(start, targets, config)
    assert stats["loss_last"] < 0.3 * stats["loss_first"]
    center, radius = framing(torch.from_numpy(gt.vertices))
    held = heldout_cameras(center, radius, 48, n=4)

    want = render_mesh(gt, held)
    before = masked_psnr(render_mesh(start, held).rgb, want.rgb, want.alpha)
    after = masked_psnr(render_mesh(refined, held).rgb, want.rgb, want.alpha)
    assert after > before + 5.0
    np.testing.assert_array_equal(refined.uv, start.uv)
    with pytest.raises(ValueError, match="textured"):
        refine_texture(Mesh(gt.vertices, gt.faces), targets, config)


@pytest.mark.parametrize("normalize", ["covered", "image"])
def test_refine_loss_normalisations_match_hand_computed_means(normalize):
    """First step's loss: the squared error summed over the covered pixels of all views, divided by the
    covered pixels (x 3) or by every pixel of the images (C H W 3, stage 2's whole-image MSE)."""
    from microdreamer.render.mesh import render_mesh

    gt = position_colored_sphere(2)
    layout = unwrap(Mesh(gt.vertices, gt.faces), max_faces=None, texture_size=32)
    start = layout.with_texture(np.full((32, 32, 3), 100, np.uint8))
    cams = orbit_cameras([0.0, 20.0, -30.0], [0.0, 120.0, 250.0], 2.0, 49.1, 24, 24)
    want = render_mesh(gt, cams, background=(0.0, 0.0, 0.0)).rgb

    config = RefineConfig(steps=1, views=3, batch=3, size=24, normalize=normalize)
    _, stats = refine_texture(start, lambda c: render_mesh(gt, c, background=(0.0, 0.0, 0.0)).rgb, config,
                              cameras=cams)  # fmt: skip
    got = render_mesh(start, cams)
    err = (((got.rgb - want) ** 2) * got.alpha).sum()
    den = 3 * got.alpha.sum() if normalize == "covered" else 3 * 3 * 24 * 24
    assert stats["loss_first"] == pytest.approx(float(err / den), rel=1e-5)


def test_refine_on_logits_with_an_anchor_moves_both_to_their_targets():
    """Adam on the texels' logits (stage 2's parametrization): the pool's views and a fixed anchor view
    (its own target and weight) both get closer; texels stay in [0, 1] without clamping."""
    from microdreamer.render.mesh import render_mesh
    from microdreamer.texture.refine import RefineAnchor

    gt = position_colored_sphere(3)
    layout = unwrap(Mesh(gt.vertices, gt.faces), max_faces=None, texture_size=64)
    start = layout.with_texture(np.full((64, 64, 3), 128, np.uint8))
    pool = orbit_cameras([0.0, 0.0, 0.0], [90.0, 180.0, 270.0], 2.0, 49.1, 32, 32)
    front = orbit_cameras([0.0], [0.0], 2.0, 49.1, 32, 32)
    target_front = render_mesh(gt, front, background=(1.0, 1.0, 1.0)).rgb[0]
    anchor = RefineAnchor(front, target_front, weight=1.0)
    config = RefineConfig(
        steps=30, lr=0.2, views=3, batch=3, size=32, parametrization="logit", normalize="image"
    )
    refined, stats = refine_texture(
        start, lambda c: render_mesh(gt, c).rgb, config, cameras=pool, anchor=anchor
    )
    assert stats["loss_last"] < 0.3 * stats["loss_first"]
    for cams in (pool, front):
        want = render_mesh(gt, cams)
        before = masked_psnr(render_mesh(start, cams).rgb, want.rgb, want.alpha)
        after = masked_psnr(render_mesh(refined, cams).rgb, want.rgb, want.alpha)
        assert after > before + 5.0
    np.testing.assert_array_equal(refined.uv, start.uv)


def test_orbit_helpers_agree_with_cameras_module():
    # bake cameras around the origin with margin chosen to give radius 2 are plain orbit cameras
    radius = 2.0 * math.sin(math.radians(49.1) / 2)
    ours = centred_orbit_cameras([10.0], [30.0], torch.zeros(3), radius, 49.1, 32, 1.0)
    ref = orbit_cameras([10.0], [30.0], 2.0, 49.1, 32, 32)
    np.testing.assert_allclose(ours.viewmats.numpy(), ref.viewmats.numpy(), atol=1e-5)


def test_unwrap_reports_the_atlas_size_xatlas_packed_for():
    layout = unwrap(sphere_mesh(3), None, 256, 2, 0)
    stats = layout.stats
    assert stats["atlas_width"] > 0 and stats["atlas_height"] > 0
    # the UVs span the packed atlas: the outermost chart texels reach (nearly) its far edges
    span = layout.uv.max(axis=0) - layout.uv.min(axis=0)
    assert (span > 0.9).all()
