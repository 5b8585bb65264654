"""#35: ``status`` and ``lock --check`` reach no index, so they need no index credentials
(monitoring and CI must not hold the private index's password); every other run still does."""

from __future__ import annotations

import pytest

from servefleet.base.errors import DataError
from servefleet.settings.across import NO_INDEX
from servefleet.settings.table import load_defaults, settings_from


def test_a_run_that_reaches_no_index_needs_no_index_credentials() -> None:
    with pytest.raises(DataError, match="RBLN_INDEX_USER is not set"):
        settings_from(load_defaults().get, {})
    s = settings_from(load_defaults().get, {NO_INDEX: "1"})
    assert s.index_user is None and s.index_password is None
    with pytest.raises(DataError, match="RBLN_INDEX_USER is not set"):
        settings_from(load_defaults().get, {NO_INDEX: "yes"})  # only "1" says so


def test_lock_check_needs_no_index_credentials_and_leaves_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    import os

    from click.testing import CliRunner

    from servefleet.entry.cli import main
    from servefleet.fleet.fleetview import ReportRequest

    monkeypatch.delenv("RBLN_INDEX_USER", raising=False)
    monkeypatch.delenv("RBLN_INDEX_PASSWORD", raising=False)
    inventory = tmp_path / "inv.py"
    inventory.write_text('hosts = [("h1", {"serve_base_port": 9000})]\n')
    lock = CliRunner().invoke(main, ["lock", str(inventory), "--check", "--lock-dir",
                                     str(tmp_path / "locks")])  # fmt: skip
    assert "RBLN_INDEX_USER" not in lock.output and lock.exit_code == 1, lock.output
    assert "servefleet: lock:" in lock.output  # the lock's own problem: there is none yet
    assert NO_INDEX not in os.environ  # told to settings_from, not left in this process
    made = CliRunner().invoke(main, ["lock", str(inventory), "--lock-dir", str(tmp_path / "l2")])
    assert made.exit_code == 2 and "RBLN_INDEX_USER is not set" in made.output, made.output
    # status's and plan's report runs (they change nothing): told through their environment
    assert ReportRequest("status", str(tmp_path)).env()[NO_INDEX] == "1"
    assert ReportRequest("plan", str(tmp_path)).env()[NO_INDEX] == "1"
