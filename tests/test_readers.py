"""Readers of images and meshes validate what they return (issue 43, item 4): finite, in range, bit depth
and orientation honoured, each failure one :class:`InputError` line naming the file; and through the
commands that read them (``render``, ``evaluate``, ``view``): exit status 2, the one ``error:`` line,
nothing written."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from microdreamer.data.image import load_image
from microdreamer.errors import InputError
from microdreamer.image_io import standard_image
from microdreamer.mesh import Mesh, save_mesh
from microdreamer.mesh.load import load_texture_image, load_textured_mesh
from microdreamer.metrics_clip import read_image_on_white
from microdreamer.synthetic import sphere_mesh

TRIANGLE = "v 0 0 0\nv 1 0 0\nv 0 1 0\n"
PLY_HEAD = (
    "ply\nformat ascii 1.0\nelement vertex {v}\nproperty float x\nproperty float y\nproperty float z\n"
    "element face {f}\nproperty list uchar int vertex_indices\nend_header\n"
)
PLY_BODY = "0 0 0\n1 0 0\n0 1 0\n3 0 1 2\n"


def _glb(vertices, faces) -> bytes:
    """A minimal GLB of one triangle mesh (POSITION float32, indices uint32), written here by hand so
    that it can hold what our writer would refuse (NaN, indices out of range)."""
    import json

    pos = np.asarray(vertices, "<f4").tobytes()
    idx = np.asarray(faces, "<u4").tobytes()
    blob = pos + idx
    blob += b"\0" * (-len(blob) % 4)
    doc = {
        "asset": {"version": "2.0"},
        "scene": 0,
        "scenes": [{"nodes": [0]}],
        "nodes": [{"mesh": 0}],
        "meshes": [{"primitives": [{"attributes": {"POSITION": 0}, "indices": 1}]}],
        "buffers": [{"byteLength": len(blob)}],
        "bufferViews": [
            {"buffer": 0, "byteOffset": 0, "byteLength": len(pos)},
            {"buffer": 0, "byteOffset": len(pos), "byteLength": len(idx)},
        ],
        "accessors": [
            {"bufferView": 0, "componentType": 5126, "count": len(vertices), "type": "VEC3"},
            {"bufferView": 1, "componentType": 5125, "count": int(np.size(faces)), "type": "SCALAR"},
        ],
    }
    text = json.dumps(doc).encode()
    text += b" " * (-len(text) % 4)
    chunks = (
        struct.pack("<II", len(text), 0x4E4F534A) + text + struct.pack("<II", len(blob), 0x004E4942) + blob
    )
    return struct.pack("<III", 0x46546C67, 2, 12 + len(chunks)) + chunks


#: name -> (file content, a fragment the one-line message holds)
BAD_MESHES = {
    "nan.obj": ("v nan 0 0\nv 1 0 0\nv 0 1 0\nf 1 2 3\n", "not finite"),
    "inf.obj": ("v 0 inf 0\nv 1 0 0\nv 0 1 0\nf 1 2 3\n", "not finite"),
    "overflow.obj": ("v 1e39 0 0\nv 1 0 0\nv 0 1 0\nf 1 2 3\n", "float32's range"),
    "point.obj": ("v 2 2 2\nv 2 2 2\nv 2 2 2\nf 1 2 3\n", "no extent"),
    "line.obj": ("v 0 0 0\nv 1 1 1\nv 2 2 2\nf 1 2 3\n", "degenerate"),
    "huge.obj": ("v 1e20 0 0\nv 0 1e20 0\nv 0 0 1e20\nf 1 2 3\n", "rescale"),
    "tiny.obj": ("v 0 0 0\nv 1e-17 0 0\nv 0 1e-17 0\nf 1 2 3\n", "rescale"),
    "far.obj": ("v 1e7 0 0\nv 10000000.5 0 0\nv 1e7 0.5 0\nf 1 2 3\n", "near the origin"),
    "zero_index.obj": (TRIANGLE + "f 0 1 2\n", "index 0"),
    "zero_uv_index.obj": (TRIANGLE + "vt 0 0\nf 1/0 2/1 3/1\n", "index 0"),
    "zero_in_quad.obj": (TRIANGLE + "v 1 1 0\nf 1 2 3 0\n", "line 5"),
    "more_faces.ply": (PLY_HEAD.format(v=3, f=5) + PLY_BODY, "declares 8"),
    "more_vertices.ply": (PLY_HEAD.format(v=9, f=1) + PLY_BODY, "declares 10"),
    "fewer_declared.ply": (PLY_HEAD.format(v=3, f=1) + PLY_BODY + "3 2 1 0\n", "holds 5"),
    "binary_more_faces.ply": (
        PLY_HEAD.format(v=3, f=5).replace("ascii", "binary_little_endian").encode()
        + np.array([[0, 0, 0], [1, 0, 0], [0, 1, 0]], "<f4").tobytes()
        + bytes([3])
        + np.array([0, 1, 2], "<i4").tobytes(),
        "cannot read",
    ),
    "nan.glb": (_glb([[np.nan, 0, 0], [1, 0, 0], [0, 1, 0]], [0, 1, 2]), "not finite"),
    "index.glb": (_glb([[0, 0, 0], [1, 0, 0], [0, 1, 0]], [0, 1, 7]), None),
}


def _write(folder: Path, name: str) -> Path:
    content = BAD_MESHES[name][0]
    path = folder / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return path


def _one_line(e: InputError, path: Path) -> str:
    msg = str(e)
    assert msg and "\n" not in msg and str(path) in msg, msg
    return msg


@pytest.mark.parametrize("name", sorted(BAD_MESHES))
def test_meshes_that_would_render_wrongly_are_refused_in_one_line(tmp_path, name):
    path = _write(tmp_path, name)
    with pytest.raises(InputError) as info:
        load_textured_mesh(path)
    msg = _one_line(info.value, path)
    fragment = BAD_MESHES[name][1]
    assert fragment is None or fragment in msg, msg


def test_the_valid_neighbours_of_the_bad_meshes_load(tmp_path):
    """What the checks must let through: negative (relative) OBJ indices, indices with 0 as a digit, a
    flat quad (no extent along one axis), an ASCII PLY that holds what it declares, and a mesh of 1e-9
    units far from float32's limits; vertex colours above 1 are clipped (with a warning)."""
    (tmp_path / "neg.obj").write_text(TRIANGLE + "f -3 -2 -1\n")
    (tmp_path / "ten.obj").write_text("".join(f"v {i} {i % 3} {i % 2}\n" for i in range(12)) + "f 10 11 1\n")
    (tmp_path / "flat.obj").write_text(TRIANGLE + "v 1 1 0\nf 1 2 3\nf 2 4 3\n")
    (tmp_path / "ok.ply").write_text(PLY_HEAD.format(v=3, f=1) + PLY_BODY)
    (tmp_path / "small.obj").write_text("v 0 0 0\nv 1e-9 0 0\nv 0 1e-9 0\nf 1 2 3\n")
    assert load_textured_mesh(tmp_path / "neg.obj").faces.tolist() == [[0, 1, 2]]
    ten = load_textured_mesh(tmp_path / "ten.obj")  # trimesh keeps only the vertices faces use
    assert ten.vertices[ten.faces].tolist() == [[[9, 0, 1], [10, 1, 0], [0, 0, 0]]]
    assert load_textured_mesh(tmp_path / "flat.obj").num_faces == 2
    assert load_textured_mesh(tmp_path / "ok.ply").num_faces == 1
    assert load_textured_mesh(tmp_path / "small.obj").num_faces == 1
    colored = Mesh(np.eye(3), [[0, 1, 2]], vertex_colors=[[2.0, 0.5, 0.0]] * 3)
    path = save_mesh(colored, tmp_path / "c.obj")
    assert load_textured_mesh(path).vertex_colors.max() <= 1.0


