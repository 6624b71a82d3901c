"""CUPTI activity buffers decoded in bulk, against independent oracles (no GPU needed).

Oracles: ``ctypes.Structure`` copies of the CUPTI 13.4 structs, written field by field from
``cupti_activity.h`` (every field, packed, 8-byte aligned as ``PACKED_ALIGNMENT`` makes them),
and a walk over real H200 buffers (``tests/data/cupti_buffers_h200.npz``, raw bytes CUPTI 13.4
wrote on the H200; on the device the same walk matched ``cuptiActivityGetNextRecord`` and
cupti-python's field values on every record: ``benchmarks/probe_libcupti.py``).
"""

from __future__ import annotations

import ctypes
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import gputrace
from gputrace.backends import cupti_lib
from gputrace.backends import cupti_records as cr
from gputrace.backends.cupti import CuptiBackend
from gputrace.backends.cupti_lib import LibCuptiSource
from gputrace.clock import FakeClock
from gputrace.errors import GputraceError, reported, reset_reports
from gputrace.records import OP_KERNEL, OP_MEMCPY, OP_MEMSET
from tests.cupti_fake import FakeActivitySource

DATA = Path(__file__).parents[1] / "data"
u8, u16, u32, i32, u64, i64, ptr = (ctypes.c_uint8, ctypes.c_uint16, ctypes.c_uint32, ctypes.c_int32,
                                    ctypes.c_uint64, ctypes.c_int64, ctypes.c_void_p)  # fmt: skip


class Kernel13(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("kind", u32), ("cacheConfig", u8), ("sharedMemoryConfig", u8), ("registersPerThread", u16),
                ("partitionedGlobalCacheRequested", u32), ("partitionedGlobalCacheExecuted", u32),
                ("start", u64), ("end", u64), ("completed", u64), ("deviceId", u32), ("contextId", u32),
                ("streamId", u32), ("gridX", i32), ("gridY", i32), ("gridZ", i32), ("blockX", i32),
                ("blockY", i32), ("blockZ", i32), ("staticSharedMemory", i32), ("dynamicSharedMemory", i32),
                ("localMemoryPerThread", u32), ("localMemoryTotal", u32), ("correlationId", u32),
                ("gridId", i64), ("name", ptr), ("reserved0", ptr), ("queued", u64), ("submitted", u64),
                ("launchType", u8), ("isSharedMemoryCarveoutRequested", u8),
                ("sharedMemoryCarveoutRequested", u8), ("padding", u8), ("sharedMemoryExecuted", u32),
                ("graphNodeId", u64), ("shmemLimitConfig", u32),
                ("graphId", u32), ("pAccessPolicyWindow", ptr), ("channelID", u32), ("channelType", u32),
                ("clusterX", u32), ("clusterY", u32), ("clusterZ", u32), ("clusterSchedulingPolicy", u32),
                ("localMemoryTotal_v2", u64), ("maxPotentialClusterSize", u32), ("maxActiveClusters", u32),
                ("isDeviceLaunched", u8), ("padding3", u8 * 7), ("priority", i32), ("padding4", u32),
                ("executionModel", u32), ("padding5", u32), ("sourceGraphId", u32), ("padding6", u32),
                ("sourceGraphNodeId", u64)]  # fmt: skip


class Api(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("kind", u32), ("cbid", u32), ("start", u64), ("end", u64), ("processId", u32),
                ("threadId", u32), ("correlationId", u32), ("returnValue", u32)]  # fmt: skip


class Memcpy7(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("kind", u32), ("copyKind", u8), ("srcKind", u8), ("dstKind", u8), ("flags", u8),
                ("bytes", u64), ("start", u64), ("end", u64), ("deviceId", u32), ("contextId", u32),
                ("streamId", u32), ("correlationId", u32), ("runtimeCorrelationId", u32), ("pad", u32),
                ("reserved0", ptr), ("graphNodeId", u64), ("graphId", u32), ("channelID", u32),
                ("channelType", u32), ("isDeviceLaunched", u8), ("pad2", u8 * 3), ("copyCount", u64),
                ("sourceGraphId", u32), ("pad3", u32), ("sourceGraphNodeId", u64)]  # fmt: skip


