"""The ``servefleet resolve`` options a vLLM recipe takes (:class:`ResolveOption`: the CLI builds
its click options from them; the keywords are :meth:`Vllm.resolve`'s)."""

from __future__ import annotations

from servefleet.kinds.base import ResolveOption

OPTIONS = (
    ResolveOption("--hardware", "hardware", "GPU id (h200, mi300x, b200, ...)."),
    ResolveOption("--variant", "variant", "recipe variant."),
    ResolveOption("--tp", "tp", "tensor-parallel size override.", type=int),
    ResolveOption(
        "--feature",
        "features",
        "turn a feature on (or pick its mode).",
        metavar="NAME[=MODE]",
        multiple=True,
    ),
    ResolveOption(
        "--no-feature", "no_features", "turn a feature off.", metavar="NAME", multiple=True
    ),
    ResolveOption(
        "--kv-offload", "kv_offload", "a KV-offload option of the taxonomy.", metavar="NAME"
    ),
    ResolveOption("--task", "task", "an omni recipe's task (default: its first)."),
    ResolveOption(
        "--nodes",
        "nodes",
        "a multi-node strategy: the hosts it spans (default: the fewest it runs on).",
        type=int,
    ),
    ResolveOption(
        "--pool-parallelism",
        "pool_parallelism",
        "pd_cluster only: the prefill and decode pools' parallelism (default: the recipe's).",
        metavar="tp|tep|dep",
    ),
)
