"""Tests of the mesh stage's fast paths against their references (CPU, fast).

Input builder shared with benchmarks/bench_mesh_stage.py: :func:`noisy_splat`, a splat like the
random-weight model's output (a noisy blobby surface plus clutter), whose 128^3 mesh has ~150k faces
in hundreds of pieces.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
import trimesh

from microdreamer.kernels import cpu as cpu_kernels
from microdreamer.mesh import (
    GridVertices,
    Mesh,
    MeshConfig,
    cleanup_mesh_with_stats,
    extract_mesh,
    marching_cubes,
    marching_cubes_on_grid,
)
from microdreamer.mesh.cleanup import CAVITY_EPS, _first_unique_rows, _vertex_components
from microdreamer.mesh.cleanup_torch import cleanup_mesh_torch
from microdreamer.mesh.marching_torch import TensorMesh
from microdreamer.synthetic import noisy_splat

needs_cpp = pytest.mark.skipif(not cpu_kernels.available(), reason="no C++ compiler for the CPU kernels")

# ---------------------------------------------------------------------------------------------------
# input builders (shared with benchmarks/bench_mesh_stage.py)


def quantised_field(shape, seed: int, levels: int = 6, fraction: float = 0.3) -> np.ndarray:
    """[R0, R1, R2] float32 smooth random field around 1.0 with a random ``fraction`` of its samples
    rounded to ``levels`` steps, so that many samples equal the iso-level 1 exactly (marching cubes
    then emits coincident vertices and degenerate faces) while the rest vary continuously (ambiguous
    cubes with centre vertices)."""
    from scipy import ndimage

    g = np.random.default_rng(seed)
    smooth = ndimage.gaussian_filter(g.normal(size=shape), 1.0)
    smooth = 1.0 + smooth / smooth.std() * 0.5
    pick = g.random(shape) < fraction
    smooth[pick] = np.round(smooth[pick] * levels) / levels
    return smooth.astype(np.float32)


def field_case(seed: int):
    """(values, origin, spacing) of a quantised random field with anisotropic spacing."""
    g = np.random.default_rng(seed)
    shape = tuple(int(x) for x in g.integers(14, 24, 3))
    spacing = g.uniform(0.02, 0.08, 3)
    origin = g.uniform(-1.0, 1.0, 3)
    return quantised_field(shape, seed), origin, spacing


# ---------------------------------------------------------------------------------------------------
# cleanup: the grid-restricted merge search and the reworked steps


def close_pairs(vertices: np.ndarray, tolerance: float) -> np.ndarray:
    """[P, 2] all vertex pairs within ``tolerance``: the full k-d tree search (the reference)."""
    from scipy.spatial import cKDTree

    return cKDTree(vertices.astype(np.float64)).query_pairs(tolerance, output_type="ndarray")


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("close_boundary", [True, False])
def test_merge_candidates_hold_every_close_pair(seed, close_boundary):
    values, origin, spacing = field_case(seed)
    mesh, grid = marching_cubes_on_grid(values, 1.0, origin, spacing, close_boundary=close_boundary)
    assert mesh.num_vertices > 100
    diag = float(np.linalg.norm(np.ptp(mesh.vertices.astype(np.float64), axis=0)))
    # 0 (exact duplicates), the default 1e-6 of the diagonal, and up to 0.2 grid steps (e < 0.25)
    for tolerance in (0.0, 1e-6 * diag, 0.05 * spacing.min(), 0.2 * spacing.min()):
        pairs = close_pairs(mesh.vertices, tolerance)
        candidates = grid.merge_candidates(tolerance)
        assert candidates is not None and candidates.shape == (mesh.num_vertices,)
        assert candidates[pairs.reshape(-1)].all(), tolerance
        if tolerance == 0.2 * spacing.min():
            assert len(pairs) > 0  # the test exercises real pairs
    # beyond a quarter step the argument does not hold: search everything
    assert grid.merge_candidates(0.3 * spacing.min()) is None


def test_merge_candidates_cases_b_and_c():
    # (b) two vertices inside one grid edge, far from its samples; (c) a vertex inside a cube
    coords = np.array(
        [[3.0, 4.0, 5.4], [3.0, 4.0, 5.41], [7.0, 2.0, 2.5], [10.3, 10.6, 10.2], [11.0, 10.0, 10.05]],
        np.float32,
    )
    grid = GridVertices(coords, np.full(3, 0.1), 0.0)
    candidates = grid.merge_candidates(1e-6)
    # 0, 1: same edge; 2: alone on its edge; 3: not on an edge; 4: on an edge, in the cube next to 3's
    np.testing.assert_array_equal(candidates, [True, True, False, True, True])


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("merge_tolerance", [0.0, 1e-6, 2e-3, 0.05])
def test_cleanup_with_the_grid_equals_the_full_search(seed, merge_tolerance):
    values, origin, spacing = field_case(100 + seed)
    mesh, grid = marching_cubes_on_grid(values, 1.0, origin, spacing)
    config = MeshConfig(merge_tolerance=merge_tolerance, min_component_fraction=0.05)
    fast, fast_stats = cleanup_mesh_with_stats(mesh, config, grid)
    full, full_stats = cleanup_mesh_with_stats(mesh, config)
    np.testing.assert_array_equal(fast.vertices, full.vertices)
    np.testing.assert_array_equal(fast.faces, full.faces)
    assert fast_stats == full_stats
    if merge_tolerance == 2e-3:
        assert full_stats.vertices_merged > 0 and full_stats.degenerate_faces > 0


def test_extract_mesh_of_the_noisy_splat_is_unchanged_by_the_grid_search():
    from microdreamer.field import FieldConfig, density_field

    fld = density_field(noisy_splat(3000, seed=1, scale=0.02), FieldConfig(resolution=40), device="cpu")
    values = fld.values.numpy()
    mesh, stats = extract_mesh(values, fld.grid.origin, fld.grid.spacing, MeshConfig())
    raw = marching_cubes(values, 1.0, fld.grid.origin, fld.grid.spacing)
    full, full_stats = cleanup_mesh_with_stats(raw, MeshConfig())
    np.testing.assert_array_equal(mesh.vertices, full.vertices)
    np.testing.assert_array_equal(mesh.faces, full.faces)
    assert stats["components"] == full_stats.components > 10  # many pieces, as the real workload


def reference_cleanup(mesh: Mesh, config: MeshConfig) -> tuple[np.ndarray, np.ndarray, tuple]:
    """The cleanup's semantics written plainly: all-pairs k-d tree merge to the group's lowest index,
    degenerate then duplicate faces (first kept), undirected vertex components over all three face
    edges numbered by lowest vertex, floaters below the fraction (largest kept; ties: lowest label),
    unused vertices dropped. Returns (vertices, faces, (merged, degenerate, duplicate, components,
    removed))."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    v, f = mesh.vertices, mesh.faces
    tol = config.merge_tolerance * float(np.linalg.norm(v.max(0).astype(np.float64) - v.min(0)))
    n = len(v)
    pairs = close_pairs(v, tol) if tol > 0 else close_pairs(v, 0.0)
    graph = coo_matrix((np.ones(len(pairs)), (pairs[:, 0], pairs[:, 1])), shape=(n, n))
    _, groups = connected_components(graph, directed=False)
    lowest = {}
    for i, gid in enumerate(groups):
        lowest.setdefault(gid, i)
    remap = np.array([lowest[gid] for gid in groups])
    merged = int((remap != np.arange(n)).sum())
    f = remap[f]
    good = (f[:, 0] != f[:, 1]) & (f[:, 1] != f[:, 2]) & (f[:, 0] != f[:, 2])
    f = f[good]
    seen, unique = set(), []
    for row in f:
        key = tuple(sorted(row.tolist()))
        unique.append(key not in seen)
        seen.add(key)
    unique = np.array(unique, bool)
    f = f[unique]
    edges = np.concatenate([f[:, [0, 1]], f[:, [1, 2]], f[:, [2, 0]]])
    graph = coo_matrix((np.ones(len(edges)), (edges[:, 0], edges[:, 1])), shape=(n, n))
    _, labels = connected_components(graph, directed=False)
    counts = np.bincount(labels[f[:, 0]], minlength=labels.max() + 1)
    keep = counts >= config.min_component_fraction * len(f)
    keep[np.argmax(counts)] = True
    removed = int(((counts > 0) & ~keep).sum())
    cavities = 0
    if config.remove_cavities:
        # the walls of enclosed voids: closed, consistently wound (every directed edge once, its reverse
        # once) and of negative signed volume beyond the margin; never the largest component
        lo, hi = v.min(0).astype(np.float64), v.max(0).astype(np.float64)
        centre, diag = (lo + hi) / 2, float(np.linalg.norm(hi - lo))
        face_label = labels[f[:, 0]]
        for label in np.flatnonzero(keep & (counts > 0)):
            if label == np.argmax(counts):
                continue
            part = f[face_label == label]
            directed = Counter(
                (int(a), int(b)) for row in part for a, b in zip(row, np.roll(row, -1), strict=True)
            )
            closed = all(c == 1 and directed.get((b, a), 0) == 1 for (a, b), c in directed.items())
            volume = sum(np.linalg.det(v[row].astype(np.float64) - centre) for row in part) / 6.0
            if closed and volume < -CAVITY_EPS * diag**3:
                keep[label] = False
                cavities += 1
    f = f[keep[labels[f[:, 0]]]]
    used = np.unique(f)
    new = np.full(n, -1)
    new[used] = np.arange(len(used))
    counts_info = (
        merged,
        int((~good).sum()),
        int((~unique).sum()),
        int((counts > 0).sum()),
        removed,
        cavities,
    )
    return v[used], new[f], counts_info


