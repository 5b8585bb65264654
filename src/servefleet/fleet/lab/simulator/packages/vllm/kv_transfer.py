"""Prefill/decode disaggregation as vLLM 0.30's NIXL connector does it (vllm-rbln's
``RblnNixlConnector`` on the rbln platform): the connector from ``--kv-transfer-config``, the side
channel every such server opens, the KV blocks a prefill holds for its decode, and the decode's
fetch. A SIMULATION for the servefleet lab: the blocks are ids, their transfer a TCP exchange.

What vLLM does, read from its source (``vllm/distributed/kv_transfer/kv_connector/v1/nixl/``:
``base_scheduler.py``, ``pull_scheduler.py``, ``worker.py``; ``vllm/config/kv_transfer.py``;
``vllm/entrypoints/openai/engine/serving.py``), and what this module models:

- The connector: ``kv_connector`` ``NixlConnector`` (upstream; the CUDA build) or, on the rbln
  platform, ``RblnNixlConnector`` (also its alias ``RblnNixlPullConnector``, and upstream's name,
  NOT CONFIRMED to work on RBLN). A connector without ``kv_role`` is refused as vLLM's
  ``KVTransferConfig`` refuses it. ``kv_role`` (``kv_producer``, ``kv_consumer``, ``kv_both``) is
  "effectively a placeholder" in vLLM: the request's ``kv_transfer_params`` decide what a server
  does with it, so here too. The push connectors are not simulated (refused at start).
- The engine id: ``engine_id`` of the config, else a new uuid4 at every start (so a restarted
  prefill is another engine and stale parameters fail); ``<id>_dp<rank>`` under data parallelism.
- The side channel (vLLM: a ZMQ ROUTER socket): every NIXL server listens on
  ``$VLLM_NIXL_SIDE_CHANNEL_HOST`` (default ``localhost``, which binds loopback only) at
  ``$VLLM_NIXL_SIDE_CHANNEL_PORT`` (default 5600) plus each local data parallel rank, and
  advertises exactly that host and port. A port taken fails the start (``ZMQError: Address
  already in use``; NOT CONFIRMED: vLLM 0.30's listener thread may instead hang the start).
  Here the channel speaks JSON lines (:meth:`KVTransfer.answer_line`): ``{"op": "handshake"}`` answers the
  engine id and the compatibility hash; ``{"op": "read", "engine_id", "request_id",
  "block_ids"}`` hands over the blocks a prefill holds for that request and frees them (NIXL's
  read, then the decode's notification).
- A request with ``kv_transfer_params.do_remote_decode`` (what vllm-router and vLLM's toy proxy
  send a prefill, with ``max_tokens: 1``) is answered as usual; its whole answer carries
  ``kv_transfer_params``: ``do_remote_prefill: true``, ``do_remote_decode: false``,
  ``remote_block_ids`` (one list per KV cache group; one group here: ``ceil(prompt tokens /
  block size)`` blocks), ``remote_engine_id``, ``remote_request_id``, ``remote_host``,
  ``remote_port`` (the side channel as advertised), ``tp_size``, ``dcp_size``, ``pp_size``,
  ``remote_num_tokens`` (the prompt's tokens), ``remote_blocks_expiry_time`` (``null``: vLLM sets
  it on a decode's answer only) and ``transfer_mode`` (``pull``): the keys of
  ``NixlPullConnectorScheduler.request_finished``'s answer (``pull_scheduler.py``; checked against
  the real wheel by tests/realvllm/test_trusted.py). The blocks are held for
  ``kv_connector_extra_config.kv_lease_duration`` seconds (30) and then released with vLLM's
  warning. A streamed answer carries no parameters (the blocks are held all the same).
- A request with ``kv_transfer_params.do_remote_prefill`` and ``remote_block_ids`` naming
  ``remote_engine_id``, ``remote_request_id``, ``remote_host`` and ``remote_port`` (vLLM's
  check: the keys present) makes the server fetch them before it generates: it connects to
  ``remote_host:remote_port`` (as ZMQ does: retrying, within vLLM's 5 s receive timeout, else
  ``zmq.error.Again: Resource temporarily unavailable``), checks the compatibility hash and the
  engine id (``Remote NIXL agent engine ID mismatch. Expected X,received Y.``, vLLM's words and
  spacing), then reads the blocks. A failure is logged as vLLM logs it (``NIXL transfer
  failure: handshake_failed | Context: {...}``) and, under ``kv_load_failure_policy`` ``fail``
  (the default), fails the request as vLLM does: HTTP 500 ``Internal server error``
  (``InternalServerError``), or in a stream an error event then ``[DONE]``; under ``recompute``
  the server prefills itself and answers. Missing keys: vLLM's warning (``Got invalid
  KVTransferParams``), then a local prefill.
- Stricter than NIXL: blocks the prefill no longer holds (the lease expired, a decode read them
  already) fail the read (``transfer_failed``), where an RDMA read would return whatever those
  blocks hold by then. The decode handshakes for every request (vLLM caches the peer per engine
  id, so after a peer's restart its failure is a transfer's, not a handshake's; both fail the
  request under ``fail``).
- Without a NIXL connector ``kv_transfer_params`` are ignored, as vLLM ignores them.
- The lab's fault switch ``/etc/rbln-sim/stale-peer`` (read at start, matched to the command
  line as ``fail-start`` is): such a decode keeps the engine id it first read at each side
  channel, as NIXL up to 1.3.2 kept a peer's remote agent metadata (vllm#49238: a decode broke
  after its prefill restarted; smg#2382 the other way round), so once that peer restarts every
  read from it fails (``transfer_failed``) until this server restarts. The pinned nixl 1.5.1
  has the fix; the switch stands in for what the deploy's peer re-check must catch.

Every request is counted by the part it played: ``prefill`` (``do_remote_decode``), ``decode``
(``do_remote_prefill`` with complete parameters), ``local`` (anything else), in
``servefleet_sim_requests_total{role=...}`` on /metrics.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import ipaddress
import json
import math
import secrets
import socket
import socketserver
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .checks import fault_switch
from .common import BUILD, VERSION, SimError, _log
from .flag_table import _object

ROLES = ("prefill", "decode", "local")  # what a request did, for /metrics
PULL_CONNECTORS = {
    "cpu": ("RblnNixlConnector", "RblnNixlPullConnector", "NixlConnector"),
    "cuda": ("NixlConnector",),
}
KV_ROLES = ("kv_producer", "kv_consumer", "kv_both")
DEFAULT_HOST = "localhost"  # vLLM's VLLM_NIXL_SIDE_CHANNEL_HOST
DEFAULT_PORT = 5600  # vLLM's VLLM_NIXL_SIDE_CHANNEL_PORT
DEFAULT_LEASE = 30.0  # kv_connector_extra_config.kv_lease_duration, seconds
DEFAULT_BLOCK_SIZE = 16  # --block-size unset
HANDSHAKE_TIMEOUT = 5.0  # vLLM: the handshake socket's RCVTIMEO
RECONNECT_INTERVAL = 0.1  # ZMQ's reconnect_ivl
MAX_LINE = 1 << 16  # bytes of one side channel line
CHANNEL_IDLE = 10.0  # seconds a side channel connection may sit silent
REQUIRED = ("remote_engine_id", "remote_request_id", "remote_host", "remote_port")
INTERNAL_ERROR = "Internal server error"  # vLLM's GenerationError
TRANSFER_MODE = "pull"  # vLLM's NixlBaseConnectorScheduler._TRANSFER_MODE (the pull connectors)


class TransferError(Exception):
    """A failed KV load: vLLM's failure type and the exception it logs."""

    def __init__(self, failure_type: str, error: str) -> None:
        super().__init__(error)
        self.failure_type = failure_type
        self.error = error


