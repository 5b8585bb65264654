"""The README's data table, generated from ``group_data/all.py`` (keys, defaults, comments).

    python -m servefleet.datadoc        # print the table
A unit test checks that the README holds exactly this table.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from servefleet.data import GROUP_DATA_ALL

BEGIN = "<!-- data-table: begin (python -m servefleet.datadoc) -->"
END = "<!-- data-table: end -->"


def data_table(path: Path = GROUP_DATA_ALL) -> str:
    """A Markdown table: one row per key of ``path``, with its default and its comment."""
    source = path.read_text()
    lines = source.splitlines()
    rows = ["| key | default | meaning |", "| --- | --- | --- |"]
    for node in ast.parse(source).body:
        if not isinstance(node, ast.Assign) or not isinstance(node.targets[0], ast.Name):
            continue
        first = lines[node.lineno - 1]
        comment = first.split("  # ", 1)[1].strip() if "  # " in first else ""
        default = ast.get_source_segment(source, node.value) or ""
        if "\n" in default:
            default = "(see group_data/all.py)"
        default = re.sub(r"\|", r"\\|", default)
        rows.append(f"| `{node.targets[0].id}` | `{default}` | {comment.replace('|', '/')} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(data_table(), end="")
