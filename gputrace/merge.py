"""Merge traces from several processes (ranks of one job) onto one time line.

Each input moves by its ``clock_pair`` (realtime − monotonic) against the first input's, or, where
the ranks measured their offsets through the job's process group (``gputrace.ranks``), by those
fits onto rank 0's clock; ``merged[i]["offset"]`` says which, and how well (docs/ranks.md).
Processes keep their own tracks; GPU processes, thread ids and flow ids are renumbered apart.

>>> import gputrace, os, tempfile
>>> from gputrace.clock import FakeClock
>>> d = tempfile.mkdtemp()
>>> for rank in (0, 1):
...     os.environ["RANK"] = str(rank)
...     with gputrace.session(os.path.join(d, f"r{rank}.json"), backend="fake", quiet=True):
...         with gputrace.trace("allreduce"):
...             pass
>>> del os.environ["RANK"]
>>> merged = merge_files(os.path.join(d, "all.json"), [os.path.join(d, f"r{r}.json") for r in (0, 1)])
>>> [p["label"] for p in merged.header["processes"]], len(merged.find("allreduce"))
(['rank 0', 'rank 1'], 2)
"""

from __future__ import annotations

import functools
import glob
import itertools
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import fields, replace
from typing import Any

import numpy as np

from gputrace import exporters
from gputrace.errors import GputraceError
from gputrace.exporters import load
from gputrace.model import (
    NO_TIME,
    ClockFit,
    Mark,
    OpTable,
    QueueInfo,
    ScopeTable,
    SpanTable,
    ThreadInfo,
    Trace,
    canonical_names,
)
from gputrace.outpath import check_output
from gputrace.ranks import offset_at, to_reference
from gputrace.safetext import path_text

MAX_TID = 1 << 22  # Linux tids stay below this; remapped ones go just above it
MAX_PID = 1 << 22
# the time columns of the scope, span and operation tables (each has some of them)
TIME_COLUMNS = ("cpu_start_ns", "cpu_end_ns", "submit_ns", "call_start_ns", "call_end_ns", "gpu_start_ns",
                "gpu_end_ns")  # fmt: skip


def check_paths(out: str | os.PathLike[str], inputs: list[str]) -> None:
    """Refuse an output that is one of the inputs or not a regular file (``check_output``), and
    an input given twice. Files are compared by device and inode (links are the same file); inputs
    that do not exist are left for loading to report."""
    check_output(out)  # never onto a device node, a FIFO or a folder
    seen: dict[tuple[int, int], str] = {}
    for f in inputs:
        if (key := _file_id(f)) is None:
            continue
        if key in seen:
            first = seen[key]
            same = "it is given twice" if first == f else f"it is the same file as {path_text(first)}"
            raise GputraceError(f"{path_text(f)}: {same}; give each trace to merge once.")
        seen[key] = f
    if _file_id(out) in seen:
        raise GputraceError(
            f"{path_text(out)}: is also an input, and merging would overwrite it; choose another output file."
        )


def _file_id(path: str | os.PathLike[str]) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return st.st_dev, st.st_ino


def clock_offset(header: dict[str, Any], where: str) -> int:
    """realtime − monotonic of a trace, from its ``clock_pair``; a clear error if it has none."""
    pair = header.get("clock_pair")
    if not isinstance(pair, dict):
        raise GputraceError(f"{where}: cannot be merged, it records no clock_pair.")
    mono, real = pair.get("monotonic_ns"), pair.get("realtime_ns")
    if type(mono) is not int or type(real) is not int:
        raise GputraceError(f"{where}: cannot be merged, its clock_pair is not two integers.")
    return real - mono