@dataclass
class Blocks:
    """The KV blocks a prefill holds for decodes, by request id, until read or expired."""

    lease: float
    _held: dict[str, tuple[list[list[int]], float]] = field(default_factory=dict)
    _next: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def hold(self, request_id: str, count: int) -> list[list[int]]:
        """New block ids for ``request_id`` (one KV cache group), held for the lease."""
        with self._lock:
            ids = list(range(self._next, self._next + count))
            self._next += count
            self._held[request_id] = ([ids], time.monotonic() + self.lease)
            return [ids]

    def _purge(self) -> None:
        now = time.monotonic()
        for rid, (_, expiry) in list(self._held.items()):
            if expiry <= now:
                del self._held[rid]
                _log(
                    f"Releasing expired KV blocks for request {rid} which were retrieved by 0 "
                    f"decode worker(s) within {self.lease:g} seconds.",
                    "WARNING",
                )

    def count(self) -> int:
        """How many requests' blocks are held now (expired ones released first)."""
        with self._lock:
            self._purge()
            return len(self._held)

    def take(self, request_id: Any, block_ids: Any) -> str | None:
        """Hand over and free the blocks of ``request_id``; why not, or None."""
        with self._lock:
            self._purge()
            held = self._held.get(request_id) if isinstance(request_id, str) else None
            if held is None:
                return (
                    f"this engine holds no KV blocks for request {request_id!r} (the lease "
                    "expired, a decode read them already, or it never held them)"
                )
            if block_ids != held[0]:
                return f"request {request_id} holds blocks {held[0]}, not {block_ids!r}"
            del self._held[request_id]
            return None


