"""Argument lists of a vLLM recipe as argv words: what the recipes site's shell command gives.

The site renders a layered argument list as a shell line: a flag and the value after it share a
line, the value single-quoted (one word whatever it holds), everything else written as it is. So
an item that holds a flag and its value in one string (``"--max-model-len 32768"``) reaches
``vllm serve`` as two words, split by the shell. :func:`words` does that split: an item the site
writes unquoted is split with shell rules when it holds whitespace; a flag's value stays one
word. Items without whitespace are kept verbatim (the site's JSON ``argv`` keeps them so too).
"""

from __future__ import annotations

import shlex
from typing import Any

from servefleet.base.errors import RecipeError
from servefleet.base.vllm_args import token

# One argument item of the recipe and where it comes from (for error messages).
Item = tuple[str, str]


def items(value: Any, where: str) -> list[Item]:
    """The items of an argument list (a YAML/JSON list; empty items dropped, as the site does).

    + value: the list from the recipe, or None
    + where: the recipe location, for the error message
    """
    if value is None:
        return []
    if not isinstance(value, list):
        raise RecipeError(
            f"{where}: expected a list of arguments (strings or numbers), "
            f"got {type(value).__name__}"
        )
    out = [(token(v, f"{where}[{i}]"), f"{where}[{i}]") for i, v in enumerate(value)]
    return [(t, w) for t, w in out if t != ""]


def _site_flag(tok: str) -> bool:
    # The site's test for a flag, which decides what it quotes: anything starting with "-".
    return tok.startswith("-")


def split_item(tok: str, where: str) -> list[str]:
    """One unquoted item as the shell splits it (a line continuation is a space).

    + tok: the item
    + where: the recipe location, for the error message
    """
    if not any(c.isspace() for c in tok):
        return [tok]
    try:
        parts = shlex.split(tok.replace("\\\n", " "))
    except ValueError as e:
        raise RecipeError(
            f"{where}: {tok!r} does not split as a shell command line would ({e})"
        ) from None
    return [p for p in parts if p != ""]


def words(seq: list[Item]) -> list[str]:
    """The argv words of a layered argument list, as the site's shell command splits it.

    + seq: the items of every layer, in order
    """
    out: list[str] = []
    i = 0
    while i < len(seq):
        tok, where = seq[i]
        out += split_item(tok, where)
        nxt = seq[i + 1][0] if i + 1 < len(seq) else None
        if _site_flag(tok) and nxt is not None and not _site_flag(nxt):
            out.append(nxt)  # the flag's value: one single-quoted word on the site
            i += 2
        else:
            i += 1
    return out


def check(value: Any, where: str) -> None:
    """Raise a RecipeError if an argument list is not a list of strings/numbers that split.

    + value: the list from the recipe, or None
    + where: the recipe location, for the error message
    """
    words(items(value, where))
