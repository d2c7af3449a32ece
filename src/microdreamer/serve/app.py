"""The HTTP side of ``microdreamer serve``: the ASGI app (FastAPI), its routes and the page.

Routes (``/docs`` shows them, ``/openapi.json`` describes them)::

    GET    /                                the page (static/index.html)
    GET    /api/health                      {"status": "ok", "device", "model", "workers": [...], "queued"}
    POST   /api/jobs                        multipart: kind, file, prompt, options -> 202 {"id", ...}
    GET    /api/jobs                        {"jobs": [...]}: the recent jobs, newest first
    GET    /api/jobs/{id}                   {"status", "stage", "progress", "position", "error", "files", "seconds", ...}
    GET    /api/jobs/{id}/events            server-sent events: the same object at each change, until finished
    GET    /api/jobs/{id}/files/{name}      an output file
    GET    /api/jobs/{id}/viewer/{path}     the result in the project's viewer (built on first request)
    DELETE /api/jobs/{id}                   cancel a queued or running job; delete a finished one

Errors are ``{"error": "<one line>"}`` with a 4xx status: 400 bad input (the CLI's message), 401 no or a
wrong token, 404 unknown job or file, 409 not yet available, 413 upload too large.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Annotated

from fastapi import FastAPI, File, Form, HTTPException, Request, UploadFile
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from microdreamer import __version__
from microdreamer.errors import InputError
from microdreamer.formats import SPLAT_SUFFIXES
from microdreamer.serve import inputs
from microdreamer.serve.config import ServeConfig
from microdreamer.serve.runner import ServeJob
from microdreamer.serve.store import JobRecord, JobStore, clean_name
from microdreamer.serve.workers import Scheduler

logger = logging.getLogger(__name__)

STATIC = Path(__file__).resolve().parent / "static"
PAGE_FILES = {"serve.js": "text/javascript", "serve.css": "text/css"}
MAX_PROMPT = 2000
#: seconds between keep-alive comments of an event stream
KEEPALIVE_S = 15.0
_MIME = {".glb": "model/gltf-binary", ".ply": "application/octet-stream", ".obj": "text/plain",
         ".mtl": "text/plain", ".png": "image/png", ".json": "application/json", ".js": "text/javascript",
         ".css": "text/css", ".html": "text/html; charset=utf-8"}  # fmt: skip


class Notifier:
    """Wakes the event streams (in the server's event loop) when any record changes (in any thread)."""

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self.event: asyncio.Event | None = None

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop, self.event = loop, asyncio.Event()

    def notify(self) -> None:
        if self.loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop has closed
                self.loop.call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        old, self.event = self.event, asyncio.Event()
        old.set()

    def current(self) -> asyncio.Event:
        return self.event


class Service:
    """The jobs folder, the queue and the workers, started and stopped with the app."""

    def __init__(self, settings: ServeConfig, load_model: bool = True) -> None:
        self.settings = settings
        self.store = JobStore(settings.jobs_dir)
        self.scheduler = Scheduler(self.store, settings)
        self.notifier = Notifier()
        self.store.on_change(self.notifier.notify)
        self.load_model = load_model
        self._viewer_locks: dict[str, threading.Lock] = {}
        self.submit_lock = threading.Lock()
        self._presets: dict = {}

    def start(self) -> None:
        requeue = self.store.load()
        s = self.settings
        self.store.prune(s.keep_jobs, s.keep_hours * 3600 or None)
        self.scheduler.start(lambda: ServeJob(device=s.device, model=s.model, random_weights=s.random_weights,
                                              generate_config=s.generate_config, load_model=self.load_model))  # fmt: skip
        for record in requeue:
            try:
                self.scheduler.submit(record.id, self.spec(record, self._config_of(record)))
            except InputError as e:
                self.store.update(
                    record.id, status="failed", stage="failed", error=str(e), finished=time.time()
                )

    def stop(self) -> None:
        running = [w.current for w in self.scheduler.workers if w.current]
        self.scheduler.stop()
        for job_id in running:  # the workers are gone: what they ran did not finish
            record = self.store.get(job_id)
            if record is not None and not record.done:
                from microdreamer.serve.store import INTERRUPTED

                self.store.update(
                    job_id, status="failed", stage="failed", error=INTERRUPTED, finished=time.time()
                )

    def public(self, record: JobRecord) -> dict:
        return record.public(self.scheduler.position(record.id))

    def base(self, kind: str, mode: str | None):
        key = (kind, mode)
        if key not in self._presets:
            self._presets[key] = inputs.base_config(kind, mode, self.settings.generate_config)
        return self._presets[key]

    def _config_of(self, record: JobRecord):
        cfg, extras = inputs.job_config(record.kind, record.options, self.base(record.kind, record.mode))
        return cfg, extras

    def spec(self, record: JobRecord, config_extras) -> dict:
        cfg, extras = config_extras
        folder = self.store.folder(record.id)
        return {"id": record.id, "kind": record.kind, "folder": str(folder), "name": record.input,
                "input": None if record.input is None else str(self.store.input_path(record)),
                "prompt": record.prompt, "mode": record.mode, "config": cfg, "extras": extras}  # fmt: skip

    def viewer(self, job_id: str) -> None:
        """Build the job's viewer folder (``<id>/viewer/``) once: its outputs side by side (a mesh job's
        mesh beside its input splat), with its timings; no server path appears in the page."""
        from microdreamer.viewer import build_viewer

        lock = self._viewer_locks.setdefault(job_id, threading.Lock())
        with lock:
            folder = self.store.folder(job_id)
            if (folder / "viewer" / "index.html").is_file():
                return
            record = self.store.get(job_id)
            name = Path(record.input).stem if record.input else "text-to-3D"
            shown = folder / ".viewer-src" / (clean_name(name, "job") or "job")
            shutil.rmtree(folder / ".viewer-src", ignore_errors=True)
            shown.mkdir(parents=True)
            try:
                sources = [self.store.out_folder(job_id) / f for f in self.store.list_files(job_id)]
                source = self.store.input_path(record)
                if record.kind == "mesh" and source is not None and source.suffix.lower() == ".ply":
                    sources.append(source)
                for src in sources:
                    try:
                        os.link(src, shown / src.name)
                    except OSError:
                        shutil.copyfile(src, shown / src.name)
                title = f"{record.input or repr(record.prompt)}: {record.kind} job {job_id}"
                index = build_viewer([shown], folder / "viewer", title=title, embed=False)
                index.write_text(index.read_text().replace(json.dumps(str(shown))[1:-1], f"job {job_id}"))
            finally:
                shutil.rmtree(folder / ".viewer-src", ignore_errors=True)


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


class Guard:
    """ASGI middleware in front of the app: the token of every ``/api/`` request but ``/api/health`` (header
    ``Authorization: Bearer TOKEN``, or the page's cookie), and the size of request bodies: one over
    ``limit`` bytes is answered 413 (by its Content-Length at once, else as soon as that many bytes have
    arrived). Both before the app reads (and buffers) the body."""

    def __init__(self, app, limit: int, token: str | None = None) -> None:
        self.app, self.limit, self.token = app, limit, token

    def _authorised(self, headers: dict) -> bool:
        import hmac
        from http.cookies import SimpleCookie

        given = headers.get(b"authorization", b"").decode("latin-1")
        if given[:7].lower() == "bearer ":
            given = given[7:]
        else:
            cookie = SimpleCookie()
            with contextlib.suppress(Exception):
                cookie.load(headers.get(b"cookie", b"").decode("latin-1"))
            given = cookie["microdreamer_token"].value if "microdreamer_token" in cookie else ""
        return hmac.compare_digest(given.encode(), self.token.encode())

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        path = scope.get("path", "")
        if self.token is not None and path.startswith("/api/") and path != "/api/health":
            if not self._authorised(headers):
                response = _error(401, "a token is required: send the header 'Authorization: Bearer TOKEN' "
                                  "(the server's --token)")  # fmt: skip
                response.headers["WWW-Authenticate"] = "Bearer"
                return await response(scope, receive, send)
        if scope["method"] not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, send)
        message = upload_limit_message(self.limit)
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.limit + FORM_SLACK:
            return await _error(413, message)(scope, receive, send)
        seen = 0
        started = False

        async def limited_receive():
            nonlocal seen
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > self.limit + FORM_SLACK:
                    raise _TooLarge()
            return msg

        async def tracking_send(msg):
            nonlocal started
            if msg["type"] == "http.response.start":
                started = True
            await send(msg)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except _TooLarge:
            if not started:
                await _error(413, message)(scope, receive, send)