@dataclass
class Engine:
    """One data parallel rank's NIXL engine: its id and its advertised side channel."""

    rank: int
    engine_id: str
    host: str
    port: int


class KVTransfer:
    """A server's NIXL connector: its engines (one per local data parallel rank), their side
    channels, the blocks they hold and the fetch of a decode."""

    def __init__(
        self,
        connector: str,
        kv_role: str,
        policy: str,
        lease: float,
        enforce_compat: bool,
        engines: list[Engine],
        compat_hash: str,
        block_size: int,
        tp_size: int,
        stale: bool = False,
        pp_size: int = 1,
        dcp_size: int = 1,
    ) -> None:
        self.connector = connector
        self.kv_role = kv_role
        self.policy = policy
        self.enforce_compat = enforce_compat
        self.engines = engines
        self.compat_hash = compat_hash
        self.block_size = block_size
        self.tp_size = tp_size
        self.pp_size = pp_size
        self.dcp_size = dcp_size
        self.blocks = Blocks(lease)
        self.stale = stale  # the stale-peer switch: keep the first engine id of each channel
        self.peers: dict[tuple[str, int], str] = {}
        self._servers: list[socketserver.ThreadingTCPServer] = []

    def engine(self, rank_header: str | None) -> Engine:
        """The engine a request goes to: ``X-data-parallel-rank`` when it names a local rank,
        else the first."""
        for e in self.engines:
            if rank_header is not None and rank_header.strip() == str(e.rank):
                return e
        return self.engines[0]

    # -- the side channel ---------------------------------------------------------------------

    def open(self) -> None:
        """Listen on every engine's side channel (SimError as ZMQ's bind fails)."""
        for e in self.engines:
            self._servers.append(_listen(self, e))
        for e in self.engines:
            _log(f"NIXL side channel of engine {e.engine_id} listening on tcp://{e.host}:{e.port}")

    def close(self) -> None:
        for server in self._servers:
            server.shutdown()
            server.server_close()

    def answer_line(self, engine: Engine, line: bytes) -> dict[str, Any]:
        """The side channel's answer to one line (never raises)."""
        try:
            msg = json.loads(line)
        except ValueError:
            msg = None
        if not isinstance(msg, dict):
            return {"ok": False, "error": "expected a JSON object with op"}
        op = msg.get("op")
        if op == "handshake":
            return {
                "ok": True,
                "engine_id": engine.engine_id,
                "compatibility_hash": self.compat_hash,
                "simulated": True,
            }
        if op == "read":
            if msg.get("engine_id") != engine.engine_id:
                return {"ok": False, "error": f"this is engine {engine.engine_id}"}
            why = self.blocks.take(msg.get("request_id"), msg.get("block_ids"))
            return {"ok": True} if why is None else {"ok": False, "error": why}
        return {"ok": False, "error": f"unknown op {str(op)[:40]!r}; expected handshake or read"}

    # -- a prefill's answer and a decode's fetch ----------------------------------------------

    def prefill_params(self, engine: Engine, request_id: str, prompt_tokens: int) -> dict[str, Any]:
        """Hold this request's blocks; the ``kv_transfer_params`` its answer carries."""
        count = max(1, math.ceil(prompt_tokens / self.block_size))
        remote_id = f"{request_id}-{secrets.token_hex(4)}"
        return {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_block_ids": self.blocks.hold(remote_id, count),
            "remote_engine_id": engine.engine_id,
            "remote_request_id": remote_id,
            "remote_host": engine.host,
            "remote_port": engine.port,
            "tp_size": self.tp_size,
            "dcp_size": self.dcp_size,
            "pp_size": self.pp_size,
            "remote_num_tokens": prompt_tokens,  # vLLM: the prefill's num_computed_tokens
            "remote_blocks_expiry_time": None,  # vLLM: set on a decode (D) node's answer only
            "transfer_mode": TRANSFER_MODE,
        }

    def fetch(self, engine: Engine, request_id: str, params: Mapping[str, Any], abort: Any) -> None:
        """Read a prefill's blocks as vLLM's decode does (:func:`_fetch`); a failure is logged as
        vLLM logs it and raised as TransferError.

        + engine: this server's engine serving the request
        + request_id: this request's id, for the log
        + params: the request's kv_transfer_params (do_remote_prefill, complete)
        + abort: an Event that cuts the wait short (the shutdown)
        """
        try:
            _fetch(self, params, abort)
        except TransferError as exc:
            context = {
                "failure_type": exc.failure_type,
                "request_id": request_id,
                "engine_id": engine.engine_id,
                **{k: params.get(k) for k in REQUIRED},
            }
            _log(f"NIXL transfer failure: {exc.failure_type} | Context: {context} | {exc}", "ERROR")
            raise