def soup_case(seed: int) -> Mesh:
    """Random meshes with what the cleanup removes: near-duplicate vertices, degenerate and duplicate
    faces (both windings), unused vertices, several components of which two tie for the largest."""
    g = np.random.default_rng(seed)
    parts, offset = [], 0
    sizes = [12, 12, 5, 3, 1]  # faces per component: a tie for the largest
    g.shuffle(sizes)
    for k, size in enumerate(sizes):
        nv = size + 2
        verts = g.normal(size=(nv, 3)) + 10.0 * k
        faces = np.stack([np.arange(size), np.arange(size) + 1, np.arange(size) + 2], 1)  # a strip
        parts.append((verts, faces + offset))
        offset += nv
    verts = np.concatenate([p[0] for p in parts])
    faces = np.concatenate([p[1] for p in parts])
    dup = g.choice(len(verts), 6, replace=False)  # near copies of some vertices, used by copied faces
    verts = np.concatenate([verts, verts[dup] + g.uniform(-1e-9, 1e-9, (6, 3)), g.normal(size=(3, 3))])
    copy_faces = faces[g.choice(len(faces), 6)]
    for i, d in enumerate(dup):
        copy_faces[copy_faces == d] = offset + i
    extra = np.concatenate([copy_faces, faces[:3, ::-1], faces[3:5], [[0, 0, 1]]])
    faces = np.concatenate([faces, extra])
    return Mesh(verts, faces[g.permutation(len(faces))])


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("fraction", [0.0, 0.2, 0.9])
def test_cleanup_matches_the_plain_reference(seed, fraction):
    mesh = soup_case(seed)
    config = MeshConfig(merge_tolerance=1e-6, min_component_fraction=fraction)
    out, stats = cleanup_mesh_with_stats(mesh, config)
    ref_v, ref_f, (merged, degenerate, duplicate, components, removed, _) = reference_cleanup(mesh, config)
    np.testing.assert_array_equal(out.vertices, ref_v)
    np.testing.assert_array_equal(out.faces, ref_f)
    assert (stats.vertices_merged, stats.degenerate_faces, stats.duplicate_faces) == (
        merged,
        degenerate,
        duplicate,
    )
    assert (stats.components, stats.components_removed) == (components, removed)


