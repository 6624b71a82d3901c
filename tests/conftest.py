from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gputrace.errors import reset_reports
from gputrace.recorder import active_recorder
from tests import perfetto_rules


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
