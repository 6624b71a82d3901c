"""The viewer server under a burst of requests and a pile of idle connections.

    python3 benchmarks/viewer_server_load.py [--trace tests/data/story.json] [--idle 200]

Prints, for bursts of 200 and 1,000 parallel requests for the trace, the median and p99
latency and how many failed (30 s timeout); then how many of ``--idle`` connections that never
send a request the server has closed after its idle timeout (plus 2 s).
"""

from __future__ import annotations

import argparse
import contextlib
import socket
import threading
import time
import urllib.request
from pathlib import Path

from gputrace.viewer_server import IDLE_TIMEOUT_S, LISTEN_BACKLOG, ViewerServer

ROOT = Path(__file__).resolve().parent.parent


def burst(url: str, n: int) -> str:
    latency = [float("inf")] * n

    def one(i: int) -> None:
        t0 = time.perf_counter()
        try:
            urllib.request.urlopen(url, timeout=30).read()
            latency[i] = time.perf_counter() - t0
        except OSError:
            pass

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ok = sorted(x for x in latency if x != float("inf"))
    if not ok:
        return f"{n:>5} parallel: all failed"
    p50, p99 = ok[len(ok) // 2], ok[max(0, int(len(ok) * 0.99) - 1)]
    return f"{n:>5} parallel: p50 {p50 * 1e3:7.0f} ms   p99 {p99 * 1e3:7.0f} ms   failed {n - len(ok)}"


def idle(port: int, n: int) -> str:
    socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(n)]
    time.sleep(IDLE_TIMEOUT_S + 2)
    closed = 0
    for s in socks:
        s.setblocking(False)
        with contextlib.suppress(BlockingIOError):  # still open: nothing to read yet
            closed += s.recv(1) == b""
        s.close()
    return f"{n:>5} idle connections: {closed} closed by the server after {IDLE_TIMEOUT_S + 2:g} s"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trace", default=str(ROOT / "tests" / "data" / "story.json"))
    ap.add_argument("--idle", type=int, default=200)
    args = ap.parse_args()
    with ViewerServer(args.trace) as srv:
        srv.start_background()
        print(f"backlog {LISTEN_BACKLOG}, idle timeout {IDLE_TIMEOUT_S:g} s, trace {args.trace}")
        for n in (200, 1000):
            print(burst(srv.trace_url, n))
        print(idle(srv.port, args.idle))


if __name__ == "__main__":
    main()
