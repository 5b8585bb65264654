"""The fleet commands of the CLI (plan, status, rollout, rollback) over an inventory read by
pyinfra's loader: every host in status (unreachable with pyinfra's reason), the Prometheus file
replaced whole with every instance, one --limit, rollout's --yes, one-line refusals.

pyinfra's runs are stood in for by :class:`FakePyinfra` (summaries written where the CLI asked,
recorded pyinfra output), except one real pyinfra run against a port that refuses connections.
"""

from __future__ import annotations

import json
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from fake_pyinfra import FLEET_COMMANDS, OUTPUT, Batches, FakePyinfra, healthy, whole_reads
from host_inputs import converged_probe, settings

from servefleet.entry import cli, cmd_fleet, pyinfra_run
from servefleet.hostplan.plan import plan_host


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakePyinfra]:
    runner = FakePyinfra({"h1": healthy()}, OUTPUT)
    monkeypatch.setattr(pyinfra_run, "run_pyinfra", runner)
    yield runner


def invoke(*args: str, stdin: str | None = None) -> Any:
    return CliRunner().invoke(cli.main, list(args), input=stdin, catch_exceptions=False)


def test_status_shows_every_host_and_exits_1_naming_each_one_not_serving(
    fleet: Path, fake: FakePyinfra
) -> None:
    prom = fleet / "targets.json"
    result = invoke("status", "inv.py", "--prometheus", str(prom))
    assert result.exit_code == 1
    rows = {line.split()[0]: line for line in result.stdout.splitlines()[1:]}
    assert sorted(rows) == ["h1", "h2", "h3"]
    assert "unreachable: Could not connect ([Errno None] Unable to connect to port 22" in rows["h2"]
    assert "failed: h3: probe: rbln-smi -j printed no JSON" in rows["h3"]
    assert result.stderr.splitlines() == [
        "servefleet: h2: unreachable: Could not connect ([Errno None] Unable to connect to port "
        "22 on 10.0.0.2)",
        "servefleet: h3: failed: h3: probe: rbln-smi -j printed no JSON",
    ]
    groups = {g["labels"]["host"]: g for g in json.loads(prom.read_text())}
    assert groups["h1"]["targets"] == [f"10.0.0.1:{8000 + i}" for i in range(4)]
    assert "unreachable" not in groups["h1"]["labels"]
    assert groups["h2"]["targets"] == ["10.0.0.2:8000"]  # never seen: one instance planned
    assert groups["h2"]["labels"]["unreachable"] == "1"
    assert groups["h3"]["targets"] == ["10.0.0.3:8000", "10.0.0.3:8001"]  # its serve_instances
    # seen with four instances before: all four stay while it is unreachable
    fake.summaries["h2"] = {**healthy(), "address": "10.0.0.2"}
    fake.output = OUTPUT.replace("[h2] Could not", "[h2] Connected; ")
    assert invoke("status", "inv.py", "--prometheus", str(prom)).exit_code == 1  # h3 still
    del fake.summaries["h2"]
    fake.output = OUTPUT
    again = invoke("status", "inv.py", "--prometheus", str(prom), "--json")
    assert again.exit_code == 1
    groups = {g["labels"]["host"]: g for g in json.loads(prom.read_text())}
    assert groups["h2"]["targets"] == [f"10.0.0.2:{8000 + i}" for i in range(4)]
    assert groups["h2"]["labels"]["unreachable"] == "1"
    h2 = json.loads(again.stdout)["h2"]
    assert h2["unreachable"].startswith("Could not connect")
    assert [i["unit"] for i in h2["instances"]][-1] == "servefleet-vllm-3.service"


def test_status_is_0_when_every_host_is_healthy(fleet: Path, fake: FakePyinfra) -> None:
    fake.summaries = {h: {**healthy(), "address": h} for h in ("h1", "h2", "h3")}
    fake.output, fake.code = OUTPUT.replace("Could not", "Connected ").split("--> Preparing")[0], 0
    result = invoke("status", "inv.py")
    assert (result.exit_code, result.stderr) == (0, "")


def test_a_reader_polling_the_prometheus_file_while_status_rewrites_it_sees_whole_files(
    fleet: Path, fake: FakePyinfra
) -> None:
    prom = fleet / "targets.json"
    fake.summaries = {h: {**healthy(), "address": h} for h in ("h1", "h3")}
    invoke("status", "inv.py", "--prometheus", str(prom))

    def rewrite() -> None:
        for _ in range(15):
            assert invoke("status", "inv.py", "--prometheus", str(prom)).exit_code == 1

    reads = whole_reads(prom, rewrite)
    assert reads and all(reads)


