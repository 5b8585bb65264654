"""The simulator's config arguments and chat templates against vLLM 0.30.0's dumps
(the version's reference data, which the simulated vllm carries in flags/: each JSON-object
argument's config class and JSON schema, the chat templates the wheel ships): unknown keys, enum values and types refused in pydantic's
words inside argparse's error, as vLLM's parser refuses them, and what fits the classes
accepted; a path-like chat template found as given or among the wheel's, else vLLM's message.
Recipe fixtures of our own (tests/unit/recipes/preflight) render the forms vLLM's recipes use;
vLLM's own entry points (``make_arg_parser``, ``validate_parsed_serve_args``) answer from the
same table."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import io
import json
import os
from pathlib import Path
from typing import Any

import pytest
from lab_sim_support import load_sim, upstream_root
from preflight_cases import FIXTURES, fixture_command

from servefleet.base.vllm_reference import reference
from servefleet.kinds.vllm import load_vllm_recipe

SIM = load_sim("servefleet_lab_vllm_sim_configs")
PKG = SIM.__name__.rpartition(".")[0]
SERVE_ARGS = importlib.import_module(f"{PKG}.serve_args")
FLAG_TABLE = importlib.import_module(f"{PKG}.flag_table")
VLLM_VALIDATION_ERROR = importlib.import_module(f"{PKG}.exceptions").VLLMValidationError
FLAGS = reference().root
CONFIGS = {
    "rbln": "vllm-0.30.0-rbln-0.12.0-configs.json",
    "upstream": "vllm-0.30.0-upstream-configs.json",
}
PLATFORMS = {"rbln": "vllm-0.30.0-rbln-0.12.0.json", "upstream": "vllm-0.30.0-upstream.json"}
# The classes vLLM builds from plain JSON when the engine starts, not while it parses
AT_START = {"--watermark-config", "--diffusion-config"}
NO_SCHEMA = {"--speculative-config"}  # pydantic cannot make one; vLLM checks it at start
# Fields whose before-validator reads an enum by name (vllm.config_schemas.BEFORE)
BY_NAME = {
    ("--compilation-config", "cudagraph_mode"),
    ("--compilation-config", "mode"),
    ("--attention-config", "backend"),
    ("--attention-config", "mla_prefill_backend"),
    ("--attention-config", "backend_per_kind"),
}


def classes(platform: str) -> dict[str, dict[str, Any]]:
    text = (FLAGS / CONFIGS[platform]).read_text()
    if not text.startswith("{"):  # the rbln dump begins with vllm-rbln's import-time warning
        first, _, text = text.partition("\n")
        assert first.startswith("[vllm-rbln] WARNING"), first
    data: dict[str, dict[str, Any]] = json.loads(text)
    return data


def table(platform: str) -> dict[str, dict[str, Any]]:
    entries = json.loads((FLAGS / PLATFORMS[platform]).read_text())["flags"]
    return {e["flags"][0]: e for e in entries}


def parse(platform: str, argv: list[str]) -> tuple[argparse.Namespace | None, str]:
    """The parsed arguments (None when refused) and argparse's message after ``error: ``."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return SIM.parse_serve_args(argv, platform), ""
    except SystemExit as exc:
        assert exc.code == 2, err.getvalue()
        text = err.getvalue()
        assert "vllm serve: error: " in text, text
        return None, text.split("vllm serve: error: ", 1)[1].rstrip("\n")


def fixture_argv(recipe: str, feature: str) -> list[str]:
    """The arguments after ``vllm serve`` of a fixture recipe's command line."""
    return fixture_command(recipe, feature)[2:]


