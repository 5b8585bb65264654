"""RBLN recipe cards: load, validate, and find recipes by their qualified name.

A card is the JSON object that docs.rbln.ai embeds in each recipe page (rbln.md §5). It is read
either as bare JSON or as the page text (a title line, the JSON object, then prose): the one JSON
object that starts at the first ``{`` is decoded. Validation collects every problem and raises
once, naming the file, so a broken card reads as one line. This module loads; the card's
schema is :mod:`servefleet.kinds.rbln.card_schema`, its checks
:mod:`servefleet.kinds.rbln.card_checks`.

What a card offers comes only from each grid's ``modes`` and ``options``; the top-level ``axes``
list is kept for display (and for naming what a grid does *not* offer in error messages).

Roles: a grid's ``base`` holds one role (aggregated serving, ``main`` on the published cards) or
the two roles of prefill/decode disaggregation, ``prefill`` and ``decode``; a two-role grid may
name the policy of the router in front of them (``router: {"policy": ...}``). Fields the
resolver does not use yet are refused when set, until they mean something: a strategy's
``nodes`` (every server runs on one host), a role's ``ranks``, ``scale`` and ``varies``.

Recipe names are qualified by kind (``rbln/<name>``, ``vllm/<org>/<name>``); the registry of
recipe sources (:mod:`servefleet.kinds`) finds and lists them, the functions at the end of this
module are its names as callers knew them.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from servefleet.base.errors import RecipeError
from servefleet.kinds.loader import load_json, read_recipe_text
from servefleet.kinds.rbln.card_checks import card_from_dict
from servefleet.kinds.rbln.card_schema import Card

# ---------------------------------------------------------------------------------------------
# Loading


def decode_card_text(text: str, source: str) -> dict[str, Any]:
    """Decode the JSON object starting at the first ``{`` of bare JSON or a page's text.

    + text: the file's text
    + source: how to name the file in errors
    """
    start = text.find("{")
    if start < 0:
        raise RecipeError(f"{source}: no JSON object found")
    obj, _ = load_json(text, source, start)
    if not isinstance(obj, dict):
        raise RecipeError(f"{source}: the card is not a JSON object")
    return obj


def load_card(path: str | Path, *, name: str | None = None) -> Card:
    """Read and validate an RBLN card from bare JSON or the published page text.

    + path: the file
    + name: the qualified name to record (default: the path as given)
    """
    p = Path(path)
    label = name or str(path)
    return _card(read_recipe_text(p, label), label, p)


@functools.lru_cache(maxsize=32)
def _card(text: str, label: str, path: Path) -> Card:
    """A card is validated once per text (a deploy resolves it for every host, twice)."""
    return card_from_dict(decode_card_text(text, label), name=label, path=path)