def test_a_real_pyinfra_run_against_a_refusing_port_names_the_host(fleet: Path) -> None:
    """pyinfra itself connects (no fake): a bound port that does not listen refuses it."""
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
        # its own file name: pyinfra caches an inventory file's code by its name, per process
        (fleet / "dead.py").write_text(
            f"dead = [('dead1', {{'ssh_hostname': '127.0.0.1', 'ssh_port': {port}}})]\n"
        )
        prom = fleet / "targets.json"
        result = invoke("status", "dead.py", "--prometheus", str(prom))
    assert result.exit_code == 1
    assert result.stderr.startswith("servefleet: dead1: unreachable: Could not connect (")
    assert f"port {port}" in result.stderr
    assert json.loads(prom.read_text()) == [
        {
            "targets": ["127.0.0.1:8000"],
            "labels": {"host": "dead1", "job": "servefleet-vllm", "unreachable": "1"},
        }
    ]  # fmt: skip


def test_plan_shows_every_host_and_exits_1_for_one_it_could_not_plan(
    fleet: Path, fake: FakePyinfra
) -> None:
    from servefleet.fleet.fleetview import plan_summary

    fake.summaries = {"h1": plan_summary(plan_host(settings(), converged_probe()))}
    result = invoke("plan", "inv.py", "--json")
    assert result.exit_code == 1
    plans = json.loads(result.stdout)
    assert sorted(plans) == ["h1", "h2", "h3"] and plans["h1"]["changes"] is False
    assert plans["h2"] == {
        "unreachable": "Could not connect ([Errno None] Unable to connect to port 22 on 10.0.0.2)"
    }
    assert "servefleet: h2: unreachable: Could not connect" in result.stderr


@pytest.mark.parametrize("command", ["plan", "status"])
def test_limit_is_an_option_and_still_works_after_double_dash(
    fleet: Path, fake: FakePyinfra, command: str
) -> None:
    invoke(command, "inv.py", "--limit", "canary", "--limit", "h3")
    invoke(command, "inv.py", "--", "--limit", "canary")
    first, second = fake.runs
    assert first[first.index("-y") + 1 : -2] == ["--limit", "canary", "--limit", "h3"]
    assert second[second.index("-y") + 1 : -2] == ["--limit", "canary"]
    # the hosts status expects are the limited ones: h2 is not named
    result = invoke(command, "inv.py", "--limit", "canary")
    assert "h2" not in result.stdout + result.stderr