@pytest.fixture
def simroot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A simulation root whose platform file says upstream; the current directory elsewhere."""
    return upstream_root(tmp_path, monkeypatch)


# ---------------------------------------------------------------------------------------------
# The dumps


def test_the_dumps_cover_the_eighteen_json_object_arguments() -> None:
    for platform in PLATFORMS:
        found, flags = classes(platform), table(platform)
        assert len(found) == 18 and set(found) <= set(flags)
        assert all(c["extra"] == "forbid" for c in found.values())
        with_schema = {f for f, c in found.items() if "properties" in c["schema"]}
        assert set(found) - with_schema == NO_SCHEMA
        # parsed by pydantic while vLLM parses (parse_dataclass), or plain JSON until it starts
        assert {f for f in with_schema if "loads" in str(flags[f]["type"])} == AT_START
        checked = {f for f in with_schema if "parse_dataclass" in str(flags[f]["type"])}
        assert checked == with_schema - AT_START and len(checked) == 15
    upstream, rbln = classes("upstream"), classes("rbln")
    assert {f: c for f, c in upstream.items() if f not in NO_SCHEMA} == {
        f: c for f, c in rbln.items() if f not in NO_SCHEMA
    }  # vllm-rbln changes no config class


# ---------------------------------------------------------------------------------------------
# Recipe fixtures: refused as vLLM 0.30.0 refuses them, accepted when they fit

REFUSED = {
    "unknown_key": "argument --attention-config/-ac: 1 validation error for AttentionConfig\n"
    "use_fp4_indexer_cache\n  Unexpected keyword argument [type=unexpected_keyword_argument, "
    "input_value=True, input_type=bool]",
    "unknown_dotted_key": "argument --kernel-config: 1 validation error for KernelConfig\n"
    "fused_everything\n  Unexpected keyword argument [type=unexpected_keyword_argument, "
    "input_value=True, input_type=bool]",
    "wrong_enum": "argument --kv-transfer-config: 1 validation error for KVTransferConfig\n"
    "kv_role\n  Input should be 'kv_producer', 'kv_both' or 'kv_consumer' [type=literal_error, "
    "input_value='kv_everyone', input_type=str]",
    "wrong_type": "argument --compilation-config/-cc: 1 validation error for CompilationConfig\n"
    "cudagraph_capture_sizes\n  Input should be a valid list [type=list_type, "
    "input_value='all', input_type=str]",
    "unknown_flag": "unrecognized arguments: --tool-call-parser-plugin acme_tools.py",
}


@pytest.mark.parametrize("platform", sorted(PLATFORMS))
@pytest.mark.parametrize("feature", sorted(REFUSED))
def test_too_new_recipe_is_refused_in_vllms_words(platform: str, feature: str) -> None:
    ns, message = parse(platform, fixture_argv("too-new", feature))
    assert ns is None and message == REFUSED[feature]


def test_a_chat_template_of_vllms_source_tree_is_refused(simroot: Path) -> None:
    ns, message = parse("upstream", fixture_argv("too-new", "missing_template"))
    assert ns is not None and message == ""  # it parses; the serve checks refuse it
    with pytest.raises(VLLM_VALIDATION_ERROR) as refused:  # vLLM's, not a ValueError
        SERVE_ARGS.validate_parsed_serve_args(ns)
    builtin = os.path.join(SERVE_ARGS.CHAT_TEMPLATES_DIR, "examples/tool_chat_template_acme.jinja")
    assert str(refused.value) == (
        "The supplied chat template string (examples/tool_chat_template_acme.jinja) appears "
        f"path-like, but doesn't exist! Tried: examples/tool_chat_template_acme.jinja and {builtin}"
        " (parameter=chat_template)"
    )


@pytest.mark.parametrize("platform", sorted(PLATFORMS))
def test_recipe_that_fits_the_pin_is_accepted(platform: str, simroot: Path) -> None:
    recipe = load_vllm_recipe(FIXTURES / "fits-the-pin.yaml")
    seen = {}
    for feature in recipe.features:
        ns, message = parse(platform, fixture_argv("fits-the-pin", feature))
        assert ns is not None, (feature, message)
        SERVE_ARGS.validate_parsed_serve_args(ns)
        assert SERVE_ARGS.engine_config_error(ns, platform) is None
        seen[feature] = ns
    # vLLM appends the dotted sub-keys' object after the flag's own JSON: it replaces it
    # (vllm/utils/argparse_utils.py), so only the dotted list is left
    assert seen["compilation"].compilation_config == {
        "cudagraph_capture_sizes": ["1", "2", "4"],  # lax: "1" is an int to pydantic
    }
    assert seen["spec_decoding"].speculative_config == {
        "method": "eagle3",
        "num_speculative_tokens": 3,
    }
    # a dotted value that is not JSON stays text; pydantic reads "False" for the bool field
    assert seen["attention"].kernel_config == {"enable_flashinfer_autotune": "False"}
    assert seen["shipped_template"].chat_template == "template_chatml.jinja"


# ---------------------------------------------------------------------------------------------
# Every field of every class, held against its schema

WRONG = {  # a JSON object where a scalar belongs: pydantic's message for each schema type
    "boolean": ("bool_type", "Input should be a valid boolean"),
    "integer": ("int_type", "Input should be a valid integer"),
    "number": ("float_type", "Input should be a valid number"),
    "string": ("string_type", "Input should be a valid string"),
}


def _plain(field: dict[str, Any]) -> dict[str, Any]:
    """A field's schema without its Optional (``anyOf`` of one type and null)."""
    members = [m for m in field.get("anyOf", []) if m.get("type") != "null"]
    return members[0] if len(members) == 1 else field


