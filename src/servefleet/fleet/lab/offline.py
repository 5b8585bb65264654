"""Offline lab hosts (``servefleet lab up --offline HOST``, ``servefleet lab offline HOST``):
the host's network namespace rejects its new connections to the bridge address, so no lab
server (indexes, apt repository, file server) answers it, while connections made *to* it (the
controller's SSH, a probe of its servers) get their replies. An nftables table in that namespace
does it (``nft`` on the machine); the namespace, and so the table, lives as long as the host.
Rejected, not dropped: a fetch fails at once with "connection refused".
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterable
from typing import Any

from servefleet.fleet.lab import layout
from servefleet.fleet.lab.state import LabError, write_state


def ruleset(address: str = layout.BRIDGE_IP) -> str:
    """The nft script that makes a namespace offline (replacing an earlier table of ours).

    + address: the address its new connections may not reach (the lab's servers)
    """
    table = f"inet {layout.OFFLINE_TABLE}"
    return (
        f"table {table}\n"
        f"delete table {table}\n"
        f"table {table} {{\n"
        "  chain output {\n"
        "    type filter hook output priority 0; policy accept;\n"
        f"    ip daddr {address} ct state new meta l4proto tcp reject with tcp reset\n"
        f"    ip daddr {address} ct state new reject with icmpx type admin-prohibited\n"
        "  }\n"
        "}\n"
    )


def _nft(
    netns: str, args: list[str], script: str | None = None
) -> subprocess.CompletedProcess[str]:
    nft = shutil.which("nft")
    if nft is None:
        raise LabError("an offline lab host needs nft (apt-get install nftables; ./setup.sh does)")
    return subprocess.run(
        ["ip", "netns", "exec", netns, nft, *args],
        input=script,
        capture_output=True,
        text=True,
        timeout=30,
    )


def set_offline(netns: str, offline: bool) -> None:
    """Make a host's namespace offline, or online again (idempotent).

    + netns: the host's network namespace (``sf-labN``)
    + offline: True to reject its new connections to the lab's servers, False to allow them
    """
    if offline:
        proc = _nft(netns, ["-f", "-"], ruleset())
    else:
        proc = _nft(
            netns,
            ["-f", "-"],
            f"table inet {layout.OFFLINE_TABLE}\ndelete table inet {layout.OFFLINE_TABLE}\n",
        )
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise LabError(f"nft in {netns} failed: {tail[0]}")


def is_offline(netns: str) -> bool:
    """Whether the namespace holds our offline table now.

    + netns: the host's network namespace
    """
    return _nft(netns, ["list", "table", "inet", layout.OFFLINE_TABLE]).returncode == 0


def check_hosts(names: Iterable[str], hosts: list[str], option: str) -> list[str]:
    """Host names for the offline switch, checked against the lab's hosts; sorted, each once.

    + names: the names given
    + hosts: the lab's host names
    + option: the option or command, for the error
    """
    for name in names:
        if name not in hosts:
            raise LabError(f"{option} names host {name!r}; the lab has {', '.join(hosts)}")
    return sorted(set(names), key=hosts.index)


def offline(state: dict[str, Any], names: Iterable[str], undo: bool = False) -> list[str]:
    """Make lab hosts offline (or, with undo, online again) and record it in the lab state
    (``offline``: the offline hosts' names). Returns the offline hosts after the change.

    + state: the lab state (updated and written)
    + names: host names
    + undo: bring them back online
    """
    hosts = [h["name"] for h in state["hosts"]]
    chosen = check_hosts(names, hosts, "lab offline --undo" if undo else "lab offline")
    by_name = {h["name"]: h for h in state["hosts"]}
    now = set(state.get("offline", []))
    for name in chosen:
        set_offline(by_name[name]["netns"], not undo)
        if undo:
            now.discard(name)
        else:
            now.add(name)
    state["offline"] = [name for name in hosts if name in now]
    write_state(state)
    return state["offline"]
