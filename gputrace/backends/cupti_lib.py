"""libcupti driven through ctypes (not cupti-python: its import alone took 190–290 ms on the H200).

CUPTI's buffer-completed callback, on CUPTI's thread, only queues the buffer's address and valid
size; buffers are decoded in bulk (``cupti_records``) when the backend drains them, every flush
forced. Start-up checks (API version, record sizes) raise from ``LibCuptiSource``, and the cuda
backend falls back to events with one notice. Detail: docs/cupti.md, "How CUPTI records are
read" and "Nothing lost silently".
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import glob
import os
import re
import threading
import time
from typing import Any

import numpy as np

from gputrace.backends import cupti_records as cr
from gputrace.errors import GputraceError, report_internal

BUFFER_BYTES = 1 << 20  # one activity buffer: ~3,500 kernel + driver record pairs
FLUSH_PERIOD_MS = 200  # CUPTI hands full buffers over at least this often
SETTLE_S = 1.0  # a drain waits at most this long for a buffer callback in flight
KEEP_CALLS = re.compile(r"Launch|Memcpy|Memset|Synchronize")  # the API records attribution needs
NOT_FOUND = "libcupti was not found; pip install 'gputrace[cuda13]' (nvidia-cuda-cupti)"
_CB_DOMAIN = {cr.DOMAIN_DRIVER: 1, cr.DOMAIN_RUNTIME: 2}  # CUpti_CallbackDomain

_REQUESTED = ctypes.CFUNCTYPE(
    None, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)
)
_COMPLETED = ctypes.CFUNCTYPE(
    None, ctypes.c_void_p, ctypes.c_uint32, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t
)

# -- what outlives a session -----------------------------------------------------------------------
# CUPTI calls the last buffer callbacks it was given until the process ends, and may hand back,
# after a session stopped or in the next one, a buffer it held at that stop. So the callbacks and
# every lent buffer belong to the process, not a session's source: a callback freed with its source
# is a crash on CUPTI's thread; a buffer freed while lent gets records written into reused memory.
SPARE_BUFFERS = 8  # buffers handed back and decoded, kept to be lent again
_lock = threading.Lock()
_lent: dict[int, tuple[np.ndarray, LibCuptiSource]] = {}  # address -> (buffer, the source that lent it)
_spare: list[np.ndarray] = []
_current: list[LibCuptiSource] = []  # the source the callbacks deliver to: the last made, until it stops


def _keep_spare(bufs: list[np.ndarray]) -> None:
    """Keep a few buffers handed back to lend again; the rest are freed (under ``_lock``)."""
    _spare.extend(bufs[: max(0, SPARE_BUFFERS - len(_spare))])


def _requested(buf: Any, size: Any, max_records: Any) -> None:
    src = _current[0] if _current else None
    if src is None:
        size[0] = 0  # no session: CUPTI counts what it could not record as dropped
        return
    src._requested(buf, size, max_records)


def _completed(ctx: Any, stream: int, buf: Any, size: int, valid: int) -> None:
    with _lock:
        got = _lent.pop(int(buf or 0), None)
        src = _current[0] if _current else None
        if got is not None and got[1] is not src:  # lent in a session that stopped: nobody's records
            _keep_spare([got[0]])
            got = None
    if src is not None:
        src._completed(got[0] if got is not None else None, int(valid))


_on_requested, _on_completed = _REQUESTED(_requested), _COMPLETED(_completed)  # the C pointers CUPTI is given


def find_libcupti() -> str | None:
    """Where libcupti is: ``GPUTRACE_LIBCUPTI``, the ``nvidia-cuda-cupti`` wheel's folder (as
    cupti-python finds it), cuda-pathfinder, or the loader's search path. Imports nothing heavy;
    a library found is remembered (0.5 ms a look on the H200; a session's start looks twice)."""
    return os.environ.get("GPUTRACE_LIBCUPTI") or _find_libcupti()


@functools.cache
def _find_libcupti() -> str | None:
    import importlib.util

    with contextlib.suppress(Exception):
        spec = importlib.util.find_spec("nvidia")
        for root in (spec.submodule_search_locations or []) if spec else []:
            for pat in ("cu13/lib/libcupti.so*", "cuda_cupti/lib/libcupti.so*"):
                got = sorted(glob.glob(os.path.join(root, pat)))
                if got:
                    return got[-1]
    with contextlib.suppress(Exception):
        from cuda.pathfinder import load_nvidia_dynamic_lib  # type: ignore[import-not-found]

        return str(load_nvidia_dynamic_lib("cupti").abs_path)
    import ctypes.util

    return ctypes.util.find_library("cupti")


class LibCupti:
    """The few libcupti entry points gputrace calls, with their C types."""

    def __init__(self, path: str) -> None:
        lib = self.lib = ctypes.CDLL(path)
        self.path = path
        u32, sz, vp = ctypes.c_uint32, ctypes.c_size_t, ctypes.c_void_p
        sig = {
            "cuptiGetVersion": [ctypes.POINTER(u32)],
            "cuptiGetResultString": [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)],
            "cuptiActivityGetStructSize": [ctypes.c_int, u32, ctypes.POINTER(sz)],
            "cuptiActivityRegisterCallbacks": [_REQUESTED, _COMPLETED],
            "cuptiActivityEnable": [ctypes.c_int],
            "cuptiActivityDisable": [ctypes.c_int],
            "cuptiActivityEnableDriverApi": [u32, ctypes.c_uint8],
            "cuptiActivityEnableRuntimeApi": [u32, ctypes.c_uint8],
            "cuptiActivityFlushAll": [u32],
            "cuptiActivityFlushPeriod": [u32],
            "cuptiGetTimestamp": [ctypes.POINTER(ctypes.c_uint64)],
            "cuptiGetCallbackName": [ctypes.c_int, u32, ctypes.POINTER(ctypes.c_char_p)],
            "cuptiActivityGetNumDroppedRecords": [vp, u32, ctypes.POINTER(sz)],
        }
        for name, args in sig.items():
            f = getattr(lib, name, None)
            if f is None and name == "cuptiActivityGetStructSize":
                continue  # (CUPTI 12 has none: its sizes are known, cupti_records.CUPTI_12_SIZES)
            if f is None:
                raise AttributeError(f"libcupti has no {name}")
            f.argtypes, f.restype = args, ctypes.c_int
        self._ts = ctypes.c_uint64(0)
        self._ts_ref = ctypes.byref(self._ts)
        self._get_ts = lib.cuptiGetTimestamp

    def call(self, name: str, *args: Any) -> None:
        rc = getattr(self.lib, name)(*args)
        if rc:
            msg = ctypes.c_char_p()
            self.lib.cuptiGetResultString(rc, ctypes.byref(msg))
            raise GputraceError(f"{name} failed: {(msg.value or b'').decode(errors='replace') or rc}")

    def version(self) -> int:
        v = ctypes.c_uint32(0)
        self.call("cuptiGetVersion", ctypes.byref(v))
        return int(v.value)

    def struct_size(self, kind: int) -> int:
        n = ctypes.c_size_t(0)
        self.call("cuptiActivityGetStructSize", kind, 0, ctypes.byref(n))
        return int(n.value)

    def timestamp(self) -> int:
        self._get_ts(self._ts_ref)
        return self._ts.value

    def callback_name(self, domain: int, cbid: int) -> str | None:
        out = ctypes.c_char_p()
        if self.lib.cuptiGetCallbackName(_CB_DOMAIN[domain], cbid, ctypes.byref(out)) or not out.value:
            return None
        return out.value.decode(errors="replace")


