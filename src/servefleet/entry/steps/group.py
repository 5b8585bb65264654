"""A serving group's converge: the group restarts as one (vLLM is fail-stop: a rank cannot
rejoin a running group, and a headless rank does not exit when the head dies).

pyinfra runs each operation on every host before the next, so the lines here are the group's
order: when any rank does not run what its plan wants (decided at run time, from every rank's
plan), every rank stops, then every rank starts, then rank 0 passes the gate (its ``/health``
and a bounded chat; it comes up only once every rank has joined, so the gate waits with the
first-start timeout). Then every rank records the state as good. A gate that fails rolls the
group back as one: every rank stops, every rank starts its last good state, rank 0 gates it,
and every rank fails, naming the group. A rank that has no plan in the run (refused, failed)
fails the whole group before anything stops.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pyinfra import host, logger
from pyinfra.api import FunctionCommand, operation
from pyinfra.operations import apt, server

from servefleet.base.remote.layout import DESIRED, STATE
from servefleet.entry.steps import units
from servefleet.entry.steps.fleet import run_plan
from servefleet.entry.steps.lib import command
from servefleet.entry.steps.operations import run_with_doc
from servefleet.hostplan.types import HostPlan


def _failed_names(state: Any) -> list[str]:
    return [h.name for h in state.failed_hosts]


def _gate(state: Any, host: Any, plan: HostPlan, what: str) -> bool:  # noqa: F811
    """Run time, on rank 0: the group's gate (``group.py gate``); its outcome is the run's, for
    every rank's next steps. The operation itself passes: the ranks fail together, after the
    roll-back."""
    g = plan.group
    assert g is not None
    run = run_plan(state)
    cmd = command(plan.settings.serve_root, "group.py", "gate", "-")
    ok = run_with_doc(host, cmd, plan.desired_state(), f"the gate of {what} failed")
    if what == "the new state":
        run.gates[g.name] = None if ok else f"rank 0 ({host.name}) did not pass the gate"
    else:
        run.restored[g.name] = ok
        if not ok:
            run.gates[g.name] = f"{run.gates[g.name]}, nor did the last good state"
    return True


@operation(is_idempotent=False)
def gate(plan: HostPlan, what: str):
    """
    Rank 0's gate of the group (its API's ``/health`` and a bounded chat).

    + plan: rank 0's plan
    + what: "the new state" or "the last good state"
    """
    yield FunctionCommand(_gate, (plan, what), {})


def converge(plan: HostPlan) -> None:
    """This host's rank, restarted with the whole group when any rank differs."""
    g = plan.group
    assert g is not None
    run = run_plan()
    name = f"group {g.name}"
    state = host.state

    def missing() -> list[str]:
        return run.group_missing(g.name, _failed_names(state))

    def changing() -> bool:  # decided once for the group, when its first step runs
        if g.name not in run.restarts:
            run.restarts[g.name] = not missing() and run.group_changing(g.name)
        return run.restarts[g.name]

    def passed() -> bool:
        return changing() and run.gates.get(g.name, "") is None

    def failed() -> bool:
        return changing() and bool(run.gates.get(g.name))

    stop = command(plan.settings.serve_root, "group.py", "stop", f"{plan.state_dir}/{DESIRED}")
    start = command(plan.settings.serve_root, "group.py", "start", f"{plan.state_dir}/{DESIRED}")
    restore = command(
        plan.settings.serve_root, "group.py", "restore", f"{plan.settings.serve_root}/{STATE}"
    )
    fail_if(lambda: bool(missing()), lambda: (
        f"serve_group {g.name!r}: {', '.join(missing())} of the group cannot take part in this "
        "run, and a group restarts as one: nothing of it changes"))  # fmt: skip
    if not plan.nft:  # each rank's unit loads its rendezvous guard with nft
        apt.packages(name="Install nftables (the group's rendezvous guard)",
                     packages=["nftables"], update=True, cache_time=3600,
                     no_recommends=True)  # fmt: skip
    units.upload_desired(plan, DESIRED, f"the desired state of rank {g.rank} of {name}", changing)
    server.shell(_if=changing, name=f"Stop every rank of {name}", commands=[stop])
    server.shell(_if=changing, name=f"Start every rank of {name}", commands=[start])
    if g.rank == 0:
        gate(_if=changing, name=f"Gate {name} at rank 0", plan=plan, what="the new state")
    server.shell(_if=passed, name=f"Record {name}'s state as good",
                 commands=[command(plan.settings.serve_root, "group.py", "good",
                                   f"{plan.state_dir}/{DESIRED}")])  # fmt: skip
    server.shell(_if=failed, name=f"Roll back {name}: stop every rank", commands=[stop])
    server.shell(_if=failed, name=f"Roll back {name}: start its last good state",
                 commands=[restore])  # fmt: skip
    if g.rank == 0:
        gate(_if=failed, name=f"Gate {name}'s last good state", plan=plan,
             what="the last good state")  # fmt: skip
    fail_if(failed, lambda: f"serve_group {g.name!r}: {_rolled_back(run, g.name, plan)}")


def _rolled_back(run: Any, name: str, plan: HostPlan) -> str:
    """What became of a group whose gate failed, as the rollout reads it (``rolled back to
    RELEASE`` only when the last good state passed its gate)."""
    why = str(run.gates.get(name))
    if plan.good_release is None:
        return f"{why}; no rank has a good state to go back to: its servers stay stopped"
    if not run.restored.get(name):
        return f"{why}; every rank restarted its last good state ({plan.good_release})"
    return f"{why}; every rank rolled back to {plan.good_release} (the group's last good state)"


@operation(is_idempotent=False)
def _fail(message: Callable[[], str]):
    """
    Fail this host with a message made at run time.

    + message: makes the line
    """
    yield FunctionCommand(_say, (message,), {})


def _say(state: Any, host: Any, message: Callable[[], str]) -> bool:  # noqa: F811
    logger.error(f"{host.print_prefix}servefleet: {host.name}: {message()}")
    return False


def fail_if(when: Callable[[], bool], message: Callable[[], str]) -> None:
    """This host fails, with ``message()``, when ``when()`` is true at run time."""
    _fail(_if=when, name="Check the serving group", message=message)
