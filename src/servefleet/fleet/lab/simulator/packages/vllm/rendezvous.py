"""The rendezvous of a multi-node group, for real over TCP: the head listens, the other ranks
connect, the group forms once every rank has joined with agreeing arguments, and then it lives
and dies as vLLM's does. A SIMULATION for the servefleet lab; where each server stands is
:mod:`vllm.parallel_plan`, the head's side is :mod:`vllm.group_head`.

Two kinds of group, as vLLM 0.30.0 has them:

- ``nodes`` (``--nnodes`` > 1): torch.distributed's rendezvous. Node rank 0 listens on
  ``--master-addr``:``--master-port`` (29501; torch's TCPStore master; here only on that
  address, so a master address that is not the host's is refused at once, where torch's store
  would listen on every interface while its own client connected to that address). The other
  nodes connect, retrying (as torch's TCPStore client does) until the distributed timeout
  (``--distributed-timeout-seconds``, else NCCL's 600 s): ``torch.distributed.DistNetworkError:
  The client socket has timed out after 600000ms while trying to connect to (HOST, PORT).``
  Node rank 0 waits as long for them: ``torch.distributed.DistStoreError: Timed out after 601
  seconds waiting for clients. 8/16 clients joined.`` (torch ranks: one a GPU).
- ``dp`` (data parallel across nodes without ``--nnodes``): vLLM's engine handshake. The DP
  rank 0 front-end listens on ``--data-parallel-address``:``--data-parallel-rpc-port`` (29550;
  a ZMQ ROUTER: an address that is not the host's fails as ZMQ's bind does); the other nodes'
  engines connect as ZMQ does, for vLLM's 5 minutes (``RuntimeError: Did not receive response
  from front-end process within 5 minutes``). The front-end waits for them without a limit.

The protocol is the simulator's own (neither torch's store nor ZMQ's): JSON lines. A rank sends
``{"op": "join", ...}`` (its kind, node rank, DP ranks, --headless, pid, host and the arguments
of :data:`vllm.parallel_plan.GROUP_FIELDS`); the head answers ``joined``, or ``refused`` with
the line to log and whether it is fatal, and once the group is complete ``formed`` to every
rank. Every rank then loads the model; the others send ``ready``; the head serves once every
rank is ready. The connections stay open: they are how each side sees the other die.

What fails, and how (the head's checks: :class:`vllm.group_head.Head`):

- A rank whose arguments disagree with the head's: both fail with one line naming each
  differing flag and both values (a DP group: vLLM's ``Configuration mismatch detected for
  engine N`` line first; vLLM compares the parallel config's hash when the engines report
  READY, here at the join), and so does every rank already joined (the head went away).
- A second node rank 0 (its bind finds the port taken, or its master address on another host
  where a head answers) and a rank whose node rank or DP ranks a live rank holds already: that
  rank fails; the group goes on. A DP rank beyond ``--data-parallel-size``: the head fails as
  vLLM's does (``Message from engine with unexpected data parallel rank``), and with it the
  group. A remote DP engine that is headless where the head's mode needs it not to be, or the
  other way round: vLLM's ``Remote engine N must (not) use --headless`` on both.
- A rank that goes away before the group formed frees its place (a restarted one can take it);
  after the group formed and before it serves, the head fails (vLLM is fail-stop).
- After the group serves: a non-head rank that dies makes the head's engine dead
  (``/health`` 503, generation requests 500, then vLLM's watchdog stops the API server after
  5 s and the process exits 0, vllm#48966; ``VLLM_KEEP_ALIVE_ON_ENGINE_DEATH=1`` keeps it up);
  the head that dies leaves the other ranks hanging: they log it and never exit or rejoin
  (vllm#32136), until SIGTERM. A rank that connects to a group that formed without it is told
  so and keeps retrying until its timeout, as a restarted rank hangs in NCCL's init.

NOT CONFIRMED: how soon a real head notices a dead rank (an idle engine may notice only at its
next collective; here at once), and whether a head stopped by SIGTERM also leaves the headless
ranks hanging (here it does, as a crashed one does).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import socket
import threading
import time
from collections.abc import Mapping
from typing import Any

from .common import SimError, _log
from .parallel_plan import HANDSHAKE_TIMEOUT, Plan, args_hash

MAX_LINE = 1 << 20  # bytes of one rendezvous line
RETRY_INTERVAL = 0.25  # seconds between a rank's connection attempts
REPLY_TIMEOUT = 30.0  # seconds a head has to answer a join
WAIT_LOG_EVERY = 30.0  # seconds between a waiting rank's log lines


def tcp_uri(host: str, port: int) -> str:
    """vLLM's ``get_tcp_uri``."""
    with contextlib.suppress(ValueError):
        if ipaddress.ip_address(host.strip("[]")).version == 6:
            return f"tcp://[{host.strip('[]')}]:{port}"
    return f"tcp://{host}:{port}"


