#!/usr/bin/env python3
"""servefleet group: one rank of a serving group (one model across several hosts). Runs ON THE
HOST, as root, with the system python3 (stdlib only), next to ``instances.py``.

usage: group.py stop STATE.json      # stop this host's servers: the group's restart begins
       group.py start STATE.json     # unit files as the state says, this rank started (no gate)
       group.py gate -               # rank 0: the group's gate (state on stdin)
       group.py good STATE.json      # the group passed its gate: this state is the good one
       group.py restore STATE_DIR    # this rank's last good state started (no gate)

A group restarts as one, in steps the controller runs on every rank before the next (vLLM is
fail-stop: a rank cannot rejoin a running group, and a headless rank does not exit when the
head dies): every rank stops, every rank starts, rank 0 gates. So ``start`` never waits for
the others: a rank's server waits for the rendezvous itself, and only rank 0's ``/health``,
which comes up once every rank has joined, says the group serves (``gate``, with the
first-start timeout), and only then puts rank 0 back in the fleet routers' rotation, which
``stop`` took it out of: the group leaves and rejoins it as one worker. ``good`` then records
the state on every rank (``good.json`` and the kept unit texts, as ``instances.py converge``
does); after a failed gate ``restore`` starts each rank's good state again, and rank 0 gates
it. Each step can be interrupted and re-run.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import health  # noqa: E402  (next to this file on the host)
import instances  # noqa: E402
import layout  # noqa: E402
import rotation  # noqa: E402
import state_files  # noqa: E402
import systemd_units  # noqa: E402

UNIT_DIR = Path(layout.UNIT_DIR)


def ours() -> list[str]:
    """Our server units on this host (the files servefleet wrote)."""
    return sorted(p.name for p in UNIT_DIR.glob(layout.UNIT_GLOB))


def rotate(state: dict[str, Any], verb: str) -> None:
    """Take this rank's workers (rank 0's API: the group is one worker) out of the fleet's
    routers' rotation (``remove``), or put them back (``add``)."""
    workers = [str(i["worker"]) for i in state["instances"] if i.get("worker")]
    for admin in state.get("routers") or []:
        for worker in workers:
            rotation.router_call(admin, verb, worker)


def stop(state: dict[str, Any]) -> None:
    """Stop every server of ours on this host (a rank's, and any other left from before), rank
    0's out of the routers' rotation first."""
    rotate(state, "remove")
    units = sorted({*ours(), *(i["unit"] for i in state["instances"])})
    for unit in units:
        systemd_units.systemctl("stop", unit, check=False)
    systemd_units.log(f"stopped {', '.join(units) or 'nothing'} (group {state['group']['name']})")


def start(state: dict[str, Any]) -> None:
    """This rank's unit files as ``state`` says, its servers started (no gate: the group's
    gate is rank 0's), and the units no longer wanted removed."""
    systemd_units.write_units(state)
    wanted = {i["unit"] for i in state["instances"]}
    for unit in [u for u in ours() if u not in wanted]:
        systemd_units.systemctl("disable", "--now", "--quiet", unit, check=False)
        (UNIT_DIR / unit).unlink()
        systemd_units.log(f"{unit}: removed (not a server of this rank)")
    systemd_units.systemctl("daemon-reload")
    for inst in state["instances"]:
        systemd_units.systemctl("enable", "--quiet", "--no-reload", inst["unit"])
        systemd_units.systemctl("restart", inst["unit"])
        group = state["group"]
        systemd_units.log(f"{inst['unit']}: started, rank {group['rank']} of group {group['name']}")


def gate(state: dict[str, Any]) -> None:
    """Rank 0's gate: its API's ``/health`` and a bounded chat, with the first-start timeout
    (the group comes up only once every rank has joined)."""
    for inst in state["instances"]:
        if inst.get("serves") is False:
            continue
        why = health.check(
            inst["unit"],
            inst["port"],
            state["model"],
            state["prewarm_timeout"],
            state.get("host") or "127.0.0.1",
            answered_timeout=state["health_timeout"],
        )
        if why is not None:
            raise systemd_units.Failed(
                f"health gate: {inst['unit']}: {why}", health.journal_tail(inst["unit"])
            )
        systemd_units.log(f"{inst['unit']}: the group serves on port {inst['port']}")
    rotate(state, "add")  # back in the routers' rotation once the group serves


def good(state_dir: Path, state: dict[str, Any]) -> None:
    """The state passed the group's gate: its units kept, it becomes ``good.json``."""
    state_files.keep_units(state_dir, state)
    state_files.record_good(state_dir, state)
    state_files.clean_up(state_dir)


def restore(state_dir: Path) -> None:
    """This rank's last good state: its kept unit texts written and started (no gate)."""
    target = state_files.load(state_dir / layout.GOOD)
    if target is None:
        systemd_units.log("no good state on this host: its servers stay stopped")
        return
    kept = state_files.kept_instances(state_dir, target)
    start({**target, "instances": kept, "group": target.get("group") or {"name": "-", "rank": "-"}})
    state_files.point_current(state_dir.parent, target["release"])


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("stop", "start", "gate", "good", "restore"):
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    command, arg = argv
    try:
        if command == "gate" and arg == "-":
            gate(json.load(sys.stdin))
            return 0
        if command == "restore":
            with state_files.state_lock(Path(arg)):
                restore(Path(arg))
            return 0
        path = Path(arg)
        state = json.loads(path.read_text())
        with state_files.state_lock(path.parent):
            {"stop": stop, "start": start}.get(command, lambda s: good(path.parent, s))(state)
    except systemd_units.Failed as failure:
        instances.report(failure)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