def merge(traces: list[Trace], files: list[str] | None = None) -> Trace:
    """One trace holding every input's scopes on one time line, ordered by rank (traces without
    one last, in the given order)."""
    if not traces:
        raise GputraceError("nothing to merge: give at least one trace.")
    files = files or [f"<trace {i}>" for i in range(len(traces))]
    pairs = sorted(zip(traces, files, strict=True), key=lambda tf: (_rank(tf[0]) is None, _rank(tf[0]) or 0))
    traces, files = [t for t, _ in pairs], [f for _, f in pairs]
    offsets = [clock_offset(t.header, f) for t, f in pairs]
    # ranks that measured their offsets through the job's process group go by those (gputrace.ranks)
    traces, shifts, placed = place_ranks(traces, offsets)

    name_id: dict[str, int] = {}
    threads: list[ThreadInfo] = []
    queues: list[QueueInfo] = []
    used_tids: set[int] = set()
    used_pids: set[int] = set()
    processes: list[dict[str, Any]] = []
    tables: list[tuple[ScopeTable, SpanTable, OpTable]] = []  # renumbered, per input
    marks: list[Mark] = []
    fits: dict[int, ClockFit] = {}
    merged_info: list[dict[str, Any]] = []
    row0 = n_devices = correlation0 = 0
    for t, f, shift, how in zip(traces, files, shifts, placed, strict=True):
        name_map = np.array([name_id.setdefault(n, len(name_id)) for n in t.names] or [0], np.int64)
        thread0, queue0 = len(threads), len(queues)
        tids = [_free_id(th.tid, used_tids, 0 <= th.tid < MAX_TID, MAX_TID) for th in t.threads]
        threads += [ThreadInfo(tid, th.name) for tid, th in zip(tids, t.threads, strict=True)]
        real_pid = int(t.header.get("pid") or 1)
        pid = _free_id(real_pid, used_pids, 0 < real_pid < MAX_PID, MAX_PID)
        rank = _rank(t)
        label = f"rank {rank}" if rank is not None else f"pid {pid}"
        host = t.header.get("host")
        host_name = host.get("name") if isinstance(host, dict) else None
        devices = dict.fromkeys([q.device for q in t.queues] + sorted(t.clock_fits))
        dev_map = {dev: n_devices + k for k, dev in enumerate(devices)}
        n_devices += len(dev_map)
        processes.append({"pid": pid, "rank": rank, "label": label, "tids": tids, "host": host_name,
                          "pid_is_real": pid == real_pid, "devices": list(dev_map.values())})  # fmt: skip
        queues += [QueueInfo(dev_map[q.device], q.device_name, q.backend, q.label) for q in t.queues]
        fits.update((dev_map[dev], fit) for dev, fit in t.clock_fits.items())
        # times are on the reference clock already (_moved): only rows, names, threads and queues move
        s, sp, op = t.scopes, t.spans, t.ops
        tables.append((replace(
            s, name=name_map[s.name].astype(np.int32) if len(s) else s.name,
            thread=(s.thread + thread0).astype(np.int32), parent=np.where(s.parent >= 0, s.parent + row0, -1),
            queue=np.where(s.queue >= 0, s.queue + queue0, -1).astype(np.int32),
            args={k + row0: v for k, v in s.args.items()},
        ), replace(
            sp, scope=sp.scope + row0, label=name_map[sp.label].astype(np.int32) if len(sp) else sp.label,
            queue=np.where(sp.queue >= 0, sp.queue + queue0, -1).astype(np.int32),
        ), replace(
            op, scope=np.where(op.scope >= 0, op.scope + row0, -1),
            name=name_map[op.name].astype(np.int32), call_name=name_map[op.call_name].astype(np.int32),
            queue=(op.queue + queue0).astype(np.int32),
            thread=np.where(op.thread >= 0, op.thread + thread0, -1).astype(np.int32),
            correlation=op.correlation + correlation0,  # launch ids stay unique across processes
        )))  # fmt: skip
        correlation0 += int(op.correlation.max()) + 1 if len(op) else 0
        marks += [replace(m, thread=m.thread + thread0) for m in t.marks]
        merged_info.append({
            "file": path_text(f), "pid": pid, "rank": rank, "shift_ns": shift,
            "backend": t.header.get("backend"), "clock_pair": t.header.get("clock_pair"),
            "host": t.header.get("host"), "argv": t.header.get("argv"), "offset": how,
        })  # fmt: skip
        row0 += len(s)

    scopes, spans, ops = _concat(*zip(*tables, strict=True))
    marks.sort(key=lambda m: (m.ts_ns, m.thread, m.name))
    all_names = canonical_names(list(name_id), scopes, spans, ops)
    header = dict(traces[0].header)
    starts = [_start(t) for t in traces]
    ends = [int(t.header.get("end_ns", t.header["base_ns"])) for t in traces]
    header.update(
        start_ns=min(starts), base_ns=min(starts), end_ns=max(ends), pid=processes[0]["pid"], rank=None,
        clock=[dict(device=d, **f.to_dict()) for d, f in fits.items()], processes=processes,
        merged=merged_info, backend=",".join(sorted({str(t.header.get("backend")) for t in traces})),
    )  # fmt: skip
    merged = Trace(header, all_names, threads, queues, scopes, spans, marks, fits, ops)
    from gputrace.flags import anomaly_report

    header["anomalies"] = anomaly_report(merged)
    return merged


def _free_id(want: int, used: set[int], valid: bool, spare: int) -> int:
    """``want`` where it is valid and not taken yet, else the first free id from ``spare`` on
    (Linux tids and pids stay below the spare range); taken from then on."""
    got = want if valid and want not in used else next(i for i in itertools.count(spare) if i not in used)
    used.add(got)
    return got


def _rank(t: Trace) -> int | None:
    r = t.header.get("rank")
    return r if type(r) is int else None


