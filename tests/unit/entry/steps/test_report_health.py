"""``servefleet status`` of a host whose health check gives no answer it can read (steps/report.py,
#37): output ``InstanceHealth`` refuses (a traceback, a value of another shape), or none at all
(``remote/health.py`` failed, so pyinfra returns no fact, or it printed nothing). Each such host
is reported refused with one line, which ``status`` names (and so exits 1); the other hosts are
checked as always. Before the fix the first stopped the whole run with pyinfra's traceback and
the second crashed ``status_summary`` on None.

Driven as the pyinfra CLI drives deploys/report.py (``load_deploy_file``) on pyinfra's ``@fake``
hosts, whose answers are scripted: nothing runs anywhere.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from host_inputs import CREDS, converged_probe, settings
from pyinfra.api import Config, Inventory, State
from pyinfra.api.connect import connect_all
from pyinfra.context import ctx_state
from pyinfra_cli.util import load_deploy_file
from repo_paths import REPO

from servefleet.fleet.fleetview import REPORT_DIR_ENV, REPORT_ENV, ReportRequest
from servefleet.fleet.statusview import status_problems, status_table
from servefleet.hostplan.plan import plan_host

PROBE = re.compile("servefleet probe")  # the probe's docstring, sent inline
HEALTH = re.compile("servefleet health gate")  # the status check's
FACTS = {"uname -s": "Linux", "command -v": "/usr/bin/found"}  # what pyinfra's operations ask
PORTS = [str(i.port) for i in plan_host(settings(), converged_probe()).instances]

NO_ANSWER = "instance health: no answer (remote/health.py failed or printed nothing)"
TRACEBACK = "Traceback (most recent call last):\n  no JSON"


def unread(output: str) -> str:
    """The one line for output ``InstanceHealth`` cannot read."""
    return f"instance health: unexpected output {output!r}; allowed: one JSON object of port -> why"


GOOD = json.dumps(dict.fromkeys(PORTS, "ok"))
# a host's health check answers this; the one line status reports for it
CASES: dict[str, tuple[Any, str]] = {
    "traceback": (TRACEBACK, unread(TRACEBACK)),
    "a-list": ('["ok"]', unread('["ok"]')),
    "not-words": (json.dumps({PORTS[0]: 1}), unread(json.dumps({PORTS[0]: 1}))),
    "failed": ({"success": False, "stderr": "python3: not found"}, NO_ANSWER),
    "silent": ({"stdout": []}, NO_ANSWER),
}


def statuses(
    answers: dict[str, Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    probes: dict[str, str] | None = None,
) -> dict[str, Any]:
    """deploys/report.py for ``status`` on a fake host for each of ``answers`` (name -> what its
    health check answers; ``probes``: name -> what its probe answers, else a converged host's):
    the summaries it wrote."""
    monkeypatch.setenv(REPORT_ENV, "status")
    monkeypatch.setenv(REPORT_DIR_ENV, str(tmp_path))
    for key, value in CREDS.items():
        monkeypatch.setenv(key, value)
    probe = json.dumps(converged_probe())
    inventory = [
        (f"@fake/{name}", {"fake_responses": {HEALTH: answer,
                                              PROBE: (probes or {}).get(name, probe), **FACTS},
                           "fake_delay": 0, "fake_delay_jitter": 0})
        for name, answer in answers.items()
    ]  # fmt: skip
    state = State(Inventory((inventory, {})), Config())
    connect_all(state)
    with ctx_state.use(state):
        load_deploy_file(state, str(REPO / "deploys" / "report.py"))  # before: a ProbeError
    return ReportRequest("status", str(tmp_path)).read()


@pytest.mark.parametrize("case", CASES)
def test_a_health_check_without_an_answer_is_one_line_for_its_host(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    answer, line = CASES[case]
    found = statuses({"good": GOOD, case: answer}, tmp_path, monkeypatch)
    assert set(found) == {"@fake/good", f"@fake/{case}"}
    status_table(found)  # every host has a row
    # the other host is checked as always: converged and healthy
    assert status_problems("@fake/good", found["@fake/good"]) == []
    assert [i["health"] for i in found["@fake/good"]["instances"]] == ["ok"] * len(PORTS)
    assert status_problems(f"@fake/{case}", found[f"@fake/{case}"]) == [f"@fake/{case}: {line}"]
    assert "\n" not in line


def test_a_host_whose_probe_or_health_check_passed_its_deadline_is_one_line_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the fact's command prints when ``timeout`` ended its program on the host (#46 item
    5, steps/facts.py): the host is named with its deadline; the others are checked as always.
    Before, a probe hung on a fifo held ``status`` for ever (and that line was unexpected
    output)."""
    past = "servefleet-deadline 600"
    hosts = {"good": GOOD, "probe-hung": GOOD, "health-hung": past}
    found = statuses(hosts, tmp_path, monkeypatch, probes={"probe-hung": past})
    status_table(found)
    assert status_problems("@fake/good", found["@fake/good"]) == []
    ended = "no answer within 600 s (its deadline; `timeout` ended it on the host)"
    assert status_problems("@fake/probe-hung", found["@fake/probe-hung"]) == [
        f"@fake/probe-hung: host probe: {ended}"
    ]
    assert status_problems("@fake/health-hung", found["@fake/health-hung"]) == [
        f"@fake/health-hung: instance health: {ended}"
    ]
