"""Batches: many inputs through one job, its model loaded once (``microdreamer generate IMG... -o OUT/``,
``microdreamer mesh SPLAT... -o OUT/``), in this process or on Ray workers.

A batch is a :class:`BatchJob` (what to load once: :meth:`~BatchJob.setup`; what to do per input:
:meth:`~BatchJob.run`) and a list of :class:`BatchItem` (input -> output). Outputs::

    OUT/<stem>/        generate: splat.ply, mesh.glb, views.png, timings.json (one folder per image)
    OUT/<stem>.glb     mesh: one file per splat
    OUT/summary.json   per input: status (ok / failed / skipped), seconds, Gaussians, error; totals

Each input's outputs appear whole or not at all (generate writes into a hidden temporary folder
renamed at the end; the mesh file is written atomically), so a failed or interrupted input leaves
nothing and a rerun redoes exactly the inputs without outputs (``overwrite=False`` skips the others).
A failing input is recorded with its one-line error and the batch goes on.

:func:`run_local` runs the items one after the other in this process. :func:`run_ray` starts one
Ray actor per worker (one GPU each, or one CPU each where the cluster has no GPU); every actor runs
:meth:`~BatchJob.setup` once, and Ray's :class:`~ray.util.ActorPool` hands the items to the actors as
they free up (one queue). An actor whose process dies is restarted by Ray (``max_restarts``) and the
task it was running is retried once (``max_task_retries=1``); a task that dies twice is reported as
failed. Results land in OUT/ exactly as in :func:`run_local`: on a multi-machine cluster the inputs
and OUT/ must be on a filesystem every node sees, and microdreamer installed on every node.

Ray is optional (``pip install -e ".[distributed]"``) and imported only by :func:`run_ray`. Importing
this module imports no torch; the jobs import their stages in :meth:`~BatchJob.setup`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import json
import logging
import os
import re
import socket
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from microdreamer.errors import InputError
from microdreamer.io_utils import MAX_NAME_BYTES, atomic_path, check_output_folder, staged_folder

logger = logging.getLogger(__name__)

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".tif", ".tiff")
SPLAT_SUFFIXES = (".ply", ".spz", ".sog", ".splat", ".ksplat", ".glb", ".gltf")  # formats.SPLAT_SUFFIXES
STATUSES = ("ok", "failed", "skipped")


@dataclass(frozen=True)
class BatchItem:
    """One input of a batch and where its output goes.

    Attributes:
        name: the output's stem, unique in the batch (the input's file stem).
        input: the input file.
        output: the output folder (generate) or file (mesh).
    """

    name: str
    input: Path
    output: Path


@dataclass
class ItemResult:
    """What became of one input.

    Attributes:
        name, input, output: as in :class:`BatchItem` (paths as strings).
        status: "ok", "failed" or "skipped" (its output existed and overwriting was not asked for).
        seconds: wall-clock seconds of the input's work (0 when skipped).
        num_gaussians: the splat's Gaussians (generated, or read for a mesh), None when unknown.
        error: the one-line error of a failed input.
        worker: "pid@host" of the process that ran it.
        details: the job's numbers (stage seconds, mesh size).
    """

    name: str
    input: str
    output: str
    status: str
    seconds: float = 0.0
    num_gaussians: int | None = None
    error: str | None = None
    worker: str | None = None
    details: dict = field(default_factory=dict)


@dataclass
class BatchReport:
    """A finished batch: the items' results (in input order) and the batch's own times.

    Attributes:
        job: "generate" or "mesh".
        results: one :class:`ItemResult` per input, in the order given.
        setup: per worker, the seconds of its one-time setup (model load, warm-up) by part.
        wall: seconds from the start of the batch (before any setup) to its last result.
        workers: processes that ran items (1 for :func:`run_local`).
        engine: "local" or "ray".
    """

    job: str
    results: list[ItemResult]
    setup: list[dict]
    wall: float
    workers: int = 1
    engine: str = "local"

    def count(self, status: str) -> int:
        return sum(r.status == status for r in self.results)

    @property
    def failed(self) -> list[ItemResult]:
        return [r for r in self.results if r.status == "failed"]

    def to_dict(self) -> dict:
        ok = [r.seconds for r in self.results if r.status == "ok"]
        return {
            "job": self.job,
            "engine": self.engine,
            "workers": self.workers,
            "inputs": len(self.results),
            **{s: self.count(s) for s in STATUSES},
            "wall_seconds": self.wall,
            "setup_seconds": self.setup,
            "ok_seconds": {
                "first": ok[0] if ok else None,
                "median": sorted(ok)[len(ok) // 2] if ok else None,
                "total": sum(ok),
            },
            "failures": [{"input": r.input, "error": r.error} for r in self.failed],
            "items": [dataclasses.asdict(r) for r in self.results],
        }


# ---------------------------------------------------------------------------------------------- jobs
class BatchJob:
    """What a batch does: :meth:`setup` once per process, then :meth:`run` per input.

    A job is pickled to each Ray worker before its setup: keep what setup builds (models, devices) in
    attributes whose names start with an underscore; they are not pickled.
    """

    kind = "job"
    suffixes: tuple[str, ...] = ()  # the input files a folder contributes
    what = "input"  # how messages name an input
    output_is_folder = False  # an input's output is a folder (generate) or a file (mesh)

    def output_for(self, out_dir: Path, name: str) -> Path:
        raise NotImplementedError

    def is_done(self, output: Path) -> bool:
        """Whether ``output`` holds a complete result (then the input is skipped unless overwriting)."""
        raise NotImplementedError

    def setup(self) -> dict:
        """Load what every input needs; returns seconds by part."""
        return {}

    def run(self, item: BatchItem) -> dict:
        """Make ``item.output`` from ``item.input``; returns the numbers to record ("num_gaussians" and
        the job's details). Raises InputError (or anything else) when the input fails."""
        raise NotImplementedError

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if not k.startswith("_")}