def _nullable(field: dict[str, Any]) -> bool:
    return any(m.get("type") == "null" for m in field.get("anyOf", []))


def _one(platform: str, flag: str, value: Any) -> str:
    ns, message = parse(platform, ["m", flag, json.dumps(value)])
    return "ok" if ns is not None else message


@pytest.mark.parametrize("platform", sorted(PLATFORMS))
def test_every_field_takes_its_default_and_refuses_what_its_schema_does(platform: str) -> None:
    wrong = []
    counted = {"default": 0, "type": 0, "enum": 0}
    for flag, entry in classes(platform).items():
        schema = entry["schema"]
        if flag in AT_START | NO_SCHEMA:
            continue
        title = schema["title"]
        head = (
            f"argument {'/'.join(table(platform)[flag]['flags'])}: 1 validation error for {title}"
        )
        stranger = _one(platform, flag, {"no_such_field": 1})
        if stranger != (
            f"{head}\nno_such_field\n  Unexpected keyword argument "
            "[type=unexpected_keyword_argument, input_value=1, input_type=int]"
        ):
            wrong.append((flag, "stranger", stranger))
        for name, field in schema["properties"].items():
            if (flag, name) in BY_NAME:
                continue
            if "default" in field and (field["default"] is not None or _nullable(field)):
                counted["default"] += 1
                if _one(platform, flag, {name: field["default"]}) != "ok":
                    wrong.append((flag, name, "its default is refused"))
            plain = _plain(field)
            kind = plain.get("type")
            if kind in WRONG and "enum" not in plain and "const" not in plain:
                counted["type"] += 1
                error, msg = WRONG[kind]
                want = (
                    f"{head}\n{name}\n  {msg} [type={error}, input_value={{'x': 1}}, "
                    "input_type=dict]"
                )
                if _one(platform, flag, {name: {"x": 1}}) != want:
                    wrong.append((flag, name, "a wrong type"))
            if "enum" in plain and all(isinstance(v, str) for v in plain["enum"]):
                counted["enum"] += 1
                got = _one(platform, flag, {name: "no-such-member"})
                listed = [repr(v) for v in plain["enum"]]
                expected = listed[0] if len(listed) == 1 else ", ".join(listed[:-1])
                expected += "" if len(listed) == 1 else " or " + listed[-1]
                if f"{name}\n  Input should be {expected} [type=literal_error" not in got:
                    wrong.append((flag, name, got))
    assert wrong == []
    assert counted["default"] > 100 and counted["type"] > 100 and counted["enum"] > 10


