"""The documentation: the README stays a short guide, and every link and file reference resolves."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text("utf-8"), flags=re.S)
    return {slug(h) for h in re.findall(r"^#+ (.+)$", text, flags=re.M)}


def test_readme_is_a_short_guide() -> None:
    lines = (ROOT / "README.md").read_text("utf-8").splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; move details to docs/"
    text = "\n".join(lines)
    assert "bash tests/setup.sh && python3 -m pytest" in text  # CI runs exactly this command
    for page in ("cuda", "webgpu", "trace-format", "accuracy", "architecture"):
        assert f"(docs/{page}.md)" in text


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_resolves(page: Path) -> None:
    text = re.sub(r"```.*?```", "", page.read_text("utf-8"), flags=re.S)
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target} (no such heading)")
    assert broken == [], f"{page.relative_to(ROOT)}: {broken}"


def test_code_points_only_at_files_that_exist() -> None:
    """Comments and docstrings name documents by path; each must be in the repository."""
    missing = []
    for folder in ("gputrace", "tests", "benchmarks", "examples", "viewer"):
        for f in sorted((ROOT / folder).rglob("*")):
            if f.suffix not in (".py", ".js", ".sh", ".html") or "__pycache__" in f.parts:
                continue
            for name in re.findall(r"[\w./-]*\b[\w-]+\.md\b", f.read_text("utf-8", errors="replace")):
                if not ((ROOT / name).exists() or (ROOT / "docs" / name).exists()):
                    missing.append(f"{f.relative_to(ROOT)}: {name}")
    assert missing == []
