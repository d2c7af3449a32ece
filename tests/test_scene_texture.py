"""Per-tile UV textures of scenes (microdreamer.scene.texture): a closed room is baked from views inside it
(the walls' inner colour, not the outer), an object from the ring, unseen texels from the colour field."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch

from microdreamer.config import BakeConfig, BakeViewsConfig, FieldConfig, MeshConfig, TextureConfig
from microdreamer.scene import plan_scene, scene_to_mesh
from microdreamer.scene.texture import TileViews, texture_scene, texture_tile
from microdreamer.splat import SH_C0, Splat
from microdreamer.synthetic import surface_splat, tangent_splat

pytest.importorskip("skimage")

INNER, OUTER = (0.9, 0.1, 0.1), (0.1, 0.1, 0.9)
#: small atlases and views: the choices and colours are what is tested, not the resolution
CONFIG = TextureConfig(size=128, bake=BakeConfig(views=BakeViewsConfig(size=96)))
VIEWS = TileViews(size=96)


def box_layer(half: float, colour, step: float = 0.08) -> Splat:
    """Flat opaque Gaussians of one ``colour`` on the six faces of the cube [-half, half]^3."""
    g = np.arange(-1.0 + step / 2, 1.0, step)
    u, v = (a.ravel() * half for a in np.meshgrid(g, g, indexing="ij"))
    means, normals = [], []
    for axis in range(3):
        others = [a for a in range(3) if a != axis]
        for sign in (-1.0, 1.0):
            p, n = np.zeros((u.size, 3)), np.zeros((u.size, 3))
            p[:, others[0]], p[:, others[1]], p[:, axis] = u, v, sign * half
            n[:, axis] = sign
            means.append(p)
            normals.append(n)
    s = tangent_splat(np.concatenate(means), np.concatenate(normals), step * half, 0.2)
    s.sh_dc[:] = (torch.tensor(colour) - 0.5) / SH_C0
    s.opacity_logits[:] = 4.0
    return s


def cat(*splats: Splat) -> Splat:
    return Splat(**{k: torch.cat([s.tensors()[k] for s in splats]) for k in splats[0].tensors()})


@pytest.fixture(scope="module")
def room():
    """A closed room: walls of two layers, red inside and blue outside, meshed as one slab (inner
    surface facing in, outer facing out; the cleanup keeps the inner shell)."""
    splat = cat(box_layer(1.0, INNER), box_layer(1.12, OUTER))
    result = scene_to_mesh(splat, FieldConfig(), MeshConfig(threshold="auto", remove_cavities=False))
    return splat, result


def _inner_faces(mesh) -> np.ndarray:
    """[F] bool: the faces of the room's inner surface (their centres inside the inner layer)."""
    centres = mesh.vertices[mesh.faces].mean(1)
    return np.abs(centres).max(1) < 1.0


def _face_colours(mesh) -> np.ndarray:
    """[F, 3] the texture at each face's centre (its UVs' mean)."""
    from microdreamer.mesh.types import sample_texture_numpy

    return sample_texture_numpy(mesh.texture_float(), mesh.uv[mesh.faces].mean(1))


def _same_geometry(textured, mesh) -> None:
    """The textured mesh has the input's faces, in order, at the same positions (vertices split at seams
    only), and UVs in [0, 1]."""
    assert textured.num_faces == mesh.num_faces
    np.testing.assert_array_equal(textured.vertices[textured.faces], mesh.vertices[mesh.faces])
    assert textured.uv.shape == (textured.num_vertices, 2)
    assert np.isfinite(textured.uv).all() and textured.uv.min() >= 0.0 and textured.uv.max() <= 1.0
    assert textured.texture.shape == (CONFIG.size, CONFIG.size, 3) and textured.texture.dtype == np.uint8


