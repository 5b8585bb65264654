"""servefleet's own version is recorded where an operator later asks which servefleet did this
(#32 item 6): the lock, the release marker (tests/unit/test_install_release.py), the host's
desired state (and so its good state), and ``status``."""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path

from servefleet.lock import LOCK_FILE, stack, write_lock
from servefleet.version import VERSION


def test_the_version_is_the_installed_distributions() -> None:
    assert VERSION == importlib.metadata.version("servefleet")


def test_a_lock_records_the_servefleet_that_wrote_it(tmp_path: Path) -> None:
    st = stack("s", ["a==1"], [], [], None, ">=3.10", [])
    write_lock(tmp_path, {st: "lock-version = \"1.0\"\n"}, {}, {})
    assert json.loads((tmp_path / LOCK_FILE).read_text())["servefleet"] == VERSION
