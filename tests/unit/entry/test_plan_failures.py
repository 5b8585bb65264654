"""A host whose plan fails fails alone (issue #18): probe output its kind cannot read, or an
error servefleet did not expect (a bug), inside one host's plan is that host's failure, one line
(``servefleet: <host>: <what>``), and the other hosts' operations are planned all the same.

Driven as the pyinfra CLI drives a deploy (``load_deploy_file``: every host's deploy file in
its greenlet, the first exception out of one aborting the whole run) on pyinfra's ``@fake``
hosts, whose probe answers are scripted: nothing runs anywhere. ``servefleet plan`` and
``status`` go through the same planner (``deploys/report.py``) and report such a host per host.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyinfra.api import Config, Inventory, State
from pyinfra.api.connect import connect_all
from pyinfra.context import ctx_host, ctx_state
from pyinfra_cli.util import load_deploy_file
from repo_paths import REPO

from servefleet.fleet.fleetview import (
    REPORT_DIR_ENV,
    REPORT_ENV,
    ReportRequest,
    fleet_plan,
    plan_table,
)
from servefleet.fleet.statusview import status_problems, status_table
from servefleet.hostplan.plan import plan_host
from servefleet.platforms.rbln import PLATFORM as RBLN
from servefleet.settings.table import load_defaults, settings_from

DEPLOYS = REPO / "deploys"
CREDS = {"RBLN_INDEX_USER": "u", "RBLN_INDEX_PASSWORD": "p"}
DEFAULTS = load_defaults()
PROBE = re.compile("servefleet probe")  # the probe's docstring, sent inline
HEALTH = re.compile("servefleet health gate")  # the status check's
FACTS = {"uname -s": "Linux", "command -v": "/usr/bin/found"}  # what pyinfra's operations ask


def probe(**over: Any) -> dict[str, Any]:
    """A CR13 host with the data's driver and its release installed, nothing serving yet."""
    smi = {
        "KMD_version": DEFAULTS["driver_version"],
        "devices": [{"npu": i, "name": "RBLN-CR13"} for i in range(4)],
    }
    p: dict[str, Any] = {"kernel": "6.1.0-x", "libc": "glibc 2.39", "smi": smi, "pci": [],
                         "releases": [], "current": None, "units": {}, "warm": [], "models": []}  # fmt: skip
    p.update(over)
    return p


# the release the data asks for is installed: the controller resolves nothing (no index)
RELEASE = plan_host(settings_from(DEFAULTS.get, CREDS), probe()).release.id
HOSTS: dict[str, Any] = {
    "good": probe(releases=[RELEASE]),
    "odd-smi": probe(releases=[RELEASE], smi={"KMD_version": "3.5.1", "devices": [{"npu": None}]}),
    "garbled": "Traceback (most recent call last):\n  the probe printed no JSON",
    "bug": probe(releases=[RELEASE], kernel="parser-bug"),
}
ODD_SMI = "rbln-smi -j: unexpected output"