class Memset5(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("kind", u32), ("value", u32), ("bytes", u64), ("start", u64), ("end", u64),
                ("deviceId", u32), ("contextId", u32), ("streamId", u32), ("correlationId", u32),
                ("flags", u16), ("memoryKind", u16), ("pad", u32), ("reserved0", ptr), ("graphNodeId", u64),
                ("graphId", u32), ("channelID", u32), ("channelType", u32), ("isDeviceLaunched", u8),
                ("pad2", u8 * 3), ("sourceGraphId", u32), ("pad3", u32),
                ("sourceGraphNodeId", u64)]  # fmt: skip


ORACLE: dict[int, Any] = {cr.KIND_CONCURRENT_KERNEL: Kernel13, cr.KIND_DRIVER: Api, cr.KIND_RUNTIME: Api,
                          cr.KIND_MEMCPY: Memcpy7, cr.KIND_MEMSET: Memset5}  # fmt: skip


def test_the_layouts_are_the_headers_structs() -> None:
    """Every field gputrace reads sits where the header's struct has it; sizes are CUPTI 13.4's."""
    for kind, dtype in cr.LAYOUTS.items():
        st = ORACLE[kind]
        assert dtype.itemsize == ctypes.sizeof(st) == cr.CUPTI_13_SIZES[kind]
        for name in dtype.names:
            assert dtype.fields[name][1] == getattr(st, name).offset, (kind, name)
            assert dtype.fields[name][0].itemsize == ctypes.sizeof(dict(st._fields_)[name]), (kind, name)
    assert (ctypes.sizeof(Kernel13), ctypes.sizeof(Api)) == (248, 40)  # measured on the H200 (FACTS)


def _random_buffer(
    rng: np.random.Generator, n: int, name_ptr: int = 0
) -> tuple[bytes, list[tuple[int, Any]]]:
    """n records of random kinds with random field values, packed as CUPTI packs them (kernel
    names pointing at ``name_ptr`` when given)."""
    out, recs = bytearray(), []
    for _ in range(n):
        kind = int(rng.choice(list(ORACLE)))
        st = ORACLE[kind]()
        for name, ctype in st._fields_:
            if name == "kind" or hasattr(ctype, "_length_"):
                continue
            bits = 8 * ctypes.sizeof(ctype)
            setattr(st, name, int(rng.integers(0, 1 << min(bits, 62))))
        st.kind = kind
        if name_ptr and kind == cr.KIND_CONCURRENT_KERNEL:
            st.name = name_ptr
        recs.append((kind, st))
        out += bytes(st)
    return bytes(out), recs


@pytest.mark.parametrize("seed", range(6))
def test_random_buffers_decode_field_by_field(seed: int) -> None:
    rng = np.random.default_rng(seed)
    raw, recs = _random_buffer(rng, int(rng.integers(1, 400)))
    got = cr.BufferDecoder().decode(np.frombuffer(raw, np.uint8))
    assert got.problem == "" and got.records == len(recs)
    by_kind = {"kernels": (cr.KIND_CONCURRENT_KERNEL,), "memcpys": (cr.KIND_MEMCPY,),
               "memsets": (cr.KIND_MEMSET,), "calls": (cr.KIND_DRIVER, cr.KIND_RUNTIME)}  # fmt: skip
    for attr, kinds in by_kind.items():
        want = [st for k, st in recs if k in kinds]
        arr = getattr(got, attr)
        assert len(arr) == len(want)
        for row, st in zip(arr, want, strict=True):
            for name in arr.dtype.names:
                assert int(row[name]) == int(getattr(st, name) or 0), (attr, name)


def test_several_buffers_join_into_the_columns_of_each_in_turn() -> None:
    rng = np.random.default_rng(11)
    name = ctypes.create_string_buffer(b"kernel_a")
    dec = cr.BufferDecoder()
    bufs = [_random_buffer(rng, 60, ctypes.addressof(name))[0] for _ in range(3)]
    parts = [dec.decode(np.frombuffer(b, np.uint8)) for b in bufs]

    def read(p: int) -> str:
        return ctypes.string_at(p).decode()

    names = cr.NameTable()
    joined = cr.columns(parts, names, read)
    one = [cr.columns([p], names, read) for p in parts]  # (one table: the same index per name)
    ops = [o for o, _ in one]  # the operations come kind by kind: every buffer's kernels first
    want_ops = np.concatenate([o[o["kind"] == k] for k in (OP_KERNEL, OP_MEMCPY, OP_MEMSET) for o in ops])
    want_calls = np.concatenate([c for _, c in one])
    for got, want in zip(joined, (want_ops, want_calls), strict=True):
        assert len(got) == len(want) > 0
        for field in got.dtype.names:
            assert np.array_equal(got[field], want[field]), field
    assert {names.names[i] for i in joined[0]["name"][joined[0]["kind"] == OP_KERNEL]} == {"kernel_a"}


