"""Tests of the mesh stage: marching cubes, cleanup, decimation, export (CPU, fast)."""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pytest
import torch
import trimesh

from microdreamer.errors import InputError
from microdreamer.mesh import (
    Mesh,
    MeshConfig,
    cleanup_mesh,
    cleanup_mesh_with_stats,
    decimate,
    extract_mesh,
    marching_cubes,
    save_mesh,
)
from microdreamer.synthetic import CUBE_SIDE_COLORS, cube_side_of_vertices, textured_cube

# ---------------------------------------------------------------------------------------------------
# input builders


def grid_points(shape, origin, spacing) -> np.ndarray:
    """[R0, R1, R2, 3] float64 world positions of the grid samples."""
    idx = np.stack(np.meshgrid(*[np.arange(n) for n in shape], indexing="ij"), axis=-1)
    return np.asarray(origin, np.float64) + spacing * idx


def sphere_field(shape, origin, spacing, centre, radius, kind="linear") -> np.ndarray:
    """[R0, R1, R2] float32 field that is > 1 exactly inside the sphere (iso-level 1 is the sphere)."""
    r = np.linalg.norm(grid_points(shape, origin, spacing) - np.asarray(centre), axis=-1)
    if kind == "linear":  # 1 + signed distance / radius
        values = 1.0 + (radius - r) / radius
    else:  # a Gaussian blob that equals 1 at the radius, like a splat density
        values = 2.0 * np.exp(-math.log(2.0) * (r / radius) ** 2)
    return values.astype(np.float32)


def random_sphere_case(rng, shape):
    """A sphere of 4.5 to 7 voxels radius, off-centre, in a grid with random origin and spacing."""
    spacing = float(rng.uniform(0.01, 0.1))
    origin = rng.uniform(-1.0, 1.0, 3)
    radius = spacing * float(rng.uniform(4.5, 7.0))
    centre = origin + spacing * (np.asarray(shape) - 1) / 2 + rng.uniform(-2.0, 2.0, 3) * spacing
    return spacing, origin, radius, centre


def face_normals_dot_radial(mesh: Mesh, centre) -> np.ndarray:
    """[F] dot(unit face normal, face centroid - centre)."""
    tri = mesh.vertices[mesh.faces].astype(np.float64)
    n = np.cross(tri[:, 1] - tri[:, 0], tri[:, 2] - tri[:, 0])
    n /= np.linalg.norm(n, axis=1, keepdims=True)
    return (n * (tri.mean(axis=1) - centre)).sum(axis=1)


def icosphere(subdivisions=3, radius=1.0, centre=(0.0, 0.0, 0.0)) -> Mesh:
    t = trimesh.creation.icosphere(subdivisions=subdivisions, radius=radius)
    return Mesh(t.vertices + np.asarray(centre), t.faces)


def as_trimesh(loaded) -> trimesh.Trimesh:
    """trimesh.load may return a Scene (always for glTF): flatten it, applying node transforms."""
    if isinstance(loaded, trimesh.Scene):
        assert len(loaded.geometry) == 1
        return loaded.to_geometry()
    return loaded


# ---------------------------------------------------------------------------------------------------
# marching cubes


@pytest.mark.parametrize("shape", [(24, 24, 24), (33, 33, 33), (31, 40, 27)])
@pytest.mark.parametrize("kind", ["linear", "gaussian"])
def test_marching_cubes_recovers_sphere(shape, kind):
    rng = np.random.default_rng(1000 + sum(shape) + len(kind))
    spacing, origin, radius, centre = random_sphere_case(rng, shape)
    values = sphere_field(shape, origin, spacing, centre, radius, kind)
    mesh = marching_cubes(values, 1.0, origin, spacing)

    assert mesh.vertices.dtype == np.float32 and mesh.faces.dtype == np.int64
    assert mesh.num_faces > 100 and mesh.vertex_colors is None
    dist = np.linalg.norm(mesh.vertices - centre, axis=1)
    # Spec: within half a voxel. Linear interpolation of a smooth field along a grid edge errs by
    # about h^2 / (8 r) <= 0.03 voxel for r >= 4.5 voxels (measured <= 0.02), so 0.1 voxel for the
    # max and 0.05 for the mean also catch an off-by-half-voxel origin mapping.
    assert abs(dist.mean() - radius) < 0.05 * spacing
    assert np.abs(dist - radius).max() < 0.1 * spacing

    tm = mesh.to_trimesh()
    assert tm.is_watertight and tm.is_winding_consistent
    # outward: positive signed volume; faceting loses at most ~1.5% of a sphere of >= 4.5 voxels
    assert tm.volume > 0
    assert tm.volume == pytest.approx(4.0 / 3.0 * math.pi * radius**3, rel=0.03)
    dots = face_normals_dot_radial(mesh, centre)
    assert dots.mean() > 0.9 * radius  # normals nearly radial and outward
    assert (dots > 0).all()  # every single face outward


