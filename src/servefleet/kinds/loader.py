"""Reading recipe files: the one loader every kind's recipes and cards go through.

A recipe is input from outside (a card from a vendor's page, a YAML from a repository), so the
loader refuses, in one line naming the file, what would make a parser misbehave instead of
failing: YAML aliases (a few KB of anchors expand to gigabytes), duplicate keys (the last one
silently wins in json and PyYAML), nesting deeper than :data:`MAX_DEPTH`, numbers longer than
:data:`MAX_DIGITS` digits, numbers that are not finite, files larger than :data:`MAX_BYTES`,
keys that are not printable text (YAML's ``on:`` is a boolean, ``1:`` a number; a line break in
a key would break the one-line error naming it), text holding a NUL or a lone surrogate (no
argument, unit or UTF-8 output can carry them) and a raw control character other than tab and
line breaks (:data:`_RAW`, what YAML's reader refuses; named by line and column).
:func:`load_json_text` reads JSON held inside a recipe's text (an argument's value) under the
same limits.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import yaml

from servefleet.base.errors import RecipeError

MAX_DEPTH = 32  # nesting of lists and mappings a recipe may have
MAX_DIGITS = 18  # digits of one number (no count a recipe names needs more)
MAX_BYTES = 4 * 1024 * 1024  # a recipe file's size


def read_recipe_text(p: Path, label: str) -> str:
    """A recipe file's text; RecipeError naming ``label`` when it cannot be read or is too big."""
    try:
        if p.stat().st_size > MAX_BYTES:
            raise RecipeError(f"{label}: larger than {MAX_BYTES} bytes; allowed: a recipe file")
        return p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise RecipeError(f"{label}: cannot read recipe: {reason}") from None


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _too_deep(label: str) -> str:
    return f"{label}: nested deeper than {MAX_DEPTH} levels; allowed: at most {MAX_DEPTH}"


# No text of a recipe holds a NUL (no process argument or unit can) or a lone surrogate (no
# UTF-8 output can); no key holds a control character or line break (error messages name keys)
_BAD_TEXT = re.compile("[\x00\ud800-\udfff]")
NOT_A_NAME = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")


_NAME = re.compile(r"[A-Za-z0-9_-]+\Z")


def _at(where: str, key: str | int) -> str:
    """The location of ``key`` inside ``where`` (``strategies[0].options``)."""
    if isinstance(key, int):
        return f"{where}[{key}]"
    if not _NAME.match(key):
        return f"{where}[{key!r}]"
    return f"{where}.{key}" if where else key


def _checked(obj: Any, label: str) -> Any:
    """``obj`` when no list or mapping in it is nested deeper than :data:`MAX_DEPTH`, every key
    is a string of printable text, no text holds a NUL or a lone surrogate and every number is
    finite (YAML's ``.inf`` and ``.nan``, JSON's ``Infinity`` and ``NaN``: no count or size a
    recipe names is one, and arithmetic on them overflows)."""
    stack: list[tuple[Any, int, str]] = [(obj, 1, "")]
    while stack:
        item, depth, where = stack.pop()
        if isinstance(item, str):
            bad = _BAD_TEXT.search(item)
            if bad:
                raise RecipeError(
                    f"{label}: {where or 'the document'}: text holding {bad.group()!r}; "
                    "allowed: Unicode text without NUL or lone surrogates"
                )
        elif isinstance(item, float) and not math.isfinite(item):
            raise RecipeError(
                f"{label}: {where or 'the document'}: the number {item}; allowed: finite numbers"
            )
        elif isinstance(item, (dict, list)):
            if depth > MAX_DEPTH:
                raise RecipeError(_too_deep(label))
            if isinstance(item, list):
                stack.extend((v, depth + 1, _at(where, i)) for i, v in enumerate(item))
                continue
            for key, value in item.items():
                if not isinstance(key, str) or NOT_A_NAME.search(key):
                    raise RecipeError(
                        f"{label}: {where or 'the document'}: the key {str(key)[:40]!r}"
                        f"{'' if isinstance(key, str) else f' ({type(key).__name__})'}; allowed: "
                        "keys of printable text (quote a YAML key such as on, off, yes or 1)"
                    )
                stack.append((value, depth + 1, _at(where, key)))
    return obj