def _walk_one_by_one(buf: np.ndarray, sizes: dict[int, int]) -> list[int]:
    """The plain walk CUPTI's GetNextRecord does: kind, size, next."""
    out, off = [], 0
    while off < len(buf):
        out.append(off)
        off += sizes[int(buf[off : off + 4].view("<u4")[0])]
    assert off == len(buf)
    return out


@pytest.mark.parametrize("seed", range(8))
def test_buffers_of_runs_decode_as_the_plain_walk_does(seed: int) -> None:
    """CUPTI's usual buffer (a launch's API record, then its kernel's, over and over) with other
    records breaking the runs at random, a run cut short, or a record at the end cut off: the
    records found are the plain walk's, field by field, or the break is said."""
    rng = np.random.default_rng(100 + seed)
    recs: list[tuple[int, Any]] = []
    while len(recs) < 3000:
        for _ in range(int(rng.integers(1, 900))):
            recs += [(cr.KIND_DRIVER, Api(kind=cr.KIND_DRIVER, correlationId=len(recs))),
                     (cr.KIND_CONCURRENT_KERNEL, Kernel13(kind=cr.KIND_CONCURRENT_KERNEL,
                                                          correlationId=len(recs), gridX=7))]  # fmt: skip
        recs += _random_buffer(rng, int(rng.integers(1, 4)))[1]
    if seed % 2:
        recs = recs[: -int(rng.integers(1, 50))]  # a run's end missing
    raw = b"".join(bytes(st) for _, st in recs)
    buf = np.frombuffer(raw, np.uint8)
    sizes = cr.CUPTI_13_SIZES
    starts, problem = cr.BufferDecoder().starts(buf)
    assert problem == "" and starts.tolist() == _walk_one_by_one(buf, sizes)
    got = cr.BufferDecoder().decode(buf)
    kernels = [st for k, st in recs if k == cr.KIND_CONCURRENT_KERNEL]
    assert got.records == len(recs) and len(got.kernels) == len(kernels)
    assert got.kernels["correlationId"].tolist() == [st.correlationId for st in kernels]
    cut = cr.BufferDecoder().decode(buf[: -int(rng.integers(1, 200))])  # a short buffer: said
    assert cut.problem and cut.records < len(recs)


@pytest.mark.parametrize("tail", ["whole", "unknown kind", "cut"])
@pytest.mark.parametrize("seed", range(4))
def test_runs_that_turn_short_hand_the_rest_to_the_general_walk(seed: int, tail: str) -> None:
    """Long runs of launch + kernel, then records of random kinds (the runs turn short and the
    general walk takes over where they stopped): the records are the plain walk's; a record of an
    unknown kind or a cut in that tail is said, and the records before it are kept."""
    rng = np.random.default_rng(200 + seed)
    recs: list[tuple[int, Any]] = []
    for _ in range(int(rng.integers(20, 600))):
        api = Api(kind=cr.KIND_DRIVER, correlationId=len(recs))
        kernel = Kernel13(kind=cr.KIND_CONCURRENT_KERNEL, correlationId=len(recs))
        recs += [(cr.KIND_DRIVER, api), (cr.KIND_CONCURRENT_KERNEL, kernel)]
    recs += _random_buffer(rng, int(rng.integers(60, 300)))[1]
    raw = b"".join(bytes(st) for _, st in recs)
    want = _walk_one_by_one(np.frombuffer(raw, np.uint8), cr.CUPTI_13_SIZES)
    at = want[len(want) - int(rng.integers(2, 40))]  # inside the tail of random kinds
    if tail == "unknown kind":
        raw = raw[:at] + (77).to_bytes(4, "little") + raw[at + 4 :]
    elif tail == "cut":
        raw = raw[: at + 8]  # its kind is there, the rest of it is not
    starts, problem = cr.BufferDecoder().starts(np.frombuffer(raw, np.uint8))
    if tail == "whole":
        assert problem == "" and starts.tolist() == want
    else:
        assert problem and starts.tolist() == [w for w in want if w < at] + ([at] if tail == "cut" else [])
        got = cr.BufferDecoder().decode(np.frombuffer(raw, np.uint8))
        assert got.problem and got.records == len([w for w in want if w < at])