def test_marching_cubes_torch_and_numpy_agree():
    rng = np.random.default_rng(7)
    shape = (20, 26, 23)
    spacing, origin, radius, centre = random_sphere_case(rng, shape)
    values = sphere_field(shape, origin, spacing, centre, radius, "gaussian")
    ref = marching_cubes(values, 1.0, origin, spacing)
    got = marching_cubes(torch.from_numpy(values), 1.0, torch.tensor(origin), torch.tensor(spacing))
    np.testing.assert_array_equal(got.faces, ref.faces)
    np.testing.assert_allclose(got.vertices, ref.vertices, rtol=0, atol=1e-6)  # float64 vs float32 origin


def test_marching_cubes_world_mapping_on_a_plane():
    # A field linear in x crosses the threshold at x = origin_x + spacing * 3.25 exactly.
    shape, origin, spacing = (8, 5, 6), np.array([0.5, -2.0, 3.0]), 0.25
    i = np.arange(shape[0], dtype=np.float32)[:, None, None]
    values = np.broadcast_to(3.25 - i + 1.0, shape).copy()  # > 1 for i < 3.25
    mesh = marching_cubes(values, 1.0, origin, spacing, close_boundary=False)
    np.testing.assert_allclose(mesh.vertices[:, 0], origin[0] + spacing * 3.25, atol=1e-6)
    tri = mesh.vertices[mesh.faces].astype(np.float64)
    n = np.cross(tri[:, 1] - tri[:, 0], tri[:, 2] - tri[:, 0])
    assert (n[:, 0] > 0).all()  # outward = towards +x, away from the high values


def test_close_boundary_closes_a_field_cut_by_the_border():
    rng = np.random.default_rng(3)
    shape = (21, 24, 19)
    spacing, origin = 0.05, np.array([-0.5, -0.6, -0.45])
    centre = origin + spacing * np.array([10.0, 11.0, 9.0]) + rng.uniform(-0.5, 0.5, 3) * spacing
    values = sphere_field(shape, origin, spacing, centre, radius=spacing * 14.0)  # cut by all 6 sides
    closed = marching_cubes(values, 1.0, origin, spacing, close_boundary=True)
    tm = closed.to_trimesh()
    assert tm.is_watertight and tm.is_winding_consistent and tm.volume > 0
    # the cap lies half a voxel outside the outermost samples, on every side the sphere crosses
    lo, hi = origin - spacing / 2, origin + spacing * (np.asarray(shape) - 0.5)
    np.testing.assert_allclose(closed.bounds(), np.stack([lo, hi]), atol=1e-6)
    assert not marching_cubes(values, 1.0, origin, spacing, close_boundary=False).to_trimesh().is_watertight


def test_close_boundary_when_the_field_only_touches_the_border():
    # a sphere whose samples exceed the threshold on one border layer only: still watertight
    shape, spacing, origin = (16, 16, 16), 0.1, np.zeros(3)
    centre = np.array([0.75, 0.75, -0.2])
    values = sphere_field(shape, origin, spacing, centre, radius=0.45)
    assert (values[:, :, 0] > 1).any() and not (values[:, :, 3] > 1).any()
    tm = marching_cubes(values, 1.0, origin, spacing).to_trimesh()
    assert tm.is_watertight and tm.volume > 0


