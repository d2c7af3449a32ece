"""``microdreamer serve``: a real uvicorn process on a loopback port, tiny random models, the CPU.

Every test talks HTTP to a server started by the command line (``python -m microdreamer.cli serve``) and
waits for jobs with bounded polling loops (no timing asserts: the shared CPU is slow and its load varies).
The page is driven in the system's Chromium through Playwright, as tests/test_viewer.py does.
"""

from __future__ import annotations

import http.client
import io
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import uuid
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from conftest import sample
from microdreamer.splat import read_ply, write_ply
from microdreamer.synthetic import make_synthetic_object

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "src" / "microdreamer" / "presets" / "tiny.yaml"
CHROMIUM = os.environ.get("MICRODREAMER_CHROMIUM", "/usr/bin/chromium")
LAUNCH_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--use-angle=swiftshader", "--enable-unsafe-swiftshader",
]  # fmt: skip
#: polling: a job is awaited for at most POLLS x POLL_S seconds (generous: a loaded 2-core machine)
POLL_S = 0.25
POLLS = 4 * 60 * 40
#: a quick mesh job: a small grid, no carving, a small field texture
QUICK_MESH = {"resolution": 40, "carve": 0, "texture": "field", "texture-size": 64}
#: text-to-3D on the tiny random MVDream (the server's preset sets 2 SIR views; MVDream takes 4)
TINY_TEXT = {"mvdream": {"image_size": 64, "ddim": {"num_inference_steps": 10}},
             "sir": {"iterations": 1, "views": 4, "radius": 2.5, "lambda_ref_rgb": 0.0, "lambda_ref_mask": 0.0},
             "export": {"mesh": {"threshold": 0.05}, "texture": {"mode": "none"}}}  # fmt: skip


