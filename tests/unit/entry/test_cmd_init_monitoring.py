"""``servefleet monitoring INVENTORY``: the kit's rules with the inventory's
monitoring_thresholds, on stdout or written atomically with ``--out``; reads the data only (no
host, no index credentials); hosts whose thresholds differ, bad thresholds and a missing
directory are one line, exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from host_inputs import CREDS

from servefleet.entry.cli import main
from servefleet.fleet.monitoring.kit import rules


def monitoring(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, ["monitoring", *args], catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def test_the_rules_of_the_inventorys_data_need_no_credentials(
    fleet: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in CREDS:
        monkeypatch.delenv(name)
    code, out, err = monitoring("inv.py")
    assert (code, err) == (0, "") and out == rules()
    faster = json.dumps({"ttft_p95_ms": 500, "for_seconds": 1})
    code, out, _ = monitoring("inv.py", "--data", f"monitoring_thresholds={faster}")
    assert code == 0 and out == rules({"ttft_p95_ms": 500, "for_seconds": 1})
    assert "> 0.5\n" in out and "for: 1s" in out


def test_out_writes_the_file(fleet: Path) -> None:
    (fleet / "monitoring").mkdir()
    code, out, _ = monitoring("inv.py", "--out", "monitoring/rules.yml")
    assert code == 0 and out == "monitoring/rules.yml\n"
    assert (fleet / "monitoring" / "rules.yml").read_text() == rules()
    code, _, err = monitoring("inv.py", "--out", "nowhere/rules.yml")
    assert code == 2 and "nowhere/rules.yml: its directory nowhere does not exist" in err
    assert not (fleet / "nowhere").exists()


def test_hosts_with_other_thresholds_or_bad_ones_are_one_line(fleet: Path) -> None:
    (fleet / "two.py").write_text(
        'hosts = [("h1", {}), ("h2", {"monitoring_thresholds": {"kv_cache_percent": 80}})]\n'
    )
    code, out, err = monitoring("two.py")
    assert (code, out) == (2, "")
    assert err == (
        "servefleet: error: monitoring_thresholds: h1 and h2 differ; allowed: one value for "
        "every host of the inventory (group_data/all.py)\n"
    )
    code, out, err = monitoring("inv.py", "--data", 'monitoring_thresholds={"kv_cache_percent": 0}')
    assert (code, out) == (2, "")
    assert err.startswith(
        "servefleet: error: h1: monitoring_thresholds.kv_cache_percent: 0 is out of range; "
        "allowed: 1-100"
    )
    assert err.count("\n") == 1
