"""The viewer (``viewer/``), its server and ``gputrace view``.

Browser tests drive the real viewer in headless Chromium (Debian's ``/usr/bin/chromium``, through
Playwright's Python package; no browser is ever downloaded) on a golden trace that the fake backend
and a FakeClock write through the real exporter, so it always has the current file format. The
page is asked what it drew (``window.gputraceViewer.stats()``) and the answers are compared with
what the trace file holds.
"""

from __future__ import annotations

import gzip
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import pytest

import gputrace
from gputrace.backends.fake import FakeBackend
from gputrace.clock import FakeClock
from gputrace.durations import fmt_ns
from gputrace.exporters.plan import GPU_PID_BASE, OVERLAP_TID_STEP
from gputrace.viewer_server import ViewerServer, viewer_dir
from tests.builders import child_env

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip
XSS = "<img src=x onerror=alert(1)>"
XSS_ARG = "<script>alert(2)</script>"
# (delay after submission, GPU duration) in ns per scope name; None: the GPU cannot time it
SCRIPT: dict[str, tuple[int, int | None]] = {
    "matmul": (4_000, 30_000),
    "copy": (2_000, 8_000),
    "step": (1_000, 50_000),
    "empty": (3_000, 0),
    "host_only": (0, None),
    "worker_task": (2_000, 6_000),
    XSS: (5_000, 12_000),
}


def write_golden(path: Path) -> Path:
    """Two CPU threads, two streams, nesting, cold/warm calls, an untimed and an empty scope,
    a mark, a sync, and a scope whose name and args are HTML."""
    clock = FakeClock(1_000_000_000, 1_000)
    fake = FakeBackend(clock, script=lambda name, call: SCRIPT[name], seed=1)
    with gputrace.session(path, backend=fake, clock=clock, quiet=True):
        for _ in range(3):
            with gputrace.trace("matmul", n=256):
                pass
        with gputrace.trace("step"), gputrace.trace("copy", stream="s1"):
            pass
        with gputrace.trace("host_only"):
            pass
        with gputrace.trace("empty"):
            pass
        gputrace.mark("checkpoint")

        def work() -> None:
            with gputrace.trace("worker_task"):
                pass

        t = threading.Thread(target=work, name="worker")
        t.start()
        t.join()
        gputrace.sync()
        with gputrace.trace(XSS, note=XSS_ARG):
            pass
    return path


