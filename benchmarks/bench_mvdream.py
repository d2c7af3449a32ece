"""GPU timing of the MVDream and ImageDream priors with random weights (full size, fp16): one refine of
4 views at 256^2, its parts, and the diffusion time of a whole generation predicted from them.

    python benchmarks/bench_mvdream.py [--size full|tiny] [--kind both|mvdream|imagedream] [--reps 5]
        [--variants default,no_graphs,no_fused,plain] [--json FILE]

For each kind the networks are built once with random weights directly on the device (``--size full``:
the converted repositories' architectures, ~1.3 B parameters for MVDream, ~2.0 B for ImageDream), then
each variant builds a prior around them (:data:`VARIANTS`: CUDA graphs, channels-last, fused group norm
on or off). Per variant, after a warm-up that captures the CUDA graphs (timed apart):

* ``refine_ms``: one refine of the preset's first annealed iteration (t2 / T = ``sir.t_start``: noise to
  t1, DDIM inversion t1 -> t2, guided DDIM t2 -> 0, VAE encode and decode), and ``refine_noise_ms`` one
  from pure noise (every grid step, guided);
* the parts: a guided UNet call (both branches: 2 x 4 views, ImageDream 2 x 5), an unconditional call (4
  or 5 views), the VAE encoder and decoder of 4 views, the text encoder (prompt and negative prompt), and
  for ImageDream the image embedding (CLIP vision tower, resampler, VAE latent);
* ``generation_diffusion_s``: the preset's 31 iterations (src/microdreamer/presets/imagedream.yaml,
  text.yaml) priced from the parts: the UNet calls each iteration's (t1, t2) plan makes, one encode
  (not at the first iteration) and one decode per iteration.

CUDA-event medians (CPU wall clock with ``--size tiny`` on a machine without a GPU, where it only checks
that the script runs), peak allocated memory, UNet call counts. The JSON holds every number, the command
and the hardware (benchmarks/_common.py); the table is printed last.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

from _common import hardware, save_result, time_ms  # benchmarks/ on sys.path

ROOT = Path(__file__).resolve().parents[1]
PRESETS = ROOT / "src" / "microdreamer" / "presets"
VARIANTS = {
    "default": {},
    "no_graphs": {"cuda_graphs": False},
    "no_fused": {"fused_group_norm": False},
    "plain": {
        "cuda_graphs": False,
        "channels_last": False,
        "vae_channels_last": False,
        "fused_group_norm": False,
    },
}


def load_preset(kind: str):
    """(prior config, SIRConfig) of the kind's preset."""
    import yaml

    from microdreamer.config import from_dict
    from microdreamer.priors.imagedream import ImageDreamConfig
    from microdreamer.priors.mvdream import MVDreamConfig
    from microdreamer.sir import SIRConfig

    name, cls = (
        ("imagedream.yaml", ImageDreamConfig) if kind == "imagedream" else ("text.yaml", MVDreamConfig)
    )
    data = yaml.safe_load((PRESETS / name).read_text())
    return from_dict(cls, data["prior"], name), from_dict(SIRConfig, data["sir"], name)


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def median(xs: list[float]) -> float:
    return round(statistics.median(xs), 4)


def generation_prediction(prior, sir, parts: dict) -> dict:
    """Seconds of diffusion for the preset's whole schedule, from the parts' medians."""
    from microdreamer.sir import t_stop_schedule

    guided = uncond = encodes = 0
    for k in range(sir.iterations):
        if k == 0:
            guided += len(prior.ddim.timesteps)
            continue
        t1, t2 = prior.ddim.plan(t_stop_schedule(k, sir), prior.config.inversion_ratio)
        if t2 is None:
            continue
        encodes += 1
        if t1 is not None:
            uncond += (t2 - t1) // prior.ddim.step_size
        guided += sum(1 for t in prior.ddim.timesteps if t <= t2)
    ms = (guided * parts["unet_guided_ms"] + uncond * parts["unet_uncond_ms"] + encodes * parts["vae_encode_ms"]
          + sir.iterations * parts["vae_decode_ms"])  # fmt: skip
    return {"guided_calls": guided, "uncond_calls": uncond, "encodes": encodes, "decodes": sir.iterations,
            "generation_diffusion_s": round(ms / 1000, 3)}  # fmt: skip


