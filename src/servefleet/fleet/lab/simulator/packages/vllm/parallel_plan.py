"""Where one ``vllm serve`` stands in a multi-node group: vLLM 0.30.0's own derivation of the
node and data parallel ranks from the arguments, with its refusals in its words, and the
arguments every rank of a group must agree on. A SIMULATION for the servefleet lab; the group's
rendezvous itself is :mod:`vllm.rendezvous`.

Read from vLLM 0.30.0's source (``vllm/entrypoints/cli/serve.py``: ``ServeSubcommand.cmd``,
``run_headless``; ``vllm/engine/arg_utils.py``: ``EngineArgs.create_engine_config``;
``vllm/config/parallel.py``: ``ParallelConfig``; ``vllm/v1/engine/utils.py``:
``launch_core_engines``), in the order vLLM checks:

- ``--headless`` with ``--api-server-count`` > 0 is refused; more than one data parallel load
  balancing mode (multi-port, external: ``--data-parallel-external-lb`` or
  ``--data-parallel-rank``, hybrid: ``--data-parallel-hybrid-lb`` or
  ``--data-parallel-start-rank``) is refused.
- ``--headless`` with ``--data-parallel-hybrid-lb`` fails vLLM's assertion; hybrid and external
  together are refused; ``--nnodes`` > 1 needs ``--data-parallel-backend mp`` and must divide
  the world size (data x pipeline x tensor x prefill context parallel), and ``--node-rank``
  must be below ``--nnodes``.
- With ``--nnodes`` > 1 the data parallel rank is inferred from the node rank (``node_rank x
  local world size // world size within a DP rank``), and so is ``--data-parallel-size-local``
  when not given (``max(local world size // world size within DP, 1)``).
- External LB needs a data parallel rank and a local size of 1; ``--data-parallel-start-rank``
  without ``--headless`` makes the mode hybrid, and hybrid with a local size of 1 switches to
  external (vLLM's warning); a local size equal to the DP size turns hybrid off.
- The DP address is ``--data-parallel-address``, else ``--master-addr`` (127.0.0.1); the RPC
  port ``--data-parallel-rpc-port``, else 29550; the torch.distributed master
  ``--master-addr``:``--master-port`` (29501).
- ``ParallelConfig`` refuses a negative node rank, ``--nnodes`` 0, a DP rank outside
  ``[0, DP size)`` and ``--nnodes`` > 1 with ``--distributed-executor-backend ray``.
- A headless server needs a local DP size > 0; a server with an API server whose DP rank is
  above 0 needs external or hybrid LB (vLLM's assertion in ``launch_core_engines``).

Not modelled: whether the model is a mixture of experts (vLLM refuses external DP for dense
models and checks the DP ranks' config hash only for MoE ones; here every model counts as MoE,
as every recipe's multi-node DP strategy serves one), Ray, elastic EP.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .common import CONFIG_FIELDS, SimError, _log

MASTER_PORT = 29501  # ParallelConfig.master_port (the flag table's default too)
DP_RPC_PORT = 29550  # ParallelConfig.data_parallel_rpc_port
NCCL_TIMEOUT = 600  # torch's default process group timeout for NCCL (distributed_timeout_seconds)
HANDSHAKE_TIMEOUT = 300  # vllm/v1/engine/core.py: HANDSHAKE_TIMEOUT_MINS = 5
INVALID = "Invalid data-parallel launch options: "
PYDANTIC = "pydantic_core._pydantic_core.ValidationError: 1 validation error for ParallelConfig: "

# The factors of vLLM's ParallelConfig.compute_hash that a flag sets (what vLLM compares across
# DP ranks before they serve: "Configuration mismatch detected"); the real wheel's list is read
# by tests/unit/test_sim_multinode.py when the real-wheel tier is built
PARALLEL_HASH_FIELDS = (
    "pipeline_parallel_size", "tensor_parallel_size", "prefill_context_parallel_size",
    "data_parallel_size", "dp_sync_interval", "enable_expert_parallel",
    "enable_batch_sharded_sampling", "enable_ep_weight_filter", "enable_eplb", "eplb_config",
    "expert_placement_strategy", "all2all_backend", "enable_elastic_ep", "elastic_ep_max_dp_size",
    "enable_dbo", "ubatch_size", "dbo_decode_token_threshold", "dbo_prefill_token_threshold",
    "disable_nccl_for_dp_synchronization", "distributed_timeout_seconds",
    "cpu_distributed_timeout_seconds", "decode_context_parallel_size",
    "dcp_kv_cache_interleave_size", "dcp_comm_backend", "dcp_q_replicate",
    "cp_kv_cache_interleave_size", "enable_fault_tolerance", "fault_tolerance_config",
)  # fmt: skip
# What every rank of a group must be started with alike, by argparse dest. vLLM builds each
# node's config from that node's own arguments and checks only the parallel hash across DP
# ranks; what else differs shows as NCCL collectives over tensors of other shapes or counts
# (a failure or a hang). The set: the parallel hash's factors, what shapes the computation
# graph (the config hash the compile cache keys on, CONFIG_FIELDS, less the executor backend,
# which vLLM's parallel hash ignores: an unset one is mp across nodes), the weights' revision,
# the scheduler's batch bounds (every worker's input buffers), the speculative config (the
# number of forward passes a step) and --nnodes (the world size). Not compared: what is the
# node's own (ranks, addresses, ports, --headless, the API server's flags, devices).
GROUP_FIELDS = tuple(
    dict.fromkeys(
        [f for f in CONFIG_FIELDS if f != "distributed_executor_backend"]
        + ["revision", "max_num_seqs", "speculative_config", "nnodes"]
        + list(PARALLEL_HASH_FIELDS)
    )
)


@dataclass(frozen=True)
class Plan:
    """One server's place: its node, its DP engines, its group's addresses and timeout."""

    nnodes: int
    node_rank: int
    master_addr: str
    master_port: int
    headless: bool
    world_within_dp: int  # tensor x pipeline x prefill context parallel
    dp_size: int
    dp_local: int  # DP engines on this node
    dp_rank: int  # the first of them
    dp_address: str
    dp_rpc_port: int
    hybrid: bool
    external: bool
    timeout: int  # seconds: the distributed timeout (torch's rendezvous)

    @property
    def nnodes_within_dp(self) -> int:
        """Nodes one DP rank spans (ParallelConfig.nnodes_within_dp)."""
        if self.nnodes == 1:
            return 1
        return max(1, self.nnodes // max(1, self.dp_size // max(1, self.dp_local)))

    @property
    def node_rank_within_dp(self) -> int:
        return self.node_rank % self.nnodes_within_dp

    @property
    def local_world(self) -> int:
        """Workers (GPUs) a DP rank has on this node (ParallelConfig.local_world_size)."""
        return self.world_within_dp // self.nnodes_within_dp

    @property
    def group(self) -> str | None:
        """``nodes`` (torch.distributed across ``--nnodes`` nodes, at the master address),
        ``dp`` (DP engines of other nodes handshaking with the DP address) or None (alone).
        A headless node rank 0 runs DP engines that look for a front-end at the DP address."""
        if self.nnodes > 1 and not (self.node_rank == 0 and self.headless):
            return "nodes"
        if self.headless or self.dp_local < self.dp_size:
            return "dp"
        return None

    @property
    def head(self) -> bool:
        """Whether the others join this server: node rank 0, or the DP rank 0 front-end."""
        if self.group == "nodes":
            return self.node_rank == 0
        return self.group == "dp" and not self.headless and self.dp_rank == 0

    @property
    def address(self) -> tuple[str, int]:
        """Where the group meets."""
        if self.group == "nodes":
            return self.master_addr, self.master_port
        return self.dp_address, self.dp_rpc_port

    @property
    def dp_ranks(self) -> tuple[int, int]:
        """The DP ranks this node's engines hold: [first, end)."""
        return self.dp_rank, self.dp_rank + self.dp_local

    @property
    def remote_headless(self) -> bool:
        """What a DP head requires of the remote engines: headless unless in hybrid or
        external LB mode (``wait_for_engine_startup``)."""
        return not self.hybrid and not self.external


