"""A capture's own cameras (microdreamer.data.capture): INRIA cameras.json and transforms.json read into
the same views, checked by projecting points with the cameras' own matrices; bad files are one line."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from microdreamer.data.capture import read_capture_cameras, rotated
from microdreamer.errors import InputError

POSITIONS = np.array([[0.0, 0.0, 3.0], [2.5, 1.0, 0.5], [-1.0, 2.0, -2.0], [0.3, -0.4, 0.2]])
TARGETS = np.array([[0.0, 0.0, 0.0], [0.0, 0.2, 0.0], [0.5, 0.0, 0.0], [0.3, -0.4, -1.0]])
W, H, FX, FY = 640, 480, 500.0, 510.0


def _axes(position, target) -> np.ndarray:
    """[3, 3] camera-to-world rotation, OpenCV axes (columns: right, down, forward), world y up."""
    f = target - position
    f = f / np.linalg.norm(f)
    r = np.cross(f, [0.0, 1.0, 0.0])
    r = r / np.linalg.norm(r)
    return np.stack([r, np.cross(f, r), f], axis=1)


def inria_json(sizes=None) -> list:
    sizes = sizes or [(W, H)] * len(POSITIONS)
    return [
        {"id": i, "img_name": f"{i:05d}", "width": w, "height": h, "position": p.tolist(),
         "rotation": _axes(p, t).tolist(), "fx": FX * w / W, "fy": FY * h / H}
        for i, (p, t, (w, h)) in enumerate(zip(POSITIONS, TARGETS, sizes, strict=True))
    ]  # fmt: skip


def transforms_json() -> dict:
    frames = []
    for i, (p, t) in enumerate(zip(POSITIONS, TARGETS, strict=True)):
        m = np.eye(4)
        m[:3, :3] = _axes(p, t) @ np.diag([1.0, -1.0, -1.0])  # OpenGL: y up, z backward
        m[:3, 3] = p
        frames.append({"file_path": f"images/{i:05d}.png", "transform_matrix": m.tolist()})
    return {"camera_model": "OPENCV", "fl_x": FX, "fl_y": FY, "cx": W / 2, "cy": H / 2, "w": W, "h": H,
            "frames": frames}  # fmt: skip


def _project(cameras, points: np.ndarray) -> np.ndarray:
    """[C, P, 3]: (u, v, depth) of world ``points`` [P, 3] in each camera."""
    p = torch.cat([torch.as_tensor(points, dtype=torch.float32), torch.ones(len(points), 1)], 1)
    cam = torch.einsum("cij,pj->cpi", cameras.viewmats, p)[..., :3]
    uv = torch.einsum("cij,cpj->cpi", cameras.Ks, cam / cam[..., 2:3])
    return torch.cat([uv[..., :2], cam[..., 2:3]], -1).numpy()


def _check_views(cameras) -> None:
    assert len(cameras) == len(POSITIONS) and (cameras.width, cameras.height) == (W, H)
    for c, (p, t) in enumerate(zip(POSITIONS, TARGETS, strict=True)):
        r = _axes(p, t)
        right, up = t + 0.1 * r[:, 0], t - 0.1 * r[:, 1]
        (u0, v0, d0), (u1, v1, _), (u2, v2, _) = _project(cameras[c], np.stack([t, right, up]))[0]
        np.testing.assert_allclose([u0, v0], [W / 2, H / 2], atol=1e-3)  # the target at the image centre
        assert d0 == pytest.approx(np.linalg.norm(t - p), rel=1e-5)
        assert u1 > u0 and abs(v1 - v0) < 1e-3  # right in the world is right in the image
        assert v2 < v0 and abs(u2 - u0) < 1e-3  # up is up
        assert (u1 - u0) / (v0 - v2) == pytest.approx(FX / FY, rel=1e-5)


def test_inria_cameras_json(tmp_path):
    (tmp_path / "cameras.json").write_text(json.dumps(inria_json()))
    _check_views(read_capture_cameras(tmp_path / "cameras.json"))


def test_transforms_json(tmp_path):
    (tmp_path / "transforms.json").write_text(json.dumps(transforms_json()))
    _check_views(read_capture_cameras(tmp_path / "transforms.json"))


def test_both_layouts_give_the_same_cameras(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps(inria_json()))
    (tmp_path / "b.json").write_text(json.dumps(transforms_json()))
    a, b = read_capture_cameras(tmp_path / "a.json"), read_capture_cameras(tmp_path / "b.json")
    torch.testing.assert_close(a.viewmats, b.viewmats, atol=1e-6, rtol=0)
    torch.testing.assert_close(a.Ks, b.Ks)


def test_field_of_view_only_and_other_sizes(tmp_path):
    """camera_angle_x alone (the NeRF synthetic scenes): a square image of that field of view; frames of
    another size are scaled to the first's (the same frustum)."""
    doc = transforms_json()
    for key in ("fl_x", "fl_y", "cx", "cy", "w", "h"):
        del doc[key]
    doc["camera_angle_x"] = 2 * math.atan(0.5)
    (tmp_path / "t.json").write_text(json.dumps(doc))
    cams = read_capture_cameras(tmp_path / "t.json")
    assert cams.width == cams.height
    assert cams.Ks[0, 0, 0].item() == pytest.approx(cams.width)  # tan(fov / 2) = 0.5
    (tmp_path / "c.json").write_text(
        json.dumps(inria_json([(W, H), (2 * W, 2 * H), (W // 2, H // 2), (W, H)]))
    )
    _check_views(read_capture_cameras(tmp_path / "c.json"))


def test_rotated_cameras_see_the_rotated_scene():
    from microdreamer.orient import up_rotation

    doc_cams = read_capture_cameras_from(inria_json())
    rot = up_rotation("+z")
    points = np.array([[0.1, 0.2, 0.3], [0.0, 0.0, 0.0], [-0.4, 0.1, 0.2]])
    turned = (torch.as_tensor(points) @ rot.T).numpy()
    np.testing.assert_allclose(
        _project(rotated(doc_cams, rot), turned), _project(doc_cams, points), atol=1e-3
    )


def read_capture_cameras_from(doc):
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "cameras.json"
        path.write_text(json.dumps(doc))
        return read_capture_cameras(path)


@pytest.mark.parametrize(
    "content, message",
    [
        ("{not json", "not a readable JSON file"),
        (json.dumps({"cameras": []}), "neither an INRIA cameras.json"),
        (json.dumps([]), "holds no camera"),
        (json.dumps({"frames": []}), "holds no camera"),
        (json.dumps([{"position": [0, 0, 0], "rotation": [[2, 0, 0], [0, 1, 0], [0, 0, 1]], "fx": 1, "fy": 1,
                      "width": 4, "height": 4}]), "camera 0's rotation is not a rotation"),
        (json.dumps([{"position": [0, 0, "x"], "rotation": np.eye(3).tolist(), "fx": 1, "fy": 1, "width": 4,
                      "height": 4}]), "camera 0's position must be a finite number"),
        (json.dumps([{"position": [0, 0, 0], "rotation": np.eye(3).tolist(), "fx": 1, "width": 4,
                      "height": 4}]), "missing 'fy'"),
        (json.dumps([{"position": [0, 0, 0], "rotation": np.eye(3).tolist(), "fx": 1, "fy": 1, "width": 0,
                      "height": 4}]), "camera 0's width must be a whole number of pixels"),
        (json.dumps({"frames": [{"transform_matrix": np.eye(4).tolist()}]}), "frame 0 has no focal length"),
        (json.dumps({"frames": [{"transform_matrix": np.eye(3).tolist(), "fl_x": 3}]}), "must be 4 x 4"),
        (json.dumps({"fl_x": -2, "frames": [{"transform_matrix": np.eye(4).tolist()}]}), "not positive"),
    ],
)  # fmt: skip
def test_bad_files_are_one_line(tmp_path, content, message):
    path = tmp_path / "cams.json"
    path.write_text(content)
    with pytest.raises(InputError) as e:
        read_capture_cameras(path)
    text = str(e.value)
    assert text.startswith(f"{path}: ") and message in text and "\n" not in text, text
    with pytest.raises(InputError, match="no such file"):
        read_capture_cameras(tmp_path / "absent.json")
