"""The worker side of the service: what one worker loads once, and how it runs a job.

:class:`ServeJob` is a :class:`~microdreamer.jobs.batch.BatchJob` like the batches' (its setup is theirs:
:class:`~microdreamer.jobs.batch.MeshJob` imports the export stages and builds the CPU kernels,
:class:`~microdreamer.jobs.batch.GenerateJob` loads and warms up the model), so a worker is a local process
(:func:`worker_main`) or the batches' Ray actor. :meth:`ServeJob.run_spec` runs one job with the same
stage functions as the command line (:func:`~microdreamer.jobs.export.export_mesh`,
:func:`~microdreamer.jobs.generate.generate`) into a staged folder that appears only when the job
succeeds, and reports its stage and progress through a callback; the callback raises :class:`Cancelled`
when the job was cancelled (checked at every report: each SIR iteration, each density-field slab, each
stage), so a cancelled job ends at its next report and leaves nothing.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import queue
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from microdreamer.errors import InputError
from microdreamer.jobs.batch import BatchJob

logger = logging.getLogger(__name__)

#: (start, end) of the job's progress bar by the step reporting (a prefix of its description), in order
MESH_PLAN = (("read", 0.0, 0.05), ("density field", 0.05, 0.45), ("iso-level", 0.45, 0.5),
             ("carving", 0.5, 0.6), ("marching cubes", 0.6, 0.7), ("texture", 0.7, 0.95),
             ("writing", 0.95, 1.0))  # fmt: skip
GENERATE_PLAN = (("input", 0.0, 0.02), ("loading", 0.02, 0.04), ("building", 0.02, 0.04),
                 ("SIR", 0.04, 0.8), ("density field", 0.8, 0.85), ("iso-level", 0.85, 0.86),
                 ("carving", 0.86, 0.87), ("marching cubes", 0.87, 0.9), ("texture", 0.9, 0.93),
                 ("stage 2", 0.93, 0.98), ("writing", 0.98, 1.0))  # fmt: skip
#: at most this many progress reports a second reach the server (stage changes always do)
REPORTS_PER_SECOND = 10


class Cancelled(BaseException):  # noqa: N818 (not an error: the job was asked to stop)
    """Raised inside a job at its next progress report once it was cancelled (a BaseException, so that
    no ``except Exception`` in a stage swallows it; every ``finally`` removes the partial outputs)."""


def one_line(e: BaseException) -> str:
    """An exception as the one line a client sees: an InputError's message, else its type and first line."""
    if isinstance(e, InputError):
        return str(e)
    first = (str(e).strip().splitlines() or [""])[0]
    return f"{type(e).__name__}: {first}" if first else type(e).__name__


class Tracker:
    """Maps a job's stage messages and fractions onto one progress bar (a plan of spans by stage), checks
    for cancellation at every report and forwards ``{"stage", "progress"}`` to ``send`` (throttled)."""

    def __init__(self, plan, send: Callable[[dict], None], cancelled: Callable[[], bool]) -> None:
        self.plan, self.send, self.cancelled = plan, send, cancelled
        self.stage, self.progress, self._span = "starting", 0.0, (0.0, 0.0)
        self._last = 0.0
        self.hide: dict[str, str] = {}  # server paths in messages -> what the client sees

    def _check(self) -> None:
        if self.cancelled():
            raise Cancelled()

    def _span_of(self, desc: str) -> tuple[float, float] | None:
        for prefix, lo, hi in self.plan:
            if desc.startswith(prefix):
                return lo, hi
        return None

    def _emit(self, force: bool) -> None:
        now = time.perf_counter()
        if force or now - self._last >= 1.0 / REPORTS_PER_SECOND:
            self._last = now
            self.send({"stage": self.stage, "progress": round(self.progress, 4)})

    def say(self, message: str) -> None:
        """A stage starts (the jobs' ``stage`` callback)."""
        self._check()
        span = self._span_of(message)
        if span is not None:
            self._span = span
            self.progress = max(self.progress, span[0])
        for path, shown in self.hide.items():
            message = message.replace(path, shown)
        self.stage = message
        self._emit(True)

    def fraction(self, desc: str | None, fraction: float | None) -> None:
        """Progress of the current step (``desc`` None: the step of the last stage message)."""
        self._check()
        if desc is not None:
            span = self._span_of(desc)
            if span is None:
                return
            if fraction is None:  # a progress.stage() starts
                self._span = span
                self.progress = max(self.progress, span[0])
                self.stage = desc
                self._emit(True)
                return
            self._span = span
        if fraction is not None:
            lo, hi = self._span
            self.progress = max(self.progress, lo + (hi - lo) * min(max(fraction, 0.0), 1.0))
            self._emit(fraction >= 1.0)


