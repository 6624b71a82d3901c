"""Measured clock offsets between the ranks of a job, through the job's own process group.

Every rank measures its session clock against rank 0's by ping-pong (Cristian's bound) at session
start, at ``gputrace.sync()`` and at stop, and fits offset and drift with the resolver's clock fit;
``gputrace merge`` places each rank by it. docs/ranks.md describes the exchange, the header and the
failure cases. Nothing here opens a socket or imports torch or mpi4py (a group is used only when
the program imported its engine). An exchange that fails is given up with one notice.

>>> class Alone:                      # a one-rank "group": nothing to exchange
...     engine, rank, size = "test", 0, 1
>>> rc = RankClock(Alone(), clock=lambda: 5)
>>> rc.exchange("start"); rc.header()["status"]
'reference'
"""

from __future__ import annotations

import contextlib
import itertools
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

from gputrace.backends.base import CalibrationSample
from gputrace.errors import GputraceError, report_internal
from gputrace.npstats import quantile

TAG = 0x6774  # message tag for MPI and torch.distributed point-to-point messages
ROUNDS = 32  # ping-pongs per peer and exchange
KEEP = 8  # lowest-round-trip samples kept per exchange (all of them bound the offset; these suffice)
REFRESH_S = 5.0  # sync() exchanges at most this often (rank 0 schedules them)
TIMEOUT_S = 5.0  # an exchange waits at most this long for the other side (plus PEER_BUDGET_S per peer)
PEER_BUDGET_S = 0.25
NCCL_PEER_BUDGET_S = 1.0  # NCCL sets up a communicator for each new pair on the first message
AGREED_TIMEOUT_S = 60.0  # messages of an exchange both sides agreed to (torch.distributed)


class Pending(Protocol):
    """One posted send or receive of four int64 values."""

    def test(self) -> bool: ...
    def values(self) -> tuple[int, int, int, int]: ...
    def cancel(self) -> None: ...


class Transport(Protocol):
    """Point-to-point messages of four int64 values inside one process group."""

    engine: str
    rank: int
    size: int

    def isend(self, dst: int, values: tuple[int, int, int, int]) -> Pending: ...
    def irecv(self, src: int) -> Pending: ...


_SESSIONS = itertools.count()


class _Timeout(Exception): ...


class _Mismatch(Exception): ...


class _MpiPending:
    def __init__(self, req: Any, buf: Any) -> None:
        self.req, self.buf = req, buf  # buf: a numpy array, or a torch tensor (_TorchPending)

    def test(self) -> bool:
        return bool(self.req.Test())

    def values(self) -> tuple[int, int, int, int]:
        a, b, c, d = (int(x) for x in self.buf.tolist())
        return a, b, c, d

    def cancel(self) -> None:
        with contextlib.suppress(Exception):  # best effort: the request may have completed meanwhile
            self.req.Cancel()
            self.req.Free()


class MpiTransport:
    """An mpi4py communicator (``mpi4py.MPI.Comm``)."""

    engine = "mpi"

    def __init__(self, comm: Any) -> None:
        self.comm, self.rank, self.size = comm, int(comm.Get_rank()), int(comm.Get_size())

    def isend(self, dst: int, values: tuple[int, int, int, int]) -> Pending:
        buf = np.array(values, np.int64)
        return _MpiPending(self.comm.Isend(buf, dest=dst, tag=TAG), buf)

    def irecv(self, src: int) -> Pending:
        buf = np.zeros(4, np.int64)
        return _MpiPending(self.comm.Irecv(buf, source=src, tag=TAG), buf)


class _TorchPending(_MpiPending):
    """A torch.distributed message whose completion is polled (NCCL's ``is_completed``)."""

    done = False

    def test(self) -> bool:
        if not self.done:
            self.done = bool(self.req.is_completed())
        return self.done

    def cancel(self) -> None:
        with contextlib.suppress(Exception):  # not every backend can abort one operation
            self.req.abort()


