"""The viewer server under load and misuse: a real backlog, idle connections closed, and clients
that go away mid-answer are not errors (nothing printed, the server keeps serving)."""

from __future__ import annotations

import os
import signal
import socket
import struct
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import orjson
import pytest

from gputrace.errors import GputraceError
from gputrace.viewer_server import LISTEN_BACKLOG, ViewerServer
from tests.builders import child_env

DATA = Path(__file__).parents[1] / "data"
ROOT = Path(__file__).parents[2]


def test_listen_backlog_and_idle_timeout_are_set() -> None:
    with ViewerServer(DATA / "story.json") as srv:
        assert srv.httpd.request_queue_size == LISTEN_BACKLOG >= 128
        assert srv.idle_timeout_s == 10.0


def test_a_burst_of_connections_is_queued_not_refused() -> None:
    """More simultaneous connections than the old backlog of 5, before the server accepts any."""
    with ViewerServer(DATA / "story.json") as srv:
        socks = []
        for _ in range(100):  # the server is not serving yet: each waits in the listen backlog
            s = socket.socket()
            s.setblocking(False)
            err = s.connect_ex(("127.0.0.1", srv.port))
            assert err in (0, 115), os.strerror(err)  # 0 or EINPROGRESS, never ECONNREFUSED
            socks.append(s)
        srv.start_background()
        try:
            for s in socks:
                s.setblocking(True)
                s.settimeout(20)
                s.sendall(f"GET /trace.json HTTP/1.0\r\nHost: 127.0.0.1:{srv.port}\r\n\r\n".encode())
            for s in socks:
                assert s.recv(12) == b"HTTP/1.0 200"
        finally:
            for s in socks:
                s.close()


def test_an_idle_connection_is_closed() -> None:
    with ViewerServer(DATA / "story.json", idle_timeout_s=0.5) as srv:
        srv.start_background()
        with socket.create_connection(("127.0.0.1", srv.port), timeout=30) as s:
            t0 = time.monotonic()
            assert s.recv(100) == b""  # closed by the server, without a request
            assert time.monotonic() - t0 < 20
        # and the server still answers
        assert urllib.request.urlopen(srv.trace_url, timeout=20).status == 200


def test_client_disconnects_print_nothing(tmp_path: Path) -> None:
    """Tabs closed mid-download (connection reset): no traceback, nothing on stderr at all."""
    big = tmp_path / "big.json"
    doc = orjson.loads((DATA / "story.json").read_bytes())
    doc["pad"] = "x" * (16 << 20)  # larger than the socket buffers: the server is mid-write
    big.write_bytes(orjson.dumps(doc))
    proc = subprocess.Popen(
        [sys.executable, "-m", "gputrace", "view", str(big), "--no-browser"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=child_env(),
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        port = int(line.split("http://127.0.0.1:")[1].split("/")[0])
        for _ in range(5):
            s = socket.create_connection(("127.0.0.1", port), timeout=20)
            s.sendall(f"GET /trace.json HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
            s.recv(1000)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            s.close()  # RST: the server's next write fails with ConnectionReset / BrokenPipe
        time.sleep(1.0)
        ok = urllib.request.urlopen(f"http://127.0.0.1:{port}/trace.json", timeout=20).read()
        assert len(ok) == big.stat().st_size
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=20)
    assert err == "", err
    assert out.strip().endswith("gputrace: stopped.")


def test_server_refuses_a_fifo_instead_of_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe_bad.json"
    os.mkfifo(fifo)
    with pytest.raises(GputraceError, match=r"is a FIFO \(named pipe\), not a trace file"):
        ViewerServer(fifo)
