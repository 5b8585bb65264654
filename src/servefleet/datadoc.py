"""The README's data table, generated from ``servefleet/defaults.py`` (keys, defaults, comments).

    python -m servefleet.datadoc        # print the table
A unit test checks that the README holds exactly this table.
"""

from __future__ import annotations

import ast
import re
from importlib.resources import files

from servefleet.defaults import DEFAULTS

BEGIN = "<!-- data-table: begin (python -m servefleet.datadoc) -->"
END = "<!-- data-table: end -->"
SOURCE = "src/servefleet/defaults.py"  # how the table names the file for a long default


def data_table() -> str:
    """A Markdown table: one row per data key, with its default and its comment."""
    source = (files("servefleet") / "defaults.py").read_text(encoding="utf-8")
    lines = source.splitlines()
    rows = ["| key | default | meaning |", "| --- | --- | --- |"]
    for node in ast.parse(source).body:
        if not isinstance(node, ast.Assign) or not isinstance(node.targets[0], ast.Name):
            continue
        if node.targets[0].id not in DEFAULTS:  # PREFIXES, DEFAULTS
            continue
        first = lines[node.lineno - 1]
        comment = first.split("  # ", 1)[1].strip() if "  # " in first else ""
        default = ast.get_source_segment(source, node.value) or ""
        if "\n" in default:
            default = f"(see {SOURCE})"
        default = re.sub(r"\|", r"\\|", default)
        rows.append(f"| `{node.targets[0].id}` | `{default}` | {comment.replace('|', '/')} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(data_table(), end="")
