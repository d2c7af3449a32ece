"""Benchmark of ``microdreamer generate`` as a throughput job (issue 24's must-show): a batch of images in
one fresh CLI process, and single-image CLI calls, timed from the outside (wall clock, start-up included).

    python benchmarks/bench_batch.py [--random-weights full|tiny] [--via-disk DIR | --model PATH]
        [--images ../shared/samples/images] [--inputs 15] [--config YAML] [--device auto|cpu|cuda]
        [--singles 2] [--workers N] [--out DIR] [--json FILE]

1. ``--inputs`` inputs are made from the images in ``--images`` (links named ``NN_<stem>.png``, the
   list repeated until there are enough), and ``microdreamer generate INPUTS/ -o OUT/batch --overwrite``
   runs once in a fresh process: its wall clock (Python start-up, imports, model build or load, warm-up,
   every asset), and from its summary.json each asset's seconds: the first asset's, and the median of
   the others (the steady state). ``--workers N`` runs the batch on N Ray workers instead.
2. ``--singles`` single-image calls ``microdreamer generate IMAGE -o OUT/single_k`` in fresh processes,
   one after the other: the first may fill the on-disk caches (Triton's kernels, the CUDA extensions),
   the later ones are the "warm caches" time.
3. Start-up parts, each in a fresh process: ``import torch``; torch + diffusers' and transformers'
   classes of the Zero123 model; torch + CUDA context creation.

``--via-disk DIR`` first saves the random model in the diffusers layout under DIR (reused when there)
and gives the CLI ``--model DIR/...``: the load then goes through the real loader, from a real folder.
With ``--random-weights tiny --config src/microdreamer/presets/tiny.yaml --device cpu`` it runs on a CPU
in a few minutes (a smoke run: the numbers mean nothing for the targets). The table is printed last;
the JSON holds every number, the commands, the targets and the hardware.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGETS = {"steady_seconds_per_asset": 6.0, "batch_wall_seconds": 120.0, "single_warm_wall_seconds": 15.0}
STARTUP_PROBES = {
    "import_torch": "import torch",
    "import_torch_diffusers_transformers": "import torch\nfrom diffusers import AutoencoderKL, UNet2DConditionModel\n"
    "from transformers import CLIPImageProcessor, CLIPVisionModelWithProjection",
    "import_torch_and_cuda_context": "import torch\nif torch.cuda.is_available():\n    torch.cuda.init()\n"
    "    torch.zeros(1, device='cuda')\n    torch.cuda.synchronize()",
}


def make_inputs(images: Path, folder: Path, count: int) -> list[Path]:
    """``count`` links in ``folder`` to the images of ``images`` (sorted, repeated), named NN_<stem>.png."""
    sources = sorted(p for p in images.iterdir() if p.suffix.lower() in (".png", ".jpg", ".jpeg"))
    if not sources:
        raise SystemExit(f"--images {images}: no PNG or JPEG images there")
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.iterdir():
        old.unlink()
    made = []
    for k in range(count):
        src = sources[k % len(sources)].resolve()
        link = folder / f"{k:02d}_{src.stem}{src.suffix.lower()}"
        link.symlink_to(src)
        made.append(link)
    return made


def run_timed(cmd: list[str], log: Path) -> tuple[float, int]:
    """Wall seconds and exit status of ``cmd`` (stdout and stderr to ``log``)."""
    t = time.perf_counter()
    with open(log, "w") as f:
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT).returncode
    return time.perf_counter() - t, rc


def model_args(args) -> list[str]:
    if args.model:
        return ["--model", args.model]
    if args.via_disk:
        return ["--model", str(saved_model(Path(args.via_disk), args.random_weights, args.device))]
    return ["--random-weights", args.random_weights]


def saved_model(root: Path, size: str, device: str) -> Path:
    """The random model of ``size`` saved in the diffusers layout under ``root`` (built once)."""
    folder = root / f"zero123-random-{size}"
    if (folder / "model_index.json").exists():
        return folder
    import torch

    from microdreamer.config import Zero123Config
    from microdreamer.jobs.generate import build_prior
    from microdreamer.priors.factory import save_zero123

    dev = torch.device("cuda" if device != "cpu" and torch.cuda.is_available() else "cpu")
    prior = build_prior(Zero123Config(), dev, random_weights=size, seed=0)
    save_zero123(prior.nets, folder)
    del prior
    return folder


def save_partial(path: str, result: dict) -> None:
    """Write the JSON as it stands (after each phase; the last write has every number)."""
    from _common import save_result

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    save_result(path, result)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--random-weights", choices=["tiny", "full"], default="full")
    ap.add_argument("--model", default=None, help="a real model (folder or cached repo id)")
    ap.add_argument(
        "--via-disk", default=None, help="save the random model under this folder; load it from there"
    )
    ap.add_argument("--images", default=str(ROOT.parent / "shared" / "samples" / "images"))
    ap.add_argument("--inputs", type=int, default=15, help="batch size (the images repeated)")
    ap.add_argument("--config", default=None, help="a GenerateConfig preset for every run")
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--singles", type=int, default=2, help="single-image CLI calls after the batch")
    ap.add_argument("--workers", type=int, default=None, help="run the batch on N Ray workers")
    ap.add_argument("--no-probes", action="store_true", help="skip the start-up probes")
    ap.add_argument("--out", default="bench_batch_out")
    ap.add_argument("--json", default="benchmarks/results/batch_h200.json")
    args = ap.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    cli = [sys.executable, "-m", "microdreamer.cli", "generate"]
    common = [*model_args(args), "--device", args.device, *(["--config", args.config] if args.config else [])]
    result: dict = {"targets": TARGETS, "model": args.model or f"random weights ({args.random_weights})"
                    + (" saved and loaded from disk" if args.via_disk else "") + "; output is noise"}  # fmt: skip

    # 1. the batch, in one fresh process
    inputs = make_inputs(Path(args.images), out / "inputs", args.inputs)
    batch_cmd = [*cli, str(out / "inputs"), "-o", str(out / "batch"), "--overwrite", *common]
    if args.workers:
        batch_cmd += ["--workers", str(args.workers)]
    wall, rc = run_timed(batch_cmd, out / "batch.log")
    summary = json.loads((out / "batch" / "summary.json").read_text())
    ok = [i["seconds"] for i in summary["items"] if i["status"] == "ok"]
    result["batch"] = {
        "command": " ".join(batch_cmd),
        "exit_status": rc,
        "inputs": len(inputs),
        "ok": summary["ok"],
        "failed": summary["failed"],
        "wall_seconds": wall,
        "startup_seconds_before_batch": wall - summary["wall_seconds"],
        "setup_seconds": summary["setup_seconds"],
        "first_asset_seconds": ok[0] if ok else None,
        "steady_seconds_per_asset_median": statistics.median(ok[1:]) if len(ok) > 1 else None,
        "steady_seconds_per_asset_max": max(ok[1:]) if len(ok) > 1 else None,
        "asset_seconds": ok,
        "asset_stages": [i["details"].get("stages") for i in summary["items"] if i["status"] == "ok"],
    }
    print(f"batch: {wall:.1f} s wall, exit {rc}", flush=True)
    save_partial(args.json, result)  # a time limit later still leaves the batch's numbers

    # 2. single-image calls, each a fresh process
    singles = []
    for k in range(args.singles):
        target = out / f"single_{k}"
        cmd = [*cli, str(inputs[0]), "-o", str(target), *common]
        w, code = run_timed(cmd, out / f"single_{k}.log")
        timings = (
            json.loads((target / "timings.json").read_text()) if (target / "timings.json").exists() else {}
        )
        sec = timings.get("seconds", {})
        singles.append({"command": " ".join(cmd), "exit_status": code, "wall_seconds": w,
                        "load_model_seconds": sec.get("load_model"), "warmup_seconds": sec.get("warmup"),
                        "seconds_after_load_and_warmup": timings.get("seconds_after_load_and_warmup"),
                        "generate_wall_seconds": timings.get("wall")})  # fmt: skip
        print(f"single {k}: {w:.1f} s wall, exit {code}", flush=True)
        result["singles"] = singles
        save_partial(args.json, result)
    result["singles"] = singles

    # 3. start-up parts
    probes = {}
    if not args.no_probes:
        for name, code in STARTUP_PROBES.items():
            probes[name] = run_timed([sys.executable, "-c", code], out / f"probe_{name}.log")[0]
    result["startup_probes_seconds"] = probes

    b = result["batch"]
    warm = [s["wall_seconds"] for s in singles[1:]] or [s["wall_seconds"] for s in singles]
    result["meets"] = {
        "steady_seconds_per_asset": (b["steady_seconds_per_asset_median"] or 1e9)
        <= TARGETS["steady_seconds_per_asset"],
        "batch_wall_seconds": wall <= TARGETS["batch_wall_seconds"] and summary["failed"] == 0,
        "single_warm_wall_seconds": bool(warm) and min(warm) <= TARGETS["single_warm_wall_seconds"],
    }
    save_partial(args.json, result)

    print(f"\nmicrodreamer generate as a batch: {result['model']}")
    print(f"{'what':<58} {'seconds':>9} {'target':>8}")
    rows = [
        (
            f"batch of {len(inputs)}, wall (start-up and model build included)",
            wall,
            TARGETS["batch_wall_seconds"],
        ),
        ("  before the batch (Python, imports)", b["startup_seconds_before_batch"], None),
        (
            "  setup: model build/load + warm-up + imports",
            sum(v for s in b["setup_seconds"] for v in s.values() if isinstance(v, float)),
            None,
        ),  # fmt: skip
        ("  first asset", b["first_asset_seconds"], None),
        (
            "  steady state per asset (median of the others)",
            b["steady_seconds_per_asset_median"],
            TARGETS["steady_seconds_per_asset"],
        ),  # fmt: skip
    ]
    for k, s in enumerate(singles):
        rows.append((f"single-image CLI call {k + 1}" + (" (warm caches)" if k else ""), s["wall_seconds"],
                     TARGETS["single_warm_wall_seconds"] if k else None))  # fmt: skip
    for name, s in probes.items():
        rows.append((f"fresh process: {name}", s, None))
    for name, value, target in rows:
        v = f"{value:9.2f}" if isinstance(value, float | int) else f"{'-':>9}"
        print(f"{name:<58} {v} {target if target is not None else '':>8}")
    print(f"meets: {result['meets']}\nJSON: {args.json}")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
