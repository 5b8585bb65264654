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

from servefleet.kinds import KINDS, Kind, default_kind
from servefleet.settings.checks import Refused
from servefleet.settings.table import DEFAULTS, DOCS, Settings

BEGIN = "<!-- data-table: begin (python -m servefleet.fleet.datadoc) -->"
END = "<!-- data-table: end -->"
CELL = 40  # a default whose literal is longer is shown in the table by the file it lives in


def defaults_file(kind: Kind, source: bool = True) -> str:
    """Where a kind's defaults live: ``defaults.py`` beside its kind module (``source``: as the
    repository names a file of servefleet's, under ``src/``).

    + kind: the kind
    + source: name it as the repository does
    """
    package = type(kind).__module__.rpartition(".")[0].replace(".", "/")
    top = "src/" if source and package.startswith("servefleet/") else ""
    return f"{top}{package}/defaults.py"


class _Unlike:
    """A value no check accepts: the refusal it gets says what each key allows."""

    def __repr__(self) -> str:
        return "<none>"


def _literal(value: Any) -> str:
    """A default as Python source writes it (``"3.5.1"``, ``None``, ``["--silent"]``)."""
    if value is None or isinstance(value, (bool, int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_literal(v) for v in value) + "]"
    return "{" + ", ".join(f"{_literal(k)}: {_literal(v)}" for k, v in value.items()) + "}"


def _type(field: Any) -> str:
    """A key's type as data gives it: the key's own where the table names one (``given``: the
    pins, the indexes), else its field's with lists where the checked value is a tuple
    (``tuple[str, ...]`` -> ``list[str]``)."""
    if field.metadata.get("given"):
        return str(field.metadata["given"])
    return re.sub(r"tuple\[(\w+), \.\.\.\]", r"list[\1]", str(field.type))


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
    + default: its default, as data gives it (the default kind's for a key the kinds decide)
    + default_from: where a default that is not written in the key table lives (the default
      kind's defaults), else ""
    + by: how the docs name the kind it is from (``RBLN``), else ""
    + kinds: the other recipe kinds with a default of their own for it (``vllm``)
    + meaning: its one-line meaning
    """

    name: str
    type: str
    allowed: str
    default: Any
    default_from: str
    kinds: tuple[str, ...]
    meaning: str
    by: str = ""

    def shown_default(self) -> str:
        """The default as the data table shows it (a kind's that is longer than a cell: where
        it lives)."""
        shown = _literal(self.default)
        if self.default_from and len(shown) > CELL:
            shown = f"(see {self.default_from})"
        if self.kinds:
            shown += f"; {', '.join(self.kinds)} recipes: {_file_of(self.kinds[0], True)}"
        return shown

    def to_json(self) -> dict[str, Any]:
        out = {**asdict(self), "kinds": list(self.kinds)}
        del out["by"]
        return out


def key_docs() -> list[KeyDoc]:
    """Every data key of the key table, in its order."""
    first = default_kind()
    field_of = {f.name: f for f in fields(Settings)}
    out = []
    for key, value in DEFAULTS.items():
        field = field_of[key]
        kinds = tuple(k.kind for k in KINDS if k is not first and key in k.defaults)
        out.append(
            KeyDoc(
                name=key,
                type=_type(field),
                allowed=_allowed(field.metadata["check"]),
                default=copy.deepcopy(value),
                default_from=defaults_file(first) if key in first.defaults else "",
                kinds=kinds,
                meaning=DOCS[key],
                by=first.title if key in first.defaults or kinds else "",
            )
        )
    return out


def _file_of(kind: str, source: bool = False) -> str:
    """Where the defaults of the kind named ``kind`` live."""
    return defaults_file(next(k for k in KINDS if k.kind == kind), source)


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
        lines.append(f"    (the {doc.by} stack's, from {doc.default_from})")
    lines += [f"    {kind} recipes: their own default ({_file_of(kind)})" for kind in doc.kinds]
    return "\n".join(lines)


def commented(doc: KeyDoc) -> list[str]:
    """One key as group_data shows it, commented: its meaning, type and allowed values, then
    ``# key = default`` (a Python literal; uncommented, the data is the default)."""
    lines = [*_wrap(doc.meaning, "# "), f"# type: {doc.type}"]
    if doc.allowed:
        lines += _wrap(f"allowed: {doc.allowed}", "# ", "#          ")
    if doc.kinds:
        lines.append(
            f"# default: the {doc.by} stack's; {', '.join(doc.kinds)} recipes have their own"
        )
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
