"""``servefleet rollout``'s Rollout on its own (fleet/rollout.py), with a scripted pyinfra and
status report (no hosts): what the mutation campaign (issue #37, bench/mutation.py) found no unit
test of. The one status at the start (each host's release, and which are cold: the hosts that
pre-warm in their batch), the lines a batch says, the release after, settling failed hosts
(restore.py beside the deploy, only on those not answering healthy), and the real pyinfra CLI's
command line, its results and its live lines."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from servefleet.fleet import rollout as rollout_mod
from servefleet.fleet.inventory import limit_pattern
from servefleet.fleet.rollout import Rollout, batches


class _Fleet(Rollout):
    """A Rollout whose pyinfra runs fail the hosts of ``fail`` and whose report says the
    ``status`` of each host: ``release`` r1 before the first run, r2 after, ``warm`` per
    ``cold``, every instance healthy unless the host is in ``unhealthy``."""

    def __init__(self, fail: set[str], cold: set[str], unhealthy: tuple[str, ...] = ()) -> None:
        self.fail, self.cold, self.unhealthy = fail, cold, unhealthy
        self.runs: list[tuple[list[str], str, list[str]]] = []
        self.reports: list[tuple[str, list[str]]] = []
        self.lines: list[str] = []
        super().__init__(inventory="inv.py", deploy="/fleet/deploys/serve.py", pyinfra_args=[],
                         report=self._report, echo=self.lines.append)  # fmt: skip

    def _report(self, kind: str, hosts: list[str]) -> dict[str, Any]:
        self.reports.append((kind, list(hosts)))
        release = "r2" if self.runs else "r1"
        return {h: {"release": release, "warm": h not in self.cold,
                    "instances": [{"health": "down" if h in self.unhealthy else "ok"}]}
                for h in hosts}  # fmt: skip

    lost: set[str] = set()  # their connection drops in their first run
    garbled: set[str] = set()  # a run with one of them prints no JSON results

    def pyinfra(
        self, hosts: list[str], deploy: str, compiling: Sequence[str] = ()
    ) -> tuple[int, dict[str, Any] | None, str]:
        first = not any(set(hosts) & set(h) for h, _, _ in self.runs)
        self.runs.append((list(hosts), deploy, list(compiling)))
        if set(hosts) & self.garbled:
            return 1, None, ""
        failed = sorted(set(hosts) & self.fail) if deploy.endswith("serve.py") else []
        err = "".join(f"[{h}] servefleet: {h}: the gate failed; rolled back to r1\n"
                      for h in failed)  # fmt: skip
        if first:
            dropped = sorted(set(hosts) & self.lost)
            failed = sorted({*failed, *dropped})
            err += "".join(f"[{h}] servefleet: connection lost during 'x'\n" for h in dropped)
        return (1 if failed else 0), {"failed_hosts": failed}, err


def test_one_status_at_the_start_names_the_cold_hosts_and_the_releases() -> None:
    r = _Fleet(fail=set(), cold={"h2", "h3"})
    assert r.run([["h1"], ["h2", "h3", "h4"]], max_failures=0)
    assert r.reports == [("status", ["h1", "h2", "h3", "h4"]), ("status", ["h1", "h2", "h3", "h4"])]
    # the cold hosts pre-warm in their batch, the warm ones do not
    assert r.runs == [(["h1"], "/fleet/deploys/serve.py", []),
                      (["h2", "h3", "h4"], "/fleet/deploys/serve.py", ["h2", "h3"])]  # fmt: skip
    assert {h: (x.release_before, x.release_after, x.result) for h, x in r.results.items()} == {
        h: ("r1", "r2", "ok") for h in ("h1", "h2", "h3", "h4")
    }
    said = [line.split(" (")[0] for line in r.lines]
    assert said == ["batch 1/2: h1", "batch 1/2: 1 ok, 0 failed",
                    "batch 2/2: h2, h3, h4", "batch 2/2: 3 ok, 0 failed"]  # fmt: skip
    assert all(re.search(r" \([0-4] s\)$", line) for line in r.lines[1::2]), r.lines


def test_a_stopped_rollout_restores_only_the_failed_hosts_that_do_not_serve() -> None:
    r = _Fleet(fail={"h2", "h3"}, cold=set(), unhealthy=("h3",))
    assert not r.run([["h1"], ["h2", "h3"], ["h4"]], max_failures=1)
    assert r.runs[-1] == (["h3"], "/fleet/deploys/restore.py", [])  # beside the deploy
    assert r.reports[1] == ("status", ["h2", "h3"])  # the failed hosts' status
    assert "restoring the last good state on h3" in r.lines
    assert "stopping: 2 failed host(s), --max-failures 1" in r.lines
    assert {h: (x.result, x.rolled_back) for h, x in r.results.items()} == {
        "h1": ("ok", False), "h2": ("failed", True), "h3": ("failed", True),
        "h4": ("not reached", False),
    }  # fmt: skip
    assert r.results["h4"].release_after is None and r.results["h2"].release_after == "r2"
    assert [line.split(" (")[0] for line in r.lines if "failed" in line][1] == (
        "batch 2/3: 0 ok, 2 failed"
    )
    assert r.results["h2"].why == "h2: the gate failed; rolled back to r1"


def test_a_gate_that_rolled_back_is_read_from_the_deploys_line() -> None:
    r = _Fleet(fail={"h1"}, cold=set())
    r.pyinfra = lambda hosts, deploy, compiling=(): (  # type: ignore[method-assign]
        1,
        {"failed_hosts": ["h1"]},
        "[h1] servefleet: instance 0: rolled back to r1\n",
    )
    assert not r.run([["h1"]], max_failures=0)
    assert r.results["h1"].rolled_back is True


def test_two_unhealthy_hosts_are_named_in_one_line() -> None:
    r = _Fleet(fail={"h1", "h2"}, cold=set(), unhealthy=("h1", "h2"))
    assert not r.run([["h1", "h2"]], max_failures=0)
    assert "restoring the last good state on h1, h2" in r.lines
    assert r.runs[-1] == (["h1", "h2"], "/fleet/deploys/restore.py", [])


def test_a_run_without_json_results_fails_its_whole_batch() -> None:
    r = _Fleet(fail=set(), cold=set())
    r.garbled = {"h2"}
    assert not r.run([["h1"], ["h2", "h3"], ["h4"]], max_failures=1)
    assert {h: x.result for h, x in r.results.items()} == {
        "h1": "ok", "h2": "failed", "h3": "failed", "h4": "not reached"}  # fmt: skip


def test_a_lost_connection_is_run_once_more_alone_with_its_prewarm() -> None:
    r = _Fleet(fail=set(), cold={"h2", "h3"})
    r.lost = {"h2", "h4"}
    assert r.run([["h1", "h2", "h3", "h4"]], max_failures=0)
    assert r.runs[1] == (["h2", "h4"], "/fleet/deploys/serve.py", ["h2"])
    assert "batch 1/1: connection lost on h2, h4: once more" in r.lines
    assert {h: (x.result, x.retried) for h, x in r.results.items()} == {
        "h1": ("ok", False), "h2": ("ok", True), "h3": ("ok", False), "h4": ("ok", True)}  # fmt: skip
    # lost again, or no results the second time: failed
    r = _Fleet(fail={"h2"}, cold=set())
    r.lost = {"h2"}
    assert not r.run([["h1", "h2"]], max_failures=0)
    assert r.results["h2"].result == "failed" and r.results["h2"].retried
    r = _Fleet(fail=set(), cold=set())
    r.lost = {"h2"}
    runs = r.pyinfra
    r.pyinfra = lambda hosts, deploy, compiling=(): (  # type: ignore[method-assign]
        runs(hosts, deploy, compiling) if hosts != ["h2"] else (1, None, "")
    )
    assert not r.run([["h1", "h2"]], max_failures=0)
    assert r.results["h2"].result == "failed"


def test_a_failed_host_that_serves_is_not_restored() -> None:
    r = _Fleet(fail={"h1"}, cold=set())
    assert not r.run([["h1"], ["h2"]], max_failures=0)
    assert [deploy for _, deploy, _ in r.runs] == ["/fleet/deploys/serve.py"]
    assert not any(line.startswith("restoring") for line in r.lines)


def test_percent_batches_round_up() -> None:
    hosts = [f"h{i}" for i in range(201)]
    # 0.5 % of 201 hosts is 1.005 hosts: batches of 2
    plan = batches(hosts, 1, None, 0.5)
    assert plan[0] == ["h0"] and [len(b) for b in plan[1:]] == [2] * 100
    assert batches(hosts[:4], 1, None, 50) == [["h0"], ["h1", "h2"], ["h3"]]


def test_the_pyinfra_run_is_the_cli_with_its_limits_and_its_json(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[tuple[list[str], dict[str, Any]]] = []
    out = {"results": {"failed_hosts": ["h2"]}}

    def run(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        calls.append((cmd, kw))
        time.sleep(0.2)
        return subprocess.CompletedProcess(cmd, 1, json.dumps(out), "[h2] servefleet: bad\n")

    monkeypatch.setattr(rollout_mod.subprocess, "run", run)
    monkeypatch.setattr(rollout_mod, "TICK", 0.05)
    lines: list[str] = []
    r = Rollout(inventory="inv.py", deploy="serve.py", pyinfra_args=["--sudo"],
                report=lambda kind, hosts: {}, echo=lines.append)  # fmt: skip
    code, results, err = r.pyinfra(["h1", "h2"], "serve.py", ["h1", "h2"])
    assert (code, results, err) == (1, out["results"], "[h2] servefleet: bad\n")
    cmd, kw = calls[0]
    assert cmd == [str(Path(sys.executable).parent / "pyinfra"), "-y", "--json",
                   "--limit", limit_pattern("h1"), "--limit", limit_pattern("h2"),
                   "--sudo", "inv.py", "serve.py"]  # fmt: skip
    assert kw == {"capture_output": True, "text": True}
    assert lines and all(re.fullmatch(r"  h1, h2: pre-warm for [0-4] s", x) for x in lines), lines
    lines.clear()
    r.pyinfra(["h1"], "serve.py")
    assert lines and all(line.startswith("  running for ") for line in lines), lines

    def garbled(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(cmd, 1, "not json", "")

    monkeypatch.setattr(rollout_mod.subprocess, "run", garbled)
    assert r.pyinfra(["h1"], "serve.py")[1] is None


def test_a_batch_never_splits_a_serving_group_and_a_canary_is_a_whole_group() -> None:
    hosts = ["a1", "s1", "a2", "b1", "b2", "s2"]
    group_of = {"a1": "ga", "a2": "ga", "b1": "gb", "b2": "gb"}
    assert batches(hosts, 1, 1, None, group_of) == [["a1", "a2"], ["s1"], ["b1", "b2"], ["s2"]]
    assert batches(hosts, 0, 2, None, group_of) == [["a1", "a2", "s1"], ["b1", "b2", "s2"]]
    assert batches(hosts, 1, None, 50, group_of) == [["a1", "a2"], ["s1", "b1", "b2"], ["s2"]]
    assert batches(hosts, 1, 1, None) == [[h] for h in hosts]  # no groups: one host a unit


def test_max_failures_counts_a_failed_group_once() -> None:
    r = _Fleet(fail={"a1", "a2"}, cold=set())
    r.group_of = {"a1": "ga", "a2": "ga", "b1": "gb", "b2": "gb"}
    assert r.run([["a1", "a2"], ["b1", "b2"]], max_failures=1)  # one group failed: go on
    assert r.results["b1"].result == "ok"
    r = _Fleet(fail={"a1", "b2"}, cold=set())
    r.group_of = {"a1": "ga", "a2": "ga", "b1": "gb", "b2": "gb"}
    assert not r.run([["a1", "a2"], ["b1", "b2"], ["c"]], max_failures=1)
    assert "stopping: 2 failed host(s) or group(s), --max-failures 1" in r.lines
    assert r.results["c"].result == "not reached"


def test_an_error_that_stopped_the_whole_run_is_each_hosts_why() -> None:
    from servefleet.fleet.fleetview import failure

    out = ("--> pyinfra error in /x/errors.py line 41: servefleet: lab1: serve_group 'g1': "
           "serve_hardware on lab2 is 'h100', on lab1 'h200'; allowed: the same\n")  # fmt: skip
    assert failure(out, "lab1") == (False, "lab1: serve_group 'g1': serve_hardware on lab2 is "
                                    "'h100', on lab1 'h200'; allowed: the same")  # fmt: skip
    assert failure(out, "lab3") == (False, "not run: lab1: serve_group 'g1': serve_hardware on "
                                    "lab2 is 'h100', on lab1 'h200'; allowed: the same")  # fmt: skip
    assert failure("", "lab3") == (False, "failed")


class _DeadAtStart(_Fleet):
    """A fleet whose opening status cannot reach the hosts of ``dead``."""

    def __init__(self, dead: set[str], **kw: Any) -> None:
        self.dead = dead
        super().__init__(**kw)

    def _report(self, kind: str, hosts: list[str]) -> dict[str, Any]:
        out = super()._report(kind, hosts)
        for h in set(hosts) & self.dead:
            out[h] = {"unreachable": "timed out", "instances": [{"health": "unreachable"}]}
        return out


def test_a_host_unreachable_at_the_start_fails_in_its_batch_without_a_run() -> None:
    """#50: the opening status found h2 and h4 unreachable: no pyinfra run waits on them again
    (a batch of them alone runs nothing), each counts as a failed host, and neither is asked
    for its release at the end nor settled."""
    r = _DeadAtStart({"h2", "h4"}, fail=set(), cold=set())
    assert not r.run([["h1", "h2"], ["h3"], ["h4"]], max_failures=1)
    assert [hosts for hosts, _, _ in r.runs] == [["h1"], ["h3"]]
    assert r.results["h2"].result == "failed" and r.results["h4"].result == "failed"
    assert r.results["h2"].why == "unreachable at the start (not run): timed out"
    assert r.results["h3"].result == "ok" and r.results["h1"].result == "ok"
    assert "stopped after batch 3/3: 2 failed host(s) (h2, h4)" in r.stopped
    assert all("h2" not in hosts and "h4" not in hosts for kind, hosts in r.reports[1:])


def test_with_room_for_them_the_rest_of_the_fleet_rolls_on() -> None:
    r = _DeadAtStart({"h2"}, fail=set(), cold=set())
    assert r.run([["h1", "h2"], ["h3"]], max_failures=None)  # no limit: not stopped
    assert [hosts for hosts, _, _ in r.runs] == [["h1"], ["h3"]]
    assert [x.result for x in r.results.values()] == ["ok", "failed", "ok"]