@pytest.mark.parametrize("tail", ["whole", "unknown kind", "cut"])
@pytest.mark.parametrize("seed", range(6))
def test_records_full_of_small_numbers_walk_as_the_plain_walk_does(seed: int, tail: str) -> None:
    """Records whose fields hold small numbers (grid sizes, device and stream ids) look like a
    record's start in many of their 8-byte slots, and false chains through them run beside the
    real one and merge into it. In blocks of one kind and at random, whole, with a record of an
    unknown kind or cut short: the records are the plain walk's, or those before the break."""
    rng = np.random.default_rng(300 + seed)
    recs: list[tuple[int, Any]] = []
    while len(recs) < 1500:
        kind = int(rng.choice(list(ORACLE)))
        for _ in range(int(rng.integers(1, 60)) if rng.random() < 0.7 else 1):
            st = ORACLE[kind]()
            for name, ctype in st._fields_:
                if not hasattr(ctype, "_length_"):
                    setattr(st, name, int(rng.integers(0, 12)))
            st.kind = kind
            recs.append((kind, st))
    raw = b"".join(bytes(st) for _, st in recs)
    want = _walk_one_by_one(np.frombuffer(raw, np.uint8), cr.CUPTI_13_SIZES)
    at = want[len(want) - int(rng.integers(2, 400))]
    if tail == "unknown kind":
        raw = raw[:at] + (77).to_bytes(4, "little") + raw[at + 4 :]
    elif tail == "cut":
        raw = raw[: at + 8]
    starts, problem = cr.BufferDecoder().starts(np.frombuffer(raw, np.uint8))
    if tail == "whole":
        assert problem == "" and starts.tolist() == want
    else:
        assert problem and starts.tolist() == [w for w in want if w < at] + ([at] if tail == "cut" else [])


def test_real_h200_buffers() -> None:
    z = np.load(DATA / "cupti_buffers_h200.npz")
    sizes = {int(k): int(v) for k, v in z["sizes"].tolist()}
    assert int(z["version"]) == 130401 and cr.layout_for(130401, sizes) == sizes
    dec = cr.BufferDecoder(sizes)
    kernels = calls = 0
    for key in sorted(k for k in z.files if k.startswith("buf")):
        buf = z[key]
        starts, problem = dec.starts(buf)
        assert problem == "" and starts.tolist() == _walk_one_by_one(buf, sizes)
        got = dec.decode(buf)
        for row, off in zip(got.kernels, starts[buf[starts] == cr.KIND_CONCURRENT_KERNEL], strict=True):
            st = Kernel13.from_buffer_copy(buf[off : off + 248].tobytes())
            assert (int(row["start"]), int(row["end"]), int(row["correlationId"]), int(row["gridX"])) == (
                st.start, st.end, st.correlationId, st.gridX)  # fmt: skip
            assert st.end > st.start > 1_700_000_000 * 10**9  # CLOCK_REALTIME ns
        kernels += len(got.kernels)
        calls += len(got.calls)
    assert (kernels, calls) == (5000, 5005)  # the probe's 5,000 launches + a memset and two copies' calls


def test_real_solver_buffers_from_an_h100() -> None:
    """The buffers a CuPy solver's 300 iterations filled under gputrace on an H100 (CUPTI 13.4):
    kernel records alternate with driver and runtime API records (cuBLAS calls the runtime),
    with a copy and its calls every iteration, so the predicted runs are short and the general
    walk finds most records. Every record is the plain walk's, and every field read equals the
    header's struct read at that record."""
    z = np.load(DATA / "cupti_buffers_solver_h100.npz")
    sizes = {int(k): int(v) for k, v in z["sizes"].tolist()}
    dec = cr.BufferDecoder(sizes)
    counts: Counter[int] = Counter()
    for key in sorted(k for k in z.files if k.startswith("buf")):
        buf = z[key]
        starts, problem = dec.starts(buf)
        assert problem == "" and starts.tolist() == _walk_one_by_one(buf, sizes)
        got = dec.decode(buf)
        kinds = buf[starts]
        by_kind = {"kernels": [cr.KIND_CONCURRENT_KERNEL], "memcpys": [cr.KIND_MEMCPY],
                   "memsets": [cr.KIND_MEMSET], "calls": [cr.KIND_DRIVER, cr.KIND_RUNTIME]}  # fmt: skip
        for attr, kind_set in by_kind.items():
            arr, offs = getattr(got, attr), starts[np.isin(kinds, kind_set)]
            assert len(arr) == len(offs)
            for row, off in zip(arr, offs, strict=True):
                struct = ORACLE[int(buf[off])]
                st = struct.from_buffer_copy(buf[off : off + ctypes.sizeof(struct)].tobytes())
                assert all(int(row[f]) == int(getattr(st, f)) for f in arr.dtype.names), (key, attr, int(off))
        counts.update(kinds.tolist())
    assert dict(counts) == {cr.KIND_CONCURRENT_KERNEL: 7200, cr.KIND_DRIVER: 6000, cr.KIND_RUNTIME: 1804,
                            cr.KIND_MEMCPY: 300, cr.KIND_MEMSET: 1}  # fmt: skip


