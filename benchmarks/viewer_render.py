"""How the viewer copes with big traces: load time and frame times in headless Chromium.

    python3 benchmarks/viewer_render.py [--scopes 1000,10000,100000]

Writes fake-backend traces of N scopes (each with its CPU, queued and GPU slice and a launch
arrow, so 3·N slices), serves each with ``gputrace view``'s server and asks the page to draw
frames at several zoom levels. A frame under 16 ms keeps up with a 60 Hz display.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gputrace
from gputrace.backends.fake import FakeBackend
from gputrace.clock import FakeClock
from gputrace.viewer_server import ViewerServer

ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]  # fmt: skip
NAMES = ["matmul", "softmax", "layernorm", "copy", "attention", "gelu", "reduce", "scatter"]


def write_trace(path: Path, scopes: int) -> None:
    clock = FakeClock(1_000_000_000, 500)
    fake = FakeBackend(clock, script=lambda name, i: (3_000 + (i % 7) * 500, 4_000 + (i % 11) * 900))
    with gputrace.session(path, backend=fake, clock=clock, quiet=True):
        for i in range(scopes // 2):
            with gputrace.trace("step"):
                with gputrace.trace(NAMES[i % len(NAMES)], stream="s1" if i % 3 == 0 else None):
                    pass
            if i % 1000 == 999:
                gputrace.sync()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scopes", default="1000,10000,100000")
    sizes = [int(x) for x in ap.parse_args().scopes.split(",")]
    from playwright.sync_api import sync_playwright

    rows = []
    with sync_playwright() as p, tempfile.TemporaryDirectory() as tmp:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=ARGS)
        for n in sizes:
            path = Path(tmp) / f"t{n}.json.gz"
            write_trace(path, n)
            with ViewerServer(path) as srv:
                srv.start_background()
                page = browser.new_page(viewport={"width": 1600, "height": 900})
                t0 = time.perf_counter()
                page.goto(srv.url)
                while not page.evaluate("window.gputraceViewer && gputraceViewer.stats().loaded"):
                    page.wait_for_timeout(20)
                load_s = time.perf_counter() - t0
                ext = page.evaluate("gputraceViewer.stats().extent")
                span = ext["end"] - ext["start"]
                for label, frac in (("all", 1.0), ("1/10", 0.1), ("1/1000", 0.001)):
                    mid = ext["start"] + span / 2
                    page.evaluate(f"gputraceViewer.setView({mid - span * frac / 2}, {mid + span * frac / 2})")
                    frames = [page.evaluate("gputraceViewer.draw()") for _ in range(15)]
                    ms = [f["ms"] for f in frames]
                    rows.append((n, f"{path.stat().st_size / 1e6:.1f}", f"{load_s:.2f}", label,
                                 frames[-1]["slicesVisited"], frames[-1]["rects"],
                                 f"{statistics.median(ms):.1f}", f"{max(ms):.1f}"))  # fmt: skip
                page.close()
        browser.close()
    head = ("scopes", "gz MB", "load s", "view", "visited", "rects", "frame ms (median)", "max")
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    for r in [head, *rows]:
        print("  ".join(str(c).rjust(w) for c, w in zip(r, widths, strict=True)))


if __name__ == "__main__":
    main()
