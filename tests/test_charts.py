"""Tests of the normal-clustering unwrap (texture/charts.py) against brute-force references (CPU, fast)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import trimesh

from microdreamer.errors import InputError
from microdreamer.kernels import cpu as cpu_kernels
from microdreamer.mesh import Mesh
from microdreamer.synthetic import noisy_blob
from microdreamer.texture import TextureConfig, texture_mesh
from microdreamer.texture.charts import (
    DIRECTION_SETS,
    coarse_profiles,
    connected_components,
    face_neighbours,
    row_spans,
    slab_extents,
    unwrap_charts,
)

needs_cpp = pytest.mark.skipif(not cpu_kernels.available(), reason="no C++ compiler for the CPU kernels")


# ---------------------------------------------------------------------------------------------------
# input builders (shared with benchmarks/bench_unwrap.py)


def icosphere(subdivisions: int = 3, radius: float = 0.5) -> Mesh:
    t = trimesh.creation.icosphere(subdivisions=subdivisions, radius=radius)
    return Mesh(t.vertices, t.faces)


def noisy_sphere(subdivisions: int = 4, noise: float = 0.03, seed: int = 0) -> Mesh:
    """An icosphere with every vertex moved radially by seeded Gaussian noise (``noise`` of the radius):
    a small stand-in for a captured surface, whose face normals scatter by tens of degrees."""
    m = icosphere(subdivisions)
    rng = np.random.default_rng(seed)
    scale = 1.0 + noise * rng.standard_normal((m.num_vertices, 1))
    return Mesh(m.vertices * scale, m.faces)


def cube() -> Mesh:
    t = trimesh.creation.box()
    return Mesh(t.vertices, t.faces)


def one_face() -> Mesh:
    return Mesh([[0, 0, 0], [1, 0, 0], [0, 1, 0.2]], [[0, 1, 2]])


def two_faces() -> Mesh:
    """Two disconnected triangles facing opposite ways."""
    v = [[0, 0, 0], [1, 0, 0], [0, 1, 0], [3, 0, 1], [3, 1, 1], [4, 0, 1]]
    return Mesh(v, [[0, 1, 2], [3, 4, 5]])


def ramp(turns: float = 1.6, radial: int = 6, around: int = 96, pitch: float = 0.04) -> Mesh:
    """A helical ramp (radii 0.5 to 1, rising ``pitch`` per radian) wound with its normals up: every face
    is within a few degrees of +z, so one direction takes it all and its projection overlaps itself
    after one turn; the unwrap must cut it."""
    r = np.linspace(0.5, 1.0, radial + 1)
    a = np.linspace(0.0, 2 * math.pi * turns, around + 1)
    rr, aa = np.meshgrid(r, a, indexing="ij")
    v = np.stack([rr * np.cos(aa), rr * np.sin(aa), pitch * aa], -1).reshape(-1, 3)
    idx = np.arange(v.shape[0]).reshape(radial + 1, around + 1)
    q0, q1, q2, q3 = idx[:-1, :-1], idx[1:, :-1], idx[1:, 1:], idx[:-1, 1:]
    faces = np.concatenate(
        [np.stack([q0, q1, q2], -1).reshape(-1, 3), np.stack([q0, q2, q3], -1).reshape(-1, 3)]
    )
    return Mesh(v, faces)


def specks(n: int = 120, seed: int = 0) -> Mesh:
    """A unit square (two faces) and ``n`` disconnected triangles a few thousandths across, seeded, some
    of them slivers: at a small atlas most of them are too small to cover a texel centre unmoved."""
    rng = np.random.default_rng(seed)
    v = [np.array([[0, 0, 0], [1, 0, 0], [1, 1, 0], [0, 1, 0]], np.float64)]
    f = [np.array([[0, 1, 2], [0, 2, 3]])]
    for i in range(n):
        centre = rng.random(3) * [1.0, 1.0, 0.2] + [0.0, 0.0, 0.3]
        tri = centre + rng.normal(0.0, 0.004, (3, 3)) * rng.choice([1.0, 0.1], 3)[None, :]
        v.append(tri)
        f.append(np.array([[4 + 3 * i, 5 + 3 * i, 6 + 3 * i]]))
    return Mesh(np.concatenate(v), np.concatenate(f))


MESHES = {
    "one_face": one_face,
    "two_faces": two_faces,
    "cube": cube,
    "sphere": lambda: icosphere(3),
    "noisy_sphere": noisy_sphere,
    "ramp": ramp,
}

# ---------------------------------------------------------------------------------------------------
# brute-force references (float64 NumPy, per face; independent of the scanline code in charts.py)


def chart_of_faces(mesh: Mesh) -> np.ndarray:
    """[F] chart of each face of an unwrapped mesh: its components by shared (split) vertices."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components as components

    f = mesh.faces
    rows = np.repeat(np.arange(len(f)), 3)
    graph = coo_matrix((np.ones(rows.size), (rows, f.ravel())), shape=(len(f), mesh.num_vertices))
    n, label = components((graph @ graph.T).tocsr(), directed=False)
    return label


def texel_corners(uv: np.ndarray, size: int) -> np.ndarray:
    """[V, 2] float64 texel coordinates (x right, y up from the bottom row)."""
    return uv.astype(np.float64) * size


