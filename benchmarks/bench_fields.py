"""Benchmark of the density field: upstream's PyTorch loop, the naive and fast CUDA kernels, and the
vectorised PyTorch path, on seeded synthetic objects and the real sample splats.

    python benchmarks/bench_fields.py [--out benchmarks/results/fields_h200.json] [--quick]
        [--cases 50000x128,1000000x512] [--modes exact] [--variants 1,2] [--no-samples]
        [--chunks 1,2,4] [--scatter 0,default] [--splits default] [--sized default]
        [--precise default]

Times are CUDA-event medians after warm-up (the fast kernel's runs rotate over three input sets of
the same size so that repeated runs do not just re-read the cache); peak memory is the allocator's
peak above the inputs. The script also measures the card's copy bandwidth, write bandwidth and
ex2 rate, the rates the floors in benchmarks/README.md come from. The table is printed last; the
JSON holds every number, the command line and the hardware.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch

from _common import hardware  # benchmarks/ is on sys.path when run as a script
from microdreamer.field import FieldConfig, prepare_gaussians
from microdreamer.field.cuda import CudaFieldOptions, extract_fields
from microdreamer.field.reference import covariance6, gaussian_3d_coeff
from microdreamer.field.torch_impl import density_field_torch
from microdreamer.kernels import _backend
from microdreamer.splat import read_ply
from microdreamer.synthetic import make_synthetic_object

SAMPLES = Path(__file__).resolve().parents[1] / ".." / "shared" / "samples" / "splats"
NS = (10_000, 50_000, 200_000, 1_000_000)
RS = (128, 256, 512)
NAIVE_BUDGET_S = 3.0  # skip naive runs predicted longer than this (cost ~ N R^3)
# seconds per Gaussian x voxel of the naive kernel until a run has measured it (H200, exact mode:
# 130.8 ms for 50k x 128^3 in results/fields_h200_round7.json), so that a first case at 512^3 is not
# timed for minutes
NAIVE_RATE_GUESS = 1.2e-12


def cuda_time(fn, warmup: int = 2, reps: int = 10, inputs=None) -> tuple[float, list[float]]:
    """Median milliseconds of fn(inputs[i % len]) between CUDA events, after warm-up."""
    inputs = inputs or [None]
    for w in range(warmup):
        fn(inputs[w % len(inputs)])
    torch.cuda.synchronize()
    times = []
    for i in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(inputs[i % len(inputs)])
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times), times


def peak_mb(fn, arg=None) -> float:
    """Allocator peak (MB) above what is allocated before the call."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = fn(arg)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del out
    return peak / 2**20


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-300))


# ----------------------------------------------------------------------------------------------
# upstream's algorithm (DreamGaussian/MicroDreamer extract_fields), re-implemented from its
# description: blocks of R // num_blocks voxels, each block's box grown by relax_ratio * block size,
# the Gaussians whose centre lies inside it evaluated densely, 1024 Gaussians at a time
# ----------------------------------------------------------------------------------------------


def upstream_loop(prepared, grid, config) -> torch.Tensor:
    device = prepared.means.device
    r = grid.resolution
    split = r // config.num_blocks
    relax = config.relax_ratio * 2.0 / config.num_blocks
    means, opac = prepared.means, prepared.opacities
    covs = covariance6(prepared.transforms.double()).float()
    pieces = grid.axis(device).split(split)
    occ = torch.zeros(r, r, r, device=device)
    for xi, xs in enumerate(pieces):
        for yi, ys in enumerate(pieces):
            for zi, zs in enumerate(pieces):
                pts = torch.stack(torch.meshgrid(xs, ys, zs, indexing="ij"), -1).reshape(-1, 3)
                vmin, vmax = pts.amin(0) - relax, pts.amax(0) + relax
                mask = ((means < vmax) & (means > vmin)).all(-1)
                if not mask.any():
                    continue
                mx, mc, mo = means[mask], covs[mask], opac[mask]
                val = torch.zeros(pts.shape[0], device=device)
                for s in range(0, mx.shape[0], 1024):
                    d = pts[:, None, :] - mx[None, s : s + 1024]
                    c = mc[None, s : s + 1024].expand(pts.shape[0], -1, 6)
                    w = gaussian_3d_coeff(d.reshape(-1, 3), c.reshape(-1, 6)).reshape(pts.shape[0], -1)
                    val += (mo[None, s : s + 1024] * w).sum(-1)
                occ[xi * split : xi * split + len(xs), yi * split : yi * split + len(ys),
                    zi * split : zi * split + len(zs)] = val.reshape(len(xs), len(ys), len(zs))  # fmt: skip
    return occ


