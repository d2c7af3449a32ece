"""The viewer: the folder build_viewer() writes, serve(), and the page in a real headless Chromium.

The browser tests drive the system's Chromium (Debian's ``chromium`` package, or the path in
MICRODREAMER_CHROMIUM) through Playwright, software WebGL (SwiftShader); they skip, saying why, only
where Playwright or that browser cannot be had. Each view is drawn at SIZE x SIZE CSS pixels
(``?size=``) and compared with ``microdreamer render``'s azimuth-0 frame of the same file (a tileset: of
the GLBs it shows, from the page's camera).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from conftest import sample
from microdreamer.errors import InputError
from microdreamer.mesh import Mesh
from microdreamer.mesh.export import save_mesh
from microdreamer.splat import read_ply, write_ply
from microdreamer.synthetic import make_synthetic_object
from microdreamer.viewer import build, build_viewer, serve

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = os.environ.get("MICRODREAMER_CHROMIUM", "/usr/bin/chromium")
LAUNCH_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--use-angle=swiftshader", "--enable-unsafe-swiftshader",
]  # fmt: skip
SIZE = 160  # CSS pixels of each 3D view (device scale 1)
LOAD_TIMEOUT_MS = 180_000  # software WebGL on a shared 2-core machine


# ------------------------------------------------------------------ inputs
@pytest.fixture(scope="module")
def synthetic_splat(tmp_path_factory) -> Path:
    """A small seeded 3DGS PLY (3,000 Gaussians, SH degree 0) written by the library."""
    path = tmp_path_factory.mktemp("splat") / "synthetic.ply"
    write_ply(make_synthetic_object(n=3000, seed=7, scale_fraction=0.03), path)
    return path


@pytest.fixture(scope="module")
def synthetic_mesh(synthetic_splat, tmp_path_factory) -> Path:
    """The synthetic splat's mesh (splat_to_mesh at 40^3), vertex colours from positions, as GLB."""
    from microdreamer.field import FieldConfig
    from microdreamer.jobs.export import splat_to_mesh
    from microdreamer.mesh import MeshConfig

    mesh = splat_to_mesh(
        read_ply(synthetic_splat), FieldConfig(resolution=40), MeshConfig(), torch.device("cpu")
    ).mesh
    v = np.asarray(mesh.vertices, np.float64)
    colours = (v - v.min(0)) / np.maximum(v.max(0) - v.min(0), 1e-9)  # asymmetric: a mirror would show
    path = tmp_path_factory.mktemp("mesh") / "mesh.glb"
    save_mesh(Mesh(mesh.vertices, mesh.faces, vertex_colors=colours), path)
    return path


@pytest.fixture(scope="module")
def job_folder(synthetic_splat, synthetic_mesh, tmp_path_factory) -> Path:
    """A generate-style output folder: splat.ply, mesh.glb, timings.json, metrics.json, profile.png."""
    from microdreamer.profiling import write_profile

    folder = tmp_path_factory.mktemp("job")
    (folder / "splat.ply").write_bytes(synthetic_splat.read_bytes())
    (folder / "mesh.glb").write_bytes(synthetic_mesh.read_bytes())
    seconds = {"prepare": 0.25, "diffusion": 4.0, "reconstruction": 6.5, "mesh": 1.25}
    (folder / "timings.json").write_text(json.dumps({"seconds": seconds, "wall": 12.0, "device": "cpu"}))
    (folder / "metrics.json").write_text(
        json.dumps({"psnr": 21.5, "mesh_quality": {"fscore": 0.8}, "x": [1]})
    )
    write_profile(seconds, folder, "job", None)
    return folder


@pytest.fixture(scope="module")
def tileset(tmp_path_factory) -> tuple[Path, Path]:
    """(the merged GLB, the tileset folder) of ``mesh --tiles 2 --tileset``: three spheres in an L (x and
    y differ, so a turned or mirrored view shows), 3 leaves under a coarse root (refine REPLACE)."""
    from microdreamer import cli
    from test_scene import spheres

    pytest.importorskip("skimage")
    folder = tmp_path_factory.mktemp("tileset")
    write_ply(spheres([(0.0, 0.0, 0.0), (1.0, 0.0, 0.0), (0.0, 0.8, 0.0)], n=800), folder / "scene.ply")
    out = folder / "scene.glb"
    argv = [
        "mesh",
        str(folder / "scene.ply"),
        "-o",
        str(out),
        "--tiles",
        "2",
        "--tileset",
        str(folder / "ts"),
    ]
    assert cli.main(argv) in (0, None)
    return out, folder / "ts"