@pytest.mark.parametrize("fill", [0.0, 1.0, 5.0])  # all below, all exactly at, all above the threshold
def test_no_surface_gives_an_empty_mesh(fill):
    values = np.full((9, 10, 11), fill, np.float32)
    for close in (True, False):
        mesh = marching_cubes(values, 1.0, np.zeros(3), 0.1, close_boundary=close)
        assert mesh.is_empty and mesh.num_vertices == 0
        assert mesh.vertices.shape == (0, 3) and mesh.faces.shape == (0, 3)
    mesh, stats = extract_mesh(values, np.zeros(3), 0.1)
    assert mesh.is_empty and stats["faces"] == 0 and stats["faces_marching_cubes"] == 0


def test_marching_cubes_single_inside_sample():
    values = np.zeros((5, 5, 5), np.float32)
    values[2, 2, 2] = 2.0
    tm = marching_cubes(values, 1.0, np.zeros(3), 1.0).to_trimesh()
    assert tm.is_watertight and tm.volume > 0
    np.testing.assert_allclose(tm.vertices.mean(axis=0), [2.0, 2.0, 2.0], atol=1e-6)


def test_marching_cubes_rejects_bad_input():
    with pytest.raises(ValueError, match="3D grid"):
        marching_cubes(np.zeros((4, 4), np.float32), 1.0, np.zeros(3), 1.0)
    bad = np.zeros((4, 4, 4), np.float32)
    bad[1, 1, 1] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        marching_cubes(bad, 1.0, np.zeros(3), 1.0)
    with pytest.raises(ValueError, match="spacing"):
        marching_cubes(np.zeros((4, 4, 4), np.float32), 1.0, np.zeros(3), 0.0)


# ---------------------------------------------------------------------------------------------------
# cleanup


def two_sphere_field(shape, spacing, origin, big, small):
    """Union (max) of two sphere fields: (centre, radius) each."""
    a = sphere_field(shape, origin, spacing, *big)
    b = sphere_field(shape, origin, spacing, *small)
    return np.maximum(a, b)


def test_cleanup_removes_a_floater_and_keeps_the_main_body():
    shape, spacing, origin = (40, 32, 32), 0.05, np.array([-1.0, -0.8, -0.8])
    big = (np.array([-0.3, 0.0, 0.0]), 0.5)
    small = (np.array([0.75, 0.3, 0.2]), 0.06)
    values = two_sphere_field(shape, spacing, origin, big, small)
    mesh = marching_cubes(values, 1.0, origin, spacing)
    cleaned, stats = cleanup_mesh_with_stats(mesh, MeshConfig())
    assert stats.components == 2 and stats.components_removed == 1
    # the floater holds 1% to 2% of the faces (about (0.06 / 0.5)^2 = 1.4%)
    assert 0.01 < stats.faces_in_removed_components / mesh.num_faces < 0.02
    # what remains is exactly the big sphere: every vertex at its radius (see the marching cubes test)
    dist = np.linalg.norm(cleaned.vertices - big[0], axis=1)
    assert np.abs(dist - big[1]).max() < 0.1 * spacing
    assert cleaned.to_trimesh().is_watertight
    # a fraction of 0 or 0.01 keeps the floater
    for fraction in (0.0, 0.01):
        kept, kept_stats = cleanup_mesh_with_stats(mesh, MeshConfig(min_component_fraction=fraction))
        assert kept_stats.components_removed == 0
        assert kept.num_faces == cleaned.num_faces + stats.faces_in_removed_components


def test_cleanup_never_removes_the_largest_component():
    a = icosphere(2, 1.0, (0, 0, 0))  # 320 faces
    b = icosphere(1, 0.5, (3, 0, 0))  # 80 faces
    both = Mesh(np.concatenate([b.vertices, a.vertices]), np.concatenate([b.faces, a.faces + b.num_vertices]))
    # both are below a fraction of 0.9: only the smaller goes
    cleaned, stats = cleanup_mesh_with_stats(both, MeshConfig(min_component_fraction=0.9))
    assert stats.components == 2 and stats.components_removed == 1
    assert cleaned.num_faces == a.num_faces
    np.testing.assert_array_equal(cleaned.vertices, a.vertices)
    np.testing.assert_array_equal(cleaned.faces, a.faces)
    # a fraction of 1 with a single component keeps it
    assert cleanup_mesh(a, MeshConfig(min_component_fraction=1.0)).num_faces == a.num_faces