@pytest.fixture(scope="module")
def golden(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_golden(tmp_path_factory.mktemp("viewer") / "golden.json")


@pytest.fixture(scope="module")
def doc(golden: Path) -> dict[str, Any]:
    return json.loads(golden.read_bytes())  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def server(golden: Path) -> Iterator[ViewerServer]:
    srv = ViewerServer(golden)
    srv.start_background()
    yield srv
    srv.close()


def fmt_dur(us: float) -> str:
    """The viewer's duration format (viewer/format.js GT.fmtDur): gputrace's one format, in µs."""
    return fmt_ns(us * 1000)


def fmt_ts(us: float) -> str:
    """The viewer's time-on-axis format (viewer/format.js GT.fmtTs), to the nanosecond."""
    a = abs(us)

    def trim(s: str) -> str:
        return s.rstrip("0").rstrip(".") if "." in s else s

    if a == 0:
        return "0 µs"
    if a < 1:
        return f"{us * 1000:.0f} ns"
    if a < 1000:
        return trim(f"{us:.3f}") + " µs"
    if a < 1e6:
        return trim(f"{us / 1000:.3f}") + " ms"
    return trim(f"{us / 1e6:.3f}") + " s"


def events(doc: dict[str, Any], ph: str, cat: str | None = None) -> list[dict[str, Any]]:
    return [e for e in doc["traceEvents"] if e["ph"] == ph and (cat is None or cat_of(e) == cat)]


def cat_of(e: dict[str, Any]) -> str | None:
    """A scope's slices carry no cat in the file: CPU in a Python process, GPU in a GPU process;
    a wait's begin is named "queued · <stream>", its end has neither name nor cat."""
    if e.get("cat") is None and e["ph"] == "X":
        return "gpu" if e["pid"] >= GPU_PID_BASE else "cpu"
    if e.get("cat") is None and e["ph"] in ("b", "e") and str(e.get("name", "queued")).startswith("queued"):
        return "queued"
    return e.get("cat")


# -- server --------------------------------------------------------------------------------------
def raw_get(port: int, path: str, host: str | None = None, method: str = "GET") -> tuple[int, bytes]:
    """A request with the path exactly as given (no client-side normalisation)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(f"{method} {path} HTTP/1.1\r\nHost: {host or f'127.0.0.1:{port}'}\r\n"
                  "Connection: close\r\n\r\n".encode())  # fmt: skip
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


@pytest.mark.parametrize(
    "path",
    [
        "/../../etc/passwd",
        "/%2e%2e/%2e%2e/etc/passwd",
        "/%2E%2E%2F%2E%2E%2Fetc%2Fpasswd",
        "/..%2f..%2fetc%2fpasswd",
        "/..%5c..%5cetc%5cpasswd",
        "/%252e%252e/etc/passwd",
        "//etc/passwd",
        "/./index.html/../../../etc/passwd",
        "/viewer/../pyproject.toml",
        "/../pyproject.toml",
        "/pyproject.toml",
        "/gputrace/viewer_server.py",
        "/viewer_server.py",
        "/screenshot.png",
        "/viewer/",
        "/static/",
        "/trace.json/..",
        "/trace.json.gz",
        "/golden.json",
        "/index.html%00.png",
        "/.",
        "/..",
    ],
)
def test_only_the_viewer_and_the_trace_are_served(server: ViewerServer, path: str) -> None:
    status, body = raw_get(server.port, path)
    assert status == 404
    assert b"root:" not in body and b"[project]" not in body


def test_the_page_its_files_and_the_trace_are_served(server: ViewerServer, golden: Path) -> None:
    status, body = raw_get(server.port, "/")
    assert status == 200 and b"<canvas" in body
    for name in ("index.html", "app.js", "model.js", "timeline.js", "style.css", "perfetto.html"):
        assert raw_get(server.port, "/" + name)[0] == 200, name
    assert raw_get(server.port, "/trace.json?x=1")[1] == golden.read_bytes()
    status, body = raw_get(server.port, "/", method="HEAD")
    assert status == 200 and body == b""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    conn.request("GET", "/")
    resp = conn.getresponse()
    csp = resp.getheader("Content-Security-Policy") or ""
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp
    assert resp.getheader("X-Content-Type-Options") == "nosniff"
    conn.close()


def test_other_host_names_are_refused(server: ViewerServer) -> None:
    """A web page cannot reach the server through DNS rebinding: its Host header gives it away."""
    assert raw_get(server.port, "/trace.json", host=f"evil.example:{server.port}")[0] == 403
    assert raw_get(server.port, "/trace.json", host=f"localhost:{server.port}")[0] == 200


def test_binds_127_0_0_1_only(server: ViewerServer) -> None:
    assert server.httpd.server_address[0] == "127.0.0.1"
    assert server.url.startswith(f"http://127.0.0.1:{server.port}/")
    # another loopback address reaches a server bound to 0.0.0.0, not one bound to 127.0.0.1
    with pytest.raises(OSError), socket.create_connection(("127.0.0.2", server.port), timeout=2):
        pass


def test_gzip_trace_is_served_as_is(tmp_path: Path, golden: Path) -> None:
    gz = tmp_path / "golden.json.gz"
    gz.write_bytes(gzip.compress(golden.read_bytes()))
    with ViewerServer(gz) as srv:
        srv.start_background()
        assert "trace=trace.json.gz" in srv.url and "name=golden.json.gz" in srv.url
        assert raw_get(srv.port, "/trace.json.gz")[1] == gz.read_bytes()
        assert raw_get(srv.port, "/trace.json")[0] == 404


# -- the command -----------------------------------------------------------------------------------
def run_cli(*args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    env = child_env()
    return subprocess.run([sys.executable, "-m", "gputrace", "view", *args], capture_output=True,
                          text=True, timeout=30, env=env, cwd=ROOT, **kw)  # fmt: skip


def test_view_serves_until_ctrl_c(golden: Path) -> None:
    env = child_env(PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "gputrace", "view", str(golden), "--no-browser"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "http://127.0.0.1:" in line and "name=golden.json" in line
        port = int(line.split("http://127.0.0.1:")[1].split("/")[0])
        assert raw_get(port, "/trace.json")[1] == golden.read_bytes()
        assert raw_get(port, "/../../etc/passwd")[0] == 404
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "stopped" in out and "Traceback" not in err
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=2):
        pass


def test_view_perfetto_prints_the_handoff_page(golden: Path) -> None:
    env = child_env(PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "gputrace", "view", str(golden), "--no-browser", "--perfetto"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "/perfetto.html?trace=trace.json" in line
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=10)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "no such file"),
        (b"", "empty"),
        (b"{not json", "JSON"),
        (b'{"foo": 1}', "not a Chrome trace"),
    ],
)
def test_view_refuses_bad_files_in_one_sentence(tmp_path: Path, content: bytes | None, message: str) -> None:
    path = tmp_path / "t.json"
    if content is not None:
        path.write_bytes(content)
    r = run_cli(str(path), "--no-browser")
    assert r.returncode == 2
    assert message in r.stderr and str(path) in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def test_view_port_in_use_is_a_clear_error(golden: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        r = run_cli(str(golden), "--no-browser", "--port", str(s.getsockname()[1]))
    assert r.returncode == 2
    assert "cannot listen on 127.0.0.1" in r.stderr and "Traceback" not in r.stderr


# -- packaging ---------------------------------------------------------------------------------------
def test_viewer_files_are_installed_with_the_package(tmp_path: Path) -> None:
    """A build (not the checkout) carries the viewer as gputrace/_viewer and serves from it."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "viewer", src / "viewer")
    shutil.copytree(ROOT / "gputrace", src / "gputrace", symlinks=True,
                    ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    lib = tmp_path / "lib"
    build = [sys.executable, "-c", "from setuptools import setup; setup()", "-q", "build_py"]
    subprocess.run([*build, "--build-lib", str(lib)], cwd=src, check=True, capture_output=True, timeout=120)
    served = {p.name for p in (ROOT / "viewer").iterdir() if p.suffix in (".html", ".js", ".css")}
    installed = {p.name for p in (lib / "gputrace" / "_viewer").iterdir()}
    assert served <= installed
    assert "screenshot.png" not in installed
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert all(any(fnmatch(n, p) for p in patterns["gputrace._viewer"]) for n in served)
    found = subprocess.run(
        [sys.executable, "-c", "from gputrace.viewer_server import viewer_dir; print(viewer_dir())"],
        env={**os.environ, "PYTHONPATH": str(lib)}, cwd=tmp_path, capture_output=True, text=True,
        check=True,
    ).stdout.strip()  # fmt: skip
    assert Path(found) == lib / "gputrace" / "_viewer"


def test_checkout_serves_the_viewer_directory() -> None:
    assert (viewer_dir() / "index.html").read_bytes() == (ROOT / "viewer" / "index.html").read_bytes()


# -- the page in a real browser ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is not installed (apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("the playwright Python package is not installed (pip install playwright)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


def wait_js(page: Any, expr: str, timeout_s: float = 15.0) -> None:
    for _ in range(int(timeout_s / 0.05)):
        if page.evaluate(expr):
            return
        page.wait_for_timeout(50)
    raise AssertionError(f"timed out waiting for {expr}")


class Page:
    """A page plus everything it tried to do that a viewer must not: errors, dialogs, requests."""

    def __init__(self, browser: Any, origin: str | None) -> None:
        self.context = browser.new_context(viewport={"width": 1400, "height": 800})
        self.errors: list[str] = []
        self.dialogs: list[str] = []
        self.foreign: list[str] = []
        self.origin = origin

        def route(r: Any) -> None:
            url = r.request.url
            if (origin and url.startswith(origin + "/")) or url.startswith(("file://", "data:")):
                r.continue_()
            else:
                self.foreign.append(url)
                r.abort()

        self.context.route("**/*", route)
        self.page = self.context.new_page()
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))

        def on_dialog(d: Any) -> None:
            self.dialogs.append(d.message)
            d.dismiss()

        self.page.on("dialog", on_dialog)

    def open(self, url: str) -> dict[str, Any]:
        self.page.goto(url)
        return self.wait_loaded()

    def wait_loaded(self) -> dict[str, Any]:
        self.wait("window.gputraceViewer && gputraceViewer.stats().loaded")
        return self.js("gputraceViewer.stats()")  # type: ignore[no-any-return]

    def wait(self, expr: str, timeout_s: float = 15.0) -> None:
        """Poll ``expr`` until true (Playwright's wait_for_function evals a string, which the
        viewer's Content-Security-Policy rightly forbids)."""
        wait_js(self.page, expr, timeout_s)

    def js(self, expr: str, arg: Any = None) -> Any:
        return self.page.evaluate(expr, arg)

    def close(self) -> None:
        self.context.close()