def test_nested_classes_refs_and_unions_are_checked() -> None:
    cases = {
        # a nested class through $ref: its own unknown keys, its own types
        '{"pass_config": {"fuse_allreduce_rms": "maybe", "fuse_x": 1}}': (
            "2 validation errors for CompilationConfig\npass_config.fuse_allreduce_rms\n"
            "  Input should be a valid boolean, unable to interpret input [type=bool_parsing, "
            "input_value='maybe', input_type=str]\npass_config.fuse_x\n"
            "  Unexpected keyword argument [type=unexpected_keyword_argument, input_value=1, "
            "input_type=int]"
        ),
        '{"pass_config": 3}': (
            "1 validation error for CompilationConfig\npass_config\n  Input should be an object "
            "[type=dataclass_type, input_value=3, input_type=int]"
        ),
        # an Enum class by $ref: its values, or (vLLM's before-validator) its member names
        '{"dynamic_shapes_config": {"type": "sideways"}}': (
            "1 validation error for CompilationConfig\ndynamic_shapes_config.type\n  Input "
            "should be 'backed', 'unbacked' or 'backed_size_oblivious' [type=enum, "
            "input_value='sideways', input_type=str]"
        ),
        '{"mode": "FAST"}': (
            "1 validation error for CompilationConfig\nmode\n  Value error, Invalid compilation "
            "mode: FAST. Valid modes are: NONE, STOCK_TORCH_COMPILE, DYNAMO_TRACE_ONCE, "
            "VLLM_COMPILE [type=value_error, input_value='FAST', input_type=str]"
        ),
        # a union (list[int | str]): each member's error, tagged as pydantic tags them
        '{"compile_sizes": [1, "cudagraph_capture_sizes", 2.5]}': (
            "2 validation errors for CompilationConfig\ncompile_sizes.2.int\n  Input should be "
            "a valid integer, got a number with a fractional part [type=int_from_float, "
            "input_value=2.5, input_type=float]\ncompile_sizes.2.str\n  Input should be a "
            "valid string [type=string_type, input_value=2.5, input_type=float]"
        ),
        "[1]": (
            "1 validation error for CompilationConfig\n  Input should be an object "
            "[type=dataclass_type, input_value=[1], input_type=list]"
        ),
    }
    for value, message in cases.items():
        ns, got = parse("upstream", ["m", "-cc", value])
        assert got == f"argument --compilation-config/-cc: {message}", value
    for ok in ['{"mode": 3}', '{"cudagraph_mode": [2, 1]}', '{"compile_sizes": [1, "x"]}']:
        assert parse("upstream", ["m", "-cc", ok])[0] is not None, ok
    with pytest.raises(KeyError):  # vLLM's CUDAGraphMode[name]: not a validation error
        SIM.parse_serve_args(["m", "-cc", '{"cudagraph_mode": "SOMETIMES"}'], "upstream")
    ns, got = parse("upstream", ["m", "-ac", '{"backend": "vllm.v1.Some.Path"}'])
    assert "Value error, Unknown attention backend: 'VLLM.V1.SOME.PATH'." in got
    for backend in ("auto", "FLASHINFER", "flash_attn"):
        assert parse("upstream", ["m", "-ac", json.dumps({"backend": backend})])[0] is not None


