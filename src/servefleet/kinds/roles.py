"""Serving roles: one server (``main``), or prefill/decode disaggregation behind a router.

Both recipe families resolve a prefill/decode selection the same way: a ``prefill`` server and
a ``decode`` server (argv and env each, one pool node each), and the ``vllm-router`` command in
P/D mode in front of them, as vLLM's recipes site prints it for ``pd_cluster``. What only a
placement knows stays symbolic at resolve time, spelled as the site's shell variables
(:data:`PLACEHOLDER`): the pool nodes' addresses (``$PREFILL_NODE_<i>``, ``$DECODE_NODE_<i>``,
which also name the NIXL side-channel hosts), a DEP pool's coordinator port
(``$PREFILL_DP_RPC_PORT``, ``$DECODE_DP_RPC_PORT``) and the router's own address
(``$ROUTER_HOST``, ``$ROUTER_PORT``). :func:`bind` fills them in per host; a deploy refuses a
selection it cannot place yet (:func:`deployable`).

A group spanning several hosts (a vLLM multi-node strategy: one server per rank) holds the
site's two placeholders of a multi-node command: ``$HEAD_IP`` (rank 0's address: the
rendezvous and DP coordinator host) and ``$IFACE_NAME`` (the interface NCCL and Gloo use); a
host plan binds them with :func:`bind_group`. Pure.
"""

from __future__ import annotations

import ipaddress
import re
import shlex
from collections.abc import Mapping
from dataclasses import replace

from servefleet.base.errors import RecipeError
from servefleet.base.vllm_reference import reference
from servefleet.spec import Server, ServeSpec

MAIN = "main"
PREFILL = "prefill"
DECODE = "decode"
PD_ROLES = (PREFILL, DECODE)
COMPANION = "companion-"  # the role prefix of a helper process beside a server

# vllm-router's --policy values (vllm-project/router, docs/load_balancing)
ROUTER_POLICIES = ("round_robin", "random", "consistent_hash", "power_of_two", "cache_aware")
ROUTER = "vllm-router"
VLLM_DEFAULT_PORT = "8000"  # what vllm serve listens on without --port

# A group's placeholders (the site's multi-node commands): rank 0's address, the NCCL/Gloo NIC.
HEAD_IP = "HEAD_IP"
IFACE_NAME = "IFACE_NAME"
GROUP_PLACEHOLDERS = (HEAD_IP, IFACE_NAME)
# The ports a group's ranks listen on for each other, by the flag that moves each ("": none):
# torch.distributed's TCPStore, the DP coordinator's handshake and the DP process group's store,
# a fact of the vLLM version (its reference data, base/vllm_reference.py)
RENDEZVOUS_PORTS = reference().rendezvous_ports

# The placeholders a resolved selection may hold, as the recipes site names them.
PLACEHOLDER = re.compile(
    r"\$((?:PREFILL|DECODE)_NODE_[1-9][0-9]{0,2}|(?:PREFILL|DECODE)_DP_RPC_PORT"
    r"|ROUTER_HOST|ROUTER_PORT|HEAD_IP|IFACE_NAME)(?![A-Za-z0-9_])"
)
_SHELL_SAFE = re.compile(r"[A-Za-z0-9_./=:@,+%-]*\Z")  # a piece the shell takes as it is
# What a bound placeholder may become: a host name, an address or a port (never shell words).
_BOUND = re.compile(r"[A-Za-z0-9][A-Za-z0-9.:_-]{0,252}\Z|\[[0-9A-Fa-f:.]{2,45}\]\Z")
# A host name (RFC 1123 labels); its last label is not all digits (that is a bad IPv4 address).
_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\Z")
# A network interface as Linux names one: at most 15 bytes (IFNAMSIZ), no '/', ':' or space
# (the set here: letters, digits and . _ -, as ip-link names them: eth0, ens5f0np0, br-lab.10).
IFACE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,14}\Z")
HOST_ALLOWED = (
    "an IPv4 or IPv6 address (bare, no brackets) or a host name (letters, digits, - and .)"
)
IFACE_ALLOWED = "an interface name: 1-15 letters, digits and . _ - (eth0, ens5f0np0)"


def node(role: str, i: int = 1) -> str:
    """The placeholder of a pool's ``i``-th node (1-based): ``$PREFILL_NODE_1``.

    + role: ``prefill`` or ``decode``
    + i: the node of the pool, from 1
    """
    return f"${role.upper()}_NODE_{i}"


def dp_rpc_port(role: str) -> str:
    """The placeholder of a DEP pool's coordinator port: ``$PREFILL_DP_RPC_PORT``."""
    return f"${role.upper()}_DP_RPC_PORT"


