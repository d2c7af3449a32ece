"""Datasets (transforms.json round trips, errors, atomic writes), render_views, and mesh loading."""

from __future__ import annotations

import base64
import io
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from microdreamer.cameras import orbit_cameras
from microdreamer.config import ViewsConfig
from microdreamer.data import Normalization, load_dataset, render_views, save_dataset, view_angles
from microdreamer.errors import InputError
from microdreamer.mesh import Mesh
from microdreamer.mesh.load import load_textured_mesh
from microdreamer.render.mesh import render_mesh

SAMPLES = Path(__file__).parents[1] / ".." / "shared" / "samples"
SPOT = SAMPLES / "meshes" / "spot"


def _random_views(seed: int, C: int = 5, H: int = 12, W: int = 16):
    g = torch.Generator().manual_seed(seed)
    images = torch.rand(C, H, W, 4, generator=g)
    cams = orbit_cameras(
        torch.rand(C, generator=g) * 60 - 30, torch.rand(C, generator=g) * 360, 2.0, 40.0, W, H
    )
    return images, cams


def _one_line_input_error(excinfo) -> None:
    assert "\n" not in str(excinfo.value)


# --------------------------------------------------------------------------------------------
# save / load


def test_round_trip(tmp_path):
    images, cams = _random_views(0)
    held = torch.tensor([False, True, False, False, True])
    norm = Normalization([0.1, -0.2, 0.3], 0.75)
    out = save_dataset(tmp_path / "ds", images, cams, held, normalization=norm, extra={"note": "x"})
    ds = load_dataset(out)
    # 8-bit PNGs: each value within half a quantisation step
    assert (ds.images - images).abs().max() <= 0.5 / 255 + 1e-6
    torch.testing.assert_close(ds.cameras.viewmats, cams.viewmats, rtol=0, atol=1e-5)
    torch.testing.assert_close(ds.cameras.Ks, cams.Ks, rtol=1e-6, atol=1e-4)
    assert (ds.cameras.width, ds.cameras.height) == (16, 12)
    assert torch.equal(ds.held_out, held)
    assert ds.names == [f"r_{i:03d}" for i in range(5)]
    np.testing.assert_allclose(ds.normalization.center, [0.1, -0.2, 0.3])
    assert ds.normalization.scale == 0.75
    meta = json.loads((out / "transforms.json").read_text())
    assert meta["note"] == "x" and meta["frames"][1]["held_out"] is True
    # camera_angle_x agrees with the focal length (NeRF-synthetic readers use only this)
    assert abs(meta["camera_angle_x"] - 2 * math.atan(16 / (2 * float(cams.Ks[0, 0, 0])))) < 1e-9
    assert len(ds.train()) == 3 and len(ds.test()) == 2
    assert ds.test().names == ["r_001", "r_004"]


def test_round_trip_per_frame_intrinsics_and_rgb_images(tmp_path):
    images, cams = _random_views(1, C=3)
    cams.Ks[1, 0, 0] *= 1.1
    cams.Ks[2, 1, 2] += 0.5
    save_dataset(tmp_path / "ds", images[..., :3], cams)
    ds = load_dataset(tmp_path / "ds")
    torch.testing.assert_close(ds.cameras.Ks, cams.Ks, rtol=1e-6, atol=1e-4)
    assert (ds.images[..., 3] == 1).all()  # RGB images are opaque


def test_normalization_apply_invert():
    norm = Normalization([1.0, 2.0, 3.0], 0.5)
    p = np.random.default_rng(0).normal(size=(10, 3))
    np.testing.assert_allclose(norm.apply(p), (p - [1, 2, 3]) * 0.5)
    np.testing.assert_allclose(norm.invert(norm.apply(p)), p, atol=1e-12)