def _concat(
    parts: Sequence[ScopeTable], span_parts: Sequence[SpanTable], op_parts: Sequence[OpTable]
) -> tuple[ScopeTable, SpanTable, OpTable]:
    """Concatenate, then order scopes by (cpu start, thread, −cpu end) and operations by GPU start,
    as every trace is ordered."""
    cols = {c: np.concatenate([getattr(p, c) for p in parts]) for c in ScopeTable.COLUMNS}
    order = np.lexsort((-cols["cpu_end_ns"], cols["thread"], cols["cpu_start_ns"]))
    new_row = np.empty(len(order), np.int64)
    new_row[order] = np.arange(len(order))
    for c in ScopeTable.COLUMNS:
        cols[c] = cols[c][order]
    cols["parent"] = np.where(cols["parent"] >= 0, new_row[np.maximum(cols["parent"], 0)], -1)
    args = {int(new_row[k]): v for p in parts for k, v in p.args.items()}
    scopes = ScopeTable(**cols, args=dict(sorted(args.items())))
    scol = {f.name: np.concatenate([getattr(p, f.name) for p in span_parts]) for f in fields(SpanTable)}
    scol["scope"] = new_row[scol["scope"]] if len(scol["scope"]) else scol["scope"]
    sorder = np.lexsort((scol["gpu_end_ns"], scol["gpu_start_ns"], scol["scope"]))
    spans = SpanTable(**{c: v[sorder] for c, v in scol.items()})
    ops = OpTable(*(np.concatenate([getattr(p, c) for p in op_parts]) for c in OpTable.COLUMNS))
    ops.scope = np.where(ops.scope >= 0, new_row[np.maximum(ops.scope, 0)], -1) if len(new_row) else ops.scope
    return scopes, spans, ops.take(np.argsort(ops.gpu_start_ns, kind="stable"))


def merge_files(out: str | os.PathLike[str], inputs: list[str]) -> Trace:
    """Load ``inputs``, merge them, write ``out``; returns the merged trace (``check_paths`` first)."""
    check_paths(out, inputs)
    traces = [load(f) for f in inputs]
    merged = merge(traces, list(inputs))
    exporters.write(merged, out)
    return merged


# placing ranks: each on rank 0's clock by the fit it measured (gputrace.ranks) ---------------------
def place_ranks(
    traces: list[Trace], offsets: list[int]
) -> tuple[list[Trace], list[int], list[dict[str, Any]]]:
    """Every trace moved onto one time line: ranks that measured their offsets against one rank 0
    by their fits onto its clock, the others by their clock pairs (``offsets``: realtime −
    monotonic), anchored there. Returns the moved traces, the constant shift of each (0 for a
    fitted one), and per trace how it was placed and with what uncertainty."""
    recs = [r if isinstance(r := t.header.get("ranks"), dict) else None for t in traces]
    ids = [r.get("reference_id") if r is not None and (r.get("status") == "reference" or
           isinstance(r.get("fit"), dict)) else None for r in recs]  # fmt: skip
    counted = [i for i in ids if i]
    ref_ids = [i for i, r in zip(ids, recs, strict=True) if i and r and r.get("status") == "reference"]
    ref_id = ref_ids[0] if ref_ids else max(set(counted), key=counted.count) if counted else None
    measured = [bool(i) and i == ref_id for i in ids]
    anchor = measured.index(True) if ref_id else 0  # without measured ranks: the first input
    a_rec = recs[anchor] or {}
    at_zero = not ref_id or a_rec.get("status") == "reference"  # the anchor's clock is the time line
    a_off = 0 if at_zero else offset_at(a_rec["fit"], _start(traces[anchor]))
    out, out_shifts, info = [], [], []
    for t, rec, offset, is_measured in zip(traces, recs, offsets, measured, strict=True):
        if not is_measured or rec is None:
            shift = offset - offsets[anchor] + a_off
            out.append(_moved(t, functools.partial(np.add, shift)) if shift else t)
            out_shifts.append(shift)
            info.append(_pair_info(t, traces[anchor], shift))
            continue
        base = {
            "engine": rec.get("engine"),
            "rank": rec.get("rank"),
            "samples": len(rec.get("samples") or []),
        }
        out_shifts.append(0)
        if rec.get("status") == "reference":
            out.append(t)
            info.append(
                {"method": "reference", "offset_ns": 0, "drift_ppm": 0.0, "uncertainty_ns": 0, **base}
            )
            continue
        fit = rec["fit"]
        start, end = _start(t), int(t.header.get("end_ns", _start(t)))
        out.append(_moved(t, functools.partial(to_reference, fit), float(fit["slope"])))
        info.append({
            "method": "measured", **base, "offset_ns": offset_at(fit, start),
            "drift_ppm": -float(fit.get("drift_ppm", 0.0)),
            "uncertainty_ns": int(np.ceil(uncertainty(fit, start, end))),
            "fit_method": fit.get("method"), "bound": fit.get("bound"),
        })  # fmt: skip
        if rec.get("failed"):
            info[-1]["note"] = f"some exchanges failed: {rec['failed']}"
    return out, out_shifts, info


