"""The machine and the job a session runs in: host facts for the trace header, the rank and world
size a launcher (torchrun, mpirun, srun) gave this process, and the file each rank writes.

>>> rank_path("out/run.trace.json", 3)
'out/run.rank3.trace.json'
>>> str(rank_file(Path("run.json"), 2))
'run.rank2.json'
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

RANK_VARS = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", "LOCAL_RANK")
SIZE_VARS = ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS")


def loadavg() -> list[float] | None:
    """The 1, 5 and 15 minute load averages (the header records them at start and end)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def host_name() -> str:
    """This machine's name, read without importing ``socket`` (5 ms)."""
    if hasattr(os, "uname"):
        return os.uname().nodename
    import platform  # Windows

    return platform.node()


def host_facts() -> dict[str, Any]:
    """The header's ``host`` at start."""
    return {"name": host_name(), "cpu_count": os.cpu_count(), "loadavg_start": loadavg()}


def _first_number(names: tuple[str, ...]) -> int | None:
    for var in names:
        v = os.environ.get(var)
        if v is not None and v.strip().isdigit():
            return int(v)
    return None


def launcher_rank() -> int | None:
    """This process's rank as its launcher set it in the environment, or None."""
    return _first_number(RANK_VARS)


def rank_path(path: str | os.PathLike[str], rank: int) -> str:
    """``run.trace.json`` → ``run.rank3.trace.json`` (unchanged when the name already says it)."""
    head, name = os.path.split(os.fspath(path))
    if f"rank{rank}" in name.split("."):
        return os.fspath(path)
    stem, dot, rest = name.partition(".")
    if not stem:  # a name starting with a dot
        return os.path.join(head, f"{name}.rank{rank}")
    return os.path.join(head, f"{stem}.rank{rank}{dot}{rest}")


def rank_file(path: Path, measured_rank: int | None, launched: bool = False) -> Path:
    """The file this process writes: named for its rank when a process group measured it or (with
    ``launched``) a launcher started several ranks, so ranks never stream into one file."""
    if measured_rank is not None:
        return Path(rank_path(path, measured_rank))
    rank = launcher_rank() if launched else None
    if rank is not None and (_first_number(SIZE_VARS) or 0) > 1:  # one of several ranks
        return Path(rank_path(path, rank))
    return path
