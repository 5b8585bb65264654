"""Argument-list helpers for vLLM recipes: token coercion and last-wins flag dedupe.

Pure functions, no I/O. ``dedupe_args`` mirrors the recipes site's ``dedupeArgs``: a ``--flag``
and the value after it form one unit, and only the last unit of each flag is kept, at its own
position, so a later layer (hardware override, feature) shadows an earlier one without leaving a
stale pair behind. Unlike the site, ``--flag=value`` counts as the same flag as ``--flag value``.
"""

from __future__ import annotations

import re
from typing import Any

from servefleet.base.errors import RecipeError
from servefleet.base.remote import layout

# A token that starts with "-" but is a value, not a flag: a negative number.
_NEGATIVE_NUMBER = re.compile(r"-\d")


def token(value: Any, where: str) -> str:
    """One argv token or env value from YAML/JSON data, spelled as the recipes site spells it.

    + value: a string, number or boolean from the recipe
    + where: the recipe location, for the error message
    """
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, int, float)):
        return str(value)
    raise RecipeError(f"{where}: expected a string or number, got {type(value).__name__}")


def env_map(value: Any, where: str) -> dict[str, str]:
    """An env mapping ``NAME -> value`` from the recipe.

    + value: a mapping from the recipe, or None
    + where: the recipe location, for the error message
    """
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise RecipeError(f"{where}: expected a mapping of variables, got {type(value).__name__}")
    for k in value:
        if not isinstance(k, str) or not layout.ENV_NAME.fullmatch(k):
            raise RecipeError(
                f"{where}: {str(k)[:80]!r} is not a variable name; allowed: [A-Za-z_][A-Za-z0-9_]*"
            )
    return {k: token(v, f"{where}.{k}") for k, v in value.items()}


def is_flag(tok: str) -> bool:
    """Whether a token is a flag (``-x``, ``--x``, ``--x=v``) rather than a value or positional.

    + tok: one argv token
    """
    return tok.startswith("-") and len(tok) > 1 and not _NEGATIVE_NUMBER.match(tok)


def flag_name(tok: str) -> str:
    """The flag a token sets: ``--block-size=64`` and ``--block-size`` both give ``--block-size``.

    + tok: a flag token
    """
    return tok.split("=", 1)[0]


def dedupe_args(args: list[str]) -> list[str]:
    """Keep the last occurrence of each flag (with its value); positionals stay where they are.

    A flag takes the next token as its value when that token is not itself a flag and the flag
    is not written ``--flag=value``.

    + args: the layered argument list
    """
    units: list[tuple[str | None, list[str]]] = []
    i = 0
    while i < len(args):
        cur = args[i]
        if is_flag(cur):
            if "=" not in cur and i + 1 < len(args) and not is_flag(args[i + 1]):
                units.append((flag_name(cur), [cur, args[i + 1]]))
                i += 2
                continue
            units.append((flag_name(cur), [cur]))
        else:
            units.append((None, [cur]))
        i += 1
    seen: set[str] = set()
    keep = [False] * len(units)
    for j in range(len(units) - 1, -1, -1):
        name = units[j][0]
        if name is None:
            keep[j] = True
        elif name not in seen:
            seen.add(name)
            keep[j] = True
    return [tok for j, (_, toks) in enumerate(units) if keep[j] for tok in toks]