def test_subset_faces_by_mask_indices_and_slice():
    g = np.random.default_rng(4)
    mesh = Mesh(g.normal(size=(10, 3)), g.integers(0, 8, (12, 3)), g.random((10, 3)))
    mask = g.random(12) < 0.5
    by_mask, by_index = mesh.subset_faces(mask), mesh.subset_faces(np.flatnonzero(mask))
    used = np.unique(mesh.faces[mask])
    for sub in (by_mask, by_index):
        np.testing.assert_array_equal(sub.vertices, mesh.vertices[used])
        np.testing.assert_array_equal(sub.vertex_colors, mesh.vertex_colors[used])
        np.testing.assert_array_equal(sub.vertices[sub.faces], mesh.vertices[mesh.faces[mask]])
    full = mesh.subset_faces(slice(None))  # vertices 8, 9 are unused
    assert full.num_vertices == len(np.unique(mesh.faces)) and full.num_faces == 12


# ---------------------------------------------------------------------------------------------------
# marching cubes: the mask of straddling cubes


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("threshold", [1.0, 0.1, 1.0 / 3.0])
def test_straddling_cube_mask_leaves_marching_cubes_unchanged(seed, threshold):
    from skimage import measure

    from microdreamer.mesh.marching import _straddling_cubes

    values, _, _ = field_case(200 + seed)
    values = (values - 1.0 + threshold).astype(np.float32)
    # samples at the float32 threshold and its float32 neighbours: the side must be decided in
    # float64 as scikit-image does (float32(0.1) > 0.1, float32(1/3) > 1/3 in float64)
    g = np.random.default_rng(seed)
    t32 = np.float32(threshold)
    near = np.array([np.nextafter(t32, np.float32(0)), t32, np.nextafter(t32, np.float32(2))], np.float32)
    pick = g.random(values.shape) < 0.2
    values[pick] = g.choice(near, int(pick.sum()))
    plain = measure.marching_cubes(values, level=threshold)
    masked = measure.marching_cubes(values, level=threshold, mask=_straddling_cubes(values, threshold))
    for a, b in zip(plain, masked, strict=True):
        np.testing.assert_array_equal(a, b)
    assert len(plain[1]) > 100