#: bytes of a multipart body besides the file (boundaries, the other fields)
FORM_SLACK = 64 << 10


def upload_limit_message(limit: int) -> str:
    return (
        f"the upload is over the server's limit of {limit / 2**20:g} MB; send a smaller file (or start the "
        "server with a larger --max-upload-mb)"
    )


class _TooLarge(Exception):
    pass


def create_app(settings: ServeConfig, service: Service | None = None) -> FastAPI:
    """The ASGI app of ``settings``; its lifespan starts the service (workers, the jobs folder) and
    stops it."""
    service = service or Service(settings)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        service.notifier.bind(asyncio.get_running_loop())
        await asyncio.to_thread(service.start)
        yield
        await asyncio.to_thread(service.stop)

    app = FastAPI(title="microdreamer", version=__version__, lifespan=lifespan,
                  description="Image/text -> 3D (MicroDreamer's SIR) and Gaussian splat -> textured mesh, as a "
                              "queue of jobs. Errors: {\"error\": \"<one line>\"}.")  # fmt: skip
    app.state.service = service

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        headers = getattr(exc, "headers", None)
        response = _error(exc.status_code, str(exc.detail))
        if headers:
            response.headers.update(headers)
        return response

    @app.exception_handler(RequestValidationError)
    async def bad_request(request: Request, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p not in ("body", "query", "path"))
        return _error(400, f"{where or 'request'}: {first.get('msg', 'invalid')}")

    app.add_middleware(Guard, limit=settings.max_upload_bytes, token=settings.token)
    auth = []  # the token is checked by Guard, before a body is read

    def job_or_404(job_id: str) -> JobRecord:
        record = service.store.get(job_id)
        if record is None:
            raise HTTPException(404, f"job {job_id[:40]!r}: no such job")
        return record

    # ------------------------------------------------------------------ the page
    @app.get("/", include_in_schema=False)
    def page():
        return FileResponse(STATIC / "index.html", media_type="text/html; charset=utf-8",
                            headers={"Cache-Control": "no-store"})  # fmt: skip

    @app.get("/static/{name}", include_in_schema=False)
    def page_file(name: str):
        if name not in PAGE_FILES:
            raise HTTPException(404, f"{name[:40]!r}: no such file")
        return FileResponse(STATIC / name, media_type=PAGE_FILES[name], headers={"Cache-Control": "no-store"})

    # ------------------------------------------------------------------ the API
    @app.get("/api/health", summary="the service: device, model, workers")
    def health() -> dict:
        workers = service.scheduler.health()
        ready = [w for w in workers if w["state"] == "ready"]
        first = ready[0] if ready else {}
        model = first.get("model") or (
            f"random-{settings.random_weights}" if settings.random_weights else settings.model
        )
        return {"status": "ok", "version": __version__, "device": first.get("device", settings.device),
                "model": model, "model_error": first.get("model_error"), "ready": bool(ready),
                "workers": workers, "queued": sum(1 for r in service.store.recent(10**9) if r.status == "queued"),
                "limits": {"max_upload_mb": settings.max_upload_mb, "job_timeout_s": settings.job_timeout_s,
                           "keep_jobs": settings.keep_jobs, "keep_hours": settings.keep_hours},
                "token": settings.token is not None}  # fmt: skip

    @app.post("/api/jobs", status_code=202, dependencies=auth, summary="queue a mesh or generate job")
    def create_job(
        kind: Annotated[str | None, Form(description="mesh (a splat) or generate (an image and/or a prompt); "
                                         "default: mesh for a splat (.ply, .spz, .sog, ...), else generate")] = None,
        file: Annotated[UploadFile | None, File(description="a splat (mesh) or an image (generate); none for "
                                                "text-to-3D")] = None,
        prompt: Annotated[str | None, Form(description="generate: text-to-3D, or image+text-to-3D with an "
                                           "image")] = None,
        options: Annotated[str | None, Form(description='JSON of settings: the CLI\'s flags ({"resolution": '
                                            '128, "texture": "none"}) or the job config\'s fields ({"field": '
                                            '{"resolution": 128}})')] = None,
) -> dict:  # fmt: skip
        if file is not None and not file.filename and file.size in (0, None):
            file = None  # a form's empty file field
        name = clean_name(file.filename if file is not None else None, "input")
        if kind is None:
            kind = "mesh" if file is not None and name.lower().endswith(SPLAT_SUFFIXES) else "generate"
        if kind not in inputs.KINDS:
            raise HTTPException(
                400, f"kind {kind[:40]!r}: use mesh (a splat) or generate (an image or a prompt)"
            )
        prompt = (prompt or "").strip() or None
        if prompt is not None and (len(prompt) > MAX_PROMPT or not prompt.isprintable()):
            raise HTTPException(400, f"prompt: give at most {MAX_PROMPT} printable characters")
        try:
            if kind == "mesh" and file is None:
                raise InputError(f"file: a mesh job needs a splat file ({', '.join(SPLAT_SUFFIXES)})")
            if kind == "mesh" and prompt is not None:
                raise InputError("prompt: a mesh job takes a splat, not a prompt; leave the prompt out")
            mode = inputs.generation_mode(file is not None, prompt) if kind == "generate" else None
            opts = inputs.parse_options(options)
            cfg_extras = inputs.job_config(kind, opts, service.base(kind, mode))
        except InputError as e:
            raise HTTPException(400, str(e)) from None
        with service.store.incoming() as folder:
            upload = None
            if file is not None:
                upload = folder / name
                with open(upload, "wb") as f:
                    shutil.copyfileobj(file.file, f, 1 << 20)
                if upload.stat().st_size > settings.max_upload_bytes:
                    raise HTTPException(413, upload_limit_message(settings.max_upload_bytes))
                if upload.stat().st_size == 0:
                    raise HTTPException(400, f"{name}: the file is empty; send the splat or image itself")
                try:
                    inputs.check_input(kind, upload)
                except InputError as e:
                    raise HTTPException(400, inputs.scrub(str(e), upload, name)) from None
            record = JobRecord(id=service.store.new_id(), kind=kind, input=name if file is not None else None,
                               prompt=prompt, options=opts, mode=mode)  # fmt: skip
            with service.submit_lock:  # the records' times in the queue's order
                record.created = time.time()
                service.store.create(record, upload)
                service.scheduler.submit(record.id, service.spec(record, cfg_extras))
        return {"id": record.id, "status": record.status, "position": service.scheduler.position(record.id),
                "url": f"/api/jobs/{record.id}"}  # fmt: skip

    @app.get("/api/jobs", dependencies=auth, summary="the recent jobs, newest first")
    def list_jobs(limit: int = 50) -> dict:
        limit = max(1, min(int(limit), 1000))
        return {"jobs": [service.public(r) for r in service.store.recent(limit)]}

    @app.get(
        "/api/jobs/{job_id}", dependencies=auth, summary="a job's status, stage, progress, files, seconds"
    )
    def get_job(job_id: str) -> dict:
        return service.public(job_or_404(job_id))

    @app.get("/api/jobs/{job_id}/events", dependencies=auth, summary="server-sent events of the job's status")
    async def job_events(job_id: str, request: Request):
        job_or_404(job_id)

        async def stream():
            last = None
            while True:
                event = service.notifier.current()
                record = service.store.get(job_id)
                if record is None:
                    yield "event: deleted\ndata: {}\n\n"
                    return
                state = service.public(record)
                text = json.dumps(state)
                if text != last:
                    last = text
                    yield f"data: {text}\n\n"
                if record.done:
                    return
                try:
                    await asyncio.wait_for(event.wait(), KEEPALIVE_S)
                except TimeoutError:
                    if await request.is_disconnected():
                        return
                    yield ": keep-alive\n\n"

        return StreamingResponse(stream(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})  # fmt: skip

    @app.get("/api/jobs/{job_id}/files/{name}", dependencies=auth, summary="an output file of a finished job")
    def job_file(job_id: str, name: str):
        record = job_or_404(job_id)
        path = service.store.resolve(job_id, "out", name) if record.status == "done" else None
        if path is None:
            raise HTTPException(404, f"{name[:60]!r}: no such output of job {job_id}")
        return FileResponse(path, media_type=_MIME.get(path.suffix.lower(), "application/octet-stream"),
                            filename=name, headers={"X-Content-Type-Options": "nosniff"})  # fmt: skip

    @app.get("/api/jobs/{job_id}/viewer/{path:path}", dependencies=auth, summary="the result in the viewer")
    def job_viewer(job_id: str, path: str):
        record = job_or_404(job_id)
        if record.status != "done":
            raise HTTPException(409, f"job {job_id} is {record.status}; its viewer comes when it is done")
        parts = [p for p in (path or "index.html").split("/")]
        try:
            service.viewer(job_id)
        except InputError as e:
            raise HTTPException(400, inputs.scrub(str(e), service.store.folder(job_id), "job")) from None
        found = service.store.resolve(job_id, "viewer", *parts)
        if found is None:
            raise HTTPException(404, f"{path[:80]!r}: no such file in the viewer of job {job_id}")
        return FileResponse(found, media_type=_MIME.get(found.suffix.lower(), "application/octet-stream"),
                            headers={"X-Content-Type-Options": "nosniff", "Cache-Control": "no-store"})  # fmt: skip

    @app.delete(
        "/api/jobs/{job_id}",
        dependencies=auth,
        summary="cancel a queued or running job; delete a finished one",
    )
    def delete_job(job_id: str) -> dict:
        record = job_or_404(job_id)
        if record.done:
            service.store.delete(job_id)
            return {"id": job_id, "deleted": True}
        status = service.scheduler.cancel(job_id)
        record = service.store.get(job_id)
        return {"id": job_id, "deleted": False, "status": record.status if record else status,
                "cancelling": status == "running"}  # fmt: skip

    return app


def run_server(settings: ServeConfig, announce=print) -> None:
    """Serve ``settings`` until interrupted: bind the socket (one-line InputError if it cannot), say the
    address, run uvicorn."""
    import socket

    import uvicorn

    family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((settings.host, settings.port))
    except OSError as e:
        sock.close()
        raise InputError(f"cannot listen on {settings.host}:{settings.port} ({e.strerror}); choose another "
                         "--port or --host") from None  # fmt: skip
    sock.listen(
        2048
    )  # connections wait in the backlog while the app starts (no "refused" after the line below)
    port = sock.getsockname()[1]
    app = create_app(settings)
    host = f"[{settings.host}]" if family == socket.AF_INET6 else settings.host
    announce(f"serving at http://{host}:{port}/ (jobs in {settings.jobs_dir}; Ctrl-C stops)")
    config = uvicorn.Config(app, log_level="warning", access_log=False, timeout_graceful_shutdown=5)
    uvicorn.Server(config).run(sockets=[sock])
