"""The cuda backend on a real GPU: overhead, accuracy, alignment and drift, measured in one run.

    python3 benchmarks/bench_cuda.py [--drift-s 60] [--json results.json]

Prints one table per question:

1. overhead: CPU µs per traced empty scope next to two bare CUDA event records,
   ``torch.profiler.record_function`` and ``nvtx.annotate`` on the same loop;
2. the empty-span floor: GPU durations of empty scopes and of empty kernels, idle and queued;
3. calibration windows: how tightly an event record, a ``%globaltimer`` stamp kernel, and a
   ``%globaltimer`` ping-pong through pinned memory can be bracketed by the CPU clock;
4. accuracy: scope GPU durations against CUPTI kernel durations (torch.profiler, same process,
   same kernels) for kernels of 10 µs … 10 ms;
5. alignment: each scope's GPU start on the CPU clock against the ``%globaltimer`` read by its
   kernel, mapped onto the CPU clock by an independent ping-pong fit (median, p99);
6. drift: the same error over a long run (``--drift-s``), early against late, next to the
   uncertainty the trace states.

Needs CuPy and a CUDA device; torch, nvtx are optional (their rows say so when missing).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gputrace
from gputrace.backends.base import CalibrationSample
from gputrace.backends.cuda_events import CudaEventsBackend as CudaBackend
from gputrace.clock import session_clock
from gputrace.resolver import fit_clock

KERNELS = r"""
extern "C" __global__ void spin_ns(unsigned long long ns, unsigned long long out_addr) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
    if (out_addr) {
        ((unsigned long long*)out_addr)[0] = t0;
        ((unsigned long long*)out_addr)[1] = t;
    }
}
extern "C" __global__ void busy_ns(unsigned long long ns) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
}
extern "C" __global__ void empty() {}
extern "C" __global__ void stamp(unsigned long long out_addr) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    *((volatile unsigned long long*)out_addr) = t;
    __threadfence_system();
}
extern "C" __global__ void pingpong(unsigned long long flag_addr, unsigned int want,
                                    unsigned long long out_addr, unsigned long long timeout_ns) {
    volatile unsigned int* flag = (volatile unsigned int*)flag_addr;
    volatile unsigned long long* out = (volatile unsigned long long*)out_addr;
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    out[1] = want;
    __threadfence_system();
    while (*flag != want) {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        if (t - t0 > timeout_ns) { out[0] = 1; __threadfence_system(); return; }
    }
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    out[0] = t;
    __threadfence_system();
}
"""

RESULTS: dict[str, Any] = {}


def pct(xs: list[float] | np.ndarray, q: float) -> float:
    return float(np.percentile(np.asarray(xs, dtype=np.float64), q)) if len(xs) else float("nan")


def table(title: str, header: list[str], rows: list[list[Any]]) -> None:
    print(f"\n## {title}")
    cells = [header] + [
        [c if isinstance(c, str) else f"{c:.3f}" if isinstance(c, float) else str(c) for c in r] for r in rows
    ]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    for j, r in enumerate(cells):
        print("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)))
        if j == 0:
            print("  ".join("-" * w for w in widths))


class Gpu:
    def __init__(self) -> None:
        import cupy

        self.cp = cupy
        self.mod = cupy.RawModule(code=KERNELS)
        self.spin_k = self.mod.get_function("spin_ns")
        self.empty_k = self.mod.get_function("empty")
        self.busy_k = self.mod.get_function("busy_ns")
        self.stamp_k = self.mod.get_function("stamp")
        self.pp_k = self.mod.get_function("pingpong")
        self.pinned = cupy.cuda.alloc_pinned_memory(64)
        self.p64 = np.frombuffer(self.pinned, np.uint64, 8)
        self.p32 = np.frombuffer(self.pinned, np.uint32, 16)
        self.p64[:] = 0
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self.seq = 0
        self.spin(1000)
        self.empty()
        cupy.cuda.Device().synchronize()

    def spin(self, ns: int, out_addr: int = 0) -> None:
        self.spin_k((1,), (1,), (np.uint64(ns), np.uint64(out_addr)))

    def busy(self, ns: int) -> None:
        self.busy_k((1,), (1,), (np.uint64(ns),))

    def empty(self) -> None:
        self.empty_k((1,), (1,), ())

    def stamp_sample(self) -> tuple[int, int, int]:
        """t0; launch a kernel that writes %globaltimer to pinned memory; poll it; t1."""
        out = self.p64
        out[4] = 0
        addr = np.uint64(self.pinned.ptr + 32)
        deadline = time.monotonic() + 5
        with self.stream:
            t0 = time.perf_counter_ns()
            self.stamp_k((1,), (1,), (addr,))
        while out[4] == 0:
            if time.monotonic() > deadline:
                raise RuntimeError("stamp kernel never wrote")
        t1 = time.perf_counter_ns()
        return t0, int(out[4]), t1

    def pingpong_sample(self) -> tuple[int, int, int] | None:
        """A kernel spins on a pinned flag; t0; set the flag; the kernel writes %globaltimer; t1."""
        self.seq += 1
        want = self.seq
        out = self.p64
        out[0] = 0
        out[1] = 0
        flag_addr = np.uint64(self.pinned.ptr + 48)
        with self.stream:
            self.pp_k(
                (1,), (1,), (flag_addr, np.uint32(want), np.uint64(self.pinned.ptr), np.uint64(200_000_000))
            )
        deadline = time.monotonic() + 5
        while out[1] != want:
            if time.monotonic() > deadline:
                raise RuntimeError("ping-pong kernel never started")
        t0 = time.perf_counter_ns()
        self.p32[12] = want
        while out[0] == 0:
            if time.monotonic() > deadline:
                raise RuntimeError("ping-pong kernel never answered")
        t1 = time.perf_counter_ns()
        g = int(out[0])
        self.stream.synchronize()
        return None if g == 1 else (t0, g, t1)

    def truth_samples(self, n: int) -> list[CalibrationSample]:
        out = []
        for _ in range(n):
            s = self.pingpong_sample()
            if s is not None:
                out.append(CalibrationSample(s[0], s[1], s[2], 0))
        return out


# 1. overhead ----------------------------------------------------------------------------------
def bench_overhead(gpu: Gpu, n: int = 20_000, rounds: int = 3) -> None:
    cp = gpu.cp
    rt = cp.cuda.runtime
    e1, e2 = cp.cuda.Event(), cp.cuda.Event()
    r1, r2 = rt.eventCreateWithFlags(0), rt.eventCreateWithFlags(0)
    sptr = cp.cuda.get_current_stream().ptr
    chunk = 2000

    def bare() -> None:
        for _ in range(n):
            pass

    def two_event_records() -> None:
        for _ in range(n):
            e1.record()
            e2.record()

    def two_raw_event_records() -> None:
        rec = rt.eventRecord
        for _ in range(n):
            rec(r1, sptr)
            rec(r2, sptr)

    def scoped(backend: str) -> Callable[[], float]:
        def run() -> float:
            tr = gputrace.trace("s")
            spent = 0
            with gputrace.session(backend=backend, quiet=True):
                for _ in range(n // chunk):
                    t0 = time.perf_counter_ns()
                    for _ in range(chunk):
                        with tr:
                            pass
                    spent += time.perf_counter_ns() - t0
                    gputrace.sync()  # outside the timed part: recycles the event pool
            return spent / 1e9

        return run

    rows: dict[str, list[float]] = {}
    variants: dict[str, Callable[[], Any]] = {
        "empty loop": bare,
        "2× cupy Event.record()": two_event_records,
        "2× runtime.eventRecord (raw)": two_raw_event_records,
        "gputrace scope, cuda": scoped("cuda"),
        "gputrace scope, cpu backend": scoped("cpu"),
    }
    try:
        import torch

        torch.cuda.init()
        rf = torch.profiler.record_function

        def record_function() -> None:
            for _ in range(n):
                with rf("s"):
                    pass

        def record_function_profiling() -> float:
            acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
            with torch.profiler.profile(activities=acts):
                t0 = time.perf_counter_ns()
                record_function()
                return (time.perf_counter_ns() - t0) / 1e9

        variants["torch record_function (no profiler)"] = record_function
        variants["torch record_function (profiler on)"] = record_function_profiling
    except Exception as exc:
        print(f"(torch unavailable: {exc})")
    try:
        import torch

        nvtx_range = torch.cuda.nvtx.range

        def torch_nvtx_range() -> None:
            for _ in range(n):
                with nvtx_range("s"):
                    pass

        variants["torch.cuda.nvtx.range"] = torch_nvtx_range
    except Exception as exc:
        print(f"(torch.cuda.nvtx unavailable: {exc})")
    try:
        import nvtx

        def nvtx_annotate() -> None:
            for _ in range(n):
                with nvtx.annotate("s"):
                    pass

        variants["nvtx.annotate"] = nvtx_annotate
    except Exception as exc:
        print(f"(nvtx unavailable: {exc})")
    try:
        from cupyx.profiler import time_range

        def cupyx_time_range() -> None:
            for _ in range(n):
                with time_range("s"):
                    pass

        variants["cupyx.profiler.time_range"] = cupyx_time_range
    except Exception as exc:
        print(f"(cupyx time_range unavailable: {exc})")

    for _ in range(rounds):  # interleaved rounds: load changes hit every variant alike
        for name, fn in variants.items():
            t0 = time.perf_counter_ns()
            got = fn()
            wall = (time.perf_counter_ns() - t0) / 1e9
            secs = got if isinstance(got, float) else wall
            rows.setdefault(name, []).append(secs / n * 1e6)
            cp.cuda.Device().synchronize()
    base = min(rows["empty loop"])
    ref = min(rows["2× cupy Event.record()"]) - base
    out = []
    for name, xs in rows.items():
        best = min(xs) - base
        out.append([name, best, statistics.median(xs) - base, best / ref if ref > 0 else float("nan")])
    table(
        f"overhead per scope, CPU µs (n={n}, best and median of {rounds}, empty loop subtracted)",
        ["variant", "best µs", "median µs", "× 2 event records"],
        out,
    )
    RESULTS["overhead_us"] = {r[0]: {"best": r[1], "median": r[2], "ratio": r[3]} for r in out}
    rt.eventDestroy(r1)
    rt.eventDestroy(r2)

    # micro costs of the calls the hot path makes
    stream = cp.cuda.get_current_stream()
    micro: dict[str, Callable[[], Any]] = {
        "get_current_stream()": cp.cuda.get_current_stream,
        "runtime.getDevice()": rt.getDevice,
        "streamIsCapturing(ptr)": lambda: rt.streamIsCapturing(stream.ptr),
        "perf_counter_ns()": time.perf_counter_ns,
    }
    mrows = []
    for name, fn in micro.items():
        t0 = time.perf_counter_ns()
        for _ in range(n):
            fn()
        mrows.append([name, (time.perf_counter_ns() - t0) / n / 1e3])
    table("hot-path call costs, µs per call (incl. a lambda where shown)", ["call", "µs"], mrows)
    RESULTS["micro_us"] = {r[0]: r[1] for r in mrows}


# 2. empty-span floor --------------------------------------------------------------------------
def bench_empty_floor(gpu: Gpu, n: int = 200) -> None:
    rows = []
    with gputrace.session(backend="cuda", quiet=True, backend_options={"timing": "events"}) as s:
        for case in ("idle", "queued"):
            for body in ("nothing", "empty kernel"):
                name = f"{body} / {case}"
                for i in range(n):
                    if case == "queued" and i % 50 == 0:
                        gpu.busy(2_000_000)
                    with gputrace.trace(name):
                        if body == "empty kernel":
                            gpu.empty()
                    if case == "idle":
                        gputrace.sync()
                gputrace.sync()
    t = s.trace
    assert t is not None
    for name in dict.fromkeys(t.names):
        sc = [x for x in t.find(name)[1:] if x.gpu_ns is not None]
        if not sc:
            continue
        d = [x.gpu_ns for x in sc]
        flagged = sum(bool(x.flags & gputrace.Flag.EMPTY) for x in sc)
        rows.append([name, len(d), min(d), pct(d, 50), pct(d, 99), max(d), flagged])
    # the floor itself: two raw event records queued back to back behind a busy kernel
    cp = gpu.cp
    rt = cp.cuda.runtime
    sptr = cp.cuda.get_current_stream().ptr
    evs = [rt.eventCreateWithFlags(0) for _ in range(2 * n)]
    gpu.busy(2_000_000)
    for i in range(n):
        rt.eventRecord(evs[2 * i], sptr)
        rt.eventRecord(evs[2 * i + 1], sptr)
    rt.eventSynchronize(evs[-1])
    d = [round(rt.eventElapsedTime(evs[2 * i], evs[2 * i + 1]) * 1e6) for i in range(n)]
    rows.append(["raw event pair / queued", n, min(d), pct(d, 50), pct(d, 99), max(d), "-"])
    for e in evs:
        rt.eventDestroy(e)
    table(
        f"GPU span of a scope, ns (empty_span_ns floor = {CudaBackend.empty_span_ns})",
        ["scope", "n", "min", "p50", "p99", "max", "flagged empty"],
        rows,
    )
    RESULTS["empty_floor_ns"] = {r[0]: r[1:] for r in rows}


# 3. calibration windows -----------------------------------------------------------------------
def bench_windows(gpu: Gpu, n: int = 200) -> None:
    b = CudaBackend(session_clock, samples=1)
    ev = []
    for _ in range(n):
        ev.extend(b.calibrate())
    b.close()
    stamp = [gpu.stamp_sample() for _ in range(n)]
    pp = [s for s in (gpu.pingpong_sample() for _ in range(n)) if s is not None]
    rows = []
    for name, w in (
        ("event record, polled (backend)", [s.cpu_after_ns - s.cpu_before_ns for s in ev]),
        ("%globaltimer stamp kernel, polled", [c - a for a, _, c in stamp]),
        ("%globaltimer ping-pong (truth)", [c - a for a, _, c in pp]),
    ):
        rows.append([name, len(w), min(w), pct(w, 10), pct(w, 50), pct(w, 90)])
    table(
        "calibration window (cpu_after − cpu_before), ns", ["method", "n", "min", "p10", "p50", "p90"], rows
    )
    RESULTS["window_ns"] = {r[0]: r[1:] for r in rows}
    # how well each method's samples fit a line on their own (residual over a short run)
    fits = []
    for name, smp in (
        ("event record, polled (backend)", ev),
        ("%globaltimer ping-pong (truth)", [CalibrationSample(a, g, c) for a, g, c in pp]),
    ):
        f = fit_clock(smp)
        if f is not None:
            fits.append([name, f.samples, f.residual_ns, f.uncertainty_ns, f.drift_ppm])
    table(
        "one fit per method over those samples",
        ["method", "used", "residual ns", "uncertainty ns", "drift ppm"],
        fits,
    )


# 4. accuracy vs CUPTI -------------------------------------------------------------------------
def bench_accuracy(gpu: Gpu, reps: int = 20) -> None:
    try:
        import torch
        from torch.profiler import ProfilerActivity, profile
    except Exception as exc:
        print(f"\n## accuracy vs CUPTI: skipped (torch unavailable: {exc})")
        return
    sizes = [10_000, 30_000, 100_000, 300_000, 1_000_000, 3_000_000, 10_000_000]
    torch.cuda.init()
    res: dict[str, Any] = {}
    for queued in (False, True):
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            with gputrace.session(backend="cuda", quiet=True, backend_options={"timing": "events"}) as s:
                for ns in sizes:
                    if queued:  # a busy GPU: the scopes' events run right around their kernels
                        gpu.busy(5_000_000)
                    for _ in range(reps):
                        with gputrace.trace(f"spin {ns}"):
                            gpu.spin(ns)
                    gputrace.sync()
        t = s.trace
        assert t is not None
        kern: list[tuple[int, int]] = []
        try:
            for e in prof.profiler.kineto_results.events():
                if "spin_ns" in e.name() and str(e.device_type()).endswith("CUDA"):
                    kern.append((int(e.start_ns()), int(e.duration_ns())))
        except Exception as exc:
            print(f"(kineto_results unavailable: {exc}; using prof.events())")
            kern = []
            for fe in prof.events():
                if "spin_ns" in fe.name and str(fe.device_type).endswith("CUDA"):
                    kern.append((int(fe.time_range.start * 1000), int(fe.time_range.elapsed_us() * 1000)))
        kern.sort()
        scopes = sorted((sc for sc in t if sc.name.startswith("spin ")), key=lambda x: x.cpu_start_ns)
        mode = "queued behind a busy GPU" if queued else "GPU idle between launches"
        print(f"\n(accuracy, {mode}: {len(scopes)} scopes, {len(kern)} CUPTI spin_ns kernels)")
        if len(kern) != len(scopes):
            print("accuracy: counts differ; matching is not possible")
            continue
        rows = []
        for ns in sizes:
            pairs = [
                (sc.gpu_ns, k[1])
                for sc, k in zip(scopes, kern, strict=True)
                if sc.name == f"spin {ns}" and sc.gpu_ns is not None
            ][1:]  # drop the cold call
            err = [g - c for g, c in pairs]
            rel = [abs(e) / c * 100 for e, (_, c) in zip(err, pairs, strict=True)]
            aim = max(1000.0, 0.02 * statistics.median(c for _, c in pairs))
            med_abs = statistics.median(abs(e) for e in err)
            rows.append(
                [
                    f"{ns / 1000:g} µs",
                    len(pairs),
                    statistics.median(c for _, c in pairs),
                    statistics.median(err),
                    med_abs,
                    pct([abs(e) for e in err], 90),
                    statistics.median(rel),
                    "yes" if med_abs <= aim else "no",
                ]
            )
            res[f"{mode}: {ns}"] = rows[-1][1:]
        table(
            f"scope GPU duration − CUPTI kernel duration, ns ({mode})",
            [
                "kernel",
                "n",
                "CUPTI median",
                "median err",
                "median |err|",
                "p90 |err|",
                "median |err| %",
                "≤ max(1µs,2%)",
            ],
            rows,
        )
    RESULTS["accuracy_vs_cupti"] = res


# 5./6. alignment and drift --------------------------------------------------------------------
def traced_truth(
    gpu: Gpu,
    n: int,
    every_sync: int,
    spacing_s: float = 0.0,
    truth_every_s: float = 2.0,
    busy_every: int = 0,
    timing: str = "events",
) -> tuple[gputrace.Trace, np.ndarray, list[CalibrationSample]]:
    """n traced kernels that each record %globaltimer at their start and end; truth on the side."""
    cp = gpu.cp
    outs = cp.zeros(2 * n, dtype=cp.uint64)
    truth = gpu.truth_samples(20)
    next_truth = time.monotonic() + truth_every_s
    with gputrace.session(backend="cuda", quiet=True, backend_options={"timing": timing}) as s:
        for i in range(n):
            if busy_every and i % busy_every == 0:
                gpu.busy(3_000_000)  # queue the next scopes behind a busy GPU
            with gputrace.trace("probe"):
                # 200 µs: the end event is queued before the kernel ends, so it marks the kernel's
                # end (a shorter kernel can finish before the CPU records the end event)
                gpu.spin(200_000, outs.data.ptr + 16 * i)
            if (i + 1) % every_sync == 0:
                gputrace.sync()
            if spacing_s:
                time.sleep(spacing_s)
            if time.monotonic() > next_truth:
                gpu.cp.cuda.get_current_stream().synchronize()
                truth.extend(gpu.truth_samples(5))
                next_truth = time.monotonic() + truth_every_s
    truth.extend(gpu.truth_samples(20))
    t = s.trace
    assert t is not None
    return t, outs.get().reshape(n, 2), truth


def alignment_errors(t: gputrace.Trace, g: np.ndarray, truth: list[CalibrationSample]) -> dict[str, Any]:
    """Scope start − kernel's first timer read, scope end − kernel's last read, on the CPU clock."""
    tf = fit_clock(truth)
    assert tf is not None
    scopes = t.find("probe")
    start = np.array([sc.gpu_start_ns for sc in scopes], np.int64)
    end = np.array([sc.gpu_end_ns for sc in scopes], np.int64)
    unc = np.array([sc.uncertainty_ns for sc in scopes], np.int64)
    err_start = start - tf.to_cpu(g[:, 0].astype(np.int64))
    err_end = end - tf.to_cpu(g[:, 1].astype(np.int64))
    return {
        "err": err_start,
        "err_end": err_end,
        "unc": unc,
        "cpu": np.array([sc.cpu_start_ns for sc in scopes]),
        "truth_fit": tf,
        "fit": t.clock_fits.get(0),
        "flags": t.header.get("anomalies", {}).get("counts", {}),
    }


def bench_alignment(gpu: Gpu) -> None:
    rows = []
    for label, n, every, spacing, busy, timing in (
        ("events: idle GPU, sync every 10", 500, 10, 0.0, 0, "events"),
        ("events: queued (busy 3 ms every 50), sync every 50", 500, 50, 0.0, 50, "events"),
        ("cupti: idle GPU, sync every 10", 500, 10, 0.0, 0, "cupti"),
        ("cupti: queued (busy 3 ms every 50), sync every 50", 500, 50, 0.0, 50, "cupti"),
        ("cupti: idle GPU, 1 ms apart, no sync", 300, 10**9, 0.001, 0, "cupti"),
    ):
        t, g, truth = traced_truth(gpu, n, every, spacing, busy_every=busy, timing=timing)
        a = alignment_errors(t, g, truth)
        # start and end together: CUPTI's kernel interval also holds the kernel's prologue and
        # epilogue around its first and last timer reads, so start errs early and end late by
        # about as much; their mean is the clock's own error
        for which in ("start", "end", "mid"):
            e = {"start": a["err"], "end": a["err_end"], "mid": (a["err"] + a["err_end"]) / 2}[which]
            rows.append(
                [
                    f"{label}: {which}",
                    len(e),
                    float(np.median(e)),
                    float(np.median(np.abs(e))),
                    pct(np.abs(e), 99),
                    float(np.max(np.abs(e))),
                    float(np.median(a["unc"])),
                    a["truth_fit"].uncertainty_ns,
                    float(np.mean(np.abs(e) <= a["unc"])),
                ]
            )
        print(f"({label}: fit {a['fit'].to_dict()}; anomalies {a['flags']})")
    table(
        "alignment: scope GPU start/end − the kernel's own %globaltimer reads (truth) on the CPU clock, ns",
        [
            "run",
            "n",
            "median err",
            "median |err|",
            "p99 |err|",
            "max |err|",
            "stated unc p50",
            "truth unc",
            "frac |err|≤stated",
        ],
        rows,
    )
    RESULTS["alignment_ns"] = {r[0]: r[1:] for r in rows}


def bench_drift(gpu: Gpu, seconds: float) -> None:
    n = int(seconds / 0.05)
    t0 = time.monotonic()
    t, g, truth = traced_truth(gpu, n, every_sync=20, spacing_s=0.05, truth_every_s=5.0)
    took = time.monotonic() - t0
    a = alignment_errors(t, g, truth)
    e, unc, cpu = a["err_end"], a["unc"], a["cpu"]
    span = (cpu - cpu[0]) / 1e9
    rows = []
    for label, m in (("first 10 s", span <= 10), ("last 10 s", span >= span[-1] - 10), ("all", span >= 0)):
        rows.append(
            [
                label,
                int(m.sum()),
                float(np.median(e[m])),
                float(np.median(np.abs(e[m]))),
                pct(np.abs(e[m]), 99),
                float(np.max(np.abs(e[m]))),
                float(np.median(unc[m])),
                float(np.mean(np.abs(e[m]) <= unc[m])),
            ]
        )
    fit, tf = a["fit"], a["truth_fit"]
    table(
        f"drift over {took:.0f} s (scopes every 50 ms, sync every 20): scope end − truth, ns",
        [
            "window",
            "n",
            "median err",
            "median |err|",
            "p99 |err|",
            "max |err|",
            "stated unc p50",
            "frac |err|≤stated",
        ],
        rows,
    )
    print(
        f"backend fit: drift {fit.drift_ppm:+.3f} ppm, residual {fit.residual_ns:.0f} ns, "
        f"uncertainty {fit.uncertainty_ns:.0f} ns over {fit.samples} samples; truth fit: drift "
        f"{tf.drift_ppm:+.3f} ppm, uncertainty {tf.uncertainty_ns:.0f} ns over {tf.samples} samples"
    )
    RESULTS["drift"] = {
        "seconds": took,
        "rows": {r[0]: r[1:] for r in rows},
        "fit": fit.to_dict(),
        "truth_fit": tf.to_dict(),
    }


# 7. whole programs ------------------------------------------------------------------------------
# Each variant runs in its own process (CUPTI and torch leave state behind in a process), timed from
# just before the profiler starts to just after it stopped and wrote its trace, so session start,
# the stop's resolve and the write are all counted.
PROGRAM = r"""
import json, os, sys, time, tempfile
variant, workload = sys.argv[1], sys.argv[2]
import cupy as cp
if workload == "tiny":
    x = cp.zeros(256, dtype=cp.float32); n = 20_000
    def step(): x.__iadd__(1)