def bench_variant(kind: str, comps, name: str, args, device) -> dict:
    import dataclasses

    from microdreamer.priors import OrbitViews, Reference
    from microdreamer.priors.imagedream import ImageDreamPrior
    from microdreamer.priors.mvdream import MVDreamPrior

    prior_cfg, sir = load_preset(kind)
    size = 256 if args.size == "full" else 64
    prior_cfg = dataclasses.replace(prior_cfg, image_size=size, **VARIANTS[name])
    cls = ImageDreamPrior if kind == "imagedream" else MVDreamPrior
    prior = cls(comps, prior_cfg, device)
    C = 4
    g = torch.Generator(device=device).manual_seed(0)
    rgb = torch.rand(3, size, size, device=device, generator=g)
    ref = Reference(rgb.cpu(), torch.ones(1, size, size), azimuth_deg=90.0, radius=sir.radius)
    row: dict = {"kind": kind, "variant": name, "settings": VARIANTS[name], "views": C, "image_size": size}
    row["set_prompt_ms"] = median(
        time_ms(lambda: prior.set_prompt("a DSLR photo of a red fire hydrant"), 1, args.reps)
    )
    if kind == "imagedream":
        row["set_reference_ms"] = median(time_ms(lambda: prior.set_reference(ref), 1, args.reps))
    views = OrbitViews(torch.full((C,), -2.5), torch.arange(C) * 90.0 - 135.0, sir.radius)
    renders = torch.rand(C, 3, size, size, device=device, generator=g)
    sync()
    t = time.perf_counter()
    prior.warmup(C)  # captures the UNet's graphs (both branches, unconditional) and the VAE's
    sync()
    row["warmup_s"] = round(time.perf_counter() - t, 3)
    cam = prior.camera(views)
    h = size // prior.vae_factor
    x = torch.randn(C, 4, h, h, device=device, generator=g)
    guided, uncond = prior._eps_guided(cam), prior._eps_unconditional(cam)
    lat = torch.randn(C, 4, h, h, device=device, generator=g)
    parts = {
        "unet_guided_ms": median(time_ms(lambda: guided(x, 501), 2, args.reps)),
        "unet_uncond_ms": median(time_ms(lambda: uncond(x, 501), 2, args.reps)),
        "vae_encode_ms": median(time_ms(lambda: prior.encode(renders), 2, args.reps)),
        "vae_decode_ms": median(time_ms(lambda: prior.decode(lat), 2, args.reps)),
    }
    row.update(parts)
    t_first = sir.t_start
    calls0 = prior.unet.calls
    row["refine_ms"] = median(time_ms(lambda: prior.refine(renders, views, t_first, g), 1, args.reps))
    row["refine_unet_calls"] = (prior.unet.calls - calls0) // (args.reps + 1)
    row["refine_t_stop"] = t_first
    row["refine_plan_t1_t2"] = list(prior.ddim.plan(t_first, prior.config.inversion_ratio))
    row["refine_noise_ms"] = median(
        time_ms(lambda: prior.refine(None, views, 1.0, g), 1, max(1, args.reps // 2))
    )
    row.update(generation_prediction(prior, sir, parts))
    row["stats"] = prior.stats()
    if torch.cuda.is_available():
        row["peak_allocated_GiB"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", choices=("full", "tiny"), default="full")
    ap.add_argument("--kind", choices=("both", "mvdream", "imagedream"), default="both")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args()
    variants = [v for v in args.variants.split(",") if v]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        sys.exit(f"unknown variant(s) {', '.join(unknown)}; use {', '.join(VARIANTS)}")
    cuda = torch.cuda.is_available()
    if args.size == "full" and not cuda:
        sys.exit("--size full needs a CUDA GPU (use --size tiny to check the script on the CPU)")
    device = torch.device("cuda" if cuda else "cpu")
    dtype = torch.float16 if cuda else torch.float32
    from microdreamer.priors.factory import build_random_mvdream

    kinds = ["mvdream", "imagedream"] if args.kind == "both" else [args.kind]
    rows, builds = [], {}
    for kind in kinds:
        t = time.perf_counter()
        comps = build_random_mvdream(args.size, args.seed, device, dtype, image_prompt=kind == "imagedream")
        sync()
        builds[kind] = {"build_s": round(time.perf_counter() - t, 2),
                        "parameters": {n: sum(p.numel() for p in m.parameters())
                                       for n, m in (("unet", comps.unet), ("vae", comps.vae),
                                                    ("text_encoder", comps.text_encoder),
                                                    ("image_encoder", comps.image_encoder)) if m is not None}}  # fmt: skip
        for name in variants:
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            rows.append(bench_variant(kind, comps, name, args, device))
            print(f"{kind} {name}: refine {rows[-1]['refine_ms']} ms", flush=True)
        del comps
        if cuda:
            torch.cuda.empty_cache()
    result = {"size": args.size, "dtype": str(dtype), "builds": builds, "rows": rows}
    if args.json:
        save_result(args.json, result)
    keys = ("unet_guided_ms", "unet_uncond_ms", "vae_encode_ms", "vae_decode_ms", "refine_ms", "refine_unet_calls",
            "refine_noise_ms", "warmup_s", "generation_diffusion_s")  # fmt: skip
    print(f"\n{'kind':<11} {'variant':<10} " + " ".join(f"{k:>22}" for k in keys))
    for r in rows:
        print(f"{r['kind']:<11} {r['variant']:<10} " + " ".join(f"{r[k]!s:>22}" for k in keys))
    print(hardware().get("gpu", hardware()["cpu"]))


if __name__ == "__main__":
    main()
