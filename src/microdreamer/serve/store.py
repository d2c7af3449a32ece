"""The jobs folder: one folder per job, its record (``job.json``), its input and its outputs.

Layout of ``jobs_dir``::

    <id>/job.json        the record (:class:`JobRecord`), rewritten atomically at each change of status or stage
    <id>/input/<name>    the upload, under a cleaned name
    <id>/out/            the outputs; staged beside it while the job runs and moved in only when it succeeds
    <id>/viewer/         the result's viewer page, built on its first request
    .incoming/           uploads being checked (removed whether they pass or not)

A job folder appears whole: it is assembled under a hidden name and renamed into place. Every path a
request names is checked here: ids are 16 hex digits, file names one plain component (no ``/``, no leading
dot), and every component on the way is a real folder or a regular file, never a symbolic link
(:meth:`JobStore.resolve`). The folders are read back at start (:meth:`JobStore.load`): finished jobs are
listed again, a job that was running is marked failed and its partial outputs removed.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import secrets
import shutil
import stat
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from microdreamer.io_utils import atomic_path

logger = logging.getLogger(__name__)

ID_PATTERN = re.compile(r"[0-9a-f]{16}")
#: one path component a request may name: no separator, no leading dot (so neither "." nor ".."), short
NAME_PATTERN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,127}")
STATUSES = ("queued", "running", "done", "failed", "cancelled")
FINISHED = ("done", "failed", "cancelled")
RECORD = "job.json"
INTERRUPTED = "the server stopped while this job was running; submit it again"


def clean_name(name: str | None, default: str = "input") -> str:
    """An upload's file name as one safe path component: its last component, characters outside
    ``[A-Za-z0-9_.+-]`` replaced by ``_``, no leading dots, at most 100 characters (the suffix kept)."""
    base = re.split(r"[\\/]", name or "")[-1]
    base = re.sub(r"[^A-Za-z0-9_.+-]", "_", base).lstrip(".")
    if len(base) > 100:
        stem, dot, suffix = base.rpartition(".")
        base = (stem[: 100 - len(suffix) - 1] + dot + suffix) if dot and len(suffix) < 16 else base[:100]
    return base if NAME_PATTERN.fullmatch(base) else default


@dataclass
class JobRecord:
    """One job, as ``job.json`` holds it and the API shows it.

    Attributes:
        id: 16 hex digits.
        kind: "mesh" or "generate".
        status: one of :data:`STATUSES`.
        stage: what the job is doing (a line; "queued", the job's own stage messages, "done").
        progress: fraction done, 0-1 (never decreases while the job runs).
        error: the one-line error of a failed job.
        files: the output files' names (in ``out/``), once done.
        seconds: the job's seconds per stage, and ``job`` (its whole in-process time), ``queued`` (waiting)
            and ``wall`` (submitted -> finished).
        created, started, finished: Unix times.
        input: the upload's cleaned name (None for text-to-3D), prompt: the text, options: as given.
        mode: generate's mode ("image", "text", "image+text"), None for mesh.
        worker: which worker ran it.
        summary: the job's numbers (Gaussians, vertices, faces, grid...), once done.
    """

    id: str
    kind: str
    status: str = "queued"
    stage: str = "queued"
    progress: float = 0.0
    error: str | None = None
    files: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    created: float = field(default_factory=time.time)
    started: float | None = None
    finished: float | None = None
    input: str | None = None
    prompt: str | None = None
    options: dict = field(default_factory=dict)
    mode: str | None = None
    worker: str | None = None
    summary: dict = field(default_factory=dict)

    @property
    def done(self) -> bool:
        return self.status in FINISHED

    def public(self, position: int | None = None) -> dict:
        """What ``GET /api/jobs/{id}`` returns: the record and the queue position (1 = next to start,
        None when not queued)."""
        return {**asdict(self), "position": position}

    @classmethod
    def from_dict(cls, data: dict) -> JobRecord:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


class JobStore:
    """The jobs folder and the records of its jobs, shared by the request handlers and the workers.

    Every change goes through :meth:`update` (under one lock), which calls the ``on_change`` listeners
    (the event streams wake on them).
    """

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root)
        self._lock = threading.RLock()
        self._jobs: dict[str, JobRecord] = {}
        self._listeners: list[Callable[[], None]] = []

    # ------------------------------------------------------------------ records
    def on_change(self, listener: Callable[[], None]) -> None:
        self._listeners.append(listener)

    def changed(self) -> None:
        for listener in list(self._listeners):
            listener()

    def load(self) -> list[JobRecord]:
        """Read the jobs folder (created if missing): every job folder's record. Jobs that were running are
        marked failed (:data:`INTERRUPTED`), partial outputs and unfinished uploads removed. Returns the
        queued jobs, oldest first (the caller queues them again)."""
        self.root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(self.root / ".incoming", ignore_errors=True)
        for leftover in self.root.glob(".*.tmp"):  # a job folder that was being assembled
            shutil.rmtree(leftover, ignore_errors=True)
        with self._lock:
            for entry in sorted(os.scandir(self.root), key=lambda e: e.name):
                if not ID_PATTERN.fullmatch(entry.name) or not entry.is_dir(follow_symlinks=False):
                    continue
                folder = Path(entry.path)
                try:
                    record = JobRecord.from_dict(json.loads((folder / RECORD).read_text()))
                except (OSError, ValueError, TypeError) as e:
                    logger.warning("%s: no readable job record (%s); left alone", folder, e)
                    continue
                if record.id != entry.name:
                    continue
                for partial in folder.glob(".out.tmp-*"):
                    shutil.rmtree(partial, ignore_errors=True)
                if record.status == "running":
                    record.status, record.error, record.stage = "failed", INTERRUPTED, "failed"
                    record.finished = time.time()
                    self._write(record)
                self._jobs[record.id] = record
            self._jobs = dict(sorted(self._jobs.items(), key=lambda kv: kv[1].created))
            return [r for r in self._jobs.values() if r.status == "queued"]

    def get(self, job_id: str) -> JobRecord | None:
        with self._lock:
            return self._jobs.get(job_id) if ID_PATTERN.fullmatch(job_id or "") else None

    def recent(self, limit: int = 50) -> list[JobRecord]:
        """The newest ``limit`` jobs, newest first."""
        with self._lock:
            return list(reversed(list(self._jobs.values())))[:limit]

    def update(self, job_id: str, persist: bool = True, **changes) -> JobRecord | None:
        """Set fields of a job's record; written to ``job.json`` when ``persist`` (progress alone is not)."""
        with self._lock:
            record = self._jobs.get(job_id)
            if record is None:
                return None
            for k, v in changes.items():
                setattr(record, k, v)
            if persist:
                self._write(record)
        self.changed()
        return record

    def _write(self, record: JobRecord) -> None:
        folder = self.root / record.id
        if not folder.is_dir():
            return
        with atomic_path(folder / RECORD) as tmp:
            tmp.write_text(json.dumps(asdict(record), indent=1))

    # ------------------------------------------------------------------ folders
    def folder(self, job_id: str) -> Path:
        if not ID_PATTERN.fullmatch(job_id):
            raise ValueError(f"not a job id: {job_id!r}")
        return self.root / job_id

    def out_folder(self, job_id: str) -> Path:
        return self.folder(job_id) / "out"

    @contextlib.contextmanager
    def incoming(self) -> Iterator[Path]:
        """A fresh folder for an upload being checked; removed when the block ends."""
        folder = self.root / ".incoming" / secrets.token_hex(8)
        folder.mkdir(parents=True)
        try:
            yield folder
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def create(self, record: JobRecord, upload: Path | None) -> JobRecord:
        """Make the job's folder (record, and ``upload`` moved into ``input/``) under a hidden name and
        rename it into place; then the record is known."""
        final = self.folder(record.id)
        tmp = self.root / f".{record.id}.tmp"
        try:
            (tmp / "input").mkdir(parents=True)
            if upload is not None:
                os.replace(upload, tmp / "input" / record.input)
            with atomic_path(tmp / RECORD) as t:
                t.write_text(json.dumps(asdict(record), indent=1))
            os.replace(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        with self._lock:
            self._jobs[record.id] = record
        self.changed()
        return record

    def new_id(self) -> str:
        while True:
            job_id = secrets.token_hex(8)
            if job_id not in self._jobs and not (self.root / job_id).exists():
                return job_id

    def input_path(self, record: JobRecord) -> Path | None:
        return None if record.input is None else self.folder(record.id) / "input" / record.input

    def delete(self, job_id: str) -> bool:
        """Remove a finished job: its folder first renamed away (so it vanishes at once), then deleted."""
        with self._lock:
            record = self._jobs.get(job_id)
            if record is None or not record.done:
                return False
            del self._jobs[job_id]
            folder = self.folder(job_id)
            trash = self.root / f".{job_id}.deleted.tmp"
            with contextlib.suppress(OSError):
                os.replace(folder, trash)
        shutil.rmtree(trash, ignore_errors=True)
        self.changed()
        return True

    def prune(self, keep: int, max_age_s: float | None) -> list[str]:
        """Delete finished jobs beyond the newest ``keep``, and those finished more than ``max_age_s`` ago
        (None or 0: no age limit); queued and running jobs are never pruned. Returns the ids deleted."""
        now = time.time()
        with self._lock:
            finished = [r for r in self._jobs.values() if r.done]
            old = finished[: max(0, len(finished) - keep)]
            if max_age_s:
                old += [r for r in finished if now - (r.finished or r.created) > max_age_s and r not in old]
            ids = [r.id for r in old]
        return [i for i in ids if self.delete(i)]

    def resolve(self, job_id: str, *parts: str) -> Path | None:
        """The regular file ``<id>/<parts...>`` when every component is a plain name
        (:data:`NAME_PATTERN`) and every folder on the way and the file itself are real (no symbolic
        links); else None. Nothing outside the job's folder can be named."""
        if not ID_PATTERN.fullmatch(job_id or "") or not parts:
            return None
        if not all(NAME_PATTERN.fullmatch(p or "") for p in parts):
            return None
        path = self.root / job_id
        for i, part in enumerate((None, *parts)):
            if part is not None:
                path = path / part
            try:
                mode = os.lstat(path).st_mode
            except OSError:
                return None
            last = i == len(parts)
            if not (stat.S_ISREG(mode) if last else stat.S_ISDIR(mode)):
                return None
        return path

    def list_files(self, job_id: str) -> list[str]:
        """The regular files of the job's ``out/`` folder (symbolic links and hidden names left out)."""
        out = self.out_folder(job_id)
        try:
            if not stat.S_ISDIR(os.lstat(out).st_mode):
                return []
            return sorted(e.name for e in os.scandir(out)
                          if NAME_PATTERN.fullmatch(e.name) and e.is_file(follow_symlinks=False))  # fmt: skip
        except OSError:
            return []
