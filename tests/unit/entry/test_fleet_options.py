"""Issue #50's findings about the fleet commands' options: one rule for ``--data``, ``--limit``
and ``--selection`` on every fleet command; unknown options refused before any host; the data
checked whole (recipe, strategy, selection) before any host; ``--analysis-report`` made when
missing; a stopped rollout says why on stderr; ``plan`` without index credentials and
``plan --diff`` over hosts it could not reach; ``--fail-percent`` and growing batches.

pyinfra's runs are stood in for by :class:`FakePyinfra` (plan, status) and :class:`Batches`
(the rollout's batches, rollback): every test says which runs happened, none contacts a host.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from fake_pyinfra import FLEET_COMMANDS, OUTPUT, Batches, FakePyinfra
from host_inputs import CREDS

from servefleet.entry import cli, cmd_fleet, pyinfra_run
from servefleet.fleet.rollout import Rollout, batch_sizes, batches

COMMANDS = {c: [a.format("inv.py") for a in args] for c, args in FLEET_COMMANDS.items()}


@pytest.fixture
def runs(fleet: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[FakePyinfra, Batches]:
    """The report runs (plan, status, the rollout's status) and the deploy runs."""
    fake = FakePyinfra({}, OUTPUT)
    monkeypatch.setattr(pyinfra_run, "run_pyinfra", fake)
    deploys = Batches()
    monkeypatch.setattr(subprocess, "run", deploys)
    return fake, deploys


def invoke(*args: str, stdin: str | None = None) -> Any:
    return CliRunner().invoke(cli.main, list(args), input=stdin, catch_exceptions=False)


def nothing_ran(runs: tuple[FakePyinfra, Batches]) -> bool:
    return runs[0].runs == [] and runs[1].runs == []


# --- one rule for options ---------------------------------------------------------------------


@pytest.mark.parametrize("command", COMMANDS)
def test_every_fleet_command_takes_data_limit_and_selection_as_its_own_options(
    runs: tuple[FakePyinfra, Batches], command: str
) -> None:
    """The same three options, in the same place: a bad selection given with them is refused
    as the data's problem (the options were read), before any host (rollback needs no recipe:
    a bad key, there)."""
    bad = (
        ["--data", "serve_base_port=0"]
        if command == "rollback"
        else ["--selection", "lmcache=bogus"]
    )
    args = [*COMMANDS[command], "--limit", "canary", "--data", "serve_target=Throughput", *bad]
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    key = "serve_base_port" if command == "rollback" else "serve_recipe/serve_selection: "
    assert result.stderr.startswith(f"servefleet: error: h1: {key}")
    assert len(result.stderr.splitlines()) == 1
    assert nothing_ran(runs)
    shown = invoke(*COMMANDS[command][:1], "-h").stdout
    assert all(
        o in shown for o in ("--limit PATTERN", "--data KEY=VALUE", "--selection AXIS=VALUE")
    )


def test_rollout_selection_and_data_reach_every_run_as_pyinfra_data(
    runs: tuple[FakePyinfra, Batches],
) -> None:
    """Finding 3: rollout --selection used to go to pyinfra, which refused it: every host
    failed, no reason given."""
    fake, deploys = runs
    done = invoke("rollout", "inv.py", "--yes", "--selection", "lmcache=cpu", "--data",
                  "serve_target=Throughput")  # fmt: skip
    assert done.exit_code == 0, done.output
    data = ["--data", "serve_target=Throughput", "--data", 'serve_selection={"lmcache": "cpu"}']
    batch = deploys.runs[0]
    assert batch[-2 - len(data) : -2] == data
    assert all(r[-2 - len(data) : -2] == data for r in fake.runs)  # its status runs too
    planned = invoke("plan", "inv.py", "--selection", "lmcache=cpu")
    assert fake.runs[-1][-2 - len(data[2:]) : -2] == data[2:], planned.output


def test_options_after_double_dash_still_work(runs: tuple[FakePyinfra, Batches]) -> None:
    fake, deploys = runs
    invoke("plan", "inv.py", "--", "--data", "serve_target=Throughput", "--sudo")
    assert fake.runs[0][-4:-2] == ["--data", "serve_target=Throughput", "--sudo"][1:]
    assert invoke("rollout", "inv.py", "--yes", "--", "--sudo").exit_code == 0
    assert "--sudo" in deploys.runs[0]


@pytest.mark.parametrize(
    "args",
    [["--bogus"], ["--", "--bogus"], ["--", "stray"], ["--", "--limit"]],
    ids=["option", "after --", "a word after --", "a value missing"],
)
@pytest.mark.parametrize("command", ["plan", "status", "rollout", "rollback"])
def test_an_unknown_option_is_refused_in_one_line_before_any_host(
    runs: tuple[FakePyinfra, Batches], command: str, args: list[str]
) -> None:
    """Finding 5: rollout used to query every host, then report each one failed (exit 1)."""
    result = invoke(*COMMANDS[command], *args)
    assert result.exit_code == 2, result.output
    assert len(result.stderr.splitlines()) == 1
    assert result.stderr.startswith("servefleet: error: ")
    assert nothing_ran(runs)


def test_rollout_check_points_at_plan_diff(runs: tuple[FakePyinfra, Batches]) -> None:
    result = invoke("rollout", "inv.py", "--check", "--yes")
    assert (result.exit_code, result.stderr) == (
        2,
        "servefleet: error: rollout has no --check; allowed: `servefleet plan INVENTORY --diff` "
        "shows what a rollout would change, changing nothing (Ansible's --check --diff)\n",
    )
    assert nothing_ran(runs)
    assert "plan INVENTORY --diff" in " ".join(invoke("rollout", "-h").stdout.split())


# --- the data checked whole -------------------------------------------------------------------

BAD_DATA = """
cr13 = [
    ("h1", {"ssh_hostname": "10.0.0.1", "serve_recipe": "rbln/gpt-oss-12b"}),
    ("h2", {"ssh_hostname": "10.0.0.2", "serve_strategy": "fastest"}),
    ("h3", {"ssh_hostname": "10.0.0.3", "serve_strategy": "fastest"}),
]
"""


@pytest.mark.parametrize("command", [c for c in COMMANDS if c != "rollback"])
def test_a_bad_recipe_or_strategy_is_one_line_each_before_any_host(
    runs: tuple[FakePyinfra, Batches], command: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Finding 6: plan, rollout and monitoring used to go on to the hosts; only lock refused."""
    Path("bad.py").write_text(BAD_DATA)
    result = invoke(*(("bad.py" if a == "inv.py" else a) for a in COMMANDS[command]))
    assert result.exit_code == 2, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 2
    assert lines[0].startswith(
        "servefleet: error: h1: serve_recipe/serve_selection: no recipe 'rbln/gpt-oss-12b'"
    )
    assert lines[1] == (
        "servefleet: error: h2: serve_recipe/serve_selection: rbln/gpt-oss-120b: unknown strategy "
        "'fastest' (allowed: aggregated) (also h3)"
    )
    assert nothing_ran(runs) and not Path("wh").exists()


def test_rollback_checks_the_keys_but_needs_no_recipe(runs: tuple[FakePyinfra, Batches]) -> None:
    """A rollback goes back to the hosts' kept states: a bad recipe does not stop it, a bad key
    does, before any host."""
    Path("bad.py").write_text(BAD_DATA)
    assert invoke("rollback", "bad.py").exit_code == 0
    refused = invoke("rollback", "inv.py", "--data", "serve_base_port=0")
    assert refused.exit_code == 2
    assert refused.stderr.startswith("servefleet: error: h1: serve_base_port")
    assert len(runs[1].runs) == 1


# --- the rollout ------------------------------------------------------------------------------


def test_the_analysis_report_directory_is_made_when_missing(
    runs: tuple[FakePyinfra, Batches], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Finding 1: the documented command was refused in a fresh fleet (reports: not a
    directory). Declined at the prompt: the directory is there, no host was changed."""
    monkeypatch.setattr(cmd_fleet, "_interactive", lambda: True)
    asked = invoke("rollout", "inv.py", "--canary", "1", "--analysis", "--analysis-report",
                   "reports/today", stdin="n\n")  # fmt: skip
    assert asked.exit_code == 1 and "Aborted!" in asked.stderr, asked.output
    assert Path("reports/today").is_dir() and runs[1].runs == []
    Path("afile").write_text("")
    for path, said in (("afile", "afile: exists and is not a directory; allowed: a directory, "
                        "or a path to make one"),
                       ("afile/sub", "afile/sub: cannot make the directory (Not a directory)")):  # fmt: skip
        refused = invoke("rollout", "inv.py", "--yes", "--canary", "1", "--analysis",
                         "--analysis-report", path)  # fmt: skip
        assert (refused.exit_code, refused.stderr) == (
            2, f"servefleet: error: Invalid value for '--analysis-report': {said}\n"
        )  # fmt: skip
    assert nothing_ran(runs)


def test_a_stopped_rollout_says_why_on_stderr(
    runs: tuple[FakePyinfra, Batches], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Finding 4: it exited 1 with nothing on stderr."""
    deploys = Batches(fail={"h1"})
    monkeypatch.setattr(subprocess, "run", deploys)
    result = invoke("rollout", "inv.py", "--yes", "--canary", "1")
    assert result.exit_code == 1
    assert result.stderr == (
        "servefleet: rollout stopped after batch 1/2: 1 failed host(s) (h1), more than "
        "--max-failures 0 allows; h1: the gate failed: instance 0 answered 500\n"
    )
    assert len(deploys.runs) == 1  # the second batch never ran


def test_fail_percent_stops_when_more_than_that_share_of_the_hosts_run_failed(
    runs: tuple[FakePyinfra, Batches], monkeypatch: pytest.MonkeyPatch
) -> None:
    deploys = Batches(fail={"h2"})
    monkeypatch.setattr(subprocess, "run", deploys)
    # h2 of h1, h2: 50 % of the hosts run, within 50 %: on to h3
    assert invoke("rollout", "inv.py", "--yes", "--batch-size", "2,1", "--fail-percent",
                  "50").exit_code == 0  # fmt: skip
    assert len(deploys.runs) == 2
    stopped = invoke("rollout", "inv.py", "--yes", "--batch-size", "2,1", "--fail-percent", "40")
    assert stopped.exit_code == 1
    assert "more than --fail-percent 40 (50% of 2 run) allows" in stopped.stderr
    assert len(deploys.runs) == 3
    # with --max-failures too, the first limit exceeded stops it
    both = invoke("rollout", "inv.py", "--yes", "--batch-size", "1", "--fail-percent", "90",
                  "--max-failures", "0")  # fmt: skip
    assert both.exit_code == 1 and "more than --max-failures 0 allows" in both.stderr
    shown = " ".join(invoke("rollout", "-h").stdout.split())
    assert "--fail-percent P" in shown and "max_fail_percentage" in shown and "1,5,20%" in shown


def test_batch_sizes_grow_as_ansibles_serial() -> None:
    hosts = [f"h{i}" for i in range(12)]
    # the canary, then 1, 5, then 20 % of 12 (3 hosts, rounded up) until every host had its batch
    got = batches(hosts, 1, batch_sizes("1,5,20%"), None)
    assert [len(b) for b in got] == [1, 1, 5, 3, 2]
    assert [h for b in got for h in b] == hosts
    assert batch_sizes("3") == [(3, False)] and batch_sizes("12.5%") == [(12.5, True)]
    assert [len(b) for b in batches(hosts, 0, batch_sizes("50%"), None)] == [6, 6]
    for bad in ("0", "1,x", "150%", "1,,2", "-1", "2.5"):
        with pytest.raises(ValueError, match="not a batch size; allowed: N \\(hosts\\), P%"):
            batch_sizes(bad)


def test_a_bad_batch_size_is_one_line(runs: tuple[FakePyinfra, Batches]) -> None:
    result = invoke("rollout", "inv.py", "--yes", "--batch-size", "1,x")
    assert result.exit_code == 2
    assert result.stderr == (
        "servefleet: error: Invalid value for '--batch-size': 'x' is not a batch size; allowed: "
        "N (hosts), P% (of all the hosts), or a comma list of them that grows, the last "
        "repeated (1,5,20%)\n"
    )
    assert nothing_ran(runs)


def test_run_keeps_its_max_failures_when_no_fail_percent_is_given() -> None:
    r = Rollout(inventory="inv.py", deploy="serve.py", pyinfra_args=[],
                report=lambda kind, hosts: {}, echo=lambda m: None)  # fmt: skip
    r.pyinfra = lambda hosts, deploy, compiling=(): (0, {"failed_hosts": []}, "")  # type: ignore[method-assign]
    assert r.run([["a"], ["b"]], max_failures=0) and r.stopped == ""


# --- plan -------------------------------------------------------------------------------------


def test_plan_runs_without_index_credentials(
    runs: tuple[FakePyinfra, Batches], monkeypatch: pytest.MonkeyPatch
) -> None:
    """It changes nothing, so it needs none (status and monitoring did not either)."""
    for name in CREDS:
        monkeypatch.delenv(name)
    result = invoke("plan", "inv.py", "--json")
    assert result.exit_code == 1  # h2 unreachable, h3 failed: named; not refused (2)
    assert "RBLN_INDEX" not in result.stderr and len(runs[0].runs) == 1


def test_plan_diff_over_hosts_it_could_not_reach_says_so(
    runs: tuple[FakePyinfra, Batches],
) -> None:
    fake = runs[0]
    fake.output = "".join(
        f"    [{h}] Could not connect ([Errno None] Unable to connect to port 22 on {h})\n"
        for h in ("h1", "h2", "h3")
    ).join(["--> Connecting to hosts...\n", "--> Disconnecting from hosts...\n"])
    result = invoke("plan", "inv.py", "--diff")
    assert result.exit_code == 1
    assert "no unit changes" not in result.stdout
    assert "no unit diffs: none of the 3 host(s) could be planned (see stderr)" in result.stdout
    assert [line.split(":")[1] for line in result.stderr.splitlines()] == [" h1", " h2", " h3"]
    assert json.loads(invoke("plan", "inv.py", "--json").stdout)["h1"]["unreachable"]


def test_wheelhouse_takes_the_host_options_with_an_inventory_only(
    runs: tuple[FakePyinfra, Batches],
) -> None:
    result = invoke("wheelhouse", "wh", "--lock-dir", "locks", "--selection", "lmcache=cpu")
    assert (result.exit_code, result.stderr) == (
        2, "servefleet: error: --limit, --data and --selection: give --inventory too\n"
    )  # fmt: skip
    assert not Path("wh").exists()


def test_a_selection_over_a_serve_selection_that_is_no_mapping_is_one_line(
    runs: tuple[FakePyinfra, Batches],
) -> None:
    result = invoke("plan", "inv.py", "--data", "serve_selection=cpu", "--selection", "lmcache=cpu")
    assert result.exit_code == 2
    assert result.stderr == (
        "servefleet: error: --data serve_selection='cpu': not a mapping, so --selection cannot "
        'add to it; allowed: a JSON object ({"lmcache": "cpu"}) or --selection alone\n'
    )
    assert nothing_ran(runs)
