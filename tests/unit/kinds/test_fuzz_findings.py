"""What the recipe fuzz test (``test_fuzz_recipes.py``) found, one regression test each: every
case once ended in another exception than a ServefleetError (a traceback), a message of more
than one line, or a spec that a host cannot serve (a model that is no model id, an env entry
that is no variable)."""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from servefleet.base.errors import RecipeError, ServefleetError
from servefleet.base.shipped import FILES
from servefleet.entry.cli import main
from servefleet.kinds import find, platforms_of
from servefleet.kinds.loader import load_json, load_yaml
from servefleet.kinds.rbln.card_checks import card_from_dict
from servefleet.kinds.rbln.resolve import resolve_rbln
from servefleet.kinds.vllm import describe_vllm, load_vllm_recipe, resolve_vllm
from servefleet.kinds.vllm.kind import KIND as VLLM
from servefleet.platforms import detect

CARD = json.loads((FILES / "recipes" / "rbln" / "gpt-oss-120b.json").read_text())
VLLM_ROOT = FILES / "recipes" / "vllm"
GPT_OSS = VLLM_ROOT / "models" / "openai" / "gpt-oss-120b.yaml"
EAGLE3 = ("strategies", 0, "options", 0, "grid", "deltas", "spec_decode=eagle3", "main",
          "add_args", "--speculative-config")  # fmt: skip


def one_line(e: pytest.ExceptionInfo[ServefleetError]) -> str:
    text = str(e.value)
    assert len(text.splitlines()) == 1, text
    return text


def at(doc: Any, loc: tuple[Any, ...]) -> Any:
    for step in loc:
        doc = doc[step]
    return doc


def card_with(loc: tuple[Any, ...], value: Any) -> dict[str, Any]:
    card = copy.deepcopy(CARD)
    at(card, loc[:-1])[loc[-1]] = value
    return card


@pytest.fixture
def vllm_recipe(tmp_path: Path) -> Any:
    """Write a changed copy of gpt-oss-120b's recipe (with the shipped taxonomy): the change
    is a function of the parsed YAML, or text to append."""
    shutil.copytree(VLLM_ROOT, tmp_path / "vllm")
    path = tmp_path / "vllm" / "fuzz.yaml"

    def write(change: Any = None, text: str = "") -> Path:
        doc = yaml.safe_load(GPT_OSS.read_text())
        if change is not None:
            change(doc)
        path.write_text(yaml.safe_dump(doc, sort_keys=False) + text)
        return path

    return write


# -- the loader ---------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["a: " + "9" * 5000, "a: !!int " + "1" * 4400, "a: 0x" + "f" * 30])
def test_a_yaml_number_past_the_digit_cap_is_one_line(text: str) -> None:
    # was ValueError: Exceeds the limit (4300 digits) for integer string conversion
    with pytest.raises(RecipeError) as e:
        load_yaml(text, "r.yaml")
    assert "is too long; allowed: at most 18 digits" in one_line(e)


def test_a_json_card_with_a_huge_number_is_detected_in_one_line(tmp_path: Path) -> None:
    # the JSON loader refused it, then detecting the kind read the same text as YAML: ValueError
    path = tmp_path / "card.json"
    path.write_text(json.dumps(CARD).replace('"npus": 1', '"npus": ' + "9" * 5000, 1))
    result = CliRunner().invoke(main, ["resolve", str(path)])
    assert result.exit_code == 2 and result.exception.__class__ is SystemExit, result.output
    assert "is too long" in result.stderr and len(result.stderr.splitlines()) == 1


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('features:\n  "\\u2028": {}\n', "the key '\\u2028'"),
        ('features:\n  "\\x1b[2J": {}\n', "the key '\\x1b[2J'"),
        ("modes:\n  on: {}\n", "the key 'True' (bool)"),
        ("tp:\n  8: 2\n", "the key '8' (int)"),
    ],
)
def test_a_key_that_is_not_printable_text_is_refused_in_one_line(text: str, needle: str) -> None:
    # keys end up in messages: a line break in one made a message of two lines
    with pytest.raises(RecipeError) as e:
        load_yaml(text, "r.yaml")
    assert needle in one_line(e) and "allowed: keys of printable text" in str(e.value)


@pytest.mark.parametrize("value", ['"\\ud800"', '"a\\u0000b"'])
def test_text_no_output_can_carry_is_refused_at_load(value: str) -> None:
    with pytest.raises(RecipeError) as e:
        load_json('{"strategies": [{"label": ' + value + "}]}", "card.json")
    assert "strategies[0].label: text holding" in one_line(e)


