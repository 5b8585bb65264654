"""The argv scan: a ``vllm serve`` argv read the way vLLM's parser reads it.

``--flag=v`` equals ``--flag v``, ``--max_num_seqs`` equals ``--max-num-seqs``, a one-dash
spelling stands for its long name, the last occurrence wins, and a JSON config flag merges its
dotted fields (``--speculative-config.num_speculative_tokens 2``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from servefleet.base.errors import RecipeError
from servefleet.kinds.loader import load_json_text
from servefleet.kinds.rbln.argv_flags import BOOL_FLAGS, VALUE_FLAGS, norm_flag


@dataclass
class ScannedArgv:
    """A ``vllm serve`` argv read the way vLLM's parser reads it (last occurrence wins).

    + positionals: non-flag tokens after the launcher (the model first)
    + flags: normalised flag name -> value (``True``/``False`` for switches)
    + dotted: ``speculative-config`` -> {field: value} from ``--speculative-config.field v``
    """

    positionals: list[str]
    flags: dict[str, Any]
    dotted: dict[str, dict[str, Any]]


def scan_argv(argv: Sequence[str]) -> ScannedArgv:
    """Read flags and positionals of a ``vllm serve`` argv.

    + argv: the full command, launcher first (``vllm serve MODEL --flag v ...``)
    """
    rest = list(argv[2:]) if len(argv) > 1 and argv[1] == "serve" else list(argv[1:])
    out = ScannedArgv([], {}, {})
    i = 0
    while i < len(rest):
        tok = rest[i]
        i += 1
        if not tok.startswith("-") or tok == "-":
            out.positionals.append(tok)
            continue
        name, eq, value = tok.partition("=")
        flag = norm_flag(name)
        head, dot, sub = flag.partition(".")
        if eq:
            val: Any = value
        elif flag in BOOL_FLAGS or (flag.startswith("no-") and flag[3:] in BOOL_FLAGS):
            val = None
        elif i < len(rest) and (flag in VALUE_FLAGS or dot or not rest[i].startswith("-")):
            val = rest[i]
            i += 1
        else:
            val = None
        if val is None:
            if flag.startswith("no-"):
                out.flags[flag[3:]] = False
            else:
                out.flags[flag] = True
        elif dot:
            try:
                parsed = load_json_text(val, f"--{flag}")
            except RecipeError:
                parsed = val  # a dotted value that is not JSON is a string
            out.dotted.setdefault(head, {})[sub] = parsed
        else:
            out.flags[flag] = val
    return out


def json_value(scanned: ScannedArgv, flag: str) -> Any:
    """A JSON config flag's value: the object with its dotted fields merged, the text when it
    is not a JSON object (vLLM's ``union_dict_and_str``), or None when absent."""
    try:
        return json_flag(scanned, flag)
    except RecipeError:
        return scanned.flags.get(flag)


def json_flag(scanned: ScannedArgv, flag: str) -> dict[str, Any] | None:
    """A JSON-valued flag (``speculative-config``) merged with its dotted fields; None if absent.

    + scanned: the scanned argv
    + flag: the flag name without ``--``
    """
    raw = scanned.flags.get(flag)
    if raw is None and flag not in scanned.dotted:
        return None
    value: dict[str, Any] = {}
    if isinstance(raw, str):
        loaded = load_json_text(raw, f"--{flag}: not valid JSON: {raw[:80]!r}")
        if not isinstance(loaded, dict):
            raise RecipeError(f"--{flag}: expected a JSON object, got {raw[:80]!r}")
        value.update(loaded)
    value.update(scanned.dotted.get(flag, {}))
    return value
