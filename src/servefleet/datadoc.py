"""The README's data table, generated from the key table (:class:`servefleet.settings.Settings`).

    python -m servefleet.datadoc        # print the table
A unit test checks that the README holds exactly this table.
"""

from __future__ import annotations

import json
from typing import Any

from servefleet.kinds import KINDS
from servefleet.kinds.rbln import defaults as rbln
from servefleet.settings import DEFAULTS, DOCS

BEGIN = "<!-- data-table: begin (python -m servefleet.datadoc) -->"
END = "<!-- data-table: end -->"
KIND_DEFAULTS = "src/servefleet/kinds/rbln/defaults.py"  # where the RBLN stack's defaults live


def _literal(value: Any) -> str:
    """A default as Python source writes it (``"3.5.1"``, ``None``, ``["--silent"]``)."""
    if value is None or isinstance(value, (bool, int)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_literal(v) for v in value) + "]"
    return "{" + ", ".join(f"{_literal(k)}: {_literal(v)}" for k, v in value.items()) + "}"


def data_table() -> str:
    """A Markdown table: one row per data key, with its default and its meaning."""
    kind_values = [v for k, v in vars(rbln).items() if k.isupper()]
    rows = ["| key | default | meaning |", "| --- | --- | --- |"]
    for key, value in DEFAULTS.items():
        shown = (
            f"(see {KIND_DEFAULTS})" if any(value is v for v in kind_values) else _literal(value)
        )
        over = [k.kind for k in KINDS if key in k.defaults]
        if over:
            shown += f"; {', '.join(over)} recipes: src/servefleet/kinds/{over[0]}/defaults.py"
        shown = shown.replace("|", "\\|")
        rows.append(f"| `{key}` | `{shown}` | {DOCS[key].replace('|', '/')} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(data_table(), end="")