def _textured_mesh() -> Mesh:
    """A seeded random textured quad pair (UVs, 8 x 8 texture)."""
    g = np.random.default_rng(3)
    vertices = np.array([[0, 0, 0], [1, 0, 0], [1, 1, 0], [0, 1, 0]], np.float32)
    faces = np.array([[0, 1, 2], [0, 2, 3]], np.int64)
    uv = vertices[:, :2].copy()
    texture = g.integers(0, 256, (8, 8, 3), dtype=np.uint8)
    return Mesh(vertices, faces, uv=uv, texture=texture)


def _manifest_of(page) -> dict:
    return json.loads(page.eval_on_selector("#md-manifest", "e => e.textContent"))


def _manifest(index: Path) -> dict:
    text = index.read_text()
    m = re.search(r'<script type="application/json" id="md-manifest">(.*?)</script>', text, re.S)
    assert m, "no manifest in index.html"
    return json.loads(m.group(1))


# ------------------------------------------------------------------ the folder (no browser)
def test_build_viewer_writes_a_self_contained_folder(synthetic_splat, tmp_path):
    from microdreamer.jobs.turntable import splat_framing

    index = build_viewer([synthetic_splat], tmp_path / "v", title="a <b> title")
    out = index.parent
    assert index.name == "index.html"
    for rel in ("viewer.js", "viewer.css", "vendor/mdv-vendor.min.js", "vendor/VERSIONS", "data.js",
                "assets/0_synthetic/synthetic.ply"):  # fmt: skip
        assert (out / rel).is_file(), rel
    assert (out / "assets/0_synthetic/synthetic.ply").read_bytes() == synthetic_splat.read_bytes()
    text = index.read_text()
    assert "a &lt;b&gt; title" in text
    # nothing from the network: every src/href is a relative path (or an empty data: icon)
    for ref in re.findall(r'(?:src|href)="([^"]*)"', text):
        assert ref == "data:," or (":" not in ref and not ref.startswith("/")), ref
    manifest = _manifest(index)
    assert manifest["embedded"] is True and manifest["title"] == "a <b> title"
    (group,) = manifest["groups"]
    (view,) = group["views"]
    assert (group["kind"], view["kind"], view["url"]) == (
        "splat",
        "splat",
        "assets/0_synthetic/synthetic.ply",
    )
    assert view["stats"]["gaussians"] == 3000 and view["stats"]["sh_degree"] == 0
    # the camera of `microdreamer render` at azimuth 0: from +z, at margin * r / sin(fovy / 2)
    center, radius = splat_framing(read_ply(synthetic_splat))
    distance = 1.1 * radius / np.sin(np.radians(49.1) / 2)
    cam = view["camera"]
    assert cam["fovy_deg"] == 49.1
    np.testing.assert_allclose(cam["target"], center.numpy(), rtol=0, atol=1e-6)
    np.testing.assert_allclose(cam["position"], center.numpy() + [0, 0, distance], rtol=0, atol=1e-5)


def test_mesh_view_is_framed_on_its_bounding_sphere(synthetic_mesh, tmp_path):
    import trimesh

    index = build_viewer([synthetic_mesh], tmp_path / "v")
    (view,) = _manifest(index)["groups"][0]["views"]
    tm = trimesh.load(synthetic_mesh, force="mesh", process=False)
    v = np.asarray(tm.vertices, np.float64)
    center = (v.min(0) + v.max(0)) / 2
    radius = np.linalg.norm(v - center, axis=1).max()
    assert view["stats"]["vertices"] == len(v) and view["stats"]["faces"] == len(tm.faces)
    np.testing.assert_allclose(view["camera"]["target"], center, atol=1e-6)
    np.testing.assert_allclose(view["camera"]["position"][2] - center[2], 1.1 * radius / np.sin(np.radians(24.55)),
                               rtol=1e-5)  # fmt: skip


def test_obj_comes_with_its_material_and_texture(tmp_path):
    save_mesh(_textured_mesh(), tmp_path / "quad.obj")
    index = build_viewer([tmp_path / "quad.obj"], tmp_path / "v")
    (view,) = _manifest(index)["groups"][0]["views"]
    assert view["format"] == "obj" and view["mtl"] == "assets/0_quad/quad.mtl"
    assert view["files"] == ["assets/0_quad/quad.obj", "assets/0_quad/quad.mtl", "assets/0_quad/quad.png"]
    for rel in view["files"]:
        assert (index.parent / rel).read_bytes() == (tmp_path / Path(rel).name).read_bytes()
    assert view["stats"]["textured"] is True and view["stats"]["faces"] == 2