def centre_hits(p: np.ndarray, faces: np.ndarray, size: int, margin: float):
    """(texel index [T], face [T]) of texel centres more than ``margin`` texels inside each triangle."""
    texels, owners = [], []
    for fi, tri in enumerate(p[faces]):
        area = (tri[1, 0] - tri[0, 0]) * (tri[2, 1] - tri[0, 1]) - (tri[1, 1] - tri[0, 1]) * (
            tri[2, 0] - tri[0, 0]
        )
        if abs(area) < 1e-12:
            continue
        lo = np.floor(tri.min(0)).astype(int).clip(0, size - 1)
        hi = np.ceil(tri.max(0)).astype(int).clip(0, size - 1)
        ys, xs = np.mgrid[lo[1] : hi[1] + 1, lo[0] : hi[0] + 1]
        qx, qy = xs + 0.5, ys + 0.5
        inside = np.ones(qx.shape, bool)
        for k in range(3):
            a, b = tri[k], tri[(k + 1) % 3]
            e = ((b[0] - a[0]) * (qy - a[1]) - (b[1] - a[1]) * (qx - a[0])) * np.sign(area)
            inside &= e / np.hypot(*(b - a)) > margin
        texels.append((ys * size + xs)[inside])
        owners.append(np.full(int(inside.sum()), fi))
    return np.concatenate(texels), np.concatenate(owners)


def touched_texels(p: np.ndarray, faces: np.ndarray, size: int, tol: float = 1e-4) -> list[np.ndarray]:
    """Per face, the flat indices of the texel squares that the triangle overlaps by more than ``tol``
    texels (separating axes: x, y and the three edge normals). The tolerance is the float32 rounding of
    the UVs (6e-5 texel at 1024): charts end exactly on texel lines, so squares that only touch one
    count as apart."""
    out = []
    for tri in p[faces]:
        lo = np.floor(tri.min(0)).astype(int).clip(0, size - 1)
        hi = np.ceil(tri.max(0)).astype(int).clip(1, size)
        ys, xs = np.mgrid[lo[1] : hi[1], lo[0] : hi[0]]
        xs, ys = xs.ravel(), ys.ravel()
        keep = (xs < tri[:, 0].max() - tol) & (xs + 1 > tri[:, 0].min() + tol)
        keep &= (ys < tri[:, 1].max() - tol) & (ys + 1 > tri[:, 1].min() + tol)
        corners = np.stack(
            [np.stack([xs + dx, ys + dy], -1) for dx in (0, 1) for dy in (0, 1)], 1
        )  # [n, 4, 2]
        for k in range(3):
            a, b = tri[k], tri[(k + 1) % 3]
            n = np.array([a[1] - b[1], b[0] - a[0]])  # an edge normal
            n = n / np.hypot(*n)
            t_proj = tri @ n
            s_proj = corners @ n
            keep &= (s_proj.min(1) < t_proj.max() - tol) & (s_proj.max(1) > t_proj.min() + tol)
        out.append((ys * size + xs)[keep])
    return out


def check_layout(mesh: Mesh, layout, size: int, padding: int) -> None:
    """The contract and the atlas rules of an unwrap_charts layout, by brute force."""
    out = layout.mesh
    uv = layout.uv
    assert out.num_faces == mesh.num_faces
    assert uv.shape == (out.num_vertices, 2) and uv.dtype == np.float32
    assert uv.min() >= 0.0 and uv.max() <= 1.0
    # faces in the input's order and winding; vertices copies of the input's
    np.testing.assert_array_equal(layout.source_vertex[out.faces], mesh.faces)
    np.testing.assert_array_equal(out.vertices, mesh.vertices[layout.source_vertex])
    p = texel_corners(uv, size)
    tri = p[out.faces]
    signed = 0.5 * ((tri[:, 1, 0] - tri[:, 0, 0]) * (tri[:, 2, 1] - tri[:, 0, 1])
                    - (tri[:, 1, 1] - tri[:, 0, 1]) * (tri[:, 2, 0] - tri[:, 0, 0]))  # fmt: skip
    t3 = mesh.vertices.astype(np.float64)[mesh.faces]
    area3 = 0.5 * np.linalg.norm(np.cross(t3[:, 1] - t3[:, 0], t3[:, 2] - t3[:, 0]), axis=1)
    real = area3 > 1e-9 * area3.max()
    # every UV triangle wound as its face (counter-clockwise), none flat
    assert (signed[real] > 0).all()
    # the area bound: uv area = n . d * (density^2 * 3D area) with n . d in [merge_min_cos, 1]
    scale = signed[real] / (layout.stats["texel_density"] ** 2 * area3[real])
    # tolerance: the float32 rounding of the UVs (half an ulp of 1 per coordinate, in texels) moves
    # each edge, relative to the area, by about perimeter * that / area; plus float64 slack
    perimeter = np.linalg.norm(tri - np.roll(tri, 1, axis=1), axis=-1).sum(1)[real]
    tol = 1e-6 + 2 * (2.0**-24 * size) * perimeter / signed[real]
    assert (scale >= layout.stats["merge_min_cos"] - tol).all() and (scale <= 1 + tol).all()
    # no texel centre inside two triangles (margin: rounding on shared edges)
    texel, _ = centre_hits(p, out.faces, size, margin=1e-3)
    assert np.bincount(texel, minlength=size * size).max() <= 1
    # charts' touched texels at least `padding` texels apart, and from the atlas border
    chart = chart_of_faces(out)
    assert layout.stats["charts"] == chart.max() + 1
    touched = touched_texels(p, out.faces, size)
    owner = np.full(size * size, -1)
    for c in range(chart.max() + 1):
        cells = np.unique(np.concatenate([touched[f] for f in np.nonzero(chart == c)[0]]))
        y, x = np.divmod(cells, size)
        assert x.min() >= padding and y.min() >= padding
        assert x.max() < size - padding and y.max() < size - padding
        # this chart's cells dilated by the padding must not hold another chart's cell
        for dy in range(-padding, padding + 1):
            for dx in range(-padding, padding + 1):
                near = (y + dy) * size + x + dx
                others = owner[near]
                assert ((others == -1) | (others == c)).all(), f"chart {c} within {padding} texels of another"
        owner[cells] = c


