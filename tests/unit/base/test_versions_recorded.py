"""servefleet's own version is recorded where an operator later asks which servefleet did this
(#32 item 6): the lock, the release marker (tests/unit/base/remote/test_install_release.py), the
host's desired state (and so its good state), and ``status``."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path

from repo_paths import REMOTE

from servefleet.base.version import VERSION
from servefleet.release.lock import LOCK_FILE, write_lock
from servefleet.release.stack import stack


def test_the_version_is_the_installed_distributions() -> None:
    assert VERSION == importlib.metadata.version("servefleet")


def test_a_lock_records_the_servefleet_that_wrote_it(tmp_path: Path) -> None:
    st = stack("s", ["a==1"], [], [], None, ">=3.10", [])
    write_lock(tmp_path, {st: 'lock-version = "1.0"\n'}, {}, {})
    assert json.loads((tmp_path / LOCK_FILE).read_text())["servefleet"] == VERSION


def _good_state(root: Path) -> dict[str, object]:
    """remote/probe.py's own good_state(), run as the host runs it."""
    remote = REMOTE
    code = (f"import json, sys; sys.path.insert(0, {str(remote)!r}); import probe; out = {{}}; "
            f"probe.good_state(out, {str(root)!r}); print(json.dumps(out))")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return dict(json.loads(done.stdout))


def test_the_probe_reads_who_converged_the_host_and_status_shows_it(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    assert _good_state(tmp_path) == {"good": None, "good_shas": [], "good_servefleet": None}
    good = {"release": "r1", "instances": [{"sha": "s1"}], "servefleet": "0.1.0"}
    (state / "good.json").write_text(json.dumps(good))
    assert _good_state(tmp_path) == {"good": "r1", "good_shas": ["s1"], "good_servefleet": "0.1.0"}
    del good["servefleet"]  # a state an older servefleet wrote
    (state / "good.json").write_text(json.dumps(good))
    assert _good_state(tmp_path)["good_servefleet"] is None


def test_an_odd_version_in_a_hosts_state_is_not_shown() -> None:
    from servefleet.hostplan.plan import _version_word

    assert _version_word("0.1.0") == "0.1.0"
    assert _version_word("1.0\x1b[2J") is None and _version_word(7) is None
    assert _version_word("x" * 65) is None


def test_the_status_table_has_a_servefleet_column() -> None:
    from servefleet.fleet.statusview import STATUS_COLUMNS, status_table

    assert STATUS_COLUMNS[-1] == "servefleet"
    row = {"driver": "3.5.1", "sku": "RBLN-CR13", "devices": 8, "release": "r1",
           "instances": [], "warm": True, "servefleet": VERSION}  # fmt: skip
    assert status_table({"lab1": row}).splitlines()[-1].split()[-1] == VERSION
