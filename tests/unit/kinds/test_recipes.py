"""Loading and validating RBLN cards; recipe names and kinds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rbln_cases import BROKEN, SEED, SEED_PAGE, TINY, seed

from servefleet.base.errors import RecipeError
from servefleet.base.shipped import FILES
from servefleet.kinds import detect_kind, find_recipe, list_recipes, load_rbln
from servefleet.kinds.rbln.card import decode_card_text, load_card
from servefleet.kinds.rbln.card_checks import parse_arg_fragment, parse_env_fragment

RECIPES = FILES / "recipes"


def test_seed_shape() -> None:
    card = seed()
    assert card.name == "rbln/gpt-oss-120b"
    assert [s.slug for s in card.strategies] == ["aggregated"]
    targets = [o.target for o in card.strategies[0].options]
    assert targets == ["Latency", "Throughput"]
    grid = card.strategies[0].options[0].grid
    assert list(grid.modes) == ["lmcache", "prefix_caching", "spec_decode"]
    assert grid.options == {"tool_calling": ["off", "on"]}
    assert grid.base[0].launcher == ["vllm", "serve"]
    assert grid.base[0].args["--max-num-seqs"] == ["--max-num-seqs", "1"]
    # display axes name more than the grid offers
    assert "kv_connector" in card.axes and "kv_connector" not in grid.offered()


def test_page_text_equals_bare_json() -> None:
    page = load_card(SEED_PAGE, name="x")
    bare = load_card(SEED, name="x")
    assert page.strategies == bare.strategies
    assert page.axes == bare.axes


def test_decode_takes_first_object_and_ignores_prose() -> None:

    with pytest.raises(RecipeError, match="t: malformed JSON"):
        decode_card_text("Title {not json", "t")
    assert decode_card_text('Title\n\n{"a": {"b": 1}}\nprose {"c": 2}', "t") == {"a": {"b": 1}}


def test_env_fragment_value_may_contain_equals() -> None:
    assert parse_env_fragment("A", "A='x=y=z'") == "x=y=z"
    assert parse_env_fragment("A", "A=") == ""
    with pytest.raises(RecipeError, match="is not one A=value"):
        parse_env_fragment("A", "B=1")
    with pytest.raises(RecipeError, match="is not one A=value"):
        parse_env_fragment("A", "A=1 B=2")


def test_arg_fragment_forms() -> None:
    assert parse_arg_fragment("--f", "--f=a b") == ["--f=a", "b"]
    assert parse_arg_fragment("--f", "--f 'a b'") == ["--f", "a b"]
    assert parse_arg_fragment("--f", "--f") == ["--f"]
    with pytest.raises(RecipeError, match="does not start with --f"):
        parse_arg_fragment("--f", "--g 1")


def test_fixture_card_loads() -> None:
    card = load_card(TINY)
    lat = card.strategies[0].options[0]
    assert lat.npus == 2
    assert lat.grid.model == "acme/tiny-moe"
    assert card.strategies[0].options[1].grid.model == "acme/tiny-moe-card"  # card's model
    assert lat.grid.base[0].args["--served-model-name"] == ["--served-model-name", "tiny moe=fast"]
    assert lat.grid.base[0].envs["EXTRA_NOTE"] == 'a b=c $HOME 100% "q" \\\\ ;'


BROKEN_EXPECT = {
    "no-strategies": "'strategies' must be a non-empty list",
    "no-model": "no 'model'",
    "npus-zero": "npus must be a positive integer, got 0",
    "skus-empty": "skus must be a non-empty list",
    "env-wrong-name": "env FOO: fragment 'BAR=1' is not one FOO=value",
    "env-two-words": "is not one FOO=value",
    "arg-key-mismatch": "does not start with --max-num-seqs",
    "arg-unbalanced-quote": "cannot parse fragment",
    "option-base-missing": "option_base has no default for option axis sampler",
    "delta-unknown-axis": "names axis 'color', not offered",
    "delta-unknown-role": "router: no such role (roles: main)",
    "recommended-bad-value": "quant='fp4' is not offered (allowed: w8a16, w8a8)",
    "excluded-unknown-axis": "names axis 'color'",
    "modes-empty-values": "modes.quant must be a non-empty list",
    "duplicate-target": "duplicate targets",
    "no-launcher": "launcher: NoneType is not a launcher servefleet runs; allowed: 'vllm serve'",
    "truncated-json": "malformed JSON",
    "not-json": "no JSON object found",
}


def test_every_broken_card_has_an_expectation() -> None:
    assert sorted(p.stem for p in BROKEN.glob("*.json")) == sorted(BROKEN_EXPECT)


@pytest.mark.parametrize("name", sorted(BROKEN_EXPECT))
def test_broken_card_is_one_clear_error(name: str) -> None:
    path = BROKEN / f"{name}.json"
    with pytest.raises(RecipeError) as info:
        load_card(path)
    msg = str(info.value)
    assert BROKEN_EXPECT[name] in msg
    assert msg.startswith(str(path))
    assert "\n" not in msg


def test_unreadable_recipe(tmp_path: Path) -> None:
    with pytest.raises(RecipeError, match="cannot read recipe"):
        load_card(tmp_path / "missing.json")
    (tmp_path / "bin.json").write_bytes(b"\xff\xfe{")
    with pytest.raises(RecipeError, match="cannot read recipe"):
        load_card(tmp_path / "bin.json")


def test_names_and_kinds() -> None:
    assert find_recipe("rbln/gpt-oss-120b", RECIPES) == ("rbln", RECIPES / "rbln/gpt-oss-120b.json")
    kind, path = find_recipe("vllm/openai/gpt-oss-120b", RECIPES)
    assert (kind, path) == ("vllm", RECIPES / "vllm/models/openai/gpt-oss-120b.yaml")
    assert find_recipe(str(SEED_PAGE), RECIPES) == ("rbln", SEED_PAGE)
    assert find_recipe(str(TINY), RECIPES)[0] == "rbln"
    assert detect_kind(RECIPES / "vllm/json/openai/gpt-oss-120b.json") == "vllm"
    with pytest.raises(RecipeError, match="no recipe 'rbln/nope'; allowed: a recipe file"):
        find_recipe("rbln/nope", RECIPES)
    with pytest.raises(RecipeError, match="not an RBLN recipe card"):
        load_rbln("vllm/openai/gpt-oss-120b", RECIPES)


@pytest.mark.parametrize(
    "name, close",
    [
        ("rbln/gpt-oss-12b", "did you mean rbln/gpt-oss-120b, vllm/openai/gpt-oss-120b, "
         "vllm/openai/gpt-oss-20b? "),
        ("vllm/Qwen/Qwen3.8-72B", "did you mean vllm/Qwen/Qwen3.8-27B? "),
        ("zzz", ""),
    ],
)  # fmt: skip
def test_an_unknown_recipe_is_one_short_line_with_the_closest_names(name: str, close: str) -> None:
    """#50: the name asked, the closest shipped names and the command that lists every one; no
    path of the installed package, no list of every recipe (before: about 400 characters)."""
    with pytest.raises(RecipeError) as e:
        find_recipe(name)
    assert str(e.value) == (
        f"no recipe {name!r}; {close}allowed: a recipe file or a name `servefleet recipes list` "
        "prints"
    )
    assert len(str(e.value)) < 200 and str(FILES) not in str(e.value)
    with pytest.raises(RecipeError, match=r"`servefleet recipes list DIRECTORY` prints$"):
        find_recipe("rbln/nope", RECIPES / "rbln")


def test_list_recipes(tmp_path: Path) -> None:
    names = list_recipes(RECIPES)
    assert names[0] == "rbln/gpt-oss-120b"
    assert "vllm/openai/gpt-oss-120b" in names
    assert names == sorted(names, key=lambda n: (not n.startswith("rbln/"), n))
    (tmp_path / "rbln").mkdir()
    (tmp_path / "rbln" / "x.json").write_text(json.dumps({}))
    assert list_recipes(tmp_path) == ["rbln/x"]