def test_job_folder_shows_mesh_and_splat_with_their_seconds(job_folder, tmp_path):
    index = build_viewer([job_folder], tmp_path / "v")
    (group,) = _manifest(index)["groups"]
    assert group["kind"] == "folder"
    assert [v["kind"] for v in group["views"]] == ["mesh", "splat"]
    assert group["seconds"]["timings.json: seconds"] == {"prepare": 0.25, "diffusion": 4.0, "reconstruction": 6.5,
                                                         "mesh": 1.25}  # fmt: skip
    assert group["seconds"]["profile.json: seconds"]["diffusion"] == 4.0
    assert group["scalars"]["timings.json"] == {"wall": 12.0, "device": "cpu"}
    assert group["scalars"]["metrics.json"] == {"psnr": 21.5, "mesh_quality.fscore": 0.8}  # lists left out
    assert [i["name"] for i in group["images"]] == ["profile.png"]
    assert (index.parent / group["images"][0]["url"]).read_bytes() == (
        job_folder / "profile.png"
    ).read_bytes()


def test_ascii_splat_is_rewritten_as_binary(tmp_path):
    splat = make_synthetic_object(n=5, seed=2)
    write_ply(splat, tmp_path / "bin.ply")
    head, body = (tmp_path / "bin.ply").read_bytes().split(b"end_header\n", 1)
    names = [line.split()[-1] for line in head.decode().splitlines() if line.startswith("property")]
    rows = np.frombuffer(body, np.float32).reshape(5, len(names))
    header = "ply\nformat ascii 1.0\nelement vertex 5\n" + "".join(f"property float {n}\n" for n in names)
    text = "\n".join(" ".join(f"{x:.9g}" for x in row) for row in rows)
    (tmp_path / "ascii.ply").write_text(header + "end_header\n" + text + "\n")
    index = build_viewer([tmp_path / "ascii.ply"], tmp_path / "v")
    copied = index.parent / "assets/0_ascii/ascii.ply"
    assert b"format binary_little_endian" in copied.read_bytes()[:200]
    torch.testing.assert_close(read_ply(copied).means, splat.means, rtol=0, atol=1e-6)


def test_embedding_follows_the_size_limit(synthetic_splat, tmp_path, monkeypatch):
    index = build_viewer([synthetic_splat], tmp_path / "a")
    line = (index.parent / "data.js").read_text().splitlines()[1]
    b64 = re.search(r'b64: "([^"]+)"', line).group(1)
    import base64

    assert base64.b64decode(b64) == synthetic_splat.read_bytes()
    monkeypatch.setattr(build, "EMBED_LIMIT_BYTES", synthetic_splat.stat().st_size - 1)
    index = build_viewer([synthetic_splat], tmp_path / "b")
    assert not (index.parent / "data.js").exists() and _manifest(index)["embedded"] is False
    index = build_viewer([synthetic_splat], tmp_path / "c", embed=True)
    assert (index.parent / "data.js").exists()


def test_bad_inputs_and_outputs_say_what_to_do(synthetic_splat, tmp_path):
    with pytest.raises(InputError, match="no input"):
        build_viewer([], tmp_path / "v")
    with pytest.raises(InputError, match="does not exist"):
        build_viewer([tmp_path / "missing.glb"], tmp_path / "v")
    save_mesh(_textured_mesh(), tmp_path / "mesh.ply")  # a mesh PLY, not a splat
    with pytest.raises(InputError, match="3DGS"):
        build_viewer([tmp_path / "mesh.ply"], tmp_path / "v")
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(InputError, match="unsupported input"):
        build_viewer([tmp_path / "notes.txt"], tmp_path / "v")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="no mesh"):
        build_viewer([tmp_path / "empty"], tmp_path / "v")
    (tmp_path / "broken.glb").write_bytes(b"glTF not really")
    with pytest.raises(InputError, match="broken.glb"):
        build_viewer([synthetic_splat, tmp_path / "broken.glb"], tmp_path / "v")
    assert not (tmp_path / "v").exists()  # a failure leaves nothing, not even a temporary folder
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".v.")]
    # an output folder with other things in it is not overwritten
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "keep.txt").write_text("keep")
    with pytest.raises(InputError, match="not empty"):
        build_viewer([synthetic_splat], tmp_path / "mine")
    assert (tmp_path / "mine" / "keep.txt").read_text() == "keep"
    # an earlier viewer is replaced
    build_viewer([synthetic_splat], tmp_path / "v")
    (tmp_path / "v" / "stale.txt").write_text("old")
    build_viewer([synthetic_splat], tmp_path / "v")
    assert not (tmp_path / "v" / "stale.txt").exists() and (tmp_path / "v" / "index.html").is_file()