def test_room_is_baked_from_inside(room):
    splat, result = room
    mesh = result.mesh
    inner = _inner_faces(mesh)
    assert 0.1 < inner.mean() < 0.9  # both surfaces are there
    out = texture_tile(mesh, splat, CONFIG, VIEWS, level=result.level)
    s = out.stats
    assert s["views"] == "free space"
    assert s["ring_coverage"] < 0.9  # the ring sees the outside only
    assert s["coverage"] > 0.95 and s["positions"] >= 1
    _same_geometry(out.mesh, mesh)
    colours = _face_colours(out.mesh)
    # the inner walls carry the inner layer's colour (a bake from outside would give them the outer one)
    inner_median = np.median(colours[inner], axis=0)
    assert np.abs(inner_median - INNER).max() < 0.1, inner_median
    outer_median = np.median(colours[~inner], axis=0)
    assert np.abs(outer_median - OUTER).max() < 0.1, outer_median
    assert s["texels_from_views"] > 0.5
    assert s["texels_from_views"] + s["texels_from_field"] + s["texels_filled"] == pytest.approx(
        1.0, abs=1e-3
    )


def test_unseen_texels_take_the_colour_field(room):
    """One position inside the room sees the inner walls only: the outer surface's texels are the colour
    field's (here a stand-in that paints them green)."""
    splat, result = room
    mesh = result.mesh
    green = np.array([0.0, 1.0, 0.0], np.float32)
    out = texture_tile(mesh, splat, CONFIG, TileViews(size=96, max_positions=1), level=result.level,
                       field_colors=lambda points: np.tile(green, (len(points), 1)))  # fmt: skip
    s = out.stats
    assert s["views"] == "free space" and s["positions"] == 1
    assert s["texels_from_field"] > 0.2
    colours = _face_colours(out.mesh)
    inner = _inner_faces(mesh)
    np.testing.assert_allclose(np.median(colours[~inner], axis=0), green, atol=0.02)
    assert np.abs(np.median(colours[inner], axis=0) - INNER).max() < 0.1


def test_default_field_colour_is_the_splats():
    """Without a stand-in, the unseen texels take the splat's colour field (the room's outer surface, seen
    by no view when only one position inside is allowed, is blue-ish: the outer layer's colour)."""
    splat = cat(box_layer(1.0, INNER), box_layer(1.12, OUTER))
    result = scene_to_mesh(splat, FieldConfig(), MeshConfig(threshold="auto", remove_cavities=False))
    out = texture_tile(result.mesh, splat, CONFIG, TileViews(size=96, max_positions=1), level=result.level)
    colours = _face_colours(out.mesh)
    outer = ~_inner_faces(result.mesh)
    median = np.median(colours[outer], axis=0)
    assert median[2] > median[0], median  # more of the outer (blue) layer than of the inner (red) one


def test_object_takes_the_ring():
    splat = surface_splat(1500, radius=0.5, scale=0.05)
    result = scene_to_mesh(splat, FieldConfig(), MeshConfig(threshold="auto"))
    out = texture_tile(result.mesh, splat, CONFIG, VIEWS, level=result.level)
    assert out.stats["views"] == "ring"
    assert out.stats["cameras"] == CONFIG.bake.views.num_views
    assert out.stats["texels_from_views"] > 0.95
    _same_geometry(out.mesh, result.mesh)
    # the bake matches the vertex colours of the colour field
    ref = scene_to_mesh(splat, FieldConfig(), MeshConfig(threshold="auto"), colors=True).mesh
    baked = out.mesh.colors_at_vertices()
    np.testing.assert_allclose(np.median(baked, 0), np.median(ref.vertex_colors, 0), atol=0.05)


def test_scene_tiles_render_only_their_neighbourhood():
    """Two objects far apart, cut into tiles: each tile is textured, renders only the Gaussians near it,
    and the tiles' faces are the scene's."""
    one = surface_splat(1500, radius=0.5, scale=0.05)
    far = one.tensors()
    far = Splat(**{**far, "means": far["means"] + torch.tensor([6.0, 0.0, 0.0])})
    splat = cat(one, far)
    plan = plan_scene(splat, FieldConfig(), tiles_along_longest=4)
    result = scene_to_mesh(splat, FieldConfig(), MeshConfig(threshold="auto"), plan=plan)
    lines = []
    tiles = texture_scene(result, splat, CONFIG, VIEWS, progress=lines.append)
    parts = result.tile_meshes()
    assert len(tiles) == len(parts) == len(lines) >= 2
    assert sum(t.mesh.num_faces for t in tiles) == result.mesh.num_faces
    assert all(line.split(", ")[1].startswith("ring") for line in lines), lines
    for tile, (t, part) in zip(tiles, parts, strict=True):
        assert tile.stats["tile"] == t
        assert tile.stats["gaussians"] <= len(one) < tile.stats["gaussians_scene"]
        _same_geometry(tile.mesh, part)


