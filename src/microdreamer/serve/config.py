"""The service's settings (``microdreamer serve``): one dataclass, its fields the command's flags."""

from __future__ import annotations

from dataclasses import dataclass

from microdreamer.config import DEVICES, RANDOM_WEIGHTS, Config, setting

#: hosts that reach only this machine; any other --host warns
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


@dataclass
class ServeConfig(Config):
    """``microdreamer serve``: where it listens, what it loads once, and its limits.

    Attributes:
        host, port: the address the HTTP server binds (127.0.0.1 unless told otherwise).
        jobs_dir: the folder of the jobs: each job's input, outputs and record (``job.json``); kept across
            restarts.
        token: when set, every API request but ``/api/health`` needs ``Authorization: Bearer TOKEN``.
        model, random_weights: the image-to-3D model, loaded and warmed up once per worker (as
            ``generate --model`` / ``--random-weights``).
        generate_config: a GenerateConfig preset (YAML), the base of every generate job's settings.
        device: where the jobs compute.
        workers: worker processes, one job at a time each (one GPU each when there are GPUs).
        ray_address: run the workers as actors of the Ray cluster at this address instead.
        max_upload_mb: the largest upload accepted.
        job_timeout_s: a job running longer than this is stopped and marked failed.
        keep_jobs, keep_hours: finished jobs kept: the newest ``keep_jobs``, and none older than
            ``keep_hours`` (0: no age limit).
    """

    host: str = setting("127.0.0.1", "the address to listen on; another than 127.0.0.1 makes the service "
                        "reachable from other machines (a warning says so)")  # fmt: skip
    port: int = setting(8000, "the TCP port (0: a free one, printed)")
    jobs_dir: str = setting("microdreamer-jobs", "the jobs' folder: inputs, outputs and records, kept across "
                            "restarts")  # fmt: skip
    token: str | None = setting(None, "require the header 'Authorization: Bearer TOKEN' on the API (the page "
                                "asks for it once)")  # fmt: skip
    model: str | None = setting(None, "the image-to-3D model: a diffusers-format folder or a repo id in the "
                                "local Hugging Face cache (none: generate's default)")  # fmt: skip
    random_weights: str | None = setting(None, "use a randomly initialised model (timing and plumbing only: the "
                                         "output is noise)", choices=RANDOM_WEIGHTS)  # fmt: skip
    generate_config: str | None = setting(None, "a GenerateConfig preset (YAML): the base of every generate job's "
                                          "settings")  # fmt: skip
    device: str = setting(
        "auto", "where to compute: auto (CUDA when available), cpu or cuda", choices=DEVICES
    )
    workers: int = setting(1, "worker processes, each running one job at a time (one GPU each)")
    ray_address: str | None = setting(None, "run the workers on the Ray cluster at ADDR (host:port or auto); "
                                      "needs the distributed extra")  # fmt: skip
    max_upload_mb: float = setting(512.0, "the largest upload accepted, in MB")
    job_timeout_s: float = setting(3600.0, "a job running longer than this many seconds is stopped (failed)")
    keep_jobs: int = setting(200, "finished jobs kept (the oldest removed first)")
    keep_hours: float = setting(168.0, "finished jobs older than this many hours are removed (0: no limit)")

    def validate(self) -> None:
        self.require("port", 0 <= self.port <= 65535, "must be between 0 and 65535")
        self.require("host", bool(self.host.strip()), "must not be empty")
        self.require("jobs_dir", bool(self.jobs_dir.strip()), "must not be empty")
        if self.token is not None:
            self.require("token", len(self.token) >= 8 and self.token.isprintable() and " " not in self.token,
                         "must be at least 8 printable characters without spaces")  # fmt: skip
        if self.random_weights is not None:
            self.choose("random_weights", RANDOM_WEIGHTS)
            self.require("random_weights", self.model is None, "give --model or --random-weights, not both")
        self.choose("device", DEVICES)
        self.require("workers", self.workers >= 1, "must be at least 1")
        self.require("max_upload_mb", self.max_upload_mb > 0, "must be positive")
        self.require("job_timeout_s", self.job_timeout_s > 0, "must be positive")
        self.require("keep_jobs", self.keep_jobs >= 1, "must be at least 1")
        self.require("keep_hours", self.keep_hours >= 0, "must be 0 (no limit) or positive")

    @property
    def loopback(self) -> bool:
        return self.host in LOOPBACK_HOSTS

    @property
    def max_upload_bytes(self) -> int:
        return int(self.max_upload_mb * (1 << 20))