def test_serve_answers_on_loopback_only(synthetic_mesh, tmp_path):
    index = build_viewer([synthetic_mesh], tmp_path / "v")
    url, server = serve(index.parent)
    try:
        assert url.startswith("http://127.0.0.1:") and server.server_address[0] == "127.0.0.1"
        with urllib.request.urlopen(url) as r:
            assert r.status == 200 and r.read() == index.read_bytes()
        with urllib.request.urlopen(url + "assets/0_mesh/mesh.glb") as r:
            assert r.headers["Content-Type"] == "model/gltf-binary"
            assert r.read() == synthetic_mesh.read_bytes()
        with urllib.request.urlopen(url + "vendor/mdv-vendor.min.js") as r:
            assert r.headers["Content-Type"].startswith("text/javascript")
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(url + "nothing-here")
        assert e.value.code == 404
    finally:
        server.shutdown()
        server.server_close()
    with pytest.raises(InputError, match="index.html"):
        serve(tmp_path)


def test_vendored_files_are_the_pinned_build():
    vendor = ROOT / "src/microdreamer/viewer/vendor"
    script = (ROOT / "scripts/vendor_viewer.sh").read_text()
    pins = dict(re.findall(r"^(\w+)_VERSION=(\S+)$", script, re.M))
    lines = [
        line.split() for line in (vendor / "VERSIONS").read_text().splitlines() if not line.startswith("#")
    ]
    versions = {parts[0]: parts[1] for parts in lines}
    assert versions["three"] == pins["THREE"] and versions["@sparkjsdev/spark"] == pins["SPARK"]
    assert versions["esbuild"] == pins["ESBUILD"] and versions["3d-tiles-renderer"] == pins["TILES"]
    assert all(parts[2].startswith("sha512-") for parts in lines[:-1])
    bundle = (vendor / "mdv-vendor.min.js").read_bytes()
    assert versions["mdv-vendor.min.js"] == "sha256-" + hashlib.sha256(bundle).hexdigest()
    assert len(bundle) < 4_000_000  # three.js + Spark (2.2 MB of it Spark's inline WebAssembly)
    for name in ("three", "spark", "fflate"):
        assert "MIT License" in (vendor / f"LICENSE.{name}").read_text()
    assert "Apache License" in (vendor / "LICENSE.3d-tiles-renderer").read_text()
    # every file the viewer copies is in the package data
    tomllib = pytest.importorskip("tomllib", reason="tomllib needs Python 3.11")
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    package = ROOT / "src/microdreamer"
    shipped = {p for pattern in patterns["microdreamer"] for p in package.glob(pattern)}
    needed = [p for d in ("viewer/vendor", "viewer/static") for p in (package / d).iterdir() if p.is_file()]
    assert needed and all(p in shipped for p in needed), [p.name for p in needed if p not in shipped]


def _frame(camera: dict) -> tuple[np.ndarray, float]:
    """(centre, radius) of the sphere a page camera frames (its distance is 1.1 r / sin(fovy / 2))."""
    target = np.asarray(camera["target"])
    distance = np.linalg.norm(np.asarray(camera["position"]) - target)
    return target, float(distance * np.sin(np.radians(camera["fovy_deg"]) / 2) / 1.1)