def test_rollout_and_rollback_take_the_same_limit(
    fleet: Path, fake: FakePyinfra, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = Batches()
    monkeypatch.setattr(subprocess, "run", runs)
    done = invoke("rollout", "inv.py", "--yes", "--limit", "cr13", "--", "--exclude", "h2",
                  "--data", "serve_target=Throughput")  # fmt: skip
    assert done.exit_code == 0, done.output
    assert "rollout of 2 host(s) in 1 batch(es): h1, h3" in done.stdout
    batch = runs.runs[0]
    # one pyinfra run for the batch, limited to its own hosts; --exclude applied, not passed on
    assert batch[batch.index("--json") + 1 :] == [
        "--limit", "h1", "--limit", "h3", "--data", "serve_target=Throughput", "inv.py",
        pyinfra_run.deploy_path("serve.py"),
    ]  # fmt: skip
    assert len(runs.runs) == 1
    back = invoke("rollback", "inv.py", "--limit", "canary", "--limit", "h3")
    assert back.exit_code == 0
    assert runs.runs[1][1:6] == ["-y", "--limit", "canary", "--limit", "h3"]
    # an option after the inventory is ours, -h too (it used to go to pyinfra)
    assert invoke("rollback", "inv.py", "-h").stdout.startswith("Usage: ")
    assert len(runs.runs) == 2


@pytest.mark.parametrize("command", ["plan", "status", "rollout", "rollback"])
def test_a_limit_that_matches_no_host_is_one_line_and_runs_nothing(
    fleet: Path, fake: FakePyinfra, monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    runs = Batches()
    monkeypatch.setattr(subprocess, "run", runs)
    yes = ["--yes"] if command == "rollout" else []
    result = invoke(command, "inv.py", *yes, "--limit", "nowhere")
    assert result.exit_code == 2
    assert result.stderr == "servefleet: error: --limit nowhere matches no host of the inventory\n"
    assert fake.runs == [] and runs.runs == []


@pytest.mark.parametrize("as_json", [["--json"], []])
def test_rollout_without_yes_needs_a_terminal(
    fleet: Path, fake: FakePyinfra, monkeypatch: pytest.MonkeyPatch, as_json: list[str]
) -> None:
    runs = Batches()
    monkeypatch.setattr(subprocess, "run", runs)
    result = invoke("rollout", "inv.py", *as_json, stdin="")
    assert result.exit_code == 2
    assert result.stderr == (
        "servefleet: error: rollout asks before it starts and stdin is not a terminal: pass --yes\n"
    )
    assert result.stdout == "" and fake.runs == [] and runs.runs == []
    # at a terminal it asks (on stderr with --json: stdout stays JSON); "n" starts nothing
    monkeypatch.setattr(cmd_fleet, "_interactive", lambda: True)
    asked = invoke("rollout", "inv.py", *as_json, stdin="n\n")
    assert asked.exit_code == 1 and "Aborted!" in asked.stderr
    where = asked.stderr if as_json else asked.stdout
    assert "rollout of 3 host(s) in 1 batch(es): h1, h2, h3" in where and "Start?" in where
    assert (asked.stdout == "") == bool(as_json)
    assert fake.runs == [] and runs.runs == []


@pytest.mark.parametrize("command", ["plan", "status", "rollout"])
def test_bad_data_is_one_line_before_any_pyinfra_run(
    fleet: Path, fake: FakePyinfra, monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    runs = Batches()
    monkeypatch.setattr(subprocess, "run", runs)
    yes = ["--yes"] if command == "rollout" else []
    result = invoke(command, "inv.py", *yes, "--", "--data", "serve_base_port=0")
    assert result.exit_code == 2
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("servefleet: error: h1: serve_base_port")
    assert fake.runs == [] and runs.runs == []


def test_pyinfra_refusing_its_arguments_is_one_line(fleet: Path, fake: FakePyinfra) -> None:
    fake.summaries = {}
    fake.output, fake.code = "Usage: pyinfra ...\nError: No such option: --sudoo\n", 2
    result = invoke("status", "inv.py", "--", "--sudo", "--sudo-user=x")
    assert result.exit_code == 2
    assert result.stderr == "servefleet: error: pyinfra: Error: No such option: --sudoo\n"


def test_rollout_reads_pyinfra_inventory_forms(
    fleet: Path, fake: FakePyinfra, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A comma-separated host list, as pyinfra takes it (rollout read only files before)."""
    runs = Batches()
    monkeypatch.setattr(subprocess, "run", runs)
    result = invoke("rollout", "h1,h9", "--yes", "--json", "--batch-size", "1")
    assert result.exit_code == 0, result.output
    assert {h: r["result"] for h, r in json.loads(result.stdout).items()} == {
        "h1": "ok",
        "h9": "ok",
    }
    assert [r[-2:] for r in runs.runs] == [["h1,h9", pyinfra_run.deploy_path("serve.py")]] * 2
    assert [r[r.index("--limit") + 1] for r in runs.runs] == ["h1", "h9"]
    assert fake.runs[0][-2] == "h1,h9"  # its status at the start, over the same inventory


ALLOWED_FORMS = (
    "allowed: a pyinfra Python inventory file (inventories/prod.py), a host list h1,h2 "
    "(no name empty), @connector names or a module.attribute"
)
# an inventory mistake (issue #50): the files it writes, the inventory argument, the line
INVENTORY_MISTAKES = {
    "host list": ({}, "h1,", f"h1,: an empty host name in the host list; {ALLOWED_FORMS}"),
    "host name": (
        {"bad.py": 'cr13 = ["npu a1"]\n'},
        "bad.py",
        "host 'npu a1': not a host name or address; allowed characters: letters, digits and "
        ". - _ : (an @connector name also / + @)",
    ),
    "ssh_port": (
        {"bad.py": 'cr13 = [("h1", {"ssh_port": 70000})]\n'},
        "bad.py",
        "h1: ssh_port 70000: not a port; allowed: 1-65535",
    ),
    "ansible": (
        {"hosts.ini": "[cr13]\nh1 ansible_host=10.0.0.1\n"},
        "hosts.ini",
        "hosts.ini: not a pyinfra inventory (an Ansible INI or YAML inventory is not supported); "
        + ALLOWED_FORMS,
    ),
    "missing": ({}, "inventories/prod.py", f"inventories/prod.py: no such file; {ALLOWED_FORMS}"),
    "group_data": (
        {"group_data/all.py": "x = 1\ny = (\n"},
        "inv.py",
        "group_data/all.py, line 2: cannot read the group data: SyntaxError: '(' was never closed",
    ),
}


@pytest.mark.parametrize("mistake", INVENTORY_MISTAKES)
@pytest.mark.parametrize("command", FLEET_COMMANDS)
def test_every_fleet_command_refuses_an_inventory_mistake_in_one_line_before_any_host(
    fleet: Path, fake: FakePyinfra, monkeypatch: pytest.MonkeyPatch, command: str, mistake: str
) -> None:
    files, inventory, line = INVENTORY_MISTAKES[mistake]
    for name, text in files.items():
        (fleet / name).parent.mkdir(exist_ok=True)
        (fleet / name).write_text(text)
    from servefleet.fleet.inventory import pyinfra_cli

    # pyinfra caches each file's code by the name given (bad.py)
    monkeypatch.setattr(pyinfra_cli().util, "PYTHON_CODES", {})
    runs = Batches()
    monkeypatch.setattr(subprocess, "run", runs)
    result = invoke(*(a.format(inventory) for a in FLEET_COMMANDS[command]))
    assert (result.exit_code, result.stderr) == (2, f"servefleet: error: {line}\n")
    assert fake.runs == [] and runs.runs == [] and not (fleet / "wh").exists()
