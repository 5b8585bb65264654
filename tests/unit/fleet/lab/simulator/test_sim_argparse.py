"""The simulated vllm's ``vllm serve`` parser where tests/realvllm/test_sim_parity.py found it
unlike the real vLLM 0.30.0 (issue #30): the parser that ``vllm.entrypoints.cli.main`` builds
(``vllm`` with its ``serve`` subcommand, as vLLM's ``main()`` does) takes abbreviated long flags,
adds vLLM's ``--task`` hint, reads a ``--config`` YAML file; vLLM's ``parse_type`` and
``optional_type`` words; pydantic's ``json_invalid`` error and its ``Input should be an object``
for config arguments; a ``null`` where vLLM skips the field's validation; a missing chat
template is vLLM's ``VLLMValidationError``."""

from __future__ import annotations

import contextlib
import importlib
import io
import re
from pathlib import Path
from typing import Any

import pytest
from lab_sim_support import load_sim, upstream_root

SIM = load_sim("servefleet_lab_vllm_sim_argparse")
PKG = SIM.__name__.rpartition(".")[0]
CLI_MAIN = importlib.import_module(f"{PKG}.entrypoints.cli.main")
SERVE_ARGS = importlib.import_module(f"{PKG}.serve_args")
EXCEPTIONS = importlib.import_module(f"{PKG}.exceptions")
MODEL = "Qwen/Qwen3-0.6B"


@pytest.fixture
def cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An upstream simulation root, and a current directory of the test's own (returned)."""
    upstream_root(tmp_path, monkeypatch)
    return tmp_path / "cwd"


def serve(*argv: str) -> tuple[Any, str]:
    """``vllm serve ARGV`` parsed by the top-level parser: (namespace, "") or (None, argparse's
    message after ``error: ``)."""
    parser, _ = CLI_MAIN._build()
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            return parser.parse_args(["serve", *argv]), ""
    except SystemExit as exc:
        assert exc.code == 2, err.getvalue()
        return None, err.getvalue().split(": error: ", 1)[1].rstrip("\n")


def test_an_unambiguous_abbreviation_is_the_flag_and_an_ambiguous_one_is_refused(
    cwd: Path,
) -> None:
    ns, _ = serve(MODEL, "--max-model", "4096")
    assert ns.max_model_len == 4096
    ns, message = serve(MODEL, "--max-num", "8")
    assert ns is None and message.startswith("ambiguous option: --max-num could match ")


def test_task_is_refused_with_vllms_hint(cwd: Path) -> None:
    for task in (["--task", "embed"], ["--task=embed"]):
        ns, message = serve(MODEL, *task)
        first, _, hint = message.partition("\n\n")
        assert ns is None and first == f"unrecognized arguments: {' '.join(task)}"
        assert hint.startswith("Hint: --task is not a vllm serve option. ")
    _, message = serve(MODEL, "--nosuch")
    assert message == "unrecognized arguments: --nosuch"


def test_a_value_parser_wrapped_by_parse_type_or_optional_type_says_what_it_could_not_convert(
    cwd: Path,
) -> None:
    loads = re.escape("<function loads at 0x") + "[0-9a-f]+>"
    for flag in ("--override-generation-config", "--speculative-config"):
        _, message = serve(MODEL, flag, "{bad")
        assert re.fullmatch(
            rf"argument {flag}(/-sc)?: Value {{bad cannot be converted to {loads}\.", message
        )
    _, message = serve(MODEL, "--model-loader-extra-config", "{bad}")  # braced: JSON
    assert re.search(rf"Value {{bad}} cannot be converted to {loads}\.$", message)
    ns, _ = serve(MODEL, "--model-loader-extra-config", "not-json", "--speculative-config", "None")
    assert ns.model_loader_extra_config == "not-json" and ns.speculative_config is None