def test_tileset_view_copies_its_tiles_and_frames_the_root_box(tileset, tmp_path):
    import trimesh

    out, folder = tileset
    doc = json.loads((folder / "tileset.json").read_text())
    leaves = sorted(c["content"]["uri"] for c in doc["root"]["children"])
    for path in (folder, folder / "tileset.json"):  # the folder, or its tileset.json
        index = build_viewer([path], tmp_path / path.name)
        (group,) = _manifest(index)["groups"]
        (view,) = group["views"]
        assert (group["kind"], view["kind"], view["format"]) == ("tileset", "tiles", "3dtiles")
        assert view["stats"] == {
            "tiles": 4,
            "leaves": 3,
            "refine": "REPLACE",
            "bytes": view["stats"]["bytes"],
        }
        rel = view["url"].rsplit("/", 1)[0]
        assert sorted(view["files"]) == sorted(
            [view["url"], f"{rel}/tiles/root.glb", *(f"{rel}/{u}" for u in leaves)]
        )
        for f in view["files"]:
            assert (index.parent / f).read_bytes() == (folder / f[len(rel) + 1 :]).read_bytes()
    # the root's box is the scene's (y-up) bounding box; the camera frames the sphere through its corners
    v = np.asarray(trimesh.load(out, force="mesh", process=False).vertices, np.float64)
    lo, hi = v.min(0), v.max(0)
    radius = np.linalg.norm(hi - lo) / 2
    np.testing.assert_allclose(view["camera"]["target"], (lo + hi) / 2, atol=1e-5)
    np.testing.assert_allclose(view["camera"]["position"], (lo + hi) / 2 + [0, 0, 1.1 * radius / np.sin(np.radians(24.55))],
                               atol=1e-5)  # fmt: skip


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda d: d["root"]["children"][0]["content"].update(uri="../outside.glb"), "outside its folder"),
        (lambda d: d["root"]["children"][0]["content"].update(uri="tiles/gone.glb"), "which is not in"),
        (lambda d: d["root"]["children"][0]["content"].update(uri="tiles/a.b3dm"), "GLB files"),
        (lambda d: d["root"].update(boundingVolume={"region": [0, 0, 1, 1, 0, 1]}), "neither a box"),
        (lambda d: d["root"]["boundingVolume"].update(box=[0, 0, "x"]), "12 finite numbers"),
        (lambda d: d.pop("root"), "no 'asset' and 'root'"),
    ],
)
def test_bad_tileset_says_what_is_wrong(tileset, tmp_path, edit, message):
    import shutil

    folder = tmp_path / "ts"
    shutil.copytree(tileset[1], folder)
    (tmp_path / "outside.glb").write_bytes((folder / "tiles/root.glb").read_bytes())
    doc = json.loads((folder / "tileset.json").read_text())
    edit(doc)
    (folder / "tileset.json").write_text(json.dumps(doc))
    with pytest.raises(InputError, match=message):
        build_viewer([folder], tmp_path / "v")
    assert not (tmp_path / "v").exists()


# ------------------------------------------------------------------ the page in Chromium
@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    """A headless Chromium (system binary) with a fresh profile; skips where none can be had."""
    try:
        from playwright.sync_api import Error, sync_playwright
    except ImportError:
        pytest.skip("Playwright is not installed (pip install -e '.[viewer-test]')")
    if not Path(CHROMIUM).is_file():
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium, or set MICRODREAMER_CHROMIUM)")
    with sync_playwright() as p:
        try:
            context = p.chromium.launch_persistent_context(
                str(tmp_path_factory.mktemp("chromium-profile")),
                executable_path=CHROMIUM,
                args=LAUNCH_ARGS,
                headless=True,
                viewport={"width": 1000, "height": 900},
                device_scale_factor=1,
            )
        except Error as e:
            pytest.skip(f"Chromium at {CHROMIUM} would not start: {str(e).splitlines()[0]}")
        yield context
        context.close()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """build(paths) -> the URL of a served viewer of them; every server stopped at the end."""
    servers = []

    def build_and_serve(paths: list[Path], **kw) -> str:
        index = build_viewer(paths, tmp_path_factory.mktemp("viewer") / "v", **kw)
        url, server = serve(index.parent)
        servers.append(server)
        return url

    yield build_and_serve
    for server in servers:
        server.shutdown()
        server.server_close()


@dataclass
class Opened:
    page: object
    stats: dict
    console: list[tuple[str, str]] = field(default_factory=list)

    @property
    def errors(self) -> list[str]:
        return [f"{kind}: {text}" for kind, text in self.console if kind in ("error", "pageerror")]


def _wait_idle(page) -> dict:
    page.wait_for_function(
        "(() => { const s = JSON.parse(document.getElementById('md-stats').textContent);"
        " return s.state !== 'loading' && (s.state === 'error' || s.views.every(v => v.idle)); })()",
        timeout=LOAD_TIMEOUT_MS,
    )
    return json.loads(page.eval_on_selector("#md-stats", "e => e.textContent"))


def open_viewer(browser, url: str) -> Opened:
    page = browser.new_page()
    opened = Opened(page, {})
    page.on("console", lambda m: opened.console.append((m.type, m.text)))
    page.on("pageerror", lambda e: opened.console.append(("pageerror", str(e))))
    page.goto(url)
    opened.stats = _wait_idle(page)
    return opened


