"""Mesh rasteriser against the brute-force ray-cast reference, analytic cases, and shading checks."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from microdreamer.cameras import Cameras, orbit_cameras
from microdreamer.kernels import cpu as cpu_kernels
from microdreamer.render.mesh import (
    Fragments,
    interpolate,
    rasterize,
    rasterize_depth,
    rasterize_reference,
    render_mesh,
    sample_texture,
)

SAMPLES = Path(__file__).parents[1] / ".." / "shared" / "samples"


def _soup(seed: int, n_vertices: int, n_faces: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    v = torch.rand(n_vertices, 3, generator=g) - 0.5
    f = torch.randint(0, n_vertices, (n_faces, 3), generator=g)
    return v, f


def _random_cameras(seed: int, n: int, width: int, height: int, radius: float = 1.5) -> Cameras:
    g = torch.Generator().manual_seed(seed + 1000)
    el = torch.rand(n, generator=g) * 60 - 30
    az = torch.rand(n, generator=g) * 360
    return orbit_cameras(el, az, radius=radius, width=width, height=height)


def _identity_camera(f: float, width: int, height: int, near: float = 0.01) -> Cameras:
    """A camera at the origin looking down +z (OpenCV axes), principal point at the image centre."""
    K = torch.tensor([[f, 0.0, width / 2], [0.0, f, height / 2], [0.0, 0.0, 1.0]])
    return Cameras(torch.eye(4)[None], K[None], width, height, near=near)


def _shift(cameras: Cameras, dx: float, dy: float) -> Cameras:
    Ks = cameras.Ks.clone()
    Ks[:, 0, 2] += dx
    Ks[:, 1, 2] += dy
    return Cameras(cameras.viewmats, Ks, cameras.width, cameras.height, cameras.near, cameras.far)


def _ambiguous(vertices, faces, cameras, cull=False) -> torch.Tensor:
    """[C, H, W] bool: pixels whose reference face changes when the image shifts by 1e-4 pixel.

    These are pixel centres within ~1e-4 px of an edge or of the line where two faces cross, where
    float32 (ours) and float64 (reference) rounding may legitimately pick different faces."""
    ref = rasterize_reference(vertices, faces, cameras, cull_backfaces=cull).face_id
    amb = torch.zeros_like(ref, dtype=torch.bool)
    for dx, dy in [(1e-4, 0), (-1e-4, 0), (0, 1e-4), (0, -1e-4)]:
        amb |= (
            rasterize_reference(vertices, faces, _shift(cameras, dx, dy), cull_backfaces=cull).face_id != ref
        )
    return amb


def _assert_fragments_close(got: Fragments, ref: Fragments, skip: torch.Tensor) -> None:
    keep = ~skip
    assert torch.equal(got.face_id[keep], ref.face_id[keep])
    torch.testing.assert_close(got.alpha[keep], ref.alpha[keep], rtol=0, atol=0)
    hit = keep & (ref.face_id >= 0)
    # float32 screen-space interpolation vs float64 ray casting: errors ~1e-6 on these well-scaled
    # inputs (measured <= 2e-6); 1e-4 leaves room for thin random triangles
    torch.testing.assert_close(got.bary[hit], ref.bary[hit], rtol=0, atol=1e-4)
    torch.testing.assert_close(got.depth[hit], ref.depth[hit], rtol=1e-5, atol=1e-6)
    empty = keep & (ref.face_id < 0)
    assert (got.bary[empty] == 0).all() and (got.depth[empty] == 0).all()


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("n_faces", [0, 1, 7, 40])
@pytest.mark.parametrize("cull", [False, True])
def test_matches_reference_on_random_soups(seed, n_faces, cull):
    v, f = _soup(seed, 30, n_faces)
    cams = _random_cameras(seed, 3, width=19, height=13)
    # a tiny max_candidates forces many chunks; the result must not depend on it
    got = rasterize(v, f, cams, cull_backfaces=cull, max_candidates=37)
    ref = rasterize_reference(v, f, cams, cull_backfaces=cull)
    skip = _ambiguous(v, f, cams, cull)
    assert skip.float().mean() < 0.05  # sanity: only a few pixels sit on an edge
    _assert_fragments_close(got, ref, skip)
    assert got.face_id.shape == (3, 13, 19) and got.bary.shape == (3, 13, 19, 3)
    assert got.depth.shape == (3, 13, 19, 1) and got.alpha.shape == (3, 13, 19, 1)


def test_matches_reference_on_closed_mesh_with_big_and_small_faces():
    import trimesh

    s = trimesh.creation.icosphere(subdivisions=2, radius=0.55)
    box = trimesh.creation.box(extents=(0.4, 1.6, 0.4))  # faces much larger than the image's pixels
    mesh = trimesh.util.concatenate([s, box])
    v = torch.tensor(mesh.vertices, dtype=torch.float32)
    f = torch.tensor(mesh.faces)
    cams = _random_cameras(7, 2, width=24, height=18, radius=1.2)  # some faces leave the image
    got = rasterize(v, f, cams, max_candidates=500)
    ref = rasterize_reference(v, f, cams)
    _assert_fragments_close(got, ref, _ambiguous(v, f, cams))
    assert got.alpha.mean() > 0.3


def test_result_independent_of_chunking():
    v, f = _soup(3, 50, 60)
    cams = _random_cameras(3, 2, width=40, height=30)
    a = rasterize(v, f, cams, max_candidates=1)
    b = rasterize(v, f, cams, max_candidates=1 << 24)
    for x, y in zip(
        (a.face_id, a.bary, a.depth, a.alpha), (b.face_id, b.bary, b.depth, b.alpha), strict=True
    ):
        assert torch.equal(x, y)


@pytest.mark.parametrize("workers", [2, 3])
def test_camera_groups_on_threads_give_the_same_fragments(workers):
    """Groups of cameras rasterised on threads (PyTorch single-threaded) against one call in this
    thread: every output equal to the bit (the views are independent)."""
    verts, faces = _soup(7, 200, 300)
    cams = _random_cameras(7, 5, 41, 37)
    want = rasterize(verts, faces, cams, cull_backfaces=False, max_candidates=5000, workers=1)
    got = rasterize(verts, faces, cams, cull_backfaces=False, max_candidates=5000, workers=workers)
    for k in ("face_id", "bary", "depth", "alpha"):
        assert torch.equal(getattr(got, k), getattr(want, k)), k
    assert int((want.face_id >= 0).sum()) > 0


CPP = pytest.param(
    "cpp", marks=pytest.mark.skipif(not cpu_kernels.available(), reason="no C++ compiler for the CPU kernels")
)


@pytest.mark.parametrize("backend", ["torch", CPP])
@pytest.mark.parametrize(
    "seed, n_faces, cull, workers",
    [(1, 300, False, 1), (2, 500, True, 2), (3, 1, False, 1), (4, 0, False, 1), (5, 2001, True, 3)]
    + [(s, 777, s % 2 == 0, 2) for s in range(6, 14)],
)
def test_depth_only_rasterisation_equals_the_full_one(seed, n_faces, cull, workers, backend):
    """rasterize_depth (the depth test's buffer, no last pass; PyTorch or the C++ CPU kernel) against
    rasterize: depth and alpha equal to the bit, on random soups (intersecting faces, ties) with and
    without culling. Both follow the same float32 operations on the same projected vertices, so no
    tolerance: a pixel on an edge must fall on the same side."""
    verts, faces = _soup(seed, 150, n_faces)
    cams = _random_cameras(seed, 3, 45, 38)
    want = rasterize(verts, faces, cams, cull_backfaces=cull, max_candidates=7000, workers=1)
    depth, alpha = rasterize_depth(
        verts, faces, cams, cull_backfaces=cull, max_candidates=7000, workers=workers, backend=backend
    )
    assert torch.equal(depth, want.depth) and torch.equal(alpha, want.alpha)
    assert n_faces <= 1 or int(alpha.sum()) > 0


@pytest.mark.parametrize("backend", ["torch", CPP])
def test_depth_only_rasterisation_of_a_closed_mesh_in_the_bake_views(backend):
    """rasterize_depth as the bake calls it (a closed mesh, culling, 26 views of 96^2 around it) equals
    rasterize to the bit."""
    from microdreamer.synthetic import sphere_mesh
    from microdreamer.texture import BakeViewsConfig, bake_cameras

    mesh = sphere_mesh(3)
    verts, faces = torch.from_numpy(mesh.vertices).float(), torch.from_numpy(mesh.faces).long()
    cams = bake_cameras(BakeViewsConfig(size=96), torch.zeros(3), float(verts.norm(dim=-1).max()))
    want = rasterize(verts, faces, cams, cull_backfaces=True)
    depth, alpha = rasterize_depth(verts, faces, cams, cull_backfaces=True, workers=2, backend=backend)
    assert torch.equal(depth, want.depth) and torch.equal(alpha, want.alpha)
    assert 0.1 < float(alpha.mean()) < 0.9


def test_fronto_parallel_quad_covers_known_pixels_at_known_depth():
    W, H, fpx, z = 16, 11, 10.0, 2.0
    cam = _identity_camera(fpx, W, H)
    u0, u1, v0, v1 = 3.2, 10.7, 2.6, 7.3  # rectangle in pixel coordinates

    def world(u, v):
        return [(u - W / 2) * z / fpx, (v - H / 2) * z / fpx, z]

    verts = torch.tensor([world(u0, v0), world(u1, v0), world(u1, v1), world(u0, v1)])
    faces = torch.tensor([[0, 1, 2], [0, 2, 3]])
    fr = rasterize(verts, faces, cam)
    expect = torch.zeros(H, W)
    expect[3:7, 3:11] = 1  # centres x + 0.5 in [3.2, 10.7] -> x = 3..10; y + 0.5 in [2.6, 7.3] -> 3..6
    assert torch.equal(fr.alpha[0, ..., 0], expect)
    torch.testing.assert_close(fr.depth[0, ..., 0], expect * z, rtol=0, atol=1e-6)
    assert set(fr.face_id[0][expect.bool()].tolist()) == {0, 1}


def test_tilted_plane_depth_is_perspective_correct():
    # plane z = 2 + 0.5 x (camera space); the ray through normalised coords (a, b) hits it at
    # depth t = 2 / (1 - 0.5 a). Linear interpolation of z in screen space would be wrong.
    W, H, fpx = 24, 24, 12.0
    cam = _identity_camera(fpx, W, H)
    pts = [(-1.0, -1.0), (1.0, -1.0), (1.0, 1.0), (-1.0, 1.0)]  # corner rays (a, b)
    verts = []
    for a, b in pts:
        t = 2.0 / (1 - 0.5 * a)
        verts.append([a * t, b * t, t])
    fr = rasterize(torch.tensor(verts), torch.tensor([[0, 1, 2], [0, 2, 3]]), cam)
    xs = (torch.arange(W) + 0.5 - W / 2) / fpx
    expect = (2.0 / (1 - 0.5 * xs)).expand(H, W)
    assert fr.alpha.all()  # the plane fills the image (corner rays at a, b = +-1 reach beyond it)
    torch.testing.assert_close(fr.depth[0, ..., 0], expect, rtol=1e-5, atol=0)


def _slab_hit(origin, dirs, lo, hi):
    """Ray / axis-aligned box: entry distance t per ray (inf on a miss). dirs [P, 3] with z = 1."""
    with torch.no_grad():
        inv = 1.0 / dirs
        t1, t2 = (lo - origin) * inv, (hi - origin) * inv
        tnear = torch.minimum(t1, t2).amax(-1)
        tfar = torch.maximum(t1, t2).amin(-1)
        return torch.where((tnear <= tfar) & (tnear > 0), tnear, torch.full_like(tnear, math.inf))


def test_cube_depth_matches_ray_casting():
    import trimesh

    box = trimesh.creation.box(extents=(1.0, 1.0, 1.0))
    v = torch.tensor(box.vertices, dtype=torch.float32)
    f = torch.tensor(box.faces)
    cams = orbit_cameras(
        torch.tensor([-35.0, 20.0]), torch.tensor([30.0, 200.0]), radius=3.0, width=48, height=40
    )
    fr = rasterize(v, f, cams)
    for c in range(2):
        # rays in world space through every pixel centre (float64)
        c2w = torch.linalg.inv(cams.viewmats[c].double())
        ys, xs = torch.meshgrid(torch.arange(40.0) + 0.5, torch.arange(48.0) + 0.5, indexing="ij")
        pix = torch.stack([xs, ys, torch.ones_like(xs)], -1).reshape(-1, 3).double()
        d_cam = torch.linalg.solve(cams.Ks[c].double(), pix.T).T  # camera-space ray with z = 1
        d_world = d_cam @ c2w[:3, :3].T
        o = c2w[:3, 3]
        one = torch.ones(3, dtype=torch.float64)
        t = _slab_hit(o, d_world, -0.5 * one, 0.5 * one)
        t_in = _slab_hit(o, d_world, (-0.5 + 1e-4) * one, (0.5 - 1e-4) * one)
        t_out = _slab_hit(o, d_world, (-0.5 - 1e-4) * one, (0.5 + 1e-4) * one)
        clear = torch.isfinite(t_in) == torch.isfinite(t_out)  # not within 1e-4 of the silhouette
        hit = torch.isfinite(t).reshape(40, 48)
        assert clear.float().mean() > 0.95
        assert torch.equal(fr.alpha[c, ..., 0].bool()[clear.reshape(40, 48)], hit[clear.reshape(40, 48)])
        depth = torch.where(hit, t.reshape(40, 48), 0.0).float()  # t is the depth since d_cam z = 1
        torch.testing.assert_close(fr.depth[c, ..., 0][hit], depth[hit], rtol=1e-5, atol=0)


def test_face_ids_and_barycentrics_reproduce_positions():
    import trimesh

    s = trimesh.creation.icosphere(subdivisions=3, radius=0.6)
    v = torch.tensor(s.vertices, dtype=torch.float32)
    f = torch.tensor(s.faces)
    cams = _random_cameras(11, 3, width=64, height=48, radius=2.0)
    fr = rasterize(v, f, cams)
    covered = fr.face_id >= 0
    pos = interpolate(v, fr, f)  # [C, H, W, 3] world positions
    cam_pts = (
        torch.einsum("cij,chwj->chwi", cams.viewmats[:, :3, :3], pos) + cams.viewmats[:, None, None, :3, 3]
    )
    uvz = torch.einsum("cij,chwj->chwi", cams.Ks, cam_pts)
    uv = uvz[..., :2] / uvz[..., 2:3]
    ys, xs = torch.meshgrid(torch.arange(48.0) + 0.5, torch.arange(64.0) + 0.5, indexing="ij")
    centres = torch.stack([xs, ys], -1).expand(3, 48, 64, 2)
    # the interpolated surface point projects back onto the pixel centre (float32 at ~64 px: 1e-3)
    torch.testing.assert_close(uv[covered], centres[covered], rtol=0, atol=1e-3)
    torch.testing.assert_close(cam_pts[..., 2][covered], fr.depth[..., 0][covered], rtol=1e-5, atol=0)
    # the visible point is on the near side: its normal faces the camera
    assert covered.float().mean() > 0.2


def test_shared_edges_leave_no_cracks():
    # A plane cut into triangles whose edges and diagonals pass through pixel centres: such pixels
    # belong to both faces of the edge (inclusive test), so no pixel is left uncovered.
    W = H = 16
    fpx, z = 10.0, 3.0
    cam = _identity_camera(fpx, W, H)
    step, n = 3, 7
    # vertices at pixel coordinates -1.5, 1.5, 4.5, ..., 19.5: beyond the image on every side
    coords = torch.tensor([-1.5 + step * i for i in range(n + 1)], dtype=torch.float32)
    gu, gv = torch.meshgrid(coords, coords, indexing="xy")
    verts = torch.stack([(gu - W / 2) * z / fpx, (gv - H / 2) * z / fpx, torch.full_like(gu, z)], -1)
    verts = verts.reshape(-1, 3)
    faces = []
    m = n + 1
    for j in range(n):
        for i in range(n):
            a, b, c, d = j * m + i, j * m + i + 1, (j + 1) * m + i + 1, (j + 1) * m + i
            faces += [[a, b, c], [a, c, d]] if (i + j) % 2 else [[a, b, d], [b, c, d]]
    fr = rasterize(verts, torch.tensor(faces), cam)
    assert fr.alpha.all()


def test_shared_edge_functions_are_exact_negatives():
    # the rasteriser evaluates each edge with its end points in canonical order, so two faces sharing
    # an edge get bitwise opposite values at any point: the basis of crack-free coverage
    from microdreamer.render.mesh import _canonical_edges, _edge_values

    g = torch.Generator().manual_seed(0)
    p = torch.rand(4, 2, generator=g) * 100  # projected vertices 0..3; faces (0, 1, 2) and (2, 1, 3)
    faces = torch.tensor([[0, 1, 2], [2, 1, 3]])
    start, direction, sign = _canonical_edges(p[faces], faces)
    q = torch.rand(2, 1000, generator=g) * 100
    w = _edge_values(start, direction, sign, q[0].expand(2, -1), q[1].expand(2, -1))  # [2, 1000, 3]
    # edge (1, 2) is opposite vertex 0 in face 0 and opposite vertex 3 (slot 2) in face 1
    assert torch.equal(w[0, :, 0], -w[1, :, 2])


def test_skips_faces_behind_or_crossing_the_near_plane():
    cam = _identity_camera(10.0, 8, 8, near=0.1)
    behind = torch.tensor([[-1.0, -1.0, -2.0], [1.0, -1.0, -2.0], [0.0, 1.0, -2.0]])
    crossing = torch.tensor([[-1.0, -1.0, 0.05], [1.0, -1.0, 2.0], [0.0, 1.0, 2.0]])
    for tri in (behind, crossing):
        fr = rasterize(tri, torch.tensor([[0, 1, 2]]), cam)
        ref = rasterize_reference(tri, torch.tensor([[0, 1, 2]]), cam)
        assert (fr.face_id == -1).all() and (ref.face_id == -1).all()


def test_rejects_bad_inputs():
    cam = _identity_camera(10.0, 8, 8)
    with pytest.raises(ValueError, match="faces index range"):
        rasterize(torch.zeros(3, 3), torch.tensor([[0, 1, 3]]), cam)
    with pytest.raises(ValueError, match="vertices must be"):
        rasterize(torch.zeros(3, 2), torch.tensor([[0, 1, 2]]), cam)


def test_barycentric_gradients_flow_to_vertices():
    # moving the whole fronto-parallel quad by dz moves every covered pixel's depth by dz
    W, H, fpx, z = 12, 10, 10.0, 2.0
    cam = _identity_camera(fpx, W, H)
    verts = torch.tensor([[-0.8, -0.7, z], [0.8, -0.7, z], [0.8, 0.7, z], [-0.8, 0.7, z]], requires_grad=True)
    fr = rasterize(verts, torch.tensor([[0, 1, 2], [0, 2, 3]]), cam)
    fr.depth.sum().backward()
    n_covered = fr.alpha.sum()
    torch.testing.assert_close(verts.grad[:, 2].sum(), n_covered, rtol=1e-5, atol=0)


# --------------------------------------------------------------------------------------------
# shading


@pytest.mark.parametrize("seed", [0, 1])
def test_sample_texture_matches_grid_sample(seed):
    g = torch.Generator().manual_seed(seed)
    tex = torch.rand(7, 9, 4, generator=g)
    # keep samples at least half a texel inside, where wrapping and border handling do not matter
    lo, span = torch.tensor([0.5 / 9, 0.5 / 7]), torch.tensor([1 - 1 / 9, 1 - 1 / 7])
    uv = torch.rand(100, 2, generator=g) * span + lo
    got = sample_texture(tex, uv)
    grid = torch.stack([uv[:, 0] * 2 - 1, 1 - 2 * uv[:, 1]], -1)  # grid_sample: y = -1 is the top row
    ref = torch.nn.functional.grid_sample(
        tex.permute(2, 0, 1)[None], grid[None, None], mode="bilinear", align_corners=False
    )[0, :, 0].T
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-6)
    # repeat wrapping: integer shifts of uv sample the same colour (float32 rounding of uv + k: 1e-5)
    torch.testing.assert_close(sample_texture(tex, uv + torch.tensor([1.0, -2.0])), got, rtol=0, atol=1e-5)


@pytest.mark.parametrize("seed,shape", [(0, (7, 9)), (1, (1, 5)), (2, (16, 16))])
def test_bilinear_taps_reproduce_sample_texture_and_its_gradient(seed, shape):
    """Precomputed taps (refine_texture's fixed geometry) give sample_texture's values and texture
    gradient on random coordinates, wrapping included (uv far outside [0, 1], texel centres, edges)."""
    from microdreamer.render.mesh import bilinear_taps, sample_taps

    g = torch.Generator().manual_seed(seed)
    h, w = shape
    tex = torch.rand(h, w, 3, generator=g, dtype=torch.float64)
    uv = torch.cat([torch.rand(200, 2, generator=g, dtype=torch.float64) * 6 - 3,
                    torch.tensor([[0.5 / w, 1 - 0.5 / h], [0.0, 0.0], [1.0, 1.0]], dtype=torch.float64)])  # fmt: skip
    index, weight = bilinear_taps(uv, h, w)
    assert index.shape == weight.shape == (203, 4) and index.dtype == torch.int64
    assert int(index.min()) >= 0 and int(index.max()) < h * w
    torch.testing.assert_close(weight.sum(-1), torch.ones(203, dtype=torch.float64), rtol=0, atol=1e-12)
    a = tex.clone().requires_grad_(True)
    b = tex.clone().requires_grad_(True)
    want, got = sample_texture(a, uv), sample_taps(b, index, weight)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)  # float64: only the summation order differs
    probe = torch.rand(203, 3, generator=g, dtype=torch.float64)
    (want * probe).sum().backward()
    (got * probe).sum().backward()
    torch.testing.assert_close(b.grad, a.grad, rtol=0, atol=1e-12)


def _quad_mesh(**extra):
    from microdreamer.mesh import Mesh

    v = [[-0.5, -0.5, 0.0], [0.5, -0.5, 0.0], [0.5, 0.5, 0.0], [-0.5, 0.5, 0.0]]
    return Mesh(v, [[0, 1, 2], [0, 2, 3]], **extra)


def test_texture_orientation_obj_convention():
    # uv = (x + 0.5, y + 0.5): v grows with world y (up); the image's top-left quadrant is red, so the
    # quad's top-left (world x < 0, y > 0) must render red when seen from +z with y up
    tex = torch.zeros(4, 4, 3)
    tex[:2, :2] = torch.tensor([1.0, 0, 0])  # top-left red
    tex[:2, 2:] = torch.tensor([0, 1.0, 0])  # top-right green
    tex[2:, :2] = torch.tensor([0, 0, 1.0])  # bottom-left blue
    tex[2:, 2:] = torch.tensor([1.0, 1.0, 1.0])  # bottom-right white
    uv = [[0.0, 0.0], [1.0, 0.0], [1.0, 1.0], [0.0, 1.0]]
    mesh = _quad_mesh(uv=uv, texture=(tex * 255).round().to(torch.uint8).numpy())  # as a Mesh holds it
    cam = orbit_cameras(0.0, 0.0, radius=2.0, fovy_deg=40.0, width=64, height=64)
    out = render_mesh(mesh, cam, background=(0.5, 0.5, 0.5))
    # quad spans about 0.5 / (2 tan 20deg) * 64 = 44 px around the centre; sample well inside quadrants
    rgb = out.rgb[0]
    torch.testing.assert_close(rgb[22, 22], torch.tensor([1.0, 0, 0]), rtol=0, atol=1e-6)  # top-left
    torch.testing.assert_close(rgb[22, 42], torch.tensor([0, 1.0, 0]), rtol=0, atol=1e-6)  # top-right
    torch.testing.assert_close(rgb[42, 22], torch.tensor([0, 0, 1.0]), rtol=0, atol=1e-6)  # bottom-left
    torch.testing.assert_close(rgb[42, 42], torch.tensor([1.0, 1, 1]), rtol=0, atol=1e-6)  # bottom-right
    torch.testing.assert_close(rgb[1, 1], torch.tensor([0.5, 0.5, 0.5]))  # background


def test_vertex_colors_background_and_normals():
    import trimesh

    s = trimesh.creation.icosphere(subdivisions=3, radius=0.5)
    from microdreamer.mesh import Mesh

    mesh = Mesh(s.vertices, s.faces, vertex_colors=[[0.2, 0.4, 0.6]] * len(s.vertices))
    cams = _random_cameras(5, 2, width=48, height=48, radius=2.0)
    out = render_mesh(mesh, cams, background=(1.0, 0.0, 1.0))
    inside = out.alpha[..., 0] == 1
    outside = out.alpha[..., 0] == 0
    torch.testing.assert_close(out.rgb[inside], torch.tensor([0.2, 0.4, 0.6]).expand(int(inside.sum()), 3))
    torch.testing.assert_close(out.rgb[outside], torch.tensor([1.0, 0.0, 1.0]).expand(int(outside.sum()), 3))
    # smooth normals of a sphere: close to the radial direction of the surface point (facets of a
    # subdivision-3 icosphere deviate by a few degrees from the true normal: cos > 0.99)
    fr = rasterize(torch.tensor(s.vertices, dtype=torch.float32), torch.tensor(s.faces), cams)
    pos = interpolate(torch.tensor(s.vertices, dtype=torch.float32), fr, torch.tensor(s.faces))
    radial = torch.nn.functional.normalize(pos, dim=-1)
    assert ((out.normals * radial).sum(-1)[inside] > 0.99).all()
    assert (out.normals[outside] == 0).all()
    flat = render_mesh(mesh, cams, smooth_normals=False)
    assert ((flat.normals * radial).sum(-1)[inside] > 0.98).all()


def test_supersampling_gives_fractional_edge_coverage():
    # quad edge at pixel x = 4.5: with 2x2 supersampling, column 4 has sub-sample centres at 4.25 (out)
    # and 4.75 (in) -> alpha 0.5; columns >= 5 are covered fully and columns < 4 not at all
    W, H, fpx, z = 10, 6, 10.0, 2.0
    cam = _identity_camera(fpx, W, H)

    def world(u, v):
        return [(u - W / 2) * z / fpx, (v - H / 2) * z / fpx, z]

    verts = [world(4.5, -5), world(20, -5), world(20, 20), world(4.5, 20)]
    from microdreamer.mesh import Mesh

    mesh = Mesh(verts, [[0, 1, 2], [0, 2, 3]], vertex_colors=[[1.0, 1.0, 1.0]] * 4)
    out = render_mesh(mesh, cam, background=(0.0, 0.0, 0.0), ssaa=2)
    expect = torch.tensor([0, 0, 0, 0, 0.5, 1, 1, 1, 1, 1]).expand(H, W)
    torch.testing.assert_close(out.alpha[0, ..., 0], expect, rtol=0, atol=0)
    torch.testing.assert_close(out.rgb[0, ..., 0], expect, rtol=0, atol=1e-6)  # white over black
    torch.testing.assert_close(out.depth[0, ..., 0], (expect > 0) * z, rtol=0, atol=1e-5)


def test_texture_gradient_is_bilinear_weight_sum():
    tex = torch.rand(8, 8, 3, requires_grad=True)
    quad = _quad_mesh()  # render_mesh takes any object with these attributes; tensors keep autograd
    uv = torch.tensor([[0.0, 0.0], [1.0, 0.0], [1.0, 1.0], [0.0, 1.0]])
    mesh = SimpleNamespace(vertices=quad.vertices, faces=quad.faces, uv=uv, texture=tex)
    cam = orbit_cameras(0.0, 0.0, radius=2.0, width=32, height=32)
    out = render_mesh(mesh, cam)
    (out.rgb * out.alpha).sum().backward()
    # each covered pixel's four bilinear weights sum to 1 per channel
    torch.testing.assert_close(tex.grad.sum(), out.alpha.sum() * 3, rtol=1e-5, atol=0)


def test_empty_mesh_renders_background():
    from microdreamer.mesh import Mesh

    mesh = Mesh(torch.zeros(0, 3).numpy(), torch.zeros(0, 3, dtype=torch.int64).numpy())
    cams = _random_cameras(0, 2, 8, 8)
    out = render_mesh(mesh, cams, background=(0.1, 0.2, 0.3))
    torch.testing.assert_close(out.rgb, torch.tensor([0.1, 0.2, 0.3]).expand(2, 8, 8, 3))
    assert (out.alpha == 0).all() and (out.depth == 0).all()


def test_renders_spot_sample():
    obj = SAMPLES / "meshes" / "spot" / "spot_triangulated.obj"
    if not obj.exists():
        pytest.skip(f"sample mesh {obj} is absent")
    from microdreamer.mesh.load import load_textured_mesh

    mesh = load_textured_mesh(obj, SAMPLES / "meshes" / "spot" / "spot_texture.png")
    cams = orbit_cameras(
        torch.tensor([-15.0, 10.0]), torch.tensor([0.0, 120.0]), radius=3.0, width=48, height=48
    )
    out = render_mesh(mesh, cams, ssaa=2)
    assert 0.1 < float(out.alpha.mean()) < 0.9
    assert out.rgb.min() >= 0 and out.rgb.max() <= 1


def _uv_sphere(n_lat: int, n_lon: int, radius: float) -> tuple[torch.Tensor, torch.Tensor]:
    """A closed latitude/longitude sphere without trimesh: ([V, 3] float32, [F, 3] int64)."""
    theta = torch.linspace(0, math.pi, n_lat + 1)[1:-1]
    phi = torch.arange(n_lon) * (2 * math.pi / n_lon)
    t, p = torch.meshgrid(theta, phi, indexing="ij")
    ring = torch.stack([t.sin() * p.cos(), t.cos(), t.sin() * p.sin()], -1).reshape(-1, 3)
    v = torch.cat([torch.tensor([[0.0, 1, 0]]), ring, torch.tensor([[0.0, -1, 0]])]) * radius
    faces = []
    last = 1 + (n_lat - 1) * n_lon
    for j in range(n_lon):
        k = (j + 1) % n_lon
        faces += [[0, 1 + k, 1 + j], [last, 1 + (n_lat - 2) * n_lon + j, 1 + (n_lat - 2) * n_lon + k]]
        for i in range(n_lat - 2):
            a, b = 1 + i * n_lon + j, 1 + i * n_lon + k
            faces += [[a, b, b + n_lon], [a, b + n_lon, a + n_lon]]
    return v, torch.tensor(faces)


@pytest.mark.cuda
def test_cuda_matches_cpu():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from microdreamer.mesh import Mesh

    v, f = _uv_sphere(40, 80, 0.5)  # 6.3k faces
    v2, f2 = _uv_sphere(6, 12, 0.3)  # a second, intersecting sphere
    f = torch.cat([f, f2 + v.shape[0]])
    v = torch.cat([v, v2 * torch.tensor([3.0, 1.0, 1.0])])
    cams = _random_cameras(2, 4, width=128, height=96, radius=2.0)
    cpu = rasterize(v, f, cams)
    gpu = rasterize(v.cuda(), f.cuda(), cams.to("cuda"))
    same = gpu.face_id.cpu() == cpu.face_id
    # GPU arithmetic (fused multiply-add) may flip pixel centres within ~1e-6 px of an edge
    assert same.float().mean() > 0.999
    hit = same & (cpu.face_id >= 0)
    assert hit.float().mean() > 0.2
    torch.testing.assert_close(gpu.bary.cpu()[hit], cpu.bary[hit], rtol=0, atol=1e-4)
    torch.testing.assert_close(gpu.depth.cpu()[hit], cpu.depth[hit], rtol=1e-5, atol=0)
    mesh = Mesh(v.numpy(), f.numpy(), vertex_colors=(v * 0.5 + 0.5).clamp(0, 1).numpy())
    a = render_mesh(mesh, cams, ssaa=2)
    b = render_mesh(mesh, cams.to("cuda"), ssaa=2)
    # a flipped edge sub-sample changes a pixel by at most 1/4 of a colour difference
    assert (b.rgb.cpu() - a.rgb).abs().gt(1e-4).float().mean() < 0.001


def _grey_cube():
    """A unit cube (no colour), faces wound outward, flat-shaded by keeping each face's own corners."""
    import trimesh

    from microdreamer.mesh import Mesh

    box = trimesh.creation.box(extents=(1.0, 1.0, 1.0))
    tri = box.vertices[box.faces].reshape(-1, 3)  # unshared corners: sharp edges, one normal per face
    return Mesh(tri, torch.arange(len(tri)).reshape(-1, 3).numpy())


def test_uncoloured_mesh_is_shaded_head_light():
    """A mesh without colour renders shaded, not as a flat grey silhouette: seen from azimuth 20, the
    cube's +z face (20 degrees from the view) is brighter than its +x face (70 degrees, grazing), each
    at ambient + (1 - ambient) cos(angle) times the grey, and the image has more than one grey level."""
    from microdreamer.render.mesh import AMBIENT

    mesh = _grey_cube()
    cam = orbit_cameras(0.0, 20.0, radius=3.0, fovy_deg=40.0, width=96, height=96)
    out = render_mesh(mesh, cam, background=(1.0, 1.0, 1.0), smooth_normals=False)
    inside = out.alpha[0, ..., 0] == 1
    levels = torch.unique((out.rgb[0][inside] * 255).round(), dim=0)
    assert len(levels) > 1, "flat silhouette"
    front = out.normals[0, ..., 2] > 0.99  # the +z face
    side = out.normals[0, ..., 0] > 0.99  # the +x face
    assert int((front & inside).sum()) > 50 and int((side & inside).sum()) > 20
    grey_front = out.rgb[0][front & inside].mean(0)
    grey_side = out.rgb[0][side & inside].mean(0)
    assert (grey_front > grey_side + 0.2).all(), (grey_front, grey_side)
    # the head-light law per pixel: grey * (ambient + (1 - ambient) cos), cos between the face normal
    # and the direction from the pixel's surface point (interpolated vertex positions) to the camera
    frags = rasterize(torch.as_tensor(mesh.vertices), torch.as_tensor(mesh.faces), cam)
    pos = interpolate(torch.as_tensor(mesh.vertices), frags, torch.as_tensor(mesh.faces))[0]
    to_cam = torch.nn.functional.normalize(cam.camera_centers()[0] - pos, dim=-1)
    cos = (out.normals[0] * to_cam).sum(-1).clamp_min(0)
    want = 0.7 * (AMBIENT + (1 - AMBIENT) * cos)
    torch.testing.assert_close(out.rgb[0, ..., 0][inside], want[inside], rtol=0, atol=1e-5)
    # unlit on request: every covered pixel is the default grey
    flat = render_mesh(mesh, cam, lighting_mode="unlit")
    torch.testing.assert_close(flat.rgb[0][inside], torch.full((int(inside.sum()), 3), 0.7))


def test_fixed_light_does_not_depend_on_the_view_and_colour_stays_unlit():
    """With a fixed world light a face has one brightness from every camera that sees it; a mesh with
    vertex colours keeps its colours exactly (auto lights only meshes without colour)."""
    from microdreamer.render.mesh import AMBIENT, has_color

    mesh = _grey_cube()
    assert not has_color(mesh)
    cams = orbit_cameras(torch.tensor([-30.0, -30.0]), torch.tensor([20.0, 60.0]), 3.0, 40.0, 64, 64)
    light = (0.0, 1.0, 0.0)  # straight up: the top face full brightness, the sides ambient only
    out = render_mesh(mesh, cams, smooth_normals=False, light_direction=light)
    inside = out.alpha[..., 0] == 1
    top = (out.normals[..., 1] > 0.99) & inside
    sides = (out.normals[..., 1].abs() < 0.01) & inside
    assert top[0].sum() > 20 and top[1].sum() > 20
    torch.testing.assert_close(out.rgb[top], torch.full((int(top.sum()), 3), 0.7), rtol=0, atol=1e-5)
    torch.testing.assert_close(
        out.rgb[sides], torch.full((int(sides.sum()), 3), 0.7 * AMBIENT), rtol=0, atol=1e-5
    )
    coloured = type(mesh)(mesh.vertices, mesh.faces, vertex_colors=[[0.2, 0.4, 0.6]] * mesh.num_vertices)
    assert has_color(coloured)
    lit = render_mesh(coloured, cams, light_direction=light)
    torch.testing.assert_close(lit.rgb[inside], torch.tensor([0.2, 0.4, 0.6]).expand(int(inside.sum()), 3))