@dataclass
class GenerateJob(BatchJob):
    """``microdreamer generate`` over many images: the prior built (or loaded) and warmed up once, then
    :func:`microdreamer.jobs.generate.generate` per image into OUT/<stem>/.

    Attributes:
        config: the :class:`~microdreamer.config.GenerateConfig` of every image (same seed for each, so an
            image's outputs do not depend on its place in the batch or on the worker that ran it).
        model: a model folder or cached repo id (None: ``config.prior.model``).
        random_weights: None, "tiny" or "full" (an untrained model: timing and plumbing only).
        device: "auto", "cpu" or "cuda".
    """

    config: Any = None
    model: str | None = None
    random_weights: str | None = None
    device: str = "auto"

    kind = "generate"
    suffixes = IMAGE_SUFFIXES
    what = "image"
    output_is_folder = True
    FILES = (
        "input_rgba.png",
        "splat.ply",
        "mesh.glb",
        "views.png",
        "timings.json",
    )  # timings.json is written last
    OWNED = (*FILES, "profile.json", "profile.png")  # what a run may write (an earlier run's are replaced)

    def output_for(self, out_dir: Path, name: str) -> Path:
        return out_dir / name

    def is_done(self, output: Path) -> bool:
        return all((output / f).is_file() for f in self.FILES)

    def setup(self) -> dict:
        t = time.perf_counter()
        from microdreamer.config import GenerateConfig
        from microdreamer.jobs import resolve_device
        from microdreamer.jobs.generate import PRELOAD_MODULES, build_prior, initialise_device

        cfg = self.config or GenerateConfig()
        seconds = {"import_torch": time.perf_counter() - t}
        t = time.perf_counter()
        self._device = resolve_device(self.device)
        initialise_device(self._device)  # in the shadow of the imports below
        _import_quietly(
            ("diffusers.models.autoencoders", "diffusers.models.unets", "transformers.models.clip")
        )
        seconds["import_diffusers"] = time.perf_counter() - t
        t = time.perf_counter()
        self._prior = build_prior(cfg.prior, self._device, self.model, self.random_weights, cfg.sir.seed)
        seconds["load_model"] = _lap(t, self._device)
        t = time.perf_counter()
        if cfg.warmup and hasattr(self._prior, "warmup"):  # once: the runs below replay what it captured
            if "from_renders" in inspect.signature(self._prior.warmup).parameters:
                self._prior.warmup(cfg.sir.views, from_renders=cfg.sir.iterations > 1)
            else:
                self._prior.warmup(cfg.sir.views)
        seconds["warmup"] = _lap(t, self._device)
        t = time.perf_counter()
        _import_quietly(PRELOAD_MODULES)  # the export stages' modules, before the first image
        seconds["import_export_stages"] = time.perf_counter() - t
        self._config = dataclasses.replace(cfg, warmup=False)
        return seconds

    def run(self, item: BatchItem) -> dict:
        from microdreamer.jobs.generate import generate

        # as a single-image run: staged, moved in as one; the user's other files in OUT/<stem>/ kept
        with staged_folder(item.output, owned=self.OWNED) as tmp:
            report = generate(item.input, tmp, self._config, model=self._prior, device=self._device)
        return {
            "num_gaussians": report["num_gaussians"],
            "mesh_faces": report["mesh_faces"],
            "stages": report["stages"],
            "seconds_after_load": report["seconds_after_load"],
        }