# ---------------------------------------------------------------------------------------------------
# GLB export written directly, against trimesh's exporter


def glb_chunks(data: bytes) -> tuple[dict, bytes]:
    """(JSON document, BIN chunk) of a GLB, checking the container layout of the glTF 2.0 spec."""
    import json
    import struct

    magic, version, total = struct.unpack("<4sII", data[:12])
    assert (magic, version, total) == (b"glTF", 2, len(data))
    json_len, json_type = struct.unpack("<I4s", data[12:20])
    assert json_type == b"JSON" and json_len % 4 == 0
    doc = json.loads(data[20 : 20 + json_len])
    bin_len, bin_type = struct.unpack("<I4s", data[20 + json_len : 28 + json_len])
    assert bin_type == b"BIN\x00" and bin_len % 4 == 0 and 28 + json_len + bin_len == len(data)
    blob = data[28 + json_len :]
    assert doc["buffers"] == [{"byteLength": bin_len}]
    for view in doc["bufferViews"]:
        assert view["byteOffset"] % 4 == 0 and view["byteOffset"] + view["byteLength"] <= bin_len
    sizes = {5126: 4, 5125: 4, 5121: 1}
    widths = {"SCALAR": 1, "VEC2": 2, "VEC3": 3, "VEC4": 4}
    for acc in doc["accessors"]:
        need = acc["count"] * sizes[acc["componentType"]] * widths[acc["type"]]
        assert need <= doc["bufferViews"][acc["bufferView"]]["byteLength"]
    return doc, blob


def textured_random_mesh(seed: int, height: int = 37, width: int = 53) -> Mesh:
    g = np.random.default_rng(seed)
    v = g.normal(size=(50, 3))
    faces = np.stack([g.permutation(50)[:3] for _ in range(80)])
    uv = g.random((50, 2))
    texture = g.integers(0, 256, (height, width, 3), dtype=np.uint8)
    return Mesh(v, faces, None, uv, texture)