else:
    a = cp.random.rand(4096, 4096, dtype=cp.float32); n = 60
    def step(): a @ a
step(); cp.cuda.Device().synchronize()
out = os.path.join(tempfile.mkdtemp(), "t.json")
extra = {}
if variant in ("cupti_raw", "cupti_raw_corr"):
    from cupti import cupti
    recs = [0]
    def req(): return 1 << 20, 0
    def done(acts): recs[0] += len(acts)
    K = cupti.ActivityKind
    kinds = [K.CONCURRENT_KERNEL, K.DRIVER, K.RUNTIME]
    if variant == "cupti_raw_corr":
        kinds.append(K.EXTERNAL_CORRELATION)
if variant.startswith("torch"):
    import torch; torch.cuda.init()
if variant == "nvtx":
    from cupyx.profiler import time_range
if variant.startswith("gputrace_"):
    import gputrace  # imported before the clock starts, as torch is for its rows
t0 = time.perf_counter_ns()
if variant == "bare":
    for _ in range(n): step()
    cp.cuda.Device().synchronize()
elif variant.startswith("gputrace_"):
    timing = variant.split("_")[1]
    opts = {"timing": timing}
    if variant.endswith("_all"):
        opts["api_filter"] = False
    s = gputrace.session(out, backend="cuda", quiet=True, backend_options=opts)
    s.start()
    ta = time.perf_counter_ns()
    tr = gputrace.trace("tiny" if workload == "tiny" else "matmul")
    for _ in range(n):
        with tr:
            step()
    tb = time.perf_counter_ns()
    if os.environ.get("BENCH_PROFILE_STOP"):
        import cProfile, pstats
        pr = cProfile.Profile(); pr.enable(); s.__exit__(None, None, None); pr.disable()
        pstats.Stats(pr, stream=sys.stderr).sort_stats("cumulative").print_stats(25)
    else:
        s.__exit__(None, None, None)  # as ``with session(...)`` ends: the file is written, not read back
    tc = time.perf_counter_ns()
    extra = {"start_ms": round((ta - t0) / 1e6, 1), "loop_ms": round((tb - ta) / 1e6, 1),
             "stop_ms": round((tc - tb) / 1e6, 1)}
