"""Two ranks with NCCL on one host: measured clock offsets and the per-rank view, checked in one run.

    source .device/setup.sh && torchrun --standalone --nproc-per-node 2 benchmarks/ranks_h200.py [OUT_DIR]

(``--cpu`` runs the same program with gloo and the cpu backend, to check the script without a GPU.)

Each rank runs a session with the CUDA backend and ``steps`` training-like steps: a top-level
``train_step`` scope holding a ``compute`` scope (matmuls; rank 1 does twice as many, so it is the
slower rank) and an ``allreduce`` scope (``torch.distributed.all_reduce`` through NCCL). Rank 1's
session clock is the machine's monotonic clock plus a known offset and a drift of ``DRIFT_PPM``
(``clock=``); rank 0's is the machine's clock itself. Both ranks share one host, so the true offset
between them is exactly what was injected. The session finds the initialised process group and
measures the offset by ping-pong through NCCL (CUDA tensors on the rank's device).

After both ranks wrote ``run.rank<r>.trace.json``, rank 0 merges them and prints:

1. per rank: how merge placed it, the recovered offset, the injected truth, the stated
   uncertainty, whether the truth lies within it, and the GPU slices (kernels) on the merged time line;
2. all-reduce alignment: in how many steps the two ranks' all-reduce GPU spans overlap on the merged
   time line (an all-reduce finishes on both ranks together, so on a right time line they overlap;
   the injected offset alone would move them apart);
3. the slower rank per step, as ``gputrace summarize`` names it.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

INJECTED_NS = 1_234_567  # rank 1's clock runs this far ahead of rank 0's at T0 ...
DRIFT_PPM = 20.0  # ... and gains this many ns per ms
STEPS = 40
SIZE = 4096


def main() -> None:
    import torch
    import torch.distributed as dist

    import gputrace

    args = [a for a in sys.argv[1:] if a != "--cpu"]
    cpu = "--cpu" in sys.argv[1:]
    out = args[0] if args else os.path.join(tempfile.gettempdir(), "gputrace_ranks")
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if cpu:
        dev, backend = "cpu", "cpu"
        dist.init_process_group("gloo")
    else:
        import cupy

        torch.cuda.set_device(local)
        cupy.cuda.Device(local).use()
        dev, backend = "cuda", "cuda"
        dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    rank = dist.get_rank()
    os.makedirs(out, exist_ok=True)
    # a common T0 for the injected drift: rank 0's clock, sent to every rank
    t0 = torch.tensor([time.perf_counter_ns()], dtype=torch.int64, device=dev)
    dist.broadcast(t0, 0)
    t0_ns = int(t0.item())
    offset, drift = (INJECTED_NS, DRIFT_PPM * 1e-6) if rank == 1 else (0, 0.0)

    def clock() -> int:
        t = time.perf_counter_ns()
        return t + offset + round(drift * (t - t0_ns))

    size = SIZE // 8 if cpu else SIZE
    a = torch.randn(size, size, device=dev)
    grad = torch.randn(size * 256, device=dev)
    reps = 4 * (2 if rank == 1 else 1)
    if not cpu:
        torch.cuda.synchronize()
    with gputrace.session(os.path.join(out, "run.trace.json"), backend=backend, clock=clock,
                          group_options={"refresh_s": 0.5}, quiet=True) as s:  # fmt: skip
        for step in range(STEPS):
            with gputrace.trace("train_step", step=step):
                with gputrace.trace("compute"):
                    for _ in range(reps):
                        a = torch.tanh(a @ a * (1.0 / size))
                with gputrace.trace("allreduce"):
                    dist.all_reduce(grad)
            if step % 5 == 4:
                gputrace.sync()
    written = str(s.written)
    dist.barrier()
    if rank == 0:
        report(out, t0_ns)
    else:
        print(f"rank {rank} wrote {written}", flush=True)
    dist.destroy_process_group()


def _truth(rank: int, local_ns: int, t0_ns: int) -> float:
    """Rank 0's clock minus rank ``rank``'s at rank ``rank``'s local time ``local_ns``."""
    if rank == 0:
        return 0.0
    t = t0_ns + (local_ns - t0_ns - INJECTED_NS) / (1 + DRIFT_PPM * 1e-6)
    return t - local_ns