def uncertainty(fit: dict[str, Any], start_ns: int, end_ns: int) -> float:
    """The largest alignment uncertainty (ns) of a rank's ``fit`` over ``start_ns``–``end_ns``: its
    bound inside its samples, growing by the slope's uncertainty outside."""
    from gputrace.resolver import uncertainty_at

    return float(np.max(uncertainty_at(ClockFit.from_dict(fit), np.array([start_ns, end_ns], np.int64))))


def _start(t: Trace) -> int:
    return int(t.header.get("start_ns", t.header["base_ns"]))


def _pair_info(t: Trace, ref: Trace, shift: int) -> dict[str, Any]:
    host = (t.header.get("host") or {}).get("name")
    same = host is not None and host == (ref.header.get("host") or {}).get("name")
    note = ("clock pair on the same host: one monotonic clock, exact up to the realtime reads unless "
            "the realtime clock was stepped between the sessions") if same else (
            "clock pair across hosts: trusts NTP (single-digit ms over the internet, tens of µs on a "
            "good LAN); not measured")  # fmt: skip
    r = t.header.get("ranks")
    if isinstance(r, dict) and r.get("failed"):
        note += f"; the measured exchange failed: {r['failed']}"
    return {"method": "clock pair", "offset_ns": shift, "uncertainty_ns": None, "note": note}


def _moved(t: Trace, to: Callable[[np.ndarray], np.ndarray], slope: float = 1.0) -> Trace:
    """``t`` with every time but ``NO_TIME`` moved by ``to`` (int64 ns to int64 ns: a constant shift,
    or a rank's fit onto rank 0's clock, whose ``slope`` its GPU clock fits take)."""

    def m(col: np.ndarray) -> np.ndarray:
        out = np.array(col, np.int64)  # a copy
        ok = out != NO_TIME
        out[ok] = to(out[ok])
        return out

    def one(ns: int) -> int:
        return int(to(np.array([ns], np.int64))[0])

    def times(table: Any) -> Any:
        return replace(table, **{c: m(getattr(table, c)) for c in TIME_COLUMNS if hasattr(table, c)})

    scopes, spans, ops = times(t.scopes), times(t.spans), times(t.ops)
    marks = [replace(x, ts_ns=one(x.ts_ns)) for x in t.marks]
    fits = {d: replace(f, cpu_ref_ns=one(f.cpu_ref_ns), first_cpu_ns=one(f.first_cpu_ns),
                       last_cpu_ns=one(f.last_cpu_ns), slope=f.slope / slope)
            for d, f in t.clock_fits.items()}  # fmt: skip
    header = dict(t.header)
    for k in ("start_ns", "base_ns", "end_ns"):
        if isinstance(header.get(k), int):
            header[k] = one(header[k])
    return Trace(header, list(t.names), list(t.threads), list(t.queues), scopes, spans, marks, fits, ops)


def placement_lines(header: dict[str, Any]) -> list[str]:
    """One line per input of a merged trace: how it was placed on the time line, how well."""
    out = []
    for m in header.get("merged") or []:
        how = m.get("offset") or {}
        who = f"rank {m['rank']}" if m.get("rank") is not None else str(m.get("file"))
        method = how.get("method", "clock pair")
        line = f"{who}: {method}" + (" (its clock is the time line)" if method == "reference" else "")
        if method == "measured":
            unc = float(how.get("uncertainty_ns") or 0)
            line += (f" through {how.get('engine')}, offset {how.get('offset_ns', 0) / 1e3:+.3f} µs "
                     f"± {unc / 1e3:.3f} µs, drift {how.get('drift_ppm', 0.0):+.2f} ppm")  # fmt: skip
        elif method == "clock pair":
            line += f", offset {how.get('offset_ns', 0) / 1e3:+.3f} µs, uncertainty not measured"
        if how.get("note"):
            line += f" ({how['note']})"
        out.append(line)
    return out


def expand_inputs(inputs: Sequence[str]) -> list[str]:
    """Inputs with glob patterns (``'run.rank*.trace.json'``, quoted past the shell) expanded, in
    rank order where the names carry ranks; a pattern matching nothing stays as given."""

    def key(p: str) -> tuple[int, str]:
        m = re.search(r"\.rank(\d+)\.", os.path.basename(p) + ".")
        return (int(m.group(1)) if m else 1 << 30, p)

    out: list[str] = []
    for p in inputs:
        hits = [] if os.path.exists(p) or not glob.has_magic(p) else glob.glob(p)
        out.extend(sorted(hits, key=key) if hits else [p])
    return out