def test_texture_coordinates_must_be_finite(tmp_path):
    (tmp_path / "t.png").write_bytes(b"")
    Image.fromarray(np.full((4, 4, 3), 90, np.uint8)).save(tmp_path / "t.png")
    path = tmp_path / "uv.obj"
    path.write_text(TRIANGLE + "vt nan 0\nvt 1 0\nvt 0 1\nf 1/1 2/2 3/3\n")
    with pytest.raises(InputError, match="texture coordinates"):
        load_textured_mesh(path, texture=tmp_path / "t.png")


# ------------------------------------------------------------------------------------------ images
def _grey16(path: Path) -> np.ndarray:
    """A 16-bit greyscale PNG, a ramp over 0..65535; returns the values / 65535."""
    ramp = np.linspace(0, 65535, 48 * 32).reshape(32, 48).astype(np.uint16)
    Image.fromarray(ramp).save(path)
    assert Image.open(path).mode.startswith("I;16")
    return ramp / 65535.0


def test_a_16_bit_greyscale_png_keeps_its_values_everywhere_it_is_read(tmp_path):
    """Not clipped to white: the prepared input, evaluate's reference picture and a texture all hold
    the ramp (to 8-bit rounding)."""
    want = _grey16(tmp_path / "g.png")
    arr = load_image(tmp_path / "g.png")
    assert arr.shape == (32, 48, 4) and (arr[..., 3] == 1).all()
    np.testing.assert_allclose(arr[..., 0], want, atol=0.5 / 255 + 1e-6)
    np.testing.assert_allclose(read_image_on_white(tmp_path / "g.png")[..., 1] / 255.0, want, atol=1 / 255)
    np.testing.assert_allclose(load_texture_image(tmp_path / "g.png")[..., 2], want, atol=0.5 / 255 + 1e-6)