def test_a_lone_surrogate_in_a_card_is_one_line_not_an_encoding_crash(tmp_path: Path) -> None:
    # `recipes show` printed it: UnicodeEncodeError on the way to a UTF-8 terminal
    path = tmp_path / "card.json"
    path.write_text(json.dumps({**CARD, "name": "\ud800"}))
    result = CliRunner().invoke(main, ["recipes", "show", str(path)])
    assert result.exit_code == 2 and "lone surrogates" in result.stderr, result.output


def test_yaml_dates_are_text_and_other_tags_are_refused(vllm_recipe: Any) -> None:
    # a date in a field `recipes show` prints was no JSON: TypeError in json.dumps
    path = vllm_recipe(lambda d: d["variants"]["default"].__setitem__("label", "2001-12-14"))
    path.write_text(path.read_text().replace("label: '2001-12-14'", "label: 2001-12-14"))
    info = describe_vllm(load_vllm_recipe(path))
    assert info["variants"]["default"]["label"] == "2001-12-14"
    json.dumps(info)
    with pytest.raises(RecipeError) as e:
        load_yaml("a: !!binary aGVsbG8=", "r.yaml")
    assert "a YAML binary value at line 1" in one_line(e)


# -- cards ------------------------------------------------------------------------------------


@pytest.mark.parametrize("config", ['{"model": "-h"}', '{"model": " "}', '{"model": ["a/b"]}'])
def test_a_draft_model_that_is_no_model_id_is_refused(config: str) -> None:
    card = card_from_dict(card_with(EAGLE3, f"--speculative-config '{config}'"), name="c")
    with pytest.raises(RecipeError) as e:  # was a spec whose models included '-h'
        resolve_rbln(card, sets={"spec_decode": "eagle3"}, compiler_version="0.12.0")
    assert "--speculative-config: draft model: " in one_line(e) and "is not a model id" in str(
        e.value
    )


@pytest.mark.parametrize(
    "config",
    ['{"model": "a/b", "num_speculative_tokens": ' + "9" * 5000 + "}", "[" * 5000 + "]" * 5000],
)
def test_json_in_a_card_argument_is_read_under_the_loaders_limits(config: str) -> None:
    # json.loads: ValueError (more than 4300 digits) or RecursionError, out of the resolver
    card = card_from_dict(card_with(EAGLE3, f"--speculative-config '{config}'"), name="c")
    with pytest.raises(RecipeError) as e:
        resolve_rbln(card, sets={"spec_decode": "eagle3"}, compiler_version="0.12.0")
    assert "--speculative-config: not valid JSON" in one_line(e)


# -- vLLM recipes -----------------------------------------------------------------------------


def test_a_null_variant_is_an_empty_one(vllm_recipe: Any) -> None:
    # `amd_fp8:` with nothing under it: AttributeError in describe ('NoneType' has no 'get')
    recipe = load_vllm_recipe(vllm_recipe(lambda d: d["variants"].__setitem__("amd_fp8", None)))
    info = describe_vllm(recipe)
    assert info["variants"]["amd_fp8"]["model_id"] == "openai/gpt-oss-120b"
    spec = resolve_vllm(recipe, hardware="mi355x", variant="amd_fp8")
    assert spec.servers[0].argv[:3] == ["vllm", "serve", "openai/gpt-oss-120b"]


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        (lambda d: d["model"].__setitem__("model_id", "-h"), "model.model_id: '-h' is not"),
        (lambda d: d["variants"]["amd_fp8"].__setitem__("model_id", "x"), "'x' is not a model"),
        (lambda d: d["model"]["base_env"].__setitem__(" ", "-h"), "' ' is not a variable name"),
        (lambda d: d["compatible_strategies"].append("\u2028"), "'\\u2028' is not a name"),
        (
            lambda d: d["features"]["spec_decoding"]["args"].__setitem__(1, '{"model": "-h"}'),
            "draft model: '-h' is not a model id",
        ),  # fmt: skip
        (
            lambda d: d["features"]["spec_decoding"]["args"].__setitem__(1, "[" * 5000),
            None,
        ),  # fmt: skip
    ],
)
def test_hostile_vllm_recipe_values_are_one_line(
    vllm_recipe: Any, change: Any, needle: str | None
) -> None:
    path = vllm_recipe(change)
    try:
        spec = VLLM.resolve(
            path, str(path), None, {"hardware": "h200", "features": ["spec_decoding"]}
        )
    except RecipeError as e:
        assert needle is not None and needle in str(e) and len(str(e).splitlines()) == 1, e
    else:  # JSON too deep to read names no draft model: the spec serves the recipe's model
        assert needle is None and spec.requirements.models == ["openai/gpt-oss-120b"]