def role_of(kv: KVTransfer | None, params: Mapping[str, Any] | None) -> str:
    """The part a request plays (:data:`ROLES`) on a server with connector ``kv``."""
    if kv is None or not params:
        return "local"
    if params.get("do_remote_decode"):
        return "prefill"
    if params.get("do_remote_prefill") and params.get("remote_block_ids"):
        if all(k in params for k in REQUIRED):
            return "decode"
        _log(
            f"Got invalid KVTransferParams: {dict(params)}. This request will not utilize "
            "KVTransfer",
            "WARNING",
        )
    return "local"


def _fetch(kv: KVTransfer, params: Mapping[str, Any], abort: Any) -> None:
    host, port = params["remote_host"], params["remote_port"]
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port < 65536:
        raise TransferError("handshake_failed", "zmq.error.ZMQError: Invalid argument")
    deadline = time.monotonic() + HANDSHAKE_TIMEOUT
    sock = _connect(str(host), port, deadline, abort)
    try:
        meta = _ask(sock, {"op": "handshake"}, deadline)
        remote_hash = meta.get("compatibility_hash")
        if kv.enforce_compat and remote_hash != kv.compat_hash:
            raise TransferError(
                "handshake_failed",
                f"RuntimeError: NIXL compatibility hash mismatch. Local: {kv.compat_hash}, "
                f"Remote: {remote_hash}. Prefill and decode instances have incompatible "
                "configurations. This may be due to: different vLLM versions, models, dtypes, "
                "KV cache layouts, attention backends, etc. Both instances must use identical "
                "configurations.Disable this check using --kv-transfer-config "
                '\'{"kv_connector_extra_config": {"enforce_handshake_compat": false}}\'',
            )
        expected = params["remote_engine_id"]
        if meta.get("engine_id") != expected:
            raise TransferError(
                "handshake_failed",
                f"RuntimeError: Remote NIXL agent engine ID mismatch. Expected {expected},"
                f"received {meta.get('engine_id')}.",
            )
        first = kv.peers.setdefault((str(host), port), expected) if kv.stale else expected
        if first != expected:
            raise TransferError(
                "transfer_failed",
                f"the remote agent metadata loaded for {host}:{port} is engine {first}'s, and "
                f"that peer runs engine {expected} now (the lab's stale-peer switch: NIXL <= "
                "1.3.2 kept a restarted peer's metadata, vllm#49238)",
            )
        read = {
            "op": "read",
            "engine_id": expected,
            "request_id": params["remote_request_id"],
            "block_ids": params["remote_block_ids"],
        }
        answer = _ask(sock, read, time.monotonic() + HANDSHAKE_TIMEOUT, "transfer_failed")
        if not answer.get("ok"):
            raise TransferError(
                "transfer_failed", f"the prefill refused the read: {answer.get('error')}"
            )
    finally:
        sock.close()


