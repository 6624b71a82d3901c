"""Writing a trace with many concurrent lanes: 8 threads × 10k scopes with fake GPU spans that
overlap on one queue (an out-of-order fake GPU), each format side by side (issue 20, defect 5).

    python3 benchmarks/bench_lanes.py [--threads 8] [--scopes 10000] [--repeat 3]

The trace is recorded once (a session with no file); then each format is written whole
(``exporters.write``, best of ``--repeat``), and one streamed session per format records the
same program to a file (start to stop, the stop's last chunk and final header included).
Times are wall seconds and this process's CPU seconds; the ratio is against ``.json``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import gputrace  # noqa: E402
import gputrace.exporters as exporters  # noqa: E402
from gputrace.backends.fake import FakeBackend  # noqa: E402
from gputrace.clock import session_clock  # noqa: E402

FORMATS = ("json", "json.gz", "pftrace")


def program(threads: int, scopes: int) -> None:
    def work() -> None:
        for i in range(scopes):
            with gputrace.trace("step", i=i % 3):
                pass

    ts = [threading.Thread(target=work) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


def backend() -> FakeBackend:
    # the default script (5 µs delay, 20 µs on the GPU), one in-order queue: the GPU falls behind
    # the 8 threads, so thousands of waits (submission -> start) are open at once
    return FakeBackend(session_clock)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--scopes", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    with gputrace.session(backend=backend(), clock=session_clock, quiet=True) as s:
        program(a.threads, a.scopes)
    trace = s.trace
    assert trace is not None
    print(f"{a.threads} threads x {a.scopes} scopes: {len(trace)} scopes, "
          f"load average {os.getloadavg()[0]:.2f}")  # fmt: skip
    print(
        f"{'format':<8} {'write s':>8} {'cpu s':>7} {'x json':>7} {'session s':>10} {'x json':>7} {'MB':>7}"
    )
    base_w = base_s = 0.0
    with tempfile.TemporaryDirectory() as d:
        for fmt in FORMATS:
            path = Path(d) / f"t.{fmt}"
            best = (float("inf"), 0.0)
            for _ in range(a.repeat):
                w0, c0 = time.perf_counter(), time.process_time()
                exporters.write(trace, path)
                best = min(best, (time.perf_counter() - w0, time.process_time() - c0))
            size = path.stat().st_size / 1e6
            spath = Path(d) / f"s.{fmt}"
            t0 = time.perf_counter()
            with gputrace.session(spath, backend=backend(), clock=session_clock, quiet=True):
                program(a.threads, a.scopes)
            sess = time.perf_counter() - t0
            if fmt == "json":
                base_w, base_s = best[0], sess
            print(f"{fmt:<8} {best[0]:>8.2f} {best[1]:>7.2f} {best[0] / base_w:>7.2f} {sess:>10.2f} "
                  f"{sess / base_s:>7.2f} {size:>7.1f}")  # fmt: skip


if __name__ == "__main__":
    main()