def test_a_local_model_directory_is_still_a_model(vllm_recipe: Any) -> None:
    path = vllm_recipe(lambda d: d["variants"]["amd_fp8"].__setitem__("model_id", "/models/x-1"))
    spec = resolve_vllm(load_vllm_recipe(path), hardware="mi355x", variant="amd_fp8")
    assert spec.servers[0].argv[2] == "/models/x-1"


def test_amd_smi_output_nested_too_deep_reads_no_gpu() -> None:
    # json.loads raised RecursionError out of the probe parser
    hw = detect(platforms_of(VLLM), {"gpus": [], "amd": ["[" * 100000 + "]" * 100000]})[1]
    assert hw.devices == ()


def test_every_shipped_and_shared_recipe_still_loads() -> None:
    for path in sorted((VLLM_ROOT / "models").glob("*/*.yaml")):
        load_vllm_recipe(path)
    kind, path = find("rbln/gpt-oss-120b")
    assert kind.resolve(path, "rbln/gpt-oss-120b", None, {}).kind == "rbln"


# -- #31 (9): the second campaign (raw control bytes, swapped shapes, non-finite numbers) ------

SITE_JSON = VLLM_ROOT / "json" / "openai" / "gpt-oss-120b.json"


def resolved(path: Path, *options: str, fmt: str = "shell") -> Any:
    """``servefleet resolve PATH OPTIONS --format FMT`` as the CLI runs it."""
    return CliRunner().invoke(main, ["resolve", str(path), *options, "--format", fmt])


def refused_in_one_line(result: Any, *needles: str) -> str:
    """The run ended in exit 2 with one line of stderr holding every needle (no traceback)."""
    assert result.exception.__class__ is SystemExit, result.exception
    assert result.exit_code == 2, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and all(n in lines[0] for n in needles), result.stderr
    line: str = lines[0]
    return line


@pytest.mark.parametrize("raw", ["\x1b", "\x00", "\x07", "\x9b", "\ufffe"])
def test_a_raw_control_byte_in_a_recipe_file_is_one_line(
    vllm_recipe: Any, tmp_path: Path, raw: str
) -> None:
    # was yaml.ReaderError: the YAML loader was built (and read the text) outside its try
    path = vllm_recipe(text=f"x: a{raw}b\n")
    line = refused_in_one_line(resolved(path), str(path), "malformed YAML at line")
    assert f"U+{ord(raw):04X}" in line and "allowed: printable text" in line
    for name, text in (
        ("card.json", json.dumps(CARD).replace('"MXFP4"', f'"MX{raw}FP4"', 1)),
        ("card.yaml", yaml.safe_dump(CARD).replace("MXFP4", f"MX{raw}FP4", 1)),
    ):
        card = tmp_path / name
        card.write_text(text)
        refused_in_one_line(resolved(card), str(card))


def test_a_raw_control_byte_in_the_recipe_of_lock_check_is_one_line(tmp_path: Path) -> None:
    """`servefleet lock --check` resolves each host's recipe: the same loader, the same line.
    The CLI in a subprocess (reading an inventory imports pyinfra's CLI)."""
    shutil.copytree(VLLM_ROOT, tmp_path / "vllm")
    recipe = tmp_path / "vllm" / "models" / "openai" / "gpt-oss-120b.yaml"
    recipe.write_text(recipe.read_text() + "x: \x1b[2J\n")
    inventory = tmp_path / "inventories" / "prod.py"
    inventory.parent.mkdir()
    inventory.write_text('hosts = ["h1"]\n')
    cmd = [sys.executable, "-m", "servefleet", "lock", str(inventory), "--lock-dir",
           str(tmp_path / "lock"), "--check", "--data", f"serve_recipe={recipe}"]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("RBLN_")}
    env |= {"RBLN_INDEX_USER": "u", "RBLN_INDEX_PASSWORD": "p"}
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    (line,) = done.stderr.splitlines()
    assert f"{recipe}: malformed YAML at line" in line and "U+001B" in line, line


