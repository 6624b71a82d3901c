"""A torch.distributed (gloo) program with no session of its own, for ``gputrace run`` on each rank:
the session attaches to the group at the first ``sync()`` after ``init_process_group``."""

from __future__ import annotations

import time

import torch.distributed as dist

import gputrace

dist.init_process_group("gloo")
for _ in range(5):
    with gputrace.trace("train_step"):
        time.sleep(0.01 * (1 + dist.get_rank()))
        dist.barrier()
    gputrace.sync()
dist.destroy_process_group()
