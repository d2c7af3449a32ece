"""Peak memory and progress of a large conversion: `microdreamer mesh` on a 3,000,000-Gaussian splat at
256^3, in a child process whose stderr is a log file (not a terminal), as under a pipe or a scheduler.

    python benchmarks/bench_large.py [--gaussians 3000000] [--resolution 256] [--sh-degree 0]
                                     [--texture none] [--device cpu] [--keep DIR]

Builds a seeded synthetic object (``microdreamer.synthetic.make_synthetic_object``, Gaussians about a
voxel wide on a closed surface) and writes it as an INRIA PLY; then runs the console command once and
measures the child's peak resident memory (``getrusage(RUSAGE_CHILDREN).ru_maxrss``: the command alone,
not this script), its wall time, the stage seconds it printed, and the progress lines it wrote to its
log (each with the seconds since start, so the log shows that it never sat silent for long). Writes
benchmarks/results/large_<device>.json with the command and the hardware.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from _common import save_result  # benchmarks/ is on sys.path when run as a script

ROOT = Path(__file__).resolve().parents[1]


def build_splat(path: Path, n: int, degree: int, seed: int = 0) -> float:
    """Write the seeded n-Gaussian object to ``path``; returns the seconds it took."""
    import torch

    from microdreamer.splat import num_sh_coeffs, write_ply
    from microdreamer.synthetic import make_synthetic_object

    t = time.perf_counter()
    # Gaussians about one voxel of a 256^3 grid wide: N points on a surface of area ~4 are ~1/sqrt(N/4) apart
    spacing = (4.0 / n) ** 0.5
    splat = make_synthetic_object(n, seed=seed, scale_fraction=1.5 * spacing)
    if degree:
        g = torch.Generator().manual_seed(seed + 1)
        splat.sh_rest = 0.1 * torch.randn(n, num_sh_coeffs(degree) - 1, 3, generator=g)
    write_ply(splat, path)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gaussians", type=int, default=3_000_000)
    ap.add_argument("--resolution", type=int, default=256)
    ap.add_argument("--sh-degree", type=int, default=0, choices=(0, 1, 2, 3))
    ap.add_argument("--texture", default="none", choices=("none", "field", "bake"))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--keep", type=Path, default=None, help="keep the splat, mesh and log in this folder")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    out_json = args.out or ROOT / "benchmarks" / "results" / f"large_{args.device}.json"

    with tempfile.TemporaryDirectory() as tmp:
        work = args.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        splat = work / f"synthetic_{args.gaussians}.ply"
        build_seconds = build_splat(splat, args.gaussians, args.sh_degree)
        log_path = work / "mesh.log"
        cmd = [sys.executable, "-m", "microdreamer.cli", "mesh", str(splat), "-o", str(work / "mesh.glb"),
               "--resolution", str(args.resolution), "--texture", args.texture, "--device", args.device]  # fmt: skip
        start = time.perf_counter()
        stamped: list[tuple[float, str]] = []
        with open(log_path, "w") as log:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    env={**os.environ, "PYTHONUNBUFFERED": "1"})  # fmt: skip

            def read_stderr() -> None:  # the log, each line stamped with its arrival
                for line in proc.stderr:
                    stamped.append((time.perf_counter() - start, line.rstrip("\n")))
                    log.write(line)
                    log.flush()

            reader = threading.Thread(target=read_stderr)
            reader.start()
            stdout = proc.stdout.read()
            proc.wait()
            reader.join()
        wall = time.perf_counter() - start
        peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # KiB on Linux
        if proc.returncode != 0:
            sys.exit(f"error: the command failed ({proc.returncode}):\n" + "\n".join(s for _, s in stamped))
        m = re.search(r"seconds: (.*)", stdout)
        stages = {k: float(v) for k, v in (kv.split() for kv in m.group(1).split(", "))} if m else {}
        times = [0.0] + [t for t, _ in stamped] + [wall]
        longest_silence = max(b - a for a, b in zip(times[:-1], times[1:], strict=True))
        size = splat.stat().st_size

    result = {
        "benchmark": "microdreamer mesh on a large synthetic splat: peak RSS of the command, progress in its log",
        "gaussians": args.gaussians,
        "sh_degree": args.sh_degree,
        "resolution": args.resolution,
        "texture": args.texture,
        "device": args.device,
        "splat_bytes": size,
        "build_seconds": round(build_seconds, 1),
        "command": " ".join(["microdreamer", *cmd[3:]]).replace(str(work), "WORK"),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "wall_seconds": round(wall, 1),
        "peak_rss_GiB": round(peak_kib / 2**20, 3),
        "stage_seconds": stages,
        "stdout": stdout.strip().splitlines(),
        "log": [f"{t:8.1f} s  {s}" for t, s in stamped],
        "longest_silence_seconds": round(longest_silence, 1),
    }
    save_result(out_json, result)
    print(f"{args.gaussians} Gaussians at {args.resolution}^3 ({args.device}, texture {args.texture}): "
          f"peak RSS {result['peak_rss_GiB']:.2f} GiB, wall {wall:.0f} s, longest silence "
          f"{longest_silence:.0f} s; log:")  # fmt: skip
    for line in result["log"]:
        print("  " + line)
    print(f"-> {out_json}")


if __name__ == "__main__":
    main()
