"""Benchmark of what ``microdreamer generate`` pays before its first SIR step (issue 24's warm start), each
number from fresh processes, ``--reps`` times (median, min and max; the table shows the median).

    python benchmarks/bench_startup.py [--random-weights tiny|full] [--via-disk DIR | --model PATH]
        [--image IMG] [--config YAML] [--device auto|cpu|cuda] [--reps 5] [--no-importtime] [--json FILE]

1. ``python -c pass`` and ``python -c "import torch"``: the interpreter, and torch.
2. The CLI, ``microdreamer generate IMAGE -o OUT ...`` (``_startup_child.py first-step``), stopped where SIR
   would start: seconds from the process's start to the input image's first open (time to first byte), to
   the model build's start and end, and to the first SIR step (after the warm-up on a GPU); generate's
   own stage seconds so far; which heavy packages were imported by then.
3. The parts, one after the other in one process (``_startup_child.py parts``): ``import torch``, the CLI's
   and generate's modules, the device's context, the model's diffusers and transformers imports, the
   model build (random weights) or load (``--model``, ``--via-disk``: a diffusers-format folder), and the
   prior's set-up.
4. Unless ``--no-importtime``: one more CLI run under ``python -X importtime``, and the cumulative import
   seconds of the packages in :data:`ATTRIBUTED` (nested: diffusers' includes the torch._dynamo it imports;
   importtime's own overhead inflates them, and the background imports of generate's export stages are
   mixed in: read them as shares, not as times).

``--via-disk DIR`` saves the random model in the diffusers layout under DIR first (reused when there) and
passes ``--model DIR/...``: the real loader on a real folder. The table is printed last; the JSON holds
every run, the commands and the hardware.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CHILD = HERE / "_startup_child.py"
#: packages whose cumulative import time ``-X importtime`` reports (first import of each)
ATTRIBUTED = ("torch", "microdreamer.cli", "microdreamer.jobs.generate", "diffusers", "torch._dynamo",
              "diffusers.models.modeling_utils", "diffusers.models.transformers", "diffusers.loaders.lora_base", "transformers",
              "transformers.modeling_utils", "torchvision", "peft", "triton", "scipy.stats", "sympy",
              "skimage.measure", "trimesh", "gsplat")  # fmt: skip


def child_run(cmd: list[str], log: Path) -> tuple[float, float, dict | None, str]:
    """(parent wall clock before the start, wall seconds, the child's RESULT JSON or None, its output)."""
    start = time.time()
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - t
    text = proc.stdout + proc.stderr
    log.write_text(text)
    found = [line[len("RESULT ") :] for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    return start, wall, json.loads(found[-1]) if found else None, text


def summary(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "runs": values}


def importtime_shares(stderr: str) -> dict[str, float]:
    """Cumulative seconds of each :data:`ATTRIBUTED` module's first import in ``-X importtime`` output."""
    found: dict[str, float] = {}
    for line in stderr.splitlines():
        m = re.match(r"import time:\s+\d+ \|\s+(\d+) \|\s*(\S+)", line)
        if m and m.group(2) in ATTRIBUTED and m.group(2) not in found:
            found[m.group(2)] = int(m.group(1)) / 1e6
    return {k: v for k, v in sorted(found.items(), key=lambda kv: -kv[1]) if v >= 0.01}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--random-weights", choices=["tiny", "full"], default="tiny")
    ap.add_argument("--model", default=None, help="a diffusers-format Zero123 folder to load")
    ap.add_argument("--via-disk", default=None, help="save the random model under this folder; load it")
    ap.add_argument("--image", default=str(ROOT.parent / "shared" / "samples" / "images" / "ghost_rgba.png"))
    ap.add_argument("--config", default=None, help="a GenerateConfig preset for the CLI runs")
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--no-importtime", action="store_true")
    ap.add_argument("--json", default="benchmarks/results/startup_cpu.json")
    args = ap.parse_args()
    from _common import save_result
    from bench_batch import saved_model

    model = args.model
    if args.via_disk:
        model = str(saved_model(Path(args.via_disk), args.random_weights, args.device))
    weights = ["--model", model] if model else ["--random-weights", args.random_weights]
    work = Path(tempfile.mkdtemp(prefix="bench_startup_"))
    cli_args = ["-o", str(work / "out"), "--overwrite", *weights, "--device", args.device]
    cli_args += ["--config", args.config] if args.config else []
    first_cmd = [sys.executable, str(CHILD), "first-step", args.image, *cli_args]
    parts_cmd = [sys.executable, str(CHILD), "parts", *weights, "--device", args.device]
    probes = {
        "interpreter": [sys.executable, "-c", "pass"],
        "import_torch": [sys.executable, "-c", "import torch"],
    }
    env_note = {
        k: os.environ.get(k) for k in ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX", "TRITON_CACHE_DIR")
    }

    walls: dict[str, list[float]] = {name: [] for name in probes}
    first: dict[str, list[float]] = {}
    part_seconds: dict[str, list[float]] = {}
    runs: list[dict] = []
    for rep in range(args.reps):  # the kinds interleaved, so that a busy spell hits all of them
        for name, cmd in probes.items():
            walls[name].append(child_run(cmd, work / f"{name}.log")[1])
        start, wall, res, text = child_run(first_cmd, work / "first_step.log")
        if res is None:
            raise SystemExit(f"the CLI run failed:\n{text[-3000:]}")
        ev = {k: v - start for k, v in res["events"].items()}
        ev["process_exit"] = wall
        for k, v in ev.items():
            first.setdefault(k, []).append(v)
        for k, v in res["generate_seconds"].items():
            first.setdefault(f"generate.{k}", []).append(v)
        _, _, parts, text = child_run(parts_cmd, work / "parts.log")
        if parts is None:
            raise SystemExit(f"the parts run failed:\n{text[-3000:]}")
        for k, v in parts["seconds"].items():
            part_seconds.setdefault(k, []).append(v)
        runs.append({"first_step": res, "parts": parts})
        print(f"rep {rep + 1}/{args.reps}: first SIR step at {ev.get('first_sir_step', float('nan')):.2f} s, "
              f"input first opened at {ev.get('input_first_open', float('nan')):.2f} s", flush=True)  # fmt: skip

    shares: dict[str, float] = {}
    if not args.no_importtime:
        cmd = [sys.executable, "-X", "importtime", *first_cmd[1:]]
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        shares = importtime_shares(proc.stderr)

    result = {
        "what": "microdreamer generate before its first SIR step, fresh processes",
        "model": model or f"random weights ({args.random_weights})",
        "environment": env_note,
        "commands": {
            "cli": "microdreamer generate " + " ".join([args.image, *cli_args]),
            "first_step": " ".join(first_cmd),
            "parts": " ".join(parts_cmd),
        },
        "reps": args.reps,
        "probes_wall_seconds": {k: summary(v) for k, v in walls.items()},
        "cli_seconds_from_process_start": {k: summary(v) for k, v in first.items()},
        "parts_seconds": {k: summary(v) for k, v in part_seconds.items()},
        "importtime_cumulative_seconds": shares,
        "imported_at_first_sir_step": runs[-1]["first_step"]["imported"],
        "modules_at_first_sir_step": runs[-1]["first_step"]["modules"],
        "runs": runs,
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    save_result(args.json, result)

    print(
        f"\nmicrodreamer generate, {result['model']}, device {args.device}: median of {args.reps} fresh processes"
    )
    print(f"{'what':<62} {'seconds':>8} {'min':>7} {'max':>7}")
    rows = [(f"python -c {k!r}" if k == "interpreter" else "python -c 'import torch'", v)
            for k, v in result["probes_wall_seconds"].items()]  # fmt: skip
    labels = {
        "cli_imported": "CLI: microdreamer.cli and jobs.generate imported",
        "input_first_open": "CLI: input image first opened (time to first byte)",
        "model_start": "CLI: model build/load starts",
        "model_end": "CLI: model built/loaded",
        "first_sir_step": "CLI: first SIR step (after the warm-up)",
        "process_exit": "CLI: process gone (stopped at the first SIR step)",
        "generate.load_model": "  generate's load_model stage",
        "generate.warmup": "  generate's warmup stage",
    }
    rows += [(label, result["cli_seconds_from_process_start"][k]) for k, label in labels.items()
             if k in result["cli_seconds_from_process_start"]]  # fmt: skip
    rows += [(f"part: {k}", v) for k, v in result["parts_seconds"].items()]
    for label, s in rows:
        print(f"{label:<62} {s['median']:8.2f} {s['min']:7.2f} {s['max']:7.2f}")
    for k, v in shares.items():
        print(f"{'importtime, cumulative: ' + k:<62} {v:8.2f}")
    heavy = [k for k, v in result["imported_at_first_sir_step"].items() if v]
    print(
        f"imported at the first SIR step: {', '.join(heavy)} ({result['modules_at_first_sir_step']} modules)"
    )
    print(f"JSON: {args.json}")


if __name__ == "__main__":
    main()
