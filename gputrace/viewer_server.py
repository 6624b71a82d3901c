"""Serve the static viewer and exactly one trace file on 127.0.0.1 (what ``gputrace view`` runs).

The server answers a fixed table of routes built at start: ``/`` and each file of the viewer
(read into memory once), plus ``/trace.json`` (or ``/trace.json.gz``) for the one trace, read
from disk on each request so a reload shows a re-written trace. A request path is looked up in
that table as sent; it is never joined to a directory, so ``/../../etc/passwd`` and its encoded
variants are plain misses (404), and there is no directory listing. Requests whose ``Host``
header is not this server's own address are refused (a web page cannot reach the server through
DNS rebinding).

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
import threading
import urllib.parse
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from gputrace.errors import GputraceError

HOST = "127.0.0.1"
CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
}
# Files of viewer/ that the page needs; the README screenshot stays out of the package and routes.
SERVED_SUFFIXES = (".html", ".js", ".css", ".svg")
# Scripts and styles only from this server; fetch only from it; no plugins, no <base>, no framing.
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)


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


def _is_gzip(path: Path) -> bool:
    with path.open("rb") as f:
        return f.read(2) == b"\x1f\x8b"


class ViewerServer:
    """One trace and the viewer on ``127.0.0.1:port`` (``port=0``: a free port chosen by the OS).

    Raises ``GputraceError`` if the port cannot be bound or the trace cannot be read.
    """

    def __init__(self, trace_path: str | os.PathLike[str], port: int = 0) -> None:
        self.trace_path = Path(trace_path)
        try:
            gz = _is_gzip(self.trace_path)
        except OSError as exc:
            raise GputraceError(f"{self.trace_path}: cannot be read ({exc.strerror or exc}).") from None
        self.trace_route = "/trace.json.gz" if gz else "/trace.json"
        self.routes: dict[str, tuple[bytes | None, str]] = {}
        vdir = viewer_dir()
        for f in sorted(vdir.iterdir()):
            if f.is_file() and f.suffix in SERVED_SUFFIXES and not f.name.startswith("."):
                self.routes["/" + f.name] = (f.read_bytes(), CONTENT_TYPES[f.suffix])
        self.routes["/"] = self.routes["/index.html"]
        self.routes[self.trace_route] = (None, "application/gzip" if gz else "application/json")
        try:
            self.httpd = ThreadingHTTPServer((HOST, port), _handler_for(self))
        except OSError as exc:
            raise GputraceError(
                f"cannot listen on {HOST}:{port} ({exc.strerror or exc}); pick another --port."
            ) from None
        self.httpd.daemon_threads = True
        self.port = int(self.httpd.server_address[1])
        self._thread: threading.Thread | None = None

    # addresses -----------------------------------------------------------------------------
    @property
    def origin(self) -> str:
        return f"http://{HOST}:{self.port}"

    def _query(self) -> str:
        return urllib.parse.urlencode({"trace": self.trace_route.lstrip("/"), "name": self.trace_path.name})

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

    # lifecycle -----------------------------------------------------------------------------
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


def _handler_for(server: ViewerServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "gputrace-view"
        sys_version = ""

        def do_GET(self) -> None:
            self._answer(body=True)

        def do_HEAD(self) -> None:
            self._answer(body=False)

        def _answer(self, body: bool) -> None:
            allowed_hosts = {f"{HOST}:{server.port}", f"localhost:{server.port}"}
            if self.headers.get("Host", "") not in allowed_hosts:
                self._send(HTTPStatus.FORBIDDEN, b"wrong Host header\n", "text/plain", body)
                return
            route = self.path.split("?", 1)[0]  # as sent: never unquoted, normalised or joined
            entry = server.routes.get(route)
            if entry is None:
                self._send(HTTPStatus.NOT_FOUND, b"not found\n", "text/plain", body)
                return
            data, ctype = entry
            if data is None:  # the trace: read now, so a reload shows a re-written file
                try:
                    from gputrace.exporters.json import servable

                    data = servable(server.trace_path)  # a file cut short comes closed
                except OSError:
                    self._send(HTTPStatus.NOT_FOUND, b"trace file is gone\n", "text/plain", body)
                    return
            self._send(HTTPStatus.OK, data, ctype, body)

        def _send(self, status: HTTPStatus, data: bytes, ctype: str, body: bool) -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Cache-Control", "no-store")
            self.send_header("X-Content-Type-Options", "nosniff")
            self.send_header("Referrer-Policy", "no-referrer")
            if ctype.startswith("text/html"):
                self.send_header("Content-Security-Policy", CSP)
            self.end_headers()
            if body:
                self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # quiet: the terminal shows the URL and "stopped", not every request

    return Handler
