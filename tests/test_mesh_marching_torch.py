"""Tests of the torch mesh path (marching_torch.py, cleanup_torch.py, mc_table.py) against its references:
scikit-image's Lorensen marching cubes (with marching.py's pad, orientation and world mapping) and the
NumPy/SciPy cleanup. CPU here; the ``cuda`` copies run the same checks on a GPU.

Input builders (:func:`microdreamer.synthetic.blobby_field` is shared with benchmarks/bench_marching.py): :func:`smooth_field`,
:func:`sphere_field`, :func:`torus_field`.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from microdreamer.errors import InputError
from microdreamer.mesh import (
    Mesh,
    MeshConfig,
    TensorMesh,
    cleanup_mesh_torch,
    cleanup_mesh_with_stats,
    extract_mesh,
    marching_cubes_torch,
    resolve_mesh_backend,
)
from microdreamer.mesh.marching import _close_boundary_pad

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]

# ---------------------------------------------------------------------------------------------------
# input builders (shared with benchmarks/bench_marching.py)


def smooth_field(shape, seed: int, sigma: float = 1.0) -> np.ndarray:
    """[R0, R1, R2] float32 Gaussian-filtered white noise scaled to unit standard deviation: many
    components and ambiguous cubes at any level near 0."""
    from scipy import ndimage

    g = np.random.default_rng(seed)
    f = ndimage.gaussian_filter(g.normal(size=shape), sigma)
    return (f / max(float(f.std()), 1e-12)).astype(np.float32)


def grid_points(shape) -> np.ndarray:
    """[R0, R1, R2, 3] float64 positions in [-1, 1] per axis (sample i at -1 + 2 i / (R - 1))."""
    axes = [np.linspace(-1.0, 1.0, n) for n in shape]
    return np.stack(np.meshgrid(*axes, indexing="ij"), axis=-1)


def sphere_field(shape, radius: float = 0.6, centre=(0.05, -0.03, 0.02)) -> np.ndarray:
    """[R0, R1, R2] float32, 1 + (radius - distance to centre) / radius: > 1 inside the sphere."""
    d = np.linalg.norm(grid_points(shape) - np.asarray(centre), axis=-1)
    return (1.0 + (radius - d) / radius).astype(np.float32)


def torus_field(shape, major: float = 0.55, minor: float = 0.2) -> np.ndarray:
    """[R0, R1, R2] float32, 1 + (minor - distance to the ring) / minor, the ring in the axis-0/1
    plane: a genus-1 surface."""
    p = grid_points(shape)
    ring = np.hypot(p[..., 0], p[..., 1]) - major
    return (1.0 + (minor - np.hypot(ring, p[..., 2])) / minor).astype(np.float32)


def quantised_field(shape, seed: int, levels: int = 6, fraction: float = 0.3) -> np.ndarray:
    """:func:`smooth_field` around 1 with a random ``fraction`` of its samples rounded to ``levels``
    steps: many samples equal the iso-level 1 exactly (coincident vertices, degenerate faces)."""
    f = 1.0 + 0.5 * smooth_field(shape, seed).astype(np.float64)
    g = np.random.default_rng(seed + 1)
    pick = g.random(shape) < fraction
    f[pick] = np.round(f[pick] * levels) / levels
    return f.astype(np.float32)


def case_grid(seed: int):
    """(values, origin, spacing) of a smooth random field on an odd, non-cubic grid with anisotropic
    spacing."""
    g = np.random.default_rng(seed)
    shape = tuple(int(x) for x in g.integers(9, 26, 3))
    return smooth_field(shape, seed), g.uniform(-1.0, 1.0, 3), g.uniform(0.02, 0.08, 3)


# ---------------------------------------------------------------------------------------------------
# references and checks


def skimage_lorensen(values: np.ndarray, threshold: float, origin, spacing, close_boundary: bool) -> Mesh:
    """The reference: scikit-image's ``method="lorensen"`` with marching.py's conventions (the same
    "no surface" test, the close_boundary pad, faces turned outward, float64 world mapping)."""
    from skimage import measure

    grid = np.asarray(values, np.float32)
    n_inside = int(np.count_nonzero(grid > np.float32(threshold)))
    if n_inside in (0, grid.size):
        return Mesh.empty()
    offset = 0.0
    if close_boundary:
        grid, offset = _close_boundary_pad(grid, threshold), 1.0
    verts, faces, _, _ = measure.marching_cubes(grid, level=threshold, method="lorensen")
    world = (verts.astype(np.float64) - offset) * np.asarray(spacing, np.float64) + np.asarray(origin)
    return Mesh(world.astype(np.float32), faces[:, [0, 2, 1]])


def assert_same_mesh(got: TensorMesh, ref: Mesh, exact: bool, atol: float = 0.0) -> None:
    """``got`` is ``ref`` up to the numbering of the vertices: the same faces in the same order, one
    vertex of ``got`` for each of ``ref`` (the corner-to-corner relation is a bijection), the same
    positions (bit for bit when ``exact``, else within ``atol``)."""
    out = got.to_mesh()
    assert out.num_faces == ref.num_faces and out.num_vertices == ref.num_vertices
    if ref.num_faces == 0:
        return
    a, b = out.faces.reshape(-1), ref.faces.reshape(-1)
    pairs = np.unique(np.stack([a, b], axis=1), axis=0)
    assert len(pairs) == len(np.unique(a)) == len(np.unique(b)) == ref.num_vertices
    if exact:
        np.testing.assert_array_equal(out.vertices[a], ref.vertices[b])
    else:
        np.testing.assert_allclose(out.vertices[a], ref.vertices[b], rtol=0, atol=atol)


def mean_vertex_distance(a: np.ndarray, b: np.ndarray) -> float:
    """Symmetric mean nearest-neighbour distance between two vertex sets."""
    from scipy.spatial import cKDTree

    da, _ = cKDTree(b.astype(np.float64)).query(a.astype(np.float64))
    db, _ = cKDTree(a.astype(np.float64)).query(b.astype(np.float64))
    return 0.5 * (float(da.mean()) + float(db.mean()))


def edge_use_counts(faces: np.ndarray) -> np.ndarray:
    """How many faces use each undirected edge."""
    e = np.sort(np.concatenate([faces[:, [0, 1]], faces[:, [1, 2]], faces[:, [2, 0]]]), axis=1)
    return np.unique(e, axis=0, return_counts=True)[1]


def assert_closed_and_outward(mesh: Mesh) -> float:
    """Watertight (every edge in exactly two faces), consistently wound (no directed edge twice) and
    outward (positive signed volume); returns the volume."""
    f = mesh.faces
    assert (edge_use_counts(f) == 2).all()
    directed = np.concatenate([f[:, [0, 1]], f[:, [1, 2]], f[:, [2, 0]]])
    assert len(np.unique(directed, axis=0)) == len(directed)
    tri = mesh.vertices[f].astype(np.float64)
    volume = float(np.einsum("ij,ij->i", tri[:, 0], np.cross(tri[:, 1], tri[:, 2])).sum() / 6.0)
    assert volume > 0
    return volume


def march(values, threshold, origin, spacing, close_boundary, device):
    return marching_cubes_torch(
        torch.from_numpy(np.ascontiguousarray(values)).to(device), threshold, origin, spacing, close_boundary
    )


# ---------------------------------------------------------------------------------------------------
# the triangulation table


def test_table_is_what_scikit_image_lorensen_emits():
    from microdreamer.mesh.mc_table import TABLE_TEXT, derive_table, format_table, parse_table, table_arrays

    derived = derive_table()
    assert parse_table() == derived  # the committed table, derived again
    assert format_table(derived) == TABLE_TEXT
    counts, edges = table_arrays()
    assert counts[0] == counts[255] == 0 and counts.max() == 5 and counts.sum() == 820
    assert edges.shape == (256, 5, 3) and edges.max() == 11


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("close_boundary", [False, True])
def test_every_case_of_one_cube(device, close_boundary):
    # each of the 256 sign patterns on a 2x2x2 grid, random magnitudes (the interpolation)
    g = np.random.default_rng(5)
    for case in range(256):
        bits = np.array([case >> n & 1 for n in range(8)], bool).reshape(2, 2, 2)
        u = g.uniform(0.05, 1.0, (2, 2, 2))
        values = np.where(bits, 1.0 + u, 1.0 - u).astype(np.float32)
        ref = skimage_lorensen(values, 1.0, np.zeros(3), 0.5, close_boundary)
        got, _ = march(values, 1.0, np.zeros(3), 0.5, close_boundary, device)
        assert_same_mesh(got, ref, exact=True)
        if case not in (0, 255):
            assert got.num_faces > 0
        if close_boundary and got.num_faces:
            assert_closed_and_outward(got.to_mesh())


# ---------------------------------------------------------------------------------------------------
# marching cubes against scikit-image's Lorensen method


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("close_boundary", [False, True])
def test_random_fields_match_scikit_image(device, seed, close_boundary):
    values, origin, spacing = case_grid(seed)
    threshold = [0.0, 0.3, -0.5, 1.0 / 3.0, 0.1][seed]
    ref = skimage_lorensen(values, threshold, origin, spacing, close_boundary)
    got, grid = march(values, threshold, origin, spacing, close_boundary, device)
    assert got.vertices.device.type == device and got.faces.dtype == torch.int64
    assert ref.num_faces > 500
    assert_same_mesh(got, ref, exact=True)
    # the measure, implied by the above: vertices on the reference surface
    assert mean_vertex_distance(got.to_mesh().vertices, ref.vertices) <= 0.01 * spacing.min()
    # grid coordinates map to the world positions
    offset = 1.0 if close_boundary else 0.0
    world = (grid.coords.cpu().double().numpy() - offset) * spacing + origin
    np.testing.assert_array_equal(world.astype(np.float32), got.to_mesh().vertices)
    if close_boundary:
        assert_closed_and_outward(got.to_mesh())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("threshold", [1.0, 0.1, 1.0 / 3.0])
def test_samples_at_the_threshold_are_decided_as_scikit_image_decides(device, threshold):
    # samples at the float32 threshold and its float32 neighbours (float32(0.1) > 0.1 in float64)
    values = (quantised_field((17, 14, 19), 3) - 1.0 + threshold).astype(np.float32)
    g = np.random.default_rng(11)
    t32 = np.float32(threshold)
    near = np.array([np.nextafter(t32, np.float32(0)), t32, np.nextafter(t32, np.float32(2))], np.float32)
    pick = g.random(values.shape) < 0.2
    values[pick] = g.choice(near, int(pick.sum()))
    for close in (False, True):
        ref = skimage_lorensen(values, threshold, np.zeros(3), 0.1, close)
        got, _ = march(values, threshold, np.zeros(3), 0.1, close, device)
        assert ref.num_faces > 100
        assert_same_mesh(got, ref, exact=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fill", [0.0, 1.0, 5.0])  # all below, all exactly at, all above the threshold
def test_no_surface_gives_an_empty_mesh(device, fill):
    values = np.full((5, 4, 6), fill, np.float32)
    for close in (False, True):
        mesh, grid = march(values, 1.0, np.zeros(3), 0.1, close, device)
        assert mesh.num_faces == 0 and mesh.num_vertices == 0 and grid.coords.shape == (0, 3)
        assert mesh.vertices.device.type == device
    for shape in [(2, 2, 2), (1, 1, 1), (0, 3, 3)]:
        mesh, _ = march(np.zeros(shape, np.float32), 1.0, np.zeros(3), 0.1, True, device)
        assert mesh.is_empty


@pytest.mark.parametrize("device", DEVICES)
def test_single_sample_and_thin_grids_with_close_boundary(device):
    for shape in [(1, 1, 2), (1, 3, 2), (2, 2, 2), (1, 5, 4)]:
        values = np.zeros(shape, np.float32)
        values.reshape(-1)[len(values.reshape(-1)) // 2] = 2.0
        ref = skimage_lorensen(values, 1.0, np.ones(3), 0.2, True)
        got, _ = march(values, 1.0, np.ones(3), 0.2, True, device)
        assert ref.num_faces > 0
        assert_same_mesh(got, ref, exact=True)
        assert_closed_and_outward(got.to_mesh())


@pytest.mark.parametrize("device", DEVICES)
def test_rejects_bad_input(device):
    with pytest.raises(ValueError, match="3D grid"):
        marching_cubes_torch(torch.zeros(4, 4), 1.0, np.zeros(3), 1.0)
    for bad_value in (float("nan"), float("inf"), -float("inf")):
        for where in ((1, 2, 3), (0, 0, 0), (4, 4, 4)):
            bad = torch.zeros(5, 5, 5)
            bad[1, 1, 1] = 2.0  # a surface otherwise
            bad[where] = bad_value
            with pytest.raises(ValueError, match="NaN or infinite"):
                marching_cubes_torch(bad.to(device), 1.0, np.zeros(3), 1.0)
    with pytest.raises(ValueError, match="spacing"):
        marching_cubes_torch(torch.zeros(4, 4, 4), 1.0, np.zeros(3), 0.0)
    with pytest.raises(ValueError, match="origin"):
        marching_cubes_torch(torch.zeros(4, 4, 4), 1.0, np.zeros(2), 1.0)
    with pytest.raises(ValueError, match="2 samples"):
        marching_cubes_torch(torch.zeros(1, 4, 4), 1.0, np.zeros(3), 1.0, close_boundary=False)


@pytest.mark.parametrize("device", DEVICES)
def test_close_boundary_pad_equals_the_numpy_pad(device):
    from microdreamer.mesh.marching_torch import close_boundary_pad_torch

    for seed, shape in enumerate([(1, 1, 1), (2, 3, 1), (7, 5, 9)]):
        values = (1.0 + smooth_field(shape, seed)).astype(np.float32)
        for threshold in (1.0, 0.1, 1.7):
            got = close_boundary_pad_torch(torch.from_numpy(values).to(device), threshold)
            np.testing.assert_array_equal(got.cpu().numpy(), _close_boundary_pad(values, threshold))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["sphere", "torus"])
def test_sphere_and_torus(device, kind):
    shape = (33, 30, 36)
    values = sphere_field(shape) if kind == "sphere" else torus_field(shape)
    origin, spacing = -np.ones(3), 2.0 / (np.asarray(shape) - 1)
    ref = skimage_lorensen(values, 1.0, origin, spacing, True)
    got, _ = march(values, 1.0, origin, spacing, True, device)
    assert_same_mesh(got, ref, exact=True)
    mesh = got.to_mesh()
    volume = assert_closed_and_outward(mesh)
    if kind == "sphere":
        assert volume == pytest.approx(4.0 / 3.0 * math.pi * 0.6**3, rel=0.03)
    else:
        assert volume == pytest.approx(2.0 * math.pi**2 * 0.55 * 0.2**2, rel=0.05)
        # genus 1: V - E + F = 0
        n_edges = len(edge_use_counts(mesh.faces))
        assert mesh.num_vertices - n_edges + mesh.num_faces == 0


@pytest.mark.parametrize("device", DEVICES)
def test_real_splat_field(device):
    from conftest import sample
    from microdreamer.field import FieldConfig, density_field
    from microdreamer.splat import read_ply

    splat = read_ply(sample("splats/dg_ghost_amd_17k.ply"))  # 16 pieces at 64^3, some samples at the level
    # point samples (no voxel filter): the field whose samples touch the level, so vertices merge
    fld = density_field(splat, FieldConfig(resolution=64, voxel_filter=0.0), device=device)
    assert fld.values.device.type == device
    values = fld.values.cpu().numpy()
    ref = skimage_lorensen(values, 1.0, fld.grid.origin, fld.grid.spacing, True)
    got, grid = marching_cubes_torch(fld.values, 1.0, fld.grid.origin, fld.grid.spacing)
    assert ref.num_faces > 5000
    assert_same_mesh(got, ref, exact=True)
    assert_closed_and_outward(got.to_mesh())
    # and the cleaned mesh equals the NumPy cleanup of the reference mesh
    config = MeshConfig()
    clean, stats = cleanup_mesh_torch(got, config, grid)
    ref_clean, ref_stats = cleanup_mesh_with_stats(ref, config)
    # a merged group keeps its lowest-index vertex, which the two numberings may pick differently:
    # positions agree within the merge tolerance
    diagonal = float(np.linalg.norm(np.ptp(ref.vertices.astype(np.float64), axis=0)))
    assert_same_mesh(clean, ref_clean, exact=False, atol=config.merge_tolerance * diagonal)
    assert stats == ref_stats and stats.components > 1 and stats.vertices_merged > 0


# ---------------------------------------------------------------------------------------------------
# cleanup against the NumPy/SciPy cleanup


def assert_cleanup_matches(mesh: TensorMesh, config: MeshConfig, grid=None):
    ref, ref_stats = cleanup_mesh_with_stats(mesh.to_mesh(), config)
    out, stats = cleanup_mesh_torch(mesh, config, grid)
    assert out.vertices.device == mesh.vertices.device
    got = out.to_mesh()
    np.testing.assert_array_equal(got.vertices, ref.vertices)
    np.testing.assert_array_equal(got.faces, ref.faces)
    if ref.vertex_colors is not None:
        np.testing.assert_array_equal(got.vertex_colors, ref.vertex_colors)
    assert stats == ref_stats
    return stats


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize("merge_tolerance", [0.0, 1e-6, 2e-3, 0.05])  # 0.05: about a voxel, all searched
def test_cleanup_of_marching_cubes_meshes(device, seed, merge_tolerance):
    g = np.random.default_rng(seed)
    shape = tuple(int(x) for x in g.integers(14, 24, 3))
    values = quantised_field(shape, 100 + seed)
    floaters = np.zeros((4, *shape[1:]), np.float32)  # a layer of single-sample pieces beside the field
    floaters[2, 1::4, 1::4] = 2.0
    values = np.concatenate([values, floaters])
    origin, spacing = g.uniform(-1.0, 1.0, 3), g.uniform(0.02, 0.08, 3)
    mesh, grid = march(values, 1.0, origin, spacing, True, device)
    config = MeshConfig(merge_tolerance=merge_tolerance, min_component_fraction=0.05)
    with_grid = assert_cleanup_matches(mesh, config, grid)
    assert assert_cleanup_matches(mesh, config) == with_grid  # the grid search changes nothing
    if merge_tolerance == 1e-6:  # the default: samples at the level give coincident vertices
        assert with_grid.vertices_merged > 0 and with_grid.degenerate_faces > 0
        assert with_grid.components_removed > 0  # floaters


def soup(seed: int, device) -> TensorMesh:
    """Random meshes with what the cleanup removes: near-duplicate vertices, degenerate and duplicate
    faces (both windings), unused vertices, several components of which two tie for the largest,
    vertex colours."""
    g = np.random.default_rng(seed)
    parts, offset = [], 0
    sizes = [12, 12, 5, 3, 1]
    g.shuffle(sizes)
    for k, size in enumerate(sizes):
        verts = g.normal(size=(size + 2, 3)) + 10.0 * k
        faces = np.stack([np.arange(size), np.arange(size) + 1, np.arange(size) + 2], 1)
        parts.append((verts, faces + offset))
        offset += size + 2
    verts = np.concatenate([p[0] for p in parts])
    faces = np.concatenate([p[1] for p in parts])
    dup = g.choice(len(verts), 6, replace=False)
    verts = np.concatenate([verts, verts[dup] + g.uniform(-1e-9, 1e-9, (6, 3)), verts[dup[:2]]])
    verts = np.concatenate([verts, g.normal(size=(3, 3))])
    copy_faces = faces[g.choice(len(faces), 6)]
    for i, d in enumerate(dup):
        copy_faces[copy_faces == d] = offset + i
    extra = np.concatenate([copy_faces, faces[:3, ::-1], faces[3:5], [[0, 0, 1]], [[offset + 6, 1, 2]]])
    faces = np.concatenate([faces, extra])
    mesh = Mesh(verts, faces[g.permutation(len(faces))], g.random((len(verts), 3)))
    return TensorMesh.from_mesh(mesh, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("fraction", [0.0, 0.2, 0.9, 1.0])
def test_cleanup_of_soups(device, seed, fraction):
    for tolerance in (0.0, 1e-6, 1e-3):
        stats = assert_cleanup_matches(
            soup(seed, device), MeshConfig(merge_tolerance=tolerance, min_component_fraction=fraction)
        )
        assert stats.vertices_merged >= 2 and stats.degenerate_faces >= 1 and stats.duplicate_faces >= 3


@pytest.mark.parametrize("device", DEVICES)
def test_cleanup_of_empty_and_tiny_meshes(device):
    empty = TensorMesh.empty(device)
    out, stats = cleanup_mesh_torch(empty)
    assert out.is_empty and stats.faces_in == 0 and out.vertices.device.type == device
    one = TensorMesh.from_mesh(Mesh(np.eye(3), [[0, 1, 2]]), device)
    assert_cleanup_matches(one, MeshConfig())
    degenerate = TensorMesh.from_mesh(Mesh(np.zeros((3, 3)), [[0, 1, 2]]), device)  # all coincide
    stats = assert_cleanup_matches(degenerate, MeshConfig(merge_tolerance=0.0))
    assert stats.faces_out == 0 and stats.vertices_merged == 2


@pytest.mark.parametrize("device", DEVICES)
def test_duplicate_faces_above_the_single_key_limit(device):
    # V >= 2e6 takes the two-sort path: same first-kept faces as the NumPy path
    g = np.random.default_rng(2)
    n = 2_100_000
    faces = g.integers(0, 40, (300, 3)) * 50_000 + g.integers(0, 3, (300, 3))
    faces = np.concatenate([faces, faces[:50, ::-1], faces[60:70]])
    good = (faces[:, 0] != faces[:, 1]) & (faces[:, 1] != faces[:, 2]) & (faces[:, 0] != faces[:, 2])
    faces = torch.from_numpy(faces[good]).to(device)
    from microdreamer.mesh.cleanup import _first_unique_rows
    from microdreamer.mesh.cleanup_torch import first_unique_faces

    got = first_unique_faces(faces, n).cpu().numpy()
    np.testing.assert_array_equal(got, _first_unique_rows(faces.cpu().numpy(), n))
    assert not got.all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("seed", range(4))
def test_min_labels_against_scipy(device, seed):
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    from microdreamer.mesh.cleanup_torch import min_labels

    g = np.random.default_rng(seed)
    n = int(g.integers(1, 3000))
    e = int(g.integers(0, 2 * n))
    u, v = g.integers(0, n, e), g.integers(0, n, e)
    if seed == 3:  # a long path numbered against the hooking order: many rounds
        perm = g.permutation(n)
        u, v = perm[:-1], perm[1:]
    labels = min_labels(n, torch.from_numpy(u).to(device), torch.from_numpy(v).to(device)).cpu().numpy()
    _, comp = connected_components(coo_matrix((np.ones(len(u)), (u, v)), shape=(n, n)), directed=False)
    lowest = np.full(comp.max() + 1, n)
    np.minimum.at(lowest, comp, np.arange(n))
    np.testing.assert_array_equal(labels, lowest[comp])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("seed", range(4))
def test_close_pairs_against_a_kd_tree(device, seed):
    from scipy.spatial import cKDTree

    from microdreamer.mesh.cleanup_torch import close_pairs

    g = np.random.default_rng(seed)
    centres = g.uniform(-5, 5, (200, 3))
    points = np.concatenate([centres, centres[:80] + g.normal(0, 0.01, (80, 3)), centres[:5]])
    points = points[g.permutation(len(points))]
    for tolerance in (0.0, 0.005, 0.02, 0.5):
        ref = {tuple(p) for p in cKDTree(points).query_pairs(tolerance, output_type="ndarray").tolist()}
        got = close_pairs(torch.from_numpy(points).to(device), tolerance).cpu().numpy()
        assert {(min(a, b), max(a, b)) for a, b in got.tolist()} == ref
        assert len(ref) > 0


# ---------------------------------------------------------------------------------------------------
# dispatch


def test_backend_field_and_its_resolution():
    assert MeshConfig().backend == "auto"
    with pytest.raises(InputError, match="backend"):
        MeshConfig(backend="cuda")
    values = np.zeros((3, 3, 3), np.float32)
    assert resolve_mesh_backend("auto", values) == "skimage"
    assert resolve_mesh_backend("auto", torch.from_numpy(values)) == "skimage"
    assert resolve_mesh_backend("torch", values) == "torch"
    assert resolve_mesh_backend("skimage", torch.from_numpy(values)) == "skimage"
    with pytest.raises(ValueError, match="unknown mesh backend"):
        resolve_mesh_backend("gpu", values)


@pytest.mark.parametrize("device", DEVICES)
def test_extract_mesh_with_the_torch_backend(device):
    values = quantised_field((21, 18, 23), 9)
    origin, spacing = np.array([-0.5, 0.2, 0.1]), 0.05
    config = MeshConfig(backend="torch" if device == "cpu" else "auto", min_component_fraction=0.05)
    mesh, stats = extract_mesh(torch.from_numpy(values).to(device), origin, spacing, config)
    assert stats["backend"] == "torch"
    raw, grid = march(values, 1.0, origin, spacing, True, device)
    ref, ref_stats = cleanup_mesh_torch(raw, config, grid)
    np.testing.assert_array_equal(mesh.vertices, ref.to_mesh().vertices)
    np.testing.assert_array_equal(mesh.faces, ref.to_mesh().faces)
    assert stats["faces_marching_cubes"] == raw.num_faces and stats["components"] == ref_stats.components
    assert stats["faces"] == mesh.num_faces > 1000
    # the scikit-image backend (Lewiner's triangulation): the same surface, closed both ways
    sk, sk_stats = extract_mesh(
        values, origin, spacing, MeshConfig(backend="skimage", min_component_fraction=0.05)
    )
    assert sk_stats["backend"] == "skimage"
    assert mean_vertex_distance(mesh.vertices, sk.vertices) < 0.05 * spacing
