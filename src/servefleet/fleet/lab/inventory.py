"""The lab fleet as a pyinfra inventory (``servefleet lab up``): every lab host in the group
``lab`` and in the group of its hardware (``cr13``: RBLN NPUs; ``h200``, ``h100``: NVIDIA GPUs;
a group the lab has no host of is empty), and the groups of ``lab up --group GROUP=HOST``, reached as root over SSH with the lab's key and strict
host key checking. The hosts' cards (SKU, device count) are not given as data: a deploy
discovers them. ``inventories/lab.py`` (this repository's and a scaffolded one's) is
``globals().update(lab_inventory())``."""

from __future__ import annotations

from typing import Any

from servefleet.base.errors import ServefleetError
from servefleet.fleet.lab.state import load_state

GROUPS = ("cr13", "h200", "h100")  # always there (empty when the lab has no such host)


def lab_inventory() -> dict[str, Any]:
    """The inventory's groups: ``lab`` (every host, with its SSH data) and one per hardware."""
    try:
        state = load_state()
    except ServefleetError as exc:
        raise SystemExit(f"inventories/lab.py: {exc}") from None
    ssh = {
        "ssh_user": state["ssh"]["user"],
        "ssh_key": state["ssh"]["key"],
        "ssh_known_hosts_file": state["ssh"]["known_hosts"],
        "ssh_strict_host_key_checking": "yes",
        "ssh_connect_retries": 2,
    }
    out: dict[str, Any] = {
        "lab": [(h["name"], dict(ssh, ssh_hostname=h["address"])) for h in state["hosts"]]
    }
    for group in [*GROUPS, *(g for g in state["groups"] if g not in (*GROUPS, "lab"))]:
        members = state["groups"].get(group, [])
        out[group] = [h["name"] for h in state["hosts"] if h["name"] in members]
    return out