# ----------------------------------------------------------------------------------------------
# the card's rates
# ----------------------------------------------------------------------------------------------


EXP2_PROBE = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
__global__ void exp2_kernel(float* out, int64_t threads, int iters) {
  const int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (t >= threads) return;
  float v[8];  // eight independent chains keep the special-function unit busy; each step is one ex2.approx
  for (int c = 0; c < 8; ++c) v[c] = -1e-3f * static_cast<float>((t + c) & 255);
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int c = 0; c < 8; ++c) {
      float y;
      asm volatile("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(v[c]));
      v[c] = -y;
    }
  }
  float s = 0.f;
  for (int c = 0; c < 8; ++c) s += v[c];
  out[t] = s;
}
at::Tensor exp2_probe(int64_t threads, int64_t iters) {
  at::Tensor out = at::empty({threads}, at::TensorOptions().dtype(at::kFloat).device(at::kCUDA));
  exp2_kernel<<<(threads + 255) / 256, 256, 0, c10::cuda::getCurrentCUDAStream()>>>(
      out.data_ptr<float>(), threads, static_cast<int>(iters));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}
"""


def exp2_probe():
    """This benchmark's own extension: threads x iters x 8 ex2.approx (the special-function unit's rate)."""
    from torch.utils.cpp_extension import load_inline

    return load_inline("microdreamer_exp2_probe", cpp_sources="at::Tensor exp2_probe(int64_t threads, int64_t iters);",
                       cuda_sources=EXP2_PROBE, functions=["exp2_probe"], extra_cuda_cflags=["-O3"])  # fmt: skip


def measure_rates() -> dict:
    n = 512 * 2**20  # 2 GiB of float32
    src = torch.rand(n, device="cuda")
    dst = torch.empty_like(src)
    copy_ms, _ = cuda_time(lambda _: dst.copy_(src), warmup=2, reps=10)
    fill_ms, _ = cuda_time(lambda _: dst.fill_(1.0), warmup=2, reps=10)
    src = dst = None
    torch.cuda.empty_cache()
    probe = exp2_probe()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    threads, iters = sms * 2048 * 2, 2048
    exp_ms, _ = cuda_time(lambda _: probe.exp2_probe(threads, iters), warmup=2, reps=10)
    return {
        "copy_GBps": 2 * 4 * n / copy_ms / 1e6,  # bytes read + written
        "write_GBps": 4 * n / fill_ms / 1e6,
        "exp2_per_s": threads * iters * 8 / exp_ms * 1e3,
        "copy_ms_2GiB": copy_ms,
        "fill_ms_2GiB": fill_ms,
        "exp2_probe_ms": exp_ms,
    }


_splats: dict = {}


def inputs_for(name: str, n: int | None, r: int, mode: str, copies: int):
    cfg = FieldConfig(resolution=r, mode=mode)
    sets = []
    for seed in range(copies):
        key = (name, n, seed)
        if key not in _splats:
            if len(_splats) > 6:
                _splats.clear()
            _splats[key] = (
                make_synthetic_object(n, seed=seed) if name == "synthetic" else read_ply(SAMPLES / name)
            )
        splat = _splats[key]
        prepared, grid = prepare_gaussians(splat.to("cuda"), cfg)
        sets.append((prepared, grid))
    return cfg, sets


def bench_case(
    name,
    n,
    r,
    rows,
    naive_rate,
    quick,
    modes=("exact", "upstream"),
    variants=(1,),
    scatters=(0,),
    splits=(None,),
    chunk_set=(1, 2, 4),
    sized=(None,),
    precise=(None,),
):
    for mode in modes:
        if mode == "upstream" and (quick or (name == "synthetic" and r == 512 and n >= 200_000)):
            continue
        bench_mode(
            name, n, r, mode, rows, naive_rate, quick, variants, scatters, splits, chunk_set, sized, precise
        )
        torch.cuda.empty_cache()


def bench_mode(
    name,
    n,
    r,
    mode,
    rows,
    naive_rate,
    quick,
    variants=(1,),
    scatters=(0,),
    splits=(None,),
    chunk_set=(1, 2, 4),
    sized=(None,),
    precise=(None,),
):
    cfg, sets = inputs_for(name, n, r, mode, copies=1 if name != "synthetic" else 3)
    n_kept = len(sets[0][0])
    row0 = {"input": name, "N": n_kept, "R": r, "mode": mode}

    def fast(s, chunks, variant, scatter, split=None, sized_list=None, scatter_precise=None):
        options = CudaFieldOptions(chunks=chunks, variant=variant, scatter_voxels=scatter, splits=split,
                                   sized_list=sized_list, scatter_precise=scatter_precise)  # fmt: skip
        return extract_fields(s[0], s[1], cfg, options)

    def naive(s):
        return extract_fields(s[0], s[1], cfg, CudaFieldOptions(impl="naive"))

    def torch_path(s):
        return density_field_torch(s[0], s[1], cfg)

    def loop(s):
        return upstream_loop(s[0], s[1], cfg)

    # fast, every tile depth and variant
    outs, fast_rows, row_keys = {}, [], {}
    defaults = CudaFieldOptions().resolve(cfg, n_kept)

    def default_splits(chunks):
        return CudaFieldOptions(chunks=chunks).resolve(cfg, n_kept).splits

    scatters = tuple(dict.fromkeys(defaults.scatter_voxels if x is None else x for x in scatters))
    if mode != "exact":
        scatters = (0,)
    combos = [
        (c, v, x, sp, sz, pr)
        for v in variants
        for c in chunk_set
        if mode == "exact" or c != 4
        for x in scatters
        for sp in (splits if v == 2 else (None,))
        for sz in (sized if v >= 2 else (None,))
        for pr in (precise if mode == "exact" else (None,))
    ]
    for chunks, variant, scatter, split, sized_list, scatter_precise in combos:
        key = (chunks, variant, scatter, split, sized_list, scatter_precise)
        t0 = time.perf_counter()
        fast(sets[0], *key)
        torch.cuda.synchronize()
        slow = time.perf_counter() - t0 > 0.02  # long runs: fewer repetitions
        reps = 3 if slow else (7 if quick else 21)
        ms, times = cuda_time(lambda s, k=key: fast(s, *k), warmup=2, reps=reps, inputs=sets)
        t0 = time.perf_counter()
        outs[key] = fast(sets[0], *key)
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) * 1e3
        used_splits = (split or default_splits(chunks)) if variant == 2 else 1
        fast_rows.append({**row0, "impl": "fast", "chunks": chunks, "variant": variant,
                          "scatter_voxels": scatter, "splits": used_splits,
                          "sized_list": (defaults.sized_list if sized_list is None else sized_list)
                          if variant >= 2 else True,
                          "scatter_precise": defaults.scatter_precise if scatter_precise is None
                          else scatter_precise,
                          "default": chunks == defaults.chunks and variant == defaults.variant
                          and scatter == defaults.scatter_voxels
                          and split in (None, default_splits(chunks))
                          and sized_list in (None, defaults.sized_list)
                          and scatter_precise in (None, defaults.scatter_precise),
                          "median_ms": ms, "runs_ms": times, "wall_ms_one_call": wall,
                          "peak_MB": peak_mb(lambda s, k=key: fast(s, *k), sets[0])})  # fmt: skip
        row_keys[id(fast_rows[-1])] = key
    rows.extend(fast_rows)
    fast_out = outs.get(
        (
            defaults.chunks,
            variants[0],
            scatters[0],
            splits[0] if variants[0] == 2 else None,
            sized[0] if variants[0] >= 2 else None,
            precise[0] if mode == "exact" else None,
        ),
        outs[combos[0]],
    )
    ref, ref_kind = None, None
    # the vectorised PyTorch path (on this GPU)
    if r == 128 and n_kept <= 60_000:
        ms, times = cuda_time(torch_path, warmup=0, reps=1, inputs=sets)
        ref, ref_kind = torch_path(sets[0]), "torch"
        rows.append({**row0, "impl": "torch", "median_ms": ms, "runs_ms": times,
                     "peak_MB": peak_mb(torch_path, sets[0])})  # fmt: skip
    else:
        rows.append(
            {**row0, "impl": "torch", "skipped": "a Python loop over 8^3 tiles: minutes at this size"}
        )
    # the naive kernel
    predicted = naive_rate.get(mode, NAIVE_RATE_GUESS) * n_kept * r**3
    if predicted > NAIVE_BUDGET_S:
        rows.append({**row0, "impl": "naive", "skipped": f"predicted {predicted:.0f} s (cost ~ N R^3)"})
    elif mode == "upstream" and r > 128:
        rows.append({**row0, "impl": "naive", "skipped": "upstream mode: timed at R = 128 only"})
    else:
        long = predicted > 0.5
        ms, times = cuda_time(naive, warmup=0 if long else 1, reps=1 if long else 3, inputs=sets)
        naive_rate[mode] = ms / 1e3 / (n_kept * r**3)
        out = naive(sets[0])
        rows.append({**row0, "impl": "naive", "median_ms": ms, "runs_ms": times,
                     "rel_diff_vs_fast": rel_err(out, fast_out)})  # fmt: skip
        if ref is None:
            ref, ref_kind = out, "naive"
    # upstream's loop: upstream mode, R = 128, N <= 50k
    if mode == "upstream" and r == 128 and n_kept <= 60_000:
        ms, times = cuda_time(loop, warmup=0, reps=1, inputs=sets)
        out = loop(sets[0])
        rows.append({**row0, "impl": "upstream_loop", "median_ms": ms, "runs_ms": times,
                     "rel_diff_vs_fast": rel_err(out, fast_out)})  # fmt: skip
    elif mode == "upstream":
        rows.append({**row0, "impl": "upstream_loop", "skipped": "timed at R = 128, N <= 50k only"})
    if ref is not None:
        for row in fast_rows:
            row[f"rel_err_vs_{ref_kind}"] = rel_err(outs[row_keys[id(row)]], ref)
    for row in fast_rows:
        row["rel_diff_vs_default"] = rel_err(outs[row_keys[id(row)]], fast_out)


def table(rows: list[dict]) -> str:
    lines = [f"{'input':<32} {'N':>8} {'R':>4} {'mode':<8} {'impl':<14} {'ms':>10} {'peak MB':>8}  note"]
    for row in rows:
        impl = (
            row["impl"]
            + (f"/c{row['chunks']}" if "chunks" in row else "")
            + (f"/v{row['variant']}" if "variant" in row else "")
            + (f"/s{row['splits']}" if row.get("splits", 1) > 1 else "")
            + ("/L" if row.get("variant", 1) >= 2 and row.get("sized_list") else "")
            + ("/P" if row.get("scatter_precise") else "")
            + ("*" if row.get("default") else "")
        )
        ms = f"{row['median_ms']:.4g}" if "median_ms" in row else "-"
        mb = f"{row['peak_MB']:.0f}" if "peak_MB" in row else "-"
        note = row.get("skipped", "")
        for k in ("rel_err_vs_torch", "rel_err_vs_naive", "rel_diff_vs_fast"):
            if k in row:
                note = f"{k}={row[k]:.1e}"
        lines.append(f"{row['input'][:32]:<32} {row['N']:>8} {row['R']:>4} {row['mode']:<8} {impl:<14} {ms:>10} "
                     f"{mb:>8}  {note}")  # fmt: skip
    return "\n".join(lines)


def must_show(rows: list[dict]) -> dict:
    def pick(n, r, impl, mode="exact", variant=None):
        c = [x for x in rows if x["input"] == "synthetic" and x["R"] == r and x["impl"] == impl
             and x["mode"] == mode and abs(x["N"] - n) < 0.01 * n and "median_ms" in x
             and (variant is None or x.get("variant") == variant)]  # fmt: skip
        return min(c, key=lambda x: x["median_ms"]) if c else None

    out = {}
    n128 = pick(50_000, 128, "naive")
    variants = sorted({x["variant"] for x in rows if "variant" in x})
    for tag, v in [("", None)] + [(f"_v{v}", v) for v in variants]:
        f128 = pick(50_000, 128, "fast", variant=v)
        for key, row, target_key, limit in (
            ("fast_128_50k", f128, "target_128_50k_le_0.1ms", 0.1),
            ("fast_512_1M", pick(1_000_000, 512, "fast", variant=v), "target_512_1M_le_10ms", 10.0),
        ):
            if row:
                out[f"{key}_ms{tag}"] = row["median_ms"]
                out[f"{key}_chunks{tag}"] = row["chunks"]
                out[f"{key}_variant{tag}"] = row["variant"]
                out[f"{key}_scatter_voxels{tag}"] = row.get("scatter_voxels")
                out[f"{key}_splits{tag}"] = row.get("splits")
                out[f"{target_key}{tag}"] = row["median_ms"] <= limit
        if f128 and n128:
            out[f"speedup_vs_naive_128_50k{tag}"] = n128["median_ms"] / f128["median_ms"]
            out[f"target_speedup_ge_500{tag}"] = out[f"speedup_vs_naive_128_50k{tag}"] >= 500
    errs = [v for x in rows for k, v in x.items() if k.startswith("rel_err_vs")]
    out["max_rel_err"] = max(errs) if errs else None
    return out


def flag(text: str) -> bool:
    """'0' or '1' -> bool."""
    return bool(int(text))


def option_values(text: str, cast) -> tuple:
    """A comma-separated option: each value cast, 'default' -> None (the kernel's default)."""
    return tuple(None if x == "default" else cast(x) for x in text.split(","))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results/fields_h200.json")
    parser.add_argument("--quick", action="store_true", help="small sizes and fewer runs (a smoke test)")
    parser.add_argument(
        "--cases", default="", help="synthetic cases NxR, comma-separated (default: every N x R)"
    )
    parser.add_argument("--modes", default="exact,upstream", help="field modes, comma-separated")
    parser.add_argument("--variants", default="1,2", help="fast-kernel variants, comma-separated")
    parser.add_argument("--no-samples", action="store_true", help="skip the real sample splats")
    parser.add_argument(
        "--scatter",
        default="0,default",
        help="exact mode: scatter_voxels values, comma-separated ('default': default_scatter_voxels)",
    )
    parser.add_argument(
        "--splits",
        default="default",
        help="variant 2: blocks per tile, comma-separated ('default': default_splits)",
    )
    parser.add_argument("--chunks", default="1,2,4", help="fast: tile depths / 8, comma-separated")
    parser.add_argument(
        "--precise",
        default="default",
        help="exact mode: scatter_precise values, comma-separated: default, 0 or 1",
    )
    parser.add_argument(
        "--sized",
        default="default",
        help="variant 2: sized_list values, comma-separated: default, 0 or 1",
    )
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_fields.py needs a CUDA GPU")
    t_start = time.perf_counter()
    _backend.load()
    hw = hardware()
    rates = measure_rates()
    rows: list[dict] = []
    naive_rate: dict = {}
    ns = NS[:2] if args.quick else NS
    rs = RS[:2] if args.quick else RS
    partial = Path(args.out).with_suffix(".partial.json")
    partial.parent.mkdir(parents=True, exist_ok=True)
    modes = tuple(args.modes.split(","))
    variants = tuple(int(v) for v in args.variants.split(","))
    scatters, splits = option_values(args.scatter, int), option_values(args.splits, int)
    chunk_set = tuple(int(x) for x in args.chunks.split(","))
    sized, precise = option_values(args.sized, flag), option_values(args.precise, flag)
    if args.cases:
        cases = [("synthetic", int(c.split("x")[0]), int(c.split("x")[1])) for c in args.cases.split(",")]
    else:
        cases = [("synthetic", n, r) for n in ns for r in rs]
    real = sorted(p.name for p in SAMPLES.glob("*.ply")) if SAMPLES.is_dir() and not args.no_samples else []
    cases += [(name, None, r) for name in real for r in rs]
    for name, n, r in cases:
        bench_case(
            name,
            n,
            r,
            rows,
            naive_rate,
            args.quick,
            modes,
            variants,
            scatters,
            splits,
            chunk_set,
            sized,
            precise,
        )
        print(f"done {name} N={n} R={r} ({time.perf_counter() - t_start:.0f} s)", flush=True)
        partial.write_text(json.dumps({"rates": rates, "hardware": hw, "results": rows}, indent=1))
    # floors at 512^3 / 1M (exact mode): the grid's bytes, and the exponentials of a kernel that
    # evaluates every (voxel, Gaussian) pair inside the cutoff once
    cfg = FieldConfig(resolution=512, mode="exact")
    prepared, grid = prepare_gaussians(make_synthetic_object(1_000_000, seed=0).to("cuda"), cfg)
    h = 2.0 / 511
    vol = (
        4.0 / 3.0 * math.pi * cfg.cutoff_sq**1.5 / torch.linalg.det(prepared.transforms.double()).abs()
    ) / h**3
    pairs = float(vol.sum())
    floors = {
        "grid_bytes": 4 * 512**3,
        "grid_write_ms": 4 * 512**3 / rates["write_GBps"] / 1e6,
        "pairs_inside_cutoff": pairs,
        "exp_ms_at_measured_rate": pairs / rates["exp2_per_s"] * 1e3,
    }
    result = {
        "command": " ".join(shlex.quote(a) for a in [sys.executable.split("/")[-1], *sys.argv]),
        "hardware": hw,
        "rates": rates,
        "floors_512_1M": floors,
        "must_show": must_show(rows),
        "notes": "fast: chunks = 8-voxel chunks per thread along z (tile 16 x 16 x 8*chunks); variant 1: "
        "host-sized lists (one sync per call), 2: fixed-capacity lists (no sync), register caps, empty tiles "
        "exit, 3: 2 + two Gaussians per warp step; /sK: variant 2 with K blocks per tile (long tile lists cut into "
        "slices added with atomics); /L: variant 2 or 3 with the list sized from the counts (sized_list); /P: float64-class Gaussians scattered (scatter_precise); * = the defaults of the code that ran (given explicitly or not). "
        "Timed runs of fast rotate over three seeded inputs of the same size (synthetic). "
        "torch = microdreamer.field.torch_impl on the GPU. naive runs predicted longer than "
        f"{NAIVE_BUDGET_S} s are skipped (cost ~ N R^3).",
        "results": rows,
        "seconds": time.perf_counter() - t_start,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    partial.unlink(missing_ok=True)
    print(json.dumps({"rates": rates, "floors_512_1M": floors, "must_show": result["must_show"]}, indent=1))
    print(table(rows))


if __name__ == "__main__":
    main()