# ---------------------------------------------------------------------------------------------------
# the unwrap


@pytest.mark.parametrize("name", list(MESHES))
@pytest.mark.parametrize("packing", ["skyline", "shelf"])
def test_unwrap_charts_layout_rules(name, packing):
    mesh = MESHES[name]()
    size, padding = 128, 2
    layout = unwrap_charts(mesh, texture_size=size, padding=padding, packing=packing)
    check_layout(mesh, layout, size, padding)
    assert layout.stats["faces_in"] == mesh.num_faces
    assert 0.0 < layout.stats["utilization"] < 1.0


@pytest.mark.parametrize("directions,padding", [(6, 0), (14, 1), (26, 3)])
def test_unwrap_charts_settings(directions, padding):
    mesh = noisy_sphere(3, seed=directions)
    layout = unwrap_charts(mesh, texture_size=96, padding=padding, directions=directions, min_cos=0.55)
    check_layout(mesh, layout, 96, padding)
    assert layout.stats["directions"] == directions


def test_unwrap_charts_cuts_a_ramp_that_overlaps_itself():
    mesh = ramp()
    layout = unwrap_charts(mesh, texture_size=128, padding=2)
    # one direction takes every face; one chart would cover its first turn twice
    assert layout.stats["charts"] >= 2 and layout.stats["split_rounds"] >= 1
    check_layout(mesh, layout, 128, 2)


def test_unwrap_charts_keeps_a_noisy_sphere_in_few_charts():
    # 5120 faces whose normals scatter: the smoothing and merging keep the charts near the 14 directions
    layout = unwrap_charts(noisy_sphere(4, noise=0.03), texture_size=256)
    assert layout.stats["charts"] <= 60
    assert layout.stats["utilization"] > 0.35
    cube_layout = unwrap_charts(cube(), texture_size=64)
    assert cube_layout.stats["charts"] == 6  # one per side


@pytest.mark.parametrize("packing", ["skyline", "shelf"])
def test_unwrap_charts_gives_every_tiny_chart_a_texel(packing):
    # specks under a texel each: every chart still covers a texel centre of its own (else the bake
    # would colour it from the gutter fill, i.e. from a neighbouring chart)
    mesh = specks()
    size = 128
    layout = unwrap_charts(mesh, texture_size=size, packing=packing, min_chart_faces=1)
    check_layout(mesh, layout, size, 2)
    chart = chart_of_faces(layout.mesh)
    _, face = centre_hits(texel_corners(layout.uv, size), layout.mesh.faces, size, margin=1e-3)
    covered = np.zeros(chart.max() + 1, bool)
    covered[chart[face]] = True
    assert covered.all(), f"{(~covered).sum()} of {covered.size} charts cover no texel centre"
    # and most specks are tiny at this density: the test exercises the shift
    area_px = layout.stats["texel_density"] ** 2 * 0.004**2
    assert area_px < 1.0


def test_unwrap_charts_is_deterministic():
    mesh = noisy_sphere(3, seed=7)
    a = unwrap_charts(mesh, texture_size=128)
    b = unwrap_charts(mesh, texture_size=128)
    np.testing.assert_array_equal(a.uv, b.uv)
    np.testing.assert_array_equal(a.mesh.faces, b.mesh.faces)
    np.testing.assert_array_equal(a.source_vertex, b.source_vertex)


def test_unwrap_charts_caps_the_face_count_and_carries_colours():
    m = icosphere(4)
    colors = np.random.default_rng(0).random((m.num_vertices, 3)).astype(np.float32)
    layout = unwrap_charts(Mesh(m.vertices, m.faces, colors), max_faces=600, texture_size=128)
    assert layout.stats["faces_in"] == 5120 and 500 <= layout.mesh.num_faces <= 600
    assert layout.mesh.vertex_colors is not None and layout.mesh.vertex_colors.shape == (
        layout.mesh.num_vertices,
        3,
    )