def capture(page, index: int = 0) -> np.ndarray:
    """[SIZE, SIZE, 3] uint8: the page's screenshot of the index-th 3D view."""
    box = page.locator("canvas").nth(index).bounding_box()
    clip = {"x": round(box["x"]), "y": round(box["y"]), "width": SIZE, "height": SIZE}
    return np.asarray(Image.open(io.BytesIO(page.screenshot(clip=clip))).convert("RGB"))


def foreground(image: np.ndarray) -> np.ndarray:
    """[H, W] bool: pixels visibly darker than the white background (sum of channels < 735)."""
    return image.astype(np.int64).sum(-1) < 735


def assert_drawn_centred(image: np.ndarray) -> None:
    """Not blank, not all object, and the object centred: the middle of its pixels' bounding box within
    10 % of the view's centre (the camera aims at the middle of the object's 3D box; perspective moves
    the silhouette's box by a few %), the centroid of its pixels within 15 % (a cow's mass sits lower
    than its box's middle). Placement to the pixel is checked against the renderer's frame."""
    fg = foreground(image)
    cover = fg.mean()
    assert 0.03 < cover < 0.9, f"object covers {cover:.1%} of the view"
    ys, xs = np.nonzero(fg)
    middle = (np.array([xs.min() + xs.max(), ys.min() + ys.max()]) / 2 + 0.5) / SIZE
    centroid = (np.array([xs.mean(), ys.mean()]) + 0.5) / SIZE
    assert np.abs(middle - 0.5).max() < 0.1, f"the object's box is centred at {middle} of the view"
    assert np.abs(centroid - 0.5).max() < 0.15, f"the object's centroid is at {centroid} of the view"


def assert_matches_render(
    image: np.ndarray, source: Path, iou_min: float, mad_max: float, frame=None
) -> None:
    """The view against `microdreamer render`'s azimuth-0 frame (same camera, white background; ``frame``:
    the (centre, radius) it frames, default the source's own): silhouettes' intersection over union
    >= iou_min, mean absolute difference <= mad_max levels."""
    from microdreamer.jobs.turntable import load_renderable, turntable_frames

    if frame is not None:
        frame = (torch.as_tensor(frame[0], dtype=torch.float32), frame[1])
    ref = next(turntable_frames(load_renderable(source), [0.0], size=SIZE, frame=frame))
    a, b = foreground(image), foreground(ref)
    iou = (a & b).sum() / max((a | b).sum(), 1)
    mad = np.abs(image.astype(np.float64) - ref).mean()
    assert iou >= iou_min and mad <= mad_max, (
        f"IoU {iou:.3f} (>= {iou_min}), mean |diff| {mad:.2f} (<= {mad_max})"
    )


# Tolerances against our renderers (measured at 256^2: synthetic splat IoU 0.996 / 1.6 levels,
# DreamGaussian sample 0.974 / 1.1, SH-3 sample 0.986 / 2.0; meshes 0.98-0.99 / 0.1-0.5): Spark cuts
# each Gaussian at sqrt(8) sigma and sorts per splat, ours at 3 sigma per tile; the browser
# antialiases mesh edges (MSAA) where ours supersamples. A mirrored, dark or offset view fails both.
SPLAT_IOU, SPLAT_MAD = 0.9, 6.0
MESH_IOU, MESH_MAD = 0.93, 3.0


def test_splat_view_reports_its_splats_and_matches_render(browser, served, synthetic_splat):
    opened = open_viewer(browser, served([synthetic_splat]) + f"?size={SIZE}")
    assert opened.stats["state"] == "ready", opened.stats["errors"]
    assert not opened.errors, opened.errors
    (view,) = opened.stats["views"]
    assert view["kind"] == "splat" and view["splats"] == 3000 and view["active_splats"] == 3000
    image = capture(opened.page)
    assert_drawn_centred(image)
    assert_matches_render(image, synthetic_splat, SPLAT_IOU, SPLAT_MAD)
    opened.page.close()


def test_mesh_view_matches_render(browser, served, synthetic_mesh):
    opened = open_viewer(browser, served([synthetic_mesh]) + f"?size={SIZE}")
    assert opened.stats["state"] == "ready" and not opened.errors, opened.errors
    (view,) = opened.stats["views"]
    import trimesh

    tm = trimesh.load(synthetic_mesh, force="mesh", process=False)
    assert (view["vertices"], view["triangles"]) == (len(tm.vertices), len(tm.faces))
    assert view["lit"] is False  # vertex colours shown as stored
    image = capture(opened.page)
    assert_drawn_centred(image)
    assert_matches_render(image, synthetic_mesh, MESH_IOU, MESH_MAD)
    opened.page.close()