def test_cleanup_merges_duplicate_vertices_of_a_triangle_soup():
    rng = np.random.default_rng(11)
    ref = icosphere(3, 0.8, (0.2, -0.1, 0.4))  # reference: the indexed mesh
    soup_vertices = ref.vertices[ref.faces].reshape(-1, 3).astype(np.float64)  # 3 F vertices
    diag = np.linalg.norm(np.ptp(ref.vertices, axis=0))
    tol = 1e-6  # MeshConfig default, relative to the diagonal
    # jitter well inside the tolerance (0.2 tol per axis -> at most 0.35 tol apart per pair)
    soup_vertices += rng.uniform(-0.1, 0.1, soup_vertices.shape) * tol * diag
    soup = Mesh(soup_vertices, np.arange(soup_vertices.shape[0]).reshape(-1, 3))
    cleaned = cleanup_mesh(soup, MeshConfig(merge_tolerance=tol))
    assert cleaned.num_vertices == ref.num_vertices and cleaned.num_faces == ref.num_faces
    # same triangles, in the same face order, each corner within the jitter of the reference
    np.testing.assert_allclose(
        cleaned.vertices[cleaned.faces], ref.vertices[ref.faces], rtol=0, atol=tol * diag
    )
    assert cleaned.to_trimesh().is_watertight

    # points further apart than the tolerance are not merged (here: tolerance 0 -> exact only;
    # fraction 0, or the unmerged soup's one-face components would go as floaters)
    exact_only = MeshConfig(merge_tolerance=0.0, min_component_fraction=0.0)
    unmerged = cleanup_mesh(soup, exact_only)
    # reference: distinct float32 rows (float32 rounding can make a jittered pair coincide)
    assert unmerged.num_vertices == len(np.unique(soup.vertices, axis=0)) > 0.99 * soup.num_vertices
    exact = Mesh(ref.vertices[ref.faces].reshape(-1, 3), np.arange(3 * ref.num_faces).reshape(-1, 3))
    merged = cleanup_mesh(exact, exact_only)
    np.testing.assert_array_equal(merged.vertices[merged.faces], ref.vertices[ref.faces])
    assert merged.num_vertices == ref.num_vertices


def test_cleanup_drops_degenerate_duplicate_faces_and_unused_vertices():
    ref = icosphere(1)
    extra_vertex = np.array([[5.0, 5.0, 5.0]])
    faces = np.concatenate(
        [
            ref.faces,
            ref.faces[:3],  # exact duplicates
            ref.faces[3:5, ::-1],  # duplicates with the other winding
            [[0, 0, 1], [2, 3, 3]],  # repeated corners
        ]
    )
    colors = np.random.default_rng(2).random((ref.num_vertices + 1, 3))
    mesh = Mesh(np.concatenate([ref.vertices, extra_vertex]), faces, colors)
    cleaned, stats = cleanup_mesh_with_stats(mesh, MeshConfig(min_component_fraction=0.0))
    assert stats.duplicate_faces == 5 and stats.degenerate_faces == 2
    np.testing.assert_array_equal(cleaned.faces, ref.faces)
    np.testing.assert_array_equal(cleaned.vertices, ref.vertices)
    np.testing.assert_array_equal(cleaned.vertex_colors, colors[:-1].astype(np.float32))


def test_cleanup_empty_mesh():
    cleaned = cleanup_mesh(Mesh.empty())
    assert cleaned.is_empty and cleaned.num_vertices == 0


# ---------------------------------------------------------------------------------------------------
# decimation


def test_decimate_reaches_about_the_target_and_keeps_the_shape():
    ref = icosphere(5, 1.0)  # 20480 faces
    colors = (ref.vertices * 0.5 + 0.5).astype(np.float32)  # colour = position: checkable after
    mesh = Mesh(ref.vertices, ref.faces, colors)
    out = decimate(mesh, 2000)
    # fast_simplification stops at the first pass that reaches the target: within 5% below
    assert 0.95 * 2000 <= out.num_faces <= 2000
    tm = out.to_trimesh()
    assert tm.is_watertight and tm.volume > 0
    assert tm.volume == pytest.approx(mesh.to_trimesh().volume, rel=0.02)
    np.testing.assert_allclose(np.linalg.norm(out.vertices, axis=1), 1.0, atol=0.02)
    # nearest-vertex colours of a colour-equals-position field: within the input's vertex spacing
    np.testing.assert_allclose(out.vertex_colors, out.vertices * 0.5 + 0.5, atol=0.02)
    assert decimate(mesh, mesh.num_faces) is mesh  # no-op when already at or below the target
    assert decimate(mesh, 10**6) is mesh