@pytest.mark.parametrize("kind", ["textured", "coloured", "plain"])
def test_glb_bytes_match_trimesh_export(tmp_path, kind):
    import trimesh

    from microdreamer.mesh.export import glb_bytes

    g = np.random.default_rng(7)
    mesh = textured_random_mesh(7)
    if kind == "coloured":
        mesh = Mesh(mesh.vertices, mesh.faces, g.random((mesh.num_vertices, 3)))
    elif kind == "plain":
        mesh = Mesh(mesh.vertices, mesh.faces)
    ours = glb_bytes(mesh)
    doc, _ = glb_chunks(ours)
    position = doc["accessors"][doc["meshes"][0]["primitives"][0]["attributes"]["POSITION"]]
    np.testing.assert_array_equal(position["min"], mesh.vertices.min(axis=0))
    np.testing.assert_array_equal(position["max"], mesh.vertices.max(axis=0))
    (tmp_path / "ours.glb").write_bytes(ours)
    mesh.to_trimesh().export(file_obj=str(tmp_path / "trimesh.glb"), file_type="glb")  # the reference
    a, b = (trimesh.load(tmp_path / f"{n}.glb", process=False, force="mesh") for n in ("ours", "trimesh"))
    np.testing.assert_array_equal(a.vertices, b.vertices)
    np.testing.assert_array_equal(a.faces, b.faces)
    assert a.visual.kind == b.visual.kind
    if kind == "textured":
        np.testing.assert_array_equal(a.visual.uv, b.visual.uv)
        image = np.asarray(a.visual.material.baseColorTexture.convert("RGB"))
        np.testing.assert_array_equal(image, mesh.texture)  # PNG: lossless
        np.testing.assert_array_equal(image, np.asarray(b.visual.material.baseColorTexture.convert("RGB")))
        assert a.visual.material.metallicFactor == 0.0 and a.visual.material.roughnessFactor == 1.0
    elif kind == "coloured":
        np.testing.assert_array_equal(a.visual.vertex_colors, b.visual.vertex_colors)


def test_merge_candidates_do_not_depend_on_an_integer_offset():
    values, origin, spacing = field_case(7)
    mesh, grid = marching_cubes_on_grid(values, 1.0, origin, spacing)
    shifted = GridVertices(grid.coords - np.float32(40.0), grid.spacing, grid.world_error)
    for tolerance in (0.0, 0.1 * spacing.min()):
        np.testing.assert_array_equal(shifted.merge_candidates(tolerance), grid.merge_candidates(tolerance))


# ---------------------------------------------------------------------------------------------------
# cavities: the walls of enclosed voids


def ball(subdivisions: int, radius: float, centre, inward: bool = False) -> tuple[np.ndarray, np.ndarray]:
    t = trimesh.creation.icosphere(subdivisions=subdivisions, radius=radius)
    faces = t.faces[:, ::-1] if inward else t.faces
    return t.vertices + np.asarray(centre, np.float64), np.ascontiguousarray(faces)


def closed_parts_case(seed: int) -> Mesh:
    """An outward ball (the largest), an inward ball inside it (a void's wall), an inward ball with one
    face missing (open), a tiny inward ball (its volume inside the margin), a small outward ball in the
    void, and an inward ball outside everything; shuffled faces, random placement."""
    g = np.random.default_rng(seed)
    c = g.uniform(-1, 1, 3)
    parts = [
        ball(3, 1.0, c),
        ball(2, 0.6, c + g.uniform(-0.1, 0.1, 3), inward=True),
        ball(1, 0.2, c + [0.3, 0.0, 0.0]),
        ball(2, 0.3, c + [3.0, 0.0, 0.0], inward=True),
        ball(1, 0.3, c + [-3.0, 0.0, 0.0], inward=True),
        ball(1, 0.005, c + [0.0, 3.0, 0.0], inward=True),
    ]
    v, f = parts[4]
    parts[4] = (v, f[1:])  # open: one face missing
    verts, faces, offset = [], [], 0
    for pv, pf in parts:
        verts.append(pv)
        faces.append(pf + offset)
        offset += len(pv)
    faces = np.concatenate(faces)
    return Mesh(np.concatenate(verts).astype(np.float32), faces[g.permutation(len(faces))])


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("remove", [True, False])
def test_cavities_match_the_plain_reference_on_both_paths(seed, remove):
    mesh = closed_parts_case(seed)
    config = MeshConfig(min_component_fraction=0.0, remove_cavities=remove)
    out, stats = cleanup_mesh_with_stats(mesh, config)
    ref_v, ref_f, info = reference_cleanup(mesh, config)
    np.testing.assert_array_equal(out.vertices, ref_v)
    np.testing.assert_array_equal(out.faces, ref_f)
    # two walls of voids go: the one inside the big ball and the closed one outside everything; the open
    # one and the tiny one (inside the margin) stay
    assert stats.cavities_removed == info[5] == (2 if remove else 0)
    assert stats.components == 6 and stats.components_removed == 0
    got, tstats = cleanup_mesh_torch(TensorMesh.from_mesh(mesh, "cpu"), config)
    np.testing.assert_array_equal(got.vertices.numpy(), ref_v)
    np.testing.assert_array_equal(got.faces.numpy(), ref_f)
    assert (tstats.cavities_removed, tstats.faces_in_cavities) == (
        stats.cavities_removed,
        stats.faces_in_cavities,
    )


