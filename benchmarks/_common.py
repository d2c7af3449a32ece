"""What the benchmark scripts share: the machine record, and timing of one call."""

from __future__ import annotations

import os
import platform
import subprocess
import time
from pathlib import Path

import torch


def hardware(**extra) -> dict:
    """Python, torch, CPU model and cores, load average, and the GPU (name, SMs, memory, CUDA,
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
