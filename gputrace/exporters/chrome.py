"""Chrome trace events (JSON text) for a trace, rendered from its ``plan`` (see docs/trace-format.md).

- a ``cat: "cpu"`` X slice per scope on its thread, spanning its CPU enqueue window;
- a ``cat: "gpu"`` X slice per GPU scope on its stream (wgpu passes: ``gpu.pass`` children),
  its args every field a reader needs: submission, submission -> start, GPU and CPU durations,
  alignment uncertainty, flags (and the operations' busy time where the trace has them);
- the submission -> GPU start wait as process-scoped async ``b``/``e`` events (``id2.local``),
  the ``b`` named "queued · <stream>", the ``e`` with no name (neither with a category), so they
  sit inside their GPU process and overlapping waits stack;
- a flow v2 from each scope's CPU slice to its GPU slice (``bind_id``, ``flow_out``/``flow_in``),
  which Perfetto binds to exactly those slices;
- a queue-depth counter per stream; instants for syncs, marks and anomalies; per-operation
  events (CUPTI) with the fields Holistic Trace Analysis reads.

``Encoder`` turns a trace into events chunk by chunk (a streaming session appends one chunk per
sync). Each batch of the plan is formatted a column at a time (``_text.Rows``): building text or
a dict per event costs far more than the numbers in it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from gputrace.exporters._text import Rows
from gputrace.exporters.plan import Chunk, Events, Planner, Waits
from gputrace.jsonsafe import dumps
from gputrace.model import Trace


def _j(value: Any) -> str:
    return dumps(value).decode()


class Encoder(Planner):
    """Events of one file as JSON text, appended chunk by chunk (see ``Planner``)."""

    def encode(self, trace: Trace) -> Iterator[Any]:
        """The events of ``trace`` (one chunk) as pieces of JSON text (bytes-like: bytes or uint8
        arrays, never joined into one more copy), each event followed by a comma; rows are
        numbered after the previous chunks'. The chunk is planned at once; its pieces are
        rendered as they are taken."""
        return render(self.chunk(trace))


def render(chunk: Chunk) -> Iterator[Any]:
    quoted: dict[int, list[str]] = {}  # a table's entries JSON-quoted, once per chunk

    def table(t: list[Any]) -> list[str]:
        got = quoted.get(id(t))
        if got is None:
            got = quoted[id(t)] = [_j(x) for x in t] or ['""']
        return got

    if chunk.meta:
        yield (",".join(map(_j, chunk.meta)) + ",").encode()
    for ev in chunk.events:
        yield from _events(ev, table)
    for w in chunk.waits:
        yield from _waits(w)
    for c in chunk.counters:
        r = Rows(len(c.ts)).lit('{"ph":"C","name":').pick([_j(x) for x in c.labels], c.label)
        r.lit(',"pid":').num(c.pid).lit(',"ts":').us(c.ts).lit(',"args":{' + _j(c.key) + ":").num(c.value)
        yield from r.lit("}}").blocks()


def _events(ev: Events, table: Any) -> Iterator[Any]:
    r = Rows(len(ev.ts))
    r.lit('{"ph":"X","cat":' if ev.dur is not None else '{"ph":"i","s":"t","cat":')
    r.pick([_j(c) for c in ev.cats], ev.cat).lit(',"name":').pick(table(ev.names), ev.name)
    r.lit(',"pid":').num(ev.pid).lit(',"tid":').num(ev.tid).lit(',"ts":').us(ev.ts)
    if ev.dur is not None:
        r.lit(',"dur":').us(ev.dur)
    if ev.flow is not None:
        way = ',"flow_out":true' if ev.flow_out else ',"flow_in":true'
        r.lit(',"bind_id":', ev.flow_has).num(ev.flow, ev.flow_has).lit(way, ev.flow_has)
    if ev.args:
        items = [
            (_j(a.key) + ":", a.kind, (table(a.value[0]), a.value[1]) if a.kind == "pick" else a.value, a.has)
            for a in ev.args
        ]
        r.members(',"args":{', items)
    if ev.objs is not None:
        objs, idx = ev.objs
        r.pick([""] + [',"args":' + _j(o) for o in objs[1:]], idx)
    return r.lit("}").blocks()


def _waits(w: Waits) -> Iterator[Any]:
    # Only the begin is named; neither end has a category. Perfetto's JSON importer keys an async
    # slice's track by (process, cookie), the cookie being the hash of `cat` and id2.local
    # (json_trace_tokenizer.cc, ParseTraceEventContents), so both ends must carry the same `cat`:
    # here none. The track takes its name from the first event of that cookie, the begin
    # (track_compressor.cc, InternLegacyAsyncTrack), and an end with no name and no category
    # closes the open slice on it (slice_tracker.cc, MatchingIncompleteSliceIndex). Readers pair
    # them by (pid, id). Each wait's begin and end come one after the other.
    n = len(w.id)
    heads = [f'{{"ph":"b","name":{_j(x)}' for x in w.labels] + ['{"ph":"e"']
    two = np.repeat(np.arange(n), 2)
    head = w.label[two].copy()
    head[1::2] = len(heads) - 1
    t = np.empty(2 * n, np.int64)
    t[0::2], t[1::2] = w.start, w.end
    r = Rows(2 * n).pick(heads, head).lit(',"id2":{"local":').num(w.id[two])
    return r.lit('},"pid":').num(w.pid[two]).lit(',"ts":').us(t).lit("}").blocks()