def test_wide_and_float_greyscale_outside_their_range_is_refused(tmp_path):
    Image.fromarray(np.array([[0, 70000]], np.int32), "I").save(tmp_path / "i.tif")
    Image.fromarray(np.array([[0.2, np.nan]], np.float32), "F").save(tmp_path / "nan.tif")
    Image.fromarray(np.array([[0.2, 1.5]], np.float32), "F").save(tmp_path / "big.tif")
    for name in ("i.tif", "nan.tif", "big.tif"):
        with pytest.raises(InputError) as info:
            load_image(tmp_path / name)
        assert "outside" in _one_line(info.value, tmp_path / name)
    Image.fromarray(np.array([[0.0, 0.5, 1.0]], np.float32), "F").save(tmp_path / "ok.tif")
    np.testing.assert_allclose(load_image(tmp_path / "ok.tif")[0, :, 0], [0.0, 128 / 255, 1.0])


def _rotated_jpeg(path: Path, orientation: int) -> None:
    """A 40 x 20 JPEG whose left half is red and right half black, with an EXIF orientation tag."""
    img = np.zeros((20, 40, 3), np.uint8)
    img[:, :20] = (230, 20, 20)
    exif = Image.Exif()
    exif[0x0112] = orientation
    Image.fromarray(img).save(path, quality=95, exif=exif)


def test_a_jpegs_exif_orientation_is_applied_to_input_images(tmp_path):
    """Orientation 6 (stored rotated 90 degrees counter-clockwise, shown turned clockwise): the stored
    left half (red) is the top of the picture; 3 (upside down): the red half is on the right. Input
    images (generate's and evaluate's) come upright; a texture keeps its stored pixels (the UVs address
    them so)."""
    _rotated_jpeg(tmp_path / "six.jpg", 6)
    arr = load_image(tmp_path / "six.jpg")
    assert arr.shape == (40, 20, 4)
    assert arr[:20, :, 0].mean() > 0.8 and arr[20:, :, 0].mean() < 0.1
    clip = read_image_on_white(tmp_path / "six.jpg")
    assert clip.shape == (40, 20, 3) and clip[:20, :, 0].mean() > 200 and clip[20:, :, 0].mean() < 30
    _rotated_jpeg(tmp_path / "three.jpg", 3)
    arr = load_image(tmp_path / "three.jpg")
    assert arr.shape == (20, 40, 4) and arr[:, 20:, 0].mean() > 0.8 and arr[:, :20, 0].mean() < 0.1
    assert load_texture_image(tmp_path / "six.jpg").shape == (20, 40, 3)


