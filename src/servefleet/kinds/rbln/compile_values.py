"""The compile inputs' value parsers: each normalises a given flag, env or JSON value.

The same value in another spelling (``1k`` and ``1000``, ``exp`` and ``exponential``, ``"1"``
and ``true``) parses to the same canonical value, so the fingerprint does not change with it.
A value that cannot be parsed is a :class:`RecipeError` naming it.
"""

from __future__ import annotations

import re
from typing import Any

from servefleet.base.errors import RecipeError
from servefleet.kinds.loader import load_json_text


def parse_bool(v: Any) -> bool:
    """Flags give True/False; env vars are true when "true" or "1" (case-insensitive)."""
    if isinstance(v, bool):
        return v
    return str(v).strip().lower() in ("true", "1")


def parse_int(v: Any) -> int:
    text = str(v).strip()
    if isinstance(v, (dict, list)) or len(text) > 18:
        raise RecipeError(f"not an integer: {text[:40]!r}")
    try:
        return int(text)
    except ValueError:
        raise RecipeError(f"not an integer: {v!r}") from None


def parse_human_int(v: Any) -> int:
    """vLLM's human-readable ints for --max-model-len: ``1k`` = 1000, ``1K`` = 1024."""
    s = str(v).strip()
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgG])", s)
    if not m:
        return parse_int(s)
    num, unit = m.groups()
    scale = {"k": 10**3, "m": 10**6, "g": 10**9, "K": 2**10, "M": 2**20, "G": 2**30}[unit]
    return int(float(num) * scale)


def parse_float(v: Any) -> float:
    try:
        return float(str(v).strip())
    except ValueError:
        raise RecipeError(f"not a number: {v!r}") from None


def parse_str(v: Any) -> str:
    return str(v)


def parse_strategy(v: Any) -> str:
    s = str(v).strip().lower()
    return "exponential" if s == "exp" else s


def parse_int_list(v: Any) -> list[int]:
    if isinstance(v, list):
        return [parse_int(x) for x in v]
    s = str(v).strip()
    if s.startswith("["):
        loaded = parse_json(s)
        if not isinstance(loaded, list):
            raise RecipeError(f"not a list of integers: {v!r}")
        return [parse_int(x) for x in loaded]
    return [parse_int(x) for x in s.split(",") if x.strip()]


def parse_json(v: Any) -> Any:
    if not isinstance(v, str):
        return v
    return load_json_text(v, f"not valid JSON: {v[:80]!r}")


def parse_canon(v: Any) -> Any:
    """A JSON config's value as given: an object (dotted fields merged) or a string."""
    return v


def parse_scalar(v: Any) -> Any:
    """Unknown ``--rbln-*`` values: booleans stay, numbers are parsed, the rest is a string."""
    if isinstance(v, bool):
        return v
    for conv in (int, float):
        try:
            return conv(v)
        except (TypeError, ValueError):
            pass
    return str(v)
