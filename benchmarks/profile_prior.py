"""Where the time of ``generate``'s GPU-heavy parts goes: the Zero123 networks kernel by kernel, and the
SIR training step on the host.

    python benchmarks/profile_prior.py [--random-weights full] [--views 6] [--parts kernels,graphs,train]
        [--json FILE]

Parts:
- ``kernels``: one eager call each of the guided UNet (batch 2C), the unconditional UNet (batch C), the
  VAE encoder and decoder (C views) under torch.profiler: kernel count, summed kernel time, the kernels
  grouped by kind (GEMM/convolution, normalisation, attention, elementwise, copies) and the top ones.
- ``graphs``: CUDA-event milliseconds of each part eagerly and replayed from a captured CUDA graph.
- ``train``: one SIR training step (C + 1 views at 256^2, a 35k-Gaussian splat) wall clock vs its GPU
  kernels, and a cProfile of the host side (top functions by own time).

The JSON holds every number, the command and the hardware; the tables are printed.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch

from _common import (  # benchmarks/ on sys.path
    hardware,
    kernel_table,
    sir_training_step,
    step_wall_ms,
    time_ms,
)


def graphed(fn):
    """``fn`` (no arguments, fixed inputs) captured once into a CUDA graph; returns a replay function."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g.replay


def prior_parts(prior, C: int) -> dict:
    """The four network calls of a refinement at SIR's shapes, as argument-free functions (eager)."""
    s = prior.image_size
    h = s // prior.vae_factor
    d = prior.nets.camera_projection.out_features
    unet, vae = prior.nets.unet, prior.nets.vae
    x2 = torch.randn(2 * C, 8, h, h, device=prior.device, dtype=prior.dtype)
    c2 = torch.randn(2 * C, 1, d, device=prior.device, dtype=prior.dtype)
    t2 = torch.full((2 * C,), 501.0, device=prior.device)
    imgs = torch.rand(C, 3, s, s, device=prior.device, dtype=prior.dtype) * 2 - 1
    lat = torch.randn(C, 4, h, h, device=prior.device, dtype=prior.dtype)
    return {
        "unet_guided_batch_2C": lambda: unet(x2, t2, encoder_hidden_states=c2).sample,
        "unet_uncond_batch_C": lambda: unet(x2[:C], t2[:C], encoder_hidden_states=c2[:C]).sample,
        "vae_encode_C": lambda: vae.encode(imgs).latent_dist.mode(),
        "vae_decode_C": lambda: vae.decode(lat).sample,
    }


def compile_parts(prior, calls: dict, mode: str) -> dict:
    """torch.compile of the UNet and the VAE decoder: seconds to compile (first call), then CUDA-event
    ms per call of the compiled module, eagerly and replayed from a CUDA graph, and the largest
    deviation from the eager output."""
    import torch._dynamo

    out: dict = {"mode": mode}
    unet, vae = prior.nets.unet, prior.nets.vae
    for name, target, attr in (("unet_guided_batch_2C", unet, "forward"), ("vae_decode_C", vae, "decode")):
        ref = calls[name]().float()
        orig = getattr(target, attr)
        t = time.perf_counter()
        setattr(target, attr, torch.compile(orig, mode=mode, dynamic=False))
        try:
            got = calls[name]().float()
            torch.cuda.synchronize()
            first = time.perf_counter() - t
            ms = statistics.median(time_ms(calls[name], warmup=2, reps=20))
            replay = graphed(calls[name])
            gms = statistics.median(time_ms(replay, warmup=2, reps=20))
            err = float((got - ref).abs().max() / ref.abs().max().clamp_min(1e-6))
            out[name] = {
                "compile_seconds": first,
                "compiled_ms": ms,
                "compiled_graph_ms": gms,
                "max_rel_dev": err,
            }
        except Exception as e:  # noqa: BLE001  (a measurement: report what failed)
            out[name] = {"error": repr(e)[:500]}
        finally:
            setattr(target, attr, orig)
            torch._dynamo.reset()
        print(name, out[name], flush=True)
    return out


