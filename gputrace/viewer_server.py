"""Serve the static viewer and exactly one trace file on 127.0.0.1 (``gputrace view``).

The routes are a fixed table: ``/`` and each viewer file (read once), and ``/trace.json`` (or
``.json.gz``), read per request so a reload shows a re-written trace. A path is looked up as sent,
never joined to a directory, so ``/../`` is a plain 404; a foreign ``Host`` is refused (DNS
rebinding).

>>> import tempfile, urllib.request, gputrace
>>> path = tempfile.mkdtemp() + "/t.json"
>>> with gputrace.session(path, backend="cpu"):
...     with gputrace.trace("step"):
...         pass
>>> server = ViewerServer(path)
>>> server.start_background()
>>> urllib.request.urlopen(server.trace_url).read()[:15]
b'{"displayTimeUn'
>>> server.close()
"""

from __future__ import annotations

import os
import sys
import threading
import urllib.parse
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from gputrace.errors import GputraceError
from gputrace.exporters.opener import read_file

HOST = "127.0.0.1"
LISTEN_BACKLOG = 128
IDLE_TIMEOUT_S = 10.0
# the viewer's files served, by suffix (the README's screenshot .png stays out of the routes)
CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}
# Scripts and styles only from this server; fetch only from it; no plugins, no <base>, no framing.
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
HEADERS = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"}


def viewer_dir() -> Path:
    """The viewer's files: ``gputrace/_viewer`` when installed, else the checkout's ``viewer/``."""
    here = Path(__file__).resolve().parent
    for cand in (here / "_viewer", here.parent / "viewer"):
        if (cand / "index.html").is_file():
            return cand
    raise GputraceError(
        f"the viewer's files are missing (looked in {here / '_viewer'} and {here.parent / 'viewer'}); "
        "reinstall gputrace."
    )


class ViewerServer:
    """One trace and the viewer on ``127.0.0.1:port`` (0: any free port); a ``GputraceError`` if
    the port cannot be bound or the trace cannot be read."""

    def __init__(
        self, trace_path: str | os.PathLike[str], port: int = 0, idle_timeout_s: float = IDLE_TIMEOUT_S
    ) -> None:
        self.trace_path = Path(trace_path)
        self.idle_timeout_s = idle_timeout_s
        gz = read_file(self.trace_path)[:2] == b"\x1f\x8b"  # bounded, regular files only (not a FIFO)
        self.trace_route = "/trace.json.gz" if gz else "/trace.json"
        self.routes: dict[str, tuple[bytes | None, str]] = {}
        vdir = viewer_dir()
        for f in sorted(vdir.iterdir()):
            if f.is_file() and f.suffix in CONTENT_TYPES and not f.name.startswith("."):
                self.routes["/" + f.name] = (f.read_bytes(), CONTENT_TYPES[f.suffix])
        self.routes["/"] = self.routes["/index.html"]
        self.routes[self.trace_route] = (None, "application/gzip" if gz else "application/json")
        try:
            self.httpd = _Server((HOST, port), _handler_for(self))
        except OSError as exc:
            raise GputraceError(
                f"cannot listen on {HOST}:{port} ({exc.strerror or exc}); pick another --port."
            ) from None
        self.port = int(self.httpd.server_address[1])
        self._thread: threading.Thread | None = None

    @property
    def origin(self) -> str:
        return f"http://{HOST}:{self.port}"

    def _query(self) -> str:
        # the name as bytes: a non-UTF-8 file name is percent-encoded as it is on disk
        name = os.fsencode(self.trace_path.name)
        return urllib.parse.urlencode({"trace": self.trace_route.lstrip("/"), "name": name})

    @property
    def url(self) -> str:
        """The viewer showing the trace."""
        return f"{self.origin}/?{self._query()}"

    @property
    def perfetto_url(self) -> str:
        """A local page that hands the trace to the Perfetto UI (ui.perfetto.dev)."""
        return f"{self.origin}/perfetto.html?{self._query()}"

    @property
    def trace_url(self) -> str:
        return self.origin + self.trace_route

    def serve_forever(self) -> None:
        """Serve until ``close()`` or Ctrl-C (``KeyboardInterrupt`` propagates to the caller)."""
        self.httpd.serve_forever(poll_interval=0.2)

    def start_background(self) -> None:
        """Serve from a daemon thread (tests, notebooks)."""
        self._thread = threading.Thread(target=self.serve_forever, name="gputrace-view", daemon=True)
        self._thread.start()

    def close(self) -> None:
        if self._thread is not None:
            self.httpd.shutdown()
            self._thread.join()
            self._thread = None
        self.httpd.server_close()

    def __enter__(self) -> ViewerServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Server(ThreadingHTTPServer):
    """A thread per connection, a real listen backlog, and quiet client disconnects."""

    request_queue_size = LISTEN_BACKLOG
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, TimeoutError)):  # socket.timeout is TimeoutError
            return  # the client went away or went quiet: nothing to report
        print(f"gputrace: view: a request failed ({type(exc).__name__}: {exc}).", file=sys.stderr)


def _handler_for(server: ViewerServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "gputrace-view"
        sys_version = ""
        timeout = server.idle_timeout_s  # an idle connection is closed, not held forever

        def do_GET(self) -> None:
            self._send(*self._answer(), body=True)

        def do_HEAD(self) -> None:
            self._send(*self._answer(), body=False)

        def _answer(self) -> tuple[HTTPStatus, bytes, str]:
            if self.headers.get("Host", "") not in {f"{HOST}:{server.port}", f"localhost:{server.port}"}:
                return HTTPStatus.FORBIDDEN, b"wrong Host header\n", "text/plain"
            entry = server.routes.get(self.path.split("?", 1)[0])  # as sent: never unquoted or joined
            if entry is None:
                return HTTPStatus.NOT_FOUND, b"not found\n", "text/plain"
            data, ctype = entry
            if data is not None:
                return HTTPStatus.OK, data, ctype
            from gputrace.exporters.json import servable

            try:  # the trace, read now so a reload shows a re-written file; a cut stream comes closed
                return HTTPStatus.OK, servable(server.trace_path), ctype
            except (GputraceError, OSError):
                return HTTPStatus.NOT_FOUND, b"trace file is gone or unreadable\n", "text/plain"

        def _send(self, status: HTTPStatus, data: bytes, ctype: str, body: bool) -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            for name, value in HEADERS.items():
                self.send_header(name, value)
            if ctype.startswith("text/html"):
                self.send_header("Content-Security-Policy", CSP)
            self.end_headers()
            if body:
                self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # quiet: the terminal shows the URL and "stopped", not every request

    return Handler
