"""``Rollout.analysed`` (fleet/rollout.py) on its own, with a recording status report and
pyinfra: which statuses the canary analysis asks for (``status`` of the canary hosts that passed
and the next hosts; none when there is no host to ask about), what counts as a canary that
changed what it runs (its release, or any instance's unit or running unit sha: rolled back) and
what does not (the same: left), the halting lines naming every host, and a rollback run without
results (mutants of the mutation campaign, #37, that test_rollout_analysis.py's scripted fleet
let through)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from servefleet.fleet.analysis.canary import Outcome
from servefleet.fleet.rollout import HostResult, Rollout

DEPLOY = "/fleet/deploys/serve.py"
ROLLBACK = "/fleet/deploys/rollback.py"
HALT = Outcome(False, "analysis: itl_p50: canary 9.0 ms, baseline 6.0 ms (50% longer)")


def status(release: str = "r1", *instances: tuple[str, str]) -> dict[str, Any]:
    return {"release": release, "instances": [{"unit": u, "running": sha} for u, sha in instances]}


BEFORE = status("r1", ("u0", "a"), ("u1", "b"))


class Recorded:
    """A Rollout whose status report answers ``now`` and whose pyinfra answers ``rollback``,
    each call recorded."""

    def __init__(
        self,
        hosts: Sequence[str],
        now: dict[str, Any],
        rollback: tuple[int, dict[str, Any] | None, str] = (0, {"failed_hosts": []}, ""),
    ) -> None:
        self.asked: list[tuple[str, list[str]]] = []
        self.runs: list[tuple[list[str], str]] = []
        self.lines: list[str] = []
        self.now, self.rollback = now, rollback
        self.rollout = Rollout(inventory="inv.py", deploy=DEPLOY, pyinfra_args=[],
                               report=self.report, echo=self.lines.append,
                               analyse=lambda ok, rest, statuses: HALT)  # fmt: skip
        self.rollout.pyinfra = self.pyinfra  # type: ignore[method-assign]
        self.rollout.results = {h: HostResult(result="ok") for h in hosts}

    def report(self, kind: str, hosts: list[str]) -> dict[str, Any]:
        self.asked.append((kind, list(hosts)))
        return {h: self.now[h] for h in hosts if h in self.now}

    def pyinfra(
        self, hosts: list[str], deploy: str, compiling: Sequence[str] = ()
    ) -> tuple[int, dict[str, Any] | None, str]:
        self.runs.append((list(hosts), deploy))
        return self.rollback


def test_the_status_of_the_canary_and_the_next_hosts_is_asked() -> None:
    r = Recorded(["c1", "c2"], {h: BEFORE for h in ("c1", "c2", "n1")})
    assert not r.rollout.analysed(["c1", "c2"], {"c2"}, [["n1"]], {"c1": BEFORE})
    assert r.asked == [("status", ["c1", "n1"])]


def test_no_status_is_asked_of_no_host() -> None:
    """Every canary host failed its gate and no host is left: nothing to ask about."""
    r = Recorded(["c1"], {})
    assert not r.rollout.analysed(["c1"], {"c1"}, [], {})
    assert r.asked == [] and r.runs == []


def test_a_canary_unchanged_with_no_host_left_is_not_rolled_back() -> None:
    r = Recorded(["c1"], {"c1": BEFORE})
    assert not r.rollout.analysed(["c1"], set(), [], {"c1": BEFORE})
    assert r.asked == [("status", ["c1"])] and r.runs == []
    assert "halting: c1 already ran this before: nothing to roll back" in r.lines
    assert (r.rollout.results["c1"].result, r.rollout.results["c1"].why) == ("failed", HALT.why)


@pytest.mark.parametrize(
    ("now", "changed"),
    [
        (BEFORE, False),
        (status("r2", ("u0", "a"), ("u1", "b")), True),  # another release
        (status("r1", ("u0", "a"), ("u1", "c")), True),  # an instance runs another unit
        (status("r1", ("u0", "a"), ("u2", "b")), True),  # another instance's unit
        (status("r1", ("u0", "a")), True),  # an instance fewer
    ],
    ids=["same", "release", "running", "unit", "instances"],
)
def test_what_counts_as_a_canary_that_changed(now: dict[str, Any], changed: bool) -> None:
    r = Recorded(["c1"], {"c1": now})
    assert not r.rollout.analysed(["c1"], set(), [], {"c1": BEFORE})
    assert r.runs == ([(["c1"], ROLLBACK)] if changed else [])
    assert r.rollout.results["c1"].rolled_back is changed


def test_the_halting_lines_name_every_host() -> None:
    changed = status("r2", ("u0", "x"))
    now = {"c1": changed, "c2": changed, "c3": BEFORE, "c4": BEFORE}
    r = Recorded(list(now), now)
    assert not r.rollout.analysed(list(now), set(), [], {h: BEFORE for h in now})
    assert r.lines[-2:] == [
        "halting: rolling the canary back on c1, c2",
        "halting: c3, c4 already ran this before: nothing to roll back",
    ]


def test_a_rollback_run_without_results_rolled_nothing_back() -> None:
    """pyinfra printed no JSON (it stopped early): no changed host counts as rolled back."""
    lost = (1, None, "[c1] Could not connect (timed out)\n")
    r = Recorded(["c1"], {"c1": status("r2", ("u0", "x"))}, rollback=lost)
    assert not r.rollout.analysed(["c1"], set(), [], {"c1": BEFORE})
    c1 = r.rollout.results["c1"]
    assert not c1.rolled_back
    assert c1.why == f"{HALT.why}; its rollback failed: Could not connect (timed out)"
