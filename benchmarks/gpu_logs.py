"""The logs of a GPU round (``benchmarks/gpu_round.sh``) as result JSON: the first-use compile and the
no-compiler runs, each with the command, the device and the commit it ran on.

    python benchmarks/gpu_logs.py DIR --commit SHA --out-prefix benchmarks/results/ --card h100

DIR holds what the round wrote under $OUT (``round1.log``, ``first_use_cold.log``, ``first_use_warm.log``,
``no_compiler.log``). Writes ``first_use_<card>.json`` and ``no_compiler_<card>.json``.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path


def _device(round_log: str) -> dict:
    lines = round_log.splitlines()
    gpu = lines[0].split(", ") if lines else []
    versions = dict(zip(*[iter(lines[1].split())] * 2, strict=False)) if len(lines) > 1 else {}
    return {"gpu": gpu[0] if gpu else None, "memory": gpu[1] if len(gpu) > 1 else None,
            "driver": gpu[2] if len(gpu) > 2 else None, **versions}  # fmt: skip


def first_use(folder: Path) -> dict:
    log = (folder / "round1.log").read_text()
    walls = {m[0]: float(m[1]) for m in re.findall(r"first-use (cold|warm): rc 0 wall ([\d.]+) s", log)}
    cold = (folder / "first_use_cold.log").read_text()
    ours = re.search(r"built the microdreamer CUDA kernels in ([\d.]+) s", cold)
    gs = re.search(r"gsplat: CUDA extension has been set up successfully in ([\d.]+) seconds", cold)
    stages = {
        run: dict(re.findall(r"(\w+) ([\d.]+)", re.search(r"^seconds: (.*)$", text, re.M).group(1)))
        for run, text in (("cold", cold), ("warm", (folder / "first_use_warm.log").read_text()))
    }
    return {
        "what": "a user's first `microdreamer mesh` on a GPU (an empty TORCH_EXTENSIONS_DIR: both compiles in "
        "the one process), then the same command again (warm cache)",
        "command": "TORCH_EXTENSIONS_DIR=/tmp/ext_cold microdreamer -v mesh dg_ghost_amd_17k.ply -o ghost.glb "
        "--device cuda (benchmarks/gpu_round.sh first-use)",
        "device": _device(log),
        "cli_wall_seconds": walls,
        "compile_seconds": {
            "microdreamer_kernels": float(ours.group(1)) if ours else None,
            "gsplat": float(gs.group(1)) if gs else None,
        },  # fmt: skip
        "stage_seconds": {k: {s: float(v) for s, v in d.items()} for k, d in stages.items()},
        "cache": "$TORCH_EXTENSIONS_DIR, else ~/.cache/torch_extensions/py<ver>_cu<ver>/ (gsplat_cuda 32 MB, "
        "microdreamer_kernels-<hash> 3.6 MB)",
    }


def no_compiler(folder: Path) -> dict:
    text = (folder / "no_compiler.log").read_text()
    notices = sorted({ln for ln in text.splitlines() if ln.startswith(("no CUDA compiler", "building "))})
    runs = [
        {"command": f"mesh {m[0]}.ply", "run": int(m[1]), "cli_wall_s": float(m[2])}
        for m in re.findall(r"no-compiler mesh (\S+) run (\d+): wall ([\d.]+) s", text)
    ]
    stage_lines = re.findall(r"^seconds: (field .*)$", text, re.M)
    for run, line in zip(runs, stage_lines, strict=False):
        run["stage_seconds"] = {s: float(v) for s, v in re.findall(r"(\w+) ([\d.]+)", line)}
    gen = re.search(r"no-compiler generate: wall ([\d.]+) s", text)
    gen_stages = re.search(r"^seconds: (diffusion .*)$", text, re.M)
    return {
        "what": "a GPU with no CUDA compiler: nvcc off PATH, CUDA_HOME at no toolkit, an empty extensions cache "
        "(benchmarks/gpu_round.sh no-compiler)",
        "device": _device((folder / "round1.log").read_text()),
        "toolkit_seen": re.search(r"^toolkit: (.*)$", text, re.M).group(1),
        "notice_lines": notices,
        # each mesh process printed its whole output; generate's was cut to its last lines by the round
        "notice_printed_once_per_mesh_process": text.count("no CUDA compiler (nvcc) found") == len(runs),
        "mesh_runs": runs,
        "generate": {
            "command": "generate ghost_rgba.png --random-weights full (one fresh process)",
            "cli_wall_s": float(gen.group(1)) if gen else None,
            "stages": gen_stages.group(1) if gen_stages else None,
        },
        "reconstruct": "not finished inside the round's limit (reconstruct --iters 300 on the PyTorch rasteriser)"
        if "no-compiler reconstruct" not in text
        else re.search(r"no-compiler reconstruct.*", text).group(0),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--commit", required=True)
    ap.add_argument("--date", required=True)
    ap.add_argument("--card", default="h100")
    ap.add_argument("--out-prefix", default="benchmarks/results/")
    args = ap.parse_args()
    for name, fn in (("first_use", first_use), ("no_compiler", no_compiler)):
        doc = {"date": args.date, "commit": args.commit, **fn(args.folder)}
        path = Path(f"{args.out_prefix}{name}_{args.card}.json")
        path.write_text(json.dumps(doc, indent=1) + "\n")
        print(path)


if __name__ == "__main__":
    main()
