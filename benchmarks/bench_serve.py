"""Benchmark of ``microdreamer serve``: what the service adds to a job (issue 41's must-show).

    python benchmarks/bench_serve.py [--splat ../shared/samples/splats/dg_ghost_amd_17k.ply] [--runs 5]
        [--warmup 1] [--options JSON] [--json FILE]

A real server (``microdreamer serve --device cpu --random-weights tiny --config presets/tiny.yaml``, as the
tests start it: tests/test_serve.py's ``Server``) on a loopback port; after ``--warmup`` mesh jobs of the
splat, ``--runs`` more, one at a time, each timed by the client from just before its ``POST /api/jobs``
(the upload, built beforehand) to the event that says it is done (``GET /api/jobs/{id}/events``). The
service's overhead per request is that wall time minus the job's own in-process time (``seconds.job``:
the worker's read, field, mesh, texture and write, measured around the job function), split into the
POST (upload, the splat read to check it, the job folder made) and the rest (the wait in the queue, the
job handed to the worker process, its result back, the outputs listed, the event delivered); the
server's own record of the wait in the queue (``seconds.queued``, from the job's creation inside the POST
to its start) is listed beside them. The worker may start the job before the POST's answer reaches the
client, so the rest can be a few milliseconds below zero.
Target: <= 0.2 s per request (the median). The table is printed last; the JSON holds every run.
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import save_result  # noqa: E402  (benchmarks/ is on sys.path when run as a script)
from test_serve import TINY, Server, multipart  # noqa: E402  (the tests' server and upload builder)

GHOST = ROOT.parent / "shared" / "samples" / "splats" / "dg_ghost_amd_17k.ply"
TARGET_OVERHEAD_S = 0.2


def one_request(server: Server, body: bytes, ctype: str) -> dict:
    """Submit one job, follow its events to the end; the client's times and the job's record."""
    t0 = time.perf_counter()
    status, created = server.json("POST", "/api/jobs", body=body, headers={"Content-Type": ctype})
    t_post = time.perf_counter()
    assert status == 202, created
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=3600)
    conn.request("GET", f"/api/jobs/{created['id']}/events")
    r = conn.getresponse()
    job = None
    while True:
        line = r.fp.readline()
        if not line:
            break
        if line.startswith(b"data: "):
            job = json.loads(line[6:])
            if job["status"] in ("done", "failed", "cancelled"):
                break
    t_done = time.perf_counter()
    conn.close()
    assert job is not None and job["status"] == "done", job
    wall = t_done - t0
    s = job["seconds"]
    return {
        "id": job["id"],
        "wall_s": wall,
        "job_s": s["job"],
        "overhead_s": wall - s["job"],
        "post_s": t_post - t0,
        "queued_s": s["queued"],
        "rest_s": wall - (t_post - t0) - s["job"],
        "stages": {k: v for k, v in s.items() if k not in ("job", "queued", "wall")},
        "faces": job["summary"].get("faces"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--splat", default=str(GHOST))
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--options", default=None, help="the jobs' options (JSON); default: mesh's defaults")
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args()
    splat = Path(args.splat)
    fields = {"kind": "mesh", **({"options": args.options} if args.options else {})}
    body, ctype = multipart(fields, {"file": (splat.name, splat.read_bytes())})
    with tempfile.TemporaryDirectory() as tmp:
        server = Server(Path(tmp) / "jobs", "--random-weights", "tiny", "--config", str(TINY))
        try:
            t = time.perf_counter()
            health = server.wait_ready()
            ready_s = time.perf_counter() - t
            warm = [one_request(server, body, ctype) for _ in range(args.warmup)]
            runs = [one_request(server, body, ctype) for _ in range(args.runs)]
        finally:
            server.stop()
    keys = ("wall_s", "job_s", "overhead_s", "post_s", "queued_s", "rest_s")
    median = {k: statistics.median(r[k] for r in runs) for k in keys}
    result = {
        "what": "microdreamer serve: per-request overhead of a mesh job (client's submit -> done, minus the job's "
        "in-process seconds), one request at a time, after warm-up",
        "splat": splat.name,
        "options": json.loads(args.options) if args.options else {},
        "server": "microdreamer serve --device cpu --random-weights tiny --config presets/tiny.yaml (1 worker)",
        "worker_setup_seconds": health["workers"][0]["setup_seconds"],
        "seconds_to_ready": ready_s,
        "target_overhead_s": TARGET_OVERHEAD_S,
        "median": median,
        "max_overhead_s": max(r["overhead_s"] for r in runs),
        "warmup": warm,
        "runs": runs,
    }
    if args.json:
        save_result(args.json, result)
    print(
        f"{'run':>4} {'wall s':>8} {'job s':>8} {'overhead s':>11} {'POST s':>8} {'queued s':>9} {'rest s':>8}"
    )
    for i, r in enumerate(runs):
        print(
            f"{i:>4} " + " ".join(f"{r[k]:>{w}.3f}" for k, w in zip(keys, (8, 8, 11, 8, 9, 8), strict=True))
        )
    print(
        f"median overhead {median['overhead_s']:.3f} s per request (target <= {TARGET_OVERHEAD_S} s): POST "
        f"{median['post_s']:.3f}, then queue, hand-over and events {median['rest_s']:.3f} (the server's queue wait "
        f"{median['queued_s']:.3f})"
    )


if __name__ == "__main__":
    main()
