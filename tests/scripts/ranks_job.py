"""One rank of the multi-rank clock-offset test.

    mpiexec -n 4 python3 ranks_job.py OUT_DIR T0_NS STEPS mpi
    RANK=r WORLD_SIZE=4 MASTER_ADDR=127.0.0.1 MASTER_PORT=p python3 ranks_job.py OUT_DIR T0_NS STEPS gloo

Each rank's session clock is the machine's monotonic clock plus a known offset and drift
(``INJECTED``), relative to ``T0_NS``. With MPI the communicator is handed to the session; with
gloo the session finds the initialised ``torch.distributed`` itself. The ranks write
``OUT_DIR/run.rank<r>.trace.json``.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import gputrace

# rank -> (offset ns, drift): some drift by tens of ppm
INJECTED = {
    0: (-7_000_000, 10e-6),
    1: (3_000_000, 40e-6),
    2: (-12_345_678, -25e-6),
    3: (250_000_000_000, 0.0),
}


def main() -> None:
    out, t0, steps, engine = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    group: Any = None
    if engine == "mpi":
        from mpi4py import MPI

        group = MPI.COMM_WORLD
        rank = group.Get_rank()
        barrier = group.Barrier
    else:
        import torch.distributed as dist

        dist.init_process_group("gloo")
        rank = dist.get_rank()
        barrier = dist.barrier
    offset, drift = INJECTED[rank % len(INJECTED)]

    def clock() -> int:
        t = time.perf_counter_ns()
        return t + offset + round(drift * (t - t0))

    with gputrace.session(f"{out}/run.trace.json", backend="cpu", clock=clock, group=group,
                          group_options={"refresh_s": 0.2}, quiet=True):  # fmt: skip
        for step in range(steps):
            with gputrace.trace("step", rank=rank, step=step):
                time.sleep(0.02 * (1 + rank % 2))
            barrier()
            gputrace.sync()
    if engine != "mpi":
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