def check_serve_modes(ns: argparse.Namespace) -> None:
    """What ``ServeSubcommand.cmd`` refuses before the API server is set up: ``--headless``
    with API servers, more than one load balancing mode.

    + ns: the parsed arguments
    """
    if ns.headless and ns.api_server_count is not None and ns.api_server_count > 0:
        raise SimError(
            f"ValueError: --api-server-count={ns.api_server_count} cannot be used with "
            "--headless (no API servers are started in headless mode)."
        )
    external = ns.data_parallel_external_lb or ns.data_parallel_rank is not None
    multi = ns.data_parallel_multi_port_external_lb
    hybrid = ns.data_parallel_hybrid_lb if (ns.data_parallel_hybrid_lb or multi) else (
        ns.data_parallel_start_rank is not None
    )  # fmt: skip
    if sum([bool(multi), bool(external), bool(hybrid)]) > 1:
        raise SimError(
            "ValueError: Cannot use more than one data parallel load balancing mode. Choose one "
            "of: --data-parallel-multi-port-external-lb, --data-parallel-external-lb (or "
            "--data-parallel-rank), --data-parallel-hybrid-lb (or --data-parallel-start-rank)."
        )


def _nodes(ns: argparse.Namespace, within: int) -> int:
    """``create_engine_config`` with ``--nnodes`` > 1: its checks, the inferred DP rank (and the
    DP rank and local size it fills in); returns the inferred rank."""
    if ns.nnodes <= 1:
        return 0
    if ns.data_parallel_backend != "mp":
        raise SimError(
            f"ValueError: {INVALID}`--nnodes {ns.nnodes}` requires `--data-parallel-backend mp`; "
            f"got `--data-parallel-backend {ns.data_parallel_backend}`. Use the MP backend or set "
            "`--nnodes 1`."
        )
    world = ns.data_parallel_size * within
    if world % ns.nnodes != 0:
        raise SimError(
            f"ValueError: {INVALID}`--nnodes {ns.nnodes}` must evenly divide the total world size "
            f"({world}). Adjust `--nnodes`, `--data-parallel-size`, `--pipeline-parallel-size`, "
            "`--tensor-parallel-size`, or `--prefill-context-parallel-size`."
        )
    if not 0 <= ns.node_rank < ns.nnodes:
        raise SimError(
            f"ValueError: {INVALID}`--node-rank` must be between 0 and {ns.nnodes - 1}; got "
            f"`--node-rank {ns.node_rank}`. Set it to this node's zero-based index."
        )
    local_world = world // ns.nnodes
    inferred = (ns.node_rank * local_world) // within
    if ns.data_parallel_size > 1 and ns.data_parallel_external_lb:
        ns.data_parallel_rank = inferred
        _log(
            f"Inferred data_parallel_rank {inferred} from node_rank {ns.node_rank} for external lb"
        )
    elif ns.data_parallel_size_local is None:
        ns.data_parallel_size_local = max(local_world // within, 1)
    return inferred


def _dp_mode(ns: argparse.Namespace, headless: bool, inferred: int) -> tuple[int, bool, bool]:
    """``create_engine_config``'s load balancing mode: (local DP size, hybrid, external); sets
    the DP rank on ``ns``."""
    external = bool(ns.data_parallel_external_lb or ns.data_parallel_rank is not None)
    hybrid = bool(ns.data_parallel_hybrid_lb)
    if ns.enable_fault_tolerance and not external:
        raise SimError(
            "ValueError: Fault tolerance requires external load balancer mode "
            "(--data-parallel-external-lb or --data-parallel-rank). Internal LB mode is not "
            "supported."
        )
    local: int
    if external:
        if ns.data_parallel_rank is None:
            raise SimError(
                f"ValueError: {INVALID}`--data-parallel-external-lb` requires a data-parallel "
                "rank. Set `--data-parallel-rank`, or set `--data-parallel-size` greater than 1 "
                "and use `--nnodes` with `--node-rank` so the rank can be inferred."
            )
        if ns.data_parallel_size_local not in (1, None):
            raise SimError(
                f"ValueError: {INVALID}an external data-parallel rank requires "
                f"`--data-parallel-size-local 1`; got {ns.data_parallel_size_local}. Set it to 1 "
                "or omit it."
            )
        return 1, False, True
    if ns.data_parallel_size_local is not None:
        local = ns.data_parallel_size_local
        if ns.data_parallel_start_rank is not None and not headless:
            hybrid = True  # vLLM infers hybrid LB
        if hybrid and local == 1:
            _log(
                "data_parallel_hybrid_lb is not eligible when data_parallel_size_local = 1, "
                "autoswitch to data_parallel_external_lb.",
                "WARNING",
            )
            external, hybrid = True, False
        if local == ns.data_parallel_size:
            hybrid = False
        start = ns.data_parallel_start_rank
        ns.data_parallel_rank = start if start is not None else inferred
        if ns.nnodes > 1:
            _log(
                f"Inferred data_parallel_rank {ns.data_parallel_rank} from node_rank {ns.node_rank}"
            )
        return local, hybrid, external
    if hybrid:
        raise SimError(
            f"ValueError: {INVALID}`--data-parallel-hybrid-lb` requires "
            "`--data-parallel-size-local`. Set it to the number of data-parallel ranks on this "
            "node."
        )
    return ns.data_parallel_size, hybrid, external


def _parallel_config(ns: argparse.Namespace, local: int) -> None:
    """``ParallelConfig``'s field bounds and ``__post_init__`` checks, pydantic's message."""
    for name in ("node_rank", "nnodes"):
        bound = 0 if name == "node_rank" else 1
        value = getattr(ns, name)
        if value < bound:
            raise SimError(
                f"{PYDANTIC}{name} Input should be greater than or equal to {bound} "
                f"[input_value={value}]"
            )
    rank, size = ns.data_parallel_rank or 0, ns.data_parallel_size
    if (size > 1 or local == 0) and not 0 <= rank < size:
        raise SimError(
            f"{PYDANTIC}Value error, data_parallel_rank ({rank}) must be in the range [0, {size})"
        )
    if ns.nnodes > 1 and ns.distributed_executor_backend not in (None, "mp", "uni", "external_launcher"):  # fmt: skip
        raise SimError(
            f"{PYDANTIC}Value error, nnodes > 1 can only be set when distributed executor backend "
            "is mp, uni or external_launcher."
        )


def plan_of(ns: argparse.Namespace) -> Plan:
    """This server's :class:`Plan` (after :func:`check_serve_modes`), refused as vLLM's
    ``create_engine_config`` refuses (SimError, its words), in vLLM's order (the module's
    docstring). Fills in what vLLM fills in on ``ns``
    (``data_parallel_rank``, ``data_parallel_size_local``).

    + ns: the parsed arguments
    """
    headless = bool(ns.headless)
    if headless and ns.data_parallel_hybrid_lb:
        raise SimError("AssertionError: data_parallel_hybrid_lb is not applicable in headless mode")
    if ns.data_parallel_hybrid_lb and ns.data_parallel_external_lb:
        raise SimError(
            f"ValueError: {INVALID}`--data-parallel-hybrid-lb` and `--data-parallel-external-lb` "
            "cannot be enabled together. Enable only one load-balancing mode."
        )
    pcp = getattr(ns, "prefill_context_parallel_size", 1) or 1
    within = ns.pipeline_parallel_size * ns.tensor_parallel_size * pcp
    inferred = _nodes(ns, within)
    local, hybrid, external = _dp_mode(ns, headless, inferred)
    _parallel_config(ns, local)
    if headless and local <= 0:
        raise SimError("ValueError: data_parallel_size_local must be > 0 in headless mode")
    dp_rank = ns.data_parallel_rank or 0
    plan = Plan(
        nnodes=ns.nnodes, node_rank=ns.node_rank, master_addr=ns.master_addr,
        master_port=ns.master_port, headless=headless, world_within_dp=within,
        dp_size=ns.data_parallel_size, dp_local=local, dp_rank=dp_rank,
        dp_address=ns.data_parallel_address or ns.master_addr or "127.0.0.1",
        dp_rpc_port=ns.data_parallel_rpc_port or DP_RPC_PORT, hybrid=hybrid, external=external,
        timeout=ns.distributed_timeout_seconds or NCCL_TIMEOUT,
    )  # fmt: skip
    if not headless and dp_rank > 0 and not (hybrid or external):
        if _api_servers(ns, hybrid, external) > 1:
            raise SimError("AssertionError")  # run_multi_api_server's bare assert
        raise SimError(
            "AssertionError: Attempting to launch core_engines from dp_rank > 0, but found "
            "internal DPLB, which is incompatible."
        )
    return plan


def _api_servers(ns: argparse.Namespace, hybrid: bool, external: bool) -> int:
    """How many API servers ``vllm serve`` defaults to (``ServeSubcommand.cmd``)."""
    if ns.api_server_count is not None:
        return int(ns.api_server_count)
    if external or ns.data_parallel_multi_port_external_lb:
        return 1
    if ns.data_parallel_start_rank is not None or ns.data_parallel_hybrid_lb:
        return int(ns.data_parallel_size_local or 1)
    return int(ns.data_parallel_size)


def _canonical(value: Any) -> Any:
    """A value as JSON compares it (config objects with sorted keys)."""
    return json.loads(json.dumps(value, sort_keys=True, default=str))


def group_args(ns: argparse.Namespace) -> dict[str, Any]:
    """The values of :data:`GROUP_FIELDS` this server was started with.

    + ns: the parsed arguments
    """
    return {f: _canonical(getattr(ns, f, None)) for f in GROUP_FIELDS}


def args_hash(args: Mapping[str, Any]) -> str:
    """A short digest of :func:`group_args`' values (what the DP check's message shows)."""
    text = json.dumps(args, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def differences(
    head: Mapping[str, Any], other: Mapping[str, Any], flags: Mapping[str, str]
) -> list[tuple[str, Any, Any]]:
    """The arguments two ranks disagree on: (flag, head's value, other's value), in
    :data:`GROUP_FIELDS`' order.

    + head: the head's :func:`group_args`
    + other: the joining rank's
    + flags: dest -> the flag's spelling
    """
    return [
        (flags.get(f, f), head.get(f), other.get(f))
        for f in GROUP_FIELDS
        if head.get(f) != other.get(f)
    ]