@pytest.fixture(autouse=True)
def controller(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for key, value in CREDS.items():
        monkeypatch.setenv(key, value)
    real = RBLN.read

    def parser_with_a_bug(probe: dict[str, Any]) -> Any:
        if probe.get("kernel") == "parser-bug":  # odd output reaching a bug in a parser
            return probe["smi"]["devices"][None]  # TypeError, as a real slip would raise
        return real(probe)

    monkeypatch.setattr(RBLN, "read", parser_with_a_bug)
    yield


def planned(deploy: str, hosts: dict[str, Any], health: dict[str, str] | None = None) -> State:
    """Load ``deploys/<deploy>`` for each fake host as the pyinfra CLI does (no operation
    runs); ``hosts``: name -> its probe's output (a dict as JSON, or raw text)."""
    inventory = []
    for name, answer in hosts.items():
        responses = {
            HEALTH: json.dumps(health or {}),
            PROBE: answer if isinstance(answer, str) else json.dumps(answer),
            **FACTS,
        }
        inventory.append((f"@fake/{name}", {"fake_responses": responses, "fake_delay": 0,
                                            "fake_delay_jitter": 0}))  # fmt: skip
    state = State(Inventory((inventory, {})), Config())
    connect_all(state)
    with ctx_state.use(state):
        load_deploy_file(state, str(DEPLOYS / deploy))
    return state


def ops_of(state: State, name: str) -> dict[str, Any]:
    return state.ops[state.inventory.get_host(f"@fake/{name}")]


def failure_line(state: State, name: str) -> str:
    """What the host's one operation prints when it runs (by a real shell): one line on stderr,
    exit 1."""
    (op,) = ops_of(state, name).values()
    with ctx_state.use(state), ctx_host.use(state.inventory.get_host(f"@fake/{name}")):
        (command,) = [str(c.get_raw_value()) for c in op.command_generator()]
    proc = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 1 and proc.stdout == "", proc
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


def test_a_host_whose_plan_fails_fails_alone_in_one_line() -> None:
    alone = planned("serve.py", {"good": HOSTS["good"]})
    state = planned("serve.py", HOSTS)  # before the fix: the TypeError aborted the whole run
    # the good host's operations are all planned, as when it is deployed alone
    good = ops_of(state, "good")
    assert len(good) > 10 and good.keys() == ops_of(alone, "good").keys()
    names = {n for h in good for n in state.op_meta[h].names}
    assert any(n.startswith("servefleet | Converge the instances") for n in names), names
    # each other host has one operation: it fails, saying why in one line
    assert failure_line(state, "odd-smi").startswith(f"servefleet: @fake/odd-smi: {ODD_SMI} ")
    assert failure_line(state, "garbled") == (
        "servefleet: @fake/garbled: host probe: unexpected output 'Traceback (most recent call "
        "last):\\n  the probe printed no JSON'; allowed: one JSON object"
    )
    bug = failure_line(state, "bug")
    assert bug.startswith(
        "servefleet: @fake/bug: unexpected TypeError at servefleet/platforms/__init__.py:"
    ), bug
    assert "in detect (a bug in servefleet; please report it): " in bug
    assert "Traceback" not in bug


def test_bad_data_still_stops_the_whole_run_before_any_change() -> None:
    """Data and recipes are not the host's: a bad one stops the run, one line, as before."""
    from pyinfra.api.exceptions import PyinfraError

    state_hosts = {"good": HOSTS["good"], "odd-smi": HOSTS["odd-smi"]}
    inventory = [(f"@fake/{n}", {"fake_responses": {PROBE: json.dumps(p), **FACTS},
                                 "fake_delay": 0, "fake_delay_jitter": 0, "serve_target": "Fast"})
                 for n, p in state_hosts.items()]  # fmt: skip
    state = State(Inventory((inventory, {})), Config())
    connect_all(state)
    with ctx_state.use(state), pytest.raises(PyinfraError) as e:
        load_deploy_file(state, str(DEPLOYS / "serve.py"))
    assert "serve_target: 'Fast' is not a target" in str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("kind", ["plan", "status"])
def test_plan_and_status_report_a_failed_host_per_host(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(REPORT_ENV, kind)
    monkeypatch.setenv(REPORT_DIR_ENV, str(tmp_path))
    health = {str(DEFAULTS["serve_base_port"] + i): "ok" for i in range(4)}
    planned("report.py", HOSTS, health)
    found = ReportRequest(kind, str(tmp_path)).read()  # each summary names its host
    assert set(found) == {f"@fake/{name}" for name in HOSTS}
    refusals = {h: s["refusal"] for h, s in found.items()}
    assert refusals["@fake/good"] is None
    assert refusals["@fake/odd-smi"].startswith(ODD_SMI)
    assert refusals["@fake/garbled"].startswith("host probe: unexpected output")
    assert refusals["@fake/bug"].startswith(
        "unexpected TypeError at servefleet/platforms/__init__.py:"
    )
    if kind == "plan":
        text = plan_table(fleet_plan(found))
        for host in ("odd-smi", "garbled", "bug"):
            (row,) = [line for line in text.splitlines() if line.startswith(f"@fake/{host} ")]
            assert f"refused: {refusals[f'@fake/{host}']}" in row
        assert "refused" not in next(x for x in text.splitlines() if x.startswith("@fake/good"))
    else:
        status_table(found)  # every host has a row
        problems = {h: status_problems(h, s) for h, s in found.items()}
        # planned and checked like any host: its four instances are not serving yet
        assert [p.split(" drifts:")[0] for p in problems["@fake/good"]] == [
            f"@fake/good: servefleet-vllm-{i}.service" for i in range(4)
        ]
        for host in ("odd-smi", "garbled", "bug"):
            assert problems[f"@fake/{host}"] == [f"@fake/{host}: {refusals[f'@fake/{host}']}"]