# What a recipe file may hold raw, JSON and YAML alike: YAML's printable characters (its reader
# refuses the rest); a control character is written as an escape ("\u001b") inside a string
_RAW = re.compile("[^\t\n\r\x20-\x7e\x85\xa0-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _raw_character(label: str, form: str, text: str, at: int) -> str:
    """The one line refusing the raw character at ``text[at]`` of a ``form`` (JSON, YAML) file."""
    line = text.count("\n", 0, at) + 1
    column = at - (text.rfind("\n", 0, at) + 1) + 1
    return (
        f"{label}: malformed {form} at line {line} column {column}: the character "
        f"U+{ord(text[at]):04X}; allowed: printable text, tabs and line breaks (a control "
        'character as an escape such as "\\u001b" inside a string)'
    )


def _pairs(label: str) -> Any:
    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in pairs:
            if key in out:
                raise RecipeError(f"{label}: duplicate key {key!r}; allowed: each key once")
            out[key] = value
        return out

    return hook


def _digits_ok(text: str, label: str) -> None:
    """Refuse a number whose integer part has more than :data:`MAX_DIGITS` digits (JSON's
    ``-12.5e3``; YAML's ``+1_000``, ``0x1f``, ``1:30:00`` too: Python refuses to convert an int
    of more than 4300 digits, and no count a recipe names needs more than a few)."""
    whole = re.split(r"[.eE]", text.lstrip("+-"), maxsplit=1)[0]
    if text[:2].lower() in ("0x", "0o", "0b") or ":" in text:
        whole = text  # YAML's other bases and sexagesimal: every character counts
    if len(whole.replace("_", "").replace(":", "")) > MAX_DIGITS:
        raise RecipeError(
            f"{label}: the number {text[:24]}... is too long; allowed: at most {MAX_DIGITS} digits"
        )


def _number(label: str, kind: type) -> Any:
    def parse(text: str) -> Any:
        _digits_ok(text, label)
        return kind(text)

    return parse


def load_json(text: str, label: str, start: int | None = None) -> tuple[Any, int]:
    """The JSON value starting at ``text[start]`` and where it ends (``raw_decode``); with no
    ``start``, the whole text is one JSON document.

    + text: the text holding it (a card may sit inside a page's text)
    + label: how errors name the file
    + start: the offset of the value's first character
    """
    decoder = json.JSONDecoder(
        object_pairs_hook=_pairs(label),
        parse_int=_number(label, int),
        parse_float=_number(label, float),
    )
    try:
        if start is None:
            obj, end = decoder.decode(text), len(text)
        else:
            obj, end = decoder.raw_decode(text, start)
    except json.JSONDecodeError as e:
        raise RecipeError(
            f"{label}: malformed JSON at line {e.lineno} column {e.colno}: {e.msg}"
        ) from None
    except RecursionError:
        raise RecipeError(_too_deep(label)) from None
    raw = _RAW.search(text, start or 0, end)
    if raw:
        raise RecipeError(_raw_character(label, "JSON", text, raw.start()))
    return _checked(obj, label), end


def load_json_text(text: str, label: str) -> Any:
    """A JSON value held in a recipe's text (an argument's value such as
    ``--speculative-config``), read under the same limits as a recipe file.

    + text: the JSON text
    + label: how errors name it (``--speculative-config: not valid JSON: '...'``)
    """
    if len(text) > MAX_BYTES:
        raise RecipeError(f"{label}: longer than {MAX_BYTES} characters")
    try:
        return load_json(text, "")[0]
    except RecipeError as e:
        raise RecipeError(f"{label}{e}") from None


class _SafeLoader(yaml.SafeLoader):
    """PyYAML's safe loader that refuses aliases, duplicate keys and over-long numbers (checked by
    :func:`load_yaml`)."""

    label = ""
    depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise RecipeError(
                f"{self.label}: a YAML alias (*{event.anchor}) at line {event.start_mark.line + 1}; "
                "allowed: plain values (no anchors or aliases)"
            )
        if self.depth >= MAX_DEPTH:
            raise RecipeError(_too_deep(self.label))
        self.depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, (str, int, float, bool)) or key is None:
                if key in seen:
                    raise RecipeError(
                        f"{self.label}: duplicate key {key!r} at line {key_node.start_mark.line + 1}; "
                        "allowed: each key once"
                    )
                seen.add(key)
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node: Any) -> Any:
        _digits_ok(str(node.value), self.label)
        return super().construct_yaml_int(node)

    def construct_yaml_float(self, node: Any) -> Any:
        _digits_ok(str(node.value), self.label)
        return super().construct_yaml_float(node)

    def construct_yaml_timestamp(self, node: Any) -> Any:
        return str(node.value)  # a date (meta.date_added) stays its text, as JSON would hold it

    def refuse_tag(self, node: Any) -> Any:
        raise RecipeError(
            f"{self.label}: a YAML {node.tag.rpartition(':')[2]} value at line "
            f"{node.start_mark.line + 1}; allowed: strings, numbers, booleans, null, lists and "
            "mappings"
        )


_SafeLoader.add_constructor("tag:yaml.org,2002:int", _SafeLoader.construct_yaml_int)
_SafeLoader.add_constructor("tag:yaml.org,2002:float", _SafeLoader.construct_yaml_float)
_SafeLoader.add_constructor("tag:yaml.org,2002:timestamp", _SafeLoader.construct_yaml_timestamp)
for _tag in ("binary", "set", "omap", "pairs"):  # what no JSON holds
    _SafeLoader.add_constructor(f"tag:yaml.org,2002:{_tag}", _SafeLoader.refuse_tag)


def load_yaml(text: str, label: str) -> Any:
    """The YAML document in ``text``, through the safe loader with the refusals above.

    + text: the file's text
    + label: how errors name the file
    """
    loader = None
    try:
        loader = _SafeLoader(text)  # its reader refuses a raw control character here
        loader.label = label
        obj = loader.get_single_data()
    except yaml.reader.ReaderError as e:
        raise RecipeError(_raw_character(label, "YAML", text, e.position)) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e)
        raise RecipeError(f"{label}: malformed YAML{where}: {_one_line(str(problem))}") from None
    except RecursionError:
        raise RecipeError(_too_deep(label)) from None
    finally:
        if loader is not None:
            loader.dispose()
    return _checked(obj, label)


def parse_recipe(text: str, label: str, json_form: bool) -> Any:
    """A recipe file's document: JSON when ``json_form``, else YAML."""
    return load_json(text, label)[0] if json_form else load_yaml(text, label)