def profile_train(device: torch.device, C: int, steps: int = 30) -> dict:
    """Wall ms of a SIR training step vs its GPU kernels, and the host's top functions (cProfile), on a
    35k-Gaussian random ball."""
    from microdreamer.sir import SIRConfig
    from microdreamer.train import random_ball_splat

    sc = SIRConfig(views=C)
    splat = random_ball_splat(35_000, 0.5, sc.train.sh_degree, 0.1, 0, device)
    step, trainer = sir_training_step(splat, sc)
    wall_ms = step_wall_ms(step, steps)
    kt = kernel_table(step, reps=steps)
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    pr.disable()
    buf = io.StringIO()
    pstats.Stats(pr, stream=buf).sort_stats("tottime").print_stats(25)
    buf2 = io.StringIO()
    pstats.Stats(pr, stream=buf2).sort_stats("cumulative").print_stats(30)
    return {
        "num_gaussians": len(trainer),
        "views": C + 1,
        "step_wall_ms": wall_ms,
        "step_kernels": kt,
        "cprofile_tottime": buf.getvalue().splitlines()[:60],
        "cprofile_cumulative": buf2.getvalue().splitlines()[:70],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--random-weights", choices=["tiny", "full"], default="full")
    ap.add_argument("--views", type=int, default=6)
    ap.add_argument("--parts", default="kernels,graphs,train")
    ap.add_argument("--channels-last", type=int, default=1, help="UNet in NHWC (generate's default: 1)")
    ap.add_argument("--vae-channels-last", type=int, default=None, help="VAE in NHWC (default: the config's)")
    ap.add_argument("--fused-gn", type=int, default=None, help="Triton group norms (default: the config's)")
    ap.add_argument("--compile-mode", default="default", help="torch.compile mode of the compile part")
    ap.add_argument("--json", default="benchmarks/results/profile_prior_h200.json")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("profile_prior.py needs a CUDA GPU")
    device = torch.device("cuda")
    parts = set(args.parts.split(","))
    C = args.views
    report: dict = {"command": "python " + shlex.join(sys.argv), "hardware": hardware(), "views": C}

    def save() -> None:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=2))

    if parts & {"kernels", "graphs", "compile"}:
        from microdreamer.generate import GenerateConfig, build_prior

        cfg = GenerateConfig()
        cfg.prior.channels_last = bool(args.channels_last)
        if args.vae_channels_last is not None:
            cfg.prior.vae_channels_last = bool(args.vae_channels_last)
        if args.fused_gn is not None:
            cfg.prior.fused_group_norm = bool(args.fused_gn)
        report["prior_config"] = {k: getattr(cfg.prior, k) for k in ("channels_last", "vae_channels_last",
                                  "fused_group_norm", "single_token_cross_attention")}  # fmt: skip
        t = time.perf_counter()
        prior = build_prior(cfg.prior, device, random_weights=args.random_weights)
        report["model_build_seconds"] = time.perf_counter() - t
        calls = prior_parts(prior, C)
        with torch.no_grad():
            if "kernels" in parts:
                report["kernels"] = {name: kernel_table(fn) for name, fn in calls.items()}
                save()
            if "graphs" in parts:
                report["graphs_ms"] = {}
                for name, fn in calls.items():
                    eager = statistics.median(time_ms(fn, warmup=2, reps=20))
                    replay = graphed(fn)
                    graph = statistics.median(time_ms(replay, warmup=2, reps=20))
                    report["graphs_ms"][name] = {"eager": eager, "graph": graph}
                save()
            if "compile" in parts:
                report["compile"] = compile_parts(prior, calls, args.compile_mode)
                save()
        del prior, calls
        torch.cuda.empty_cache()
    if "train" in parts:
        report["train"] = profile_train(device, C)
        save()

    for name, k in report.get("kernels", {}).items():
        print(
            f"\n== {name}: {k['kernels_per_call']:.0f} kernels, {k['kernel_ms_per_call']:.2f} ms of kernels"
        )
        for kind, (ms, n) in k["by_kind_ms_count"].items():
            print(f"   {kind:18s} {ms:7.3f} ms  {n:5.0f} kernels")
        for ms, n, name_ in k["top"]:
            print(f"   {ms:7.3f} ms {n:4.0f}x {name_}")
    for name, g in report.get("graphs_ms", {}).items():
        print(f"{name:24s} eager {g['eager']:7.2f} ms  graph {g['graph']:7.2f} ms")
    if "train" in report:
        tr = report["train"]
        k = tr["step_kernels"]
        print(f"\ntrain step: wall {tr['step_wall_ms']:.2f} ms, kernels {k['kernel_ms_per_call']:.2f} ms "
              f"({k['kernels_per_call']:.0f} kernels)")  # fmt: skip
        for kind, (ms, n) in k["by_kind_ms_count"].items():
            print(f"   {kind:18s} {ms:7.3f} ms  {n:5.0f} kernels")
        print("\n".join(tr["cprofile_tottime"]))
        print("\n".join(tr["cprofile_cumulative"]))


if __name__ == "__main__":
    main()
