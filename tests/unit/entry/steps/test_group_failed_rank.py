"""A serving group's restart stops when one of its ranks failed earlier in the run
(``entry/steps/group.py`` ``converge``: ``missing()`` is ``FleetPlan.group_missing`` with
pyinfra's failed hosts), since a group restarts as one and a rank cannot rejoin. Issue #52
bug 6: with the failed hosts no longer passed (``run.group_missing(g.name)``) or no longer
counted (``group_missing`` without ``or h in failed``), the group restarted without that rank;
``test_a_rank_that_failed_earlier_stops_the_groups_restart`` failed on both bugs, and
``test_group_missing_names_a_rank_that_failed_since`` on the second.

The step runs without pyinfra: its operations are recorded with their ``_if`` (what pyinfra
would decide at run time), on a fleet plan of two H200 ranks whose plans are stand-ins."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
from group_inputs import fleet

from servefleet.entry.steps import group


def _run(*changed: str) -> Any:
    """The fleet plan of group g1 (h1 rank 0, h2 rank 1), each rank planned: ``changed`` ranks
    do not run what their plans want."""
    f = fleet(("h1", {}), ("h2", {}))
    for h in ("h1", "h2"):
        f.plans[h] = SimpleNamespace(converged=h not in changed)  # type: ignore[assignment]
    return f


def test_group_missing_names_a_rank_that_failed_since() -> None:
    f = _run("h1")
    assert f.group_missing("g1") == []
    assert f.group_missing("g1", ["h2"]) == ["h2"]
    assert f.group_missing("g1", ["other"]) == []
    del f.plans["h1"]  # refused, or failed while planned
    assert f.group_missing("g1", ["h2"]) == ["h1", "h2"]


Ops = list[tuple[str, Callable[[], bool] | None]]


def _converge(monkeypatch: pytest.MonkeyPatch, f: Any, rank: str, failed: list[str]) -> Ops:
    """``group.converge`` of ``rank``'s plan in a run where ``failed`` hosts failed so far:
    each operation's name and its ``_if`` (None: always), in order."""
    ops: Ops = []

    def record(**kw: Any) -> None:
        ops.append((kw["name"], kw.get("_if")))
        if "message" in kw:
            f.messages.append(kw["message"])

    state = SimpleNamespace(failed_hosts=[SimpleNamespace(name=h) for h in failed])
    monkeypatch.setattr(group, "host", SimpleNamespace(state=state, name=rank))
    monkeypatch.setattr(group, "run_plan", lambda *a: f)
    for op in ("_fail", "gate"):
        monkeypatch.setattr(group, op, record)
    monkeypatch.setattr(group.server, "shell", record)
    monkeypatch.setattr(group.apt, "packages", record)
    monkeypatch.setattr(group.units, "upload_desired", lambda *a: None)
    settings = SimpleNamespace(serve_root="/opt/servefleet")
    plan = SimpleNamespace(group=f.group("g1").place(rank), settings=settings,
                           state_dir="/opt/servefleet/state", nft=True,
                           good_release="r0")  # fmt: skip
    group.converge(plan)  # type: ignore[arg-type]
    return ops


def _decide(ops: Ops, name: str, nth: int = 0) -> bool:
    """What pyinfra decides at run time for the ``nth`` operation named ``name``."""
    when = [w for n, w in ops if n == name][nth]
    return True if when is None else when()


def test_a_rank_that_failed_earlier_stops_the_groups_restart(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    f = _run("h1")
    f.messages = []
    ops = _converge(monkeypatch, f, "h1", failed=["h2"])
    assert not _decide(ops, "Stop every rank of group g1")
    assert not _decide(ops, "Start every rank of group g1")
    assert not _decide(ops, "Gate group g1 at rank 0")
    assert f.restarts == {"g1": False}
    assert _decide(ops, "Check the serving group")  # the rank fails, naming the rank missing
    assert not _decide(ops, "Check the serving group", 1)  # no gate failed: nothing rolled back
    assert f.messages[0]().startswith("serve_group 'g1': h2 of the group cannot take part")


def test_a_group_whose_ranks_all_stand_restarts_as_one(monkeypatch: pytest.MonkeyPatch) -> None:
    f = _run("h1")
    f.messages = []
    ops = _converge(monkeypatch, f, "h1", failed=["elsewhere"])
    assert _decide(ops, "Stop every rank of group g1")
    assert _decide(ops, "Start every rank of group g1")
    assert f.restarts == {"g1": True}
    assert not _decide(ops, "Check the serving group")
    assert [n for n, _ in ops].count("Check the serving group") == 2
