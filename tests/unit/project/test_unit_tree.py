"""The unit tests' own tree: the test files mirror servefleet's packages (a test of
``servefleet/fleet/lab/`` sits in ``tests/unit/fleet/lab/``; a test of the project as a whole, its
layers, packaging and documents, in ``project/``); no module under tests/unit/ imports a test
module (what two tests share lives in a helper module beside conftest.py, a fixture used by name
in conftest.py); and every test file's name is unique under tests/ (pytest's default import mode
imports each test file by its basename)."""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

from layer_table import SRC
from repo_paths import REPO, UNIT

WHOLE = "project"  # the tests of the project as a whole


def imported(path: Path) -> set[str]:
    """The top-level names of every module a file imports, at any depth of its syntax tree."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module.split(".")[0])
    return out


def test_no_module_imports_a_test_module() -> None:
    found = {
        f"{path.relative_to(UNIT)} imports {name}"
        for path in sorted(UNIT.rglob("*.py"))
        for name in imported(path)
        if name.startswith("test_")
    }
    assert sorted(found) == []


def test_every_test_file_name_is_unique_under_tests() -> None:
    names = Counter(p.name for p in (REPO / "tests").rglob("test_*.py"))
    assert [name for name, n in names.items() if n > 1] == []


def test_every_test_file_sits_where_its_package_does() -> None:
    """Beside conftest.py only helpers; every test file in a directory that is a package's path
    under src/servefleet (or ``project/``)."""
    misplaced = [
        str(path.relative_to(UNIT))
        for path in sorted(UNIT.rglob("test_*.py"))
        if not (rel := path.parent.relative_to(UNIT)).parts
        or not (rel == Path(WHOLE) or (SRC / rel).is_dir())
    ]
    assert misplaced == []