# ------------------------------------------------------------------ a server process and an HTTP client
class Server:
    """``microdreamer serve`` in a subprocess on 127.0.0.1 (a free port), and requests to it."""

    def __init__(self, jobs_dir: Path, *extra: str) -> None:
        self.jobs_dir = Path(jobs_dir)
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
        }
        cmd = [sys.executable, "-m", "microdreamer.cli", "serve", "--host", "127.0.0.1", "--port", "0",
               "--jobs-dir", str(jobs_dir), "--device", "cpu", *extra]  # fmt: skip
        self.log = open(self.jobs_dir.parent / f"serve-{uuid.uuid4().hex[:6]}.log", "w+")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self.log, text=True, env=env)
        line = self.proc.stdout.readline()  # the first line says the address; the process ends on bad input
        m = re.search(r"serving at http://127\.0\.0\.1:(\d+)/", line)
        assert m, f"no address from the server: {line!r}; log: {self.read_log()}"
        self.port = int(m.group(1))
        self.base = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.proc.stdout.read, daemon=True).start()  # drain

    def read_log(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text()[-4000:]

    def request(self, method: str, path: str, body: bytes | None = None, headers: dict | None = None):
        """(status, body bytes, headers); ``path`` is sent as it is (no normalisation)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            r = conn.getresponse()
            return r.status, r.read(), dict(r.getheaders())
        finally:
            conn.close()

    def json(self, method: str, path: str, **kw):
        status, body, _ = self.request(method, path, **kw)
        return status, json.loads(body or b"{}")

    def submit(self, kind=None, file=None, prompt=None, options=None, headers=None):
        """POST /api/jobs (multipart); ``file`` a path or (name, bytes). Returns (status, json)."""
        fields = {k: v for k, v in (("kind", kind), ("prompt", prompt)) if v is not None}
        if options is not None:
            fields["options"] = options if isinstance(options, str) else json.dumps(options)
        files = {}
        if file is not None:
            name, data = (file.name, file.read_bytes()) if isinstance(file, Path) else file
            files["file"] = (name, data)
        body, ctype = multipart(fields, files)
        return self.json("POST", "/api/jobs", body=body, headers={"Content-Type": ctype, **(headers or {})})

    def wait(self, job_id: str, until=("done", "failed", "cancelled"), headers=None) -> dict:
        for _ in range(POLLS):
            status, job = self.json("GET", f"/api/jobs/{job_id}", headers=headers)
            assert status == 200, job
            if job["status"] in until:
                return job
            assert self.proc.poll() is None, self.read_log()
            time.sleep(POLL_S)
        raise AssertionError(f"job {job_id} still {job['status']} after {POLLS} polls")

    def wait_ready(self) -> dict:
        for _ in range(POLLS):
            status, health = self.json("GET", "/api/health")
            if status == 200 and health["ready"]:
                return health
            assert self.proc.poll() is None, self.read_log()
            time.sleep(POLL_S)
        raise AssertionError("the server's worker never became ready")

    def stop(self, sig=signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            code = self.proc.wait()  # uvicorn stops its workers, then exits
        else:
            code = self.proc.returncode
        self.log.close()
        return code

    def job_folders(self) -> set[str]:
        return {p.name for p in self.jobs_dir.iterdir() if p.name != ".incoming"} | {
            f".incoming/{p.name}" for p in (self.jobs_dir / ".incoming").glob("*")
        }


def multipart(fields: dict, files: dict) -> tuple[bytes, str]:
    boundary = uuid.uuid4().hex
    out = io.BytesIO()
    for k, v in fields.items():
        out.write(f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode())
    for k, (name, data) in files.items():
        out.write(f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"; filename="{name}"\r\n'
                  "Content-Type: application/octet-stream\r\n\r\n".encode())  # fmt: skip
        out.write(data + b"\r\n")
    out.write(f"--{boundary}--\r\n".encode())
    return out.getvalue(), f"multipart/form-data; boundary={boundary}"


# ------------------------------------------------------------------ inputs
@pytest.fixture(scope="module")
def splat_file(tmp_path_factory) -> Path:
    """A small seeded 3DGS PLY (2,000 Gaussians)."""
    path = tmp_path_factory.mktemp("inputs") / "object.ply"
    write_ply(make_synthetic_object(n=2000, seed=3, scale_fraction=0.03), path)
    return path


@pytest.fixture(scope="module")
def image_file(tmp_path_factory) -> Path:
    """An RGBA image of a red disc (its alpha is the mask)."""
    yy, xx = np.mgrid[0:80, 0:80]
    a = np.clip(24.0 - np.hypot(yy - 40, xx - 40), 0, 1)
    img = np.zeros((80, 80, 4), np.uint8)
    img[..., 0], img[..., 1], img[..., 3] = 200, 90, (a * 255).astype(np.uint8)
    path = tmp_path_factory.mktemp("inputs") / "disc.png"
    Image.fromarray(img, "RGBA").save(path)
    return path


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One server for the module: the tiny random model, the tiny preset, a 2 MB upload limit."""
    jobs = tmp_path_factory.mktemp("serve") / "jobs"
    s = Server(jobs, "--random-weights", "tiny", "--config", str(TINY), "--max-upload-mb", "2")
    try:
        s.wait_ready()
        yield s
    finally:
        s.stop()


# ------------------------------------------------------------------ the API
def test_health_says_device_and_model(server):
    status, health = server.json("GET", "/api/health")
    assert status == 200 and health["status"] == "ok"
    assert health["device"] == "cpu" and health["model"] == "random-tiny" and health["model_error"] is None
    assert health["limits"]["max_upload_mb"] == 2
    status, schema = server.json("GET", "/openapi.json")
    assert status == 200 and "/api/jobs/{job_id}/events" in schema["paths"]
    status, body, _ = server.request("GET", "/docs")
    assert status == 200 and b"swagger" in body.lower()
    status, body, _ = server.request("GET", "/")
    assert status == 200 and b"microdreamer" in body and b"/static/serve.js" in body


def _events(server, job_id: str) -> list[dict]:
    """The job's server-sent events, read until the stream ends (it ends when the job finishes)."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=3600)
    conn.request("GET", f"/api/jobs/{job_id}/events")
    r = conn.getresponse()
    assert r.status == 200 and r.getheader("content-type").startswith("text/event-stream")
    events = [json.loads(line[6:]) for line in r.read().decode().splitlines() if line.startswith("data: ")]
    conn.close()
    return events


def test_mesh_job_end_to_end(server, splat_file, tmp_path):
    import trimesh

    status, created = server.submit("mesh", splat_file, options=QUICK_MESH)
    assert status == 202, created
    events = _events(server, created["id"])
    assert events[-1]["status"] == "done", events[-1]
    progress = [e["progress"] for e in events if e["status"] == "running"]
    assert progress == sorted(progress)  # never goes back
    job = server.wait(created["id"])
    assert job["files"] == ["mesh.glb", "timings.json"] and job["error"] is None
    assert job["seconds"]["job"] > 0 and {"field", "mesh", "texture", "wall", "queued"} <= set(job["seconds"])
    assert job["summary"]["gaussians_in"] == 2000 and job["summary"]["field_resolution"] == 40
    status, data, headers = server.request("GET", f"/api/jobs/{job['id']}/files/mesh.glb")
    assert status == 200 and headers["content-type"] == "model/gltf-binary"
    (tmp_path / "mesh.glb").write_bytes(data)
    mesh = trimesh.load(tmp_path / "mesh.glb", force="mesh")
    assert len(mesh.faces) == job["summary"]["faces"] > 0
    status, timings = server.json("GET", f"/api/jobs/{job['id']}/files/timings.json")
    assert status == 200 and timings["mesh"]["faces"] == len(mesh.faces)
    status, page, _ = server.request("GET", f"/api/jobs/{job['id']}/viewer/index.html")
    assert status == 200 and b"microdreamer-viewer" in page
    status, listed = server.json("GET", "/api/jobs")
    assert status == 200 and job["id"] in [j["id"] for j in listed["jobs"]]


def test_generate_job_end_to_end(server, image_file, tmp_path):
    import trimesh

    status, created = server.submit("generate", image_file, options={"seed": 1})
    assert status == 202, created
    job = server.wait(created["id"])
    assert job["status"] == "done", job
    assert job["mode"] == "image" and job["summary"]["random_weights"] == "tiny"
    assert set(job["files"]) == {"input_rgba.png", "splat.ply", "mesh.glb", "views.png", "timings.json"}
    for name in job["files"]:
        status, data, _ = server.request("GET", f"/api/jobs/{job['id']}/files/{name}")
        assert status == 200, name
        (tmp_path / name).write_bytes(data)
    assert len(read_ply(tmp_path / "splat.ply")) == job["summary"]["num_gaussians"] > 0
    assert len(trimesh.load(tmp_path / "mesh.glb", force="mesh").faces) == job["summary"]["mesh_faces"]
    assert Image.open(tmp_path / "views.png").size[0] > 0
    timings = json.loads((tmp_path / "timings.json").read_text())
    assert timings["seed"] == 1 and timings["random_weights"] == "tiny"
    assert {"diffusion", "reconstruction", "mesh", "job"} <= set(job["seconds"])


def test_text_to_3d(server):
    status, created = server.submit(prompt="a small red ghost", options=TINY_TEXT)
    assert status == 202, created
    job = server.wait(created["id"])
    assert job["status"] == "done", job
    assert job["kind"] == "generate" and job["mode"] == "text" and job["input"] is None
    assert "input_rgba.png" not in job["files"] and "mesh.glb" in job["files"]
    status, timings = server.json("GET", f"/api/jobs/{job['id']}/files/timings.json")
    assert timings["mode"] == "text" and timings["prompt"] == "a small red ghost"


def _corrupt_splat(splat_file: Path) -> tuple[str, bytes]:
    data = splat_file.read_bytes()
    return "broken.ply", data[: len(data) // 2]  # the header promises more than the file holds


@pytest.mark.parametrize(
    "case, status, message",
    [
        ("image for a mesh job", 400, r"^picture\.png: .*PLY"),
        ("text for an image", 400, r"^notes\.png: cannot read the image"),
        ("corrupt splat", 400, r"^broken\.ply: "),
        ("oversized", 413, r"over the server's limit of 2 MB"),
        ("bad option value", 400, r"^options: resolution 1: "),
        ("unknown option", 400, r"^options: unknown ExportConfig field\(s\) colour"),
        ("options not JSON", 400, r"^options: not valid JSON"),
        ("model option", 400, r"^options: prior\.model: the server loads its model once"),
        ("unknown kind", 400, r"^kind 'paint'"),
        ("mesh without a file", 400, r"^file: a mesh job needs a splat"),
        ("nothing to generate from", 400, r"^nothing to generate from"),
        ("empty file", 400, r"the file is empty"),
    ],
)  # fmt: skip
def test_bad_uploads_are_refused_and_leave_nothing(server, splat_file, image_file, case, status, message):
    before = server.job_folders()
    requests = {
        "image for a mesh job": dict(kind="mesh", file=("picture.png", image_file.read_bytes())),
        "text for an image": dict(kind="generate", file=("notes.png", b"not an image at all\n" * 50)),
        "corrupt splat": dict(kind="mesh", file=_corrupt_splat(splat_file)),
        "oversized": dict(kind="mesh", file=("huge.ply", splat_file.read_bytes()[:1000] + bytes(3 << 20))),
        "bad option value": dict(kind="mesh", file=splat_file, options={"resolution": 1}),
        "unknown option": dict(kind="mesh", file=splat_file, options={"colour": "red"}),
        "options not JSON": dict(kind="mesh", file=splat_file, options="{resolution: 64"),
        "model option": dict(kind="generate", file=image_file, options={"prior": {"model": "/etc"}}),
        "unknown kind": dict(kind="paint", file=splat_file),
        "mesh without a file": dict(kind="mesh"),
        "nothing to generate from": dict(kind="generate"),
        "empty file": dict(kind="mesh", file=("empty.ply", b"")),
    }
    got, body = server.submit(**requests[case])
    assert got == status, body
    assert re.search(message, body["error"]), body["error"]
    assert (
        "\n" not in body["error"] and str(server.jobs_dir) not in body["error"]
    )  # one line, no server paths
    assert server.job_folders() == before  # nothing kept


def test_cancel_while_running(server, image_file, splat_file):
    status, created = server.submit("generate", image_file, options={"iters": 400})
    assert status == 202, created
    job = server.wait(created["id"], until=("running", "done", "failed", "cancelled"))
    for _ in range(POLLS):  # until the SIR loop reports (then it checks for the cancel at every iteration)
        if job["progress"] > 0.05 or job["status"] != "running":
            break
        time.sleep(POLL_S)
        job = server.json("GET", f"/api/jobs/{created['id']}")[1]
    assert job["status"] == "running", job
    status, answer = server.json("DELETE", f"/api/jobs/{created['id']}")
    assert status == 200 and answer["cancelling"], answer
    job = server.wait(created["id"])
    assert job["status"] == "cancelled" and job["files"] == []
    folder = server.jobs_dir / created["id"]
    assert not (folder / "out").exists() and not list(folder.glob(".out.tmp-*"))  # nothing half-written
    status, created = server.submit("mesh", splat_file, options=QUICK_MESH)  # the worker goes on
    assert server.wait(created["id"])["status"] == "done"
    # a queued job is cancelled at once; a finished one is deleted
    status, answer = server.json("DELETE", f"/api/jobs/{created['id']}")
    assert status == 200 and answer["deleted"] and not (server.jobs_dir / created["id"]).exists()
    assert server.json("GET", f"/api/jobs/{created['id']}")[0] == 404


def test_two_clients_at_once_are_served_in_order(server, splat_file):
    results: dict[int, dict] = {}
    gate = threading.Barrier(2)

    def client(k: int) -> None:
        gate.wait()
        status, created = server.submit(
            "mesh", (f"client{k}.ply", splat_file.read_bytes()), options=QUICK_MESH
        )
        assert status == 202, created
        results[k] = server.wait(created["id"])

    threads = [threading.Thread(target=client, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [0, 1] and all(r["status"] == "done" for r in results.values())
    first, second = sorted(results.values(), key=lambda r: r["created"])
    assert first["started"] <= second["started"]
    assert second["started"] >= first["finished"]  # one worker: one job at a time, first in first out


def test_queue_position(server, image_file, splat_file):
    status, slow = server.submit("generate", image_file, options={"iters": 400})
    server.wait(slow["id"], until=("running",))
    status, waiting = server.submit("mesh", splat_file, options=QUICK_MESH)
    assert status == 202 and waiting["position"] == 1
    status, job = server.json("GET", f"/api/jobs/{waiting['id']}")
    assert job["status"] == "queued" and job["position"] == 1
    assert server.json("DELETE", f"/api/jobs/{waiting['id']}")[1]["status"] == "cancelled"  # at once
    assert server.json("DELETE", f"/api/jobs/{slow['id']}")[0] == 200
    assert server.wait(slow["id"])["status"] == "cancelled"


def test_paths_outside_the_jobs_folder_are_refused(server, splat_file, tmp_path):
    status, created = server.submit("mesh", splat_file, options=QUICK_MESH)
    job = server.wait(created["id"])
    out = server.jobs_dir / job["id"] / "out"
    secret = tmp_path / "secret.txt"
    secret.write_text("not for clients")
    (out / "link.txt").symlink_to(secret)  # symbolic links planted in the jobs folder
    (out / "linkdir").symlink_to(tmp_path, target_is_directory=True)
    viewer = server.jobs_dir / job["id"] / "viewer"
    assert server.request("GET", f"/api/jobs/{job['id']}/viewer/index.html")[0] == 200
    (viewer / "assets" / "up").symlink_to(tmp_path, target_is_directory=True)
    base = f"/api/jobs/{job['id']}"
    attempts = [
        f"{base}/files/../job.json", f"{base}/files/..%2Fjob.json", f"{base}/files/%2e%2e%2fjob.json",
        f"{base}/files/%2e%2e", f"{base}/files/..", f"{base}/files/.%2e/input/{splat_file.name}",
        f"{base}/files/{urllib.parse.quote(str(secret), safe='')}", f"{base}/files//etc/passwd",
        f"{base}/files/%2Fetc%2Fpasswd", f"{base}/files/link.txt", f"{base}/files/linkdir",
        f"{base}/viewer/../job.json", f"{base}/viewer/..%2F..%2F..%2Fetc%2Fpasswd", f"{base}/viewer//etc/passwd",
        f"{base}/viewer/assets/up/secret.txt", f"{base}/viewer/%2e%2e/input/{splat_file.name}",
        f"{base}/viewer/assets/0_out/..%2F..%2F..%2Fjob.json", "/api/jobs/..%2F..%2Fetc/files/passwd",
        "/api/jobs/../../etc/passwd", "/static/..%2Fapp.py", "/static/../app.py", "/static/%2e%2e%2fapp.py",
        f"/api/jobs/{job['id']}%2F..%2F..%2F/files/job.json",
    ]  # fmt: skip
    for path in attempts:
        status, body, _ = server.request("GET", path)
        assert status in (400, 404), (path, status)
        assert b"not for clients" not in body and b"root:" not in body and b'"kind"' not in body, path
    assert server.request("GET", f"{base}/files/mesh.glb")[0] == 200  # the real file still is


def test_page_drives_a_mesh_job_in_chromium(server, tmp_path):
    """The ghost splat through the page: upload, progress, the mesh in the viewer, the GLB downloaded;
    the screenshot is docs/serve.png."""
    ghost = sample("splats/dg_ghost_amd_17k.ply")
    try:
        from playwright.sync_api import Error, sync_playwright
    except ImportError:
        pytest.skip("Playwright is not installed (pip install -e '.[viewer-test]')")
    if not Path(CHROMIUM).is_file():
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium, or set MICRODREAMER_CHROMIUM)")
    with sync_playwright() as p:
        try:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS, headless=True)
        except Error as e:
            pytest.skip(f"Chromium at {CHROMIUM} would not start: {str(e).splitlines()[0]}")
        page = browser.new_page(viewport={"width": 1100, "height": 1250}, accept_downloads=True)
        requests = []
        page.on("request", lambda r: requests.append(r.url))
        page.goto(server.base + "/")
        page.wait_for_function("document.getElementById('health').textContent.startsWith('ready')")
        page.set_input_files("#file", str(ghost))
        assert "splat" in page.inner_text("#chosen") and page.is_visible("#mesh-options")
        page.click("#go")
        page.wait_for_selector("#job[data-status='running'], #job[data-status='done']", timeout=0)
        seen = set()
        for _ in range(POLLS):  # watch the progress bar move
            state = page.get_attribute("#job", "data-status")
            seen.add((state, page.get_attribute("#job", "data-progress")))
            if state in ("done", "failed", "cancelled"):
                break
            time.sleep(POLL_S)
        assert state == "done", page.inner_text("#job-error")
        assert len({p for s, p in seen if s == "running"}) >= 2  # the bar moved while it ran
        frame = page.frame_locator("#viewer")
        frame.locator("#md-stats[data-state='ready']").wait_for(state="attached", timeout=0)
        stats = json.loads(frame.locator("#md-stats").text_content())
        mesh_view = next(v for v in stats["views"] if v["kind"] == "mesh")
        assert mesh_view["loaded"] and mesh_view["triangles"] > 1000
        canvas = frame.locator("canvas[data-kind='mesh']").screenshot()
        pixels = np.asarray(Image.open(io.BytesIO(canvas)).convert("L"), np.float32)
        assert pixels.std() > 5 and (pixels < 200).mean() > 0.02  # not blank: the ghost is drawn
        with page.expect_download() as download:
            page.click("#downloads a[download='mesh.glb']")
        glb = tmp_path / "ghost.glb"
        download.value.save_as(glb)
        assert glb.read_bytes()[:4] == b"glTF"
        page.locator("#job").scroll_into_view_if_needed()
        page.screenshot(path=str(tmp_path / "serve.png"), full_page=True)
        if os.environ.get("MICRODREAMER_WRITE_DOCS"):
            (ROOT / "docs" / "serve.png").write_bytes((tmp_path / "serve.png").read_bytes())
        browser.close()
    assert all(u.startswith(server.base) or u.startswith(("blob:", "data:")) for u in requests), [
        u for u in requests if not u.startswith(server.base)
    ]


# ------------------------------------------------------------------ a second server: restart and token
def test_restart_keeps_finished_jobs_and_fails_interrupted_ones(tmp_path, splat_file, image_file):
    jobs = tmp_path / "jobs"
    first = Server(jobs, "--random-weights", "tiny", "--config", str(TINY))
    try:
        first.wait_ready()
        status, done = first.submit("mesh", splat_file, options=QUICK_MESH)
        done = first.wait(done["id"])
        assert done["status"] == "done"
        status, running = first.submit("generate", image_file, options={"iters": 400})
        first.wait(running["id"], until=("running",))
        status, queued = first.submit("mesh", splat_file, options=QUICK_MESH)
        assert first.json("GET", f"/api/jobs/{queued['id']}")[1]["status"] == "queued"
    finally:
        assert first.stop(signal.SIGTERM) in (0, 143), first.read_log()  # 143: the CLI's "terminated"
    record = json.loads((jobs / running["id"] / "job.json").read_text())
    assert record["status"] == "failed" and "server stopped" in record["error"]
    assert not (jobs / running["id"] / "out").exists() and not list((jobs / running["id"]).glob(".out.tmp-*"))
    # a job the server could not mark (killed): its record says running and a partial output is left
    crashed = "0123456789abcdef"
    (jobs / crashed / ".out.tmp-99999").mkdir(parents=True)
    (jobs / crashed / ".out.tmp-99999" / "mesh.glb").write_bytes(b"half")
    (jobs / crashed / "job.json").write_text(json.dumps({"id": crashed, "kind": "mesh", "status": "running"}))

    second = Server(jobs, "--token", "s3cret-token", "--random-weights", "tiny", "--config", str(TINY))
    auth = {"Authorization": "Bearer s3cret-token"}
    try:
        assert second.json("GET", "/api/health")[0] == 200  # open
        assert second.json("GET", f"/api/jobs/{done['id']}")[0] == 401
        assert (
            second.json("GET", f"/api/jobs/{done['id']}", headers={"Authorization": "Bearer wrong-token"})[0]
            == 401
        )
        assert second.submit("mesh", splat_file)[0] == 401
        status, again = second.json("GET", f"/api/jobs/{done['id']}", headers=auth)
        assert status == 200 and again["status"] == "done" and again["files"] == done["files"]
        status, data, _ = second.request("GET", f"/api/jobs/{done['id']}/files/mesh.glb", headers=auth)
        assert status == 200 and data == (jobs / done["id"] / "out" / "mesh.glb").read_bytes()
        status, crash = second.json("GET", f"/api/jobs/{crashed}", headers=auth)
        assert crash["status"] == "failed" and "server stopped" in crash["error"]
        assert not list((jobs / crashed).glob(".out.tmp-*"))
        assert second.json("GET", f"/api/jobs/{running['id']}", headers=auth)[1]["status"] == "failed"
        second.wait_ready()
        assert second.wait(queued["id"], headers=auth)["status"] == "done"  # queued jobs run after a restart
        listed = second.json("GET", "/api/jobs", headers=auth)[1]["jobs"]
        assert {done["id"], running["id"], queued["id"], crashed} <= {j["id"] for j in listed}
    finally:
        second.stop()


def test_bad_settings_end_with_one_line(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    for args, message in [
        (["--port", "70000"], "error: --port 70000: must be between 0 and 65535"),
        (["--random-weights", "tiny", "--model", "x"], "error: --random-weights tiny: give --model or --random-weights, not both"),
        (["--config", str(tmp_path / "missing.yaml")], "config preset not found"),
        (["--token", "short"], "error: --token short: must be at least 8"),
    ]:  # fmt: skip
        r = subprocess.run([sys.executable, "-m", "microdreamer.cli", "serve", "--jobs-dir", str(tmp_path / "j"),
                            *args], capture_output=True, text=True, env=env)  # fmt: skip
        assert r.returncode == 2 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_a_job_over_the_time_limit_is_stopped_and_fails(tmp_path, image_file, splat_file):
    server = Server(
        tmp_path / "jobs", "--random-weights", "tiny", "--config", str(TINY), "--job-timeout", "3"
    )
    try:
        server.wait_ready()
        status, slow = server.submit("generate", image_file, options={"iters": 400})
        job = server.wait(slow["id"])
        assert job["status"] == "failed" and "time limit of 3 s" in job["error"], job
        assert not (tmp_path / "jobs" / slow["id"] / "out").exists()
        assert not list((tmp_path / "jobs" / slow["id"]).glob(".out.tmp-*"))
    finally:
        server.stop()


def test_ray_workers_run_jobs(tmp_path, splat_file):
    """--ray-address: the worker is the batches' Ray actor (here a local cluster started for the server); no
    model is given and none is cached, so generate jobs would fail with the load's line and mesh jobs run."""
    pytest.importorskip("ray", reason="Ray is not installed (pip install -e '.[distributed]')")
    server = Server(tmp_path / "jobs", "--ray-address", "local", "--workers", "1")
    try:
        health = server.wait_ready()
        assert health["workers"][0]["state"] == "ready" and health["model"] is None
        status, created = server.submit("mesh", splat_file, options=QUICK_MESH)
        job = server.wait(created["id"])
        assert job["status"] == "done" and job["files"] == ["mesh.glb", "timings.json"], job
        status, created = server.submit("generate", prompt="a ghost")
        job = server.wait(created["id"])
        assert job["status"] == "failed" and job["error"].startswith("the model did not load"), job
    finally:
        server.stop(signal.SIGINT)


def test_another_host_than_loopback_warns(tmp_path):
    """Checked without binding anything but loopback: the warning comes before the settings' last check."""
    r = subprocess.run([sys.executable, "-m", "microdreamer.cli", "serve", "--host", "0.0.0.0", "--jobs-dir",
                        str(tmp_path / "j"), "--config", str(tmp_path / "missing.yaml")], capture_output=True,
                       text=True, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})  # fmt: skip
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 2, r.stderr
    assert lines[0].startswith("WARNING: --host 0.0.0.0: the service is reachable from other machines")
    assert "set --token" in lines[0] and "config preset not found" in lines[1]


