"""`servefleet plan --diff` against the lab fleet (#32 item 5): the plan's probe reads each unit
file's text on the host, and the diff shows a hand edit against the unit the deploy renders;
plan changes nothing, and a converged fleet has no unit change."""

from __future__ import annotations

import json
from typing import Any

from faults import run
from labhelpers import on_host
from test_plan_status import cli

NO_CHANGES = "no unit changes on the 3 host(s) planned"  # plan --diff over the whole lab
UNIT = "/etc/systemd/system/servefleet-vllm-2.service"


def test_plan_diff_shows_a_hand_edited_unit_and_changes_nothing(lab: dict[str, Any]) -> None:
    assert run(lab).returncode == 0
    clean = cli(lab, "plan", "inventories/lab.py", "--diff")
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert clean.stdout.rstrip().endswith(NO_CHANGES)
    on_host(lab, "lab2", f"sed -i 's/^RestartSec=5/RestartSec=6/' {UNIT}")
    edited = on_host(lab, "lab2", f"cat {UNIT}").stdout
    shown = cli(lab, "plan", "inventories/lab.py", "--diff")
    assert shown.returncode == 0, shown.stdout + shown.stderr
    diff = shown.stdout.split("== lab2: servefleet-vllm-2.service\n", 1)[1]
    lines = diff.splitlines()
    assert lines[:2] == [f"--- {UNIT}", f"+++ {UNIT}"]
    assert "-RestartSec=6" in lines and "+RestartSec=5" in lines
    assert "== lab1" not in shown.stdout and "== lab3" not in shown.stdout
    as_json = json.loads(cli(lab, "plan", "inventories/lab.py", "--json", "--diff").stdout)
    assert list(as_json["lab2"]["diffs"]) == ["servefleet-vllm-2.service"]
    assert as_json["lab1"]["diffs"] == {} and as_json["lab3"]["diffs"] == {}
    assert on_host(lab, "lab2", f"cat {UNIT}").stdout == edited  # plan changed nothing
    assert run(lab, "--limit", "lab2").returncode == 0  # the deploy puts it back
    assert (
        cli(lab, "plan", "inventories/lab.py", "--diff").stdout.rstrip().endswith(NO_CHANGES)
    )