def test_text_that_is_not_json_is_pydantics_json_invalid_error_of_the_config_class(
    cwd: Path,
) -> None:
    cases = {
        "{mode: 3": "key must be a string at line 1 column 2",
        '{"mode": 3': "EOF while parsing an object at line 1 column 10",
        '{"mode" 3}': "expected `:` at line 1 column 9",
        '{"mode": 3}x': "trailing characters at line 1 column 12",
        '{"mode": 3,}': "trailing comma at line 1 column 12",
        '{"mode": [1 2]}': "expected `,` or `]` at line 1 column 13",
        '{"mode": "x': "EOF while parsing a string at line 1 column 11",
        "abc": "expected value at line 1 column 1",
    }
    for text, words in cases.items():
        _, message = serve(MODEL, "-cc", text)
        assert message == (
            "argument --compilation-config/-cc: 1 validation error for CompilationConfig\n"
            f"  Invalid JSON: {words} [type=json_invalid, input_value={text!r}, input_type=str]"
        ), text
    _, message = serve(MODEL, "--quantization-config", "{bad")  # a class without a schema
    assert message.startswith(
        "argument --quantization-config: 1 validation error for QuantizationConfigArgs\n"
        "  Invalid JSON: key must be a string at line 1 column 2 [type=json_invalid"
    )
    _, message = serve(MODEL, "--quantization-config", "3")
    assert message.endswith(
        "Input should be an object [type=dataclass_type, input_value=3, input_type=int]"
    )


def test_null_passes_where_vllm_skips_the_fields_validation(cwd: Path) -> None:
    for argv in (
        ["--compilation-config.mode", "null"],
        ["-cc", '{"cudagraph_mode": null, "max_cudagraph_capture_size": null}'],
        ["-cc.pass_config.fuse_norm_quant", "null"],
    ):
        ns, message = serve(MODEL, *argv)
        assert ns is not None, message
    _, message = serve(MODEL, "-cc.backend", "null")  # no such validator: checked, as vLLM does
    assert message.endswith(
        "backend\n  Input should be a valid string [type=string_type, input_value=None, "
        "input_type=NoneType]"
    )


def test_a_config_file_gives_arguments_the_command_line_overrides(cwd: Path) -> None:
    (cwd / "cfg.yaml").write_text(
        "max-model-len: 4096\nport: 8001\nenforce-eager: true\ndisable-log-stats: false\n"
        "served-model-name: [a, b]\ncompilation-config:\n  mode: 3\n"
    )
    ns, _ = serve(MODEL, "--config", "cfg.yaml", "--port", "8002")
    assert (ns.model_tag, ns.max_model_len, ns.port, ns.enforce_eager) == (MODEL, 4096, 8002, True)
    assert ns.served_model_name == ["a", "b"] and ns.compilation_config == {"mode": 3}
    (cwd / "model.yml").write_text(f"model: {MODEL}\n")
    with pytest.raises(ValueError, match=r"^No model specified! Please specify model either"):
        serve("--config", "cfg.yaml")
    ns, _ = serve("--config", "model.yml")
    assert ns.model == MODEL and ns.model_tag is None
    (cwd / "bad.yaml").write_text("nosuch: 1\n")
    assert serve(MODEL, "--config", "bad.yaml")[1] == "unrecognized arguments: --nosuch 1"
    with pytest.raises(FileNotFoundError):
        serve(MODEL, "--config", "missing.yaml")
    with pytest.raises(
        ValueError, match=r"^Config file must be of a yaml/yml type. json supplied$"
    ):
        serve(MODEL, "--config", "cfg.json")
    with pytest.raises(ValueError, match=r"^No config file specified!"):
        serve(MODEL, "--config")


def test_a_missing_chat_template_is_vllms_validation_error(cwd: Path) -> None:
    ns, _ = serve(MODEL, "--chat-template", "missing.jinja")
    with pytest.raises(EXCEPTIONS.VLLMValidationError) as refused:
        SERVE_ARGS.validate_parsed_serve_args(ns)
    assert str(refused.value).startswith("The supplied chat template string (missing.jinja)")
    assert str(refused.value).endswith(" (parameter=chat_template)")
    assert refused.value.parameter == "chat_template" and refused.value.value is None
    assert not isinstance(refused.value, ValueError)  # vLLM's own, a VLLMClientError
    assert isinstance(refused.value, EXCEPTIONS.VLLMClientError)
    (cwd / "t.jinja").write_text("{{ messages }}")
    SERVE_ARGS.validate_parsed_serve_args(serve(MODEL, "--chat-template", "t.jinja")[0])


def test_vllm_serve_reports_a_config_file_or_template_it_cannot_use_in_one_line(
    cwd: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert SIM.main(["serve", MODEL, "--config", "missing.yaml"]) == 1
    assert "[sim] FileNotFoundError: [Errno 2] No such file or directory: 'missing.yaml'" in (
        capsys.readouterr().err
    )
    assert SIM.main(["serve", MODEL, "--chat-template", "missing.jinja"]) == 1
    assert "[sim] VLLMValidationError: The supplied chat template string" in capsys.readouterr().err