# ------------------------------------------------------------------ the parts, without a server
def test_importing_the_service_imports_neither_fastapi_nor_torch():
    code = "import sys, microdreamer.serve, microdreamer.cli; print(sorted({'fastapi', 'torch'} & set(sys.modules)))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT / "src")})  # fmt: skip
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stderr


@pytest.mark.parametrize(
    "given, cleaned",
    [("ghost.ply", "ghost.ply"), ("../../etc/passwd", "passwd"), ("C:\\x\\..\\a b.png", "a_b.png"),
     (".hidden.ply", "hidden.ply"), ("..", "input"), ("", "input"), (None, "input"), ("é.png", "_.png"),
     ("a" * 300 + ".ply", "a" * 96 + ".ply")],
)  # fmt: skip
def test_upload_names_become_one_plain_component(given, cleaned):
    from microdreamer.serve.store import clean_name

    assert clean_name(given) == cleaned


def test_store_resolves_only_real_files_inside_a_job(tmp_path):
    from microdreamer.serve.store import JobRecord, JobStore

    store = JobStore(tmp_path / "jobs")
    store.load()
    record = store.create(JobRecord(id="00112233445566aa", kind="mesh"), None)
    out = store.out_folder(record.id)
    out.mkdir()
    (out / "mesh.glb").write_bytes(b"glTF")
    (tmp_path / "outside.txt").write_text("x")
    (out / "link.glb").symlink_to(tmp_path / "outside.txt")
    (out / "sub").symlink_to(tmp_path, target_is_directory=True)
    assert store.resolve(record.id, "out", "mesh.glb") == out / "mesh.glb"
    for parts in [("out", "link.glb"), ("out", "sub", "outside.txt"), ("out", ".."), ("..", "jobs"), ("out",),
                  ("out", "../job.json"), ("out", "/etc/passwd"), ("out", ""), ("out", "mesh.glb/")]:  # fmt: skip
        assert store.resolve(record.id, *parts) is None, parts
    assert (
        store.resolve("../" + record.id, "job.json") is None
        and store.resolve("00112233445566AA", "job.json") is None
    )
    assert store.list_files(record.id) == ["mesh.glb"]