@dataclass
class ServeJob(BatchJob):
    """What a worker holds and runs: the export stages (always) and the image-to-3D model (loaded and
    warmed up once; the text modes' models on their first job, then kept).

    Attributes:
        device: "auto", "cpu" or "cuda".
        model, random_weights: the image-to-3D model (as ``generate --model`` / ``--random-weights``).
        generate_config: the server's GenerateConfig preset (YAML) or None.
        load_model: load the model at setup (a server that only meshes may go without: its generate jobs
            then fail with the load's error).
    """

    device: str = "auto"
    model: str | None = None
    random_weights: str | None = None
    generate_config: str | None = None
    load_model: bool = True
    model_error: str | None = field(default=None, init=False)
    model_name: str | None = field(default=None, init=False)

    kind = "serve"

    def setup(self) -> dict:
        from microdreamer.jobs.batch import GenerateJob, MeshJob

        seconds = {}
        mesh = MeshJob(device=self.device)
        seconds.update({f"mesh {k}": v for k, v in mesh.setup().items()})
        self._device = mesh._device
        self._priors: dict[str, Any] = {}
        if self.load_model:
            from microdreamer.serve.inputs import base_config

            try:
                cfg = base_config("generate", "image", self.generate_config)
                gen = GenerateJob(
                    cfg, model=self.model, random_weights=self.random_weights, device=self.device
                )
                seconds.update({f"model {k}": v for k, v in gen.setup().items()})
                self._priors["image"] = gen._prior
                self.model_name = str(getattr(getattr(gen._prior, "config", None), "model", self.model))
            except Exception as e:  # mesh jobs still run; generate jobs fail with this line
                self.model_error = f"the model did not load: {one_line(e)}"
                logger.warning("%s", self.model_error)
        return seconds

    def info(self) -> dict:
        return {"device": str(getattr(self, "_device", self.device)), "model": self.model_name,
                "model_error": self.model_error, "pid": os.getpid()}  # fmt: skip

    def _prior(self, mode: str, cfg):
        if mode in self._priors:
            return self._priors[mode]
        if self.model_error is not None or not self.load_model:
            raise InputError(self.model_error or "this server was started without a model; generate jobs "
                             "cannot run")  # fmt: skip
        from microdreamer.jobs.generate import build_generate_prior

        prior = build_generate_prior(cfg, mode, self._device, None, self.random_weights)
        if cfg.warmup and hasattr(prior, "warmup"):
            prior.warmup(cfg.sir.views)
        self._priors[mode] = prior
        return prior

    def run_spec(self, spec: dict, send: Callable[[dict], None], cancelled: Callable[[], bool]) -> dict:
        """Run one job: ``spec`` = {"kind", "folder", "input", "prompt", "mode", "config", "extras"};
        writes ``<folder>/out/`` (staged, moved in at the end). Returns {"seconds", "summary"}.
        Raises InputError (bad input), :class:`Cancelled`, or anything a stage raises."""
        from microdreamer import progress
        from microdreamer.io_utils import staged_folder

        kind = spec["kind"]
        tracker = Tracker(MESH_PLAN if kind == "mesh" else GENERATE_PLAN, send, cancelled)
        stop = progress.subscribe(tracker.fraction)
        start = time.perf_counter()
        out = Path(spec["folder"]) / "out"
        try:
            with staged_folder(out) as stage:
                tracker.hide = {str(stage) + os.sep: "", str(spec["input"]): spec.get("name") or ""}
                if kind == "mesh":
                    result = self._mesh(spec, stage, tracker)
                else:
                    result = self._generate(spec, stage, tracker)
                tracker._check()  # a cancel during the last step: nothing moves into place
        finally:
            stop()
        result["seconds"]["job"] = time.perf_counter() - start
        return result

    def _mesh(self, spec: dict, stage: Path, tracker: Tracker) -> dict:
        from microdreamer.jobs.export import export_mesh
        from microdreamer.profiling import StageTimer
        from microdreamer.serve.inputs import read_splat
        from microdreamer.splat import Splat

        timer = StageTimer()
        tracker.say("reading the splat")
        with timer.stage("read"):
            splat = Splat.from_arrays(read_splat(spec["input"]))
        stage.mkdir(parents=True, exist_ok=True)
        fmt = spec.get("extras", {}).get("format", "glb")
        result = export_mesh(splat, stage / f"mesh.{fmt}", spec["config"], self._device, timer=timer,
                             progress=lambda f: tracker.fraction(None, f), name=spec["name"] or "splat",
                             stage=tracker.say)  # fmt: skip
        seconds = dict(timer.seconds)
        summary = {**result.summary(), "gaussians_in": result.convert.num_gaussians_in,
                   "gaussians_kept": result.convert.num_gaussians_kept, "up": result.up}  # fmt: skip
        from microdreamer.io_utils import atomic_path

        with atomic_path(stage / "timings.json") as tmp:
            tmp.write_text(
                json.dumps({"seconds": seconds, "mesh": summary, "device": str(self._device)}, indent=1)
            )
        return {"seconds": seconds, "summary": summary}

    def _generate(self, spec: dict, stage: Path, tracker: Tracker) -> dict:
        from microdreamer.jobs.generate import generate

        cfg = spec["config"]
        prior = self._prior(spec["mode"], cfg)
        cfg = dataclasses.replace(cfg, warmup=False)  # warmed up once, with the prior
        report = generate(spec["input"], stage, cfg, model=prior, device=self._device, random_weights=self.random_weights,
                          progress=lambda f: tracker.fraction(None, f), prompt=spec.get("prompt"),
                          stage=tracker.say)  # fmt: skip
        seconds = {k: float(v) for k, v in report.get("stages", {}).items()}
        summary = {k: report.get(k) for k in ("mode", "num_gaussians", "mesh_vertices", "mesh_faces", "model",
                                              "random_weights", "device")}  # fmt: skip
        return {"seconds": seconds, "summary": summary}