@dataclass
class MeshJob(BatchJob):
    """``microdreamer mesh`` over many splats: the export stages (and on a GPU the field kernels) loaded
    once, then :func:`microdreamer.jobs.export.export_mesh` per splat into OUT/<stem>.glb.

    Attributes:
        config: the :class:`~microdreamer.config.ExportConfig` of every splat.
        device: "auto", "cpu" or "cuda".
        suffix: the mesh format of the outputs (".glb", ".obj" or ".ply").
    """

    config: Any = None
    device: str = "auto"
    suffix: str = ".glb"

    kind = "mesh"
    suffixes = SPLAT_SUFFIXES
    what = "splat"

    def output_for(self, out_dir: Path, name: str) -> Path:
        return out_dir / f"{name}{self.suffix}"

    def is_done(self, output: Path) -> bool:
        return output.is_file()

    def setup(self) -> dict:
        t = time.perf_counter()
        from microdreamer.jobs import resolve_device
        from microdreamer.jobs.export import export_mesh  # noqa: F401  (the stages' imports, once)

        self._device = resolve_device(self.device)
        seconds = {"imports": time.perf_counter() - t}
        if self._device.type == "cuda":
            t = time.perf_counter()
            from microdreamer import fallback
            from microdreamer.render import gaussians

            # compiled once, then cached on disk; without a compiler the PyTorch paths (said once)
            fallback.kernels_usable()
            gaussians.resolve_backend("auto", self._device, needs_grad=False)
            seconds["kernels"] = time.perf_counter() - t
        t = time.perf_counter()
        from microdreamer.kernels import cpu

        cpu.usable()  # the C++ CPU kernels (packer; field and bake on the CPU): built once, then cached on disk
        seconds["cpu_kernels"] = time.perf_counter() - t
        return seconds

    def run(self, item: BatchItem) -> dict:
        from microdreamer.config import ExportConfig
        from microdreamer.jobs.export import export_mesh
        from microdreamer.profiling import StageTimer
        from microdreamer.splat import read_splat

        cfg = self.config or ExportConfig()
        timer = StageTimer()
        with timer.stage("read"):
            splat = read_splat(item.input)
        item.output.parent.mkdir(parents=True, exist_ok=True)
        result = export_mesh(splat, item.output, cfg, self._device, timer=timer, name=str(item.input))
        return {
            "num_gaussians": result.convert.num_gaussians_in,
            "gaussians_kept": result.convert.num_gaussians_kept,
            "mesh_vertices": int(result.mesh.num_vertices),
            "mesh_faces": int(result.mesh.num_faces),
            "up": result.up,
            "stages": dict(timer.seconds),
        }


def _lap(start: float, device) -> float:
    if getattr(device, "type", "") == "cuda":
        import torch

        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def _import_quietly(names: Sequence[str]) -> None:
    import importlib

    for name in names:
        try:
            importlib.import_module(name)
        except Exception as e:  # an optional module missing fails later, where it is needed
            logger.debug("import of %s failed: %r", name, e)


# ------------------------------------------------------------------------------------------ planning
def collect_inputs(sources: Sequence[str | os.PathLike], suffixes: Sequence[str], what: str) -> list[Path]:
    """The input files of a batch: each source as given when it is not a folder (a missing or unreadable
    one fails as that input), and a folder's files with one of ``suffixes`` (case ignored, sorted by
    name, hidden files left out); a path given twice counts once.

    Raises:
        InputError: a folder holds no such file, or there is no input at all.
    """
    inputs: list[Path] = []
    seen: set[str] = set()
    for source in sources:
        path = Path(source)
        if path.is_dir():
            found = sorted(
                p for p in path.iterdir()
                if p.is_file() and p.suffix.lower() in suffixes and not p.name.startswith(".")
            )  # fmt: skip
            if not found:
                raise InputError(f"{path}: the folder holds no {what} ({', '.join(suffixes)}); give files "
                                 "or a folder that holds some")  # fmt: skip
        else:
            found = [path]
        for p in found:
            key = os.path.abspath(p)
            if key not in seen:
                seen.add(key)
                inputs.append(p)
    if not inputs:
        raise InputError(f"no input given; give one or more {what} files or a folder")
    return inputs