def test_textured_obj_view_matches_render(browser, served, tmp_path):
    from microdreamer.mesh.load import load_textured_mesh

    obj = sample("meshes/spot/spot_triangulated.obj")
    spot = load_textured_mesh(obj, texture=obj.parent / "spot_texture.png")
    save_mesh(spot, tmp_path / "spot.obj")  # OBJ + MTL + PNG
    opened = open_viewer(browser, served([tmp_path / "spot.obj"]) + f"?size={SIZE}")
    assert opened.stats["state"] == "ready" and not opened.errors, opened.errors
    assert opened.stats["views"][0]["textured"] is True
    image = capture(opened.page)
    assert_drawn_centred(image)
    assert_matches_render(image, tmp_path / "spot.obj", MESH_IOU, MESH_MAD)
    opened.page.close()


@pytest.mark.parametrize("name", ["dg_creative_tmp_8.8k.ply", "supersplat_fruit_drops_4.7k_sh3.ply"])
def test_shared_splat_samples(browser, served, name):
    path = sample(f"splats/{name}")
    count = int(re.search(rb"element vertex (\d+)", path.read_bytes()[:4096]).group(1))
    opened = open_viewer(browser, served([path]) + f"?size={SIZE}")
    assert opened.stats["state"] == "ready" and not opened.errors, opened.errors
    assert opened.stats["views"][0]["splats"] == count
    image = capture(opened.page)
    assert_drawn_centred(image)
    assert_matches_render(image, path, SPLAT_IOU, SPLAT_MAD)
    opened.page.close()


def test_job_folder_side_by_side_with_linked_cameras(browser, served, job_folder):
    opened = open_viewer(browser, served([job_folder]) + f"?size={SIZE}")
    page = opened.page
    assert opened.stats["state"] == "ready" and not opened.errors, opened.errors
    mesh, splat = opened.stats["views"]
    assert (mesh["kind"], splat["kind"], splat["splats"]) == ("mesh", "splat", 3000)
    assert page.locator(".seconds").count() == 2  # timings.json and profile.json
    assert page.locator(".seconds").first.locator(".bar-row").count() == 4
    assert page.eval_on_selector("figure.image img", "img => img.complete && img.naturalWidth") > 0
    before = [capture(page, 0), capture(page, 1)]
    for i in range(2):
        assert_drawn_centred(before[i])

    def drag(dx: int) -> None:  # orbit the mesh view
        box = page.locator("canvas").nth(0).bounding_box()
        x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
        page.mouse.move(x, y)
        page.mouse.down()
        page.mouse.move(x + dx, y, steps=8)
        page.mouse.up()
        _wait_idle(page)

    def changed(a: np.ndarray, b: np.ndarray) -> float:
        return float((foreground(a) ^ foreground(b)).mean())

    drag(50)
    after = [capture(page, 0), capture(page, 1)]
    assert changed(before[0], after[0]) > 0.01 and changed(before[1], after[1]) > 0.01  # both turned
    page.locator(".link input").uncheck()
    drag(50)
    unlinked = [capture(page, 0), capture(page, 1)]
    assert changed(after[0], unlinked[0]) > 0.01 and changed(after[1], unlinked[1]) < 0.002
    assert not opened.errors, opened.errors
    page.close()


def test_file_url_works_with_embedded_assets(browser, synthetic_splat, synthetic_mesh, tmp_path):
    index = build_viewer([synthetic_splat, synthetic_mesh], tmp_path / "v", embed=True)
    opened = open_viewer(browser, index.as_uri() + f"?size={SIZE}")
    assert opened.stats["state"] == "ready" and not opened.errors, opened.errors
    splat, mesh = opened.stats["views"]
    assert (
        splat["splats"] == 3000
        and mesh["triangles"] == _manifest(index)["groups"][1]["views"][0]["stats"]["faces"]
    )
    for i in range(2):
        assert_drawn_centred(capture(opened.page, i))
    opened.page.close()


def _wait_for(page, condition: str) -> dict:
    """The page's stats once its first view satisfies ``condition`` (JavaScript on ``v``) and is idle."""
    page.wait_for_function(
        "(() => { const s = JSON.parse(document.getElementById('md-stats').textContent);"
        f" const v = s.views[0]; return s.state === 'error' || (v.idle && ({condition})); }})()",
        timeout=LOAD_TIMEOUT_MS,
    )
    return json.loads(page.eval_on_selector("#md-stats", "e => e.textContent"))


