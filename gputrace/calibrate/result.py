"""What a calibration produces: measurements (each a median with its spread, ``Stat``, never a
single number or a mean), a break-even table, and the headline numbers in ``summary`` that later
traces record in their header. A ``Calibration`` round-trips through JSON.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

FORMAT = "gputrace-calibration/1"
_NS_FIELDS = ("median", "p5", "p95", "min", "max")  # Stat's fields after n, saved as "<name>_ns"


@dataclass(frozen=True)
class Stat:
    """The distribution of repeated samples of one quantity, in nanoseconds."""

    n: int
    median: float
    p5: float
    p95: float
    min: float
    max: float

    @classmethod
    def of(cls, samples: Iterable[float]) -> Stat:
        arr = np.asarray(list(samples), dtype=np.float64)
        if arr.size == 0:
            raise ValueError("a statistic needs at least one sample")
        p5, med, p95 = np.percentile(arr, [5.0, 50.0, 95.0])
        # kept at the precision a saved calibration has (ps), so a calibration read back prints
        # the same digits as the one measured (40.34999… printed 40.3, its saved 40.35 then 40.4)
        return cls(int(arr.size), *(round(float(v), 3) for v in (med, p5, p95, arr.min(), arr.max())))

    def to_json(self) -> dict[str, Any]:
        return {"n": self.n, **{f"{k}_ns": round(getattr(self, k), 3) for k in _NS_FIELDS}}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Stat:
        return cls(int(d["n"]), *(float(d[f"{k}_ns"]) for k in _NS_FIELDS))


def _known(cls: type, d: dict[str, Any]) -> dict[str, Any]:
    """The items of ``d`` that are fields of ``cls`` (a later version's extra keys are ignored)."""
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in d.items() if k in names}


@dataclass(frozen=True)
class Measurement:
    """One quantity measured on the CPU wall clock, the device clock, or both; each sample is per
    operation (``per`` were timed together); ``bytes`` is set for copies (the table's bandwidth)."""

    key: str
    group: str
    what: str
    wall: Stat | None = None
    device: Stat | None = None
    per: int = 1
    bytes: int | None = None
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        for side in ("wall", "device"):
            out[side] = out[side].to_json() if out[side] else None
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Measurement:
        kw = _known(cls, d)
        for side in ("wall", "device"):
            kw[side] = Stat.from_json(d[side]) if d.get(side) else None
        return cls(**kw)


@dataclass(frozen=True)
class BreakEven:
    """For ``ops_per_element`` multiply-adds per element: the smallest element count at which the
    GPU finishes first, with data already on the GPU (``resident``) and with copies in and out;
    None if it never won on the grid, ``below_grid`` if it won already at the smallest size."""

    ops_per_element: int
    resident: int | None
    with_copies: int | None
    resident_below_grid: bool = False
    with_copies_below_grid: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "ops_per_element": self.ops_per_element,
            "resident_elements": self.resident,
            "resident_below_grid": self.resident_below_grid,
            "with_copies_elements": self.with_copies,
            "with_copies_below_grid": self.with_copies_below_grid,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> BreakEven:
        return cls(
            ops_per_element=int(d["ops_per_element"]),
            resident=d.get("resident_elements"),
            with_copies=d.get("with_copies_elements"),
            resident_below_grid=bool(d.get("resident_below_grid", False)),
            with_copies_below_grid=bool(d.get("with_copies_below_grid", False)),
        )


@dataclass
class Calibration:
    """Everything ``gputrace calibrate`` measured on one machine and backend."""

    backend: str
    device: str
    host: dict[str, Any]
    created: str
    quick: bool
    summary: dict[str, float] = field(default_factory=dict)
    measurements: list[Measurement] = field(default_factory=list)
    breakeven: list[BreakEven] = field(default_factory=list)
    curves: dict[str, Any] = field(default_factory=dict)  # the break-even raw curves
    skipped: dict[str, str] = field(default_factory=dict)  # what could not be measured, and why

    def get(self, key: str) -> Measurement | None:
        return next((m for m in self.measurements if m.key == key), None)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"format": FORMAT}
        out.update((f.name, getattr(self, f.name)) for f in fields(self))
        out["measurements"] = [m.to_json() for m in self.measurements]
        out["breakeven"] = [b.to_json() for b in self.breakeven]
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Calibration:
        if d.get("format") != FORMAT:
            raise ValueError(f"not a gputrace calibration (format {d.get('format')!r})")
        kw = _known(cls, d)
        kw["measurements"] = [Measurement.from_json(m) for m in d.get("measurements", [])]
        kw["breakeven"] = [BreakEven.from_json(b) for b in d.get("breakeven", [])]
        return cls(**{"device": "", "host": {}, "created": "", "quick": False, **kw})
