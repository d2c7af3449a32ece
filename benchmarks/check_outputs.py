"""Behaviour check: the CLI's outputs on fixed inputs, hashed, recorded once and compared later.

A refactor must not change what the commands write. This script runs, on the CPU:

* ``microdreamer mesh`` on the four shared splats, with ``--texture none`` and ``--texture field``;
* ``microdreamer render-views`` of a small coloured object built here, then ``reconstruct`` on it;
* ``microdreamer generate --random-weights tiny --iters 2`` on a shared image,

and records the SHA-256 of every output file (JSON outputs with their timing fields removed, as
those differ between runs). ``--record FILE`` writes the hashes; ``--compare FILE`` runs again and
exits 1 listing every file whose hash differs.

    python benchmarks/check_outputs.py --record benchmarks/results/outputs_cpu.json
    python benchmarks/check_outputs.py --compare benchmarks/results/outputs_cpu.json

Inputs under ``../shared/samples`` that are absent are skipped (and said so). The commands run with one
CPU thread (``OMP_NUM_THREADS=1``): with more, the reconstruction's gradients are summed in an order that
depends on the threads' timing, so two runs of the same code differ in the last bits. The outputs go to
one fixed folder (the dataset records its mesh's path).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT.parent / "shared" / "samples"
SPLATS = (
    "dg_creative_tmp_8.8k.ply",
    "dg_ghost_amd_17k.ply",
    "supersplat_fruit_drops_4.7k_sh3.ply",
    "pc_guitar_91k_sh0.decoded.ply",
)
IMAGE = "ghost_rgba.png"
#: keys of JSON outputs that hold wall-clock times or host facts, dropped before hashing
VOLATILE = {"seconds", "wall", "seconds_after_load", "seconds_after_load_and_warmup", "background_seconds",
            "demo_seconds", "device", "stages"}  # fmt: skip


def _strip(obj):
    if isinstance(obj, dict):
        return {k: _strip(v) for k, v in obj.items() if k not in VOLATILE}
    if isinstance(obj, list):
        return [_strip(v) for v in obj]
    return obj


def file_hash(path: Path) -> str:
    data = path.read_bytes()
    if path.suffix == ".json":
        data = json.dumps(_strip(json.loads(data)), sort_keys=True).encode()
    return hashlib.sha256(data).hexdigest()


def run(cmd: list[str]) -> None:
    print("$ " + " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env={**os.environ, "OMP_NUM_THREADS": "1"})


def write_object(path: Path) -> None:
    """A vertex-coloured bumpy sphere (a PLY mesh) for render-views."""
    import numpy as np
    import trimesh

    sphere = trimesh.creation.icosphere(subdivisions=3, radius=1.0)
    v = np.asarray(sphere.vertices)
    v = v * (1.0 + 0.15 * np.sin(3 * v[:, :1]) * np.cos(2 * v[:, 1:2]))
    rgb = np.clip(0.5 + 0.5 * np.stack([v[:, 0], v[:, 1], -v[:, 2]], 1), 0, 1)
    colors = np.concatenate([rgb * 255, np.full((len(v), 1), 255)], 1).astype(np.uint8)
    trimesh.Trimesh(v, sphere.faces, vertex_colors=colors, process=False).export(path, file_type="ply")


def produce(out: Path) -> dict[str, str]:
    """Run every command into ``out``; {relative path: hash} of what they wrote."""
    cli = [sys.executable, "-m", "microdreamer.cli"]
    skipped = []
    for name in SPLATS:
        src = SAMPLES / "splats" / name
        if not src.exists():
            skipped.append(name)
            continue
        stem = name.split("_")[1]
        for texture in ("none", "field"):
            run([*cli, "mesh", str(src), "-o", str(out / f"mesh_{stem}_{texture}.glb"), "--texture", texture,
                 "--device", "cpu"])  # fmt: skip
    write_object(out / "object.ply")
    run([*cli, "render-views", str(out / "object.ply"), "-o", str(out / "views"), "--views", "8", "--held-out", "2",
         "--size", "32", "--device", "cpu"])  # fmt: skip
    run(
        [
            *cli,
            "reconstruct",
            str(out / "views"),
            "-o",
            str(out / "recon"),
            "--iters",
            "40",
            "--device",
            "cpu",
        ]
    )
    image = SAMPLES / "images" / IMAGE
    if image.exists():
        run([*cli, "generate", str(image), "-o", str(out / "gen"), "--random-weights", "tiny", "--iters", "2",
             "--device", "cpu"])  # fmt: skip
    else:
        skipped.append(IMAGE)
    if skipped:
        print(f"skipped (not in {SAMPLES}): {', '.join(skipped)}")
    return {str(p.relative_to(out)): file_hash(p) for p in sorted(out.rglob("*")) if p.is_file()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--record", metavar="FILE", help="write the hashes to FILE")
    g.add_argument("--compare", metavar="FILE", help="compare with the hashes in FILE")
    args = p.parse_args()
    out = Path(tempfile.gettempdir()) / "microdreamer-check-outputs"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    try:
        hashes = produce(out)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    if args.record:
        Path(args.record).write_text(
            json.dumps({"command": " ".join(sys.argv), "files": hashes}, indent=2) + "\n"
        )
        print(f"recorded {len(hashes)} files -> {args.record}")
        return 0
    want = json.loads(Path(args.compare).read_text())["files"]
    differ = sorted(k for k in set(want) | set(hashes) if want.get(k) != hashes.get(k))
    for k in differ:
        print(f"DIFFERS: {k} (recorded {want.get(k, 'absent')[:12]}, now {hashes.get(k, 'absent')[:12]})")
    print(f"{len(hashes) - len([k for k in differ if k in hashes])} of {len(want)} files identical")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