# ------------------------------------------------------------------- mesh --tiles --tile-texture bake
#: the CLI's bake at test sizes (the defaults' 512^2 views would take minutes a tile)
#: small bake renders
SMALL_BAKE = "texture:\n  bake:\n    views:\n      size: 64\n"
#: the spheres are hollow (shells of Gaussians): their inner shells removed as an object's are, so that
#: every tile is seen from the ring
NO_CAVITIES = "scene:\n  remove_cavities: true\n"


def _bake_cli(tmp_path, capsys, output: str, *extra: str) -> tuple[int, str, str]:
    from microdreamer import cli
    from microdreamer.splat import write_ply
    from test_scene import SCENE, spheres

    write_ply(spheres(SCENE[:2], n=600), tmp_path / "scene.ply")
    (tmp_path / "small.yaml").write_text(SMALL_BAKE + NO_CAVITIES)
    rc = cli.main(["mesh", str(tmp_path / "scene.ply"), "-o", str(tmp_path / output), "--tiles", "2",
                   "--tile-texture", "bake", "--texture-size", "64", "--config", str(tmp_path / "small.yaml"),
                   *extra])  # fmt: skip
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def test_bake_writes_a_texture_per_tile_node_and_tileset_tile(tmp_path, capsys):
    from test_tileset import glb_json

    rc, out, err = _bake_cli(tmp_path, capsys, "scene.glb", "--tileset", str(tmp_path / "ts"))
    assert rc in (0, None), err
    lines = [line for line in err.splitlines() if "texture: tile " in line]
    assert len(lines) >= 2 and all(", ring, 26 views" in line for line in lines), lines
    n = len(lines)
    assert f"texture per tile baked in {n} tiles ({n} ring)" in out, out
    assert "(a texture per tile's node)" in out
    doc = glb_json(tmp_path / "scene.glb")
    assert len(doc["nodes"]) == len(doc["materials"]) == len(doc["images"]) == n
    prims = [m["primitives"][0] for m in doc["meshes"]]
    assert sorted(p["material"] for p in prims) == list(range(n))
    assert all("TEXCOORD_0" in p["attributes"] for p in prims)
    for node in doc["nodes"]:
        tile = glb_json(tmp_path / "ts" / "tiles" / f"{node['name']}.glb")
        assert len(tile["materials"]) == len(tile["images"]) == 1
    assert not (tmp_path / "scene.glb.tiles").exists()


@pytest.mark.parametrize("suffix", [".ply", ".obj"])
def test_bake_into_one_mesh_samples_the_textures(tmp_path, capsys, suffix):
    """An .obj or .ply holds one mesh: the tiles' textures sampled at its vertices, said so."""
    import trimesh

    rc, out, err = _bake_cli(tmp_path, capsys, "out" + suffix)
    assert rc in (0, None), err
    assert "the tiles' textures sampled into vertex colours" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["scene.ply", "small.yaml", "out" + suffix])
    mesh = trimesh.load(tmp_path / ("out" + suffix), process=False)
    colours = np.asarray(mesh.visual.vertex_colors)[:, :3] / 255.0
    assert colours.std(0).max() > 0.05  # coloured, not one grey


