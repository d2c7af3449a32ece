"""Scene-scale splats: `microdreamer mesh --tiles auto` against the dense path on scenes built from the
shared guitar capture (copies on a grid on the ground, each moved and turned by a seeded jitter).

    python benchmarks/bench_scene.py [--gaussians 1000000] [--modes tiles,tiles-w2,dense] [--device cpu|cuda]
                                     [--texture field] [--tile-threads 1,4] [--keep DIR] [--out PATH]

    # on a GPU: the tiles in-process (after a warm-up on one guitar) and through the command
    python benchmarks/bench_scene.py --gaussians 4000000 --modes tiles --device cuda --max-rss 60

Modes: ``tiles`` (``--tiles auto``), ``tiles-wN`` (the same on N Ray workers of a local cluster:
``--workers N``, its start-up included), ``dense``.

Each run is the console command in a child process (start-up, reading and writing included); its peak
resident memory is the child's own (``os.wait4``'s rusage), its stage seconds the ones it prints; a run
whose resident memory passes ``--max-rss`` GiB is killed and recorded as such. The Ray workers are not the
child's children in rusage's sense: ``peak_tree_rss_GiB`` is the largest sum of the resident memory of the
child and all its descendants (the raylet, the workers), sampled every 0.2 s (shared pages, the object
store's among them, counted once per process). The dense run is untextured by default
(``--dense-texture``). With ``--device cuda`` the tiles are also run in this process
(:func:`microdreamer.scene.scene_to_mesh` on the scene in memory, once on one guitar first to load the
kernels), with its stage seconds, wall and peak GPU memory (``torch.cuda.max_memory_allocated``) beside the
peak resident memory. Writes benchmarks/results/scene_<gaussians / 1000>k.json (on a GPU
``scene_<n>k_<card>.json``, e.g. ``_h100``) with the command and the hardware. Never run a setting expected
above ~8 GB resident on a shared machine (the dense path reached 20 GB at 4M).
"""

from __future__ import annotations

import argparse
import hashlib
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from _common import save_result  # benchmarks/ is on sys.path when run as a script

ROOT = Path(__file__).resolve().parents[1]
GUITAR = ROOT.parent / "shared" / "samples" / "splats" / "pc_guitar_91k_sh0.decoded.ply"
if not GUITAR.exists():
    GUITAR = Path("/work/shared/samples/splats/pc_guitar_91k_sh0.decoded.ply")