def test_unwrap_charts_rejects_bad_input():
    with pytest.raises(ValueError, match="empty"):
        unwrap_charts(Mesh.empty())
    with pytest.raises(ValueError, match="directions"):
        unwrap_charts(cube(), directions=8)
    with pytest.raises(ValueError, match="min_cos"):
        unwrap_charts(cube(), directions=6, min_cos=0.7)  # beyond the 6 axes' covering cosine 0.577
    with pytest.raises(ValueError, match="merge_min_cos"):
        unwrap_charts(cube(), merge_min_cos=0.6)
    with pytest.raises(ValueError, match="packing"):
        unwrap_charts(cube(), packing="maxrects")


def test_direction_sets_cover_the_sphere():
    g = np.random.default_rng(3).standard_normal((200_000, 3))
    g /= np.linalg.norm(g, axis=1, keepdims=True)
    for dirs, covering in DIRECTION_SETS.values():
        np.testing.assert_allclose(np.linalg.norm(dirs, axis=1), 1.0)
        assert (g @ dirs.T).max(1).min() >= covering


@pytest.mark.slow
def test_unwrap_charts_on_a_real_marching_cubes_mesh():
    from conftest import sample

    t = trimesh.load(sample("meshes/dreamgaussian_reference/creative_tmp/tmp_mesh.glb"), force="mesh")
    mesh = Mesh(t.vertices, t.faces)
    layout = unwrap_charts(mesh, texture_size=256)
    check_layout(mesh, layout, 256, 2)


# ---------------------------------------------------------------------------------------------------
# the pieces against references


def random_mesh(n_vertices: int, n_faces: int, seed: int) -> Mesh:
    rng = np.random.default_rng(seed)
    faces = np.stack([rng.choice(n_vertices, 3, replace=False) for _ in range(n_faces)])
    return Mesh(rng.random((n_vertices, 3)), faces)


@pytest.mark.parametrize("seed", [0, 1])
def test_face_neighbours_pair_faces_across_shared_edges(seed):
    mesh = random_mesh(12, 60, seed)  # many edges shared by three or more faces
    nbr = face_neighbours(torch.from_numpy(mesh.faces)).numpy()
    f = mesh.faces
    edges = {}
    for i in range(len(f)):
        for k in range(3):
            edges.setdefault(frozenset((f[i, k], f[i, (k + 1) % 3])), []).append((i, k))
    for owners in edges.values():
        for i, k in owners:
            j = nbr[i, k]
            if j < 0:
                continue
            # the neighbour holds the same edge and points back
            kj = [
                m
                for m in range(3)
                if frozenset((f[j, m], f[j, (m + 1) % 3])) == frozenset((f[i, k], f[i, (k + 1) % 3]))
            ]
            assert any(nbr[j, m] == i for m in kj)
        paired = sum(nbr[i, k] >= 0 for i, k in owners)
        assert paired == len(owners) - len(owners) % 2  # every edge's faces paired off but one at most
    # a closed manifold mesh: every face has three neighbours
    s = icosphere(2)
    assert (face_neighbours(torch.from_numpy(s.faces)) >= 0).all()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_connected_components_backends_agree_with_a_search(seed):
    mesh = random_mesh(200, 300, seed)
    faces = torch.from_numpy(mesh.faces)
    nbr = face_neighbours(faces)
    same = torch.from_numpy(np.random.default_rng(seed).random((300, 3)) < 0.6)  # need not be symmetric
    a = connected_components(nbr, same, backend="scipy")
    b = connected_components(nbr, same, backend="torch")
    np.testing.assert_array_equal(a.numpy(), b.numpy())
    # reference: repeated relaxation to the smallest index over the graph
    label = np.arange(300)
    pairs = [(i, int(nbr[i, k])) for i in range(300) for k in range(3) if same[i, k] and nbr[i, k] >= 0]
    for _ in range(300):
        old = label.copy()
        for i, j in pairs:
            m = min(label[i], label[j])
            label[i] = label[j] = m
        if (old == label).all():
            break
    np.testing.assert_array_equal(a.numpy(), label)
    if cpu_kernels.available():
        np.testing.assert_array_equal(connected_components(nbr, same, backend="cpp").numpy(), label)


