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
    if tmp is not None:
        for f in sorted(tmp.rglob("*.json")) + sorted(tmp.rglob("*.json.gz")):
            if request.node.get_closest_marker("not_a_trace") or "bad" in f.name:
                continue
            try:
                doc = perfetto_rules.read(f)
            except Exception:
                continue  # deliberately broken inputs in bad-input tests
            if isinstance(doc, dict) and "gputrace" in doc:
                problems = perfetto_rules.check(doc)
                assert not problems, f"{f.name} breaks Perfetto rules: {problems[:5]}"
