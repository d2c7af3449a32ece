"""The queue and the workers of the service, on the server's side.

One first-in-first-out queue of job ids; each worker takes the next job when it is free and runs one at a
time (:class:`Scheduler`). A worker is a process of its own (:class:`LocalWorker`, one GPU each when
there are several: ``CUDA_VISIBLE_DEVICES``) or a Ray actor (:class:`RayWorker`, ``--ray-address``); either
way a thread of the server drives it: sends the job, turns its reports into the job's record, enforces the
time limit and cancellation. A job is cancelled at its next progress report; one that does not stop
within :data:`CANCEL_GRACE_S` (a long step without reports) has its worker killed and restarted, so a
cancel or a time limit always ends the job. A worker that dies fails its job and is started again.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from pathlib import Path

from microdreamer.serve.config import ServeConfig
from microdreamer.serve.runner import ServeJob
from microdreamer.serve.store import JobStore

logger = logging.getLogger(__name__)

#: seconds a cancelled (or timed-out) job has to stop by itself before its worker is killed
CANCEL_GRACE_S = 10.0
#: how often a worker's driver looks at the clock while its job runs
POLL_S = 0.05


class Scheduler:
    """The FIFO queue and the workers: :meth:`submit`, :meth:`cancel`, :meth:`position`."""

    def __init__(self, store: JobStore, settings: ServeConfig) -> None:
        self.store, self.settings = store, settings
        self._queue: collections.deque[str] = collections.deque()
        self._cond = threading.Condition()
        self._stopping = False
        self.workers: list = []
        self.specs: dict[str, dict] = {}  # job id -> what its worker needs (kept until it starts)

    def start(self, make_job) -> None:
        n = self.settings.workers
        if self.settings.ray_address:
            self.workers = [RayWorker(i, self, make_job()) for i in range(n)]
        else:
            gpus = n > 1 and self.settings.device != "cpu"
            self.workers = [LocalWorker(i, self, make_job(), gpu=i if gpus else None) for i in range(n)]
        for w in self.workers:
            w.start()

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        for w in self.workers:
            w.stop()

    def submit(self, job_id: str, spec: dict) -> None:
        with self._cond:
            self.specs[job_id] = spec
            self._queue.append(job_id)
            self._cond.notify_all()
        self.store.changed()

    def position(self, job_id: str) -> int | None:
        """1 for the next job to start, 2 for the one after...; None when not queued."""
        with self._cond:
            try:
                return self._queue.index(job_id) + 1
            except ValueError:
                return None

    def next_job(self, timeout: float = 0.5) -> tuple[str, dict] | None:
        """The next queued job (taken off the queue), or None after ``timeout`` or when stopping."""
        with self._cond:
            if not self._queue and not self._stopping:
                self._cond.wait(timeout)
            if self._stopping or not self._queue:
                return None
            job_id = self._queue.popleft()
            spec = self.specs.pop(job_id)
        self.store.changed()  # the others moved up
        return job_id, spec

    def cancel(self, job_id: str) -> str | None:
        """Cancel a queued job (at once) or a running one (its worker is told); returns the job's status
        after the call, None when it is neither queued nor running."""
        with self._cond:
            if job_id in self._queue:
                self._queue.remove(job_id)
                self.specs.pop(job_id, None)
                queued = True
            else:
                queued = False
        if queued:
            self.store.update(job_id, status="cancelled", stage="cancelled", finished=time.time())
            return "cancelled"
        for w in self.workers:
            if w.request_cancel(job_id):
                return "running"
        return None

    def health(self) -> list[dict]:
        return [w.health() for w in self.workers]


class _Driver:
    """What both kinds of workers share: the thread that takes jobs and turns reports into records."""

    def __init__(self, index: int, scheduler: Scheduler, job: ServeJob) -> None:
        self.index, self.scheduler, self.job = index, scheduler, job
        self.store = scheduler.store
        self.state = "starting"  # starting | ready | failed | stopped
        self.info: dict = {}
        self.setup_seconds: dict = {}
        self.error: str | None = None
        self.current: str | None = None
        self._cancel: dict[str, str] = {}  # job id -> reason ("cancelled" or the time-limit line)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"microdreamer-worker-{index}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=CANCEL_GRACE_S + 5)
        self._shutdown()

    def request_cancel(self, job_id: str) -> bool:
        if self.current != job_id:
            return False
        self._cancel.setdefault(job_id, "cancelled")
        return True

    def health(self) -> dict:
        return {"worker": self.index, "state": self.state, "job": self.current, "error": self.error,
                "setup_seconds": self.setup_seconds, **self.info}  # fmt: skip

    # -------------------------------------------------------------- the loop
    def _loop(self) -> None:
        while not self._stop.is_set():
            if self.state != "ready":
                if not self._bring_up():
                    self._stop.wait(5.0)
                    continue
            taken = self.scheduler.next_job()
            if taken is None:
                continue
            self._run(*taken)

    def _bring_up(self) -> bool:
        self.state = "starting"
        try:
            self.setup_seconds, self.info = self._launch()
        except Exception as e:
            self.state, self.error = "failed", str(e)
            logger.warning("worker %d did not start: %s", self.index, e)
            return False
        self.state, self.error = "ready", None
        self.store.changed()
        return True

    def _run(self, job_id: str, spec: dict) -> None:
        settings = self.scheduler.settings
        record = self.store.get(job_id)
        if record is None or record.done:
            return
        self.current = job_id
        started = time.time()
        self.store.update(job_id, status="running", stage="starting", started=started,
                          worker=f"{self.index}@{self.info.get('pid', '?')}",
                          seconds={"queued": started - record.created})  # fmt: skip
        outcome = None
        deadline = time.monotonic() + settings.job_timeout_s
        kill_at = None
        try:
            self._send_job(spec)
            while outcome is None:
                for message in self._receive(POLL_S):
                    outcome = self._handle(job_id, message) or outcome
                if outcome is not None:
                    break
                if self._stop.is_set():  # the server stops: the job is interrupted, its worker ended below
                    from microdreamer.serve.store import INTERRUPTED

                    self._kill()
                    outcome = ("failed", INTERRUPTED)
                    break
                if not self._alive():
                    outcome = ("failed", f"the worker process ended while running the job "
                                          f"({self._exit_note()}); submit it again")  # fmt: skip
                    break
                now = time.monotonic()
                if now > deadline and job_id not in self._cancel:
                    self._cancel[job_id] = (f"stopped after the server's time limit of {settings.job_timeout_s:g} s "
                                            "per job; give smaller settings")  # fmt: skip
                if job_id in self._cancel and kill_at is None:
                    self._send_cancel(job_id)
                    kill_at = now + CANCEL_GRACE_S
                if kill_at is not None and now > kill_at:
                    logger.warning("job %s did not stop within %g s; restarting worker %d", job_id,
                                   CANCEL_GRACE_S, self.index)  # fmt: skip
                    self._kill()
                    self.state = "starting"
                    outcome = ("cancelled",)
        except Exception as e:  # the link to the worker broke
            logger.warning("worker %d: %r", self.index, e)
            self._kill()
            self.state = "starting"
            outcome = ("failed", f"the worker was lost ({type(e).__name__}); submit it again")
        finally:
            self.current = None
        self._finish(job_id, outcome, spec)

    def _handle(self, job_id: str, message) -> tuple | None:
        kind = message[0]
        if kind == "progress" and message[1] == job_id:
            self.store.update(job_id, persist=False, **message[2])
            return None
        if kind in ("done", "failed", "cancelled") and message[1] == job_id:
            return (kind, *message[2:])
        return None

    def _finish(self, job_id: str, outcome: tuple, spec: dict) -> None:
        from microdreamer.serve.inputs import scrub

        record = self.store.get(job_id)
        if record is None:
            return
        finished = time.time()
        seconds = dict(record.seconds)
        reason = self._cancel.pop(job_id, None)
        for partial in Path(spec["folder"]).glob(".out.tmp-*"):  # a killed worker's staged outputs
            import shutil

            shutil.rmtree(partial, ignore_errors=True)
        kind = outcome[0]
        if kind == "done":
            result = outcome[1]
            seconds.update(result.get("seconds", {}))
            seconds["wall"] = finished - record.created
            self.store.update(job_id, status="done", stage="done", progress=1.0, finished=finished,
                              seconds=seconds, files=self.store.list_files(job_id),
                              summary=result.get("summary", {}))  # fmt: skip
        elif kind == "cancelled" and reason not in (None, "cancelled"):  # the time limit
            self.store.update(job_id, status="failed", stage="failed", error=reason, finished=finished)
        elif kind == "cancelled":
            self.store.update(job_id, status="cancelled", stage="cancelled", finished=finished)
        else:
            error = scrub(scrub(outcome[1], spec.get("input"), spec.get("name")), Path(spec["folder"]), "")
            self.store.update(job_id, status="failed", stage="failed", error=error, finished=finished)
        settings = self.scheduler.settings
        self.store.prune(settings.keep_jobs, settings.keep_hours * 3600 or None)

    # -------------------------------------------------------------- transport (per kind of worker)
    def _launch(self) -> tuple[dict, dict]:
        raise NotImplementedError

    def _send_job(self, spec: dict) -> None:
        raise NotImplementedError

    def _send_cancel(self, job_id: str) -> None:
        raise NotImplementedError

    def _receive(self, timeout: float) -> list:
        raise NotImplementedError

    def _alive(self) -> bool:
        raise NotImplementedError

    def _exit_note(self) -> str:
        return "it died"

    def _kill(self) -> None:
        raise NotImplementedError

    def _shutdown(self) -> None:
        self._kill()


class LocalWorker(_Driver):
    """A worker process of this machine (multiprocessing, spawned: a fresh interpreter)."""

    def __init__(self, index: int, scheduler: Scheduler, job: ServeJob, gpu: int | None = None) -> None:
        super().__init__(index, scheduler, job)
        self.gpu = gpu
        self.process = None
        self.conn = None

    def _launch(self) -> tuple[dict, dict]:
        import multiprocessing as mp

        from microdreamer.serve.runner import worker_main

        self._kill()
        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe()
        self.process = ctx.Process(target=worker_main, args=(child, self.job, self.gpu),
                                   name=f"microdreamer-worker-{self.index}", daemon=True)  # fmt: skip
        self.process.start()
        child.close()
        self.conn = parent
        while True:  # the setup: imports, kernels, the model (minutes for a large model on a CPU)
            if self._stop.is_set():
                raise RuntimeError("stopping")
            if parent.poll(0.5):
                message = parent.recv()
                if message[0] == "ready":
                    return message[1], message[2]
                raise RuntimeError(message[1])
            if not self.process.is_alive():
                raise RuntimeError(f"the worker process ended during its setup ({self._exit_note()})")

    def _send_job(self, spec: dict) -> None:
        self.conn.send(("run", spec))

    def _send_cancel(self, job_id: str) -> None:
        self.conn.send(("cancel", job_id))

    def _receive(self, timeout: float) -> list:
        out = []
        if self.conn.poll(timeout):
            while self.conn.poll():
                out.append(self.conn.recv())
        return out

    def _alive(self) -> bool:
        return self.process is not None and self.process.is_alive()

    def _exit_note(self) -> str:
        code = None if self.process is None else self.process.exitcode
        return f"exit code {code}" if code is not None else "it died"

    def _kill(self) -> None:
        if self.process is not None and self.process.is_alive():
            self.process.kill()
            self.process.join(timeout=10)
        if self.conn is not None:
            self.conn.close()
        self.process, self.conn = None, None

    def _shutdown(self) -> None:
        if self.process is not None and self.process.is_alive() and self.conn is not None:
            try:
                self.conn.send(("stop",))
                self.process.join(timeout=5)
            except OSError:
                pass
        self._kill()
        self.state = "stopped"


class RayWorker(_Driver):
    """A worker that is an actor of a Ray cluster (the batches' actor, :class:`~microdreamer.jobs.batch._Worker`,
    with the service's methods): one GPU each when the cluster has GPUs, else one CPU."""

    def __init__(self, index: int, scheduler: Scheduler, job: ServeJob) -> None:
        super().__init__(index, scheduler, job)
        self.actor = None
        self.ref = None
        self._dead = False

    def _launch(self) -> tuple[dict, dict]:
        from microdreamer.jobs import batch

        ray = batch.import_ray("--ray-address")
        if not ray.is_initialized():
            ray.init(address=self.scheduler.settings.ray_address, include_dashboard=False,
                     logging_level=logging.WARNING)  # fmt: skip
        gpus = int(ray.cluster_resources().get("GPU", 0))
        resources = {"num_gpus": 1} if gpus and self.job.device != "cpu" else {"num_cpus": 1}
        cls = ray.remote(max_concurrency=4, **resources)(_serve_actor_class())
        self.actor = cls.remote(self.job)
        error, seconds, who = ray.get(self.actor.ready.remote())
        if error:
            raise RuntimeError(error)
        info = ray.get(self.actor.info.remote())
        return seconds, {**info, "pid": who}

    def _send_job(self, spec: dict) -> None:
        self._dead = False
        self.ref = self.actor.run_spec.remote(spec)

    def _send_cancel(self, job_id: str) -> None:
        self.actor.cancel.remote(job_id)

    def _receive(self, timeout: float) -> list:
        import ray

        out = list(ray.get(self.actor.poll.remote()))
        if self.ref is not None:
            done, _ = ray.wait([self.ref], timeout=timeout)
            if done:
                try:
                    out += list(ray.get(self.actor.poll.remote())) + [ray.get(self.ref)]
                except ray.exceptions.RayError:
                    self._dead = True
                self.ref = None
        return out

    def _alive(self) -> bool:
        return not self._dead

    def _kill(self) -> None:
        if self.actor is not None:
            import ray

            ray.kill(self.actor)
        self.actor, self.ref = None, None


def _serve_actor_class():
    from microdreamer.jobs.batch import _Worker

    class _ServeActor(_Worker):
        """The batches' Ray actor (one job, set up once) with the service's calls: run a spec in a thread,
        poll its reports, cancel it."""

        def __init__(self, job: ServeJob) -> None:
            super().__init__(job)
            self.reports: list = []
            self.cancelled: set = set()
            self.lock = threading.Lock()

        def info(self) -> dict:
            return self.job.info()

        def poll(self) -> list:
            with self.lock:
                out, self.reports = self.reports, []
            return out

        def cancel(self, job_id: str) -> None:
            self.cancelled.add(job_id)

        def run_spec(self, spec: dict) -> tuple:
            from microdreamer.serve.runner import Cancelled, one_line

            job_id = spec["id"]

            def send(update: dict) -> None:
                with self.lock:
                    self.reports.append(("progress", job_id, update))

            try:
                return ("done", job_id, self.job.run_spec(spec, send, lambda: job_id in self.cancelled))
            except Cancelled:
                return ("cancelled", job_id)
            except Exception as e:
                return ("failed", job_id, one_line(e))

    return _ServeActor