def test_standard_image_modes():
    """Every mode comes out 8-bit RGB or RGBA: palette with transparency and LA keep their alpha."""
    p = Image.new("P", (2, 1))
    p.putpalette([255, 0, 0, 0, 255, 0] + [0] * 762)
    p.putpixel((1, 0), 1)
    p.info["transparency"] = 1
    out = standard_image(p, "p.png")
    assert out.mode == "RGBA"
    assert [out.getpixel((x, 0)) for x in range(2)] == [(255, 0, 0, 255), (0, 255, 0, 0)]
    assert standard_image(Image.new("LA", (1, 1), (7, 9)), "la.png").getpixel((0, 0)) == (7, 7, 7, 9)
    assert standard_image(Image.new("1", (1, 1), 1), "b.png").getpixel((0, 0)) == (255, 255, 255)
    assert standard_image(Image.new("CMYK", (1, 1)), "c.jpg").mode == "RGB"


# ------------------------------------------------------------------------------------------ commands
def _snapshot(root: Path) -> dict:
    return {
        str(p.relative_to(root)): "dir" if p.is_dir() else p.read_bytes() for p in sorted(root.rglob("*"))
    }


def _fails_cleanly(tmp_path, capsys, args, fragment) -> None:
    from microdreamer.cli import main

    before = _snapshot(tmp_path)
    code = main([str(a) for a in args])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, err
    errors = [line for line in err if line.startswith("error:")]
    assert len(errors) == 1 and err[-1] == errors[0] and "Traceback" not in "\n".join(err), err
    assert fragment in errors[0], errors[0]
    assert _snapshot(tmp_path) == before


@pytest.mark.parametrize("name", ["nan.obj", "point.obj", "zero_index.obj", "more_faces.ply", "nan.glb"])
def test_render_refuses_a_bad_mesh_in_one_line(tmp_path, capsys, name):
    path = _write(tmp_path, name)
    _fails_cleanly(
        tmp_path, capsys, ["render", path, "-o", tmp_path / "out.png", "--size", 32], BAD_MESHES[name][1]
    )


@pytest.mark.parametrize("name", ["nan.obj", "point.obj", "zero_index.obj", "nan.glb", "huge.obj"])
def test_view_refuses_a_bad_mesh_in_one_line(tmp_path, capsys, name):
    """No viewer folder with a blank view, and no NaN written into the page's JSON."""
    path = _write(tmp_path, name)
    _fails_cleanly(tmp_path, capsys, ["view", path, "-o", tmp_path / "v"], BAD_MESHES[name][1])


@pytest.mark.parametrize("name", ["nan.obj", "point.obj", "zero_index.obj", "more_faces.ply"])
def test_evaluate_refuses_a_bad_mesh_in_one_line(tmp_path_factory, capsys, name):
    """No CLIP score of a blank render."""
    pytest.importorskip("transformers", reason="CLIP similarity needs transformers")
    from microdreamer.metrics_clip import save_random_clip

    model = save_random_clip(tmp_path_factory.mktemp("clip") / "tiny", seed=1)
    tmp_path = tmp_path_factory.mktemp("case")
    path = _write(tmp_path, name)
    Image.fromarray(np.full((40, 40, 3), 200, np.uint8)).save(tmp_path / "in.png")
    args = ["evaluate", path, "--image", tmp_path / "in.png", "-o", tmp_path / "out", "--model", model,
            "--size", 32, "--device", "cpu"]  # fmt: skip
    _fails_cleanly(tmp_path, capsys, args, BAD_MESHES[name][1])


def test_render_of_a_small_mesh_is_not_blank(tmp_path):
    """A sphere 1e-6 across renders like a unit one (the near plane follows the framing's distance)."""
    from microdreamer.jobs.turntable import turntable_frames

    base = sphere_mesh(2)
    frames = [
        next(turntable_frames(Mesh(base.vertices.astype(np.float64) * s, base.faces), [0.0], size=32, ssaa=1))
        for s in (1.0, 1e-6)
    ]
    covered = [float((f < 250).any(-1).mean()) for f in frames]
    assert covered[0] > 0.3 and abs(covered[1] - covered[0]) < 0.02, covered