def _family(host: str) -> int:
    """ZMQ without its IPV6 option (vLLM sets it for IPv6 literals only) resolves IPv4."""
    with contextlib.suppress(ValueError):
        if ipaddress.ip_address(host.strip("[]")).version == 6:
            return socket.AF_INET6
    return socket.AF_INET


def _connect(host: str, port: int, deadline: float, abort: Any) -> socket.socket:
    """A connection to the side channel, retried as ZMQ reconnects until ``deadline``."""
    while True:
        try:
            family = _family(host)
            addr = socket.getaddrinfo(host.strip("[]"), port, family, socket.SOCK_STREAM)[0][4]
            sock = socket.socket(family, socket.SOCK_STREAM)
            try:
                sock.settimeout(max(0.05, deadline - time.monotonic()))
                sock.connect(addr)
            except OSError:
                sock.close()
                raise
            return sock
        except OSError:
            pass
        left = deadline - time.monotonic()
        if left <= 0 or abort.wait(min(RECONNECT_INTERVAL, left)):
            raise TransferError(
                "handshake_failed", "zmq.error.Again: Resource temporarily unavailable"
            )


def _ask(
    sock: socket.socket, msg: dict[str, Any], deadline: float, failure: str = "handshake_failed"
) -> dict[str, Any]:
    """Send one line, read the answer line before ``deadline``."""
    again = TransferError(failure, "zmq.error.Again: Resource temporarily unavailable")
    try:
        sock.sendall(json.dumps(msg).encode() + b"\n")
        data = b""
        while not data.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or len(data) > MAX_LINE:
                raise again
            sock.settimeout(left)
            chunk = sock.recv(65536)
            if not chunk:
                raise again  # the peer went away: ZMQ would wait out the timeout
            data += chunk
    except OSError:
        raise again from None
    try:
        answer = json.loads(data)
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        raise TransferError(
            failure,
            "RuntimeError: Failed to decode NixlHandshakePayload. This likely indicates an "
            "incompatibility between connector version.",
        )
    return answer


class _Channel(socketserver.StreamRequestHandler):
    timeout = CHANNEL_IDLE  # a silent client is dropped

    def handle(self) -> None:
        kv, engine = self.server.kv, self.server.engine  # type: ignore[attr-defined]
        while True:
            try:
                line = self.rfile.readline(MAX_LINE + 1)
            except OSError:
                return
            if not line:
                return
            if len(line) > MAX_LINE or not line.endswith(b"\n"):
                answer = {"ok": False, "error": f"a line is at most {MAX_LINE} bytes"}
                with contextlib.suppress(OSError):
                    self.wfile.write(json.dumps(answer).encode() + b"\n")
                return
            answer = kv.answer_line(engine, line)
            try:
                self.wfile.write(json.dumps(answer).encode() + b"\n")
            except OSError:
                return


class _Server(socketserver.ThreadingTCPServer):
    allow_reuse_address = True  # as ZMQ's listener: a restart binds while old sockets linger
    daemon_threads = True


def _listen(kv: KVTransfer, engine: Engine) -> socketserver.ThreadingTCPServer:
    """Bind ``engine``'s side channel and serve it in a thread; SimError as ZMQ's bind fails."""
    path = f"tcp://{engine.host}:{engine.port}"
    family = _family(engine.host)
    try:
        if not engine.host:
            raise OSError(22, "Invalid argument")
        try:
            addr = socket.getaddrinfo(
                engine.host.strip("[]"), engine.port, family, socket.SOCK_STREAM, 0,
                socket.AI_PASSIVE,
            )[0][4]  # fmt: skip
        except socket.gaierror:
            raise OSError(19, "No such device") from None
        server_cls = type("_Server", (_Server,), {"address_family": family})
        server = server_cls(addr, _Channel, bind_and_activate=False)
        try:
            server.server_bind()
            server.server_activate()
        except BaseException:
            server.server_close()
            raise
    except (OSError, OverflowError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise SimError(
            f"zmq.error.ZMQError: {why} (addr='{path}'): the NIXL side channel of engine "
            f"{engine.engine_id} cannot listen (VLLM_NIXL_SIDE_CHANNEL_HOST/PORT)"
        ) from None
    server.kv = kv  # type: ignore[attr-defined]
    server.engine = engine  # type: ignore[attr-defined]
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True,
        name=f"nixl_handshake_listener_{engine.rank}",
    )  # fmt: skip
    thread.start()
    return server