def plan(inputs: Sequence[Path], out_dir: str | os.PathLike, job: BatchJob) -> list[BatchItem]:
    """One :class:`BatchItem` per input, named by the file's stem, its output in ``out_dir``.

    Raises:
        InputError: ``out_dir`` exists and is not a folder, or two inputs share a stem (one output).
    """
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise InputError(
            f"{out}: exists and is not a folder; a batch writes one output per input into a folder"
        )
    check_output_folder(out)
    summary = out / "summary.json"
    if summary.exists() and (summary.is_dir() or not summary.is_file()):
        raise InputError(f"{summary}: exists and is not a file; the batch writes its summary there, move it")
    items, by_name = [], {}
    for path in inputs:
        name = Path(path).stem
        output = job.output_for(out, name)
        if output.parent != out or output.name in ("", ".", ".."):  # "..png": OUT/. is OUT itself
            raise InputError(f"{path}: its name (stem {name!r}) gives no output name inside {out}; rename "
                             "the file")  # fmt: skip
        if len(os.fsencode(output.name)) > MAX_NAME_BYTES:
            raise InputError(f"{path}: its name is too long for an output name; rename the file")
        if output.exists() and output.is_dir() != job.output_is_folder:
            kind = "a folder" if output.is_dir() else "a file"
            raise InputError(f"{output}: is {kind} of another kind than the output of {path}; move it")
        if name in by_name:
            raise InputError(f"{by_name[name]} and {path}: both would write {job.output_for(out, name)}; "
                             "rename one or run them in separate batches")  # fmt: skip
        by_name[name] = path
        items.append(BatchItem(name, Path(path), output))
    return items


def _skipped(item: BatchItem) -> ItemResult:
    return ItemResult(item.name, str(item.input), str(item.output), "skipped")


def run_item(job: BatchJob, item: BatchItem) -> ItemResult:
    """Run one item, turning its failure into a failed :class:`ItemResult` (the error's one line)."""
    worker = f"{os.getpid()}@{socket.gethostname()}"
    t = time.perf_counter()
    try:
        out = dict(job.run(item))
    except InputError as e:
        return ItemResult(item.name, str(item.input), str(item.output), "failed", time.perf_counter() - t,
                          error=str(e), worker=worker)  # fmt: skip
    except Exception as e:  # anything else fails this input only; the traceback goes to the log
        logger.info("%s failed:\n%s", item.input, traceback.format_exc())
        first = (str(e).strip().splitlines() or [""])[0]
        return ItemResult(item.name, str(item.input), str(item.output), "failed", time.perf_counter() - t,
                          error=f"{item.input}: {type(e).__name__}: {first}", worker=worker)  # fmt: skip
    seconds = time.perf_counter() - t
    n = out.pop("num_gaussians", None)
    return ItemResult(
        item.name, str(item.input), str(item.output), "ok", seconds, n, worker=worker, details=out
    )


Report = Callable[[ItemResult, int, int], None]  # (result, done so far, total)


def _split_done(
    job: BatchJob, items: Sequence[BatchItem], overwrite: bool, report: Report | None
) -> tuple[list, dict]:
    """([(index, item)] to run, {index: skipped result} of the inputs whose outputs exist), each skipped
    one reported."""
    todo, done = [], {}
    for i, item in enumerate(items):
        if not overwrite and job.is_done(item.output):
            done[i] = _skipped(item)
        else:
            todo.append((i, item))
    for r in done.values():
        if report:
            report(r, len(done), len(items))
    return todo, done


# --------------------------------------------------------------------------------------------- local
def run_local(
    job: BatchJob, items: Sequence[BatchItem], overwrite: bool = False, report: Report | None = None
) -> BatchReport:
    """Run ``items`` one after the other in this process after one :meth:`~BatchJob.setup` (skipped when
    every output exists). ``report(result, done, total)`` is called after each input."""
    start = time.perf_counter()
    todo, results = _split_done(job, items, overwrite, report)
    n = len(items)
    setup = [job.setup()] if todo else []
    for i, item in todo:
        results[i] = run_item(job, item)
        if report:
            report(results[i], len(results), n)
    ordered = [results[i] for i in range(n)]
    return BatchReport(job.kind, ordered, setup, time.perf_counter() - start, 1 if todo else 0, "local")


# ----------------------------------------------------------------------------------------------- Ray
RAY_MISSING = (
    'Ray is not installed; pip install -e ".[distributed]" (or pip install ray), or leave out {flag}'
)


