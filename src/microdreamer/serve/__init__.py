"""``microdreamer serve``: the jobs of the command line as a warm service, with a web page and an HTTP API.

The command line and the service are two front doors to one set of jobs (:mod:`microdreamer.jobs`):

* :mod:`.config` — :class:`~.config.ServeConfig`, the command's settings;
* :mod:`.inputs` — a request's file and options checked by the CLI's own readers and config classes;
* :mod:`.store` — the jobs folder: records, inputs, outputs, safe paths, retention, restart;
* :mod:`.runner` — the worker side: set up once (the model loaded and warmed up), run one job at a time;
* :mod:`.workers` — the FIFO queue and the workers (local processes, or Ray actors);
* :mod:`.app` — the ASGI app (FastAPI; uvicorn serves it) and ``static/``, the page.

Importing this package imports neither FastAPI nor torch (``pip install -e ".[serve]"`` brings the first).
"""

from __future__ import annotations

from microdreamer.serve.config import ServeConfig

__all__ = ["ServeConfig", "serve"]

MISSING = 'the service needs FastAPI and uvicorn: pip install -e ".[serve]" (or pip install fastapi uvicorn python-multipart)'


def serve(settings: ServeConfig, announce=print) -> None:
    """Run the service until interrupted (:func:`microdreamer.serve.app.run_server`)."""
    from microdreamer.errors import InputError

    try:
        import fastapi  # noqa: F401
        import multipart  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise InputError(MISSING) from None
    from microdreamer.serve.app import run_server

    run_server(settings, announce)