def test_normalization_with_rotation_round_trips_and_upright_keeps_units(tmp_path):
    from microdreamer.orient import up_rotation

    R = np.asarray(up_rotation("+z"))
    norm = Normalization([1.0, 2.0, 3.0], 0.5, R)
    p = np.random.default_rng(1).normal(size=(10, 3))
    np.testing.assert_allclose(norm.apply(p), 0.5 * (p - [1, 2, 3]) @ R.T)
    np.testing.assert_allclose(norm.invert(norm.apply(p)), p, atol=1e-12)
    np.testing.assert_allclose(norm.upright(norm.apply(p)), p @ R.T, atol=1e-12)  # R x: units kept
    s, t = norm.upright_similarity()
    np.testing.assert_allclose(s * norm.apply(p) + t, p @ R.T, atol=1e-12)
    images, cams = _random_views(0, C=2)
    ds = load_dataset(save_dataset(tmp_path / "ds", images, cams, normalization=norm))
    np.testing.assert_allclose(ds.normalization.rotation, R)
    plain = load_dataset(
        save_dataset(tmp_path / "plain", images, cams, normalization=Normalization([0, 0, 0], 1))
    )
    assert "rotation" not in json.loads((tmp_path / "plain" / "transforms.json").read_text())["normalization"]
    np.testing.assert_array_equal(plain.normalization.rotation, np.eye(3))
    with pytest.raises(ValueError, match="proper rotation"):
        Normalization([0, 0, 0], 1.0, np.diag([1.0, 1.0, -1.0]))


def _write_png(path: Path, array: np.ndarray) -> None:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array).save(path)


def test_reads_nerf_synthetic_split_layout_without_suffixes(tmp_path):
    W = H = 8
    rng = np.random.default_rng(0)
    c2w = np.eye(4)
    c2w[2, 3] = 3.0
    for split, n in (("train", 2), ("test", 1)):
        frames = []
        for i in range(n):
            _write_png(tmp_path / split / f"r_{i}.png", rng.integers(0, 256, (H, W, 4), dtype=np.uint8))
            frames.append(
                {"file_path": f"./{split}/r_{i}", "rotation": 0.0, "transform_matrix": c2w.tolist()}
            )
        (tmp_path / f"transforms_{split}.json").write_text(
            json.dumps({"camera_angle_x": 0.6, "frames": frames})
        )
    ds = load_dataset(tmp_path)
    assert ds.held_out.tolist() == [False, False, True]
    focal = 0.5 * W / math.tan(0.3)
    torch.testing.assert_close(
        ds.cameras.Ks[0], torch.tensor([[focal, 0, 4.0], [0, focal, 4.0], [0, 0, 1.0]])
    )
    # OpenGL camera at z = 3 looking down -z: OpenCV world-to-camera maps the origin to depth 3
    torch.testing.assert_close(
        ds.cameras.viewmats[0] @ torch.tensor([0.0, 0, 0, 1]), torch.tensor([0.0, 0, 3, 1])
    )


@pytest.fixture
def dataset_dir(tmp_path) -> Path:
    images, cams = _random_views(2, C=3)
    return save_dataset(tmp_path / "ds", images, cams)


def _edit_json(directory: Path, fn) -> None:
    path = directory / "transforms.json"
    meta = json.loads(path.read_text())
    fn(meta)
    path.write_text(json.dumps(meta))


def test_file_path_without_suffix(dataset_dir):
    def strip(meta):
        for f in meta["frames"]:
            f["file_path"] = f["file_path"][: -len(".png")]

    _edit_json(dataset_dir, strip)
    assert len(load_dataset(dataset_dir)) == 3


@pytest.mark.parametrize(
    "breakage, message",
    [
        ("no_folder", "does not exist"),
        ("no_json", "has no transforms.json"),
        ("bad_json", "cannot read"),
        ("no_frames", "no 'frames'"),
        ("no_image", "does not exist in"),
        ("bad_image", "cannot read image"),
        ("wrong_size", "one size"),
        ("wrong_wh", "says images are"),
        ("bad_matrix", "transform_matrix"),
        ("no_fov", "camera_angle_x"),
    ],
)
def test_load_errors(dataset_dir, breakage, message):
    d = dataset_dir
    if breakage == "no_folder":
        d = d / "missing"
    elif breakage == "no_json":
        (d / "transforms.json").unlink()
    elif breakage == "bad_json":
        (d / "transforms.json").write_text("{not json")
    elif breakage == "no_frames":
        _edit_json(d, lambda m: m.update(frames=[]))
    elif breakage == "no_image":
        (d / "images" / "r_001.png").unlink()
    elif breakage == "bad_image":
        (d / "images" / "r_001.png").write_bytes(b"not a png")
    elif breakage == "wrong_size":
        _write_png(d / "images" / "r_001.png", np.zeros((5, 5, 4), np.uint8))
    elif breakage == "wrong_wh":
        _edit_json(d, lambda m: m.update(w=99))
    elif breakage == "bad_matrix":
        _edit_json(d, lambda m: m["frames"][0].update(transform_matrix=[[1, 0], [0, 1]]))
    elif breakage == "no_fov":
        _edit_json(d, lambda m: [m.pop(k) for k in ("camera_angle_x", "fl_x")])
    with pytest.raises(InputError, match=message) as excinfo:
        load_dataset(d)
    _one_line_input_error(excinfo)