def import_ray(flag: str = "--workers"):
    """The ``ray`` module, or a one-line InputError saying how to install it."""
    try:
        import ray
        from ray.util import ActorPool  # noqa: F401
    except ImportError:
        raise InputError(RAY_MISSING.format(flag=flag)) from None
    return ray


class _Worker:
    """A Ray actor: one job, set up once in its process; runs items (failures become results)."""

    def __init__(self, job: BatchJob) -> None:
        self.job = job
        self.setup_error = None
        self.setup_seconds: dict = {}
        try:
            self.setup_seconds = job.setup()
        except Exception as e:  # reported by ready(); the driver fails the batch with it
            first = (str(e).strip().splitlines() or [""])[0]
            self.setup_error = first if isinstance(e, InputError) else f"{type(e).__name__}: {first}"

    def ready(self) -> tuple[str | None, dict, str]:
        return self.setup_error, self.setup_seconds, f"{os.getpid()}@{socket.gethostname()}"

    def run(self, item: BatchItem) -> ItemResult:
        return run_item(self.job, item)


#: seconds to wait for a Ray cluster's address to answer before giving up
RAY_CONNECT_S = 10.0
_RAY_ADDRESS = re.compile(r"^(?:ray://)?(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(?P<port>\d{1,5})$")


def check_ray_address(address: str, timeout: float = RAY_CONNECT_S) -> None:
    """InputError unless ``address`` is ``auto`` or ``[ray://]host:port`` whose port answers within
    ``timeout`` seconds (``ray.init`` itself may wait without end for a host that drops packets)."""
    if address == "auto":
        return
    m = _RAY_ADDRESS.match(address)
    if m is None or not 0 < int(m["port"]) < 65536:
        raise InputError(f"--ray-address {address!r}: not an address; give host:port (e.g. 10.0.0.5:6379) "
                         "or auto")  # fmt: skip
    host = m["host"].strip("[]")
    try:
        socket.create_connection((host, int(m["port"])), timeout=timeout).close()
    except OSError as e:
        reason = "no answer" if isinstance(e, TimeoutError) else (e.strerror or type(e).__name__)
        raise InputError(f"--ray-address {address}: cannot reach it ({reason} within {timeout:g} s); start the "
                         "cluster (ray start --head) or check the address") from None  # fmt: skip


@contextlib.contextmanager
def ray_cluster(
    workers: int | None = None,
    address: str | None = None,
    device: str = "auto",
    init_kwargs: dict | None = None,
):
    """Ray, connected, and how its workers are laid out: yields ``(ray, workers, resources)``, the actors'
    count and their ``ray.remote`` resources (one GPU each, or one CPU each where the cluster has no GPU,
    or where ``device`` is "cpu").

    Args:
        workers: actors the caller will start. Default: one per GPU of the cluster (required when it has
            none).
        address: an existing cluster ("auto" or "host:port"); None starts a local one with a CPU slot per
            worker (at least one per core), and its GPUs. A cluster this call started is stopped on exit;
            one already initialised in this process is used as it is and left running.
        device: "auto", "cpu" or "cuda" (refused on a cluster without a GPU).
        init_kwargs: more ``ray.init`` arguments (tests).

    Raises:
        InputError: Ray missing, a worker count below 1, more workers than GPUs, no worker count for a
            CPU cluster, or no cluster at ``address``.
    """
    ray = import_ray("--ray-address" if address and workers is None else "--workers")
    if workers is not None and workers < 1:
        raise InputError(f"--workers {workers}: must be at least 1")
    kwargs = {"include_dashboard": False, "logging_level": logging.WARNING, **(init_kwargs or {})}
    started = not ray.is_initialized()
    if started:
        if address is None:
            kwargs.setdefault("num_cpus", max(workers or 1, os.cpu_count() or 1))
            ray.init(address="local", **kwargs)
        else:
            check_ray_address(address)  # bounded: an unreachable host fails in seconds, not never
            try:
                ray.init(address=address, **kwargs)
            except (ConnectionError, TimeoutError, RuntimeError, ValueError, OSError) as e:
                first = (str(e).strip().splitlines() or [type(e).__name__])[0]
                raise InputError(f"--ray-address {address}: no Ray cluster there ({first}); start one "
                                 "(ray start --head) or leave out --ray-address") from None  # fmt: skip
    try:
        gpus = int(ray.cluster_resources().get("GPU", 0))
        if workers is None:
            if not gpus:
                raise InputError(
                    "--ray-address: the cluster has no GPU; say how many CPU workers with --workers N"
                )
            workers = gpus
        if gpus and workers > gpus:
            raise InputError(
                f"--workers {workers}: the cluster has {gpus} GPUs (one worker each); use at most {gpus}"
            )
        if not gpus and device == "cuda":
            raise InputError("--device cuda: the Ray cluster has no GPU; use --device auto or cpu")
        resources = {"num_gpus": 1} if gpus and device != "cpu" else {"num_cpus": 1}
        yield ray, workers, resources
    finally:
        if started:
            ray.shutdown()