def report(out: str, t0_ns: int) -> None:
    import numpy as np

    from gputrace.exporters import load
    from gputrace.merge import merge_files
    from gputrace.model import NO_TIME
    from gputrace.summary import summarize

    files = [os.path.join(out, f"run.rank{r}.trace.json") for r in (0, 1)]
    merged = merge_files(os.path.join(out, "merged.trace.json"), files)
    summary = summarize(merged)
    view = summary["ranks"]
    print(f"\nmerged {len(files)} ranks into {out}/merged.trace.json ({len(merged)} scopes)")
    print(f"{'rank':>4}  {'placed by':<10} {'recovered µs':>14} {'truth µs':>14} {'± stated µs':>12} "
          f"{'in bound':>8} {'GPU slices':>10} {'engine'}")  # fmt: skip
    s = merged.scopes
    tid_rank = {t: p["rank"] for p in merged.header["processes"] for t in p["tids"]}
    scope_rank = np.array([tid_rank.get(merged.threads[int(i)].tid, -1) for i in s.thread])
    span_rank = scope_rank[merged.spans.scope] if len(merged.spans) else np.zeros(0, int)
    for info, f in zip(merged.header["merged"], files, strict=True):
        r, how = info["rank"], info["offset"]
        own = load(f)
        truth = _truth(r, int(own.header["start_ns"]), t0_ns)
        rec = how.get("offset_ns", 0)
        unc = how.get("uncertainty_ns")
        ok = "—" if unc is None else ("yes" if abs(rec - truth) <= unc + 1 else "NO")
        slices = int(np.count_nonzero((scope_rank == r) & (s.gpu_start_ns != NO_TIME)))
        slices += int(np.count_nonzero(span_rank == r))
        stated = "—" if unc is None else f"{unc / 1e3:.3f}"
        print(f"{r:>4}  {how['method']:<10} {rec / 1e3:>14.3f} {truth / 1e3:>14.3f} "
              f"{stated:>12} {ok:>8} {slices:>10} {how.get('engine', '')}")  # fmt: skip
    # all-reduce spans of the two ranks overlap on a right time line
    ar = [
        sorted((sc.gpu_start_ns, sc.gpu_end_ns) for sc in merged.find("allreduce")
               if sc.gpu_start_ns is not None and tid_rank.get(sc.thread.tid) == r)
        for r in (0, 1)
    ]  # fmt: skip
    pairs = list(zip(*ar, strict=False))
    overlap = sum(1 for (a0, a1), (b0, b1) in pairs if a0 < b1 and b0 < a1)
    shifted = sum(1 for (a0, a1), (b0, b1) in pairs if a0 < b1 - INJECTED_NS and b0 - INJECTED_NS < a1)
    print(
        f"\nall-reduce GPU spans overlapping across ranks: {overlap} of {len(pairs)} steps "
        f"(with rank 1 left {INJECTED_NS / 1e3:.0f} µs off: {shifted} of {len(pairs)})"
    )
    if view is None or view.get("steps") is None:
        print("summarize found no per-rank steps")
        return
    st = view["steps"]
    print(
        f"\nslower rank per step ({st['name']}, {st['count']} steps): "
        + ", ".join(f"rank {k} in {v}" for k, v in st["slowest_counts"].items())
    )
    print(
        f"{'step':>4} {'slower':>6} {'lead µs':>9}  "
        + "  ".join(f"r{x['rank']} work/coll µs" for x in st["rows"][0]["ranks"])
    )
    for row in st["rows"][:10]:
        cells = "  ".join(
            f"{x['work_ns'] / 1e3:>8.0f}/{x['collective_ns'] / 1e3:<6.0f}" for x in row["ranks"]
        )
        print(f"{row['step']:>4} {row['slowest_rank']:>6} {row['lead_ns'] / 1e3:>9.1f}  {cells}")
    for r in view["ranks"]:
        share = r["gpu_busy_share"] or 0.0
        print(
            f"{r['label']}: GPU busy {r['gpu_busy_ns'] / 1e6:.1f} ms ({share:.0%}), "
            f"in collectives {r['collective_ns'] / 1e6:.1f} ms"
        )


if __name__ == "__main__":
    main()