def test_a_short_buffer_keeps_what_precedes_the_cut_and_says_so() -> None:
    raw, recs = _random_buffer(np.random.default_rng(7), 50)
    buf = np.frombuffer(raw, np.uint8)
    ends = set(np.cumsum([ctypes.sizeof(st) for _, st in recs]).tolist())
    for cut in (1, 8, 40, 100, 333):
        if len(buf) - cut in ends:
            continue  # a cut at a record's end leaves a whole, shorter buffer
        got = cr.BufferDecoder().decode(buf[:-cut])
        assert got.problem  # said
        assert got.records < len(recs)
        kept = sum(len(getattr(got, a)) for a in ("kernels", "memcpys", "memsets", "calls"))
        assert kept == got.records  # never a record read past the end


def test_an_unknown_kind_stops_the_chain_there() -> None:
    raw, recs = _random_buffer(np.random.default_rng(8), 30)
    buf = np.frombuffer(raw, np.uint8).copy()
    offs = np.cumsum([0] + [ctypes.sizeof(st) for _, st in recs])
    buf[offs[12] : offs[12] + 4] = np.frombuffer(np.uint32(99).tobytes(), np.uint8)
    got = cr.BufferDecoder().decode(buf)
    assert got.records == 12 and "unknown kind 99" in got.problem
    assert cr.BufferDecoder().decode(np.zeros(0, np.uint8)).records == 0


def test_unknown_versions_and_short_structs_are_refused() -> None:
    assert "no known record layout" in str(cr.layout_for(120800, cr.CUPTI_13_SIZES))
    assert "no known record layout" in str(cr.layout_for(140000, cr.CUPTI_13_SIZES))
    small = {**cr.CUPTI_13_SIZES, cr.KIND_CONCURRENT_KERNEL: 144}
    assert "needs" in str(cr.layout_for(130000, small))
    grown = {**cr.CUPTI_13_SIZES, cr.KIND_CONCURRENT_KERNEL: 256}  # a later 13.x appended fields
    assert cr.layout_for(130600, grown) == grown


class StandInLib:
    """libcupti's answers without a GPU (what LibCuptiSource asks at construction)."""

    def __init__(self, version: int) -> None:
        self._v = version
        self.path = "stand-in"
        self.calls: list[tuple[Any, ...]] = []

    def version(self) -> int:
        return self._v

    def struct_size(self, kind: int) -> int:
        return cr.CUPTI_13_SIZES[kind]

    def call(self, name: str, *args: Any) -> None:
        self.calls.append((name, *args))

    def timestamp(self) -> int:
        return 0

    def callback_name(self, domain: int, cbid: int) -> str | None:
        return None


def test_an_unknown_cupti_version_is_refused_with_one_sentence() -> None:
    with pytest.raises(GputraceError, match="CUPTI API version 120800 has no known record layout"):
        LibCuptiSource(lib=StandInLib(120800))


def test_a_registration_cupti_refuses_is_one_sentence_at_start() -> None:
    """CUPTI's first registration runs on a thread from the source's construction; its failure
    is raised by ``start``, on the session's thread, as CUPTI refusing to start."""

    class Refusing(StandInLib):
        def call(self, name: str, *args: Any) -> None:
            super().call(name, *args)
            if name == "cuptiActivityRegisterCallbacks":
                raise GputraceError("cuptiActivityRegisterCallbacks failed: CUPTI_ERROR_NOT_INITIALIZED")

    lib = Refusing(130401)
    src = LibCuptiSource(lib=lib)
    with pytest.raises(
        GputraceError, match=r"CUPTI could not be enabled \(cuptiActivityRegisterCallbacks failed"
    ):
        src.start()
    assert not any(c[0] == "cuptiActivityEnable" for c in lib.calls)  # nothing enabled after it