def test_options_use_the_cli_flags_and_the_config_fields():
    from microdreamer.config import ExportConfig
    from microdreamer.errors import InputError
    from microdreamer.serve.inputs import base_config, job_config

    cfg, extras = job_config("mesh", {"resolution": 128, "max-faces": 5000, "texture.size": 256,
                                      "mesh": {"carve": 0}, "format": "obj"}, ExportConfig())  # fmt: skip
    assert (cfg.field.resolution, cfg.mesh.decimate_target, cfg.texture.size, cfg.mesh.carve) == (
        128,
        5000,
        256,
        0,
    )
    assert extras == {"format": "obj"}
    cfg, _ = job_config(
        "generate", {"iters": 3, "no-refine": True}, base_config("generate", "image", str(TINY))
    )
    assert cfg.sir.iterations == 3 and not cfg.refine.enabled and cfg.image.size == 64  # the preset below
    for options, message in [({"resolution": 1}, "options: resolution 1: "), ({"decimate": -5}, "options: decimate -5"),
                             ({"field": {"resolution": "x"}}, "options.field: FieldConfig.resolution = 'x'"), ({"format": "stl"}, "format 'stl'"),
                             ({"texture": {"bake": {"model": 1}}}, "the server loads its model")]:  # fmt: skip
        with pytest.raises(InputError, match=re.escape(message)):
            job_config("mesh", options, ExportConfig())


@pytest.mark.parametrize(
    "kind, options, named",
    [
        ("mesh", {"tileset": "/tmp/elsewhere"}, "tileset"),
        ("mesh", {"scene": {"tileset": "/tmp/elsewhere"}}, "scene.tileset"),
        ("mesh", {"tiles": "auto", "tile-texture": "bake", "cameras": "/etc/passwd"}, "cameras"),
        ("mesh", {"workers": 2}, "workers"),
        ("mesh", {"scene.ray_address": "10.0.0.1:6379"}, "scene.ray_address"),
        ("generate", {"prior": {"hf_cache_dir": "/"}}, "prior.hf_cache_dir"),
    ],
)  # fmt: skip
def test_options_naming_server_paths_are_refused(kind, options, named):
    """A client's options may not name the server's files, folders or machines: a job reads its upload
    and writes its own folder, nothing else."""
    from microdreamer.errors import InputError
    from microdreamer.serve import inputs

    with pytest.raises(InputError) as e:
        inputs.job_config(
            kind, options, inputs.base_config(kind, "image" if kind == "generate" else None, None)
        )
    assert str(e.value).startswith(f"options: {named}: names the server's own files"), str(e.value)
