"""The fresh process that :mod:`bench_startup` times; it imports nothing heavy before it is told to.

    python benchmarks/_startup_child.py first-step IMAGE GENERATE_ARGS...
    python benchmarks/_startup_child.py parts (--random-weights tiny|full | --model PATH) --device DEV

``first-step`` runs ``microdreamer generate IMAGE GENERATE_ARGS...`` through the CLI's ``main``, stopped
where SIR would start, and prints one JSON line: the wall-clock times (``time.time()``) of the input's
first open, of ``generate()``'s model build (start, end) and of the first SIR step, generate's stage
seconds so far (prepare, load_model, warmup), and which heavy packages were imported by then.

``parts`` times, one after the other in one process: ``import torch``, the CLI's and generate's modules,
the device's context, the model's diffusers and transformers imports (those of ``build_random_zero123`` /
``load_components``), the model build or load, and the prior's set-up (``Zero123Prior``); one JSON line.
"""

from __future__ import annotations

import json
import sys
import time

#: the packages whose presence at the first SIR step is reported
WATCHED = ("torch", "diffusers", "transformers", "torch._dynamo", "torchvision", "peft", "accelerate", "triton",
           "scipy.stats", "sympy", "gsplat", "skimage", "trimesh")  # fmt: skip


def first_step(image: str, argv: list[str]) -> dict:
    import os

    events: dict[str, float] = {"child_start": time.time()}
    target = os.path.realpath(image)

    def hook(event: str, args: tuple) -> None:
        if event == "open" and "input_first_open" not in events and isinstance(args[0], str):
            if os.path.realpath(args[0]) == target:
                events["input_first_open"] = time.time()

    sys.addaudithook(hook)
    import microdreamer.cli as cli
    import microdreamer.jobs.generate as gen

    events["cli_imported"] = time.time()
    build = gen.build_generate_prior
    seconds: dict[str, float] = {}

    def timed_build(*args, **kwargs):
        events["model_start"] = time.time()
        prior = build(*args, **kwargs)
        _sync(prior)
        events["model_end"] = time.time()
        return prior

    class FirstStep(Exception):
        pass

    def stop(*args, timer=None, **kwargs):
        events["first_sir_step"] = time.time()
        seconds.update(timer.seconds if timer is not None else {})
        raise FirstStep

    gen.build_generate_prior, gen.run_sir = timed_build, stop
    try:
        cli.main(["generate", image, *argv])
    except FirstStep:
        pass
    return {
        "events": events,
        "generate_seconds": seconds,
        "modules": len(sys.modules),
        "imported": {name: name in sys.modules for name in WATCHED},
    }


def _sync(prior) -> None:
    device = getattr(prior, "device", None)
    if device is not None and device.type == "cuda":
        import torch

        torch.cuda.synchronize(device)


def parts(argv: list[str]) -> dict:
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--random-weights", default=None)
    ap.add_argument("--model", default=None)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args(argv)
    out: dict[str, float] = {}
    t = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal t
        now = time.perf_counter()
        out[name] = now - t
        t = now

    import torch

    lap("import_torch")
    import microdreamer.cli  # noqa: F401
    import microdreamer.jobs.generate  # noqa: F401

    lap("import_cli_and_generate")
    from microdreamer.config import Zero123Config
    from microdreamer.jobs import resolve_device
    from microdreamer.priors.zero123 import Zero123Prior, clip_image_processor_class, resolve_dtype

    device = resolve_device(args.device)
    if device.type == "cuda":
        torch.zeros(1, device=device)
        torch.cuda.synchronize(device)
    lap("device_context")
    from diffusers import AutoencoderKL, UNet2DConditionModel  # noqa: F401

    lap("import_diffusers_models")
    from transformers import CLIPVisionConfig, CLIPVisionModelWithProjection  # noqa: F401

    clip_image_processor_class()
    lap("import_transformers_clip")
    from diffusers import DDIMInverseScheduler, DDIMScheduler  # noqa: F401

    lap("import_diffusers_schedulers")
    config = Zero123Config()
    dtype = resolve_dtype(config.dtype, device)
    if args.model:
        from microdreamer.priors.zero123 import load_components

        comps = load_components(args.model, device, dtype)
        name = "load_model"
    else:
        from microdreamer.priors.factory import build_random_zero123

        comps = build_random_zero123(args.random_weights, 0, device, dtype)
        name = "build_model"
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    lap(name)
    prior = Zero123Prior(comps, config, device)
    _sync(prior)
    lap("prior_setup")
    return {"seconds": out, "device": str(device), "dtype": str(dtype).replace("torch.", "")}


if __name__ == "__main__":
    mode, rest = sys.argv[1], sys.argv[2:]
    if mode == "first-step":
        result = first_step(rest[0], rest[1:])
    elif mode == "parts":
        result = parts(rest)
    else:
        raise SystemExit(f"unknown mode {mode!r}: use first-step or parts")
    print("RESULT " + json.dumps(result), flush=True)