def run_ray(
    job: BatchJob,
    items: Sequence[BatchItem],
    overwrite: bool = False,
    report: Report | None = None,
    workers: int | None = None,
    address: str | None = None,
    init_kwargs: dict | None = None,
) -> BatchReport:
    """Run ``items`` on Ray: ``workers`` actors, each set up once, fed from one queue (ActorPool).

    Args:
        job, items, overwrite, report: as in :func:`run_local`.
        workers, address, init_kwargs: the cluster (:func:`ray_cluster`).

    Raises:
        InputError: as :func:`ray_cluster`, or a worker's setup failed (its one line).
    """
    import_ray("--ray-address" if address and workers is None else "--workers")
    from ray.util import ActorPool

    start = time.perf_counter()
    todo, results = _split_done(job, items, overwrite, report)
    n = len(items)
    if not todo:
        return BatchReport(
            job.kind, [results[i] for i in range(n)], [], time.perf_counter() - start, 0, "ray"
        )
    device = getattr(job, "device", "auto")
    with ray_cluster(workers, address, device, init_kwargs) as (ray, workers, resources):
        actor_cls = ray.remote(max_restarts=-1, max_task_retries=1, **resources)(_Worker)
        actors = [actor_cls.remote(job) for _ in range(min(workers, len(todo)))]
        setup = []
        for error, seconds, who in ray.get([a.ready.remote() for a in actors]):
            if error:
                raise InputError(error)
            setup.append({**seconds, "worker": who})
        pool = ActorPool(actors)
        for _, item in todo:
            pool.submit(lambda actor, it: actor.run.remote(it), item)
        k = 0
        while pool.has_next():  # in submission order: the k-th result is the k-th item's
            i, item = todo[k]
            try:
                results[i] = pool.get_next()
            except ray.exceptions.RayError as e:  # its worker died twice, or Ray itself failed
                first = (str(e).strip().splitlines() or [""])[0]
                results[i] = ItemResult(item.name, str(item.input), str(item.output), "failed",
                                        error=f"{item.input}: the worker was lost ({type(e).__name__}: {first})")  # fmt: skip
            k += 1
            if report:
                report(results[i], len(results), n)
        for i, item in todo[k:]:  # every actor gone: what was still queued
            results[i] = ItemResult(item.name, str(item.input), str(item.output), "failed",
                                    error=f"{item.input}: not run, every worker was lost")  # fmt: skip
            if report:
                report(results[i], len(results), n)
    ordered = [results[i] for i in range(n)]
    return BatchReport(job.kind, ordered, setup, time.perf_counter() - start, len(setup), "ray")


# ------------------------------------------------------------------------------------------- summary
def write_summary(report: BatchReport, out_dir: str | os.PathLike, extra: dict | None = None) -> Path:
    """``OUT/summary.json`` (written atomically): :meth:`BatchReport.to_dict` plus ``extra``."""
    path = Path(out_dir) / "summary.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps({**(extra or {}), **report.to_dict()}, indent=2))
    return path


def table(report: BatchReport) -> str:
    """The per-input table the CLI prints: input, status, seconds, Gaussians, output or error."""
    rows = [("input", "status", "seconds", "Gaussians", "output / error")]
    for r in report.results:
        rows.append((r.name, r.status, f"{r.seconds:.2f}" if r.status != "skipped" else "-",
                     str(r.num_gaussians) if r.num_gaussians is not None else "-",
                     r.output if r.status != "failed" else f"error: {r.error}"))  # fmt: skip
    widths = [max(len(row[c]) for row in rows) for c in range(4)]
    lines = []
    for row in rows:
        cells = [
            row[0].ljust(widths[0]),
            row[1].ljust(widths[1]),
            row[2].rjust(widths[2]),
            row[3].rjust(widths[3]),
        ]
        lines.append("  ".join(cells + [row[4]]).rstrip())
    return "\n".join(lines)