def sockaddr(host: str, port: int) -> tuple[int, Any]:
    """The address family and socket address of ``host``:``port`` (a name is resolved)."""
    info = socket.getaddrinfo(host.strip("[]"), port, 0, socket.SOCK_STREAM)[0]
    return info[0], info[4]


def send(sock: socket.socket, msg: Mapping[str, Any]) -> None:
    """One JSON line."""
    sock.sendall(json.dumps(msg, separators=(",", ":")).encode() + b"\n")


class Lines:
    """JSON lines read from a socket (None at its end, or on a line that is not one)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""

    def read(self, timeout: float | None = None) -> dict[str, Any] | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self.buf:
            if len(self.buf) > MAX_LINE:
                return None
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError("no line in time")
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(65536)
            except TimeoutError:
                raise TimeoutError("no line in time") from None
            except OSError:
                return None
            if not chunk:
                return None
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        try:
            msg = json.loads(line)
        except ValueError:
            return None
        return msg if isinstance(msg, dict) else None


def connect_once(host: str, port: int, timeout: float) -> socket.socket | None:
    """A connection to ``host``:``port``, or None when nobody listens (yet)."""
    try:
        family, addr = sockaddr(host, port)
        sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError:
        return None
    try:
        sock.settimeout(timeout)
        sock.connect(addr)
    except OSError:
        sock.close()
        return None
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    return sock


def check_interfaces(env: Mapping[str, str]) -> None:
    """The data NICs a group's collectives bind, as gloo and NCCL look them up when the process
    group starts: every ``GLOO_SOCKET_IFNAME`` entry must be an interface of this host, and
    ``NCCL_SOCKET_IFNAME`` (prefixes; ``=NAME`` exact; a ``^`` list excludes) must match one.
    Raises SimError with their messages (an unbound ``$IFACE_NAME`` fails here).

    + env: the server's environment
    """
    names = [name for _, name in socket.if_nameindex()]
    for item in filter(None, (x.strip() for x in env.get("GLOO_SOCKET_IFNAME", "").split(","))):
        if item not in names:
            raise SimError(
                "RuntimeError: [enforce fail at ../third_party/gloo/gloo/transport/tcp/"
                f"device.cc:84] ifa != nullptr. Unable to find address for: {item}"
            )
    nccl = env.get("NCCL_SOCKET_IFNAME", "").strip()
    if not nccl or nccl.startswith("^"):
        return
    exact = nccl.startswith("=")
    wanted = [x.strip() for x in nccl.lstrip("=").split(",") if x.strip()]
    if not any(n == w if exact else n.startswith(w) for n in names for w in wanted):
        raise SimError(
            "torch.distributed.DistBackendError: NCCL error: internal error - please report this "
            f"issue to the NCCL developers (NCCL WARN Bootstrap : no socket interface found; "
            f"NCCL_SOCKET_IFNAME={nccl}; this host has {', '.join(names)})"
        )


def join_message(plan: Plan, args: Mapping[str, Any], argv: list[str]) -> dict[str, Any]:
    """What a rank tells the head about itself."""
    return {
        "op": "join",
        "kind": plan.group,
        "node_rank": plan.node_rank,
        "node_rank_within_dp": plan.node_rank_within_dp,
        "dp_ranks": list(plan.dp_ranks),
        "headless": plan.headless,
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "args": dict(args),
        "hash": args_hash(args),
        "argv": argv,
    }


def who(plan: Plan) -> str:
    """How the log names this rank in its group."""
    if plan.group == "nodes":
        return f"node rank {plan.node_rank}"
    first, end = plan.dp_ranks
    return f"DP ranks {first}-{end - 1}" if end - first > 1 else f"DP rank {first}"


class Member:
    """A rank that joins a head: connect, join, wait until the group forms, report ready, then
    watch the head (its death leaves this rank hanging, vllm#32136)."""

    def __init__(self, plan: Plan, args: Mapping[str, Any], argv: list[str]) -> None:
        self.plan = plan
        self.host, self.port = plan.address
        self.uri = tcp_uri(self.host, self.port)
        self.message = join_message(plan, args, argv)
        self.sock: socket.socket | None = None
        self.lines: Lines | None = None
        self.size = plan.nnodes if plan.group == "nodes" else plan.dp_size
        self.alive = 1  # ranks this one sees (itself; the whole group once formed)
        self.stalled = threading.Event()  # the head went away after the group formed
        self.dead = threading.Event()  # a member's engine never dies of another rank

    @property
    def timeout(self) -> float:
        return float(self.plan.timeout if self.plan.group == "nodes" else HANDSHAKE_TIMEOUT)

    def _timed_out(self) -> SimError:
        if self.plan.group == "nodes":
            return SimError(
                "torch.distributed.DistNetworkError: The client socket has timed out after "
                f"{int(self.timeout * 1000)}ms while trying to connect to ({self.host}, "
                f"{self.port})."
            )
        minutes = HANDSHAKE_TIMEOUT // 60
        return SimError(
            "RuntimeError: Did not receive response from front-end process within "
            f"{minutes} minutes"
        )

    def join(self) -> None:
        """Connect and join, retrying until the timeout; returns once the head took this rank
        (then :meth:`wait_formed`). Raises SimError when refused for good or timed out."""
        deadline = time.monotonic() + self.timeout
        said = 0.0
        while True:
            sock = connect_once(
                self.host, self.port, min(2.0, max(0.05, deadline - time.monotonic()))
            )
            if sock is not None:
                lines = Lines(sock)
                reply = self._ask(sock, lines)
                if reply is not None and reply.get("op") == "joined":
                    self.sock, self.lines = sock, lines  # it may hold the next line already
                    _log(
                        f"Joined the group at {self.uri} as {who(self.plan)} "
                        f"({reply.get('joined')}/{reply.get('size')} ranks joined)"
                    )
                    return
                sock.close()
                if reply is not None and reply.get("op") == "refused":
                    if reply.get("fatal"):
                        raise SimError(str(reply.get("error")))
                    if time.monotonic() - said > WAIT_LOG_EVERY:
                        _log(str(reply.get("error")), "WARNING")
                        said = time.monotonic()
            elif time.monotonic() - said > WAIT_LOG_EVERY:
                what = "node rank 0" if self.plan.group == "nodes" else "the DP front-end"
                _log(
                    f"Waiting for {what} at {self.uri} (nobody listens there yet; retrying for "
                    f"up to {int(self.timeout)} s)"
                )
                said = time.monotonic()
            if time.monotonic() >= deadline:
                raise self._timed_out()
            time.sleep(min(RETRY_INTERVAL, max(0.0, deadline - time.monotonic())))

    def _ask(self, sock: socket.socket, lines: Lines) -> dict[str, Any] | None:
        try:
            send(sock, self.message)
            return lines.read(REPLY_TIMEOUT)
        except (OSError, TimeoutError):
            return None

    def wait_formed(self) -> None:
        """Wait until the head says the group formed (as long as the head takes: it times
        out itself). Raises SimError when the head fails or goes away first."""
        assert self.lines is not None
        msg = self.lines.read()
        if msg is not None and msg.get("op") == "formed":
            self.alive = self.size
            _log(
                f"world_size={msg.get('world')} rank={msg.get('rank')} local_rank=0 "
                f"distributed_init_method={self.uri} backend=nccl"
                if self.plan.group == "nodes"
                else f"The group at {self.uri} formed: {self.size} DP ranks"
            )
            return
        if msg is not None and msg.get("op") == "failed":
            raise SimError(f"{msg.get('error')} (the head at {self.uri} failed)")
        if self.plan.group == "nodes":
            raise SimError(
                "torch.distributed.DistNetworkError: failed to recv, got 0 bytes (node rank 0 "
                f"at {self.uri} went away before the group formed)"
            )
        raise SimError(
            f"RuntimeError: the DP front-end at {self.uri} went away before the engines started"
        )

    def ready(self) -> None:
        """The model is loaded: tell the head, then watch it."""
        assert self.sock is not None
        with contextlib.suppress(OSError):
            send(self.sock, {"op": "ready"})
        threading.Thread(target=self._watch, name="rendezvous-watch", daemon=True).start()

    def _watch(self) -> None:
        assert self.lines is not None
        while True:
            msg = self.lines.read()
            if msg is None:
                break
        self.alive = 0
        self.stalled.set()
        _log(
            f"The head of the group at {self.uri} went away. This rank stays as it is: vLLM's "
            "other ranks neither exit nor rejoin when the head dies (vllm#32136); restart "
            "every rank of the group",
            "ERROR",
        )

    def close(self) -> None:
        if self.sock is not None:
            with contextlib.suppress(OSError):
                self.sock.close()


def launch_line(plan: Plan, version: str) -> str:
    """What ``run_headless`` logs as it starts: the headless multiproc executor of a follower
    node (TP/PP across nodes), else this node's data parallel engines."""
    if plan.group == "nodes" and plan.node_rank_within_dp > 0:
        return (
            f"Launching vLLM (v{version}) headless multiproc executor, with head node address "
            f"{plan.master_addr}:{plan.master_port} for torch.distributed process group."
        )
    return (
        f"Launching {plan.dp_local} data parallel engine(s) in headless mode, with head node "
        f"address {tcp_uri(plan.dp_address, plan.dp_rpc_port)}."
    )