def test_save_is_atomic(tmp_path, monkeypatch):
    from PIL import Image

    images, cams = _random_views(3, C=4)
    target = save_dataset(tmp_path / "ds", images, cams)
    before = (target / "transforms.json").read_text()
    calls = {"n": 0}
    real_save = Image.Image.save

    def failing_save(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError("disk full")
        return real_save(self, *args, **kwargs)

    monkeypatch.setattr(Image.Image, "save", failing_save)
    with pytest.raises(OSError, match="disk full"):
        save_dataset(tmp_path / "ds", images.flip(0), cams)
    with pytest.raises(OSError, match="disk full"):
        calls["n"] = 0
        save_dataset(tmp_path / "new", images, cams)
    monkeypatch.undo()
    # the old dataset is intact, the new one was never created, no temporary folders are left
    assert (target / "transforms.json").read_text() == before
    assert len(load_dataset(target)) == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds"]


def test_save_refuses_non_dataset_folder(tmp_path):
    images, cams = _random_views(4, C=2)
    (tmp_path / "stuff").mkdir()
    (tmp_path / "stuff" / "keep.txt").write_text("mine")
    with pytest.raises(InputError, match="not empty") as excinfo:
        save_dataset(tmp_path / "stuff", images, cams)
    _one_line_input_error(excinfo)
    assert (tmp_path / "stuff" / "keep.txt").read_text() == "mine"
    (tmp_path / "empty").mkdir()
    save_dataset(tmp_path / "empty", images, cams)  # an empty folder is fine
    assert len(load_dataset(tmp_path / "empty")) == 2


# --------------------------------------------------------------------------------------------
# render_views


def test_view_angles():
    el, az, held = view_angles(8, 3, seed=5)
    assert el.shape == az.shape == held.shape == (11,)
    assert held.tolist() == [False] * 8 + [True] * 3
    torch.testing.assert_close(az[:8], torch.arange(8) * 45.0)
    # held-out azimuths sit halfway between training azimuths, in distinct gaps
    gaps = (az[8:] - 22.5) / 45.0
    torch.testing.assert_close(gaps, gaps.round())
    assert len(set(gaps.round().tolist())) == 3
    assert (el.abs() <= 30).all() and el.std() > 5
    el2, _, _ = view_angles(8, 3, seed=5)
    el3, _, _ = view_angles(8, 3, seed=6)
    assert torch.equal(el, el2) and not torch.equal(el, el3)


def _box_ply(path: Path) -> tuple[np.ndarray, np.ndarray]:
    import trimesh

    box = trimesh.creation.box(extents=(2.0, 1.0, 0.5))
    box.apply_translation([5.0, -1.0, 2.0])  # off-centre and not unit-sized: normalisation matters
    colors = np.tile(np.array([[200, 40, 90, 255]], np.uint8), (len(box.vertices), 1))
    mesh = trimesh.Trimesh(box.vertices, box.faces, vertex_colors=colors, process=False)
    mesh.export(path)
    return np.asarray(box.vertices), np.asarray(box.faces)


def test_render_views_frame_and_normalisation(tmp_path):
    verts, faces = _box_ply(tmp_path / "box.ply")
    out = render_views(
        tmp_path / "box.ply",
        tmp_path / "views",
        ViewsConfig(views=6, size=32, held_out=2, seed=1),
        device="cpu",
    )
    ds = load_dataset(out)
    assert len(ds) == 8 and ds.held_out.sum() == 2 and ds.images.shape == (8, 32, 32, 4)
    # normalisation: bounding-box centre to the origin, farthest vertex at 0.6
    np.testing.assert_allclose(ds.normalization.center, [5.0, -1.0, 2.0], atol=1e-6)
    v_ds = ds.normalization.apply(verts)
    assert abs(np.linalg.norm(v_ds, axis=1).max() - 0.6) < 1e-6
    # cameras on the orbit of radius 2 around the origin, looking at it
    torch.testing.assert_close(
        ds.cameras.camera_centers().norm(dim=-1), torch.full((8,), 2.0), rtol=1e-5, atol=0
    )
    centre_px = ds.cameras.Ks @ (ds.cameras.viewmats[:, :3, 3:])  # the origin's projection
    torch.testing.assert_close(centre_px[:, :2, 0] / centre_px[:, 2:, 0], torch.full((8, 2), 16.0))
    # the images are the normalised mesh seen by the stored cameras: re-rendering from the loaded
    # dataset's cameras reproduces the saved alpha (up to 8-bit quantisation)
    again = render_mesh(Mesh(v_ds, faces), ds.cameras, ssaa=2)
    assert (again.alpha[..., 0] - ds.images[..., 3]).abs().max() <= 0.5 / 255 + 1e-6
    # straight colour where covered: the vertex colour (200, 40, 90)
    covered = ds.images[..., 3] > 0
    expect = torch.tensor([200, 40, 90]).float().div(255).expand(int(covered.sum()), 3)
    torch.testing.assert_close(ds.images[..., :3][covered], expect, rtol=0, atol=1.0 / 255)
    meta = json.loads((out / "transforms.json").read_text())
    assert meta["render_views"]["views"] == 6 and len(meta["render_views"]["elevation_deg"]) == 8


@pytest.mark.parametrize(
    "kwargs, message",
    [({"views": 0}, "views"), ({"views": 4, "held_out": 5}, "held_out"), ({"size": 4}, "size")],
)
def test_render_views_bad_arguments(tmp_path, kwargs, message):
    _box_ply(tmp_path / "box.ply")
    with pytest.raises(InputError, match=message) as excinfo:
        render_views(tmp_path / "box.ply", tmp_path / "v", ViewsConfig(**kwargs))
    _one_line_input_error(excinfo)
    assert not (tmp_path / "v").exists()


def test_render_views_spot(tmp_path):
    if not (SPOT / "spot_triangulated.obj").exists():
        pytest.skip(f"sample mesh {SPOT} is absent")
    out = render_views(
        SPOT / "spot_triangulated.obj", tmp_path / "spot", ViewsConfig(views=4, size=48, held_out=1),
        texture=SPOT / "spot_texture.png", device="cpu",
    )  # fmt: skip
    ds = load_dataset(out)
    alpha = ds.images[..., 3]
    assert len(ds) == 5 and 0.1 < float(alpha.mean()) < 0.6
    # textured: the cow's white body and black patches both show up
    rgb = ds.images[..., :3][alpha == 1]
    assert (rgb.mean(-1) > 0.85).float().mean() > 0.2 and (rgb.mean(-1) < 0.35).float().mean() > 0.02


# --------------------------------------------------------------------------------------------
# mesh loading


def _parse_obj(path: Path):
    v, vt, fv, ft = [], [], [], []
    for line in path.read_text().splitlines():
        t = line.split()
        if not t:
            continue
        if t[0] == "v":
            v.append([float(x) for x in t[1:4]])
        elif t[0] == "vt":
            vt.append([float(x) for x in t[1:3]])
        elif t[0] == "f":
            fv.append([int(x.split("/")[0]) - 1 for x in t[1:]])
            ft.append([int(x.split("/")[1]) - 1 for x in t[1:]])
    return np.array(v), np.array(vt), np.array(fv), np.array(ft)


def test_spot_corners_keep_their_uvs():
    obj = SPOT / "spot_triangulated.obj"
    if not obj.exists():
        pytest.skip(f"sample mesh {SPOT} is absent")
    mesh = load_textured_mesh(obj, SPOT / "spot_texture.png")
    v, vt, fv, ft = _parse_obj(obj)
    # vertices split at UV seams: each face corner has the file's position and texture coordinate
    assert mesh.num_faces == len(fv) and mesh.num_vertices >= len(vt)
    np.testing.assert_allclose(mesh.vertices[mesh.faces], v[fv], atol=1e-6)
    np.testing.assert_allclose(mesh.uv[mesh.faces], vt[ft], atol=1e-6)
    assert mesh.texture.shape == (1024, 1024, 3) and mesh.texture.dtype == np.uint8


_QUAD_V = [[-0.5, -0.5, 0.0], [0.5, -0.5, 0.0], [0.5, 0.5, 0.0], [-0.5, 0.5, 0.0]]


def _quadrant_texture() -> np.ndarray:
    """8x8 RGB: top-left red, top-right green, bottom-left blue, bottom-right white."""
    tex = np.zeros((8, 8, 3), np.uint8)
    tex[:4, :4] = [255, 0, 0]
    tex[:4, 4:] = [0, 255, 0]
    tex[4:, :4] = [0, 0, 255]
    tex[4:, 4:] = [255, 255, 255]
    return tex


def _assert_quadrants(mesh: Mesh) -> None:
    """Seen from +z with y up, the quad's top-left is the texture's top-left (red), etc."""
    cam = orbit_cameras(0.0, 0.0, radius=2.0, fovy_deg=40.0, width=64, height=64)
    rgb = render_mesh(mesh, cam).rgb[0]
    torch.testing.assert_close(rgb[22, 22], torch.tensor([1.0, 0, 0]))
    torch.testing.assert_close(rgb[22, 42], torch.tensor([0, 1.0, 0]))
    torch.testing.assert_close(rgb[42, 22], torch.tensor([0, 0, 1.0]))
    torch.testing.assert_close(rgb[42, 42], torch.tensor([1.0, 1, 1]))


def test_obj_with_mtl_and_explicit_texture(tmp_path):
    _write_png(tmp_path / "tex.png", _quadrant_texture())
    lines = ["mtllib quad.mtl", "usemtl m"] + [f"v {x} {y} {z}" for x, y, z in _QUAD_V]
    lines += ["vt 0 0", "vt 1 0", "vt 1 1", "vt 0 1", "f 1/1 2/2 3/3", "f 1/1 3/3 4/4"]
    (tmp_path / "quad.obj").write_text("\n".join(lines) + "\n")
    (tmp_path / "quad.mtl").write_text("newmtl m\nKd 1 1 1\nmap_Kd tex.png\n")
    mesh = load_textured_mesh(tmp_path / "quad.obj")
    assert mesh.texture is not None and mesh.uv is not None
    _assert_quadrants(mesh)
    # an explicit texture replaces the MTL's
    flipped = _quadrant_texture()[::-1].copy()
    _write_png(tmp_path / "flipped.png", flipped)
    other = load_textured_mesh(tmp_path / "quad.obj", texture=tmp_path / "flipped.png")
    np.testing.assert_array_equal(other.texture, flipped)  # the PNG's own 8-bit values


def _gltf_quad(path: Path, factor: list[float] | None = None) -> None:
    """A hand-written glTF quad: texcoords in glTF's convention (v = 0 at the image's TOP row)."""
    from PIL import Image

    pos = np.array(_QUAD_V, np.float32)
    # glTF: the top-left vertex (-0.5, 0.5) samples the image's top-left corner at (0, 0)
    tc = np.array([[0, 1], [1, 1], [1, 0], [0, 0]], np.float32)
    idx = np.array([0, 1, 2, 0, 2, 3], np.uint16)
    blob = pos.tobytes() + tc.tobytes() + idx.tobytes()
    png = io.BytesIO()
    Image.fromarray(_quadrant_texture()).save(png, format="PNG")
    gltf = {
        "asset": {"version": "2.0"},
        "scene": 0,
        "scenes": [{"nodes": [0]}],
        "nodes": [{"mesh": 0}],
        "meshes": [{"primitives": [
            {"attributes": {"POSITION": 0, "TEXCOORD_0": 1}, "indices": 2, "material": 0},
        ]}],
        "materials": [{"pbrMetallicRoughness": {"baseColorTexture": {"index": 0}}}],
        **({"materials": [{"pbrMetallicRoughness": {"baseColorTexture": {"index": 0},
                                                    "baseColorFactor": factor}}]} if factor else {}),
        "textures": [{"source": 0, "sampler": 0}],
        "samplers": [{}],
        "images": [{"uri": "data:image/png;base64," + base64.b64encode(png.getvalue()).decode()}],
        "buffers": [{"byteLength": len(blob),
                     "uri": "data:application/octet-stream;base64," + base64.b64encode(blob).decode()}],
        "bufferViews": [
            {"buffer": 0, "byteOffset": 0, "byteLength": 48},
            {"buffer": 0, "byteOffset": 48, "byteLength": 32},
            {"buffer": 0, "byteOffset": 80, "byteLength": 12},
        ],
        "accessors": [
            {"bufferView": 0, "componentType": 5126, "count": 4, "type": "VEC3",
             "min": [-0.5, -0.5, 0.0], "max": [0.5, 0.5, 0.0]},
            {"bufferView": 1, "componentType": 5126, "count": 4, "type": "VEC2"},
            {"bufferView": 2, "componentType": 5123, "count": 6, "type": "SCALAR"},
        ],
    }  # fmt: skip
    path.write_text(json.dumps(gltf))


def test_gltf_texcoords_are_flipped_to_obj_convention(tmp_path):
    _gltf_quad(tmp_path / "quad.gltf")
    mesh = load_textured_mesh(tmp_path / "quad.gltf")
    # the top-left vertex has OBJ-convention uv (0, 1)
    top_left = np.where((mesh.vertices[:, 0] < 0) & (mesh.vertices[:, 1] > 0))[0][0]
    np.testing.assert_allclose(mesh.uv[top_left], [0.0, 1.0])
    _assert_quadrants(mesh)
    # glTF's baseColorFactor multiplies the texture
    _gltf_quad(tmp_path / "tinted.gltf", factor=[0.5, 1.0, 0.25, 1.0])
    tinted = load_textured_mesh(tmp_path / "tinted.gltf")
    # trimesh keeps the factor as 8-bit values (within half a step) and the product is rounded to the
    # uint8 texture (another half step): within one step of 8-bit
    np.testing.assert_allclose(tinted.texture, mesh.texture * [0.5, 1.0, 0.25], atol=1.0)


def test_glb_round_trip_and_spot_render_identically(tmp_path):
    import trimesh

    if not (SPOT / "spot_triangulated.obj").exists():
        pytest.skip(f"sample mesh {SPOT} is absent")
    obj = load_textured_mesh(SPOT / "spot_triangulated.obj", SPOT / "spot_texture.png")
    from PIL import Image

    # a PBR material with only a base-colour texture (trimesh's default SimpleMaterial would be
    # exported with a grey baseColorFactor of 0.4, which glTF readers must multiply in)
    material = trimesh.visual.material.PBRMaterial(baseColorTexture=Image.open(SPOT / "spot_texture.png"))
    visual = trimesh.visual.TextureVisuals(uv=obj.uv, material=material)
    tm = trimesh.Trimesh(obj.vertices, obj.faces, process=False, visual=visual)
    tm.export(tmp_path / "spot.glb")
    glb = load_textured_mesh(tmp_path / "spot.glb")
    cams = orbit_cameras([-10.0, 20.0], [30.0, 200.0], radius=3.0, width=40, height=40)
    a, b = render_mesh(obj, cams), render_mesh(glb, cams)
    # the GLB stores float32 uv (v flipped twice) and the same texture: identical images up to rounding
    torch.testing.assert_close(a.alpha, b.alpha)
    torch.testing.assert_close(a.rgb, b.rgb, rtol=0, atol=1e-3)


def test_ply_vertex_and_face_colors(tmp_path):
    import trimesh

    verts, faces = _box_ply(tmp_path / "box.ply")
    mesh = load_textured_mesh(tmp_path / "box.ply")
    np.testing.assert_allclose(
        mesh.vertex_colors, np.tile([[200 / 255, 40 / 255, 90 / 255]], (8, 1)), atol=1e-6
    )
    assert mesh.uv is None and mesh.texture is None
    fc = np.zeros((len(faces), 4), np.uint8)
    fc[:, 3] = 255
    fc[::2, 0] = 255  # alternate red / black faces
    trimesh.Trimesh(verts, faces, face_colors=fc, process=False).export(tmp_path / "faces.ply")
    m2 = load_textured_mesh(tmp_path / "faces.ply")
    assert m2.num_faces == len(faces) and m2.num_vertices == 3 * len(faces)  # corners unshared
    np.testing.assert_allclose(m2.vertex_colors[m2.faces[:, 0], 0], fc[:, 0] / 255.0)


def test_mesh_loading_errors(tmp_path):
    with pytest.raises(InputError, match="does not exist") as e:
        load_textured_mesh(tmp_path / "missing.obj")
    _one_line_input_error(e)
    (tmp_path / "bad.glb").write_bytes(b"\x00garbage" * 10)
    with pytest.raises(InputError, match="cannot read mesh file") as e:
        load_textured_mesh(tmp_path / "bad.glb")
    _one_line_input_error(e)
    (tmp_path / "x.xyz").write_text("1 2 3\n")
    with pytest.raises(InputError, match="unsupported suffix"):
        load_textured_mesh(tmp_path / "x.xyz")
    _box_ply(tmp_path / "box.ply")
    _write_png(tmp_path / "t.png", _quadrant_texture())
    with pytest.raises(InputError, match="no UV coordinates") as e:
        load_textured_mesh(tmp_path / "box.ply", texture=tmp_path / "t.png")
    _one_line_input_error(e)
    with pytest.raises(InputError, match="texture image"):
        load_textured_mesh(tmp_path / "box.ply", texture=tmp_path / "missing.png")
    header = "ply\nformat ascii 1.0\nelement vertex 1\nproperty float x\nproperty float y\nproperty float z\n"
    (tmp_path / "points.ply").write_text(header + "end_header\n0 0 0\n")
    with pytest.raises(InputError) as e:
        load_textured_mesh(tmp_path / "points.ply")
    _one_line_input_error(e)
    shutil.rmtree(tmp_path)


def test_render_views_up_turns_a_z_up_mesh_upright(tmp_path):
    """A tall box standing along +z (a Z-up scan): with --up +z the dataset frame has it standing along
    +y (the orbit's axis), and transforms.json records the rotation."""
    import trimesh

    box = trimesh.creation.box(extents=(0.4, 0.6, 2.0))  # tallest along z
    top = np.asarray(box.vertices)[:, 2] > 0
    colors = np.where(top[:, None], [[220, 30, 30, 255]], [[30, 30, 220, 255]]).astype(np.uint8)
    trimesh.Trimesh(box.vertices, box.faces, vertex_colors=colors, process=False).export(tmp_path / "z.ply")
    out = render_views(tmp_path / "z.ply", tmp_path / "v", ViewsConfig(views=4, held_out=0, size=32, up="+z"),
                       device="cpu")  # fmt: skip
    ds = load_dataset(out)
    v = ds.normalization.apply(np.asarray(box.vertices))
    assert np.ptp(v[:, 1]) > 2.5 * max(np.ptp(v[:, 0]), np.ptp(v[:, 2]))  # standing along y
    assert v[top, 1].min() > 0  # the +z end (red) is the top
    meta = json.loads((out / "transforms.json").read_text())
    assert meta["render_views"]["up"] == "+z" and "rotation" in meta["normalization"]
    # in every view the red (top) pixels are above the blue ones: the object stands, it does not tumble
    for img in ds.images:
        a = img[..., 3] > 0.5
        red = a & (img[..., 0] > 0.5) & (img[..., 2] < 0.3)
        blue = a & (img[..., 2] > 0.5) & (img[..., 0] < 0.3)
        assert red.sum() > 5 and blue.sum() > 5
        assert red.nonzero()[:, 0].float().mean() < blue.nonzero()[:, 0].float().mean()


def test_render_views_shades_an_uncoloured_mesh_and_says_so(tmp_path):
    import trimesh

    from microdreamer.render.mesh import AMBIENT

    box = trimesh.creation.box(extents=(1.0, 1.0, 1.0))
    trimesh.Trimesh(box.vertices, box.faces, process=False).export(tmp_path / "grey.ply")
    out = render_views(tmp_path / "grey.ply", tmp_path / "v", ViewsConfig(views=4, held_out=0, size=48),
                       device="cpu")  # fmt: skip
    ds = load_dataset(out)
    inside = ds.images[..., 3] == 1
    grey = ds.images[..., 0][inside]
    levels = torch.unique((grey * 255).round())
    assert len(levels) > 3, levels  # shaded, not one flat silhouette level
    assert grey.min() >= 0.7 * AMBIENT - 1 / 255 and grey.max() <= 0.7 + 1 / 255
    meta = json.loads((out / "transforms.json").read_text())["render_views"]
    assert meta["mesh_has_color"] is False and "no colour" in meta["shading"]["note"]
    _box_ply(tmp_path / "box.ply")  # vertex-coloured: unlit, and recorded as such
    meta = json.loads((render_views(tmp_path / "box.ply", tmp_path / "c", ViewsConfig(views=2, held_out=0,
                       size=16), device="cpu") / "transforms.json").read_text())["render_views"]  # fmt: skip
    assert meta["mesh_has_color"] is True and meta["shading"].startswith("unlit")
