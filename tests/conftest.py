from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gputrace.errors import reset_reports
from gputrace.recorder import active_recorder
from tests import perfetto_rules, perfetto_ui

# files the tests wrote, for Perfetto's real importer at the end of the run: (path, expected, test)
WRITTEN: list[tuple[Path, dict, str]] = []  # type: ignore[type-arg]
# files per format opened in the real importer (0.3-1 s each in one page of the UI): every one
# (about 450 in a whole run), or a sample of this many per format, one per test module first
PER_FORMAT = int(os.environ.get("GPUTRACE_PERFETTO_UI_PER_FORMAT", "0")) or 1_000_000
# ... within this many seconds: the files of each test module come first, the formats taken in
# turn, so a slow browser leaves out only the modules' further files, which it names by count
BUDGET_S = float(os.environ.get("GPUTRACE_PERFETTO_UI_BUDGET_S", "1500"))
COUNTS = ("slices", "tracks", "flows")  # per process, but the flows
MAX_BYTES = 64 << 20  # (every file the suite writes: the largest, 53 MB of 591k slices, takes ~20 s)


def _size(written: tuple[Path, dict, str]) -> int:  # type: ignore[type-arg]
    return written[0].stat().st_size


@pytest.fixture(scope="session", autouse=True)
def _perfetto_imports_every_format(request: pytest.FixtureRequest) -> Iterator[None]:
    """At the end of the run, every file the tests wrote (up to ``MAX_BYTES``; or a sample of
    ``PER_FORMAT`` per format) is opened in Perfetto's own importer (its UI v52 in headless
    chromium): no import error or data loss, and the slices and tracks per process and the
    flows the file holds. The project's rule check (``perfetto_rules``) stays the fast path."""
    yield
    if not WRITTEN or perfetto_ui.skip_reason() or os.environ.get("GPUTRACE_SKIP_PERFETTO_UI"):
        return
    picked: dict[str, list[tuple[int, Path, dict, str]]] = {}  # type: ignore[type-arg]
    seen: set[tuple[str, str]] = set()
    there = [w for w in WRITTEN if w[0].exists()]
    by_size = sorted((w for w in there if _size(w) <= MAX_BYTES), key=_size)
    too_big = len(there) - len(by_size)
    for spread in (True, False):  # one file per test module first, then the next smallest
        for f, expected, test in by_size:
            fmt = next((x for x in (".pftrace", ".gz") if f.name.endswith(x)), ".json")
            group = picked.setdefault(fmt, [])
            key = (fmt, test.split("::")[0] if spread else str(f))
            if len(group) < PER_FORMAT and key not in seen and all(f != g[1] for g in group):
                seen.add(key)
                group.append((0 if spread else 1, f, expected, test))
    failures = []
    listing = os.environ.get("GPUTRACE_PERFETTO_UI_LIST")  # (a file to note what was opened)
    if listing:
        big = [f"{w[2]} {w[0]} (not opened: {_size(w) >> 20} MB)" for w in there if _size(w) > MAX_BYTES]
        opened = [f"{t} {f}" for g in picked.values() for _, f, _, t in g]
        Path(listing).write_text("\n".join(opened + big), errors="backslashreplace")
    # one file of each test module first, the formats in turn; then the others, alike
    order = sorted(
        ((x[0], i, x[1:]) for group in picked.values() for i, x in enumerate(group)), key=lambda o: o[:2]
    )
    deadline = time.monotonic() + BUDGET_S
    left = left_first = 0
    ui = perfetto_ui.PerfettoUI()
    try:
        for rank, _, (f, expected, test) in order:
            if time.monotonic() > deadline:
                left += 1
                left_first += rank == 0
                continue
            got = ui.report(f)
            slices = {pid: r["slices"] for pid, r in got["processes"].items()}
            tracks = {pid: r["tracks"] for pid, r in got["processes"].items()}
            if got["problems"] or (slices, tracks, got["flows"]) != tuple(map(expected.get, COUNTS)):
                failures.append(f"{test}: {f.name}: {got['problems']} slices {slices} tracks {tracks} "
                                f"flows {got['flows']}, expected {expected}")  # fmt: skip
    finally:
        ui.close()
    assert not failures, "Perfetto's importer disagrees:\n" + "\n".join(failures)
    if left or too_big:  # (said, not warned: warnings are errors in this suite)
        plugins = request.config.pluginmanager
        with plugins.get_plugin("capturemanager").global_and_fixture_disabled():
            plugins.get_plugin("terminalreporter").write_line(
                f"Perfetto's importer opened {len(order) - left} of the {len(order)} files the tests "
                f"wrote within {BUDGET_S:g} s; {left} were left out, {left_first} of them a test "
                f"module's first file of a format (GPUTRACE_PERFETTO_UI_BUDGET_S); {too_big} larger "
                f"than {MAX_BYTES >> 20} MB were not opened."
            )


@pytest.fixture(autouse=True)
def _no_leaks_and_valid_files(request: pytest.FixtureRequest) -> Iterator[None]:
    """No session may leak out of a test, and every trace file a test writes obeys the Perfetto rules."""
    reset_reports()
    tmp: Path | None = request.getfixturevalue("tmp_path") if "tmp_path" in request.fixturenames else None
    yield
    rec = active_recorder()
    if rec is not None:
        rec.deactivate()
        pytest.fail("a gputrace session was left active by this test")
    if tmp is not None and not request.node.get_closest_marker("not_a_trace"):
        for f in sorted(tmp.rglob("*")):
            if f.is_file() and "bad" not in f.name:
                problems = perfetto_rules.check_file(f)
                assert not problems, f"{f.name} breaks Perfetto rules: {problems[:5]}"
                expected = perfetto_rules.expected_counts(f) if not f.name.endswith(".partial") else None
                if expected is not None and expected["slices"]:  # (nothing to draw: nothing to check)
                    WRITTEN.append((f, expected, request.node.nodeid))