class _BlockingTorchPending(_TorchPending):
    """gloo's send/recv report completion only through ``wait``: wait with a timeout there."""

    def wait(self, seconds: float) -> bool:
        if self.done:
            return True
        from datetime import timedelta

        try:
            self.req.wait(timedelta(seconds=max(seconds, 0.001)))
        except Exception:  # gloo raises when the timeout passes
            return False
        self.done = True
        return True


class TorchTransport:
    """A ``torch.distributed`` process group (``None``: the default group). NCCL messages live on
    the current CUDA device; gloo (and other CPU backends) use CPU tensors."""

    def __init__(self, group: Any = None) -> None:
        torch = sys.modules["torch"]
        dist = sys.modules["torch.distributed"]
        self.torch, self.dist, self.group = torch, dist, group
        self.rank, self.size = int(dist.get_rank(group)), int(dist.get_world_size(group))
        backend = str(dist.get_backend(group))
        self.engine = f"torch.distributed ({backend})"
        self.nccl = "nccl" in backend.lower()
        self.device = torch.device("cuda", torch.cuda.current_device()) if self.nccl else torch.device("cpu")
        # NCCL's is_completed() polls the GPU; gloo's send/recv complete only through wait()
        self.pending = _TorchPending if self.nccl else _BlockingTorchPending
        # A gloo wait that times out closes the connection, and an NCCL message nobody receives
        # stalls the communicator: both would break the program's own next collective. So the two
        # sides first agree through the group's key-value store (non-blocking reads) that both are
        # there; only then is a message posted, and it will be answered.
        try:
            self.store = dist.distributed_c10d._get_default_store()
        except Exception:
            self.store = None
        self.prefix = f"gputrace/ranks/g{self._peer(0)}"

    def alive(self) -> bool:
        """False once the program destroyed its process group (before the session stopped)."""
        try:
            return bool(self.dist.is_initialized())
        except Exception:
            return False

    def finish(self, rank: int, e: int) -> None:
        """After a successful exchange: drop its keys, so a long run does not fill the store."""
        if self.store is None:
            return
        key = f"{self.prefix}/{e}/{rank}"
        with contextlib.suppress(Exception):  # not every store can delete
            self.store.delete_key(key + "/go")
            self.store.delete_key(key)

    def meet(self, rank: int, e: int, peer: int, deadline: float) -> bool:
        """Both sides of one exchange agree to go (True), or the non-0 side is marked gone."""
        store = self.store
        if store is None:
            return True
        key = f"{self.prefix}/{e}/{peer if rank == 0 else rank}"
        go = key + "/go"

        def cas(old: str, new: str) -> str:
            v = store.compare_set(key, old, new)
            return v.decode() if isinstance(v, bytes) else str(v)

        if rank != 0:
            if cas("", "here") == "gone":
                return False  # rank 0 gave up on this rank for this exchange already
            pause = 0.0005
            while time.monotonic() < deadline:
                if store.check([go]):
                    return True
                time.sleep(pause)
                pause = min(pause * 1.5, 0.02)  # ranks wait their turn one by one: spare the store
            if cas("here", "gone") == "gone":
                return False  # withdrawn: rank 0 will skip this rank
            # rank 0 committed just now: its go follows at once
            while not store.check([go]):
                time.sleep(0.0005)
            return True
        while time.monotonic() < deadline and not store.check([key]):
            time.sleep(0.0005)
        if cas("here", "served") != "served" and (
            cas("", "gone") != "here" or cas("here", "served") != "served"
        ):
            return False  # never came: marked gone, so it will not post a message later
        store.set(go, "1")
        return True

    def _peer(self, r: int) -> int:
        return r if self.group is None else int(self.dist.get_global_rank(self.group, r))

    def isend(self, dst: int, values: tuple[int, int, int, int]) -> Pending:
        t = self.torch.tensor(values, dtype=self.torch.int64, device=self.device)
        work = self.dist.isend(t, self._peer(dst), group=self.group, tag=TAG)
        return self.pending(work, t)

    def irecv(self, src: int) -> Pending:
        t = self.torch.zeros(4, dtype=self.torch.int64, device=self.device)
        work = self.dist.irecv(t, self._peer(src), group=self.group, tag=TAG)
        return self.pending(work, t)


