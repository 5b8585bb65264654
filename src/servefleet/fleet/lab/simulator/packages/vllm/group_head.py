"""The head of a multi-node group (node rank 0, or the DP rank 0 front-end): it listens, takes
or refuses each rank that joins, says when the group formed, waits until every rank is ready
and then watches them. The protocol and what fails how: :mod:`vllm.rendezvous`. A SIMULATION
for the servefleet lab."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .common import SimError, _log
from .parallel_plan import Plan, args_hash, differences
from .rendezvous import (
    REPLY_TIMEOUT,
    Lines,
    Member,
    check_interfaces,
    connect_once,
    send,
    sockaddr,
    tcp_uri,
    who,
)

TORCH_IN_USE = (
    "torch.distributed.DistNetworkError: The server socket has failed to listen on any local "
    "network address. port: {port}, useIpv6: {ipv6}, code: -98, name: EADDRINUSE, message: "
    "address already in use"
)


@dataclass
class _Rank:
    """A rank as the head knows it."""

    conn: socket.socket
    msg: dict[str, Any]
    slots: frozenset[int]
    ready: bool = False
    gone: bool = False
    name: str = field(default="")


def _shown(value: Any) -> str:
    if value is None:
        return "unset"
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


class Head:
    """The head's side of the rendezvous; :meth:`bind`, :meth:`wait_formed`, :meth:`ready`."""

    def __init__(
        self, plan: Plan, args: Mapping[str, Any], argv: list[str], flags: Mapping[str, str]
    ) -> None:
        self.plan = plan
        self.args = dict(args)
        self.hash = args_hash(args)
        self.flags = flags
        self.host, self.port = plan.address
        self.uri = tcp_uri(self.host, self.port)
        nodes = plan.group == "nodes"
        self.size = plan.nnodes if nodes else plan.dp_size
        self.own = frozenset({0} if nodes else range(0, plan.dp_local))
        self.members: list[_Rank] = []
        self.cond = threading.Condition()
        self.state = "forming"  # formed (loading), serving, failed
        self.failure: str | None = None
        self.dead = threading.Event()  # a rank died after the group served: the engine is dead
        self.stalled = threading.Event()  # never set: the head is who the others wait for
        self.listener: socket.socket | None = None

    # -- the listener ------------------------------------------------------------------------

    def bind(self) -> bool:
        """Listen on the group's address. False when it is not this host's and this is node
        rank 0 (torch's store would listen everywhere and its client connect there: the
        caller joins that address as a member would). Raises SimError as torch's store or
        ZMQ's bind fails."""
        try:
            family, addr = sockaddr(self.host, self.port)
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError as exc:
            raise SimError(f"OSError: {self.uri}: {exc}") from None
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(addr)
            sock.listen(64)
        except OSError as exc:
            sock.close()
            if exc.errno == errno.EADDRNOTAVAIL and self.plan.group == "nodes":
                _log(
                    f"--master-addr {self.host} is not an address of this host: node rank 0's "
                    "store would listen on every interface here while its own client connects "
                    f"to {self.uri}",
                    "WARNING",
                )
                return False
            raise SimError(self._bind_error(exc)) from None
        self.listener = sock
        threading.Thread(target=self._accept, name="rendezvous", daemon=True).start()
        what = "torch.distributed store" if self.plan.group == "nodes" else "DP handshake"
        _log(f"The group's {what} listens on {self.uri} for {self.size - len(self.own)} more ranks")
        return True

    def _bind_error(self, exc: OSError) -> str:
        if exc.errno == errno.EADDRINUSE:
            there = self._probe()
            if self.plan.group == "nodes":
                line = TORCH_IN_USE.format(port=self.port, ipv6=str(":" in self.host).lower())
            else:
                line = f"zmq.error.ZMQError: Address already in use (addr='{self.uri}')"
            return line + there
        if exc.errno == errno.EADDRNOTAVAIL:
            return f"zmq.error.ZMQError: Cannot assign requested address (addr='{self.uri}')"
        return f"OSError: {self.uri}: {exc.strerror or exc}"

    def _probe(self) -> str:
        """What holds the port, when it is a group's head: the words that say so."""
        sock = connect_once(self.host, self.port, 2.0)
        if sock is None:
            return ""
        try:
            send(sock, {"op": "probe"})
            answer = Lines(sock).read(5.0)
        except (OSError, TimeoutError):
            answer = None
        finally:
            sock.close()
        if not answer or answer.get("op") != "head":
            return ""
        rank = "node rank 0" if self.plan.group == "nodes" else "the DP rank 0 front-end"
        return (
            f" (the head of a group, pid {answer.get('pid')} on {answer.get('host')}, listens "
            f"there already: this would be a second {rank})"
        )

    def _accept(self) -> None:
        assert self.listener is not None
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        lines = Lines(conn)
        try:
            msg = lines.read(REPLY_TIMEOUT)
        except TimeoutError:
            msg = None
        if msg is not None and msg.get("op") == "probe":
            with contextlib.suppress(OSError):
                send(conn, {"op": "head", "pid": os.getpid(), "host": socket.gethostname()})
        rank = self._admit(conn, msg) if msg is not None and msg.get("op") == "join" else None
        if rank is None:
            with contextlib.suppress(OSError):
                conn.close()
            return
        while True:
            got = lines.read()
            if got is None:
                break
            if got.get("op") == "ready":
                with self.cond:
                    rank.ready = True
                    self.cond.notify_all()
        self._gone(rank)

    # -- joining -----------------------------------------------------------------------------

    def _name(self, msg: Mapping[str, Any]) -> str:
        if self.plan.group == "nodes":
            return f"node rank {msg.get('node_rank')}"
        first, end = (msg.get("dp_ranks") or [0, 0])[:2]
        return f"DP ranks {first}-{end - 1}" if end - first > 1 else f"DP rank {first}"

    def _slots(self, msg: Mapping[str, Any]) -> frozenset[int]:
        if self.plan.group == "nodes":
            return frozenset({int(msg.get("node_rank", -1))})
        first, end = (msg.get("dp_ranks") or [0, 0])[:2]
        return frozenset(range(int(first), int(end)))

    def _mismatch(self, msg: Mapping[str, Any], name: str) -> str | None:
        """The line both sides fail with when the joiner's arguments are not the head's."""
        theirs: dict[str, Any] = msg["args"] if isinstance(msg.get("args"), dict) else {}
        diffs = differences(self.args, theirs, self.flags)
        if not diffs:
            return None
        me = who(self.plan)
        shown = ", ".join(f"{f} ({me}: {_shown(a)}, {name}: {_shown(b)})" for f, a, b in diffs)
        if self.plan.group == "dp":
            first = sorted(self._slots(msg))[0] if self._slots(msg) else 0
            return (
                f"RuntimeError: Configuration mismatch detected for engine {first}. All DP "
                "workers must have identical configurations for parameters that affect "
                "collective communication (e.g., enable_eplb, eplb_config.log_balancedness). "
                f"Worker hash: {msg.get('hash')}, Expected hash: {self.hash}. Please ensure all "
                f"workers are started with the same command-line arguments. Differing: {shown}"
            )
        return (
            f"RuntimeError: {name} of the group at {self.uri} was started with other arguments "
            f"than {me}: {shown}. Every node of a vLLM group must run the same model with the "
            "same configuration; NCCL's collectives fail or hang on mismatched shapes"
        )

    def _headless_rule(self, msg: Mapping[str, Any]) -> str | None:
        """vLLM's check of a remote DP engine's --headless against the head's LB mode."""
        leader = self.plan.group == "dp" or msg.get("node_rank_within_dp") == 0
        first = (
            min(self._slots(msg)) if self.plan.group == "dp" else (msg.get("dp_ranks") or [0])[0]
        )
        if not leader or (self.plan.group == "nodes" and first == 0):
            return None
        headless = bool(msg.get("headless"))
        if headless == self.plan.remote_headless:
            return None
        if headless:
            return (
                f"RuntimeError: Remote engine {first} must not use --headless in external or "
                "hybrid dp lb mode"
            )
        return (
            f"RuntimeError: Remote engine {first} must use --headless unless in external or "
            "hybrid dp lb mode"
        )

    def _holder(self, slots: frozenset[int]) -> tuple[str, str] | None:
        """(pid, host) of the live rank (or the head) holding any of ``slots``."""
        if slots & self.own:
            return str(os.getpid()), socket.gethostname()
        for m in self.members:
            if not m.gone and m.slots & slots:
                return str(m.msg.get("pid")), str(m.msg.get("host"))
        return None

    def _admit(self, conn: socket.socket, msg: dict[str, Any]) -> _Rank | None:
        """Take the joiner into the group or refuse it; the head fails too when vLLM's would."""
        name = self._name(msg)
        with self.cond:
            kind = msg.get("kind")
            slots = self._slots(msg)
            if self.state == "failed":
                self._refuse(conn, f"The head at {self.uri} is failing: {self.failure}", False)
                return None
            if kind != self.plan.group:
                self._refuse(
                    conn,
                    f"RuntimeError: {self.uri} is the rendezvous of a {self.plan.group!r} group, "
                    f"not of a {kind!r} one: check --master-port and --data-parallel-rpc-port",
                    True,
                )
                return None
            holder = self._holder(slots)
            if holder is not None:
                self._refuse(
                    conn,
                    f"RuntimeError: {name} of the group at {self.uri} is pid {holder[0]} on "
                    f"{holder[1]}: a second {name} cannot join (each node needs a rank of its "
                    "own)",
                    True,
                )
                return None
            if self.state != "forming":
                self._refuse(
                    conn,
                    f"The group at {self.uri} formed without {name}: a vLLM group does not take "
                    "a rank back (fail-stop); waiting, as NCCL's init would",
                    False,
                )
                return None
            head_fails = self._mismatch(msg, name) or self._headless_rule(msg)
            beyond = sorted(s for s in slots if not 0 <= s < self.size)
            if head_fails is None and beyond and self.plan.group == "dp":
                head_fails = f"RuntimeError: Message from engine with unexpected data parallel rank: {beyond[0]}"  # fmt: skip
            if head_fails is None:
                rank = _Rank(conn, msg, slots, name=name)
                self.members.append(rank)
                joined = len(self.own) + sum(len(m.slots) for m in self.members)
                self._send(conn, {"op": "joined", "joined": joined, "size": self.size})
                _log(f"{name} joined the group at {self.uri} (pid {msg.get('pid')} on {msg.get('host')})")  # fmt: skip
                self._check_formed()
                return rank
            self._refuse(conn, head_fails, True)
            self.fail(head_fails)
        return None

    def _refuse(self, conn: socket.socket, line: str, fatal: bool) -> None:
        _log(line, "ERROR" if fatal else "WARNING")
        self._send(conn, {"op": "refused", "error": line, "fatal": fatal})

    @staticmethod
    def _send(conn: socket.socket, msg: Mapping[str, Any]) -> None:
        with contextlib.suppress(OSError):
            send(conn, msg)

    def _per_node(self) -> int:
        return max(1, self.plan.dp_size * self.plan.world_within_dp // max(1, self.plan.nnodes))

    def _check_formed(self) -> None:
        """Under the lock: once every rank joined, tell each (with its first torch rank)."""
        taken = set(self.own).union(*(m.slots for m in self.members))
        if self.state != "forming" or taken != set(range(self.size)):
            return
        self.state = "formed"
        world = self._per_node() * self.plan.nnodes
        for m in self.members:
            first = min(m.slots) * self._per_node() if self.plan.group == "nodes" else min(m.slots)
            self._send(m.conn, {"op": "formed", "world": world, "rank": first})
        self.cond.notify_all()

    def _gone(self, rank: _Rank) -> None:
        with self.cond:
            rank.gone = True
            state = self.state
            if state == "forming":
                self.members.remove(rank)
                _log(f"{rank.name} left the group at {self.uri} before it formed: its place is free")  # fmt: skip
                return
            self.cond.notify_all()
        pid, host = rank.msg.get("pid"), rank.msg.get("host")
        if state == "formed":
            self.fail(
                f"RuntimeError: {rank.name} (pid {pid} on {host}) left the group at {self.uri} "
                "while the model loaded: vLLM is fail-stop, every rank of the group must restart"
            )
        elif state == "serving":
            self.dead.set()
            _log(
                f"{rank.name} (pid {pid} on {host}) of the group at {self.uri} went away: the "
                "engine is dead (EngineDeadError: EngineCore encountered an issue. See stack "
                "trace (above) for the root cause.); /health answers 503",
                "ERROR",
            )

    def fail(self, line: str) -> None:
        """The head fails with ``line``: every rank is told and let go."""
        with self.cond:
            if self.state == "failed":
                return
            self.state, self.failure = "failed", line
            for m in self.members:
                self._send(m.conn, {"op": "failed", "error": line})
                with contextlib.suppress(OSError):
                    m.conn.shutdown(socket.SHUT_RDWR)
            self.cond.notify_all()

    # -- the main thread's waits -------------------------------------------------------------

    def wait_formed(self) -> None:
        """Until every rank joined; nodes: within the distributed timeout (torch's store)."""
        deadline = time.monotonic() + self.plan.timeout if self.plan.group == "nodes" else None
        with self.cond:  # an RLock: fail() takes it again
            while self.state == "forming":
                if deadline is not None and time.monotonic() >= deadline:
                    joined = (1 + len(self.members)) * self._per_node()
                    self.fail(
                        f"torch.distributed.DistStoreError: Timed out after "
                        f"{self.plan.timeout + 1} seconds waiting for clients. "
                        f"{joined}/{self._per_node() * self.plan.nnodes} clients joined."
                    )
                    break
                self.cond.wait(0.2)
            if self.state == "failed":
                raise SimError(str(self.failure))
        world = self._per_node() * self.plan.nnodes
        if self.plan.group == "nodes":
            _log(f"world_size={world} rank=0 local_rank=0 distributed_init_method={self.uri} backend=nccl")  # fmt: skip
        _log(f"The group at {self.uri} formed: {self.size} {'nodes' if self.plan.group == 'nodes' else 'DP ranks'}")  # fmt: skip

    def ready(self) -> None:
        """This rank loaded the model: wait until every rank has, then serve."""
        with self.cond:
            while self.state == "formed" and not all(m.ready for m in self.members):
                self.cond.wait(0.2)
            if self.state == "failed":
                raise SimError(str(self.failure))
            self.state = "serving"

    @property
    def alive(self) -> int:
        """Ranks of the group alive as the head sees them (nodes, or DP ranks)."""
        with self.cond:
            return len(self.own) + sum(len(m.slots) for m in self.members if not m.gone)

    def close(self) -> None:
        if self.listener is not None:
            with contextlib.suppress(OSError):
                self.listener.close()
        with self.cond:
            for m in self.members:
                with contextlib.suppress(OSError):
                    m.conn.close()


def flag_names(platform: str) -> dict[str, str]:
    """dest -> the flag's spelling in log lines (its first long form)."""
    from .flag_table import flag_table

    names: dict[str, str] = {}
    for entry in flag_table(platform):
        spelled = [f for f in entry["flags"] if f.startswith("--") and not f.startswith("--no-")]
        if spelled:
            names.setdefault(entry["dest"], spelled[0])
    return names


def join_group(
    plan: Plan, args: Mapping[str, Any], argv: list[str], platform: str, env: Mapping[str, str]
) -> Head | Member | None:
    """Take part in this server's group until it formed: the head listens and waits for every
    rank (a node rank 0 whose master address is another host's joins there, to be refused as
    a second one); the others join. None for a server on its own. Raises SimError as the
    group fails (:mod:`vllm.rendezvous`).

    + plan: the server's plan
    + args: its :func:`vllm.parallel_plan.group_args`
    + argv: its command line
    + platform: the flag table (for the flags' names in log lines)
    + env: the server's environment (the data NICs: :func:`vllm.rendezvous.check_interfaces`)
    """
    if plan.group is None:
        return None
    check_interfaces(env)
    if plan.head:
        head = Head(plan, args, argv, flag_names(platform))
        if head.bind():
            head.wait_formed()
            return head
    member = Member(plan, args, argv)
    member.join()
    member.wait_formed()
    return member
