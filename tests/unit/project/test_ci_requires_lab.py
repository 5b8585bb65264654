"""In CI (CI=true) a host test that cannot reach a lab fails; elsewhere it skips with the reason.
Runs tests/conftest.py for real, in a scratch tree where the lab is made unavailable."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from repo_paths import REPO

CONFTEST = REPO / "tests" / "conftest.py"


@pytest.mark.parametrize(("ci", "outcome"), [("true", "1 error"), ("", "1 skipped")])
def test_host_tests_fail_in_ci_without_a_lab(tmp_path: Path, ci: str, outcome: str) -> None:
    source = CONFTEST.read_text().replace(
        "def lab_unavailable_reason() -> str | None:",
        "def lab_unavailable_reason() -> str | None:\n    return 'simulated: no namespaces'\n\n\n"
        "def _real_reason() -> str | None:",
    )
    (tmp_path / "tests" / "hosts").mkdir(parents=True)
    (tmp_path / "tests" / "conftest.py").write_text(source)
    (tmp_path / "tests" / "hosts" / "test_x.py").write_text("def test_x():\n    pass\n")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "tests"],
        cwd=tmp_path, env={"CI": ci, "PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
    )  # fmt: skip
    assert outcome in proc.stdout, proc.stdout
    assert "simulated: no namespaces" in proc.stdout
