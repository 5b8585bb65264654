"""Hostile recipes and cards (issue #18): every one is refused in one line naming the problem,
never a traceback, a hang or a memory blow-up; the shipped recipes still load."""

from __future__ import annotations

import copy
import json
import resource
import shutil
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from servefleet.cli import main
from servefleet.errors import RecipeError
from servefleet.kinds.loader import MAX_DEPTH, load_json, load_yaml
from servefleet.kinds.rbln.card import card_from_dict, decode_card_text
from servefleet.kinds.rbln.resolve import resolve_rbln
from servefleet.kinds.vllm import load_vllm_recipe
from servefleet.shipped import FILES

SEED = FILES / "recipes" / "rbln" / "gpt-oss-120b.json"
ALIAS_BOMB = "\n".join(
    ['a: &a ["x","x","x","x","x","x","x","x","x"]']
    + [f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)},*{chr(97 + i)},*{chr(97 + i)},*{chr(97 + i)},*{chr(97 + i)},*{chr(97 + i)},*{chr(97 + i)},*{chr(97 + i)},*{chr(97 + i)}]" for i in range(8)]
)  # fmt: skip


def seed() -> dict[str, Any]:
    return json.loads(SEED.read_text())


def base_role(card: dict[str, Any]) -> dict[str, Any]:
    role: dict[str, Any] = card["strategies"][0]["options"][0]["grid"]["base"][0]
    return role


def one_line(exc: pytest.ExceptionInfo[RecipeError]) -> str:
    text = str(exc.value)
    assert "\n" not in text and len(text) < 600, text
    return text


def test_a_yaml_alias_bomb_is_refused_without_expanding() -> None:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(RecipeError) as e:
        load_yaml(ALIAS_BOMB, "bomb.yaml")
    assert "YAML alias (*a)" in one_line(e) and "no anchors or aliases" in str(e.value)
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown_kib < 50 * 1024  # expanded, it would take gigabytes


def test_a_vllm_recipe_with_an_alias_bomb_in_its_title_is_one_line(tmp_path: Path) -> None:
    root = tmp_path / "vllm"
    shutil.copytree(FILES / "recipes" / "vllm", root)
    recipe = root / "models" / "openai" / "gpt-oss-120b.yaml"
    text = recipe.read_text()
    recipe.write_text(ALIAS_BOMB + "\n" + text)
    with pytest.raises(RecipeError) as e:
        load_vllm_recipe(recipe)
    assert "YAML alias" in one_line(e)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('{"a": 1, "a": 2}', "duplicate key 'a'"),
        ("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1), f"nested deeper than {MAX_DEPTH}"),
        ("[" * 100000 + "]" * 100000, f"nested deeper than {MAX_DEPTH}"),
        ('{"npus": ' + "9" * 5000 + "}", "is too long"),
        ('{"a": 1', "malformed JSON at line 1"),
    ],
)
def test_json_refusals(text: str, needle: str) -> None:
    with pytest.raises(RecipeError) as e:
        load_json(text, "card.json")
    assert needle in one_line(e)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("a: 1\na: 2\n", "duplicate key 'a' at line 2"),
        ("a:\n" + "".join("  " * i + "- \n" for i in range(1, MAX_DEPTH + 2)), "nested deeper"),
        ("[" * 5000 + "]" * 5000, "nested deeper"),
    ],
)
def test_yaml_refusals(text: str, needle: str) -> None:
    with pytest.raises(RecipeError) as e:
        load_yaml(text, "r.yaml")
    assert needle in one_line(e)


def test_a_card_with_a_duplicate_key_is_refused() -> None:
    text = SEED.read_text().replace('"model":', '"model": "x/y", "model":', 1)
    with pytest.raises(RecipeError) as e:
        decode_card_text(text, "dup.json")
    assert "duplicate key 'model'" in one_line(e)


def mutated(change: Any) -> dict[str, Any]:
    card = copy.deepcopy(seed())
    change(card)
    return card


@pytest.mark.parametrize(
    ("name", "change", "needle"),
    [
        (
            "launcher path",
            lambda c: base_role(c).__setitem__("launcher", "../../../../usr/bin/python3 -c x"),
            "is not a bare word",
        ),
        (
            "model option",
            lambda c: c["strategies"][0]["options"][0]["grid"].__setitem__("model", "-h"),
            "'-h' is not a model id",
        ),
        (
            "two options in a fragment",
            lambda c: base_role(c)["args"].__setitem__(
                "--max-num-seqs", "--max-num-seqs=1 --host 0.0.0.0 --api-key x"
            ),
            "is more than one option",
        ),
        (
            "npus bomb",
            lambda c: c["strategies"][0]["options"][0].__setitem__("npus", 10**10),
            "npus must be at most 64",
        ),
        (
            "axes options",
            lambda c: c.__setitem__("axes", [{"axis": "x", "options": 5}]),
            "'options' must be a list",
        ),
    ],
)
def test_hostile_card_values_are_refused(name: str, change: Any, needle: str) -> None:
    with pytest.raises(RecipeError) as e:
        card_from_dict(mutated(change), name="hostile")
    assert needle in one_line(e), name


def test_a_hostile_card_through_the_cli_is_one_line_exit_2(tmp_path: Path) -> None:
    path = tmp_path / "card.json"
    path.write_text(json.dumps(mutated(lambda c: base_role(c).__setitem__("launcher", "/bin/sh"))))
    result = CliRunner().invoke(main, ["resolve", str(path)])
    assert result.exit_code == 2, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and "is not a bare word" in lines[0]


def test_negative_numbers_are_values_not_options() -> None:
    card = mutated(lambda c: base_role(c)["args"].__setitem__("--seed", "--seed -1"))
    role = card_from_dict(card, name="ok").strategies[0].options[0].grid.base[0]
    assert role.args["--seed"] == ["--seed", "-1"]


@pytest.mark.parametrize(
    "value", ["[1,", "[1, [2]]", "{}", "[" + "9" * 40 + "]", "[" * 5000 + "]" * 5000]
)
def test_a_malformed_bucket_list_in_an_env_value_is_one_line(value: str) -> None:
    card = mutated(
        lambda c: base_role(c)["envs"].__setitem__(
            "VLLM_RBLN_DECODE_BATCH_BUCKET_MANUAL_BUCKETS",
            f"VLLM_RBLN_DECODE_BATCH_BUCKET_MANUAL_BUCKETS='{value}'",
        )
    )
    parsed = card_from_dict(card, name="hostile")
    st = parsed.strategies[0]
    with pytest.raises(RecipeError) as e:
        resolve_rbln(
            parsed, strategy=st.slug, target=st.options[0].target, compiler_version="0.12.0"
        )
    assert "not" in one_line(e)