@pytest.mark.parametrize(
    ("key", "value", "allowed"),
    [
        ("strategy", [["x"]], "a strategy id"),  # was TypeError: unhashable type: 'list'
        ("strategy", {"a": 1}, "a strategy id"),
        ("alternatives", "x", "a mapping of strategy id"),  # was AttributeError: 'str' ... 'keys'
        ("alternatives", [["x"]], "a mapping of strategy id"),
        ("hardware", ["h200"], "a GPU id"),
        ("variant", 7, "a variant name"),
    ],
)
def test_a_recommended_command_of_the_wrong_shape_is_one_line(
    tmp_path: Path, key: str, value: Any, allowed: str
) -> None:
    shutil.copytree(VLLM_ROOT, tmp_path / "vllm")
    doc = json.loads(SITE_JSON.read_text())
    doc["recommended_command"][key] = value
    path = tmp_path / "vllm" / "json" / "openai" / "fuzz.json"
    path.write_text(json.dumps(doc))
    for run in (resolved(path), CliRunner().invoke(main, ["recipes", "show", str(path)])):
        refused_in_one_line(run, f"recommended_command.{key}", f"allowed: null or {allowed}")


@pytest.mark.parametrize("number", [".inf", "-.inf", ".nan"])
def test_a_non_finite_number_in_a_recipe_is_one_line(vllm_recipe: Any, number: str) -> None:
    # vram_minimum_gb: .inf was OverflowError (math.ceil(inf)) choosing the parallel size
    path = vllm_recipe(lambda d: d["variants"]["default"].__setitem__("vram_minimum_gb", 1234.5))
    path.write_text(path.read_text().replace("1234.5", number))
    line = refused_in_one_line(resolved(path), "variants.default.vram_minimum_gb")
    assert "allowed: finite numbers" in line
    with pytest.raises(RecipeError) as e:
        load_json('{"a": [1, NaN]}', "r.json")
    assert "r.json: a[1]: the number nan; allowed: finite numbers" in one_line(e)
    with pytest.raises(RecipeError) as e:
        load_json('{"a": -Infinity}', "r.json")
    assert "the number -inf" in one_line(e)


def add_args(*args: str) -> Any:
    return lambda d: d["model"].setdefault("base_args", []).extend(args)


def add_env(name: str, value: str) -> Any:
    return lambda d: (d["model"].get("base_env") or d["model"].setdefault("base_env", {})).update(
        {name: value}
    )


@pytest.mark.parametrize(
    ("change", "needles"),
    [
        (  # a value holding a line break: two options in a unit's eyes, raw in --format shell
            add_env("AMDGCN_USE_BUFFER_OPS", "--block-size 4096\n--host 0.0.0.0"),
            ("env AMDGCN_USE_BUFFER_OPS", "U+000A"),
        ),
        (add_env("VLLM_X", "a\x1b[2Jb"), ("env VLLM_X", "U+001B")),
        (add_env("VLLM_X", "a\u2028b"), ("env VLLM_X", "U+2028")),
        (add_args("--served-model-name", "x\x1b]0;owned\x07"), ("argv[", "U+001B")),
        (add_args("--served-model-name", "a\u202eb"), ("argv[", "U+202E")),
        (add_args("--served-model-name", "x\r"), ("argv[", "U+000D")),
        (  # one word holding an option: vLLM reads it as the value, a reader as two options
            add_args("--served-model-name", "x --api-key k"),
            ("argv[", "the option '--api-key' inside one word"),
        ),
        (add_args("--served-model-name", '{"a": 1 --host x'), ("the option '--host' inside",)),
    ],
)
def test_control_characters_and_options_inside_a_word_are_refused(
    vllm_recipe: Any, change: Any, needles: tuple[str, ...]
) -> None:
    path = vllm_recipe(change)
    for fmt in ("shell", "json", "unit"):
        refused_in_one_line(resolved(path, fmt=fmt), *needles, "allowed: ")


def test_json_values_and_plain_words_still_resolve(vllm_recipe: Any, tmp_path: Path) -> None:
    """What the recipes hold stays: a JSON value (line breaks between its tokens, an option
    inside one of its strings), a multi-word env value, a negative number."""
    config = '{\n  "level": 3,\n  "note": "x --host y"\n}'
    path = vllm_recipe(
        lambda d: (
            add_args("--compilation-config", config, "--seed", "-1")(d),
            add_env("VLLM_X", "a b  c")(d),
        )
    )
    shell = resolved(path)
    assert shell.exit_code == 0, shell.output
    assert "--compilation-config '{\n" in shell.output and "VLLM_X='a b  c'" in shell.output
    spec = json.loads(resolved(path, fmt="json").output)
    assert config in spec["servers"][0]["argv"]
    card = resolved(FILES / "recipes" / "rbln" / "gpt-oss-120b.json", "--recommended")
    assert card.exit_code == 0 and "LMCACHE_EXTRA_CONFIG='{\n" in card.output, card.output