def test_buffer_callbacks_hand_buffers_over_and_never_raise() -> None:
    """CUPTI's two callbacks, called as CUPTI calls them: a buffer is lent, filled with records,
    handed back; a failing hook inside the completed callback is reported, not raised."""
    src = LibCuptiSource(lib=StandInLib(130401), buffer_bytes=4096)
    bufp, size, maxrec = ctypes.c_void_p(), ctypes.c_size_t(), ctypes.c_size_t()
    cupti_lib._on_requested(ctypes.pointer(bufp), ctypes.pointer(size), ctypes.pointer(maxrec))
    assert bufp.value and size.value == 4096
    kname = ctypes.create_string_buffer(b"my_kernel")
    raw, recs = _random_buffer(np.random.default_rng(3), 10, ctypes.addressof(kname))
    ctypes.memmove(bufp.value, raw, len(raw))

    def broken() -> None:
        raise RuntimeError("hook failed")

    src._on_buffer = broken
    reset_reports()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cupti_lib._on_completed(None, 0, bufp.value, 4096, len(raw))  # must not raise into CUPTI
    assert any("hook failed" in m for m in reported())
    ops, calls = src.drain()
    n_ops = sum(1 for k, _ in recs if k in (cr.KIND_CONCURRENT_KERNEL, cr.KIND_MEMCPY, cr.KIND_MEMSET))
    assert len(ops) + len(calls) == len(recs) and len(ops) == n_ops
    assert src.buffers == 1 and src.undecoded == 0
    assert {src.names.names[i] for i in ops["name"][ops["kind"] == 0]} <= {"my_kernel"}


def test_a_decoder_fault_loses_that_buffer_alone_counted_and_said() -> None:
    """A buffer the decoder fails on (a bug, or bytes no check foresaw) costs its own records, is
    counted as undecoded and reported once; the other buffers of the same drain are kept."""
    src = LibCuptiSource(lib=StandInLib(130401), buffer_bytes=4096)
    kname = ctypes.create_string_buffer(b"kept_kernel")
    sent = []
    for seed in (11, 12):
        bufp, size, maxrec = ctypes.c_void_p(), ctypes.c_size_t(), ctypes.c_size_t()
        cupti_lib._on_requested(ctypes.pointer(bufp), ctypes.pointer(size), ctypes.pointer(maxrec))
        raw, recs = _random_buffer(np.random.default_rng(seed), 8, ctypes.addressof(kname))
        ctypes.memmove(bufp.value, raw, len(raw))
        cupti_lib._on_completed(None, 0, bufp.value, 4096, len(raw))
        sent.append(recs)
    decode, calls_made = src.decoder.decode, []

    def first_fails(buf: np.ndarray) -> cr.Decoded:
        calls_made.append(len(buf))
        if len(calls_made) == 1:
            raise IndexError("index 0 is out of bounds")
        return decode(buf)

    src.decoder.decode = first_fails  # type: ignore[method-assign]
    reset_reports()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ops, calls = src.drain()
    assert len(calls_made) == 2
    assert len(ops) + len(calls) == len(sent[1])  # the second buffer's records, all of them
    assert src.buffers == 2 and src.undecoded == 1
    assert [m for m in reported() if "decoding it failed (IndexError" in m] != []


def test_a_buffer_cupti_holds_past_a_stop_outlives_its_source() -> None:
    """CUPTI may keep a lent buffer past a session's stop and hand it back later: the buffer
    stays allocated after the source that lent it is collected (CUPTI writes into it), the
    callbacks CUPTI was given stay the same, and its records do not join the next session's."""
    import gc
    import weakref

    lib_a = StandInLib(130401)
    a = LibCuptiSource(lib=lib_a, buffer_bytes=4096)
    a.start()
    registered = [c[1:] for c in lib_a.calls if c[0] == "cuptiActivityRegisterCallbacks"]
    requested, completed = registered[-1]
    bufp, size, maxrec = ctypes.c_void_p(), ctypes.c_size_t(), ctypes.c_size_t()
    requested(ctypes.pointer(bufp), ctypes.pointer(size), ctypes.pointer(maxrec))  # as CUPTI calls it
    held = weakref.ref(cupti_lib._lent[bufp.value][0])
    a.stop()
    del a
    gc.collect()
    assert held() is not None, "a buffer CUPTI still holds was freed with its source"
    kname = ctypes.create_string_buffer(b"late_kernel")
    raw, _ = _random_buffer(np.random.default_rng(5), 6, ctypes.addressof(kname))
    ctypes.memmove(bufp.value, raw, len(raw))  # CUPTI writes its last records
    lib_b = StandInLib(130401)
    b = LibCuptiSource(lib=lib_b, buffer_bytes=4096)
    b.start()
    again = [c[1:] for c in lib_b.calls if c[0] == "cuptiActivityRegisterCallbacks"]
    assert again[-1] == (requested, completed)
    completed(None, 0, bufp.value, 4096, len(raw))  # handed back in the next session
    ops, calls = b.drain()
    assert len(ops) == len(calls) == 0  # the earlier session's records are not this one's
    b.stop()