@pytest.fixture
def page(browser: Any, server: ViewerServer) -> Iterator[Page]:
    p = Page(browser, server.origin)
    yield p
    p.close()


def lanes_in_file(doc: dict[str, Any]) -> Counter[tuple[str, int, int]]:
    """(kind, pid, tid) -> slices, counted from the trace file."""
    c: Counter[tuple[str, int, int]] = Counter()
    for e in events(doc, "X", "cpu"):
        c["cpu", e["pid"], e["tid"]] += 1
    for e in events(doc, "X", "gpu"):
        c["gpu", e["pid"], e["tid"]] += 1
    stream_of = {e["bind_id"]: e["tid"] % OVERLAP_TID_STEP for e in events(doc, "X", "gpu")}
    for e in events(doc, "b", "queued"):  # a wait is drawn on its scope's stream
        c["queued", e["pid"], stream_of[e["id2"]["local"]]] += 1
    return c


@pytest.mark.browser
def test_page_loads_the_golden_trace_and_draws_what_it_holds(
    page: Page, server: ViewerServer, doc: dict[str, Any]
) -> None:
    st = page.open(server.url)
    assert page.errors == [] and page.foreign == [] and page.dialogs == []
    assert st["file"] == "golden.json"
    cpu, gpu = events(doc, "X", "cpu"), events(doc, "X", "gpu")
    queued = events(doc, "b", "queued")
    # what the golden trace was built with: 9 scopes on 2 threads, 8 timed ones on 2 streams
    assert (len(cpu), len(gpu), len(queued)) == (9, 8, 8)
    assert st["scopes"] == len(cpu)
    assert st["slices"] == {"cpu": len(cpu), "gpu": len(gpu), "pass": 0, "queued": len(queued), "other": 0}
    assert st["flows"] == len([e for e in cpu if e.get("flow_out")]) == len(gpu)
    assert st["instants"] == len(events(doc, "i"))
    drawn = Counter({(ln["kind"], ln["pid"], ln["tid"]): ln["slices"] for ln in st["lanes"] if ln["slices"]})
    assert drawn == lanes_in_file(doc)
    kinds = Counter(ln["kind"] for ln in st["lanes"])
    assert kinds == {"cpu": 2, "gpu": 2, "queued": 2, "counter": 2}
    titles = [ln["title"] for ln in st["lanes"]]
    # per stream its queued lane first, then the execution lane; CPU threads on top
    assert titles[:2] == ["MainThread", "worker"]
    assert titles[2:6] == ["queued · stream 0", "stream 0", "queued · stream s1", "stream s1"]
    # everything fits at first: every slice was visited by the last frame
    assert st["lastDraw"]["slicesVisited"] == st["total"]
    assert st["view"]["start"] <= min(e["ts"] for e in cpu)
    assert st["view"]["end"] >= max(e["ts"] + e["dur"] for e in gpu)