def scene_splat(gaussians: int, seed: int = 0, gap: float = 1.3):
    """ceil(gaussians / 91k) copies of the guitar on a square grid in the x-z plane (the guitar stands along
    y), ``gap`` times its larger footprint side apart, each turned about y by a seeded random angle and moved
    by up to 10 % of the spacing: ``(splat, [(rotation [3, 3] float64, translation [3] float64)] per copy,
    info)``; copy k is ``guitar.transformed(rotation, translation=translation)``."""
    import torch

    from microdreamer.splat import Splat, read_splat

    guitar = read_splat(GUITAR)
    copies = max(1, math.ceil(gaussians / len(guitar)))
    keep = guitar.opacities() > 0.005
    lo, hi = guitar.means[keep].amin(0), guitar.means[keep].amax(0)
    centre = (lo + hi) / 2
    step = gap * float(max(hi[0] - lo[0], hi[2] - lo[2]))
    side = math.ceil(math.sqrt(copies))
    g = torch.Generator().manual_seed(seed)
    parts, transforms = [], []
    for c in range(copies):
        angle = float(torch.rand(1, generator=g)) * 2 * math.pi
        jitter = (torch.rand(2, generator=g) - 0.5) * 0.2 * step
        ca, sa = math.cos(angle), math.sin(angle)
        rot = torch.tensor([[ca, 0.0, sa], [0.0, 1.0, 0.0], [-sa, 0.0, ca]], dtype=torch.float64)
        where = torch.tensor(
            [(c % side) * step + float(jitter[0]), 0.0, (c // side) * step + float(jitter[1])]
        )
        translation = where.double() - rot @ centre.double()
        parts.append(guitar.transformed(rot, translation=translation).tensors())
        transforms.append((rot, translation))
    scene = Splat(**{k: torch.cat([p[k] for p in parts]) for k in parts[0]})
    info = {"copies": copies, "gaussians": len(scene), "grid_side": side, "spacing": round(step, 4)}
    return scene, transforms, info


def build_scene(path: Path, gaussians: int, seed: int = 0, gap: float = 1.3) -> dict:
    """Write :func:`scene_splat`'s scene to ``path``; returns what was built."""
    from microdreamer.splat import write_ply

    scene, _, info = scene_splat(gaussians, seed, gap)
    write_ply(scene, path)
    return info


def _tree_rss_kib(root: int) -> int:
    """KiB resident in process ``root`` and all its descendants (from /proc)."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
        pid = int(entry.name)
        children.setdefault(int(fields.get("PPid", "0").strip() or 0), []).append(pid)
        rss[pid] = int(fields.get("VmRSS", "0 kB").split()[0])
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += rss.get(pid, 0)
        todo.extend(children.get(pid, []))
    return total


def run(cmd: list[str], max_rss_gib: float) -> dict:
    """The command's wall seconds, its own peak RSS (GiB, ``os.wait4``'s rusage of this child), its stdout
    and its stage seconds. A watchdog kills it when its (and its descendants') resident memory passes ``max_rss_gib``
    (``killed_above_GiB`` is then set)."""
    import threading

    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})  # fmt: skip
    streams = {}
    readers = [threading.Thread(target=lambda k, f: streams.__setitem__(k, f.read()), args=(k, f))
               for k, f in (("out", proc.stdout), ("err", proc.stderr))]  # fmt: skip
    for r in readers:
        r.start()
    killed = None
    tree_peak = 0
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        tree = _tree_rss_kib(proc.pid)
        tree_peak = max(tree_peak, tree)
        if tree > max_rss_gib * 2**20 and killed is None:
            proc.kill()
            killed = max_rss_gib
        time.sleep(0.2)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    for r in readers:
        r.join()
    out, err = streams.get("out", ""), streams.get("err", "")
    result = {"wall_seconds": round(wall, 1), "peak_rss_GiB": round(usage.ru_maxrss / 2**20, 3),
              "peak_tree_rss_GiB": round(tree_peak / 2**20, 3)}  # fmt: skip
    if killed is not None:
        return {**result, "killed_above_GiB": killed, "log_tail": err.strip().splitlines()[-5:]}
    if proc.returncode != 0:
        sys.exit(f"error: {' '.join(cmd)} failed ({proc.returncode}):\n{err[-3000:]}")
    m = re.search(r"seconds: (.*)", out)
    stages = {k: float(v) for k, v in (kv.split() for kv in m.group(1).split(", "))} if m else {}
    faces = re.search(r"mesh: (\d+) vertices, (\d+) faces", out)
    gpu = re.search(r"peak GPU memory ([\d.]+) GiB", out)
    if gpu:
        result["peak_gpu_GiB"] = float(gpu.group(1))
    return {
        **result,
        "stage_seconds": stages,
        "vertices": int(faces.group(1)) if faces else None,
        "faces": int(faces.group(2)) if faces else None,
        "stdout": out.strip().splitlines(),
    }


def card_name() -> str:
    """A short name of GPU 0 (``h100``, ``h200``, ...; ``cpu`` without one) for the result's file name."""
    import torch

    if not torch.cuda.is_available():
        return "cpu"
    name = torch.cuda.get_device_name(0)
    m = re.search(r"\b([A-Z]{1,2}\d{2,4}[A-Z]?)\b", name)
    return (m.group(1) if m else re.sub(r"\W+", "_", name)).lower()


def in_process(gaussians: int, device: str, colors: bool, threads: int = 1) -> dict:
    """:func:`~microdreamer.scene.scene_to_mesh` on :func:`scene_splat`'s scene in this process, with the
    mesh command's default settings, after one warm-up call on a single guitar: wall and stage seconds,
    faces, peak GPU memory of the timed call, and this process's peak resident memory (the scene included).
    ``threads`` > 1: the tiles on that many threads (:func:`~microdreamer.scene.threaded_tiles`);
    ``mesh_sha1`` (vertices, faces, colours) tells whether two runs made the same mesh."""
    import resource

    import numpy as np
    import torch

    from microdreamer.config import ExportConfig
    from microdreamer.scene import scene_to_mesh, threaded_tiles

    config = ExportConfig()
    warm, _, _ = scene_splat(1)
    scene_to_mesh(warm, config.field, config.mesh, tile=config.scene.tile, colors=colors, device=device)
    splat, _, _ = scene_splat(gaussians)
    cuda = torch.device(device).type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    result = scene_to_mesh(
        splat, config.field, config.mesh, tile=config.scene.tile, colors=colors, device=device,
        map_tiles=threaded_tiles(threads) if threads > 1 else None,
    )  # fmt: skip
    wall = time.perf_counter() - start
    digest = hashlib.sha1()
    for a in (result.mesh.vertices, result.mesh.faces, result.mesh.vertex_colors):
        if a is not None:
            digest.update(np.ascontiguousarray(a).tobytes())
    out = {
        "wall_seconds": round(wall, 2),
        "stage_seconds": {k: round(v, 3) for k, v in result.stats["seconds"].items()},
        "peak_rss_GiB": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 3),
        "faces": result.mesh.num_faces,
        "vertices": result.mesh.num_vertices,
        "tiles_with_gaussians": result.stats["tiles_with_gaussians"],
        "grid_shape": result.stats["grid_shape"],
        "backend": result.stats["backend"],
        **(
            {"worker_seconds": {k: round(v, 3) for k, v in result.stats["worker_seconds"].items()}}
            if "worker_seconds" in result.stats
            else {}
        ),
        "tile_threads": threads,
        "mesh_sha1": digest.hexdigest(),
    }
    if cuda:
        out["peak_gpu_GiB"] = round(torch.cuda.max_memory_allocated() / 2**30, 3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gaussians", type=int, default=1_000_000)
    ap.add_argument("--modes", default="tiles,dense", help="comma-separated: tiles, tiles-wN, dense")
    ap.add_argument("--texture", default="field", help="the mesh command's --texture (tiles: vertex colours)")
    ap.add_argument("--max-rss", type=float, default=7.5, help="kill a run above this many GiB resident")
    ap.add_argument(
        "--dense-texture", default="none", help="the dense run's --texture (its field bake held 15 GB at 1M)"
    )
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="the mesh command's --device")
    ap.add_argument("--tile-threads", default="1",
                    help="comma-separated thread counts of the in-process tiles (CUDA), e.g. 1,4")  # fmt: skip
    ap.add_argument("--keep", type=Path, default=None, help="keep the scene, meshes and logs in this folder")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    import tempfile

    card = f"_{card_name()}" if args.device == "cuda" else ""
    out_json = args.out or ROOT / "benchmarks" / "results" / f"scene_{args.gaussians // 1000}k{card}.json"
    runs = {}
    if args.device == "cuda" and "tiles" in args.modes.split(","):
        for threads in (int(x) for x in args.tile_threads.split(",")):
            name = "in-process" if threads == 1 else f"in-process-t{threads}"
            runs[name] = r = in_process(args.gaussians, args.device, args.texture != "none", threads)
            print(f"{name}: wall {r['wall_seconds']} s, peak GPU {r['peak_gpu_GiB']} GiB, peak RSS "
                  f"{r['peak_rss_GiB']} GiB, {r['faces']} faces, mesh {r['mesh_sha1'][:12]}")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        work = args.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        ply = work / f"scene_{args.gaussians}.ply"
        t = time.perf_counter()
        built = build_scene(ply, args.gaussians)
        built["build_seconds"] = round(time.perf_counter() - t, 1)
        for mode in args.modes.split(","):
            extra = ["--tiles", "auto"] if mode.startswith("tiles") else []
            if mode.startswith("tiles-w"):
                extra += ["--workers", mode.removeprefix("tiles-w")]
            cmd = [sys.executable, "-m", "microdreamer.cli", "mesh", str(ply), "-o", str(work / f"{mode}.glb"),
                   "--texture", args.texture if mode.startswith("tiles") else args.dense_texture,
                   "--device", args.device, *extra]  # fmt: skip
            result = run(cmd, args.max_rss)
            result["command"] = " ".join(["microdreamer", *cmd[3:]]).replace(str(work), "WORK")
            runs[mode] = result
            print(f"{mode}: wall {result['wall_seconds']} s, peak RSS {result['peak_rss_GiB']} GiB, "
                  f"{result.get('faces')} faces" + (f" (killed above {result['killed_above_GiB']} GiB)"
                                                    if "killed_above_GiB" in result else ""))  # fmt: skip
    save_result(out_json, {
        "benchmark": "microdreamer mesh on a scene of guitar copies: tiled against dense, one child process each",
        "scene": built,
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "runs": runs,
    })  # fmt: skip
    stages = sorted({k for r in runs.values() for k in r.get("stage_seconds", {})})
    print(f"\n{'stage':<14}" + "".join(f"{m:>12}" for m in runs))
    for k in stages:
        print(f"{k:<14}" + "".join(f"{r.get('stage_seconds', {}).get(k, float('nan')):12.1f}"
                                   for r in runs.values()))  # fmt: skip
    for key in ("wall_seconds", "peak_rss_GiB", "peak_tree_rss_GiB", "peak_gpu_GiB", "faces"):
        print(f"{key:<14}" + "".join(f"{r.get(key)!s:>12}" for r in runs.values()))
    print(f"-> {out_json}")


if __name__ == "__main__":
    main()
