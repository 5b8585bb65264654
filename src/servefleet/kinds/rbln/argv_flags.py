"""The flag classification of the argv scan, built at import from the compile-input table.

Which ``vllm serve`` flags are switches (take no value) and which always take a value, and
vLLM's one-dash spellings: the scan reads ``--flag v`` and ``-tp 2`` the way vLLM's parser does.
"""

from __future__ import annotations

import functools

from servefleet.base import flags as vllm_flags
from servefleet.kinds.rbln.compile_table import COMPILE_INPUTS
from servefleet.kinds.rbln.compile_values import parse_bool


@functools.cache
def short_spellings() -> dict[str, str]:
    """vLLM's one-dash spellings and the long name each stands for (``tp`` ->
    ``tensor-parallel-size``, ``cc`` -> ``compilation-config``, ``q`` -> ``quantization``,
    ``sc`` -> ``speculative-config``, ...), from the flag table of vLLM 0.30.0 (the same on both
    platforms): a spelling the fingerprint does not know would not count."""
    tab = vllm_flags.table("rbln")
    return {
        name[1:]: flag.spelling[2:]
        for name, flag in tab.flags.items()
        if not name.startswith("--") and flag.spelling.startswith("--")
    }


#: Flags that are switches: a following token is never their value.
BOOL_FLAGS = frozenset(
    [e.names[0] for e in COMPILE_INPUTS if e.source == "flag" and e.parse is parse_bool]
    + ["rbln-" + f.replace("_", "-") for f in ("use_custom_sampler", "enable_sub_block_cache")]
    + [
        "trust-remote-code",
        "enable-auto-tool-choice",
        "enable-prefix-caching",
        "enforce-eager",
        "disable-log-requests",
        "disable-log-stats",
        "enable-chunked-prefill",
    ]
)
#: Flags that always take the next token as their value (even one starting with ``-``).
VALUE_FLAGS = frozenset(
    [n for e in COMPILE_INPUTS if e.source == "flag" and e.parse is not parse_bool for n in e.names]
    + [n for e in COMPILE_INPUTS if e.source == "json" for n in e.names]
    + ["speculative-config", "kv-transfer-config", "model", "port", "host", "served-model-name"]
)


def norm_flag(token: str) -> str:
    """``--max_num_seqs`` -> ``max-num-seqs``, ``-tp`` -> ``tensor-parallel-size``; a dotted
    JSON field keeps its own spelling (``speculative-config.num_speculative_tokens``)."""
    head, dot, sub = token.lstrip("-").partition(".")
    head = head.replace("_", "-")
    return short_spellings().get(head, head) + dot + sub
