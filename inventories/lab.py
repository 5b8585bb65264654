"""pyinfra inventory of the local lab fleet (``servefleet lab up``): every lab host in the group
``lab`` and in the group of its hardware (``cr13``: RBLN NPUs; ``h200``, ``h100``: NVIDIA GPUs;
a group the lab has no host of is empty), reached as root over SSH with the lab's key and strict
host key checking.

The hosts' cards (SKU, device count) are deliberately not given as data: a deploy discovers them.
"""

from __future__ import annotations

from servefleet.errors import ServefleetError
from servefleet.lab.state import load_state

try:
    _state = load_state()
except ServefleetError as _exc:
    raise SystemExit(f"inventories/lab.py: {_exc}") from None

_ssh = {
    "ssh_user": _state["ssh"]["user"],
    "ssh_key": _state["ssh"]["key"],
    "ssh_known_hosts_file": _state["ssh"]["known_hosts"],
    "ssh_strict_host_key_checking": "yes",
    "ssh_connect_retries": 2,
}

lab = [(host["name"], dict(_ssh, ssh_hostname=host["address"])) for host in _state["hosts"]]
_groups = _state["groups"]
cr13 = [host["name"] for host in _state["hosts"] if host["name"] in _groups.get("cr13", [])]
h200 = [host["name"] for host in _state["hosts"] if host["name"] in _groups.get("h200", [])]
h100 = [host["name"] for host in _state["hosts"] if host["name"] in _groups.get("h100", [])]
