"""``servefleet rollout --analysis`` through the CLI (entry/cmd_fleet.py), with pyinfra's runs
stood in for (fake_pyinfra.py's report, a scripted subprocess.run for the batches) and a probe
that answers recorded samples (analysis_cases.py): the instances it is given are the status
report's (address and port, the API key from the controller's environment, never printed), a
slower canary halts and is rolled back with rollback.py (exit 1, the JSON naming each failed
measure with both values, the report and its SVG written), an equal one promotes; the usage
refusals, one line each, before any run."""

from __future__ import annotations

import copy
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from analysis_cases import RecordedProbe
from click.testing import CliRunner
from fake_pyinfra import FakePyinfra, healthy

from servefleet.entry import cli, pyinfra_run
from servefleet.fleet.analysis import probe

KEY = "sk-lab-4711-secret"


def summary(address: str) -> dict[str, Any]:
    return {**copy.deepcopy(healthy()), "address": address}


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakePyinfra]:
    runner = FakePyinfra({h: summary(f"10.0.0.{i}") for i, h in ((1, "h1"), (2, "h2"), (3, "h3"))},
                         "", code=0)  # fmt: skip
    monkeypatch.setattr(pyinfra_run, "run_pyinfra", runner)
    monkeypatch.setenv("SERVEFLEET_API_KEY", KEY)
    yield runner


class Batches:
    """subprocess.run for the batches: every host ok; a serve.py run changes what the hosts of
    its --limit run (their first instance's unit sha), a rollback.py run changes it back."""

    def __init__(self, fake: FakePyinfra) -> None:
        self.fake = fake
        self.runs: list[tuple[list[str], str]] = []

    def __call__(self, cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        hosts = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--limit"]
        self.runs.append((hosts, Path(cmd[-1]).name))
        for h in hosts:
            first = self.fake.summaries[h]["instances"][0]
            first["running"] = "new" if cmd[-1].endswith("serve.py") else first["desired"]
        return subprocess.CompletedProcess(cmd, 0, json.dumps({"results": {"failed_hosts": []}}),
                                           "")  # fmt: skip


def invoke(*args: str) -> Any:
    return CliRunner().invoke(cli.main, list(args), catch_exceptions=False)


DATA = ("--", "--data", 'rollout_analysis={"requests": 20, "concurrency": 2}')


def test_a_slower_canary_halts_rolls_back_and_names_each_failed_measure(
    fleet: Path, fake: FakePyinfra, monkeypatch: pytest.MonkeyPatch
) -> None:
    batches = Batches(fake)
    monkeypatch.setattr(subprocess, "run", batches)
    recorded = RecordedProbe("slower_30")
    monkeypatch.setattr(probe, "run", recorded)
    out = fleet / "report"
    out.mkdir()
    done = invoke("rollout", "inv.py", "--yes", "--canary", "1", "--analysis",
                  "--analysis-report", str(out), "--json", *DATA)  # fmt: skip
    assert done.exit_code == 1, done.output
    assert batches.runs == [(["h1"], "serve.py"), (["h1"], "rollback.py")]  # h2, h3 untouched
    (targets, load), = recorded.calls  # fmt: skip
    assert [(t.role, t.origin, t.host) for t in targets] == [
        ("canary", "http://10.0.0.1:8000", "h1"), ("baseline", "http://10.0.0.2:8000", "h2")]  # fmt: skip
    assert [t.key for t in targets] == [KEY, KEY] and (load.requests, load.concurrency) == (20, 2)
    result = json.loads(done.stdout)
    h1 = result["h1"]
    assert (h1["result"], h1["rolled_back"]) == ("failed", True)
    assert h1["analysis"]["failed"] == ["ttft_p50", "itl_p50", "tokens_per_s"]
    assert h1["why"].startswith("analysis: ttft_p50: canary ") and " ms, baseline " in h1["why"]
    assert "tokens_per_s: canary " in h1["why"] and " tok/s, baseline " in h1["why"]
    assert {result[h]["result"] for h in ("h2", "h3")} == {"not reached"}
    assert result["h2"]["analysis"] is None
    assert json.loads((out / "analysis.json").read_text()) == h1["analysis"]
    assert (out / "analysis.svg").read_text().startswith("<svg ")
    assert KEY not in done.output


def test_an_equal_canary_promotes_and_the_terminal_shows_the_table(
    fleet: Path, fake: FakePyinfra, monkeypatch: pytest.MonkeyPatch
) -> None:
    batches = Batches(fake)
    monkeypatch.setattr(subprocess, "run", batches)
    monkeypatch.setattr(probe, "run", RecordedProbe("equal"))
    done = invoke("rollout", "inv.py", "--yes", "--canary", "1", "--batch-size", "1",
                  "--analysis", *DATA)  # fmt: skip
    assert done.exit_code == 0, done.output
    assert [deploy for _, deploy in batches.runs] == ["serve.py"] * 3
    lines = done.stdout.splitlines()
    at = lines.index("analysis passed: the rollout goes on")
    assert lines[at - 1] == "analysis passed (1.5 s)"
    assert any(line.startswith("measure ") for line in lines[:at])
    assert lines[at + 1] == "batch 2/3: h2"


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--analysis"], "--analysis needs --canary K: the hosts it compares with the rest"),
        (["--canary", "3", "--analysis"], "--analysis: the canary is every host, so no host is "
         "left to compare it with; allowed: a --canary that leaves hosts out"),
        (["--canary", "1", "--analysis-report", "."], "--analysis-report: give --analysis too"),
        (["--canary", "1", "--analysis", "--analysis-report", "inv.py"],
         "Invalid value for '--analysis-report': inv.py: exists and is not a directory; "
         "allowed: a directory, or a path to make one"),
    ],
)  # fmt: skip
def test_what_the_analysis_cannot_do_is_refused_before_any_run(
    fleet: Path, fake: FakePyinfra, monkeypatch: pytest.MonkeyPatch, args: list[str], said: str
) -> None:
    batches = Batches(fake)
    monkeypatch.setattr(subprocess, "run", batches)
    done = invoke("rollout", "inv.py", "--yes", *args)
    assert done.exit_code == 2
    assert done.stderr == f"servefleet: error: {said}\n"
    assert batches.runs == [] and fake.runs == []


def test_bad_analysis_data_is_one_line(fleet: Path, fake: FakePyinfra) -> None:
    done = invoke("rollout", "inv.py", "--yes", "--canary", "1", "--analysis", "--", "--data",
                  'rollout_analysis={"concurrency": 0}')  # fmt: skip
    assert done.exit_code == 2 and done.stderr == (
        "servefleet: error: h1: rollout_analysis.concurrency: 0 is out of range; allowed: 1-256 "
        "(also h2, h3)\n"
    )
