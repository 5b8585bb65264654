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
from repo_paths import RECIPES

from servefleet.base.errors import RecipeError
from servefleet.base.shipped import FILES
from servefleet.entry.cli import main
from servefleet.kinds.loader import MAX_DEPTH, load_json, load_yaml
from servefleet.kinds.rbln.card import decode_card_text
from servefleet.kinds.rbln.card_checks import card_from_dict
from servefleet.kinds.rbln.resolve import resolve_rbln
from servefleet.kinds.vllm import load_vllm_recipe

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
            "is not a launcher servefleet runs; allowed: 'vllm serve'",
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
    assert len(lines) == 1 and "'/bin/sh' is not a launcher servefleet runs" in lines[0]


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


# -- #31 (10): card fields that resolved and should not; launchers are an allow-list ----------


@pytest.mark.parametrize("value", ["a\x1b[2Jb", "a\u2028b", "a\x9bb"])
def test_a_card_env_value_holding_a_control_character_is_refused(
    tmp_path: Path, value: str
) -> None:
    path = tmp_path / "card.json"
    path.write_text(
        json.dumps(
            mutated(lambda c: base_role(c)["envs"].__setitem__("VLLM_X", f"VLLM_X='{value}'"))
        )
    )
    for fmt in ("shell", "json", "unit"):
        result = CliRunner().invoke(main, ["resolve", str(path), "--format", fmt])
        assert result.exit_code == 2 and result.exception.__class__ is SystemExit, result.output
        (line,) = result.stderr.splitlines()
        assert "env VLLM_X" in line and f"U+{ord(value[1]):04X}" in line, line
        assert "allowed: printable text" in line


@pytest.mark.parametrize("label", [{"a": 1}, ["Aggregated"], 7, "Aggre\u2028gated", "a\x1bb"])
def test_a_strategy_label_that_is_not_one_line_of_text_is_refused(label: Any) -> None:
    # a dict was shown as its repr (str(label)): the card resolved
    with pytest.raises(RecipeError) as e:
        card_from_dict(mutated(lambda c: c["strategies"][0].__setitem__("label", label)), name="c")
    assert "strategy aggregated.label" in one_line(e)
    assert "allowed: null or one line of printable text" in str(e.value)


def test_a_null_label_is_the_slug() -> None:
    card = card_from_dict(
        mutated(lambda c: c["strategies"][0].__setitem__("label", None)), name="c"
    )
    assert card.strategies[0].label == "aggregated"


@pytest.mark.parametrize(
    "launcher",
    ["n", "vllm", "vllm serve serve", "serve vllm", "python3 -m vllm", "vllm-omni serve"],
)
def test_a_card_launcher_outside_the_allow_list_is_refused(launcher: str) -> None:
    # any bare word resolved ('n' as the command, 'vllm' alone moved the model into the
    # subcommand's place); only the host's pre-flight stopped it
    with pytest.raises(RecipeError) as e:
        card_from_dict(mutated(lambda c: base_role(c).__setitem__("launcher", launcher)), name="c")
    assert f"launcher: {launcher!r} is not a launcher servefleet runs" in one_line(e)
    assert "allowed: 'vllm serve'" in str(e.value)


@pytest.mark.parametrize(
    "binary", ["n", "vllm", "vllm serve --api-key k", "vllm serve x", "/usr/bin/vllm serve"]
)
def test_an_omni_serve_binary_outside_the_allow_list_is_refused(
    tmp_path: Path, binary: str
) -> None:
    root = tmp_path / "vllm"
    shutil.copytree(FILES / "recipes" / "vllm", root)
    recipe = root / "models" / "acme" / "omni.yaml"
    recipe.parent.mkdir()
    recipe.write_text(
        "meta: {tasks: [omni], hardware: {h200: verified}}\n"
        "model: {model_id: acme/video-14b}\n"
        f"omni: {{serve_binary: {json.dumps(binary)}, tasks: [t2v]}}\n"
        "variants: {default: {}}\n"
    )
    with pytest.raises(RecipeError) as e:
        load_vllm_recipe(recipe)
    assert f"omni.serve_binary: {binary!r} is not a launcher servefleet runs" in one_line(e)
    assert "allowed: 'vllm serve' or 'vllm-omni serve'" in str(e.value)


def test_the_allowed_launchers_still_resolve() -> None:
    card = card_from_dict(seed(), name="ok")
    assert card.strategies[0].options[0].grid.base[0].launcher == ["vllm", "serve"]
    omni = load_vllm_recipe(RECIPES / "omni-diffusion.yaml")
    from servefleet.kinds.vllm import resolve_vllm

    assert resolve_vllm(omni).servers[0].argv[:2] == ["vllm-omni", "serve"]
