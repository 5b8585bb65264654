"""Shared helpers for the vLLM resolver's tests: a recipe from YAML text written to a temporary
file (the loader reads files), and the one line a resolve refuses with, its recipe's name
stripped."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from servefleet.base.errors import RecipeError
from servefleet.kinds.vllm import load_vllm_recipe
from servefleet.kinds.vllm.recipe import VllmRecipe


def recipe_from(tmp_path_factory: pytest.TempPathFactory, name: str, text: str) -> VllmRecipe:
    """The recipe ``text`` loaded as the file ``name`` of a new temporary directory."""
    path = tmp_path_factory.mktemp("recipes") / name
    path.write_text(text)
    return load_vllm_recipe(path)


def refused_line(resolve: Callable[..., Any], r: VllmRecipe, **kw: object) -> str:
    """What ``resolve(r, **kw)`` refuses with: one line, after ``<recipe name>: ``."""
    with pytest.raises(RecipeError) as err:
        resolve(r, **kw)
    msg = str(err.value)
    assert msg.startswith(f"{r.name}: ") and "\n" not in msg
    return msg[len(r.name) + 2 :]