# ---------------------------------------------------------------------------------------------------
# export


def colored_sphere(seed=0) -> Mesh:
    rng = np.random.default_rng(seed)
    ref = icosphere(2, 0.7, (0.1, 0.2, -0.3))
    return Mesh(ref.vertices, ref.faces, rng.random((ref.num_vertices, 3)))


@pytest.mark.parametrize("suffix", [".ply", ".obj", ".glb", ".GLB"])
def test_export_round_trip(tmp_path, suffix):
    mesh = colored_sphere()
    path = save_mesh(mesh, tmp_path / f"out{suffix}")
    assert sorted(os.listdir(tmp_path)) == [f"out{suffix}"]  # no temporary left behind
    loaded = as_trimesh(trimesh.load(path, process=False))
    assert len(loaded.vertices) == mesh.num_vertices
    # ply/glb store float32 exactly; obj prints 8 decimals
    np.testing.assert_allclose(loaded.vertices, mesh.vertices, rtol=0, atol=1e-6)
    np.testing.assert_array_equal(loaded.faces, mesh.faces)  # same order, same (outward) winding
    assert loaded.visual.kind == "vertex"
    # colours are stored as 8 bits: rounding error at most half a step
    np.testing.assert_allclose(
        loaded.visual.vertex_colors[:, :3] / 255.0, mesh.vertex_colors, atol=0.5 / 255 + 1e-6
    )


def test_export_without_colours(tmp_path):
    mesh = icosphere(1)
    for suffix in (".ply", ".obj", ".glb"):
        loaded = as_trimesh(trimesh.load(save_mesh(mesh, tmp_path / f"plain{suffix}"), process=False))
        np.testing.assert_allclose(loaded.vertices, mesh.vertices, rtol=0, atol=1e-6)


def test_export_unknown_suffix_is_an_input_error(tmp_path):
    target = tmp_path / "OUT.xyz"
    with pytest.raises(InputError) as info:
        save_mesh(colored_sphere(), target)
    assert str(info.value) == f"{target}: unsupported mesh format '.xyz'; use .glb, .obj or .ply"
    assert "\n" not in str(info.value)
    assert os.listdir(tmp_path) == []
    with pytest.raises(InputError, match="does not exist"):
        save_mesh(colored_sphere(), tmp_path / "missing" / "out.glb")
    with pytest.raises(ValueError, match="empty"):
        save_mesh(Mesh.empty(), tmp_path / "empty.glb")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("suffix", [".ply", ".obj", ".glb"])
