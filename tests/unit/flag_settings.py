"""vLLM's ``vllm serve`` flags as the flag table has them (flags.py's dump of vllm-rbln's parser,
the reference data's ``rbln`` table), and two settings of each made from what the table says it takes, for the fingerprint's
tests (test_compile_table_vs_flags.py, test_fingerprint_property.py)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from servefleet.base.vllm_reference import reference


def dump(path: Path) -> Any:
    """A dump of the reference data (the configs dump starts with vLLM's log line)."""
    text = path.read_text(encoding="utf-8")
    return json.loads(text[text.index("{") :])


FLAGS = [e for e in dump(reference().tables["rbln"].flags)["flags"] if e["action"] != "_HelpAction"]


def spelling(entry: dict[str, Any]) -> str:
    """The flag's long spelling (``--tensor-parallel-size``)."""
    return next(f for f in entry["flags"] if f.startswith("--") and not f.startswith("--no-"))


def settings(
    entry: dict[str, Any], json_values: Callable[[dict[str, Any]], list[str]]
) -> list[list[str]]:
    """Settings of the flag that differ: a switch on (and off when it has a ``--no-``
    spelling), two of its choices, two JSON values from ``json_values`` for a JSON flag, two
    numbers for a number, two words otherwise.

    + entry: the flag's entry in the dump
    + json_values: the JSON texts to give a JSON flag
    """
    flag = spelling(entry)
    if entry["nargs"] == 0:
        off = [f for f in entry["flags"] if f.startswith("--no-")]
        return [[flag], [off[0]]] if off else [[flag]]
    if entry["choices"]:
        return [[flag, str(c)] for c in entry["choices"][:2]]
    kind = str(entry["type"])
    if any(t in kind for t in ("loads", "dataclass", "dict")) or entry["dest"].endswith("config"):
        return [[flag, v] for v in json_values(entry)]
    if "int" in kind or "float" in kind:
        return [[flag, "3"], [flag, "5"]]
    return [[flag, "aa"], [flag, "bb"]]