def test_numbers_bounds_and_long_inputs_read_as_pydantic_reads_them() -> None:
    ok = {
        "--eplb-config": ['{"window_size": "1000"}', '{"window_size": 7.0}'],
        "--kv-transfer-config": ['{"kv_buffer_size": "1e9"}', '{"kv_rank": null}'],
    }
    for flag, values in ok.items():
        for value in values:
            assert parse("upstream", ["m", flag, value])[0] is not None, value
    ns, got = parse("upstream", ["m", "--eplb-config", '{"num_redundant_experts": -1}'])
    assert got.endswith(
        "num_redundant_experts\n  Input should be greater than or equal to 0 "
        "[type=greater_than_equal, input_value=-1, input_type=int]"
    )
    long = "x" * 80
    ns, got = parse("upstream", ["m", "--kv-transfer-config", json.dumps({"kv_rank": long})])
    assert f"input_value='{'x' * 24}...{'x' * 23}', input_type=str]" in got  # cut at 50
    ns, got = parse("upstream", ["m", "--kv-transfer-config", "{nope"])
    assert got == (  # pydantic reads the text: its json_invalid error
        "argument --kv-transfer-config: 1 validation error for KVTransferConfig\n  Invalid JSON: "
        "key must be a string at line 1 column 2 [type=json_invalid, input_value='{nope', "
        "input_type=str]"
    )