def test_tileset_streams_its_root_then_its_leaves(browser, served, tileset):
    """Opened, the tileset shows its coarse root (its error is under 16 pixels at this distance) where the
    renderer draws root.glb from the same camera; zoomed in, the leaves replace it: every face of the
    scene, the full mesh's silhouette."""
    out, folder = tileset
    url = served([folder])
    opened = open_viewer(browser, url + f"?size={SIZE}")
    page = opened.page
    assert opened.stats["state"] == "ready" and not opened.errors, opened.errors
    (view,) = opened.stats["views"]
    assert (
        view["kind"] == "tiles" and view["visible_tiles"] == ["tiles/root.glb"] and view["tiles_failed"] == 0
    )
    (spec,) = _manifest_of(page)["groups"][0]["views"]
    frame = _frame(spec["camera"])
    image = capture(page)
    assert_drawn_centred(image)  # a z-up tileset shown unturned would sit off centre (and fail below)
    assert_matches_render(image, folder / "tiles/root.glb", MESH_IOU, MESH_MAD, frame)
    box = page.locator("canvas").first.bounding_box()
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    for _ in range(25):  # OrbitControls: 0.95 of the distance a step; the leaves are due under about 1/3
        page.mouse.wheel(0, -100)
    stats = _wait_for(page, "!v.visible_tiles.includes('tiles/root.glb')")
    assert stats["state"] == "ready" and not opened.errors, opened.errors
    (view,) = stats["views"]
    doc = json.loads((folder / "tileset.json").read_text())
    assert view["visible_tiles"] == sorted(c["content"]["uri"] for c in doc["root"]["children"])
    import trimesh

    scene = trimesh.load(out, process=False)
    assert view["triangles"] == sum(len(g.faces) for g in scene.geometry.values())
    # OrbitControls dollies to 0.95 of the distance a wheel step of 100: the renderer's frame of a sphere
    # 0.95^25 as large is seen from that distance
    zoomed = (frame[0], frame[1] * 0.95**25)
    assert_matches_render(capture(page), out, MESH_IOU, MESH_MAD, zoomed)
    page.locator("figcaption button", has_text="reset view").click()  # back out: the root again
    stats = _wait_for(page, "v.visible_tiles.length === 1 && v.visible_tiles[0] === 'tiles/root.glb'")
    assert not opened.errors, opened.errors
    assert_matches_render(capture(page), folder / "tiles/root.glb", MESH_IOU, MESH_MAD, frame)
    page.close()


def test_tileset_opens_from_a_file_url(browser, tileset, tmp_path):
    index = build_viewer([tileset[1]], tmp_path / "v", embed=True)
    opened = open_viewer(browser, index.as_uri() + f"?size={SIZE}")
    assert opened.stats["state"] == "ready" and not opened.errors, opened.errors
    assert opened.stats["views"][0]["visible_tiles"] == ["tiles/root.glb"]
    assert_drawn_centred(capture(opened.page))
    opened.page.close()


def test_file_url_without_embedding_says_how_to_open_it(browser, synthetic_splat, tmp_path):
    index = build_viewer([synthetic_splat], tmp_path / "v", embed=False)
    opened = open_viewer(browser, index.as_uri())
    assert opened.stats["state"] == "error"
    message = opened.page.eval_on_selector("#md-message", "e => e.textContent")
    assert "microdreamer view" in message and "file://" in message
    opened.page.close()


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))


def test_scene_glb_of_tile_nodes_matches_render(browser, served, tmp_path):
    """``mesh --tiles`` writes one node per tile: the page shows them all, where the renderer draws the
    merged mesh."""
    from microdreamer import cli
    from microdreamer.splat import write_ply
    from test_scene import SCENE, spheres

    pytest.importorskip("skimage")
    write_ply(spheres(SCENE[:2], n=800), tmp_path / "scene.ply")
    out = tmp_path / "scene.glb"
    assert cli.main(["mesh", str(tmp_path / "scene.ply"), "-o", str(out), "--tiles", "2"]) in (0, None)
    opened = open_viewer(browser, served([out]) + f"?size={SIZE}")
    assert opened.stats["state"] == "ready" and not opened.errors, opened.errors
    (view,) = opened.stats["views"]
    import trimesh

    scene = trimesh.load(out, process=False)
    assert len(scene.graph.nodes_geometry) > 1
    assert view["triangles"] == sum(len(g.faces) for g in scene.geometry.values())
    image = capture(opened.page)
    assert_drawn_centred(image)
    assert_matches_render(image, out, MESH_IOU, MESH_MAD)
    opened.page.close()
