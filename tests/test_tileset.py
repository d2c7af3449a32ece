"""A tiled scene's outputs (microdreamer.scene.tileset, jobs/scene.py): the GLB of one node per tile and the
OGC 3D Tiles 1.1 folder, checked by the Khronos glTF validator and read back by loaders.gl."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

from microdreamer.config import FieldConfig, MeshConfig
from microdreamer.mesh.types import Mesh
from microdreamer.scene import plan_scene, scene_to_mesh, tile_of_points
from microdreamer.scene.tileset import Y_UP_TO_Z_UP, box_volume
from test_scene import SCENE, spheres

pytest.importorskip("skimage")


def _validator() -> Path | None:
    npm_root = (
        shutil.which("npm") and subprocess.run(["npm", "root", "-g"], capture_output=True, text=True).stdout
    )
    path = Path(npm_root.strip()) / "gltf-validator" if npm_root else None
    return path if path and (path / "index.js").is_file() and shutil.which("node") else None


needs_validator = pytest.mark.skipif(
    _validator() is None, reason="the Khronos glTF validator is not installed (npm gltf-validator)"
)


def validate(paths: list[Path]) -> dict[str, list[dict]]:
    """The validator's errors (severity 0) per file, all files in one node process."""
    script = (f"const v=require({json.dumps(str(_validator()))});const fs=require('fs');"
              f"Promise.all({json.dumps([str(p) for p in paths])}.map(p=>v.validateBytes("
              "new Uint8Array(fs.readFileSync(p))).then(r=>[p,r.issues.messages.filter(m=>m.severity===0)])))"
              ".then(r=>console.log(JSON.stringify(Object.fromEntries(r))))")  # fmt: skip
    run = subprocess.run(["node", "-e", script], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def glb_json(path: Path) -> dict:
    data = path.read_bytes()
    (length,) = struct.unpack_from("<I", data, 12)
    return json.loads(data[20 : 20 + length])


@pytest.fixture(scope="module")
def tiled():
    """Four spheres meshed in 2 x 3 x 3 tiles (several tiles cut each sphere), vertex colours."""
    splat = spheres(SCENE[:4])
    plan = plan_scene(splat, FieldConfig(), tiles_along_longest=3)
    assert plan.num_tiles > 8
    return scene_to_mesh(splat, FieldConfig(), MeshConfig(threshold="auto"), plan=plan, colors=True)


def test_tile_meshes_split_the_welded_mesh(tiled):
    pieces = tiled.tile_meshes()
    assert len(pieces) > 8 and len({t for t, _ in pieces}) == len(pieces)
    assert sum(m.num_faces for _, m in pieces) == tiled.mesh.num_faces
    # each face is where its tile's cells are (the tile that made it)
    centroids = tiled.mesh.vertices[tiled.mesh.faces].astype(np.float64).mean(1)
    assert np.array_equal(tile_of_points(tiled.plan, centroids), tiled.face_tile)
    # the seams: every vertex of a tile is a vertex of the welded mesh, bit for bit, colour included
    whole = {tuple(v) for v in tiled.mesh.vertices.tolist()}
    shared = 0
    for _, m in pieces:
        assert {tuple(v) for v in m.vertices.tolist()} <= whole
        shared += m.num_vertices
    assert shared > tiled.mesh.num_vertices  # seam vertices are in two tiles or more
    faces = np.concatenate([m.vertices[m.faces].reshape(-1, 9) for _, m in pieces])
    ours = tiled.mesh.vertices[tiled.mesh.faces].reshape(-1, 9)
    assert np.array_equal(np.unique(faces, axis=0), np.unique(ours, axis=0))


def test_decimated_faces_go_to_the_tile_of_their_centroid():
    splat = spheres(SCENE[:2], n=600)
    config = MeshConfig(threshold="auto", decimate_target=2000)
    result = scene_to_mesh(splat, FieldConfig(), config, tiles_along_longest=2)
    assert result.mesh.num_faces <= 2200 and result.face_tile.shape == (result.mesh.num_faces,)
    assert sum(m.num_faces for _, m in result.tile_meshes()) == result.mesh.num_faces


def test_box_volume_turns_y_up_into_z_up():
    lo, hi = np.array([1.0, 2.0, 3.0]), np.array([2.0, 6.0, 4.0])
    box = np.array(box_volume(lo, hi))
    assert np.allclose(box[:3], [1.5, -3.5, 4.0])  # (x, -z, y) of the centre (1.5, 4, 3.5)
    axes = box[3:].reshape(3, 3)
    assert np.allclose(np.abs(axes).sum(0), [0.5, 0.5, 2.0])  # z-up extents: x, z (0.5), y (2)
    assert np.allclose(Y_UP_TO_Z_UP @ [0.0, 1.0, 0.0], [0.0, 0.0, 1.0])  # glTF's up is 3D Tiles' up


@needs_validator
def test_node_per_tile_glb_validates(tiled, tmp_path):
    """The tiles' GLB, and one with textured tiles (each its own material and image)."""
    from microdreamer.mesh import save_glb_nodes

    pieces = tiled.tile_meshes()
    names = [f"tile_{t}" for t, _ in pieces]
    plain = save_glb_nodes([m for _, m in pieces], tmp_path / "nodes.glb", names)
    rng = np.random.default_rng(0)
    textured = []
    for k, (_, m) in enumerate(pieces[:3]):
        image = np.full((8, 16, 3), 60 * k, np.uint8)
        textured.append(Mesh(m.vertices, m.faces, None, rng.random((m.num_vertices, 2)), image))
    mixed = save_glb_nodes([*textured, *(m for _, m in pieces[3:])], tmp_path / "mixed.glb", names)
    assert validate([plain, mixed]) == {str(plain): [], str(mixed): []}
    doc = glb_json(plain)
    assert [n["name"] for n in doc["nodes"]] == names and len(doc["meshes"]) == len(pieces)
    assert doc["scenes"][0]["nodes"] == list(range(len(pieces)))
    doc = glb_json(mixed)
    assert len(doc["materials"]) == len(doc["images"]) == 3
    assert [m["primitives"][0].get("material") for m in doc["meshes"][:4]] == [0, 1, 2, None]


def _tileset_cli(tmp_path, *extra) -> tuple[Path, Path]:
    from microdreamer import cli
    from microdreamer.splat import write_ply

    write_ply(spheres(SCENE[:4]), tmp_path / "scene.ply")
    out, folder = tmp_path / "scene.glb", tmp_path / "ts"
    rc = cli.main(["mesh", str(tmp_path / "scene.ply"), "-o", str(out), "--tiles", "3", "--tileset", str(folder),
                   *extra])  # fmt: skip
    assert rc in (0, None)
    return out, folder


def _loaders_gl() -> Path | None:
    """The global npm folder when @loaders.gl/core, 3d-tiles and gltf are installed there (.ci/run)."""
    npm_root = (
        shutil.which("npm") and subprocess.run(["npm", "root", "-g"], capture_output=True, text=True).stdout
    )
    root = Path(npm_root.strip()) if npm_root else None
    wanted = ("core", "3d-tiles", "gltf")
    if (
        root
        and shutil.which("node")
        and all((root / "@loaders.gl" / w / "package.json").is_file() for w in wanted)
    ):
        return root
    return None


#: reads a tileset with loaders.gl (Tiles3DLoader, then GLTFLoader for every tile's content) and prints it
#: as JSON: version, error, and per tile refine (1 ADD, 2 REPLACE), error, box, uri, positions, colours
READER = """
const R = process.argv[1], file = process.argv[2], fs = require('fs');
const {parse} = require(R + '/@loaders.gl/core');
const {Tiles3DLoader} = require(R + '/@loaders.gl/3d-tiles');
const {GLTFLoader, postProcessGLTF} = require(R + '/@loaders.gl/gltf');
const tile = async (t) => {
  const out = {refine: t.refine ?? null, error: t.lodMetricValue, box: t.boundingVolume.box, uri: t.contentUrl ?? null};
  if (t.contentUrl) {
    const g = postProcessGLTF(await parse(fs.readFileSync(t.contentUrl), GLTFLoader));
    const prims = g.meshes.flatMap((m) => m.primitives);
    out.positions = prims.flatMap((p) => Array.from(p.attributes.POSITION.value));
    out.colors = prims.every((p) => !!p.attributes.COLOR_0 || !!p.material);
  }
  out.children = [];
  for (const c of t.children || []) out.children.push(await tile(c));
  return out;
};
parse(fs.readFileSync(file), Tiles3DLoader, {}, {url: file}).then(async (ts) =>
  console.log(JSON.stringify({version: ts.asset.version, error: ts.lodMetricValue, root: await tile(ts.root)})));
"""


def _box_corners(box: list[float]) -> np.ndarray:
    """The 8 corners of a 3D Tiles box (centre, then three half-axis vectors)."""
    c, axes = np.asarray(box[:3]), np.asarray(box[3:]).reshape(3, 3)
    signs = np.array([[x, y, z] for x in (-1, 1) for y in (-1, 1) for z in (-1, 1)], np.float64)
    return c + signs @ axes


@pytest.mark.skipif(
    _loaders_gl() is None, reason="loaders.gl is not installed (npm @loaders.gl/core, 3d-tiles, gltf)"
)
def test_tileset_reads_back(tmp_path):
    """The tileset and its GLBs as loaders.gl (an independent reader: Tiles3DLoader, GLTFLoader) reads them:
    asset 1.1, the root's box holds its children's, every tile's content (y-up, turned z-up) lies in its box,
    leaves' error 0."""
    out, folder = _tileset_cli(tmp_path)
    nodes = glb_json(out)["nodes"]
    doc = json.loads((folder / "tileset.json").read_text())
    assert sorted(c["content"]["uri"] for c in doc["root"]["children"]) == sorted(
        f"tiles/{n['name']}.glb" for n in nodes
    )
    run = subprocess.run(["node", "-e", READER, str(_loaders_gl()), str((folder / "tileset.json").resolve())],
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr
    read = json.loads(run.stdout)
    assert read["version"] == "1.1"
    root = read["root"]
    assert root["refine"] == 2 and Path(root["uri"]).name == "root.glb"  # REPLACE
    voxel = 0.02  # the scene's voxel is a few hundredths: the root's error is more than one
    assert root["error"] > voxel and read["error"] >= root["error"]
    corners = _box_corners(root["box"])
    lo, hi = corners.min(0), corners.max(0)
    assert len(root["children"]) == len(nodes)
    for child in root["children"]:
        assert child["error"] == 0 and not child["children"]
        box = _box_corners(child["box"])
        assert (box.min(0) >= lo - 1e-6).all() and (box.max(0) <= hi + 1e-6).all()
        points = np.asarray(child["positions"], np.float64).reshape(-1, 3) @ Y_UP_TO_Z_UP.T
        assert len(points) and (points >= box.min(0) - 1e-6).all() and (points <= box.max(0) + 1e-6).all()
        assert child["colors"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # nothing staged left behind


@needs_validator
def test_tileset_glbs_validate(tmp_path):
    out, folder = _tileset_cli(tmp_path, "--texture", "none")
    files = [out, *sorted((folder / "tiles").glob("*.glb"))]
    assert len(files) > 3
    assert validate(files) == {str(p): [] for p in files}


@pytest.mark.parametrize(
    "args, message",
    [
        (["--tileset", "{tmp}/ts"], "--tiles auto"),
        (["--tiles", "2", "--tileset", "{tmp}/scene.ply"], "not a folder"),
    ],
)
def test_tileset_bad_input_is_one_line(tmp_path, capsys, args, message):
    from microdreamer import cli
    from microdreamer.splat import write_ply

    write_ply(spheres(SCENE[:1], n=100), tmp_path / "scene.ply")
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    rc = cli.main(["mesh", str(tmp_path / "scene.ply"), "-o", str(tmp_path / "o.glb"), *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and message in err[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["scene.ply"]


def test_a_failed_tileset_leaves_neither_output(tmp_path, capsys, monkeypatch):
    """The tileset fails after the checks (a full disk, say): the .glb is not left behind either, and an
    earlier .glb of that name is kept as it was; the finished tiles stay in the work folder for a rerun."""
    from microdreamer import cli
    from microdreamer.scene import tileset
    from microdreamer.splat import write_ply

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    write_ply(spheres(SCENE[:2], n=100), tmp_path / "scene.ply")
    (tmp_path / "o.glb").write_bytes(b"earlier")
    monkeypatch.setattr(tileset, "write_tileset", full_disk)
    rc = cli.main(["mesh", str(tmp_path / "scene.ply"), "-o", str(tmp_path / "o.glb"), "--tiles", "2",
                   "--tileset", str(tmp_path / "ts"), "--overwrite", "--texture", "none"])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert rc != 0 and err[-1].startswith("error: "), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o.glb", "o.glb.tiles", "scene.ply"]
    assert (tmp_path / "o.glb").read_bytes() == b"earlier"


@pytest.mark.parametrize("extra", [["--tiles", "2"], ["--resolution", "32"]])
def test_a_glb_past_4_gib_is_one_line(tmp_path, capsys, monkeypatch, extra):
    """A .glb's length is a uint32: a mesh that would pass it (here the limit made small) is refused in one
    line that names the output and says what to do, with nothing written (a rerun as it is would fail
    again, so a scene's finished tiles are not kept)."""
    from microdreamer import cli
    from microdreamer.mesh import export
    from microdreamer.splat import write_ply

    write_ply(spheres(SCENE[:2], n=100), tmp_path / "scene.ply")
    monkeypatch.setattr(export, "GLB_MAX_BYTES", 1000)
    rc = cli.main(
        ["mesh", str(tmp_path / "scene.ply"), "-o", str(tmp_path / "o.glb"), "--texture", "none", *extra]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and err[-1].startswith(f"error: {tmp_path / 'o.glb'}: "), err
    assert "a .glb holds at most 4 GiB; write OUT.ply" in err[-1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["scene.ply"]  # the tiles' work folder too