@needs_cpp
@pytest.mark.parametrize("f", [0, 1, 2, 7, 1000])
def test_cpp_components_match_scipy_on_random_graphs(f):
    """The union-find kernel against SciPy's search on random neighbour tables: any face may neighbour any
    other (not only a mesh's), -1 holes, one-way flags, self-loops, chains in descending order (the
    union's hanging of the larger root under the smaller is what names a component by its smallest face)."""
    rng = np.random.default_rng(f)
    nbr = rng.integers(-1, max(f, 1), size=(f, 3)) if f else np.zeros((0, 3), np.int64)
    if f > 2:
        nbr[: f // 4, 0] = np.arange(f // 4) + 1  # a chain 0 - 1 - 2 - ... walked from its far end too
        nbr[f - 1, 1] = f - 1  # a self-loop
    nbr = torch.from_numpy(nbr.astype(np.int64))
    same = torch.from_numpy(rng.random((f, 3)) < 0.5)
    same[: f // 4, 0] = True
    want = connected_components(nbr, same, backend="scipy")
    got = connected_components(nbr, same, backend="cpp")
    assert got.dtype == torch.int64 and got.shape == (f,)
    np.testing.assert_array_equal(got.numpy(), want.numpy())
    np.testing.assert_array_equal(connected_components(nbr, same, backend="torch").numpy(), want.numpy())


@needs_cpp
def test_cpp_components_check_their_inputs():
    nbr = torch.tensor([[1, -1, -1], [0, -1, -1]])
    same = torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match="neighbours must hold faces in 0..1"):
        cpu_kernels.face_components(torch.tensor([[2, -1, -1], [0, -1, -1]]), same)
    with pytest.raises(ValueError, match="neighbours must hold faces in 0..1"):
        cpu_kernels.face_components(torch.tensor([[-2, -1, -1], [0, -1, -1]]), same)
    with pytest.raises(ValueError, match="same must be torch.bool"):
        cpu_kernels.face_components(nbr, same.int())
    with pytest.raises(ValueError, match=r"same must have shape \[2, 3\]"):
        cpu_kernels.face_components(nbr, same[:1])
    with pytest.raises(ValueError, match=r"shape \[F, 3\]"):
        cpu_kernels.face_components(nbr[:, :2], same)
    with pytest.raises(ValueError, match="unknown"):
        connected_components(nbr, same, backend="fast")
    np.testing.assert_array_equal(cpu_kernels.face_components(nbr, same).numpy(), [0, 0])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_row_spans_match_a_brute_force_raster(seed):
    g = torch.Generator().manual_seed(seed)
    w, h = 23, 17
    uv = torch.rand(90, 2, generator=g, dtype=torch.float64) * torch.tensor([w + 4.0, h + 4.0]) - 2.0
    faces = torch.randint(0, 90, (60, 3), generator=g)
    row, x0, x1, face = row_spans(uv, faces, w, h)
    got = {
        (int(f), int(r) * w + x)
        for r, a, b, f in zip(row, x0, x1, face, strict=True)
        for x in range(a, b + 1)
    }

    def reference(margin):  # (face, texel) of the centres more than margin inside, on the w x h grid
        side = max(w, h) + 8
        texel, owner = centre_hits(uv.numpy(), faces.numpy(), side, margin)
        y, x = np.divmod(texel, side)
        ok = (x < w) & (y < h)
        return {(int(f), int(yy) * w + int(xx)) for f, yy, xx in zip(owner[ok], y[ok], x[ok], strict=True)}

    # centres within 1e-4 texel of an edge may fall either way (the two margins differ)
    assert reference(1e-4) <= got <= reference(-1e-4)
    assert len(got) > 100


@pytest.mark.parametrize("ratio", [1.0, 1.37, 2.5])
def test_coarse_profiles_hold_every_touched_texel(ratio):
    # one chart of random triangles in a box; profiles at a density 1 / ratio of the fine slabs
    g = torch.Generator().manual_seed(int(ratio * 10))
    fine_density = 20.0
    uv_world = torch.rand(40, 2, generator=g, dtype=torch.float64)
    uv_world -= uv_world.min(0).values
    faces = torch.stack([torch.randperm(40, generator=g)[:3] for _ in range(30)])  # no repeated corner
    extent = uv_world.max(0).values[None]
    f_size = torch.ceil(extent * fine_density).long().clamp_min(1)
    ext = [
        e.numpy()
        for e in slab_extents(uv_world * fine_density, faces, torch.zeros(30, dtype=torch.int64), f_size)
    ]
    density = fine_density / ratio
    box = np.ceil(extent.numpy() * density - 1e-9).astype(np.int64).clip(min=1)
    sel = np.array([0])
    bottom, top = coarse_profiles(ext[0], ext[1], f_size[:, 0].numpy(), box[:, 0], ratio, box[:, 1], sel)
    left, right = coarse_profiles(ext[2], ext[3], f_size[:, 1].numpy(), box[:, 1], ratio, box[:, 0], sel)
    side = int(box.max()) + 2
    touched = touched_texels(uv_world.numpy() * density, faces.numpy(), side, tol=1e-9)
    cells = np.unique(np.concatenate(touched))
    y, x = np.divmod(cells, side)
    assert (x < box[0, 0]).all() and (y < box[0, 1]).all()
    assert (bottom[x] <= y).all() and (y < top[x]).all()
    assert (left[y] <= x).all() and (x < right[y]).all()
    # and not loose: a fine slab reaches at most one coarse column past its own, so each column's
    # range lies within the rows its neighbours and itself touch
    for c in range(box[0, 0]):
        near = y[np.abs(x - c) <= 1]
        assert near.min() <= bottom[c] and top[c] <= near.max() + 1


# ---------------------------------------------------------------------------------------------------
# the texture stage with each unwrap


def test_texture_config_unwrap_is_validated():
    assert TextureConfig().unwrap == "charts"
    with pytest.raises(InputError, match="unwrap"):
        TextureConfig(unwrap="lscm")


def test_field_bake_round_trip_with_charts_matches_xatlas():
    pytest.importorskip("xatlas", reason="the comparison needs xatlas (pip install xatlas)")
    from microdreamer.cameras import framing
    from microdreamer.mesh.types import sample_texture_numpy
    from microdreamer.render.mesh import render_mesh
    from microdreamer.synthetic import position_color, position_colored_sphere, surface_splat
    from test_texture import heldout_cameras, masked_psnr

    splat = surface_splat()
    gt = position_colored_sphere(3)
    mesh = Mesh(gt.vertices, gt.faces)
    center, radius = framing(torch.from_numpy(mesh.vertices))
    held = heldout_cameras(center, radius, 96, n=6)
    want = render_mesh(gt, held)
    psnr = {}
    for unwrap in ("charts", "xatlas"):
        config = TextureConfig(mode="field", unwrap=unwrap, size=256, max_faces=None)
        result = texture_mesh(mesh, splat, config)
        out = result.mesh
        assert result.stats["unwrap"] == unwrap
        # the texture at each face's centroid is the field's colour there (the field blurs ~0.01)
        centroid = out.vertices[out.faces].mean(1)
        got = sample_texture_numpy(out.texture_float(), out.uv[out.faces].mean(1))
        err = np.abs(got - position_color(centroid))
        assert err.mean() < 0.02, (unwrap, err.mean())
        psnr[unwrap] = masked_psnr(render_mesh(out, held).rgb, want.rgb, want.alpha)
    # measured: charts 59.8 dB, xatlas 60.3 (the 8-bit texture alone limits it to about 59 dB)
    assert psnr["charts"] > 50.0
    assert psnr["charts"] >= psnr["xatlas"] - 1.0, psnr


def test_unwrap_charts_with_the_torch_primitives_matches_numpy(monkeypatch):
    # the integer sorts, uniques and graph search that CUDA tensors take, run here on the CPU
    import microdreamer.texture.charts as charts

    mesh = ramp()
    a = unwrap_charts(mesh, texture_size=128)
    monkeypatch.setattr(charts, "_on_host", lambda x: False)
    b = unwrap_charts(mesh, texture_size=128, backend="torch")  # what auto takes on CUDA
    assert a.stats["charts"] == b.stats["charts"] and a.stats["split_rounds"] == b.stats["split_rounds"]
    np.testing.assert_array_equal(a.source_vertex, b.source_vertex)
    np.testing.assert_array_equal(a.uv, b.uv)


@pytest.mark.cuda
def test_unwrap_charts_on_cuda_matches_the_cpu():
    mesh = noisy_sphere(4, seed=3)
    a = unwrap_charts(mesh, texture_size=256)
    b = unwrap_charts(mesh, texture_size=256, device="cuda")
    assert a.stats["charts"] == b.stats["charts"]
    np.testing.assert_array_equal(a.source_vertex, b.source_vertex)
    np.testing.assert_array_equal(a.mesh.faces, b.mesh.faces)
    np.testing.assert_allclose(a.uv, b.uv, atol=1e-5)
    check_layout(mesh, b, 256, 2)


@pytest.mark.cuda
def test_unwrap_charts_on_cuda_keeps_the_layout_rules_on_a_real_marching_cubes_mesh():
    # the texture stage unwraps on the bake's device: on a GPU, a real mesh of thousands of charts
    from conftest import sample

    t = trimesh.load(sample("meshes/dreamgaussian_reference/creative_tmp/tmp_mesh.glb"), force="mesh")
    mesh = Mesh(t.vertices, t.faces)
    a = unwrap_charts(mesh, texture_size=512)
    b = unwrap_charts(mesh, texture_size=512, device="cuda")
    check_layout(mesh, b, 512, 2)
    # the same charts as on the CPU, up to the order of CUDA's float atomics in the per-chart sums
    assert abs(a.stats["charts"] - b.stats["charts"]) <= 0.01 * a.stats["charts"]
    assert abs(a.stats["utilization"] - b.stats["utilization"]) < 0.02


def random_profiles(rng: np.random.Generator, n: int, most: int):
    """n charts of random blobs (some columns and rows left empty), as coarse_profiles writes them: per
    column (first touched row, one past the last; an empty column is (H, 0)) and the same per row."""
    profiles = []
    for _ in range(n):
        w, h = (int(x) for x in rng.integers(1, most + 1, 2))
        mask = rng.random((h, w)) < rng.uniform(0.3, 1.0)
        mask[rng.integers(h), rng.integers(w)] = True
        any_c, any_r = mask.any(0), mask.any(1)
        bottom = np.where(any_c, np.argmax(mask, 0), h)
        top = np.where(any_c, h - np.argmax(mask[::-1], 0), 0)
        left = np.where(any_r, np.argmax(mask, 1), w)
        right = np.where(any_r, w - np.argmax(mask[:, ::-1], 1), 0)
        profiles.append(tuple(np.asarray(x, np.int64) for x in (bottom, top, left, right)))
    return profiles


def test_compiled_packer_setting_is_validated():
    with pytest.raises(ValueError, match="packer"):
        unwrap_charts(cube(), packer="rust")


@needs_cpp
@pytest.mark.parametrize("seed", range(6))
def test_compiled_skyline_pack_matches_numpy(seed):
    # the C++ loop against the NumPy reference: the same corners, turns and height, exactly; sizes from
    # single texels to charts wider than the coarse search's stride threshold (16 columns), two and four
    # orientations, some charts not turnable, paddings 0-3, ties on flat skylines (all charts equal)
    from microdreamer.texture.charts import compiled_skyline_pack, skyline_pack

    rng = np.random.default_rng(seed)
    n = [1, 7, 40, 120, 300, 64][seed]
    profiles = random_profiles(rng, n, [3, 20, 60, 40, 12, 90][seed])
    if seed == 5:
        profiles = [profiles[0]] * n
    turnable = rng.random(n) < 0.8
    for width, padding, orientations in [(256, 2, 2), (97, 0, 4), (512, 3, 2), (1024, 1, 4)]:
        try:
            want = skyline_pack(profiles, width, padding, turnable, orientations)
        except ValueError as e:
            with pytest.raises(ValueError, match="wider than the atlas"):
                compiled_skyline_pack(profiles, width, padding, turnable, orientations)
            assert "wider than the atlas" in str(e)
            continue
        got = compiled_skyline_pack(profiles, width, padding, turnable, orientations)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])
        assert got[2] == want[2]