def test_export_failure_leaves_no_partial_file(tmp_path, monkeypatch, suffix):
    def export_then_fail(self, file_obj=None, file_type=None, **kwargs):
        with open(file_obj, "wb") as f:
            f.write(b"half a mesh")
        raise RuntimeError("disk full")

    def write_half_then_fail(self, data):
        with open(self, "wb") as f:
            f.write(data[: len(data) // 2])
        raise RuntimeError("disk full")

    (tmp_path / f"keep{suffix}").write_bytes(b"old")  # an existing file is not touched either
    monkeypatch.setattr(trimesh.Trimesh, "export", export_then_fail)  # .ply, .obj: written by trimesh
    monkeypatch.setattr(Path, "write_bytes", write_half_then_fail)  # .glb: written directly
    with pytest.raises(RuntimeError, match="disk full"):
        save_mesh(colored_sphere(), tmp_path / f"out{suffix}")
    assert os.listdir(tmp_path) == [f"keep{suffix}"]


# ---------------------------------------------------------------------------------------------------
# textured meshes: uv + texture, exported as GLB (embedded PNG), OBJ + MTL + PNG, PLY (vertex colours)


# the colour of each side of the cube: +x, -x, +y, -y, +z, -z
def test_textured_cube_builder_is_consistent():
    cube = textured_cube()
    got = cube.colors_at_vertices()
    want = CUBE_SIDE_COLORS[cube_side_of_vertices(cube)] / 255.0
    np.testing.assert_allclose(got, want, atol=1e-6)  # UVs lie inside flat cells: exact colours


def test_mesh_checks_texture_fields():
    v, f = np.zeros((3, 3)), [[0, 1, 2]]
    tex = np.zeros((4, 4, 3), np.uint8)
    with pytest.raises(ValueError, match="together"):
        Mesh(v, f, uv=np.zeros((3, 2)))
    with pytest.raises(ValueError, match="Mesh.uv has shape"):
        Mesh(v, f, uv=np.zeros((2, 2)), texture=tex)
    with pytest.raises(ValueError, match="uint8"):
        Mesh(v, f, uv=np.zeros((3, 2)), texture=tex.astype(np.float32))
    mesh = Mesh(v, f, uv=np.zeros((3, 2)), texture=tex)
    assert mesh.has_texture and mesh.uv.dtype == np.float32
    assert not Mesh(v, f).has_texture


def test_sample_texture_numpy_matches_the_renderer():
    from microdreamer.mesh.types import sample_texture_numpy
    from microdreamer.render.mesh import sample_texture

    rng = np.random.default_rng(3)
    tex = rng.random((7, 11, 3)).astype(np.float32)
    uv = rng.uniform(-0.5, 1.5, (200, 2)).astype(np.float32)  # outside [0, 1] too: repeat wrapping
    ours = sample_texture_numpy(tex, uv)
    ref = sample_texture(torch.from_numpy(tex), torch.from_numpy(uv)).numpy()
    np.testing.assert_allclose(ours, ref, atol=1e-5)  # float64 vs float32 arithmetic


def _read_glb(path):
    """(json dict, binary chunk bytes) of a GLB file, parsed by hand (independent of trimesh)."""
    import json
    import struct

    data = path.read_bytes()
    magic, version, _ = struct.unpack("<4sII", data[:12])
    assert magic == b"glTF" and version == 2
    json_len, json_type = struct.unpack("<I4s", data[12:20])
    assert json_type == b"JSON"
    doc = json.loads(data[20 : 20 + json_len])
    bin_len, bin_type = struct.unpack("<I4s", data[20 + json_len : 28 + json_len])
    assert bin_type == b"BIN\x00"
    return doc, data[28 + json_len : 28 + json_len + bin_len]


def _accessor(doc, blob, index) -> np.ndarray:
    acc = doc["accessors"][index]
    view = doc["bufferViews"][acc["bufferView"]]
    dtype = {5126: np.float32, 5125: np.uint32, 5123: np.uint16}[acc["componentType"]]
    width = {"SCALAR": 1, "VEC2": 2, "VEC3": 3, "VEC4": 4}[acc["type"]]
    start = view.get("byteOffset", 0) + acc.get("byteOffset", 0)
    return np.frombuffer(blob, dtype, acc["count"] * width, start).reshape(acc["count"], width)


def test_textured_glb_reloads_with_texture_uvs_and_orientation(tmp_path):
    from PIL import Image

    from microdreamer.cameras import orbit_cameras
    from microdreamer.mesh.load import load_textured_mesh
    from microdreamer.render.mesh import render_mesh

    cube = textured_cube()
    path = save_mesh(cube, tmp_path / "cube.glb")
    assert sorted(os.listdir(tmp_path)) == ["cube.glb"]

    # the raw file: glTF's v points down the image, positions unchanged (glTF is y-up, as we are)
    doc, blob = _read_glb(path)
    prim = doc["meshes"][0]["primitives"][0]
    np.testing.assert_array_equal(_accessor(doc, blob, prim["attributes"]["POSITION"]), cube.vertices)
    texcoord = _accessor(doc, blob, prim["attributes"]["TEXCOORD_0"])
    np.testing.assert_allclose(texcoord, np.stack([cube.uv[:, 0], 1 - cube.uv[:, 1]], 1), atol=1e-7)
    assert doc["materials"][prim["material"]]["pbrMetallicRoughness"]["baseColorTexture"]["index"] == 0
    assert doc["images"][0]["mimeType"] == "image/png"
    assert all(np.allclose(n.get("matrix", np.eye(4).ravel()), np.eye(4).ravel()) for n in doc["nodes"])

    # trimesh reload: UVs back in our convention, the same image (PNG is lossless)
    loaded = as_trimesh(trimesh.load(path, process=False))
    np.testing.assert_allclose(loaded.vertices, cube.vertices, atol=1e-7)
    np.testing.assert_allclose(loaded.visual.uv, cube.uv, atol=1e-6)
    image = np.asarray(loaded.visual.material.baseColorTexture.convert("RGB"))
    np.testing.assert_array_equal(image, cube.texture)
    assert isinstance(loaded.visual.material.baseColorTexture, Image.Image)

    # orientation: a camera on +x sees the red side, on -x blue, above (+y) green
    reloaded = load_textured_mesh(path)
    cams = orbit_cameras([0.0, 0.0, -89.0], [90.0, -90.0, 0.0], 3.0, 30.0, 32, 32)
    rgb = render_mesh(reloaded, cams).rgb
    centre = (rgb[:, 14:18, 14:18].reshape(3, -1, 3).mean(1) * 255).numpy()
    np.testing.assert_allclose(centre, CUBE_SIDE_COLORS[[0, 1, 2]], atol=1.0)  # flat cells, nearest texel


def test_textured_obj_writes_obj_mtl_png_that_reload(tmp_path):
    cube = textured_cube()
    path = save_mesh(cube, tmp_path / "cube.obj")
    assert sorted(os.listdir(tmp_path)) == ["cube.mtl", "cube.obj", "cube.png"]
    assert "map_Kd cube.png" in (tmp_path / "cube.mtl").read_text()
    loaded = trimesh.load(path, process=False)
    assert len(loaded.faces) == cube.num_faces
    # trimesh splits/merges by (position, uv) pairs; compare per-corner values
    np.testing.assert_allclose(loaded.vertices[loaded.faces], cube.vertices[cube.faces], atol=1e-6)
    np.testing.assert_allclose(loaded.visual.uv[loaded.faces], cube.uv[cube.faces], atol=1e-6)
    np.testing.assert_array_equal(np.asarray(loaded.visual.material.image.convert("RGB")), cube.texture)


def test_textured_ply_has_the_texture_as_vertex_colours(tmp_path):
    cube = textured_cube()
    path = save_mesh(cube, tmp_path / "cube.ply")
    loaded = trimesh.load(path, process=False)
    # seam copies merged: 8 corners; each corner averages the colours of its three sides
    assert len(loaded.vertices) == 8 and len(loaded.faces) == 12
    side = cube_side_of_vertices(cube)
    for corner in loaded.vertices:
        copies = np.all(cube.vertices == corner, axis=1)
        want = CUBE_SIDE_COLORS[side[copies]].astype(np.float64).mean(0)
        got = loaded.visual.vertex_colors[np.all(loaded.vertices == corner, axis=1)][0, :3]
        np.testing.assert_allclose(got, want, atol=0.5 + 1e-6)  # rounded to 8 bits
    faces_pos = loaded.vertices[loaded.faces]
    np.testing.assert_allclose(
        np.sort(faces_pos.reshape(-1, 9), 0), np.sort(cube.vertices[cube.faces].reshape(-1, 9), 0)
    )


@pytest.mark.parametrize("fail_at", ["png", "obj"])
def test_textured_obj_failure_leaves_no_partial_files(tmp_path, monkeypatch, fail_at):
    from PIL import Image

    if fail_at == "png":
        original = Image.Image.save

        def save_then_fail(self, fp, *args, **kwargs):
            original(self, fp, *args, **kwargs)
            raise OSError("disk full")

        monkeypatch.setattr(Image.Image, "save", save_then_fail)
    else:
        original_savetxt = np.savetxt

        def savetxt_then_fail(f, *args, **kwargs):
            original_savetxt(f, *args, **kwargs)
            raise OSError("disk full")

        monkeypatch.setattr(np, "savetxt", savetxt_then_fail)
    (tmp_path / "keep.obj").write_text("old")
    with pytest.raises(OSError, match="disk full"):
        save_mesh(textured_cube(), tmp_path / "cube.obj")
    assert os.listdir(tmp_path) == ["keep.obj"]


# ---------------------------------------------------------------------------------------------------
# the stage


def test_extract_mesh_stage_and_stats():
    shape, spacing, origin = (40, 32, 32), 0.05, np.array([-1.0, -0.8, -0.8])
    big = (np.array([-0.3, 0.0, 0.0]), 0.5)
    small = (np.array([0.75, 0.3, 0.2]), 0.06)
    values = torch.from_numpy(two_sphere_field(shape, spacing, origin, big, small))

    mesh, stats = extract_mesh(values, origin, spacing, MeshConfig())
    assert stats["components"] == 2 and stats["components_removed"] == 1
    assert stats["faces_marching_cubes"] > stats["faces_after_cleanup"] == stats["faces"] == mesh.num_faces
    assert stats["vertices"] == mesh.num_vertices
    assert set(stats["seconds"]) == {"marching_cubes", "cleanup", "decimate"}
    assert stats["seconds"]["decimate"] == 0.0
    assert mesh.to_trimesh().is_watertight

    small_mesh, small_stats = extract_mesh(values, origin, spacing, MeshConfig(decimate_target=1000))
    assert 0.95 * 1000 <= small_mesh.num_faces <= 1000 and small_stats["faces"] == small_mesh.num_faces
    assert small_stats["faces_after_cleanup"] == stats["faces_after_cleanup"]

    # a higher threshold shrinks the sphere: the linear field is 1 + (r0 - r) / r0, so level 1.2 -> 0.8 r0
    higher, _ = extract_mesh(values, origin, spacing, MeshConfig(threshold=1.2))
    dist = np.linalg.norm(higher.vertices - big[0], axis=1)
    assert np.abs(dist - 0.8 * big[1]).max() < 0.1 * spacing


@pytest.mark.parametrize(
    "kwargs", [{"min_component_fraction": 1.5}, {"merge_tolerance": -1.0}, {"decimate_target": 0}]
)
def test_mesh_config_rejects_bad_values(kwargs):
    with pytest.raises(InputError):
        MeshConfig(**kwargs)


def test_mesh_checks_its_arrays():
    with pytest.raises(ValueError, match="index range"):
        Mesh(np.zeros((3, 3)), [[0, 1, 3]])
    with pytest.raises(ValueError, match="vertex_colors"):
        Mesh(np.zeros((3, 3)), [[0, 1, 2]], np.zeros((2, 3)))
    with pytest.raises(ValueError, match="no bounds"):
        Mesh.empty().bounds()
    mesh = Mesh([[0, 0, 0], [1, 2, 3], [-1, 0, 5]], [[0, 1, 2]])
    np.testing.assert_array_equal(mesh.bounds(), [[-1, 0, 0], [1, 2, 5]])
    assert mesh.num_vertices == 3 and mesh.num_faces == 1


def test_obj_with_uvs_and_no_material_has_no_colour(tmp_path):
    """An OBJ with texture coordinates but no ``mtllib`` carries no colour (trimesh gives it a placeholder
    image, which must not count as a texture), so it renders shaded; with an MTL naming an image it is
    textured."""
    from PIL import Image

    from microdreamer.mesh.load import load_textured_mesh

    body = "v 0 0 0\nv 1 0 0\nv 0 1 0\nvt 0 0\nvt 1 0\nvt 0 1\nf 1/1 2/2 3/3\n"
    (tmp_path / "bare.obj").write_text(body)
    bare = load_textured_mesh(tmp_path / "bare.obj")
    assert bare.texture is None and bare.vertex_colors is None
    Image.new("RGB", (4, 4), (200, 30, 30)).save(tmp_path / "red.png")
    (tmp_path / "m.mtl").write_text("newmtl red\nKd 1 1 1\nmap_Kd red.png\n")
    (tmp_path / "with.obj").write_text("mtllib m.mtl\nusemtl red\n" + body)
    textured = load_textured_mesh(tmp_path / "with.obj")
    assert textured.texture is not None and tuple(textured.texture[0, 0]) == (200, 30, 30)