def _local_ranks(ns: argparse.Namespace) -> list[int]:
    """This process's data parallel ranks (their side channels are base port + rank)."""
    size = ns.data_parallel_size or 1
    if getattr(ns, "data_parallel_rank", None) is not None:
        return [ns.data_parallel_rank]
    local = getattr(ns, "data_parallel_size_local", None) or size
    start = getattr(ns, "data_parallel_start_rank", None) or 0
    return list(range(start, start + local))


def _compat_hash(ns: argparse.Namespace) -> str:
    """What the simulated compatibility hash covers: the build, model, dtype, KV cache dtype."""
    factors = [VERSION, BUILD["device"], ns.model, str(ns.dtype), str(ns.kv_cache_dtype)]
    return hashlib.sha256(json.dumps(factors).encode()).hexdigest()[:16]


def kv_transfer(
    ns: argparse.Namespace, env: Mapping[str, str], argv: Sequence[str] = ()
) -> KVTransfer | None:
    """The server's NIXL connector from ``--kv-transfer-config`` and the side channel
    variables; None without one (no connector, or another kind). SimError as vLLM refuses the
    configuration. Nothing is bound yet (:meth:`KVTransfer.open`).

    + ns: the parsed arguments
    + env: the server's environment
    + argv: its command line (for the stale-peer switch)
    """
    kv = _object(ns.kv_transfer_config)
    connector = kv.get("kv_connector")
    if not connector:
        return None
    if kv.get("kv_role") is None:
        raise SimError(
            "ValueError: Please specify kv_role when kv_connector is set, supported roles "
            f"are {KV_ROLES}"
        )
    connector = str(connector)
    if "nixl" in connector.lower() and "push" in connector.lower():
        raise SimError(
            f"kv_connector {connector}: the simulation models NIXL's pull connectors only "
            f"({', '.join(PULL_CONNECTORS[BUILD['device']])})"
        )
    if connector not in PULL_CONNECTORS[BUILD["device"]]:
        return None
    extra = _object(kv.get("kv_connector_extra_config"))
    lease = extra.get("kv_lease_duration", DEFAULT_LEASE)
    if isinstance(lease, bool) or not isinstance(lease, (int, float)) or not lease > 0:
        raise SimError(
            f"kv_connector_extra_config.kv_lease_duration is {lease!r}; expected a number of "
            "seconds > 0"
        )
    host = env.get("VLLM_NIXL_SIDE_CHANNEL_HOST", DEFAULT_HOST)
    raw_port = env.get("VLLM_NIXL_SIDE_CHANNEL_PORT", str(DEFAULT_PORT))
    try:
        base = int(raw_port)
    except ValueError:
        raise SimError(
            f"ValueError: invalid literal for int() with base 10: {raw_port!r} "
            "(VLLM_NIXL_SIDE_CHANNEL_PORT)"
        ) from None
    engine_id = str(kv.get("engine_id") or uuid.uuid4())
    dp = (ns.data_parallel_size or 1) > 1
    engines = [
        Engine(r, f"{engine_id}_dp{r}" if dp or r > 0 else engine_id, host, base + r)
        for r in _local_ranks(ns)
    ]
    return KVTransfer(
        connector=connector,
        kv_role=str(kv["kv_role"]),
        policy=str(kv.get("kv_load_failure_policy") or "fail"),
        lease=float(lease),
        enforce_compat=extra.get("enforce_handshake_compat", True) is not False,
        engines=engines,
        compat_hash=_compat_hash(ns),
        block_size=int(ns.block_size or DEFAULT_BLOCK_SIZE),
        tp_size=int(ns.tensor_parallel_size or 1),
        pp_size=int(getattr(ns, "pipeline_parallel_size", None) or 1),
        dcp_size=int(getattr(ns, "decode_context_parallel_size", None) or 1),
        stale=fault_switch(env, "stale-peer", argv) is not None,
    )