def hollow_field(n: int = 40):
    """(values, origin, spacing): density > 1 in a spherical shell 0.45 < r < 0.8 holding a ball r < 0.2."""
    spacing = 2.0 / (n - 1)
    axis = -1.0 + spacing * np.arange(n)
    r = np.linalg.norm(np.stack(np.meshgrid(axis, axis, axis, indexing="ij"), -1), axis=-1)
    shell = 1.0 + np.minimum(r - 0.45, 0.8 - r) / 0.2
    values = np.maximum(shell, 1.0 + (0.2 - r) / 0.2).astype(np.float32)
    return values, np.full(3, -1.0), spacing


@pytest.mark.parametrize("backend", ["skimage", "torch"])
def test_extract_mesh_drops_the_wall_of_an_enclosed_void(backend):
    values, origin, spacing = hollow_field()
    keep, kept = extract_mesh(values, origin, spacing, MeshConfig(backend=backend, remove_cavities=False))
    mesh, stats = extract_mesh(values, origin, spacing, MeshConfig(backend=backend))
    assert kept["components"] == 3 and kept["cavities_removed"] == 0
    assert stats["components"] == 3 and stats["cavities_removed"] == 1
    assert stats["faces"] == kept["faces"] - stats["faces_in_cavities"]
    # what is left: the outer sphere and the ball in the void, both closed and wound outward
    parts = mesh.to_trimesh().split(only_watertight=False)
    assert len(parts) == 2 and all(p.is_watertight and p.volume > 0 for p in parts)
    radii = sorted(float(np.linalg.norm(p.vertices, axis=1).mean()) for p in parts)
    assert abs(radii[0] - 0.2) < spacing and abs(radii[1] - 0.8) < spacing
    # without the void's wall the enclosed volume is the solid's with the void (r < 0.45) filled
    assert mesh.to_trimesh().volume > keep.to_trimesh().volume + 0.9 * 4 / 3 * np.pi * 0.45**3


def test_splat_to_mesh_keeps_the_voids_in_upstream_mode(monkeypatch):
    import microdreamer.jobs.export as export
    from microdreamer.config import FieldConfig
    from microdreamer.synthetic import make_synthetic_object

    seen = []
    real = export.extract_mesh
    monkeypatch.setattr(export, "extract_mesh", lambda *a: seen.append(a[3].remove_cavities) or real(*a))
    splat = make_synthetic_object(3000, seed=1, scale_fraction=0.03)
    for mode in ("exact", "upstream"):
        export.splat_to_mesh(
            splat, FieldConfig(resolution=32, mode=mode), MeshConfig(threshold=0.5), torch.device("cpu")
        )
    assert seen == [True, False]


def plain_first_unique(faces: np.ndarray) -> np.ndarray:
    seen, keep = set(), []
    for row in faces.tolist():
        key = tuple(sorted(row))
        keep.append(key not in seen)
        seen.add(key)
    return np.array(keep, bool)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("num_vertices", [1, 50, 1_999_999, 2_000_000, 2**32, 3**40])
