"""Where ``gputrace calibrate`` saves calibrations, and the part of one that later sessions on the
same machine and backend record (``header_calibration``), so ``summarize`` can judge scopes
against this machine's own launch cost; a missing, unreadable or foreign file records nothing.

>>> import os
>>> str(default_path("cuda", host="node1", env={"XDG_CACHE_HOME": "/c"}))
'/c/gputrace/calibration-node1-cuda.json'
>>> str(default_path("cuda", env={"GPUTRACE_CALIBRATION": "/tmp/mine.json"}))
'/tmp/mine.json'
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gputrace.host import host_name
from gputrace.outpath import check_output

ENV_VAR = "GPUTRACE_CALIBRATION"
# The summary keys a trace header carries (when the calibration measured them).
HEADER_KEYS = (
    "launch_cpu_ns",
    "launch_gpu_ns",
    "launch_sync_ns",
    "graph_launch_ns",
    "h2d_1k_ns",
    "d2h_1k_ns",
    "scope_cost_ns",
    "timer_resolution_ns",
)


def default_path(backend: str, *, host: str | None = None, env: Mapping[str, str] | None = None) -> Path:
    """The file a calibration of ``backend`` on this machine is saved to and read from."""
    env = os.environ if env is None else env
    explicit = env.get(ENV_VAR)
    if explicit:
        return Path(explicit).expanduser()
    cache = env.get("XDG_CACHE_HOME") or str(Path("~/.cache").expanduser())
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", host or host_name()) or "host"
    return Path(cache) / "gputrace" / f"calibration-{name}-{backend}.json"


def save(doc: Mapping[str, Any], path: Path) -> None:
    """Write a calibration document atomically; a path that is not a regular file is refused."""
    check_output(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(doc, indent=1, allow_nan=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def header_calibration(backend: str) -> dict[str, Any] | None:
    """The calibration block for a trace header: one of this backend with both launch costs, else
    None; never raises."""
    try:
        src = default_path(backend)
        if not src.is_file():
            return None
        doc = json.loads(src.read_text(encoding="utf-8"))
        if not isinstance(doc, dict) or doc.get("backend") != backend:
            return None
        summary: dict[str, Any] = doc.get("summary") or {}
        out: dict[str, Any] = {"backend": backend}
        # numbers only (a bool is an int to isinstance)
        out.update((k, float(summary[k])) for k in HEADER_KEYS if type(summary.get(k)) in (int, float))
        if "launch_cpu_ns" not in out or "launch_gpu_ns" not in out:
            return None
        out["device"] = str(doc.get("device", ""))
        out["created"] = str(doc.get("created", ""))
        out["source"] = str(src)
        return out
    except Exception:
        return None