# ------------------------------------------------------------------------------------ local process
def worker_main(conn, job: ServeJob, gpu: int | None = None) -> None:
    """A local worker process: set up ``job`` once, then run the specs the server sends, one at a time.

    Messages from the server: ``("run", spec)``, ``("cancel", id)``, ``("stop",)``. To it: ``("ready",
    setup_seconds, info)`` or ``("setup_failed", line)``, then per job ``("progress", id, {stage,
    progress})`` and one of ``("done", id, result)``, ``("failed", id, line)``, ``("cancelled", id)``.
    """
    import signal

    signal.signal(
        signal.SIGINT, signal.SIG_IGN
    )  # Ctrl-C reaches the whole group: the server stops its workers
    if gpu is not None:  # before torch is imported
        os.environ["CUDA_VISIBLE_DEVICES"] = str(gpu)
    logging.basicConfig(level=logging.WARNING, format="worker %(process)d: %(message)s")
    from microdreamer import progress

    progress.configure("off")  # the server shows the progress; the listener hears it in any mode
    lock = threading.Lock()

    def send(message) -> None:
        with lock:
            conn.send(message)

    try:
        seconds = job.setup()
    except BaseException as e:
        send(("setup_failed", one_line(e)))
        return
    send(("ready", seconds, job.info()))
    inbox: queue.Queue = queue.Queue()
    current = [None]
    cancel = threading.Event()

    def reader() -> None:
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                message = ("stop",)
            if message[0] == "run":
                inbox.put(message[1])
            elif message[0] == "cancel":
                if message[1] == current[0]:
                    cancel.set()
            else:
                cancel.set()
                inbox.put(None)
                return

    threading.Thread(target=reader, name="microdreamer-worker-inbox", daemon=True).start()
    while True:
        spec = inbox.get()
        if spec is None:
            return
        job_id = spec["id"]
        cancel.clear()
        current[0] = job_id
        try:
            result = job.run_spec(spec, lambda update, i=job_id: send(("progress", i, update)), cancel.is_set)
            send(("done", job_id, result))
        except Cancelled:
            send(("cancelled", job_id))
        except Exception as e:
            if not isinstance(e, InputError):
                logger.warning("job %s failed:\n%s", job_id, traceback.format_exc())
            send(("failed", job_id, one_line(e)))
        finally:
            current[0] = None
