"""The data table of ``docs/data.md``, generated from the key table
(:class:`servefleet.settings.Settings`): each key's type, the values its check allows, its
default and its meaning.

    python -m servefleet.datadoc        # print the table (paste it between the markers)

A unit test checks that ``docs/data.md`` holds exactly this table between its markers.
"""

from __future__ import annotations

import json
import re
from dataclasses import fields
from typing import Any

from servefleet.checks import Refused
from servefleet.kinds import KINDS
from servefleet.kinds.rbln import defaults as rbln
from servefleet.settings import DEFAULTS, DOCS, Settings

BEGIN = "<!-- data-table: begin (python -m servefleet.datadoc) -->"
END = "<!-- data-table: end -->"
KIND_DEFAULTS = "src/servefleet/kinds/rbln/defaults.py"  # where the RBLN stack's defaults live


class _Unlike:
    """A value no check accepts: the refusal it gets says what each key allows."""

    def __repr__(self) -> str:
        return "<none>"


def _literal(value: Any) -> str:
    """A default as Python source writes it (``"3.5.1"``, ``None``, ``["--silent"]``)."""
    if value is None or isinstance(value, (bool, int)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_literal(v) for v in value) + "]"
    return "{" + ", ".join(f"{_literal(k)}: {_literal(v)}" for k, v in value.items()) + "}"


def _type(annotation: Any) -> str:
    """A key's type as data gives it: lists where the checked value is a tuple, a mapping for
    the indexes (``tuple[str, ...]`` -> ``list[str]``)."""
    text = re.sub(r"tuple\[(\w+), \.\.\.\]", r"list[\1]", str(annotation))
    return text.replace("list[Index]", "dict[str, dict]")


def _allowed(check: Any) -> str:
    """What a key's check allows, in the words of its refusal (a check that depends on
    ``pip_trusted_hosts`` is made for none)."""
    make = getattr(check, "make", None)
    try:
        (make(frozenset()) if make else check)(_Unlike())
    except Refused as refused:
        return refused.allowed
    return ""


def _code(text: str) -> str:
    """A Markdown code span in a table cell (a ``|`` escaped, backticks inside kept)."""
    text = text.replace("|", "\\|")
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def data_table() -> str:
    """A Markdown table: one row per data key, with its type, allowed values, default and
    meaning."""
    kind_values = [v for k, v in vars(rbln).items() if k.isupper()]
    field_of = {f.name: f for f in fields(Settings)}
    rows = ["| key | type | allowed | default | meaning |", "| --- | --- | --- | --- | --- |"]
    for key, value in DEFAULTS.items():
        shown = (
            f"(see {KIND_DEFAULTS})" if any(value is v for v in kind_values) else _literal(value)
        )
        over = [k.kind for k in KINDS if key in k.defaults]
        if over:
            shown += f"; {', '.join(over)} recipes: src/servefleet/kinds/{over[0]}/defaults.py"
        field = field_of[key]
        allowed = _allowed(field.metadata["check"])
        rows.append(
            f"| `{key}` | {_code(_type(field.type))} | {_code(allowed) if allowed else ''} "
            f"| {_code(shown)} | {DOCS[key].replace('|', '/')} |"
        )
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(data_table(), end="")
