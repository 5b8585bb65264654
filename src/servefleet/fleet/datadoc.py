"""The data table of ``docs/data.md``, generated from the key table
(:class:`servefleet.settings.table.Settings`): each key's type, the values its check allows, its
default and its meaning.

    python -m servefleet.fleet.datadoc        # print the table (paste it between the markers)

A unit test checks that ``docs/data.md`` holds exactly this table between its markers.
"""

from __future__ import annotations

import copy
import json
import pprint
import re
import textwrap
from dataclasses import asdict, dataclass, fields
from typing import Any

from servefleet.kinds import KINDS
from servefleet.kinds.rbln import defaults as rbln
from servefleet.settings.checks import Refused
from servefleet.settings.table import DEFAULTS, DOCS, Settings

BEGIN = "<!-- data-table: begin (python -m servefleet.fleet.datadoc) -->"
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


@dataclass(frozen=True)
class KeyDoc:
    """One data key as the key table documents it.

    + name: the key
    + type: its type as data gives it (``list[str]``, ``str | None``)
    + allowed: what its check allows, in the words of its refusal
    + default: its default, as data gives it (the RBLN stack's for a kind's own keys)
    + default_from: where a default that is not written in the key table lives, else ""
    + kinds: the recipe kinds with a default of their own for it (``vllm``)
    + meaning: its one-line meaning
    """

    name: str
    type: str
    allowed: str
    default: Any
    default_from: str
    kinds: tuple[str, ...]
    meaning: str

    def shown_default(self) -> str:
        """The default as the data table shows it (a kind's defaults: where they live)."""
        shown = f"(see {self.default_from})" if self.default_from else _literal(self.default)
        if self.kinds:
            shown += f"; {', '.join(self.kinds)} recipes: src/servefleet/kinds/{self.kinds[0]}/defaults.py"
        return shown

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "kinds": list(self.kinds)}


def key_docs() -> list[KeyDoc]:
    """Every data key of the key table, in its order."""
    kind_values = [v for k, v in vars(rbln).items() if k.isupper()]
    field_of = {f.name: f for f in fields(Settings)}
    out = []
    for key, value in DEFAULTS.items():
        field = field_of[key]
        out.append(
            KeyDoc(
                name=key,
                type=_type(field.type),
                allowed=_allowed(field.metadata["check"]),
                default=copy.deepcopy(value),
                default_from=KIND_DEFAULTS if any(value is v for v in kind_values) else "",
                kinds=tuple(k.kind for k in KINDS if key in k.defaults),
                meaning=DOCS[key],
            )
        )
    return out


def _python(value: Any, width: int = 92) -> list[str]:
    """A default as the lines of a Python literal (``pprint``: a long one wraps)."""
    return pprint.pformat(value, width=width, sort_dicts=False).splitlines()


def _wrap(text: str, first: str, rest: str | None = None, width: int = 96) -> list[str]:
    return textwrap.wrap(text, width, initial_indent=first, subsequent_indent=rest or first,
                         break_on_hyphens=False, break_long_words=False)  # fmt: skip


def key_help(doc: KeyDoc) -> str:
    """One key as ``servefleet keys NAME`` prints it (as ``ansible-doc`` does): its name and
    type, meaning, allowed values and default (a Python literal, as group_data takes it)."""
    lines = [f"{doc.name} ({doc.type})", *_wrap(doc.meaning, "    ")]
    if doc.allowed:
        lines += _wrap(f"allowed: {doc.allowed}", "    ", "             ")
    default = _python(doc.default, 84)
    lines.append(f"    default: {default[0]}")
    lines += [f"             {line}" for line in default[1:]]
    if doc.default_from:
        lines.append(f"    (the RBLN stack's, from {doc.default_from})")
    lines += [f"    {kind} recipes: their own default (servefleet/kinds/{kind}/defaults.py)"
              for kind in doc.kinds]  # fmt: skip
    return "\n".join(lines)


def commented(doc: KeyDoc) -> list[str]:
    """One key as group_data shows it, commented: its meaning, type and allowed values, then
    ``# key = default`` (a Python literal; uncommented, the data is the default)."""
    lines = [*_wrap(doc.meaning, "# "), f"# type: {doc.type}"]
    if doc.allowed:
        lines += _wrap(f"allowed: {doc.allowed}", "# ", "#          ")
    if doc.kinds:
        lines.append(f"# default: the RBLN stack's; {', '.join(doc.kinds)} recipes have their own")
    value = _python(doc.default)
    pad = " " * len(f"{doc.name} = ")
    return [*lines, f"# {doc.name} = {value[0]}", *(f"# {pad}{line}" for line in value[1:])]


def data_table() -> str:
    """A Markdown table: one row per data key, with its type, allowed values, default and
    meaning."""
    rows = ["| key | type | allowed | default | meaning |", "| --- | --- | --- | --- | --- |"]
    for doc in key_docs():
        rows.append(
            f"| `{doc.name}` | {_code(doc.type)} | {_code(doc.allowed) if doc.allowed else ''} "
            f"| {_code(doc.shown_default())} | {doc.meaning.replace('|', '/')} |"
        )
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(data_table(), end="")