def last_value(argv: list[str], flag: str) -> str | None:
    """The value vLLM's parser gives ``flag`` in an argv (its last ``--flag V`` or ``--flag=V``).

    + argv: the server's argv
    + flag: the long flag (``--port``)
    """
    value = None
    for i, tok in enumerate(argv):
        if tok == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif tok.startswith(flag + "="):
            value = tok[len(flag) + 1 :]
    return value


def pd_router(policy: str, prefill: Server, decode: Server, intra_dp: int = 1) -> list[str]:
    """The ``vllm-router`` argv in P/D mode in front of one prefill and one decode pool node,
    as the recipes site prints it: each pool's first node on its server's ``--port``.

    + policy: one of :data:`ROUTER_POLICIES`
    + prefill: the prefill server
    + decode: the decode server
    + intra_dp: ``--intra-node-data-parallel-size`` (a DEP pool's local ranks, else 1)
    """
    pport = last_value(prefill.argv, "--port") or VLLM_DEFAULT_PORT
    dport = last_value(decode.argv, "--port") or VLLM_DEFAULT_PORT
    return [
        ROUTER,
        "--policy",
        policy,
        "--vllm-pd-disaggregation",
        "--prefill",
        f"http://{node(PREFILL)}:{pport}",
        "--decode",
        f"http://{node(DECODE)}:{dport}",
        "--host",
        "$ROUTER_HOST",
        "--port",
        "$ROUTER_PORT",
        "--intra-node-data-parallel-size",
        str(intra_dp),
    ]


def shell_word(text: str) -> str:
    """One argv word or env value quoted for a POSIX shell, its placeholders left bare for the
    shell to expand (``http://$PREFILL_NODE_1:8001``), the rest quoted as ``shlex.quote``
    quotes it.

    + text: the word
    """
    out, at = [], 0
    for m in PLACEHOLDER.finditer(text):
        out += [_quoted(text[at : m.start()]), m.group(0)]
        at = m.end()
    if not out:
        return shlex.quote(text)
    return "".join([*out, _quoted(text[at:])])


def _quoted(piece: str) -> str:
    return piece if _SHELL_SAFE.match(piece) else shlex.quote(piece)


def serving_roles(spec: ServeSpec) -> list[str]:
    """The roles of a spec's servers that serve requests (companions are helpers beside one)."""
    return [s.role for s in spec.servers if not s.role.startswith(COMPANION)]


def placeholders(spec: ServeSpec) -> list[str]:
    """The placeholders a spec holds (names without ``$``), sorted.

    + spec: a resolved spec
    """
    texts = [*spec.router]
    for s in spec.servers:
        texts += [*s.argv, *s.env.values()]
    return sorted({m.group(1) for t in texts for m in PLACEHOLDER.finditer(t)})


def bind(spec: ServeSpec, values: Mapping[str, str]) -> ServeSpec:
    """The spec with its placeholders replaced by their values (argv, env and router).

    + spec: a resolved spec
    + values: placeholder name (``PREFILL_NODE_1``) -> a host, address or port; every
      placeholder the spec holds must have one
    """
    missing = [p for p in placeholders(spec) if p not in values]
    if missing:
        raise RecipeError(
            f"{spec.recipe}: no value for {', '.join('$' + p for p in missing)}; allowed: a "
            "host, address or port for each placeholder the selection holds"
        )
    for name, value in values.items():
        problem = _value_problem(name, str(value))
        if problem:
            raise RecipeError(f"{spec.recipe}: ${name}={str(value)[:60]!r} {problem}")

    def sub(text: str) -> str:
        return PLACEHOLDER.sub(lambda m: str(values.get(m.group(1), m.group(0))), text)

    servers = [
        replace(s, argv=[sub(a) for a in s.argv], env={k: sub(v) for k, v in s.env.items()})
        for s in spec.servers
    ]
    return replace(spec, servers=servers, router=[sub(a) for a in spec.router])


def _value_problem(name: str, value: str) -> str | None:
    """Why ``value`` cannot stand for the placeholder ``name``, or None."""
    if name == HEAD_IP:
        return (
            None if is_host(value) else f"is not an address or host name; allowed: {HOST_ALLOWED}"
        )
    if name == IFACE_NAME:
        return None if IFACE.match(value) else f"is not an interface name; allowed: {IFACE_ALLOWED}"
    if not _BOUND.match(value):
        return (
            "is not a host, address or port; allowed: letters, digits and . : _ - (or an [IPv6] "
            "address)"
        )
    return None