@needs_cpp
def test_compiled_skyline_pack_rejects_a_chart_wider_than_the_atlas():
    from microdreamer.texture.charts import compiled_skyline_pack

    wide = (np.zeros(50, np.int64), np.full(50, 60), np.zeros(60, np.int64), np.full(60, 50))
    with pytest.raises(ValueError, match="a chart 50 x 60 texels is wider than the atlas"):
        compiled_skyline_pack([wide], 40, 2)


@needs_cpp
def test_unwrap_charts_with_the_compiled_packer_matches_numpy_on_a_real_mesh():
    from conftest import sample

    t = trimesh.load(sample("meshes/dreamgaussian_reference/creative_tmp/tmp_mesh.glb"), force="mesh")
    mesh = Mesh(t.vertices, t.faces)
    a = unwrap_charts(mesh, texture_size=1024, packer="numpy")
    b = unwrap_charts(mesh, texture_size=1024, packer="compiled")
    assert a.stats["packs"] == b.stats["packs"]
    np.testing.assert_array_equal(a.uv, b.uv)
    np.testing.assert_array_equal(a.mesh.faces, b.mesh.faces)


# ---------------------------------------------------------------------------------------------------
# the C++ slab extents and row spans (the "cpp" backend) against the PyTorch paths


def _awkward_uv(g: torch.Generator, n: int, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
    """[n, 2] float64 points in [lo, hi]: a third on the half-integer lattice (texel centres, slab borders,
    vertical and horizontal edges, repeated points), the rest anywhere."""
    uv = lo + torch.rand(n, 2, generator=g, dtype=torch.float64) * (hi - lo)
    snap = torch.rand(n, generator=g) < 1 / 3
    uv[snap] = torch.round(uv[snap] * 2) / 2
    return uv


@needs_cpp
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_cpp_row_spans_equal_torch(seed):
    """The same runs in the same order, to the bit: random and lattice-snapped triangles, some off the
    grid or degenerate, on odd grid sizes."""
    g = torch.Generator().manual_seed(seed)
    runs = 0
    for w, h, n, f in [(23, 17, 90, 60), (1, 1, 5, 4), (64, 40, 400, 700), (7, 300, 50, 80)]:
        uv = _awkward_uv(g, n, torch.tensor([-3.0, -3.0]), torch.tensor([w + 3.0, h + 3.0]))
        faces = torch.randint(0, n, (f, 3), generator=g)
        faces[: f // 10, 2] = faces[: f // 10, 1]  # degenerate: a repeated corner
        want = row_spans(uv, faces, w, h)
        got = row_spans(uv, faces, w, h, backend="cpp")
        runs += want[0].numel()
        for a, b in zip(want, got, strict=True):
            assert a.dtype == b.dtype == torch.int64
            assert torch.equal(a, b)
    assert runs > 1000
    empty = row_spans(uv, faces[:0], 10, 10, backend="cpp")
    assert all(t.shape == (0,) for t in empty)
    assert all(t.numel() == 0 for t in row_spans(uv, faces, 0, 10, backend="cpp"))


@needs_cpp
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_cpp_run_conflicts_equal_torch(seed):
    """The overlapping pairs of the runs, in the same order: from real row spans of overlapping random
    triangles, and from runs with many equal starts and ends (the stable order and cummax's last-of-equals
    decide which face is paired)."""
    from microdreamer.texture.charts import _conflicts

    g = torch.Generator().manual_seed(seed)
    uv = _awkward_uv(g, 300, torch.tensor([0.0, 0.0]), torch.tensor([40.0, 30.0]))
    faces = torch.randint(0, 300, (400, 3), generator=g)
    spans = row_spans(uv, faces, 40, 30)
    p = 2000
    row = torch.randint(0, 5, (p,), generator=g)
    x0 = torch.randint(0, 8, (p,), generator=g)
    ties = (row, x0, x0 + torch.randint(0, 4, (p,), generator=g), torch.randint(0, 50, (p,), generator=g))
    # starts far from 0 and rows with no runs between others (the counting sorts' ranges)
    sparse = (ties[0] * 3, ties[1] + 500, ties[2] + 500, ties[3])
    # starts spread far wider than the runs are many (the kernel sorts each row instead of counting)
    spread = (ties[0], ties[1] * 10**9, ties[2] + ties[1] * (10**9 - 1), ties[3])
    for runs, width in ((spans, 40), (ties, 12), (sparse, 512), (spread, 8 * 10**9)):
        want = _conflicts(*runs, width)
        got = _conflicts(*runs, width, backend="cpp")
        assert want[0].numel() > 50
        for a, b in zip(want, got, strict=True):
            assert torch.equal(a, b)
    one = [t[:1] for t in ties]
    assert all(t.numel() == 0 for t in _conflicts(*one, 12, backend="cpp"))
    with pytest.raises(ValueError, match="x0 <= x1"):
        cpu_kernels.run_conflicts(ties[0], ties[2], ties[1] - 1, ties[3])
    with pytest.raises(ValueError, match="unknown"):
        _conflicts(*ties, 12, backend="fast")


@needs_cpp
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cpp_slab_extents_equal_torch(seed):
    """Per-chart column and row extents equal to the bit: charts of random and lattice-snapped triangles
    (vertical edges, points on slab borders), one-slab charts included."""
    g = torch.Generator().manual_seed(seed)
    charts, per = 9, 30
    size = torch.randint(1, 12, (charts, 2), generator=g)
    size[0] = torch.tensor([1, 1])
    uv, faces, fchart = [], [], []
    for c in range(charts):
        pts = _awkward_uv(g, per, torch.zeros(2, dtype=torch.float64), size[c].double())
        pts -= pts.min(0).values  # each chart's minimum corner at (0, 0), inside its slabs
        uv.append(pts)
        faces.append(torch.randint(0, per, (2 * per, 3), generator=g) + c * per)
        fchart.append(torch.full((2 * per,), c))
    uv, faces, fchart = torch.cat(uv), torch.cat(faces), torch.cat(fchart)
    want = slab_extents(uv, faces, fchart, size)
    got = slab_extents(uv, faces, fchart, size, backend="cpp")
    for a, b in zip(want, got, strict=True):
        assert a.dtype == b.dtype == torch.float64
        assert torch.equal(a, b)  # inf where a chart does not reach a slab, on both
    assert all(torch.isfinite(a).any() for a in want)


@needs_cpp
def test_cpp_uv_kernels_check_their_inputs():
    uv = torch.rand(4, 2, dtype=torch.float64)
    faces = torch.tensor([[0, 1, 2], [1, 2, 3]])
    with pytest.raises(ValueError, match="uv_px must be torch.float64"):
        cpu_kernels.row_spans(uv.float(), faces, 8, 8)
    with pytest.raises(ValueError, match="indices in 0..3"):
        cpu_kernels.row_spans(uv, faces + 1, 8, 8)
    with pytest.raises(ValueError, match="fchart must hold charts in 0..0"):
        cpu_kernels.slab_extents(uv, faces, torch.tensor([0, 1]), torch.ones(1, 2, dtype=torch.int64))
    with pytest.raises(ValueError, match="at least 1 slab"):
        cpu_kernels.slab_extents(uv, faces, torch.tensor([0, 0]), torch.zeros(1, 2, dtype=torch.int64))
    with pytest.raises(ValueError, match="unknown"):
        row_spans(uv, faces, 8, 8, backend="numpy")
    # a face with a non-finite corner covers nothing (and reads nothing out of bounds)
    g = torch.Generator().manual_seed(5)
    uv = torch.rand(40, 2, generator=g, dtype=torch.float64) * 20
    faces = torch.randint(0, 40, (60, 3), generator=g)
    uv[3] = float("nan")
    uv[7, 0] = float("inf")
    clean = ~(faces == 3).any(1) & ~(faces == 7).any(1)
    assert 0 < int(clean.sum()) < 60
    got = cpu_kernels.row_spans(uv, faces, 24, 24)
    want = cpu_kernels.row_spans(uv, faces[clean].contiguous(), 24, 24)
    assert torch.equal(got[0], want[0]) and torch.equal(clean.nonzero()[:, 0][want[3]], got[3])
    size = torch.full((1, 2), 25, dtype=torch.int64)
    chart = torch.zeros(60, dtype=torch.int64)
    got = cpu_kernels.slab_extents(uv, faces, chart, size)
    want = cpu_kernels.slab_extents(uv, faces[clean].contiguous(), chart[clean].contiguous(), size)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


@needs_cpp
def test_unwrap_charts_backends_give_the_same_layout():
    """unwrap_charts with the C++ slab extents and row spans == with the PyTorch ones, on a noisy
    surface that takes several fold-cutting rounds; the cpp backend refuses another device."""
    mesh = noisy_blob(20_000, noise=0.01)
    a = unwrap_charts(mesh, texture_size=512, backend="torch")
    b = unwrap_charts(mesh, texture_size=512, backend="cpp")
    assert a.stats["split_rounds"] >= 1 and a.stats["packs"] == b.stats["packs"]
    np.testing.assert_array_equal(a.uv, b.uv)
    np.testing.assert_array_equal(a.mesh.faces, b.mesh.faces)
    with pytest.raises(ValueError, match="CPU only"):
        unwrap_charts(mesh, backend="cpp", device="cuda")
