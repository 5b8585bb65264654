"""src/servefleet/base/remote/__init__.py ``inline``: a host program sent as one ``python3 -c``
argument (the probe, the wheelhouse check, the status gate: whatever ``inline("NAME.py")`` the
package sends) finds every neighbour it imports among the modules it carries (``CARRIED``), and
so do the carried ones; and it runs from a directory that holds none of them (#47: the gate and
the probe read the API key through ``release_check``, which must come along)."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest
from repo_paths import REMOTE, REPO

from servefleet.base.remote import CARRIED, inline

SENT = sorted(
    {
        name
        for path in (REPO / "src" / "servefleet").rglob("*.py")
        for name in re.findall(r'\binline\("(\w+\.py)"\)', path.read_text(encoding="utf-8"))
    }
)


def neighbours(name: str) -> set[str]:
    """The host programs ``name`` imports (top-level ``import x`` of a file in base/remote/)."""
    tree = ast.parse((REMOTE / name).read_text(encoding="utf-8"))
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    return {m for m in names if (REMOTE / f"{m}.py").is_file()}


def test_the_programs_sent_inline_are_found() -> None:
    assert {"probe.py", "have_files.py", "health.py"} <= set(SENT)


@pytest.mark.parametrize("name", [*SENT, *(f"{m}.py" for m in CARRIED)])
def test_each_neighbour_imported_is_carried(name: str) -> None:
    assert neighbours(name) <= set(CARRIED), f"{name} imports modules inline() does not carry"


@pytest.mark.parametrize("name", SENT)
def test_it_runs_where_no_neighbour_is(name: str, tmp_path: Path) -> None:
    """Isolated (``-I``: neither the current directory nor the environment on its path), from an
    empty directory; with no arguments each fails on them, past its imports."""
    done = subprocess.run(
        [sys.executable, "-I", "-c", inline(name)], cwd=tmp_path, stdin=subprocess.DEVNULL,
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert "ModuleNotFoundError" not in done.stderr and "ImportError" not in done.stderr
    assert done.returncode in (1, 2), done.stderr  # its arguments missing: a traceback or usage
