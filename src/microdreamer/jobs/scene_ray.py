"""A scene's tiles on Ray workers (``microdreamer mesh SPLAT --tiles auto --workers N | --ray-address ADDR``).

:class:`RayTiles` is a :data:`~microdreamer.scene.tiles.TileMap`: the plan (the Gaussians in voxel units,
binned to the tiles) is put into Ray's object store once, one actor per worker (one GPU each, or one CPU
each where the cluster has none: :func:`~microdreamer.jobs.batch.ray_cluster`, the batches' set-up) takes
it once, and each task is a tile index; its result (the first pass's column maxima, or the tile's
:class:`~microdreamer.scene.tiles.TilePiece`) comes back in the order of the tiles, so the weld on the
driver sees what the serial run sees. The work folder (resume) is written by the workers: on a cluster of
several machines it must be on a filesystem every node sees, as a batch's OUT/ must.

An actor whose process dies is restarted (``max_restarts``) and its task retried once; a tile lost twice
stops the run with one line (the tiles finished so far stay in the work folder).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from collections.abc import Callable, Iterator, Sequence

from microdreamer.errors import InputError

logger = logging.getLogger(__name__)


class _TileWorker:
    """A Ray actor holding the plan: runs one tile's work per call."""

    def __init__(self, plan, threads: int) -> None:
        import torch

        torch.set_num_threads(threads)
        self.plan = plan

    def run(self, fn: Callable, t: int, kwargs: dict):
        from microdreamer.scene.tiles import MemoryCounter

        counter, seconds = MemoryCounter(), {}
        return fn(self.plan, t, counter=counter, seconds=seconds, **kwargs), counter, seconds

    def who(self) -> str:
        return f"{os.getpid()}@{socket.gethostname()}"


class RayTiles:
    """The tiles' work on Ray actors; a context manager (the cluster it starts is stopped on exit).

    Args:
        workers: actors (default: one per GPU of the cluster; required where it has none).
        address: an existing cluster ("auto" or "host:port"); None starts a local one.
        device: "auto", "cpu" or "cuda": where there are GPUs and ``device`` is not "cpu", one GPU an actor.
        init_kwargs: more ``ray.init`` arguments (tests).

    Attributes (inside the ``with``):
        workers: the actors the cluster's layout allows (the run starts at most one per tile).
        threads: the CPU threads each actor's kernels use (the cluster's CPUs over the workers).
    """

    def __init__(
        self,
        workers: int | None = None,
        address: str | None = None,
        device: str = "auto",
        init_kwargs: dict | None = None,
    ) -> None:
        self._args = (workers, address, device, init_kwargs)
        self._cluster = None
        self._plan = None
        self._actors: list = []
        self.workers = workers or 0
        self.threads = 1

    def __enter__(self) -> RayTiles:
        from microdreamer.jobs.batch import ray_cluster

        self._cluster = ray_cluster(*self._args)
        self._ray, self.workers, self._resources = self._cluster.__enter__()
        cpus = int(self._ray.cluster_resources().get("CPU", 1))
        self.threads = max(1, cpus // self.workers)
        return self

    def __exit__(self, *exc) -> bool:
        for actor in self._actors:  # a cluster this process did not start keeps running
            with contextlib.suppress(Exception):
                self._ray.kill(actor)
        self._actors, self._plan = [], None
        return bool(self._cluster.__exit__(*exc))

    def _start(self, plan, tiles: int) -> None:
        """The actors for ``plan`` (put into the object store once), at most one per tile."""
        ray = self._ray
        for actor in self._actors:
            ray.kill(actor)
        ref = ray.put(plan)
        cls = ray.remote(max_restarts=-1, max_task_retries=1, **self._resources)(_TileWorker)
        self._actors = [cls.remote(ref, self.threads) for _ in range(max(1, min(self.workers, tiles)))]
        self._plan = plan
        who = ray.get([a.who.remote() for a in self._actors])
        logger.info("tiles on %d Ray workers (%d threads each): %s", len(who), self.threads, ", ".join(who))

    def __call__(self, fn: Callable, plan, tiles: Sequence[int], kwargs: dict) -> Iterator[tuple]:
        from ray.util import ActorPool

        if self._cluster is None:
            raise RuntimeError("RayTiles runs inside its with-block")
        if not tiles:
            return
        if plan is not self._plan:
            self._start(plan, len(tiles))
        ray = self._ray
        pool = ActorPool(self._actors)
        for t in tiles:
            pool.submit(lambda actor, t: actor.run.remote(fn, t, kwargs), t)
        for t in tiles:  # in submission order: the tiles' order
            try:
                yield pool.get_next()
            except ray.exceptions.RayTaskError as e:  # the tile's own error, as the serial run raises it
                raise e.as_instanceof_cause() from None
            except ray.exceptions.RayError as e:  # its worker died twice, or Ray itself failed
                first = (str(e).strip().splitlines() or [""])[0]
                raise InputError(f"tile {t}: the Ray worker was lost ({type(e).__name__}: {first}); run the "
                                 "command again to resume from the finished tiles") from None  # fmt: skip
