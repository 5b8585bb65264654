"""Every file of the tree that docs/design.md and docs/pyinfra-upstream.md name in code
(`` `src/...` ``, `` `tests/...` ``) is there: a module moved or removed takes its mention along
(#47: design.md named ``src/servefleet/fingerprint.py`` long after it went)."""

from __future__ import annotations

import re

import pytest
from repo_paths import REPO

DOCS = ("design.md", "pyinfra-upstream.md")
NAMED = re.compile(r"`((?:src|tests)/[^`\s:]+)`")


@pytest.mark.parametrize("doc", DOCS)
def test_every_file_the_doc_names_is_there(doc: str) -> None:
    path = REPO / "docs" / doc
    named = sorted(set(NAMED.findall(path.read_text(encoding="utf-8"))))
    assert named, f"docs/{doc} names no file of the tree"
    missing = [p for p in named if not any(REPO.glob(p))]
    assert not missing, f"docs/{doc} names files that are not in the tree: {missing}"
