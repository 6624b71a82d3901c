"""gputrace merge: one time line from the clock pairs, own tracks per process, no id collisions."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import orjson
import pytest
from click.testing import CliRunner

import gputrace
from gputrace.cli import cli
from gputrace.exporters.plan import GPU_PID_BASE
from gputrace.merge import merge, merge_files
from tests import perfetto_rules
from tests.builders import assert_same, cupti_trace

DATA = Path(__file__).parents[1] / "data"
R0, R1 = DATA / "rank0.json", DATA / "rank1.json"


def test_alignment_from_clock_pairs() -> None:
    t0, t1 = gputrace.load(R0), gputrace.load(R1)
    # rank 1's clock reads 5.0 s at realtime R + 0.5 ms, rank 0's 1.0 s at R: shift = 0.5 ms − 4 s
    shift = 500_000 - 4_000_000_000
    m = merge([t1, t0], ["rank1.json", "rank0.json"])  # ordered by rank, whatever the input order
    assert [p["rank"] for p in m.header["processes"]] == [0, 1]
    assert [x["shift_ns"] for x in m.header["merged"]] == [0, shift]
    a0, a1 = m.find("allreduce")
    assert a0.cpu_start_ns == t0.find("allreduce")[0].cpu_start_ns == 1_000_100_000
    assert a1.cpu_start_ns == t1.find("allreduce")[0].cpu_start_ns + shift == 1_000_100_000
    assert a1.gpu_start_ns == t1.find("allreduce")[0].gpu_start_ns + shift  # type: ignore[operator]
    assert [mk.ts_ns for mk in m.marks] == [1_000_105_000, 1_000_105_000]
    assert m.clock_fits[1].cpu_ref_ns == t1.clock_fits[0].cpu_ref_ns + shift
    assert m.header["clock_pair"] == t0.header["clock_pair"]


def test_merged_file_keeps_processes_apart(tmp_path: Path) -> None:
    out = tmp_path / "all.json"
    res = CliRunner().invoke(cli, ["merge", str(out), str(R1), str(R0)])
    assert res.exit_code == 0, res.output
    assert "2 scopes from 2 traces (rank 0, rank 1)" in res.output
    doc = orjson.loads(out.read_bytes())
    assert perfetto_rules.check(doc) == []
    ev = doc["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in ev if e.get("name") == "process_name"}
    cpu_pids = sorted(p for p in names if p < GPU_PID_BASE)
    gpu_pids = sorted(p for p in names if p >= GPU_PID_BASE)
    assert len(cpu_pids) == 2 and len(gpu_pids) == 2  # both inputs had pid 1000 and GPU 0
    # named by rank and host; the renumbered pid of rank 1 is not shown as if it were real
    assert [names[p] for p in cpu_pids] == ["rank 0 · golden (pid 1000)", "rank 1 · golden"]
    assert names[gpu_pids[1]] == "rank 1 · golden · GPU 1 · Fake GPU · fake"
    sort = {e["pid"]: e["args"]["sort_index"] for e in ev if e.get("name") == "process_sort_index"}
    assert sorted(sort, key=sort.__getitem__) == cpu_pids + gpu_pids  # Python processes first
    slices = [e for e in ev if e.get("ph") == "X" and e["pid"] < GPU_PID_BASE]
    assert sorted(e["pid"] for e in slices) == cpu_pids and len({e["tid"] for e in slices}) == 2
    flows = [e["bind_id"] for e in ev if e.get("flow_out")]
    assert sorted(flows) == [0, 1]
    # written again after loading, each process keeps its pid (it used to collapse into one)
    again = tmp_path / "again.json"
    gputrace.exporters.write(gputrace.load(out), again)
    doc2 = orjson.loads(again.read_bytes())
    assert perfetto_rules.check(doc2) == []
    slices2 = [e for e in doc2["traceEvents"] if e.get("ph") == "X" and e["pid"] < GPU_PID_BASE]
    assert sorted(e["pid"] for e in slices2) == cpu_pids
    names2 = {e["pid"]: e["args"]["name"] for e in doc2["traceEvents"] if e.get("name") == "process_name"}
    assert names2 == names
    gpu = [e for e in ev if e.get("ph") == "X" and e["pid"] >= GPU_PID_BASE]
    assert sorted(e["pid"] for e in gpu) == gpu_pids and len({(e["pid"], e["tid"]) for e in gpu}) == 2


def test_merged_file_loads_back_exactly(tmp_path: Path) -> None:
    out = tmp_path / "all.json.gz"
    assert CliRunner().invoke(cli, ["merge", str(out), str(R0), str(R1)]).exit_code == 0
    merged = merge([gputrace.load(R0), gputrace.load(R1)], [str(R0), str(R1)])
    back = gputrace.load(out)
    assert_same(merged, back)
    assert len(back.marks) == 2 and {m.thread for m in back.marks} == {0, 1}


def test_story_traces_merge_with_nesting_and_streams(tmp_path: Path) -> None:
    story = gputrace.load(DATA / "story.json")
    out = tmp_path / "two.json"
    shutil.copy(DATA / "story.json", tmp_path / "again.json")
    assert CliRunner().invoke(cli, ["merge", str(out), str(DATA / "story.json"),
                                    str(tmp_path / "again.json")]).exit_code == 0  # fmt: skip
    back = gputrace.load(out)
    assert len(back) == 2 * len(story) and len(back.queues) == 2 * len(story.queues)
    assert [s.name for s in back.find("matmul")[:2]] == ["matmul", "matmul"]
    steps = back.find("step")
    assert all(back.scope(c.parent).name == "step" for c in back.find("matmul"))
    assert {s.thread.tid for s in steps} == {1000, 1 << 22}  # the same tid twice: one renumbered


def test_bad_inputs_to_merge(tmp_path: Path) -> None:
    run = CliRunner().invoke
    no_pair = orjson.loads(R0.read_bytes())
    del no_pair["gputrace"]["clock_pair"]
    bad = tmp_path / "no_pair.json"
    bad.write_bytes(orjson.dumps(no_pair))
    res = run(cli, ["merge", str(tmp_path / "out.json"), str(R0), str(bad)])
    assert res.exit_code == 2 and f"{bad}: cannot be merged, it records no clock_pair." in res.output
    res = run(cli, ["merge", str(tmp_path / "out.json"), str(R0), str(DATA / "pytorch.json")])
    assert res.exit_code == 2 and "not one written by gputrace" in res.output
    res = run(cli, ["merge", str(tmp_path / "out.json")])
    assert res.exit_code == 2
    assert not (tmp_path / "out.json").exists()


def test_merge_keeps_every_gpu_operation_under_its_own_scope(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Per-operation records (CUPTI kernels) survive a merge: each under the scope that launched
    it, moved by its process's shift, with launch ids that stay unique; the file keeps them."""
    paths = [tmp_path / "a.json", tmp_path / "b.json"]
    a, b = (cupti_trace(tmp_path, monkeypatch, p) for p in paths)
    m = merge_files(tmp_path / "all.json", [str(p) for p in paths])
    shift = m.header["merged"][1]["shift_ns"]

    def ops(t: gputrace.Trace, by: int) -> list[tuple[str, str, int, int]]:
        o = t.ops
        return sorted(
            (t.names[n], t.names[t.scopes.name[sc]], g0 + by, g1 + by)
            for n, sc, g0, g1 in zip(o.name, o.scope, o.gpu_start_ns, o.gpu_end_ns, strict=True)
        )

    assert len(a.ops) > 0 and ops(m, 0) == sorted(ops(a, 0) + ops(b, shift))
    assert (m.ops.scope >= 0).all() and (np.diff(m.ops.gpu_start_ns) >= 0).all()
    assert len(set(m.ops.correlation.tolist())) == len(set(a.ops.correlation.tolist())) * 2
    assert ops(gputrace.load(tmp_path / "all.json"), 0) == ops(m, 0)
