"""Packaging: an SPDX licence with its file, a tested wgpu range, a README that renders on the index."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
tomllib = pytest.importorskip("tomllib")  # Python 3.11+


def project() -> dict[str, object]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]  # type: ignore[no-any-return]


def test_licence_is_an_spdx_expression_with_its_file() -> None:
    p = project()
    assert p["license"] == "MIT" and p["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("MIT License") and "gputrace contributors" in text


def test_wgpu_is_a_tested_range_not_one_version() -> None:
    extras = project()["optional-dependencies"]
    assert isinstance(extras, dict)
    for extra in ("wgpu", "test"):
        (spec,) = [d for d in extras[extra] if d.startswith("wgpu")]
        assert "==" not in spec and ">=0.32" in spec and "<0.33" in spec, spec


def test_readme_images_are_absolute_links() -> None:
    readme = (ROOT / "README.md").read_text()
    images = re.findall(r"!\[[^\]]*\]\(([^)\s]+)", readme) + re.findall(r"<img[^>]+src=\"([^\"]+)", readme)
    assert images, "the README shows a screenshot"
    assert all(src.startswith("https://") for src in images), images


def test_the_wheel_carries_the_licence(tmp_path: Path) -> None:
    import setuptools

    if int(setuptools.__version__.split(".")[0]) < 77:
        pytest.skip(f"setuptools {setuptools.__version__} predates SPDX licences (the test extra needs 77+)")
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "viewer", src / "viewer")
    shutil.copytree(ROOT / "gputrace", src / "gputrace", symlinks=True,
                    ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    out = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", str(out), "."],
        cwd=src, check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    (wheel,) = out.glob("gputrace-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        meta = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "License-Expression: MIT" in meta and "License-File: LICENSE" in meta
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
