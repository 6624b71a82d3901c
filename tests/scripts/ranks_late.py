"""One rank of the late-rank test (gloo, 3 ranks): rank 1 starts its session after rank 0 gave up
waiting for it, rank 2 does not trace at all. The program must go on through its own barriers.

    RANK=r WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=p python3 ranks_late.py
"""

from __future__ import annotations

import json
import time

import torch.distributed as dist

import gputrace


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if rank == 1:
        time.sleep(2.5)
    t = time.monotonic()
    group = None if rank < 2 else False
    with gputrace.session(backend="cpu", quiet=True, group=group, group_options={"timeout_s": 1.0}) as s:
        for _ in range(3):
            dist.barrier()
            gputrace.sync()
    dist.barrier()  # the program's own collectives still work
    dist.destroy_process_group()
    assert s.trace is not None
    ranks = s.trace.header.get("ranks") or {}
    print(json.dumps({"rank": rank, "s": time.monotonic() - t, "status": ranks.get("status")}))


if __name__ == "__main__":
    main()