def test_buffers_handed_back_are_lent_again_whatever_sizes_came_before() -> None:
    """Spare buffers of another session's size do not stop a source from getting one."""
    bufp, size, maxrec = ctypes.c_void_p(), ctypes.c_size_t(), ctypes.c_size_t()
    args = (ctypes.pointer(bufp), ctypes.pointer(size), ctypes.pointer(maxrec))
    for nbytes in (8192, 4096, 4096, 8192):  # spare buffers of both sizes, interleaved
        src = LibCuptiSource(lib=StandInLib(130401), buffer_bytes=nbytes)
        src.start()
        cupti_lib._on_requested(*args)  # as CUPTI calls them
        assert bufp.value and size.value == nbytes
        cupti_lib._on_completed(None, 0, bufp.value, nbytes, 0)
        src.drain()
        src.stop()


def test_a_short_buffer_in_a_session_is_counted_and_said() -> None:
    clock = FakeClock(0, 1_000)
    src = FakeActivitySource(clock)
    with gputrace.session(backend=CuptiBackend(clock, source=src), clock=clock, quiet=True) as s:
        with gputrace.trace("a"):
            src.launch("k1")
            src.launch("k2")
        # the stop's drain: k1's call and kernel, k2's call and kernel, the stop's sync call (40 B);
        # the cut takes the sync call and the tail of k2's kernel record
        src.cut_next_buffer(40 + 8)
    t = s.trace
    assert t is not None
    names = [t.names[int(i)] for i in t.ops.name]
    assert names == ["k1"]
    assert any("could not be read whole" in str(p) for p in t.header.get("problems", []))