class LibCuptiSource:
    """CUPTI's activity API through ctypes: an ``ActivitySource`` (``gputrace.backends.cupti``)."""

    name = "libcupti"

    def __init__(
        self,
        *,
        buffer_bytes: int = BUFFER_BYTES,
        flush_period_ms: int = FLUSH_PERIOD_MS,
        api_filter: bool = True,
        lib: Any = None,
    ) -> None:
        if lib is None:  # ``lib``: a stand-in with LibCupti's methods (tests)
            path = find_libcupti()
            if not path:
                raise GputraceError(NOT_FOUND)
            try:
                lib = LibCupti(path)
            except (OSError, AttributeError) as exc:
                raise GputraceError(f"libcupti at {path} could not be loaded ({exc})") from None
        self.lib = lib
        self.version = self.lib.version()
        sizes: dict[int, int] = {}
        if 130000 <= self.version < 140000:
            for kind in cr.LAYOUTS:
                sizes[kind] = self.lib.struct_size(kind)
        layout = cr.layout_for(self.version, sizes)
        if isinstance(layout, str):
            raise GputraceError(layout)
        self.decoder = cr.BufferDecoder(layout)
        self.names = cr.NameTable()
        self.buffer_bytes = int(buffer_bytes)
        self.flush_period_ms = int(flush_period_ms)
        self.api_filter = bool(api_filter)
        self.api_records = 0
        self.buffers = 0
        self.buffers_made = 0  # activity buffers allocated (the rest were reused)
        self.undecoded = 0  # buffers whose record chain broke
        self.problem = ""  # the first such break, said once
        self.start_ms: dict[str, float] = {}
        self._filled: list[tuple[np.ndarray, int]] = []  # (buffer, valid bytes), in completion order
        self._inflight = 0
        self._on_buffer: Any = None  # called after each completed buffer (CUPTI's thread)
        self._call_names: dict[tuple[int, int], str] = {}
        self._kept: dict[int, list[int]] = {}
        with _lock:
            _current[:] = [self]
        # CUPTI initializes itself at the first registration (16-23 ms on the H200, most of the
        # start): on a thread of its own, while the backend asks for the devices; ``start`` joins it
        self._register_error: BaseException | None = None
        self._registering: threading.Thread | None = threading.Thread(
            target=self._register, name="gputrace-cupti-start", daemon=True
        )
        self._registering.start()

    def _register(self) -> None:
        t0 = time.perf_counter_ns()
        try:
            self.lib.call("cuptiActivityRegisterCallbacks", _on_requested, _on_completed)
        except BaseException as exc:  # raised by ``start``, on the session's thread
            self._register_error = exc
        self.start_ms["register"] = (time.perf_counter_ns() - t0) / 1e6

    # CUPTI's thread ---------------------------------------------------------------------------
    def _requested(self, buf: Any, size: Any, max_records: Any) -> None:
        try:
            with _lock:  # (by index: ``list.remove`` would compare arrays by value)
                i = next((i for i, a in enumerate(_spare) if len(a) == self.buffer_bytes), None)
                arr = _spare.pop(i) if i is not None else None
            if arr is None:
                arr = np.empty(self.buffer_bytes, np.uint8)  # not zeroed: CUPTI writes it
                self.buffers_made += 1
            addr = arr.ctypes.data
            with _lock:
                _lent[addr] = (arr, self)
            buf[0] = addr
            size[0] = self.buffer_bytes
            max_records[0] = 0
        except Exception:  # never raise into CUPTI: no buffer, CUPTI counts the records dropped
            size[0] = 0

    def _completed(self, buf: np.ndarray | None, valid: int) -> None:
        """``buf`` handed back with ``valid`` bytes of records (None: not one this source lent)."""
        with _lock:
            self._inflight += 1
            if buf is not None:
                self._filled.append((buf, valid))
        try:
            cb = self._on_buffer
            if cb is not None:
                cb()
        except Exception as exc:  # never raise into CUPTI's thread
            report_internal("cupti:buffer", f"a CUPTI buffer callback failed ({type(exc).__name__}: {exc}).")
        finally:
            with _lock:
                self._inflight -= 1

    # the backend's calls ----------------------------------------------------------------------
    def start(self) -> None:
        t0 = time.perf_counter_ns()
        c = self.lib.call
        try:
            registering, self._registering = self._registering, None
            if registering is not None:  # the first start: registered on its thread since __init__
                registering.join()
                self.start_ms["register_wait"] = (time.perf_counter_ns() - t0) / 1e6
                if self._register_error is not None:
                    raise self._register_error
            else:
                with _lock:
                    _current[:] = [self]
                c("cuptiActivityRegisterCallbacks", _on_requested, _on_completed)
            for k in (cr.KIND_CONCURRENT_KERNEL, cr.KIND_MEMCPY, cr.KIND_MEMSET):
                c("cuptiActivityEnable", k)
            self.start_ms["enable_kinds"] = (time.perf_counter_ns() - t0) / 1e6
            if self.api_filter:
                self._enable_calls(True)
            else:
                c("cuptiActivityEnable", cr.KIND_DRIVER)
                c("cuptiActivityEnable", cr.KIND_RUNTIME)
            with contextlib.suppress(GputraceError):
                c("cuptiActivityFlushPeriod", self.flush_period_ms)
        except GputraceError as exc:
            with contextlib.suppress(Exception):
                self.stop()
            raise GputraceError(f"CUPTI could not be enabled ({exc})") from None
        self.start_ms["enable"] = (time.perf_counter_ns() - t0) / 1e6

    def _enable_calls(self, on: bool) -> None:
        """Record only the API calls that launch GPU work or synchronize (the canary): each
        recorded call costs CUPTI time in the program (~1 µs, measured from C on the H200)."""
        from gputrace.backends import cupti_cbids as ids

        for dom, known, newer, fn in (  # newer: ids past the table's, their names asked of libcupti
            (cr.DOMAIN_DRIVER, ids.DRIVER, range(ids.DRIVER_SIZE, 1024), "cuptiActivityEnableDriverApi"),
            (cr.DOMAIN_RUNTIME, ids.RUNTIME, range(ids.RUNTIME_SIZE, 768), "cuptiActivityEnableRuntimeApi"),
        ):
            if dom not in self._kept:
                self._kept[dom] = [*known, *(i for i in newer if KEEP_CALLS.search(self.call_name(dom, i)))]
            for cbid in self._kept[dom]:
                with contextlib.suppress(GputraceError):
                    self.lib.call(fn, cbid, 1 if on else 0)

    def reclaim(self) -> None:
        self.start()

    def timestamp(self) -> int:
        return int(self.lib.timestamp())

    def sync(self) -> tuple[int, int, int]:
        import cupy

        rt = cupy.cuda.runtime
        t0 = self.lib.timestamp()
        prev = rt.getDevice()
        try:
            for d in range(rt.getDeviceCount()):
                rt.setDevice(d)
                rt.deviceSynchronize()
        finally:
            rt.setDevice(prev)
        t1 = self.lib.timestamp()
        return threading.get_native_id(), t0, t1

    def take_buffers(self) -> list[tuple[np.ndarray, int]]:
        """The completed buffers so far, CUPTI forced to hand over partial ones first."""
        with contextlib.suppress(GputraceError):
            self.lib.call("cuptiActivityFlushAll", 1)  # forced: incomplete buffers too
        # a buffer CUPTI's thread is handing over when the flush returns is taken too
        deadline = time.monotonic() + SETTLE_S
        while self._inflight and time.monotonic() < deadline:
            time.sleep(0.0002)
        with _lock:
            filled, self._filled = self._filled, []
        return filled

    def self_check(self) -> str | None:
        """What is wrong, or None, with the records of one memset of a known odd size, launched and
        synced (``cupti.self_check_problem``; all records drained here predate the session)."""
        import cupy

        from gputrace.backends.cupti import SELF_CHECK_BYTES, self_check_problem

        t_ns = time.perf_counter_ns()
        mem = cupy.cuda.alloc(SELF_CHECK_BYTES)
        stream = cupy.cuda.get_current_stream()
        t0 = self.lib.timestamp()
        cupy.cuda.runtime.memsetAsync(mem.ptr, 0x5A, SELF_CHECK_BYTES, stream.ptr)
        stream.synchronize()
        t1 = self.lib.timestamp()
        ops, calls = self.drain()
        self.api_records -= len(calls)
        got = self_check_problem(
            ops, calls, nbytes=SELF_CHECK_BYTES, device=cupy.cuda.runtime.getDevice(),
            tids=(threading.get_ident(), threading.get_native_id()), t0=t0, t1=t1, call_name=self.call_name,
        )  # fmt: skip
        self.start_ms["self_check"] = (time.perf_counter_ns() - t_ns) / 1e6
        return got

    def waiting_bytes(self) -> int:
        return sum(valid for _, valid in list(self._filled))

    def drain(self) -> tuple[np.ndarray, np.ndarray]:
        bufs = self.take_buffers()
        parts = []
        for arr, valid in bufs:
            got: cr.Decoded | None = None
            try:
                got = self.decoder.decode(arr[:valid])
                problem = got.problem
            except Exception as exc:  # a fault in the decoder loses this buffer alone, counted and said
                problem = f"decoding it failed ({type(exc).__name__}: {exc})"
            if problem:
                self.undecoded += 1
                if not self.problem:
                    self.problem = problem
                    report_internal("cupti:decode", f"a CUPTI buffer could not be read whole: {problem}; "
                                    "the records after it are lost (counted in the header).")  # fmt: skip
            if got is not None:
                parts.append(got)
        self.buffers += len(bufs)
        ops, calls = cr.columns(parts, self.names, _read_c_string)
        with _lock:  # (never one still lent: these were handed back)
            _keep_spare([arr for arr, _ in bufs])
        self.api_records += len(calls)
        return ops, calls

    def call_name(self, domain: int, cbid: int) -> str:
        key = (domain, cbid)
        name = self._call_names.get(key)
        if name is None:
            got = self.lib.callback_name(domain, cbid)
            name = (
                re.sub(r"_v\d+$", "", got) if got else f"{'runtime' if domain == 1 else 'driver'} api {cbid}"
            )
            self._call_names[key] = name
        return name

    def dropped(self) -> int:
        n = ctypes.c_size_t(0)
        try:
            self.lib.call("cuptiActivityGetNumDroppedRecords", None, 0, ctypes.byref(n))
        except GputraceError:
            return 0
        return int(n.value)

    def other_client_active(self) -> str | None:
        from gputrace.backends.cupti import torch_profiler_active

        return torch_profiler_active()

    def devices(self) -> dict[int, str]:
        import cupy

        from gputrace.backends.cuda_events import device_name

        return {d: device_name(d) for d in range(cupy.cuda.runtime.getDeviceCount())}

    def stop(self) -> None:
        registering = self._registering
        if registering is not None:  # (never started: its registration is not left half-made)
            registering.join()
        with contextlib.suppress(Exception):
            self.lib.call("cuptiActivityFlushAll", 1)
        if self.api_filter and self._kept:  # per-call settings are process-wide: leave them off again
            self._enable_calls(False)
        for k in (cr.KIND_CONCURRENT_KERNEL, cr.KIND_MEMCPY, cr.KIND_MEMSET, cr.KIND_DRIVER, cr.KIND_RUNTIME):
            with contextlib.suppress(Exception):
                self.lib.call("cuptiActivityDisable", k)
        with _lock:  # what CUPTI hands back from here on is nobody's (``_completed``)
            if _current and _current[0] is self:
                _current.clear()

    def info(self) -> dict[str, Any]:
        return {
            "timing_source": self.name,
            "cupti_version": self.version,
            "cupti_library": self.lib.path,
            "cupti_record_bytes": {str(k): v for k, v in sorted(self.decoder.sizes.items())},
            "cupti_buffer_bytes": self.buffer_bytes,
            "cupti_buffers": self.buffers,
            "cupti_buffers_allocated": self.buffers_made,
            "cupti_buffers_cut": self.undecoded,
            "cupti_decode_problem": self.problem,
            "cupti_api_filter": self.api_filter,
            "cupti_api_records": self.api_records,
            "cupti_start_ms": dict(self.start_ms),
        }


def _read_c_string(ptr: int) -> str:
    return ctypes.string_at(ptr).decode(errors="replace")