def rendezvous_ports(argv: list[str]) -> tuple[int, ...]:
    """The TCP ports a rank with ``argv`` listens on for the other ranks of its group (each of
    :data:`RENDEZVOUS_PORTS`, or the value its flag gives), sorted; a placeholder or a value
    that is not a port is left out (vLLM refuses it at start).

    + argv: the rank's bound argv
    """
    ports = set()
    for flag, default in RENDEZVOUS_PORTS.items():
        value = last_value(argv, flag) if flag else None
        port = int(value) if value is not None and value.isdigit() else default
        if value is None or value.isdigit():
            ports.add(port)
    return tuple(sorted(p for p in ports if 0 < p < 65536))


def is_host(text: str) -> bool:
    """Whether ``text`` is an IP address (IPv4, or bare IPv6) or a host name.

    + text: the address or name
    """
    try:
        ipaddress.ip_address(text)
        return True
    except ValueError:
        pass
    labels = text[:-1].split(".") if text.endswith(".") else text.split(".")
    return (
        0 < len(text) <= 253
        and all(_LABEL.match(label) for label in labels)
        and not labels[-1].isdigit()
    )


def group_values(head: str, iface: str) -> dict[str, str]:
    """The values of a group's placeholders, checked: ``$HEAD_IP`` is rank 0's address on the
    serving network, ``$IFACE_NAME`` the interface that carries it (NCCL's and Gloo's socket
    interface on every rank).

    + head: rank 0's IP address or host name
    + iface: the interface name (``serve_iface``, or the one the probe finds for that address)
    """
    values = {HEAD_IP: head, IFACE_NAME: iface}
    for name, value in values.items():
        problem = _value_problem(name, value) if isinstance(value, str) else "is not text"
        if problem:
            raise RecipeError(f"${name}={str(value)[:60]!r} {problem}")
    return values


def bind_group(spec: ServeSpec, head: str, iface: str) -> ServeSpec:
    """A group spec with ``$HEAD_IP`` and ``$IFACE_NAME`` bound in every rank's argv and env
    (:func:`group_values`); a spec of one node holds neither and comes back as it is.

    + spec: a resolved spec
    + head: rank 0's IP address or host name
    + iface: the interface NCCL and Gloo use on every rank
    """
    return bind(spec, group_values(head, iface))


# What a deploy binds on one host (:func:`one_host_values`): each pool's one node, the router
PLACED = ("DECODE_NODE_1", "PREFILL_NODE_1", "ROUTER_HOST", "ROUTER_PORT")


def is_pd(spec: ServeSpec) -> bool:
    """The spec's serving roles are prefill and decode."""
    return sorted(serving_roles(spec)) == sorted(PD_ROLES)


def deployable(spec: ServeSpec, allowed: str) -> ServeSpec:
    """The spec, when a deploy can place it: one serving role with nothing left to bind (but a
    group's ``$HEAD_IP`` and ``$IFACE_NAME``: its hosts' plans bind them), or a prefill and a
    decode role whose pools are one node each (both on one host, behind its router:
    :func:`one_host_values`); else a one-line refusal. Pools of several nodes (a DEP
    pool's ranks, ``$PREFILL_NODE_2``) are not placed yet.

    + spec: a resolved spec
    + allowed: what the data may select instead (named in the message)
    """
    roles = list(dict.fromkeys(serving_roles(spec)))  # a group: one main server per rank
    if len(roles) > 1 and not is_pd(spec):
        raise RecipeError(
            f"{spec.recipe}: the selection has the roles {', '.join(roles)}, each its own "
            f"server, and servefleet places only a prefill and a decode role; allowed: {allowed}"
        )
    placed = (PLACED if is_pd(spec) else ()) + (GROUP_PLACEHOLDERS if spec.nodes > 1 else ())
    unbound = [p for p in placeholders(spec) if p not in placed]
    if unbound:
        raise RecipeError(
            f"{spec.recipe}: the selection holds {', '.join('$' + p for p in unbound)}, which "
            f"only a placement of roles on several hosts binds (not built yet); allowed: {allowed}"
        )
    return spec


def one_host_values(address: str, router_host: str, router_port: int) -> dict[str, str]:
    """The placeholders of a prefill/decode selection served on one host: both pools' node is
    the host itself (its servers' address: the NIXL side channels listen there), and the
    router is the host's own.

    + address: where the host's servers listen (``serve_host``, else loopback)
    + router_host, router_port: where its router listens
    """
    return {
        "PREFILL_NODE_1": address,
        "DECODE_NODE_1": address,
        "ROUTER_HOST": router_host,
        "ROUTER_PORT": str(router_port),
    }