elif variant == "torch":
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(n):
            with torch.profiler.record_function("tiny"):
                step()
        cp.cuda.Device().synchronize()
    prof.export_chrome_trace(out)
elif variant == "nvtx":
    for _ in range(n):
        with time_range("tiny"):
            step()
    cp.cuda.Device().synchronize()
elif variant in ("cupti_raw", "cupti_raw_corr"):
    cupti.activity_register_callbacks(req, done)
    for k in kinds: cupti.activity_enable(k)
    if variant == "cupti_raw_corr":
        push = cupti.activity_push_external_correlation_id
        pop = cupti.activity_pop_external_correlation_id
        ck = cupti.ExternalCorrelationKind.CUSTOM0
        for i in range(n):
            push(ck, i + 1)
            step()
            pop(ck)
    else:
        for _ in range(n): step()
    cp.cuda.Device().synchronize()
    cupti.activity_flush_all(1)
    for k in kinds: cupti.activity_disable(k)
    extra = {"records": recs[0]}
t1 = time.perf_counter_ns()
if variant.startswith("gputrace_"):  # read back after the clock stopped: no user program does this
    info = s.trace.header["backend_info"]
    extra.update({"ops": len(s.trace.ops), "api_records": info.get("cupti_api_records"),
                  "dropped": info.get("cupti_dropped_records"), "timing": info.get("timing"),
                  "cupti_start_ms": info.get("cupti_start_ms")})
