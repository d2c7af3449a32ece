"""What the benchmark scripts share: the machine record, and timing of one call."""

from __future__ import annotations

import json
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path

import torch


def hardware(**extra) -> dict:
    """The date, Python, torch, CPU model and cores, load average, and the GPU (name, SMs, memory, CUDA,
    nvidia-smi clocks) and gsplat version when present; ``extra`` keys are added as given."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info = {
        "date": time.strftime("%Y-%m-%d"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpu": cpu,
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
    }
    try:
        info["load_average"] = list(os.getloadavg())
    except OSError:
        pass
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        info.update(gpu=p.name, sm_count=p.multi_processor_count, memory_GiB=round(p.total_memory / 2**30, 1),
                    capability=f"{p.major}.{p.minor}", cuda=torch.version.cuda)  # fmt: skip
        try:
            q = "driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit"
            info["nvidia_smi"] = subprocess.run(
                ["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=20,
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    try:
        import gsplat

        info["gsplat"] = gsplat.__version__
    except ImportError:
        pass
    info.update(extra)
    return info


def save_result(path: str | Path, payload: dict) -> None:
    """Writes ``payload`` as JSON to ``path`` after the command line that made it and :func:`hardware`."""
    doc = {"command": "python " + shlex.join(sys.argv), "hardware": hardware(), **payload}
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)


def time_ms(fn, warmup: int = 1, reps: int = 10) -> list[float]:
    """Milliseconds of ``reps`` calls of ``fn()`` after ``warmup`` calls: CUDA events around each call
    when CUDA is available (device work counted, the host waits for it), else the CPU wall clock."""
    for _ in range(warmup):
        fn()
    times = []
    cuda = torch.cuda.is_available()
    for _ in range(reps):
        if cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
        else:
            t = time.perf_counter()
            fn()
            times.append(1e3 * (time.perf_counter() - t))
    return times


# ------------------------------------------------------------------------------ kernel tables, SIR step
KINDS = (  # (kind, substrings of the kernel name), first match wins
    ("attention", ("flash", "fmha", "attention", "sdpa")),
    ("gemm/conv", ("gemm", "conv", "cutlass", "xmma", "sm90_", "cudnn", "implicit", "wgmma", "nvjet")),
    ("norm", ("norm", "welford", "reduce")),
    ("copy", ("copy", "memcpy", "memset", "cat", "transpose")),
)


def kind_of(name: str) -> str:
    """The :data:`KINDS` group of a CUDA kernel's name ("elementwise/other" when none matches)."""
    low = name.lower()
    for kind, keys in KINDS:
        if any(k in low for k in keys):
            return kind
    return "elementwise/other"


def kernel_table(fn, reps: int = 3) -> dict:
    """Kernels of ``fn()`` under torch.profiler (per call): count, summed time, by kind, top 15."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        us = float(getattr(e, "self_device_time_total", 0.0))
        if us > 0 and e.device_type == DeviceType.CUDA:
            rows.append((us / reps, e.count / reps, e.key))
    rows.sort(reverse=True)
    by_kind: dict[str, list[float]] = {}
    for us, n, name in rows:
        k = by_kind.setdefault(kind_of(name), [0.0, 0.0])
        k[0] += us / 1000
        k[1] += n
    return {
        "kernels_per_call": sum(n for _, n, _ in rows),
        "kernel_ms_per_call": sum(us for us, _, _ in rows) / 1000,
        "by_kind_ms_count": {
            k: [round(v[0], 4), v[1]] for k, v in sorted(by_kind.items(), key=lambda x: -x[1][0])
        },
        "top": [[round(us / 1000, 4), n, name[:110]] for us, n, name in rows[:15]],
    }


def sir_training_step(splat, sir_config, iteration: int = 150):
    """(step, trainer): a function taking one SIR training step (C + 1 views at the config's size,
    random RGBA targets, white background, RGB weight 1 / C on every view, no alpha term) on ``splat``
    (on its device), with
    the trainer's iteration held at ``iteration`` (inside the densification window, between
    densifications: statistics are gathered, nothing is densified)."""
    from microdreamer.priors.base import OrbitViews, even_orbit_views
    from microdreamer.train import GaussianTrainer

    sc = sir_config
    S, C, device = sc.image_size, sc.views, splat.device
    trainer = GaussianTrainer(splat, sc.train)
    gen = torch.Generator().manual_seed(0)
    views = even_orbit_views(C, 0.0, sc.elevation_range, sc.radius, gen)
    ref = OrbitViews([0.0], [0.0], [sc.radius])
    cams = OrbitViews.cat([views, ref]).cameras(sc.fovy_deg, S, S).to(device)
    tgt = torch.rand(C + 1, S, S, 4, device=device)
    white = torch.ones(3, device=device)
    rgb_w = torch.full((C + 1,), 1.0 / C, device=device)
    alpha_w = torch.zeros(C + 1, device=device)

    def step() -> None:
        trainer.iteration = iteration - 1
        trainer.step(tgt, cams, background=white, rgb_weights=rgb_w, alpha_weights=alpha_w)

    return step, trainer


def step_wall_ms(step, steps: int = 20, warmup: int = 5) -> float:
    """Mean wall-clock ms of ``step()`` over ``steps`` calls after ``warmup`` (CUDA synchronised)."""
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) * 1000 / steps