def test_classes_built_at_start_are_checked_when_vllm_serve_starts(
    simroot: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ns = SIM.parse_serve_args(["m", "--watermark-config", "{}"], "upstream")
    assert ns.watermark_config == {}  # plain JSON while parsing, as vLLM
    message = SERVE_ARGS.engine_config_error(ns, "upstream")
    assert message == (
        "1 validation error for WatermarkConfig\nkey\n  Field required [type=missing, "
        "input_value={}, input_type=dict]"
    )
    ns = SIM.parse_serve_args(["m", "--watermark-config", '{"key": 3}'], "upstream")
    assert SERVE_ARGS.engine_config_error(ns, "upstream") is None
    assert SIM.main(["serve", "m", "--port", "8123", "--watermark-config", "{}"]) == 1
    err = capsys.readouterr().err
    assert "ValidationError: 1 validation error for WatermarkConfig\nkey\n  Field required" in err
    assert not (simroot / "run/rbln-sim/vllm-8123.json").exists()  # refused before it started
    # --speculative-config: no schema, any keys while parsing
    ns = SIM.parse_serve_args(["m", "--speculative-config.anything", "1"], "upstream")
    assert ns.speculative_config == {"anything": 1}
    assert SERVE_ARGS.engine_config_error(ns, "upstream") is None


# ---------------------------------------------------------------------------------------------
# Chat templates


def shipped() -> list[str]:
    return (FLAGS / "vllm-0.30.0-chat-templates.txt").read_text().split()


def test_path_like_chat_template_exists_as_given_or_in_the_wheel(simroot: Path) -> None:
    check = SERVE_ARGS.validate_chat_template
    assert len(shipped()) == 7 and all(n.endswith(".jinja") for n in shipped())
    for name in shipped():  # by name, relative to the wheel's folder, or its full path
        check(name)
        check(f"./{name}")
        check(os.path.join(SERVE_ARGS.CHAT_TEMPLATES_DIR, name))
    own = simroot.parent / "cwd" / "examples" / "tool_chat_template_acme.jinja"
    own.parent.mkdir()
    own.write_text("{{ messages }}")
    check(str(own))  # an existing absolute path
    check("examples/tool_chat_template_acme.jinja")  # relative to the current directory
    check("{{ messages }}")  # not path-like: the template itself
    check("line one\nline two")
    for missing in (
        "examples/tool_chat_template_gemma4.jinja",
        "tool_chat_template_llama3.1_json.jinja",  # the source tree's, not the wheel's
        "/nowhere/template_chatml.jinja",
        "template_chatml",
    ):
        with pytest.raises(VLLM_VALIDATION_ERROR, match=r"appears path-like, but doesn't exist!"):
            check(missing)
    with pytest.raises(FileNotFoundError, match="the supplied chat template path doesn't exist"):
        check(Path("/nowhere/x.jinja"))
    with pytest.raises(VLLM_VALIDATION_ERROR, match="is not a valid chat template type"):
        check(3)
    check(None)


def test_vllm_serve_refuses_a_missing_template_before_it_starts(
    simroot: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["serve", *fixture_argv("too-new", "missing_template"), "--port", "8124"]
    assert SIM.main(argv) == 1
    err = capsys.readouterr().err
    assert (
        "VLLMValidationError: The supplied chat template string "
        "(examples/tool_chat_template_acme.jinja) appears path-like, but doesn't exist!"
    ) in err
    assert not (simroot / "run/rbln-sim/vllm-8124.json").exists()


def test_serve_checks_of_flags_that_need_another(simroot: Path) -> None:
    cases = {
        ("--enable-auto-tool-choice",): "Error: --enable-auto-tool-choice requires "
        "--tool-call-parser",
        ("--enable-log-outputs",): "Error: --enable-log-outputs requires --enable-log-requests",
    }
    for flags, message in cases.items():
        ns = SIM.parse_serve_args(["m", *flags], "upstream")
        with pytest.raises(TypeError) as refused:
            SERVE_ARGS.validate_parsed_serve_args(ns)
        assert str(refused.value) == message
    ns = SIM.parse_serve_args(["m", "--enable-per-request-metrics", "--disable-log-stats"])
    with pytest.raises(ValueError, match="requires engine statistics logging"):
        SERVE_ARGS.validate_parsed_serve_args(ns)
    SERVE_ARGS.validate_parsed_serve_args(argparse.Namespace(subparser="bench"))  # not serve


# ---------------------------------------------------------------------------------------------
# vLLM's own entry points, from the same table


def test_vllms_entry_points_answer_from_the_simulators_table(simroot: Path) -> None:
    cli_args = importlib.import_module(f"{PKG}.entrypoints.launchers.cli_args")
    assert importlib.util.find_spec(f"{PKG}.entrypoints.openai") is None  # not in 0.30.0
    argparse_utils = importlib.import_module(f"{PKG}.utils.argparse_utils")
    chat_utils = importlib.import_module(f"{PKG}.entrypoints.chat_utils")
    assert cli_args.make_arg_parser is SERVE_ARGS.make_arg_parser
    assert cli_args.validate_parsed_serve_args is SERVE_ARGS.validate_parsed_serve_args
    assert chat_utils.validate_chat_template is SERVE_ARGS.validate_chat_template
    assert argparse_utils.FlexibleArgumentParser is FLAG_TABLE.FlexibleArgumentParser
    for platform in PLATFORMS:
        (simroot / "etc/rbln-sim/platform").write_text(platform)
        # built as vllm/entrypoints/cli/main.py builds it: the serve subcommand's parser
        top = argparse_utils.FlexibleArgumentParser(prog="vllm")
        sub = top.add_subparsers(dest="subparser").add_parser("serve", usage="vllm serve")
        cli_args.make_arg_parser(sub)

        def spellings(parser: argparse.ArgumentParser) -> dict[str, str]:
            return {s: a.dest for a in parser._actions for s in a.option_strings}

        assert spellings(sub) == spellings(SIM.build_parser(platform))
        argv = [*fixture_argv("fits-the-pin", "compilation"), "--model_impl", "vllm"]
        ns = top.parse_args(["serve", *argv])
        want = SIM.parse_serve_args(argv, platform)
        assert ns.subparser == "serve" and ns.model_tag == "acme/fits-8b"
        assert ns.compilation_config == want.compilation_config
        assert ns.model_impl == want.model_impl == "vllm"
        # --model moves to the positional after serve, as FlexibleArgumentParser moves it
        moved = top.parse_args(["serve", "--port", "1", "--model", "a/b"])
        assert moved.model_tag == "a/b" and moved.port == 1
        err = io.StringIO()
        with contextlib.redirect_stderr(err), pytest.raises(SystemExit):
            top.parse_args(["serve", "m", *fixture_argv("too-new", "unknown_key")[1:]])
        assert "vllm serve: error: argument --attention-config/-ac: 1 validation error" in (
            err.getvalue()
        )
