"""Reading recipe files: the one loader every kind's recipes and cards go through.

A recipe is input from outside (a card from a vendor's page, a YAML from a repository), so the
loader refuses, in one line naming the file, what would make a parser misbehave instead of
failing: YAML aliases (a few KB of anchors expand to gigabytes), duplicate keys (the last one
silently wins in json and PyYAML), nesting deeper than :data:`MAX_DEPTH`, numbers longer than
:data:`MAX_DIGITS` digits, and files larger than :data:`MAX_BYTES`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from servefleet.errors import RecipeError

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


def _depth_ok(obj: Any, label: str) -> Any:
    """``obj`` when no list or mapping in it is nested deeper than :data:`MAX_DEPTH`."""
    stack = [(obj, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth > MAX_DEPTH:
                raise RecipeError(_too_deep(label))
            values = item.values() if isinstance(item, dict) else item
            stack.extend((v, depth + 1) for v in values)
    return obj


def _pairs(label: str) -> Any:
    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in pairs:
            if key in out:
                raise RecipeError(f"{label}: duplicate key {key!r}; allowed: each key once")
            out[key] = value
        return out

    return hook


def _number(label: str, kind: type) -> Any:
    def parse(text: str) -> Any:
        if len(text.lstrip("-").split(".")[0].split("e")[0].split("E")[0]) > MAX_DIGITS:
            raise RecipeError(
                f"{label}: the number {text[:24]}... is too long; allowed: at most "
                f"{MAX_DIGITS} digits"
            )
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
    return _depth_ok(obj, label), end


class _SafeLoader(yaml.SafeLoader):
    """PyYAML's safe loader that refuses aliases and duplicate keys (checked by :func:`load_yaml`)."""

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


def load_yaml(text: str, label: str) -> Any:
    """The YAML document in ``text``, through the safe loader with the refusals above.

    + text: the file's text
    + label: how errors name the file
    """
    loader = _SafeLoader(text)
    loader.label = label
    try:
        obj = loader.get_single_data()
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e)
        raise RecipeError(f"{label}: malformed YAML{where}: {_one_line(str(problem))}") from None
    except RecursionError:
        raise RecipeError(_too_deep(label)) from None
    finally:
        loader.dispose()
    return _depth_ok(obj, label)


def parse_recipe(text: str, label: str, json_form: bool) -> Any:
    """A recipe file's document: JSON when ``json_form``, else YAML."""
    return load_json(text, label)[0] if json_form else load_yaml(text, label)