def test_first_unique_rows_matches_a_plain_reference(seed, num_vertices):
    # faces use vertices 0..min(V, 50) - 1 whatever V says: V only sets the key. From V = 2M on the key wraps
    # around; at V = 2^32, (lo * V + mid) * V + hi = hi + mid * V (mod 2^64), so faces that differ only in
    # their smallest corner share a key: the exact comparison sorts them out
    g = np.random.default_rng(seed)
    top = min(num_vertices, 50)
    for size in (1, 2, 7, 300):
        faces = g.integers(0, top, (size, 3))
        if size > 2:
            faces[size // 2 :] = faces[: size - size // 2][:, g.permutation(3)]  # duplicates, any winding
            faces = faces[g.permutation(size)]
        np.testing.assert_array_equal(_first_unique_rows(faces, num_vertices), plain_first_unique(faces))


def test_first_unique_rows_with_colliding_keys_and_no_duplicate():
    lo = np.arange(10)
    faces = np.stack([lo, np.full(10, 20), np.full(10, 30)], 1)  # one key at V = 2^32, ten distinct faces
    assert _first_unique_rows(faces, 2**32).all()
    faces = np.concatenate([faces, faces[[3, 7]][:, ::-1]])
    np.testing.assert_array_equal(_first_unique_rows(faces, 2**32), plain_first_unique(faces))


def random_faces(g: np.random.Generator, num_vertices: int, num_faces: int) -> np.ndarray:
    """Strips of faces over a shuffled vertex order: many components, unused vertices, repeated corners."""
    if num_vertices == 0 or num_faces == 0:
        return np.zeros((0, 3), np.int64)
    order = g.permutation(num_vertices)
    start = g.integers(0, num_vertices, num_faces)
    step = g.integers(1, 3, (num_faces, 2))
    idx = np.stack([start, start + step[:, 0], start + step[:, 0] + step[:, 1]], 1) % num_vertices
    return order[idx]


@needs_cpp
@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize(("num_vertices", "num_faces"), [(0, 0), (1, 0), (1, 1), (5, 0), (3, 1), (97, 20),
                                                        (1000, 300), (1000, 700), (20_011, 30_000)])  # fmt: skip
def test_vertex_components_cpp_equals_scipy(seed, num_vertices, num_faces):
    faces = random_faces(np.random.default_rng(seed), num_vertices, num_faces)
    count, labels = _vertex_components(faces, num_vertices, "cpp")
    ref_count, ref_labels = _vertex_components(faces, num_vertices, "scipy")
    assert count == ref_count
    assert labels.dtype == np.int32
    np.testing.assert_array_equal(labels, ref_labels)


@needs_cpp
def test_vertex_components_checks_its_inputs():
    faces = torch.tensor([[0, 1, 2]])
    with pytest.raises(ValueError, match="0..2"):
        cpu_kernels.vertex_components(faces, 3 - 1)
    with pytest.raises(ValueError, match="int64"):
        cpu_kernels.vertex_components(faces.int(), 3)
    with pytest.raises(ValueError, match="shape"):
        cpu_kernels.vertex_components(faces[:, :2], 3)
    with pytest.raises(ValueError, match="contiguous"):
        cpu_kernels.vertex_components(torch.tensor([[0, 1, 2, 0], [2, 1, 0, 0]])[:, :3], 3)
    with pytest.raises(ValueError, match="backend"):
        _vertex_components(faces.numpy(), 3, "cuda")


@needs_cpp
@pytest.mark.parametrize("remove", [True, False])
def test_cleanup_is_the_same_with_either_components_backend(remove):
    values, origin, spacing = field_case(2)
    mesh, _ = marching_cubes_on_grid(values, 1.0, origin, spacing)
    config = MeshConfig(min_component_fraction=0.01, remove_cavities=remove)
    out, stats = cleanup_mesh_with_stats(mesh, config, backend="cpp")
    ref, ref_stats = cleanup_mesh_with_stats(mesh, config, backend="scipy")
    np.testing.assert_array_equal(out.vertices, ref.vertices)
    np.testing.assert_array_equal(out.faces, ref.faces)
    np.testing.assert_array_equal(stats.face_source, ref_stats.face_source)
    assert stats == ref_stats and stats.components_removed >= 1


def test_component_volumes_do_not_depend_on_the_threads(monkeypatch):
    from microdreamer.mesh import cleanup

    g = np.random.default_rng(5)
    vertices = g.normal(size=(500, 3)).astype(np.float32)
    faces = g.integers(0, 500, (10_001, 3))
    label = g.integers(0, 7, 10_001)
    lo, hi = vertices.min(0).astype(np.float64), vertices.max(0).astype(np.float64)
    monkeypatch.setattr(cleanup, "VOLUME_CHUNK", 1000)  # 11 parts, the last of one face
    monkeypatch.setattr(cleanup, "VOLUME_WORKERS", 1)
    serial = cleanup._component_volumes(vertices, faces, label, 8, lo, hi)
    monkeypatch.setattr(cleanup, "VOLUME_WORKERS", 4)
    monkeypatch.setattr(cleanup.os, "cpu_count", lambda: 4)
    threaded = cleanup._component_volumes(vertices, faces, label, 8, lo, hi)
    np.testing.assert_array_equal(threaded, serial)  # the same sums in the same order: equal bits
    assert serial[7] == 0.0
