"""The structs the JSON reader's fast path decodes trace events into (msgspec), imported on the
first read only: a session that writes JSON never loads msgspec.

An event decodes by its ``ph`` into a struct of the fields the reader looks at; every other
phase of the Chrome trace format is read past and kept as an empty struct. A field absent from
the file is ``UNSET`` (raw args: an empty ``Raw``). Each struct also reads like the dict it
stands for (``get``, ``[]``, ``in``) where the reader treats it as one.
"""

from __future__ import annotations

from typing import Any, Union

import msgspec
import orjson

UNSET: Any = msgspec.UNSET
RAW_NONE = msgspec.Raw()
# The numbers the reader gathers straight into arrays are typed: a value of another type (a
# float where an integer belongs, a bool, a string, null) fails the decoding, and the plain
# path reads the file and names the value.
Int = int | msgspec.UnsetType
Float = float | msgspec.UnsetType


class Obj(msgspec.Struct, gc=False):
    """Reads like the dict it stands for where the reader treats it as one: a field not in
    the file is UNSET (raw args: an empty Raw), and reads as absent."""

    def get(self, key: str, default: Any = None) -> Any:
        v = field(self, key)
        return default if v is UNSET else v

    def __getitem__(self, key: str) -> Any:
        v = field(self, key)
        if v is UNSET:
            raise KeyError(key)
        return v

    def __contains__(self, key: str) -> bool:
        return field(self, key) is not UNSET


class Event(Obj, tag_field="ph"):
    """A trace event, by its ``ph``, with the fields the reader looks at."""


class GpuArgs(Obj):
    """A GPU slice's args: what the reader takes from them."""

    scope: Any = UNSET
    gpu_us: Any = UNSET
    submit_ts: Any = UNSET
    uncertainty_us: Any = UNSET
    flags: Any = UNSET
    pass_: Any = msgspec.field(default=UNSET, name="pass")  # a scope's one pass, folded in


class OpArgs(Obj):
    """An operation's args: what the reader takes from them."""

    op: Int = UNSET
    scope: Int = UNSET
    queue: Int = UNSET
    tid: Any = UNSET
    correlation: Int = UNSET
    call_ts: Float = UNSET
    call_dur_us: Float = UNSET
    # absent: the value the reader takes for an absent key
    call: Any = ""
    bytes: int = 0
    grid: tuple[int, int, int] = (0, 0, 0)  # otherwise: the plain path
    block: tuple[int, int, int] = (0, 0, 0)
    graph_id: int = msgspec.field(default=0, name="graph id")
    graph_node_id: int = msgspec.field(default=0, name="graph node id")


NO_GPU_ARGS = GpuArgs()
ARGS_DECODERS: dict[str, Any] = {
    "gpu": msgspec.json.Decoder(GpuArgs),
    "op": msgspec.json.Decoder(OpArgs),
}


class Complete(Event, tag="X"):
    cat: Any = UNSET
    name: Any = UNSET
    pid: Int = UNSET
    tid: Int = UNSET
    ts: Float = UNSET
    dur: Float = UNSET
    bind_id: Int = UNSET
    args: msgspec.Raw = RAW_NONE  # decoded for the events whose args are read


class Id2(Obj):
    local: Int = UNSET


class AsyncBegin(Event, tag="b"):
    cat: Any = UNSET
    name: msgspec.Raw = RAW_NONE  # looked at once per distinct name
    ts: Float = UNSET
    id2: Id2 | None = None  # an id2 that is not an object: the plain path


class Instant(Event, tag="i"):
    cat: Any = UNSET
    name: Any = UNSET
    pid: Any = UNSET
    tid: Any = UNSET
    ts: Any = UNSET
    args: msgspec.Raw = RAW_NONE


class Metadata(Event, tag="M"):
    name: Any = UNSET
    pid: Any = UNSET
    tid: Any = UNSET
    args: msgspec.Raw = RAW_NONE


class AsyncEnd(Event, tag="e"):
    """A wait's end (and any async end): read past, nothing kept."""


# every other phase of the Chrome trace format: read past, nothing kept (a phase not listed
# here, or an event without one, sends the file to the plain path)
PASSED = tuple(
    msgspec.defstruct(f"Passed{i}", [], bases=(Event,), tag=ph)
    for i, ph in enumerate("BEInsftPNODRCSTpFcvV()")
)
ANY_EVENT: Any = Union.__getitem__((Complete, AsyncBegin, AsyncEnd, Instant, Metadata, *PASSED))  # type: ignore[attr-defined]
Doc = msgspec.defstruct(
    "Doc",
    [
        ("traceEvents", list[ANY_EVENT]),
        ("gputrace", Any, UNSET),
        ("metadata", Any, UNSET),
    ],
    gc=False,
)
DOC_DECODER = msgspec.json.Decoder(Doc)
RAW_FIELDS = ("args",)  # absent: the empty Raw; any other field absent: UNSET


ATTR = {"pass": "pass_"}  # keys that are Python keywords


def field(e: Any, key: str) -> Any:
    """An event's field as its dict would hold it: raw args decoded; UNSET where absent."""
    if key == "ph":
        return e.__struct_config__.tag
    v = getattr(e, ATTR.get(key) or key.replace(" ", "_"), UNSET)
    if type(v) is msgspec.Raw:
        return orjson.loads(memoryview(v)) if len(v) else UNSET
    return v
