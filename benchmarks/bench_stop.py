"""What stopping a session costs, split into resolving and writing, on every backend that runs here.

    python3 benchmarks/bench_stop.py [--sizes 60,1000,20000] [--backends fake,cpu,wgpu] [--reps 7]

Each session records N empty scopes (on wgpu, one tiny compute pass each) and is stopped; the
stop is timed from the end of the ``with`` body to the line after it, and split into:

- resolve: the resolver (clock fit and band, placing GPU spans, nesting, flags), the final clock
  fit of a streamed file, and the streamed chunks' session-wide flags;
- write:   the exporter (the whole file, or a streamed file's last chunks and its final header);
- other:   the rest (the backend's last sync and read-back, draining the recorder, the header).

Three ways to stop: no file; a ``.json`` written as the program runs (the default, ``stream``);
a ``.json`` written at stop (``stream=False``). Repetitions are interleaved over every row and the
median is printed, so load on the machine hits every row alike. ``--sync-every K`` adds a
``gputrace.sync()`` every K scopes (more calibration samples; a streamed file then writes most
chunks before the stop).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gputrace
import gputrace.chunks
import gputrace.exporters
import gputrace.fallback
import gputrace.resolver
import gputrace.streaming

MODES = ("no file", "streamed", "at stop")


class Clocked:
    """Time spent inside the patched functions, by kind; only the outermost call counts."""

    def __init__(self) -> None:
        self.ns = {"resolve": 0, "write": 0}
        self.depth = 0

    def wrap(self, kind: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            if self.depth:
                return fn(*args, **kwargs)
            self.depth += 1
            t0 = time.perf_counter_ns()
            try:
                return fn(*args, **kwargs)
            finally:
                self.ns[kind] += time.perf_counter_ns() - t0
                self.depth -= 1

        return timed

    def reset(self) -> None:
        self.ns = {"resolve": 0, "write": 0}


CLOCKED = Clocked()


class TimedWriter:
    """A format's stream writer whose ``append`` and ``close`` count as writing."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.append = CLOCKED.wrap("write", inner.append)
        self.close = CLOCKED.wrap("write", inner.close)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def install() -> None:
    c = CLOCKED
    gputrace.fallback.resolve = c.wrap("resolve", gputrace.fallback.resolve)  # a session's resolve at stop
    gputrace.chunks.resolve = c.wrap("resolve", gputrace.chunks.resolve)
    gputrace.resolver._fits = c.wrap("resolve", gputrace.resolver._fits)
    st = gputrace.chunks.Resolving
    st._session_flags = c.wrap("resolve", st._session_flags)  # type: ignore[method-assign]
    gputrace.exporters.write = c.wrap("write", gputrace.exporters.write)
    make = gputrace.exporters.stream_writer
    gputrace.exporters.stream_writer = lambda path, header: TimedWriter(make(path, header))


class WgpuWork:
    """One tiny compute pass per scope on lavapipe (or whatever adapter wgpu finds)."""

    SHADER = """
    @group(0) @binding(0) var<storage, read_write> data: array<f32>;
    @compute @workgroup_size(64)
    fn main(@builtin(global_invocation_id) id: vec3<u32>) { data[id.x] = data[id.x] + 1.0; }
    """

    def __init__(self) -> None:
        import wgpu

        adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
        self.device = device = adapter.request_device_sync(required_features=["timestamp-query"])
        self.name = adapter.info["device"]
        buf = device.create_buffer(size=256, usage=wgpu.BufferUsage.STORAGE)
        module = device.create_shader_module(code=self.SHADER)
        self.pipeline = device.create_compute_pipeline(
            layout="auto", compute={"module": module, "entry_point": "main"}
        )
        self.bind_group = device.create_bind_group(
            layout=self.pipeline.get_bind_group_layout(0),
            entries=[{"binding": 0, "resource": {"buffer": buf}}],
        )

    def step(self) -> None:
        enc = self.device.create_command_encoder()
        cpass = enc.begin_compute_pass()
        cpass.set_pipeline(self.pipeline)
        cpass.set_bind_group(0, self.bind_group)
        cpass.dispatch_workgroups(1)
        cpass.end()
        self.device.queue.submit([enc.finish()])


def one_stop(backend: str, n: int, mode: str, folder: Path, sync_every: int, work: Any) -> tuple[float, ...]:
    """(stop, resolve, write) in ms for one session of ``n`` scopes."""
    path = None if mode == "no file" else folder / f"{backend}-{n}.json"
    options = {"device": work.device} if work is not None else {}
    step = work.step if work is not None else None
    trace = gputrace.trace
    with gputrace.session(
        path, backend=backend, backend_options=options, quiet=True, stream=mode == "streamed"
    ):
        for i in range(n):
            with trace("step"):
                if step is not None:
                    step()
            if sync_every and i % sync_every == sync_every - 1:
                gputrace.sync()
        CLOCKED.reset()
        t0 = time.perf_counter_ns()
    total = time.perf_counter_ns() - t0
    return total / 1e6, CLOCKED.ns["resolve"] / 1e6, CLOCKED.ns["write"] / 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--sizes", default="60,1000,20000")
    ap.add_argument("--backends", default="fake,cpu,wgpu")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--sync-every", type=int, default=0)
    ap.add_argument("--wgpu-max", type=int, default=1000, help="largest session on wgpu (passes are slow)")
    opts = ap.parse_args()
    sizes = [int(x) for x in opts.sizes.split(",")]
    install()
    works: dict[str, Any] = {}
    for b in opts.backends.split(","):
        if b == "wgpu":
            try:
                works[b] = WgpuWork()
            except Exception as exc:  # no wgpu or no adapter here: say so, measure the rest
                print(f"wgpu skipped: {type(exc).__name__}: {exc}")
                continue
        else:
            works[b] = None
    rows = [(b, n, m) for b in works for n in sizes if b != "wgpu" or n <= opts.wgpu_max for m in MODES]
    got: dict[tuple[str, int, str], list[tuple[float, ...]]] = {r: [] for r in rows}
    with tempfile.TemporaryDirectory() as tmp:
        for r in rows:  # warm up (imports, first-call costs)
            one_stop(*r, Path(tmp), opts.sync_every, works[r[0]])
        for _ in range(opts.reps):
            for r in rows:
                got[r].append(one_stop(*r, Path(tmp), opts.sync_every, works[r[0]]))
    if "wgpu" in works:
        print(f"wgpu adapter: {works['wgpu'].name}")
    print(f"session stop, ms, median of {opts.reps} (interleaved); sync every {opts.sync_every or '-'}")
    print(f"{'backend':8} {'scopes':>7} {'file':9} {'stop':>8} {'resolve':>8} {'write':>8} {'other':>8}"
          f" {'stop-write':>11}")  # fmt: skip
    for r in rows:
        stop, res, wr = (statistics.median(v[k] for v in got[r]) for k in range(3))
        other = statistics.median(v[0] - v[1] - v[2] for v in got[r])
        beyond = statistics.median(v[0] - v[2] for v in got[r])
        b, n, m = r
        print(f"{b:8} {n:>7} {m:9} {stop:>8.2f} {res:>8.2f} {wr:>8.2f} {other:>8.2f} {beyond:>11.2f}")


if __name__ == "__main__":
    main()