def transport_for(group: Any) -> Transport | None:
    """The transport for ``group``: an mpi4py communicator, a torch ProcessGroup, a ``Transport``;
    ``None`` (the default) finds an initialised ``torch.distributed``; ``False`` turns it off."""
    if group is False:
        return None
    if group is None:
        dist = sys.modules.get("torch.distributed")
        try:
            if dist is None or not dist.is_available() or not dist.is_initialized():
                return None
        except Exception:
            return None
        return TorchTransport(None)
    if all(hasattr(group, a) for a in ("isend", "irecv", "rank", "size", "engine")):
        return group  # type: ignore[no-any-return]
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and isinstance(group, mpi.Comm):
        return MpiTransport(group)
    dist = sys.modules.get("torch.distributed")
    if dist is not None and isinstance(group, dist.ProcessGroup):
        return TorchTransport(group)
    raise GputraceError(
        "group must be an mpi4py communicator or a torch.distributed process group, "
        f"not {type(group).__name__}."
    )


class RankClock:
    """Measures this rank's session clock against rank 0's through ``transport``."""

    def __init__(
        self,
        transport: Transport,
        clock: Callable[[], int],
        *,
        rounds: int = ROUNDS,
        keep: int = KEEP,
        refresh_s: float = REFRESH_S,
        timeout_s: float = TIMEOUT_S,
    ) -> None:
        self.t = transport
        self.clock = clock
        self.rank, self.size = int(transport.rank), int(transport.size)
        self.rounds, self.keep = max(1, int(rounds)), max(1, int(keep))
        self.refresh_s, self.timeout_s = float(refresh_s), float(timeout_s)
        self.peer_budget_s = NCCL_PEER_BUDGET_S if getattr(transport, "nccl", False) else PEER_BUDGET_S
        self.samples: list[CalibrationSample] = []
        self.exchanges: list[dict[str, Any]] = []  # as the header holds them (``_note``)
        self.failed: str | None = None
        self.skipped: list[str] = []  # exchanges not tried, and why (not failures)
        self.dead: set[int] = set()  # peers rank 0 gave up on
        self.reference_id = 0  # rank 0's id for this job (its clock at its first exchange)
        self.n_exchanges = 0
        self.n_syncs = 0
        self.next_sync = 1  # the sync() call that exchanges next; rank 0 decides and tells the others
        self.started_wall = time.monotonic()
        # sessions of one process are numbered, so that the store keys of a later session never
        # meet an earlier one's (every rank starts the same sessions in the same order)
        self.serial = next(_SESSIONS)

    # scheduling ----------------------------------------------------------------------------------
    def on_sync(self) -> None:
        """Count a ``sync()``; exchange when rank 0 scheduled this one."""
        self.n_syncs += 1
        if self.n_syncs == self.next_sync:
            self.exchange("sync")

    def _schedule(self) -> int:
        """Rank 0: the sync() call to exchange at next, about ``refresh_s`` from now at the rate
        sync() has been called so far."""
        elapsed = time.monotonic() - self.started_wall
        if self.n_syncs == 0 or elapsed <= 0:
            return self.n_syncs + 1
        return self.n_syncs + max(1, round(self.refresh_s * self.n_syncs / elapsed))

    # the exchange ---------------------------------------------------------------------------------
    def exchange(self, reason: str) -> None:
        """One exchange with every peer (rank 0) or with rank 0 (other ranks). Never raises."""
        if self.size < 2 or self.failed is not None:
            return
        alive = getattr(self.t, "alive", None)
        if alive is not None and not alive():
            self.skipped.append(f"{reason}: the process group was already destroyed")
            return
        e = self.n_exchanges
        self.n_exchanges += 1
        waited = self.timeout_s + (self.size - 1) * self.peer_budget_s
        deadline = time.monotonic() + waited
        try:
            if self.rank == 0:
                self._serve(e, reason, deadline)
            else:
                self._ping(e, reason, deadline)
        except _Timeout:
            self._fail(f"the {reason} exchange got no answer within {waited:.1f} s")
        except _Mismatch as exc:
            self._fail(f"the {reason} exchange went out of step ({exc})")
        except Exception as exc:
            self._fail(f"the {reason} exchange failed ({type(exc).__name__}: {exc})")

    def _fail(self, why: str) -> None:
        self.failed = why
        report_internal(
            "ranks",
            f"measuring rank {self.rank}'s clock offset through {self.t.engine}: {why}; "
            "no further exchanges from this rank (merge falls back to the clock pair where none succeeded).",
        )

    def _wait(self, p: Pending, deadline: float) -> None:
        wait = getattr(p, "wait", None)
        if wait is not None:  # an engine that can only block, with a timeout
            if not wait(deadline - time.monotonic()):
                p.cancel()
                raise _Timeout()
            return
        spins = 0
        while not p.test():
            spins += 1
            if spins > 200:  # let the peer run on a busy machine
                os.sched_yield()
                if time.monotonic() > deadline:
                    p.cancel()
                    raise _Timeout()

    def _serve(self, e: int, reason: str, deadline: float) -> None:
        if self.reference_id == 0:
            self.reference_id = int(self.clock()) or 1
        nxt = self.next_sync = self._schedule()
        start = time.monotonic()
        try:
            for peer in [p for p in range(1, self.size) if p not in self.dead]:
                try:
                    until = self._meet(e, peer, deadline)
                    sends: list[Pending] = []
                    for k in range(self.rounds):
                        r = self.t.irecv(peer)
                        self._wait(r, until)
                        pe, pk, _, _ = r.values()
                        if (pe, pk) != (e, k):
                            raise _Mismatch(f"rank {peer} sent round {pe}/{pk}, expected {e}/{k}")
                        sends.append(self.t.isend(peer, (e, int(self.clock()), nxt, self.reference_id)))
                    for snd in sends:
                        self._wait(snd, until)
                except (_Timeout, _Mismatch) as exc:
                    self.dead.add(peer)
                    report_internal(
                        f"ranks:{peer}",
                        f"rank {peer} did not answer the clock exchange through {self.t.engine} "
                        f"({'timeout' if isinstance(exc, _Timeout) else exc}); "
                        "its offset is not measured from here on (when only some ranks trace, "
                        "pass group=False to gputrace.session).",
                    )
        finally:
            self._note(reason, int(self.clock()), 0, 0, start)

    def _meet(self, e: int, peer: int, deadline: float) -> float:
        """Where the engine needs it, agree with ``peer`` that both take part in exchange ``e``
        before any message is posted; returns the messages' deadline (longer once agreed: a
        timed-out wait could then only do harm)."""
        meet = getattr(self.t, "meet", None)
        if meet is None:
            return deadline
        if not meet(self.rank, self.serial * 10_000_000 + e, peer, deadline):
            raise _Timeout()
        return max(deadline, time.monotonic() + AGREED_TIMEOUT_S)

    def _ping(self, e: int, reason: str, deadline: float) -> None:
        got: list[tuple[int, CalibrationSample]] = []
        start = time.monotonic()
        nxt = self.next_sync
        deadline = self._meet(e, 0, deadline)
        for k in range(self.rounds):
            r = self.t.irecv(0)
            before = int(self.clock())
            s = self.t.isend(0, (e, k, 0, 0))
            self._wait(r, deadline)
            after = int(self.clock())
            re, ref_ns, nxt, ref_id = r.values()
            if re != e:
                raise _Mismatch(f"rank 0 answered exchange {re}, expected {e}")
            self._wait(s, deadline)
            got.append((after - before, CalibrationSample(before, ref_ns, after, 0)))
            self.reference_id = ref_id
        finish = getattr(self.t, "finish", None)
        if finish is not None:
            finish(self.rank, self.serial * 10_000_000 + e)
        got.sort(key=lambda x: x[0])
        kept = [smp for _, smp in got[: self.keep]]
        self.samples.extend(kept)
        self.next_sync = nxt
        self._note(reason, kept[0].cpu_before_ns, len(kept), got[0][0], start)

    def _note(self, reason: str, at_ns: int, kept: int, min_rtt_ns: int, start: float) -> None:
        """One exchange as this rank saw it: why, when, how many rounds, the best round trip."""
        wall_ns = int((time.monotonic() - start) * 1e9)
        self.exchanges.append({"reason": reason, "at_ns": at_ns, "rounds": self.rounds, "kept": kept,
                               "min_rtt_ns": min_rtt_ns, "wall_ns": wall_ns})  # fmt: skip

    # the result -------------------------------------------------------------------------------------
    def header(self) -> dict[str, Any]:
        """The ``ranks`` object of this rank's trace header."""
        out: dict[str, Any] = {
            "engine": self.t.engine,
            "rank": self.rank,
            "size": self.size,
            "reference_rank": 0,
            "reference_id": self.reference_id,
            "rounds": self.rounds,
            "exchanges": [dict(x) for x in self.exchanges],
            "samples": [[s.cpu_before_ns, s.gpu_ns, s.cpu_after_ns] for s in self.samples],
        }
        if self.rank == 0:
            out["status"] = "reference"
        elif self.samples:
            out["status"] = "measured" if self.failed is None else "partly measured"
            out["fit"] = fit_offsets(self.samples)
        else:
            out["status"] = "not measured"
        if self.failed is not None:
            out["failed"] = self.failed
        if self.skipped:
            out["skipped"] = self.skipped
        return out