def test_auto_timing_falls_back_to_events_with_one_notice_when_cupti_refuses(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """libcupti found, but of a version whose layout gputrace does not know: events, said once."""
    from gputrace.backends import cuda, cupti
    from gputrace.backends.cpu import CpuBackend

    def refuse(clock: Any, **options: Any) -> Any:
        return LibCuptiSource(lib=StandInLib(140000))  # raises: no known record layout

    monkeypatch.setattr(cuda, "probe", lambda: None)  # as on a GPU machine
    monkeypatch.setattr(cupti, "probe", lambda: None)
    monkeypatch.setattr(cupti, "torch_loaded", lambda: None)  # (other tests may have imported torch)
    monkeypatch.setattr(cupti, "create", refuse)
    monkeypatch.setattr(cuda, "CudaEventsBackend", lambda clock, **o: CpuBackend(clock))  # events' stand-in
    backend = cuda.CudaBackend(FakeClock(0, 1), timing="auto")
    err = capsys.readouterr().err
    assert err.count("no known record layout") == 1 and "CUDA events instead" in err
    assert "CUPTI API version 140000" in backend.timing_note  # type: ignore[attr-defined]
    with pytest.raises(GputraceError, match="timing='cupti' is not usable here: CUPTI API version 140000"):
        cuda.CudaBackend(FakeClock(0, 1), timing="cupti")


# Offsets (and sizes) of the fields gputrace reads in the structs CUPTI 12.8 and 12.9 write
# (CUpti_ActivityKernel9, CUpti_ActivityAPI, CUpti_ActivityMemcpy6, CUpti_ActivityMemset4), printed
# by a C program taking ``offsetof`` of each against the headers of the nvidia-cuda-cupti-cu12
# wheels 12.8.90 and 12.9.79 (identical in both; Kernel5–8, Memcpy4–5 and Memset3 agree too).
CUPTI_12_HEADER_OFFSETS = {
    cr.KIND_CONCURRENT_KERNEL: ({"kind": 0, "start": 16, "end": 24, "deviceId": 40, "streamId": 48,
                                 "gridX": 52, "gridY": 56, "gridZ": 60, "blockX": 64, "blockY": 68,
                                 "blockZ": 72, "correlationId": 92, "name": 104, "graphNodeId": 144,
                                 "graphId": 156}, 208),
    cr.KIND_DRIVER: ({"kind": 0, "cbid": 4, "start": 8, "end": 16, "processId": 24, "threadId": 28,
                      "correlationId": 32, "returnValue": 36}, 40),
    cr.KIND_MEMCPY: ({"kind": 0, "copyKind": 4, "bytes": 8, "start": 16, "end": 24, "deviceId": 32,
                      "streamId": 40, "correlationId": 44, "graphNodeId": 64, "graphId": 72}, 96),
    cr.KIND_MEMSET: ({"kind": 0, "bytes": 8, "start": 16, "end": 24, "deviceId": 32, "streamId": 40,
                      "correlationId": 44, "graphNodeId": 64, "graphId": 72}, 88),
}  # fmt: skip


def test_cupti_12_records_have_the_fields_at_the_same_offsets() -> None:
    """CUPTI 12.8/12.9 records are read with the same field offsets, at their own sizes."""
    for version in (26, 27, 28):
        sizes = cr.layout_for(version, {})
        assert isinstance(sizes, dict)
        for kind, (offsets, size) in CUPTI_12_HEADER_OFFSETS.items():
            dtype = cr.LAYOUTS[kind]
            assert {f: dtype.fields[f][1] for f in dtype.names} == offsets, kind
            assert sizes[kind] == size
    assert "no known record layout" in str(cr.layout_for(24, {}))  # 12.6: sizes not known


@pytest.mark.parametrize("seed", range(3))
def test_cupti_12_buffers_decode_field_by_field(seed: int) -> None:
    """Random records packed at CUPTI 12.8's sizes (each 13.4 struct cut to its 12.8 size: every
    field read lies before the cut) decode to their values."""
    rng = np.random.default_rng(100 + seed)
    _, recs = _random_buffer(rng, int(rng.integers(1, 300)))
    sizes = cr.layout_for(26, {})
    assert isinstance(sizes, dict)
    raw = b"".join(bytes(st)[: sizes[k]] for k, st in recs)
    got = cr.BufferDecoder(sizes).decode(np.frombuffer(raw, np.uint8))
    assert got.problem == "" and got.records == len(recs)
    want = [st for k, st in recs if k == cr.KIND_CONCURRENT_KERNEL]
    assert len(got.kernels) == len(want)
    for row, st in zip(got.kernels, want, strict=True):
        for name in got.kernels.dtype.names:
            assert int(row[name]) == int(getattr(st, name) or 0), name
    assert len(got.calls) + len(got.memcpys) + len(got.memsets) + len(want) == len(recs)


def test_a_cupti_12_library_without_struct_sizes_gets_the_known_ones() -> None:
    class Cupti12(StandInLib):
        def struct_size(self, kind: int) -> int:
            raise AssertionError("CUPTI 12 has no cuptiActivityGetStructSize")

    src = LibCuptiSource(lib=Cupti12(26))
    assert src.decoder.sizes == cr.CUPTI_12_SIZES[26]
    with pytest.raises(GputraceError, match="CUPTI API version 24 has no known record layout"):
        LibCuptiSource(lib=Cupti12(24))


def test_a_real_buffer_with_any_kind_word_overwritten_decodes_as_far_as_the_plain_walk() -> None:
    """Each record's kind in a real buffer overwritten with every known kind and an unknown one
    (a corrupted buffer): decoding never raises, keeps the whole records the plain walk reaches
    before it breaks, and says why exactly when that walk does not end at the buffer's end."""
    z = np.load(DATA / "cupti_buffers_solver_h100.npz")
    sizes = {int(k): int(v) for k, v in z["sizes"].tolist()}
    dec = cr.BufferDecoder(sizes)
    for key in ("buf0", "buf1"):
        starts = _walk_one_by_one(z[key], sizes)
        real = z[key][: max(s for s in starts if s <= 3000)]  # whole records, up to 3 kB
        for at in _walk_one_by_one(real, sizes):
            for kind in (*sizes, 77):
                buf = real.copy()
                buf[at : at + 4] = np.frombuffer(np.uint32(kind).tobytes(), np.uint8)
                whole, off = 0, 0
                while off < len(buf) and int(buf[off : off + 4].view("<u4")[0]) in sizes:
                    size = sizes[int(buf[off : off + 4].view("<u4")[0])]
                    if off + size > len(buf):
                        break
                    whole, off = whole + 1, off + size
                got = dec.decode(buf)
                assert got.records == whole, (key, at, kind)
                assert bool(got.problem) == (off != len(buf)), (key, at, kind, got.problem)