def named_ends(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` as older gputrace wrote it: each wait's begin and end with ``cat`` and ``name``."""
    names = {(e["pid"], e["id2"]["local"]): e["name"] for e in events(doc, "b", "queued")}
    old = [
        dict(e, cat="queued", name=names[e["pid"], e["id2"]["local"]]) if cat_of(e) == "queued" else e
        for e in doc["traceEvents"]
    ]
    return dict(doc, traceEvents=old)


QUEUED_SLICES = """doc => {
    const m = GT.buildModel(doc), S = m.slices, out = [];
    for (let s = 0; s < S.n; s++) {
        if (S.kind[s] !== GT.KIND.queued) continue;
        out.push([S.scope[s], S.start[s], S.dur[s], m.lanes[S.lane[s]].title]);
    }
    return out.sort((a, b) => a[0] - b[0]);
}"""


@pytest.mark.browser
def test_waits_with_unnamed_ends_draw_as_the_named_ones_did(
    page: Page, server: ViewerServer, doc: dict[str, Any]
) -> None:
    page.open(server.url)
    ends = events(doc, "e")
    assert ends and all(set(e) == {"ph", "id2", "pid", "ts"} for e in ends)  # as written now
    begins = {(e["pid"], e["id2"]["local"]): e for e in events(doc, "b", "queued")}
    assert all("cat" not in b for b in begins.values())
    now = page.js(QUEUED_SLICES, doc)
    # each wait from its submission to its GPU start, on its stream's "queued · <stream>" lane
    expected = sorted(
        [e["id2"]["local"], begins[e["pid"], e["id2"]["local"]]["ts"],
         e["ts"] - begins[e["pid"], e["id2"]["local"]]["ts"], begins[e["pid"], e["id2"]["local"]]["name"]]
        for e in ends
    )  # fmt: skip
    assert [s[0] for s in now] == [x[0] for x in expected] and len(now) == 8
    for got, want in zip(now, expected, strict=True):
        assert got[1] == want[1] and got[2] == pytest.approx(want[2], abs=1e-9) and got[3] == want[3]
    assert page.js(QUEUED_SLICES, named_ends(doc)) == now  # an older file draws the same
    # a file cut before a wait's end keeps that wait open: not drawn, the others are
    cut = dict(doc, traceEvents=[e for e in doc["traceEvents"] if e is not ends[-1]])
    assert [s[0] for s in page.js(QUEUED_SLICES, cut)] == sorted(
        x[0] for x in expected if x[0] != ends[-1]["id2"]["local"]
    )
    assert page.errors == []


@pytest.mark.browser
def test_anomaly_examples_are_shown_as_written(page: Page, server: ViewerServer, doc: dict[str, Any]) -> None:
    from gputrace.flags import EXPLAIN

    page.open(server.url)
    assert page.js("GT.EXPLAIN") == EXPLAIN
    written = doc["gputrace"]["anomalies"]["items"]
    assert written and all({"scope", "name", "kinds", "explain"} <= set(it) for it in written)
    assert page.js("doc => GT.buildModel(doc).header.anomalies.items", doc) == written


@pytest.mark.browser
def test_hover_shows_the_scopes_numbers(page: Page, server: ViewerServer, doc: dict[str, Any]) -> None:
    page.open(server.url)
    for scope in (1, 4):  # a warm matmul on stream 0, the copy on stream s1
        g = next(e for e in events(doc, "X", "gpu") if e["bind_id"] == scope)
        wait = next(e for e in events(doc, "b", "queued") if e["id2"]["local"] == scope)
        cpu = events(doc, "X", "cpu")[scope]
        sid = page.js("s => gputraceViewer.sliceOf('gpu', s)", scope)
        page.js("id => gputraceViewer.zoomToSlice(id)", sid)
        pt = page.js("id => gputraceViewer.slicePoint(id)", sid)
        assert pt["visible"]
        page.page.mouse.move(pt["x"], pt["y"])
        tip = page.page.locator("#tooltip")
        tip.wait_for(state="visible")
        text = tip.inner_text()
        a = g["args"]
        assert text.splitlines()[0] == g["name"]
        for expected in (
            f"GPU\t{fmt_dur(g['dur'])}\tt = {fmt_ts(g['ts'])}",
            f"queued (submit → start)\t{fmt_dur(round(g['ts'] - wait['ts'], 3))}",
            f"CPU enqueue\t{fmt_dur(cpu['dur'])}\tt = {fmt_ts(cpu['ts'])}",
            f"submitted\tt = {fmt_ts(wait['ts'])}",
            f"alignment uncertainty\t± {fmt_dur(a['uncertainty_us'])}",
        ):
            assert expected in text, (expected, text)
    # the empty GPU span: its anomaly flag is shown
    sid = page.js("s => gputraceViewer.sliceOf('gpu', s)", 6)
    page.js("id => gputraceViewer.zoomToSlice(id)", sid)
    pt = page.js("id => gputraceViewer.slicePoint(id)", sid)
    page.page.mouse.move(pt["x"], pt["y"])
    assert "empty_gpu_span" in page.page.locator("#tooltip").inner_text()
    assert page.errors == []


@pytest.mark.browser
def test_durations_read_the_same_in_the_viewer_and_in_python(page: Page, server: ViewerServer) -> None:
    """viewer/format.js GT.fmtNs against the table gputrace/durations.py is tested against."""
    cases = json.loads((Path(__file__).parents[1] / "data" / "durations.json").read_text("utf-8"))["cases"]
    page.open(server.url)
    shown = page.js("cs => cs.map(c => GT.fmtNs(c[0]))", cases)
    assert shown == [text for _, text in cases]
    assert page.js("[GT.fmtDur(999.999), GT.fmtDur(null), GT.fmtNs(NaN)]") == ["1.00 ms", "—", "—"]


@pytest.mark.browser
def test_zoom_and_pan_with_wheel_keys_and_drag(page: Page, server: ViewerServer) -> None:
    page.open(server.url)
    box = page.page.locator("#canvas").bounding_box()
    x, y = box["x"] + 200 + (box["width"] - 200) * 0.5, box["y"] + 100

    def view() -> tuple[float, float]:
        v = page.js("gputraceViewer.view()")
        return v["start"], v["end"]

    def time_at(v: tuple[float, float], px: float) -> float:
        return v[0] + (px - box["x"] - 200) * (v[1] - v[0]) / (box["width"] - 200)

    before = view()
    page.page.mouse.move(x, y)
    page.page.mouse.wheel(0, -400)
    page.wait(f"gputraceViewer.view().end - gputraceViewer.view().start < {before[1] - before[0]}")
    after = view()
    assert after[1] - after[0] < 0.75 * (before[1] - before[0])
    assert time_at(after, x) == pytest.approx(time_at(before, x), abs=1e-6 * (before[1] - before[0]))
    page.page.locator("#canvas").focus()
    page.page.keyboard.press("s")
    wider = view()
    assert wider[1] - wider[0] == pytest.approx((after[1] - after[0]) * 1.25)
    page.page.keyboard.press("d")
    panned = view()
    assert panned[0] == pytest.approx(wider[0] + 0.2 * (wider[1] - wider[0]))
    # drag 200 px to the right: the view moves 200 px worth of time to the left
    page.page.mouse.move(x, y)
    page.page.mouse.down()
    page.page.mouse.move(x + 100, y)
    page.page.mouse.move(x + 200, y)
    page.page.mouse.up()
    dragged = view()
    per_px = (panned[1] - panned[0]) / (box["width"] - 200)
    assert dragged[0] == pytest.approx(panned[0] - 200 * per_px, rel=1e-6, abs=1e-6)
    page.page.keyboard.press("0")
    assert view() == pytest.approx(before)


@pytest.mark.browser
def test_scope_names_and_args_are_text_not_html(
    page: Page, server: ViewerServer, doc: dict[str, Any]
) -> None:
    page.open(server.url)
    scope = next(i for i, e in enumerate(events(doc, "X", "cpu")) if e["name"] == XSS)
    for kind in ("cpu", "gpu"):
        sid = page.js("([k, s]) => gputraceViewer.sliceOf(k, s)", [kind, scope])
        page.js("id => gputraceViewer.zoomToSlice(id)", sid)
        pt = page.js("id => gputraceViewer.slicePoint(id)", sid)
        page.page.mouse.move(pt["x"], pt["y"])
        page.page.locator("#tooltip").wait_for(state="visible")
        text = page.page.locator("#tooltip").inner_text()
        assert text.splitlines()[0] == XSS and XSS_ARG in text
        page.page.mouse.click(pt["x"], pt["y"])
        assert page.page.locator("#details-body .tt-title").inner_text() == XSS
    page.page.locator("#search").fill("img src")
    assert page.page.locator("#search-count").inner_text() == "1 match"
    cells = page.page.locator("#summary td.text").all_inner_texts()
    assert XSS in cells
    assert page.js("document.querySelectorAll('img, script:not([src])').length") == 0
    assert page.dialogs == [] and page.errors == []


@pytest.mark.browser
def test_summary_table_matches_the_trace_sorts_and_highlights(
    page: Page, server: ViewerServer, doc: dict[str, Any]
) -> None:
    page.open(server.url)
    cpu, gpu = events(doc, "X", "cpu"), events(doc, "X", "gpu")
    rows = {r["name"]: r for r in page.js("gputraceViewer.summary()")}
    assert set(rows) == {e["name"] for e in cpu}
    for name, r in rows.items():
        calls = [e for e in cpu if e["name"] == name]
        timed = [e["dur"] for e in gpu if e["name"] == name]
        assert r["calls"] == len(calls)
        assert r["cold"] == sum("cold" in e.get("args", {}).get("flags", []) for e in calls)
        assert r["gpuTotal"] == (pytest.approx(sum(timed)) if timed else None)
    # matmul: 1 cold + 2 warm calls; the median is over the warm ones
    warm = [e["dur"] for e in gpu if e["name"] == "matmul" and not e["args"]["flags"]]
    assert rows["matmul"]["gpuMedian"] == pytest.approx(sorted(warm)[len(warm) // 2])
    assert rows["empty"]["anomalies"] == 1
    # default order: GPU total, largest first; a click on "Calls" sorts by calls
    names = page.page.locator("#summary tbody td.text").all_inner_texts()
    totals = [rows[n]["gpuTotal"] or -1 for n in names]
    assert totals == sorted(totals, reverse=True)
    page.page.locator("#summary th", has_text="Calls").click()
    calls = [rows[n]["calls"] for n in page.page.locator("#summary tbody td.text").all_inner_texts()]
    assert calls == sorted(calls, reverse=True) and calls[0] == 3
    # a click on a row highlights that name's scopes
    page.page.locator("#summary tbody tr", has_text="matmul").click()
    assert page.page.locator("#highlight-name").inner_text() == "matmul"
    assert page.page.locator("#summary tbody tr.active td.text").inner_text() == "matmul"
    assert page.js("gputraceViewer.stats().highlighted") == 3 * 3  # CPU, queued and GPU slice each
    page.page.locator("#summary tbody tr.active").click()
    assert page.js("gputraceViewer.stats().highlighted") is None


@pytest.mark.browser
def test_search_click_select_and_anomalies(page: Page, server: ViewerServer, doc: dict[str, Any]) -> None:
    page.open(server.url)
    cpu = events(doc, "X", "cpu")
    page.page.locator("#search").fill("MAT")
    assert page.page.locator("#search-count").inner_text() == "3 matches"
    page.page.locator("#search").press("Enter")
    first = page.js("gputraceViewer.sliceOf('cpu', 0)")
    assert page.js("gputraceViewer.stats().selected") == first
    assert page.page.locator("#details-body .tt-title").inner_text() == cpu[0]["name"]
    page.page.locator("#search").press("Enter")
    assert page.js("gputraceViewer.stats().selected") == page.js("gputraceViewer.sliceOf('cpu', 1)")
    # anomalies: the header's list; a click selects the scope's GPU slice
    page.page.locator("#tabs button", has_text="Anomalies").click()
    items = page.page.locator("#anomaly-list li")
    assert items.count() == len(doc["gputrace"]["anomalies"]["items"]) == 1
    items.first.click()
    scope = doc["gputrace"]["anomalies"]["items"][0]["scope"]
    assert page.js("gputraceViewer.stats().selected") == page.js(f"gputraceViewer.sliceOf('gpu', {scope})")
    assert "empty_gpu_span" in page.page.locator("#details-body").inner_text()
    # the example, written as its scope and kinds, is listed with its name and what it means
    text = items.first.inner_text()
    assert "empty" in text and "no GPU work ran inside this scope" in text


@pytest.mark.browser
def test_gzip_trace_loads_through_the_server(
    browser: Any, tmp_path: Path, golden: Path, doc: dict[str, Any]
) -> None:
    gz = tmp_path / "golden.json.gz"
    gz.write_bytes(gzip.compress(golden.read_bytes()))
    with ViewerServer(gz) as srv:
        srv.start_background()
        p = Page(browser, srv.origin)
        try:
            st = p.open(srv.url)
            assert st["file"] == "golden.json.gz"
            assert st["slices"]["gpu"] == len(events(doc, "X", "gpu"))
            assert p.errors == [] and p.foreign == []
        finally:
            p.close()


@pytest.mark.browser
def test_page_opened_directly_reads_picked_and_dropped_files(
    browser: Any, tmp_path: Path, golden: Path, doc: dict[str, Any]
) -> None:
    p = Page(browser, None)
    try:
        p.page.goto((ROOT / "viewer" / "index.html").as_uri())
        assert p.page.locator("#empty").is_visible()
        gz = tmp_path / "picked.json.gz"
        gz.write_bytes(gzip.compress(golden.read_bytes()))
        p.page.locator("#file-input").set_input_files(str(gz))
        st = p.wait_loaded()
        assert st["file"] == "picked.json.gz" and st["scopes"] == len(events(doc, "X", "cpu"))
        # a drop: the same bytes as a File in a DataTransfer
        p.js(
            """text => {
                const dt = new DataTransfer();
                dt.items.add(new File([text], 'dropped.json', {type: 'application/json'}));
                window.dispatchEvent(new DragEvent('drop', {dataTransfer: dt, cancelable: true}));
            }""",
            golden.read_text(),
        )
        p.wait("gputraceViewer.stats().file === 'dropped.json'")
        assert p.js("gputraceViewer.stats().slices.queued") == len(events(doc, "b", "queued"))
        assert p.errors == [] and p.foreign == []
    finally:
        p.close()


@pytest.mark.browser
def test_bad_dropped_file_says_what_is_wrong(browser: Any) -> None:
    p = Page(browser, None)
    try:
        p.page.goto((ROOT / "viewer" / "index.html").as_uri())
        p.js("""() => {
            const dt = new DataTransfer();
            dt.items.add(new File(['{"traceEvents": [1,'], 'broken.json'));
            window.dispatchEvent(new DragEvent('drop', {dataTransfer: dt, bubbles: true, cancelable: true}));
        }""")  # fmt: skip
        p.wait("document.getElementById('status').textContent.length > 0")
        assert p.page.locator("#status").inner_text().startswith("broken.json: not valid JSON")
    finally:
        p.close()


FAKE_PERFETTO = """<!doctype html><title>fake perfetto</title><script>
window.addEventListener('message', e => {
  if (e.data === 'PING') { e.source.postMessage('PONG', '*'); return; }
  if (e.data && e.data.perfetto) {
    const p = e.data.perfetto;
    window.got = {origin: e.origin, title: p.title, text: new TextDecoder().decode(p.buffer)};
  }
});
</script>"""


@pytest.mark.browser
def test_perfetto_page_hands_the_trace_over_by_postmessage(
    browser: Any, tmp_path: Path, golden: Path
) -> None:
    """ui.perfetto.dev is played by a local stand-in that speaks its PING/PONG protocol."""
    gz = tmp_path / "run.json.gz"
    gz.write_bytes(gzip.compress(golden.read_bytes()))
    with ViewerServer(gz) as srv:
        srv.start_background()
        p = Page(browser, srv.origin)
        try:
            p.context.route("https://ui.perfetto.dev/**", lambda r: r.fulfill(
                status=200, content_type="text/html", body=FAKE_PERFETTO))  # fmt: skip
            p.page.goto(srv.perfetto_url + "&auto=0")
            p.wait("window.gputracePerfetto && gputracePerfetto.ready")
            with p.context.expect_page() as popup_info:
                p.page.locator("#open").click()
            popup = popup_info.value
            wait_js(popup, "window.got !== undefined", 10.0)
            got = popup.evaluate("window.got")
            assert got["origin"] == srv.origin and got["title"] == "run.json.gz"
            assert got["text"] == golden.read_text()  # sent decompressed
            p.wait("gputracePerfetto.sent")
            assert p.errors == []
        finally:
            p.close()


@pytest.mark.browser
def test_summary_and_details_show_the_figures_the_trace_args_carry(
    browser: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.builders import T0, cupti_trace

    path = tmp_path / "ops.json"
    t = cupti_trace(tmp_path, monkeypatch, path)
    with ViewerServer(path) as srv:
        srv.start_background()
        p = Page(browser, srv.origin)
        try:
            p.open(srv.url)
            rows = {r["name"]: r for r in p.js("gputraceViewer.summary()")}
            # the numbers of tests/resolve/test_figures.py: warm medians, self over all calls
            assert (rows["tiny"]["busyMedian"], rows["tiny"]["selfTotal"]) == (1.5, 3.0)
            assert (rows["step"]["busyMedian"], rows["step"]["selfTotal"]) == (52.7, 0.4)
            assert rows["tiny"]["freeMedian"] == 4.5 and rows["big"]["freeMedian"] is None
            assert rows["step"]["queuedMedian"] == 2.0  # from the first launch call, not the entry
            # self CPU over all calls: the step less tiny and big, each twice
            assert {n: rows[n]["selfCpuTotal"] for n in ("step", "tiny", "big")} == {
                "step": 202.0, "tiny": 22.0, "big": 4.0}  # fmt: skip
            (step0,) = [sc.index for sc in t.find("step") if sc.cpu_start_ns == T0]
            p.page.locator("#tabs button", has_text="Summary").click()
            p.js(f"gputraceViewer.select(gputraceViewer.sliceOf('gpu', {step0}))")
            text = p.page.locator("#details-body").inner_text()
            assert "GPU busy" in text and "GPU self" in text and "if launches were free" in text
            assert f"CPU self (not in child scopes)\t{fmt_dur(101.0)}" in text
            assert "estimate" in text and p.errors == []
        finally:
            p.close()


@pytest.mark.browser
def test_an_older_cupti_file_is_queued_from_its_first_launch_call(browser: Any) -> None:
    """tests/data/cuda_h200.json.gz was written when a scope's submission was its entry: its cold
    matmul's queued slice spans the 150 ms compile. The viewer takes the first launch call, as
    gputrace/figures.py does, and agrees with ``summarize``."""
    from gputrace import figures

    kept = ROOT / "tests" / "data" / "cuda_h200.json.gz"
    t = gputrace.load(kept)
    queued = figures.queued_ns(t)
    (cold,) = [sc.index for sc in t.find("matmul") if sc.flags & gputrace.model.Flag.COLD]
    (step,) = [sc.index for sc in t.find("step") if sc.flags & gputrace.model.Flag.COLD]
    with ViewerServer(kept) as srv:
        srv.start_background()
        p = Page(browser, srv.origin)
        try:
            p.open(srv.url)
            for sc in (cold, step):
                q = p.js(f"gputraceViewer.sliceOf('queued', {sc})")
                assert q >= 0
                p.js(f"gputraceViewer.select({q})")
                text = p.page.locator("#details-body").inner_text()
                assert f"queued (submit → start)\t{fmt_dur(queued[sc] / 1000)}" in text, text
            assert 20_000 < queued[cold] < 40_000  # µs, where the file says 150 ms
            rows = {r["name"]: r for r in p.js("gputraceViewer.summary()")}
            assert rows["matmul"]["queuedMedian"] == pytest.approx(8.704, abs=1e-3)  # summarize's median
            assert p.errors == []
        finally:
            p.close()


@pytest.mark.browser
def test_the_cold_h200_trace_is_queued_from_its_launch_calls(browser: Any) -> None:
    """tests/data/cuda_h200_cold.json.gz says its cold matmul was queued 180.7 ms (from the
    scope's entry); its kernel started 38.758 µs after its launch call, as summarize says."""
    from gputrace import figures

    kept = ROOT / "tests" / "data" / "cuda_h200_cold.json.gz"
    t = gputrace.load(kept)
    queued = figures.queued_ns(t)
    (cold,) = [sc.index for sc in t.find("cold matmul")]
    (scale,) = [sc.index for sc in t.find("scale") if sc.flags & gputrace.model.Flag.COLD]
    assert (queued[cold], queued[scale]) == (38_758, 45_077)
    with ViewerServer(kept) as srv:
        srv.start_background()
        p = Page(browser, srv.origin)
        try:
            p.open(srv.url)
            for sc in (cold, scale):
                q = p.js(f"gputraceViewer.sliceOf('queued', {sc})")
                p.js(f"gputraceViewer.select({q})")
                text = p.page.locator("#details-body").inner_text()
                assert f"queued (submit → start)\t{fmt_dur(queued[sc] / 1000)}" in text, text
            rows = {r["name"]: r for r in p.js("gputraceViewer.summary()")}
            assert rows["cold matmul"]["queuedMedian"] == 38.758  # its one (cold) call
            assert rows["cold matmul"]["selfCpuTotal"] == 180_708.331
            assert p.errors == []
        finally:
            p.close()


@pytest.mark.browser
def test_self_cpu_time_of_a_torch_trace_reads_as_summarize_says(browser: Any) -> None:
    from gputrace.exporters.reader import from_chrome
    from gputrace.summary import summarize

    kept = ROOT / "tests" / "data" / "torch_h200.json.gz"
    s = summarize(from_chrome(json.loads(gzip.decompress(kept.read_bytes())), str(kept)))
    ours = {r["name"]: r["self_ns"]["cpu_total"] / 1e3 for r in s["rows"] if r["queue"] is None}
    with ViewerServer(kept) as srv:
        srv.start_background()
        p = Page(browser, srv.origin)
        try:
            p.open(srv.url)
            shown = {r["name"]: r["selfCpuTotal"] for r in p.js("gputraceViewer.summary()")}
            cpu = {n: v for n, v in shown.items() if v is not None}
            assert set(cpu) == set(ours)  # kernels and GPU ranges have none
            for name, v in cpu.items():
                assert v == pytest.approx(ours[name], abs=0.002), name
            # Kineto's overhead inside aten::mm, on a track of its own (pid -1), is its child
            assert cpu["aten::mm"] == pytest.approx(410.706, abs=0.002)
            # ordered by self CPU time, as key_averages and summarize order it
            names = p.page.locator("#summary tbody td.text").all_inner_texts()
            assert names[:3] == ["Activity Buffer Request", "aten::mm", "matmul"]
            assert names[:3] == [r["name"] for r in s["rows"][:3]]
            assert p.errors == []
        finally:
            p.close()


@pytest.mark.browser
def test_a_weak_clock_fit_says_why_in_the_trace_facts(browser: Any, tmp_path: Path) -> None:
    from gputrace import exporters
    from tests.builders import SAMPLES, TIGHT, WIDE, record

    trace, _ = record(lambda k: TIGHT if k < SAMPLES else WIDE)
    path = exporters.write(trace, tmp_path / "weak.json")
    with ViewerServer(path) as srv:
        srv.start_background()
        p = Page(browser, srv.origin)
        try:
            p.open(srv.url)
            text = p.page.locator("#info").inner_text()
            assert "(4 samples). Weak fit: the clock fit rests on 4 calibration samples from 0.347 ms" in text
            assert p.errors == []
        finally:
            p.close()
