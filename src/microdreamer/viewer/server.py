"""A local HTTP server for a viewer folder (127.0.0.1 only)."""

from __future__ import annotations

import functools
import http.server
import logging
import threading
from pathlib import Path

from microdreamer.errors import InputError

logger = logging.getLogger(__name__)


class _Handler(http.server.SimpleHTTPRequestHandler):
    """Static files with the MIME types the viewer needs, no caching (a rebuilt viewer shows at once),
    requests logged at debug level instead of on stderr."""

    extensions_map = {
        **http.server.SimpleHTTPRequestHandler.extensions_map,
        ".js": "text/javascript",
        ".json": "application/json",
        ".glb": "model/gltf-binary",
        ".ply": "application/octet-stream",
        ".obj": "text/plain",
        ".mtl": "text/plain",
        ".wasm": "application/wasm",
    }

    def end_headers(self) -> None:
        self.send_header("Cache-Control", "no-store")
        super().end_headers()

    def log_message(self, format: str, *args) -> None:  # noqa: A002 (the base class's name)
        logger.debug("%s %s", self.address_string(), format % args)


def bind(out_dir: Path, port: int = 0) -> http.server.ThreadingHTTPServer:
    """A server for ``out_dir`` bound to 127.0.0.1:``port`` and not yet serving: taken before the folder
    is built, so that a port in use fails before anything is written. The folder may not exist yet.

    Raises:
        InputError: the port is out of range or taken.
    """
    if not 0 <= int(port) <= 65535:
        raise InputError(f"--port {port}: a TCP port is 0 to 65535 (0: a free one)")
    handler = functools.partial(_Handler, directory=str(Path(out_dir).resolve()))
    try:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
    except OSError as e:
        raise InputError(f"cannot listen on 127.0.0.1:{port} ({e.strerror}); choose another port") from e
    except OverflowError:
        raise InputError(f"--port {port}: a TCP port is 0 to 65535 (0: a free one)") from None
    server.daemon_threads = True
    return server


def serve(
    out_dir: Path, port: int = 0, server: http.server.ThreadingHTTPServer | None = None
) -> tuple[str, http.server.ThreadingHTTPServer]:
    """Serve ``out_dir`` on 127.0.0.1 from a daemon thread.

    Args:
        out_dir: a folder written by :func:`microdreamer.viewer.build_viewer`.
        port: the TCP port; 0 picks a free one.
        server: a server from :func:`bind` for ``out_dir`` (then ``port`` is not used).

    Returns:
        (the page's URL, the server): stop it with ``server.shutdown(); server.server_close()``.

    Raises:
        InputError: ``out_dir`` holds no ``index.html``, or the port is taken.
    """
    out_dir = Path(out_dir)
    if not (out_dir / "index.html").is_file():
        if server is not None:
            server.server_close()
        raise InputError(f"{out_dir}: no index.html; build a viewer there first (build_viewer)")
    server = server if server is not None else bind(out_dir, port)
    thread = threading.Thread(target=server.serve_forever, name="microdreamer-viewer", daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}/"
    logger.info("serving %s at %s", out_dir, url)
    return url, server
