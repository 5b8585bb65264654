"""``servefleet rollout --analysis`` in Rollout (fleet/rollout.py), with a scripted pyinfra and
status report (no pyinfra, no lab) and a scripted analysis: after the canary batch passes its
gates the analysis is asked about the canary hosts that passed and the hosts not yet upgraded;
a pass promotes (the other batches run), a failure halts: the canary that changed is rolled back
as ``servefleet rollback`` does (rollback.py beside the deploy), the other hosts untouched, each
canary host failed with the analysis' line; its report rides on the probed host's result."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from servefleet.fleet.analysis.canary import Outcome
from servefleet.fleet.rollout import Rollout

DEPLOY = "/fleet/deploys/serve.py"
ROLLBACK = "/fleet/deploys/rollback.py"


class _Fleet(Rollout):
    """A Rollout whose hosts run unit sha ``old`` until a serve.py run reaches them (then
    ``new``; a rollback.py run brings back ``old``) and whose analysis answers ``outcome``."""

    def __init__(self, outcome: Outcome, rollback_fails: bool = False) -> None:
        self.outcome, self.rollback_fails = outcome, rollback_fails
        self.runs: list[tuple[list[str], str]] = []
        self.asked: list[tuple[list[str], list[str], dict[str, Any]]] = []
        self.lines: list[str] = []
        self.sha: dict[str, str] = {}
        super().__init__(inventory="inv.py", deploy=DEPLOY, pyinfra_args=[], report=self._report,
                         echo=self.lines.append, analyse=self._analyse)  # fmt: skip

    def _report(self, kind: str, hosts: list[str]) -> dict[str, Any]:
        return {h: {"release": "r2" if self.sha.get(h) == "new" else "r1", "address": h,
                    "instances": [{"unit": "u0", "port": 8000, "health": "ok",
                                   "running": self.sha.get(h, "old")}]} for h in hosts}  # fmt: skip

    def _analyse(self, ok: list[str], rest: list[str], statuses: dict[str, Any]) -> Outcome:
        self.asked.append((ok, rest, statuses))
        return self.outcome

    def pyinfra(
        self, hosts: list[str], deploy: str, compiling: Sequence[str] = ()
    ) -> tuple[int, dict[str, Any] | None, str]:
        self.runs.append((list(hosts), deploy))
        if deploy == ROLLBACK and self.rollback_fails:
            return 1, {"failed_hosts": hosts}, "".join(f"[{h}] servefleet: {h}: no previous "
                                                       "state\n" for h in hosts)  # fmt: skip
        for h in hosts:
            self.sha[h] = "old" if deploy == ROLLBACK else "new"
        return 0, {"failed_hosts": []}, ""


PLAN = [["h1"], ["h2", "h3"], ["h4"]]
SLOWER = Outcome(False, "analysis: ttft_p50: canary 65.0 ms, baseline 50.0 ms (30% longer)",
                 ["analysis: the table"], "h1", {"passed": False, "failed": ["ttft_p50"]})  # fmt: skip


def test_a_passing_analysis_promotes_the_canary() -> None:
    r = _Fleet(Outcome(True, "", ["the table"], "h1", {"passed": True}))
    assert r.run(PLAN, max_failures=0)
    assert r.runs == [(["h1"], DEPLOY), (["h2", "h3"], DEPLOY), (["h4"], DEPLOY)]
    (ok, rest, statuses), = r.asked  # fmt: skip
    assert (ok, rest) == (["h1"], ["h2", "h3", "h4"]) and sorted(statuses) == [
        "h1",
        "h2",
        "h3",
        "h4",
    ]
    assert statuses["h1"]["instances"][0]["running"] == "new"  # after the canary batch
    assert statuses["h2"]["instances"][0]["running"] == "old"
    assert r.results["h1"].analysis == {"passed": True}
    assert all(r.results[h].analysis is None for h in ("h2", "h3", "h4"))
    assert "the table" in r.lines and "analysis passed: the rollout goes on" in r.lines
    assert r.lines.index("analysis passed: the rollout goes on") < r.lines.index(
        "batch 2/3: h2, h3"
    )


def test_a_failing_analysis_halts_and_rolls_the_canary_back() -> None:
    r = _Fleet(SLOWER)
    assert not r.run(PLAN, max_failures=5)  # whatever --max-failures allows
    assert r.runs == [(["h1"], DEPLOY), (["h1"], ROLLBACK)]  # the others untouched
    h1 = r.results["h1"]
    assert (h1.result, h1.rolled_back, h1.why) == ("failed", True, SLOWER.why)
    assert (h1.release_before, h1.release_after) == ("r1", "r1")
    assert h1.analysis == {"passed": False, "failed": ["ttft_p50"]}
    assert all(r.results[h].result == "not reached" for h in ("h2", "h3", "h4"))
    assert all(r.results[h].release_after is None for h in ("h2", "h3", "h4"))
    assert r.lines[2:] == ["analysis: the table", SLOWER.why,
                           "halting: rolling the canary back on h1"]  # fmt: skip


def test_a_canary_that_ran_the_change_before_is_not_rolled_back() -> None:
    r = _Fleet(SLOWER)
    r.sha["h1"] = "new"  # the deploy changed nothing on it: its previous state is older still
    assert not r.run(PLAN, max_failures=0)
    assert r.runs == [(["h1"], DEPLOY)]
    assert "halting: h1 already ran this before: nothing to roll back" in r.lines
    assert (r.results["h1"].result, r.results["h1"].rolled_back) == ("failed", False)


def test_a_rollback_that_fails_is_named() -> None:
    r = _Fleet(SLOWER, rollback_fails=True)
    assert not r.run(PLAN, max_failures=0)
    h1 = r.results["h1"]
    assert not h1.rolled_back
    assert h1.why == SLOWER.why + "; its rollback failed: h1: no previous state"


def test_a_canary_group_is_rolled_back_whole_and_no_baseline_halts() -> None:
    r = _Fleet(Outcome(False, "analysis: no baseline: the canary is every host"))
    r.group_of = {"a1": "ga", "a2": "ga"}
    assert not r.run([["a1", "a2"]], max_failures=0)
    assert r.asked[0][:2] == (["a1", "a2"], [])
    assert r.runs == [(["a1", "a2"], DEPLOY), (["a1", "a2"], ROLLBACK)]
    assert r.results["a2"].why == "analysis: no baseline: the canary is every host"


def test_a_canary_host_that_failed_its_gate_is_not_asked_about() -> None:
    r = _Fleet(Outcome(True, "", [], "h2", {"passed": True}))
    runs = r.pyinfra

    def gate_fails_on_h1(hosts: list[str], deploy: str, compiling: Sequence[str] = ()) -> Any:
        runs(hosts, deploy, compiling)
        failed = ["h1"] if "h1" in hosts and deploy == DEPLOY else []
        return (1 if failed else 0), {"failed_hosts": failed}, "[h1] servefleet: h1: gate\n"

    r.pyinfra = gate_fails_on_h1  # type: ignore[method-assign]
    assert r.run([["h1", "h2"], ["h3"]], max_failures=1)
    assert r.asked[0][:2] == (["h2"], ["h3"])
    assert r.results["h2"].analysis == {"passed": True} and r.results["h3"].result == "ok"


def test_the_baseline_is_one_of_the_next_few_hosts_however_large_the_fleet() -> None:
    r = _Fleet(Outcome(True, "", [], "h0", {"passed": True}))
    hosts = [f"h{i}" for i in range(50)]
    assert r.run([hosts[:1], hosts[1:]], max_failures=0)
    ok, rest, statuses = r.asked[0]
    assert rest == ["h1", "h2", "h3", "h4"] and sorted(statuses) == ["h0", "h1", "h2", "h3", "h4"]


def test_without_analysis_nothing_is_asked() -> None:
    r = _Fleet(SLOWER)
    r.analyse = None
    assert r.run(PLAN, max_failures=0) and r.asked == [] and len(r.runs) == 3