def fit_offsets(samples: Sequence[CalibrationSample]) -> dict[str, Any]:
    """Fit rank 0's clock against this rank's from ping-pong samples (before, rank 0's T, after),
    in the resolver's convention (``local = cpu_ref + slope·(T − gpu_ref)``). Only round trips up
    to ``3 × (the lowest tenth) + 2 µs`` count: a whole exchange can be slow on a busy machine, and
    such loose windows would keep the fit from resolving the drift."""
    from gputrace.resolver import clock_fits

    rtt = np.array([smp.cpu_after_ns - smp.cpu_before_ns for smp in samples], np.float64)
    limit = 3.0 * quantile(rtt, 0.1) + 2_000.0
    used = [smp for smp, r in zip(samples, rtt, strict=True) if r <= limit]
    fit = clock_fits(used)[0]
    d = fit.to_dict()
    d["fit_samples"], d["rtt_limit_ns"] = len(used), round(limit)
    d["offset_ns"] = offset_at(d, fit.first_cpu_ns)
    d["direction"] = "local = cpu_ref_ns + slope * (reference - gpu_ref_ns)"
    return d


def to_reference(fit: dict[str, Any], local_ns: np.ndarray) -> np.ndarray:
    """Rank 0's clock at this rank's session-clock times ``local_ns`` (int64 ns)."""
    delta = (local_ns - int(fit["cpu_ref_ns"])).astype(np.float64) / float(fit["slope"])
    return (int(fit["gpu_ref_ns"]) + np.rint(delta).astype(np.int64)).astype(np.int64)


def offset_at(fit: dict[str, Any], ns: int) -> int:
    """How far ``fit`` moves this rank's time ``ns``: rank 0's clock minus this rank's, there."""
    return int(to_reference(fit, np.array([ns], np.int64))[0]) - ns


def attach(group: Any, clock: Callable[[], int], options: dict[str, Any] | None = None) -> RankClock | None:
    """A ``RankClock`` for ``group`` (see ``transport_for``), or ``None`` without a group of two or
    more ranks. A group that cannot be used is reported once and ignored."""
    try:
        t = transport_for(group)
    except GputraceError:
        raise
    except Exception as exc:
        report_internal(
            "ranks", f"the process group cannot be used for clock offsets ({type(exc).__name__}: {exc})."
        )
        return None
    if t is None or int(t.size) < 2:
        return None  # a group of one rank has nobody to exchange with: nothing changes
    return RankClock(t, clock, **(options or {}))
