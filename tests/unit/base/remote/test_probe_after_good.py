"""A serving group's rank started since the host's good state was recorded (the probe's
``after_good``): a run killed after it restarted the ranks, before rank 0's gate, left them
ungated, and the next deploy of the same group hash must restart the group and gate it rather than
take it as converged. The probe's rule (a group's rank only, more than a second of slack, no good
state or no start time never flags), and the plan that counts such a rank as not converged."""

from __future__ import annotations

import sys

import pytest
from host_inputs import converged_probe, settings
from repo_paths import REMOTE

from servefleet.hostplan.plan import plan_host

sys.path.insert(0, str(REMOTE))
import probe  # noqa: E402

GOOD_AT = 1_000_000.0  # the good state file's mtime
RANK = {"active": "active", "group": "glm-5.2:abc123"}


@pytest.mark.parametrize(
    ("started", "found", "good_at", "flagged"),
    [
        (GOOD_AT + 1.5, RANK, GOOD_AT, True),  # restarted by a run that died before its gate
        (GOOD_AT + 60, RANK, GOOD_AT, True),
        (GOOD_AT + 1, RANK, GOOD_AT, False),  # within the second of slack
        (GOOD_AT + 0.5, RANK, GOOD_AT, False),
        (GOOD_AT - 30, RANK, GOOD_AT, False),  # started before the good state: it was gated
        (GOOD_AT + 60, {"active": "active", "group": None}, GOOD_AT, False),  # not a group's
        (GOOD_AT + 60, {"active": "active"}, GOOD_AT, False),
        (GOOD_AT + 60, RANK, None, False),  # no good state recorded yet
        (None, RANK, GOOD_AT, False),  # no process
    ],
)
def test_a_rank_started_after_the_good_state_is_flagged(
    started: float | None, found: dict, good_at: float | None, flagged: bool
) -> None:
    assert probe.after_good(started, dict(found), good_at) is flagged


def test_a_unit_flagged_after_good_is_not_converged_and_the_others_are() -> None:
    clean = plan_host(settings(), converged_probe())
    assert clean.converged and all(i.converged for i in clean.instances)
    units = converged_probe()["units"]
    first = next(iter(units))
    units[first] = {**units[first], "after_good": True}
    plan = plan_host(settings(), converged_probe(units=units))
    assert not plan.converged and plan.release_complete
    assert [i.converged for i in plan.instances] == [i.unit != first for i in plan.instances]
    units[first] = {**units[first], "after_good": False}
    assert plan_host(settings(), converged_probe(units=units)).converged