@pytest.mark.parametrize(
    "args, message",
    [
        (["--tile-texture", "bake"], "--tiles auto"),
        (["--tiles", "2", "--tile-texture", "bake", "--texture", "none"], "--texture none"),
    ],
)
def test_bake_bad_input_is_one_line(tmp_path, capsys, args, message):
    from microdreamer import cli
    from microdreamer.splat import write_ply
    from test_scene import SCENE, spheres

    write_ply(spheres(SCENE[:1], n=100), tmp_path / "scene.ply")
    rc = cli.main(["mesh", str(tmp_path / "scene.ply"), "-o", str(tmp_path / "o.glb"), *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and message in err[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["scene.ply"]


def test_tile_vertex_colours_are_the_textures_at_the_vertices():
    from microdreamer.scene.texture import tile_vertex_colours
    from test_scene import SCENE, spheres

    splat = spheres(SCENE[:2], n=600)
    result = scene_to_mesh(splat, FieldConfig(), MeshConfig(threshold="auto"), tiles_along_longest=2)
    tiles = texture_scene(result, splat, CONFIG, VIEWS)
    colours = tile_vertex_colours(result, tiles)
    assert colours.shape == (result.mesh.num_vertices, 3) and colours.dtype == np.float32
    for tile in tiles:  # each corner's texture sample against the vertex's colour (seam vertices: a mean)
        faces = result.mesh.faces[result.face_tile == tile.stats["tile"]]
        sampled = tile.mesh.colors_at_vertices()[tile.mesh.faces]
        assert np.median(np.abs(colours[faces] - sampled)) < 0.02


def test_room_keeps_its_inner_walls_and_is_baked_from_inside(tmp_path, capsys):
    """``mesh --tiles`` at the defaults keeps a closed room's inner walls (the cleanup's cavities are kept in
    a scene) and the bake textures them from free space."""
    from microdreamer import cli
    from microdreamer.splat import write_ply
    from test_tileset import glb_json

    write_ply(cat(box_layer(1.0, INNER), box_layer(1.12, OUTER)), tmp_path / "room.ply")
    (tmp_path / "small.yaml").write_text(SMALL_BAKE)
    rc = cli.main(["mesh", str(tmp_path / "room.ply"), "-o", str(tmp_path / "room.glb"), "--tiles", "1",
                   "--tile-texture", "bake", "--texture-size", "128", "--config", str(tmp_path / "small.yaml")])  # fmt: skip
    out = capsys.readouterr().out
    assert rc in (0, None)
    assert "baked in 1 tiles (1 free-space)" in out, out  # the ring alone would see the outer walls whole
    doc = glb_json(tmp_path / "room.glb")
    assert len(doc["materials"]) == 1


def test_scene_cavities_are_kept_unless_asked():
    from microdreamer.config import ExportConfig, SceneConfig
    from microdreamer.jobs.export import export_mesh

    splat = cat(box_layer(1.0, INNER), box_layer(1.12, OUTER))
    for remove in (False, True):
        config = ExportConfig(
            texture=TextureConfig(mode="none"), scene=SceneConfig(tiles=1, remove_cavities=remove)
        )
        with tempfile.TemporaryDirectory() as folder:
            result = export_mesh(splat, Path(folder) / "room.ply", config, torch.device("cpu"))
        inner = _inner_faces(result.mesh)
        assert result.convert.mesh_stats["cavities_removed"] == int(remove)
        assert (inner.mean() > 0.2) if not remove else not inner.any()


@pytest.mark.cuda
def test_room_bake_on_cuda_matches_the_cpu(room):
    """The tile's bake on the GPU (texels, renders, visibility there): the same views chosen, the same
    geometry and UVs, and the inner and outer walls' colours as the CPU bake gives them."""
    splat, result = room
    mesh = result.mesh
    cpu = texture_tile(mesh, splat, CONFIG, VIEWS, level=result.level)
    gpu = texture_tile(mesh, splat, CONFIG, VIEWS, level=result.level, device="cuda")
    assert gpu.stats["views"] == cpu.stats["views"] == "free space"
    assert gpu.stats["cameras"] == cpu.stats["cameras"]
    _same_geometry(gpu.mesh, mesh)
    np.testing.assert_array_equal(gpu.mesh.uv, cpu.mesh.uv)
    inner = _inner_faces(mesh)
    a, b = _face_colours(cpu.mesh), _face_colours(gpu.mesh)
    for part in (inner, ~inner):
        assert np.abs(np.median(a[part], 0) - np.median(b[part], 0)).max() < 0.02
    assert abs(gpu.stats["texels_from_views"] - cpu.stats["texels_from_views"]) < 0.02


@pytest.mark.cuda
def test_bake_cli_on_cuda(tmp_path, capsys):
    """`mesh --tiles 2 --tile-texture bake --device cuda`: the splat loaded on the GPU, every tile baked
    from the ring there, one textured node a tile (the CLI's path, not only :func:`texture_tile`'s)."""
    from test_tileset import glb_json

    rc, out, err = _bake_cli(tmp_path, capsys, "scene.glb", "--device", "cuda")
    assert rc in (0, None), err
    lines = [line for line in err.splitlines() if "texture: tile " in line]
    assert len(lines) >= 2 and all(", ring, 26 views" in line for line in lines), lines
    doc = glb_json(tmp_path / "scene.glb")
    assert len(doc["nodes"]) == len(doc["images"]) == len(lines)


# ------------------------------------------------------------------------------- the capture's cameras
def _inside_capture() -> list:
    """An INRIA cameras.json of a capture walked inside the room: 8 photos from near the centre, looking
    at the four walls, the floor and the ceiling."""
    from test_capture import _axes

    looks = [
        (1, 0, 0),
        (-1, 0, 0),
        (0, 0, 1),
        (0, 0, -1),
        (0.3, -1, 0.1),
        (-0.2, 1, 0.1),
        (1, 0.2, 1),
        (-1, -0.2, -1),
    ]
    cams = []
    for i, look in enumerate(looks):
        p = np.array([0.1 * (i % 3) - 0.1, 0.05, 0.1 * (i % 2)])
        cams.append({"id": i, "width": 320, "height": 240, "position": p.tolist(),
                     "rotation": _axes(p, p + np.array(look, float)).tolist(), "fx": 160.0, "fy": 160.0})  # fmt: skip
    return cams


def test_room_is_baked_from_the_capture_cameras(room, tmp_path):
    """Given the capture's own cameras (inside the room), the bake takes those instead of free-space
    positions: the inner walls in the inner colour."""
    import json

    from microdreamer.data.capture import read_capture_cameras

    splat, result = room
    (tmp_path / "cameras.json").write_text(json.dumps(_inside_capture()))
    capture = read_capture_cameras(tmp_path / "cameras.json")
    out = texture_tile(result.mesh, splat, CONFIG, VIEWS, level=result.level, capture=capture)
    s = out.stats
    assert s["views"] == "capture" and 1 <= s["cameras"] <= len(capture) and s["positions"] >= 1
    _same_geometry(out.mesh, result.mesh)
    inner = _inner_faces(result.mesh)
    colours = _face_colours(out.mesh)
    assert np.abs(np.median(colours[inner], axis=0) - INNER).max() < 0.1
    assert np.abs(np.median(colours[~inner], axis=0) - OUTER).max() < 0.1  # the ring's too


def test_cameras_flag(tmp_path, capsys):
    """`--cameras FILE`: read before any work and named in a line, the room baked from them; a bad file or
    no bake is one line with nothing written."""
    import json

    from microdreamer import cli
    from microdreamer.splat import write_ply

    write_ply(cat(box_layer(1.0, INNER), box_layer(1.12, OUTER)), tmp_path / "room.ply")
    (tmp_path / "small.yaml").write_text(SMALL_BAKE)
    (tmp_path / "cameras.json").write_text(json.dumps(_inside_capture()))
    (tmp_path / "bad.json").write_text(json.dumps({"frames": "none"}))
    base = ["mesh", str(tmp_path / "room.ply"), "-o", str(tmp_path / "room.glb"), "--tiles", "1",
            "--texture-size", "128", "--config", str(tmp_path / "small.yaml")]  # fmt: skip
    before = sorted(p.name for p in tmp_path.iterdir())
    for extra, message in (
        (["--tile-texture", "bake", "--cameras", str(tmp_path / "bad.json")], "neither an INRIA cameras.json"),
        (["--cameras", str(tmp_path / "cameras.json")], "are the bake's views; add --tile-texture bake"),
    ):  # fmt: skip
        assert cli.main(base + extra) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1].startswith("error: ") and message in err[-1], err
        assert sorted(p.name for p in tmp_path.iterdir()) == before
    (tmp_path / "batch").mkdir()
    write_ply(cat(box_layer(1.0, INNER)), tmp_path / "batch" / "a.ply")
    batch = ["mesh", str(tmp_path / "batch"), "-o", str(tmp_path / "out"), "--tiles", "1", "--tile-texture", "bake",
             "--cameras", str(tmp_path / "cameras.json")]  # fmt: skip
    assert cli.main(batch) == 2
    assert "one capture's cameras; give that capture's splat alone" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    rc = cli.main(base + ["--tile-texture", "bake", "--cameras", str(tmp_path / "cameras.json")])
    captured = capsys.readouterr()
    assert rc in (0, None), captured.err
    assert "capture cameras: 8 from " in captured.err
    assert "baked in 1 tiles (1 capture cameras)" in captured.out, captured.out
