"""What a host exposes on the network, from its plan, in one place (#46 item 1): each port
servefleet makes a process listen on, the address it binds (``*``: every address), and who can
use what there. ``status --json`` gives it per host (``exposes``); ``tests/hosts/test_exposure.py``
holds it to what answers from outside a lab host. sshd, and anything servefleet did not start,
are not in it.

Pure (no pyinfra import).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from servefleet.base.vllm_reference import reference
from servefleet.hostplan.types import HostPlan
from servefleet.kinds.roles import rendezvous_ports
from servefleet.router.plan import LOOPBACK

EVERY = "*"  # every address of the host
LOOPBACK_ONLY = "this host's programs only (loopback)"


@dataclass(frozen=True)
class Listener:
    """One listening port.

    + port: the TCP port
    + address: where it binds (an address, or :data:`EVERY`)
    + what: the process (``servefleet-vllm-0.service``, ``the router's proxy``)
    + to: who can use what through it
    + outside: a connection from a machine outside the fleet gets in
    """

    port: int
    address: str
    what: str
    to: str
    outside: bool = True


def keyed_prefixes(open_paths: tuple[str, ...]) -> list[str]:
    """The paths vLLM's API key guards (the version's routes: the prefixes its key check
    matches) that a request through ``open_paths`` can reach.

    + open_paths: ``serve_open_paths`` (one ending in ``/``: every path under it)
    """
    return [
        prefix
        for prefix in reference().guarded_prefixes
        if any(
            o.startswith(prefix) or (o.endswith("/") and prefix.startswith(o)) for o in open_paths
        )
    ]


def exposes(plan: HostPlan) -> list[dict[str, Any]]:
    """The ports ``plan`` makes listen, by port (see the module's text).

    + plan: the host's plan
    """
    s = plan.settings
    out: list[Listener] = []
    bound = s.instance_host or EVERY
    for inst in () if plan.builder else plan.instances:
        if inst.serves:
            keyed = keyed_prefixes(s.serve_open_paths)
            to = (
                LOOPBACK_ONLY
                if bound == LOOPBACK
                else f"anyone who reaches it: only {' '.join(s.serve_open_paths)} (any other "
                "path 404, the path guard)"
                + (f", {' '.join(keyed)} with the API key when one is set" if keyed else "")
            )
            out.append(Listener(inst.port, bound, inst.unit, to, bound != LOOPBACK))
        if plan.group is not None:
            for port in rendezvous_ports(list(inst.argv)):
                out.append(Listener(port, EVERY, f"{inst.unit} (rendezvous of group "
                                    f"{plan.group.name})", "the group's hosts only (nftables)", False))  # fmt: skip
    if plan.router is not None:
        at = s.serve_host or EVERY
        out.append(Listener(s.serve_router_port, at, "the router's proxy (nginx)",
                            "clients: the OpenAI paths only (vllm-router checks no key; the "
                            "servers behind it do)"))  # fmt: skip
        out.append(Listener(s.serve_router_metrics_port, at, "vllm-router's Prometheus metrics",
                            "anyone who reaches it: read only"))  # fmt: skip
        out.append(Listener(s.serve_router_backend_port, LOOPBACK, "vllm-router",
                            f"root and {s.serve_router_user} only (nftables)", False))  # fmt: skip
        if s.router_fleet:
            out.append(Listener(s.serve_router_admin_port, at, "the router's proxy (nginx)",
                                "the fleet's hosts: the worker API, with the routers' admin "
                                "key"))  # fmt: skip
    return [asdict(x) for x in sorted(out, key=lambda x: (x.port, x.address))]