print(json.dumps({"ms": (t1 - t0) / 1e6, **extra}))
"""

PROGRAM_VARIANTS = {
    "bare": "no profiler",
    "gputrace_cupti": "gputrace cuda, timing=cupti",
    "gputrace_cupti_all": "gputrace cupti, every API call recorded",
    "gputrace_events": "gputrace cuda, timing=events",
    "torch": "torch.profiler (CPU+CUDA) + record_function",
    "nvtx": "cupyx.profiler.time_range (NVTX)",
    "cupti_raw": "raw CUPTI activities (kernel+driver+runtime)",
    "cupti_raw_corr": "raw CUPTI + external-correlation push/pop",
}


def bench_programs(rounds: int = 3) -> None:
    import compileall
    import importlib.util
    import subprocess

    # byte-compiled once, as an installed package is: a checkout copied to a machine whose Python
    # writes no bytecode would otherwise compile gputrace (and cupti-python) in every variant's
    # process, ~60 ms at stop and more at start, a cost no installed user pays
    for pkg in ("cupti", "elftools", "numpy"):
        spec = importlib.util.find_spec(pkg)
        for loc in (spec.submodule_search_locations or []) if spec else []:
            compileall.compile_dir(loc, quiet=1)
    compileall.compile_dir(str(Path(__file__).resolve().parents[1] / "gputrace"), quiet=1)

    for workload in ("tiny", "matmul"):
        best: dict[str, float] = {}
        extra: dict[str, Any] = {}
        for _ in range(rounds):  # interleaved: load changes hit every variant alike
            for v in PROGRAM_VARIANTS:
                r = subprocess.run(
                    [sys.executable, "-c", PROGRAM, v, workload], capture_output=True, text=True, timeout=300
                )
                if r.returncode != 0:
                    print(f"({v}/{workload} failed: {r.stderr.strip().splitlines()[-1:]})")
                    continue
                got = json.loads(r.stdout.strip().splitlines()[-1])
                best[v] = min(best.get(v, float("inf")), got.pop("ms"))
                extra[v] = got
        n = 20_000 if workload == "tiny" else 60
        bare = best.get("bare", float("nan"))
        torch_over = best.get("torch", float("nan")) - bare
        rows = []
        for v, label in PROGRAM_VARIANTS.items():
            if v not in best:
                continue
            over = best[v] - bare
            rows.append(
                [label, best[v], best[v] / bare, over / n * 1e3,
                 over / torch_over if torch_over > 0 else float("nan"), json.dumps(extra.get(v, {}))]
            )  # fmt: skip
        table(
            f"whole program, {workload} ({n} iterations, one scope each; best of {rounds}, own process each)",
            ["variant", "ms", "× bare", "+µs/iter", "overhead / torch's", "notes"],
            rows,
        )
        RESULTS[f"programs_{workload}"] = {r[0]: r[1:5] for r in rows}
    env = dict(__import__("os").environ, BENCH_PROFILE_STOP="1")
    r = subprocess.run([sys.executable, "-c", PROGRAM, "gputrace_cupti", "tiny"], capture_output=True,
                       text=True, timeout=300, env=env)  # fmt: skip
    print("\n(cProfile of session stop, gputrace cupti, tiny:)")
    print("\n".join(r.stderr.splitlines()[:45]))


def bench_threads(per_thread: int = 10_000) -> None:
    """4 threads × 2 streams each × ``per_thread`` scopes, each launching a kernel whose grid size
    names its scope: every kernel attributed to its own scope, none lost, none twice."""
    import threading

    import cupy

    kern = cupy.RawKernel('extern "C" __global__ void tagged(float* x) { x[blockIdx.x % 64] += 1.0f; }',
                          "tagged")  # fmt: skip
    bufs = [cupy.zeros(64, dtype=cupy.float32) for _ in range(4)]
    kern((1,), (1,), (bufs[0],))
    cupy.cuda.Device().synchronize()

    def work(k: int) -> None:
        streams = [cupy.cuda.Stream(non_blocking=True) for _ in range(2)]
        for i in range(per_thread):
            with streams[i % 2], gputrace.trace("tagged", i=i):
                kern((i % 4096 + 1,), (1,), (bufs[k],))
        for st in streams:
            st.synchronize()

    t0 = time.monotonic()
    with gputrace.session(backend="cuda", quiet=True, backend_options={"timing": "cupti"}) as s:
        threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(timeout=120)
        hung = sum(th.is_alive() for th in threads)
    took = time.monotonic() - t0
    t = s.trace
    assert t is not None
    idx = t.names.index("tagged")
    rows = np.flatnonzero(t.ops.name == idx)
    owners = t.ops.scope[rows]
    ok = 0
    for r, o in zip(rows.tolist(), owners.tolist(), strict=True):
        if o >= 0:
            sc_args = t.scopes.args.get(o, {})
            if (
                int(t.ops.grid[r, 0]) == sc_args.get("i", -1) % 4096 + 1
                and t.ops.thread[r] == t.scopes.thread[o]
            ):
                ok += 1
    n = 4 * per_thread
    table(
        f"attribution: 4 threads × 2 streams × {per_thread} scopes (cupti)",
        ["scopes", "kernels", "attributed to their own scope", "unattributed", "twice", "hung threads",
         "dropped", "seconds"],
        [[len(t), len(rows), ok, int((owners < 0).sum()), int(len(owners) - len(set(owners.tolist()))),
          hung, t.header["backend_info"].get("cupti_dropped_records"), took]],
    )  # fmt: skip
    RESULTS["threads"] = {"scopes": len(t), "kernels": len(rows), "ok": ok, "expected": n, "seconds": took}


def write_sample_trace(path: str) -> None:
    """A small CUDA trace for tests/data: a few hundred kernels, memcpys and memsets, two streams,
    nested scopes, a graph replay."""
    import cupy

    a = cupy.random.rand(512, 512, dtype=cupy.float32)
    x = cupy.zeros(1 << 16, dtype=cupy.float32)
    host = np.ones(1 << 16, np.float32)
    s2 = cupy.cuda.Stream(non_blocking=True)
    with s2:
        y = cupy.zeros(1024, dtype=cupy.float32)
        y += 1
        s2.synchronize()
        s2.begin_capture()
        y += 1
        y *= 2
        graph = s2.end_capture()
    with gputrace.session(path, backend="cuda", quiet=True, backend_options={"timing": "cupti"}):
        for _ in range(40):
            with gputrace.trace("step"):
                with gputrace.trace("upload"):
                    x.set(host)
                with gputrace.trace("matmul"):
                    b = a @ a
                with gputrace.trace("tiny"):
                    for _ in range(4):
                        x += 1
                with gputrace.trace("side stream"), s2:
                    graph.launch(s2)
                    y.fill(0)
                with gputrace.trace("download"):
                    _ = b[:4].get()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--drift-s", type=float, default=60.0)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--sample-trace", default=None, help="write a small CUPTI-timed trace there and exit")
    ap.add_argument("--only", default="programs,overhead,floor,windows,accuracy,alignment,drift")
    args = ap.parse_args()
    import cupy

    dev = cupy.cuda.runtime.getDeviceProperties(0)["name"]
    print(
        f"# bench_cuda: {dev.decode() if isinstance(dev, bytes) else dev}, CuPy {cupy.__version__}, "
        f"Python {sys.version.split()[0]}"
    )
    if args.sample_trace:
        write_sample_trace(args.sample_trace)
        return 0
    gpu = Gpu()
    steps = {
        "overhead": lambda: bench_overhead(gpu),
        "floor": lambda: bench_empty_floor(gpu),
        "windows": lambda: bench_windows(gpu),
        "accuracy": lambda: bench_accuracy(gpu),
        "alignment": lambda: bench_alignment(gpu),
        "drift": lambda: bench_drift(gpu, args.drift_s),
        "programs": bench_programs,
        "threads": bench_threads,
    }
    failed = 0
    for name in args.only.split(","):
        try:
            t0 = time.monotonic()
            steps[name]()
            print(f"({name}: {time.monotonic() - t0:.1f} s)")
        except Exception:
            failed += 1
            print(f"\n## {name}: FAILED")
            traceback.print_exc(file=sys.stdout)
    if args.json:
        args.json.write_text(json.dumps(RESULTS, indent=1, default=str))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
