"""An instance restarted through its health gate. Runs ON THE HOST, as root, with the system
python3 (stdlib only), next to ``instances.py`` and ``health.py``.

Before a restart, our other servers holding the instance's port or devices are stopped; after
it, the instance must pass ``health.check`` within ``health_timeout`` (``prewarm_timeout`` while
its compile fingerprint is cold, or when it compiles nothing and loads from scratch), and a cold
one is then marked warm. Prefill/decode pairs are re-checked after a restart: each decode takes
one request from each prefill, as the router sends it.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fault_point  # noqa: E402  (next to this file on the host)
import health  # noqa: E402
import systemd_units  # noqa: E402
import warm_state  # noqa: E402


def make_room(state: dict[str, Any], inst: dict[str, Any]) -> None:
    """Stop our other servers that hold this instance's port or any of its devices."""
    wanted = set(filter(None, str(inst["devices"]).split(",")))
    for unit, now in systemd_units.live(state["devices_env"]).items():
        if unit == inst["unit"] or now["active"] not in ("active", "activating", "reloading"):
            continue
        if now["port"] == inst["port"] or now["devices"] & wanted:
            systemd_units.log(
                f"stopping {unit}: it holds port {now['port']} / devices "
                f"{','.join(sorted(now['devices'])) or '-'} that {inst['unit']} needs"
            )
            systemd_units.systemctl("stop", unit)


def start_through_gate(state: dict[str, Any], inst: dict[str, Any], restart: bool) -> None:
    cold = warm_state.is_cold(state, inst)
    # a server that compiles nothing (GPU) loads from scratch at every start
    slow = cold or inst["fingerprint"] == "-"
    timeout = state["prewarm_timeout"] if slow else state["health_timeout"]
    started = time.time() - 1
    if restart:
        make_room(state, inst)
        # --no-reload: the restart reads the unit (bring_to reloaded a changed file) and boot reads
        # the link; a reload here, at every restart, cost each instance of a rollout 0.15-0.3 s
        # (bring_to reloads once at its end where systemd then asks for one)
        systemd_units.systemctl("enable", "--quiet", "--no-reload", inst["unit"])
        systemd_units.systemctl("restart", inst["unit"])
        systemd_units.log(
            f"{inst['unit']}: restarted ({'cold: compiling, ' if cold else ''}gate {timeout}s)"
        )
        fault_point.barrier(f"restarted-{inst['unit']}-{inst['fingerprint']}")  # tests' fault point
    else:
        systemd_units.log(f"{inst['unit']}: runs its unit; resuming the pre-warm (gate {timeout}s)")
    why = health.check(
        inst["unit"],
        inst["port"],
        state["model"],
        timeout,
        state.get("host") or "127.0.0.1",
        answered_timeout=state["health_timeout"],
    )
    if why is not None:
        raise systemd_units.Failed(
            f"health gate: {inst['unit']}: {why}", health.journal_tail(inst["unit"])
        )
    if cold:
        dirs = warm_state.bundle_dirs(state, inst["unit"], started)
        warm_state.mark_warm(state, inst["fingerprint"], dirs)
    systemd_units.log(f"{inst['unit']}: healthy on port {inst['port']}")


def recheck_peers(state: dict[str, Any], prefills: list[str]) -> None:
    """After a prefill or a decode restarted: each decode of this host takes one request from
    each prefill in ``prefills`` (their base URLs), as the router sends it
    (:func:`health.pd_probe`). A decode that cannot read from one (NIXL can keep a restarted
    peer's old state) restarts through its gate, and must then pass."""
    first = state["instances"][0]["unit"] if state["instances"] else None
    key = health.api_key(health.unit_state(first)) if first else None

    def failing(decode: dict[str, Any]) -> str | None:
        for prefill in prefills:
            why = health.pd_probe(prefill, str(decode["worker"]), state["model"],
                                  state["health_timeout"], key)  # fmt: skip
            if why is not None:
                return why
        return None

    for inst in state["instances"]:
        if inst.get("role") != "decode" or not inst.get("worker") or not prefills:
            continue
        why = failing(inst)
        if why is not None:
            systemd_units.log(f"{inst['unit']}: a request through prefill and decode failed "
                              f"({why}): restarting it")  # fmt: skip
            start_through_gate(state, inst, True)
            why = failing(inst)
            if why is not None:
                raise systemd_units.Failed(f"{inst['unit']}: prefill/decode re-check: {why}")
        systemd_units.log(
            f"{inst['unit']}: a request from each of {len(prefills)} prefill(s) passed"
        )
