"""``remote/preflight.py``'s child side in-process (issue #37's mutation campaign; the program run
against the simulator's vllm is test_preflight.py's): ``ServeCli`` over a stand-in vLLM put in
``sys.modules`` (its serve module, the launcher module ``setup_server`` names, the parser
registries), what ``check`` runs for a command line (the subcommand's ``validate``, the parser
plugins, ``validate_api_server_args``, the reasoning parser's lookup; nothing past ``validate``
for ``--headless`` and ``--grpc``), each name a moved vLLM lacks, ``check_argvs``' messages,
``child``'s results file, ``_pin`` and argparse's message."""

from __future__ import annotations

import argparse
import importlib.metadata
import io
import json
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from servefleet.base.remote import preflight

SERVE = "vllm.entrypoints.cli.serve"
LAUNCHER = "vllm.entrypoints.openai.api_server"


class Registry:
    """A parser registry: ``import_*`` records the plugin path, ``get_reasoning_parser`` knows
    the names in ``known`` (a KeyError otherwise, as vLLM's)."""

    def __init__(self, calls: list[str], known: tuple[str, ...] = ()) -> None:
        self.calls, self.known = calls, known

    def import_tool_parser(self, path: str) -> None:
        self.calls.append(f"tool plugin {path}")

    def import_reasoning_parser(self, path: str) -> None:
        self.calls.append(f"reasoning plugin {path}")

    def get_reasoning_parser(self, name: str) -> object:
        self.calls.append(f"reasoning parser {name}")
        if name not in self.known:
            raise KeyError(f"reasoning parser '{name}' not found")
        return object()


def fake_vllm(monkeypatch: pytest.MonkeyPatch, calls: list[str], **drop: bool) -> None:
    """A stand-in vLLM entry point in sys.modules (``drop``: names its modules lack)."""

    class ServeCmd:
        name = "serve"

        @staticmethod
        def cmd(args: argparse.Namespace) -> None:
            raise AssertionError("never served")

        def subparser_init(self, subparsers: Any) -> argparse.ArgumentParser:
            parser: argparse.ArgumentParser = subparsers.add_parser("serve")
            parser.add_argument("model")
            parser.add_argument("--port", type=int)
            parser.add_argument("--headless", action="store_true")
            parser.add_argument("--grpc", action="store_true")
            parser.add_argument("--tool-parser-plugin", default="")
            parser.add_argument("--reasoning-parser-plugin", default="")
            parser.add_argument("--reasoning-parser", default="")
            parser.add_argument("--bad", action="store_true")
            return parser

        def validate(self, args: argparse.Namespace) -> None:
            calls.append(f"validate {args.model}")
            if args.bad:
                raise TypeError("Error: --bad requires --good")

    class Other:
        name = "bench"

        def subparser_init(self, subparsers: Any) -> argparse.ArgumentParser:
            parser: argparse.ArgumentParser = subparsers.add_parser("bench")
            return parser

        @staticmethod
        def cmd(args: argparse.Namespace) -> None:
            pass

    launcher = types.ModuleType(LAUNCHER)

    def validate_api_server_args(args: argparse.Namespace) -> None:
        calls.append(f"api server {args.port}")
        if args.port == 1:
            raise ValueError("port 1 is taken")

    def setup_server(args: argparse.Namespace) -> None:
        pass

    setup_server.__module__ = LAUNCHER
    if not drop.get("validate"):
        launcher.validate_api_server_args = validate_api_server_args  # type: ignore[attr-defined]
    if not drop.get("tools"):
        launcher.ToolParserManager = Registry(calls)  # type: ignore[attr-defined]
    if not drop.get("reasoning"):
        launcher.ReasoningParserManager = Registry(calls, ("known",))  # type: ignore[attr-defined]
    serve = types.ModuleType(SERVE)
    if not drop.get("parser"):
        serve.FlexibleArgumentParser = argparse.ArgumentParser  # type: ignore[attr-defined]
    if not drop.get("setup"):
        serve.setup_server = setup_server  # type: ignore[attr-defined]
    if not drop.get("cmd_init"):
        cmds = [Other()] if drop.get("serve") else [Other(), ServeCmd()]
        serve.cmd_init = lambda: cmds  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, SERVE, serve)
    monkeypatch.setitem(sys.modules, LAUNCHER, launcher)
    monkeypatch.setattr(preflight, "_pin", lambda: "0.30.0")


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    seen: list[str] = []
    fake_vllm(monkeypatch, seen)
    return seen


def test_a_passing_command_line_runs_each_check_in_order(calls: list[str]) -> None:
    cli = preflight.ServeCli()
    cli.check(["m", "--port", "8000", "--tool-parser-plugin", "/p/tools.py",
               "--reasoning-parser-plugin", "/p/r.py", "--reasoning-parser", "known"])  # fmt: skip
    assert calls == ["validate m", "tool plugin /p/tools.py", "reasoning plugin /p/r.py",
                     "api server 8000", "reasoning parser known"]  # fmt: skip


def test_short_plugin_paths_and_no_reasoning_parser_are_not_loaded(calls: list[str]) -> None:
    preflight.ServeCli().check(["m", "--tool-parser-plugin", "a.p", "--reasoning-parser-plugin",
                                "abcd"])  # fmt: skip
    assert calls == ["validate m", "reasoning plugin abcd", "api server None"]


@pytest.mark.parametrize("flag", ["--headless", "--grpc"])
def test_a_server_without_an_api_server_stops_after_validate(calls: list[str], flag: str) -> None:
    preflight.ServeCli().check(["m", flag, "--port", "1", "--reasoning-parser", "unknown"])
    assert calls == ["validate m"]


def test_the_version_flag_says_the_pin(
    calls: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """vLLM's ``vllm --version`` and ``vllm -v``, as its main.py adds them."""
    for flag in ("--version", "-v"):
        with pytest.raises(SystemExit):
            preflight.ServeCli().top.parse_args([flag])
        assert capsys.readouterr().out == "0.30.0\n"


def test_a_serve_parser_without_the_optional_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    """A vLLM whose serve command has no --headless, --grpc, parser plugins or reasoning parser:
    each is taken as not given (the API server's checks still run)."""
    calls: list[str] = []
    fake_vllm(monkeypatch, calls)
    serve = sys.modules[SERVE]

    class Bare:
        name = "serve"
        cmd = staticmethod(print)

        def subparser_init(self, subparsers: Any) -> argparse.ArgumentParser:
            parser: argparse.ArgumentParser = subparsers.add_parser("serve")
            parser.add_argument("model")
            parser.add_argument("--port", type=int)
            return parser

        def validate(self, args: argparse.Namespace) -> None:
            calls.append(f"validate {args.model}")

    monkeypatch.setattr(serve, "cmd_init", lambda: [Bare()])
    assert preflight.check_argvs([["m", "--port", "1"], ["m"]]) == [
        "ValueError: port 1 is taken",
        None,
    ]
    assert calls == ["validate m", "api server 1", "validate m", "api server None"]


def test_check_argvs_gives_each_command_lines_message(calls: list[str]) -> None:
    messages = preflight.check_argvs(
        [
            ["m"],
            ["m", "--port", "x"],
            ["m", "--bad"],
            ["m", "--port", "1"],
            ["m", "--reasoning-parser", "nope"],
            ["m", "--help"],
            ["m", "--port", "2"],
        ]
    )
    assert messages[0] is None and messages[6] is None
    assert messages[1] == "argument --port: invalid int value: 'x'"
    assert messages[2] == "TypeError: Error: --bad requires --good"
    assert messages[3] == "ValueError: port 1 is taken"
    assert messages[4] == "at engine start: KeyError: \"reasoning parser 'nope' not found\""
    assert messages[5] == "vllm serve exits at once (status 0) with these arguments"
    assert len(messages) == 7


@pytest.mark.parametrize(
    ("drop", "says"),
    [
        ("parser", f"{SERVE} has no FlexibleArgumentParser"),
        ("setup", f"{SERVE} has no setup_server"),
        ("validate", f"{SERVE}.setup_server's module has no validate_api_server_args"),
        ("tools", "validate_api_server_args' module has no ToolParserManager"),
        ("reasoning", "the same module has no ReasoningParserManager"),
        ("cmd_init", f"{SERVE} has no cmd_init"),
        ("serve", f"{SERVE}.cmd_init() gives no serve subcommand"),
    ],
)
def test_each_name_a_moved_vllm_lacks_is_named(
    monkeypatch: pytest.MonkeyPatch, drop: str, says: str
) -> None:
    fake_vllm(monkeypatch, [], **{drop: True})
    with pytest.raises(preflight.Unsupported) as missing:
        preflight.ServeCli()
    assert str(missing.value) == says


def test_no_serve_module_is_unsupported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, SERVE, None)
    with pytest.raises(preflight.Unsupported, match=rf"^no module {SERVE} \("):
        preflight.ServeCli()


def test_argparse_message_is_what_follows_error() -> None:
    stderr = "usage: vllm serve [-h]\nvllm serve: error: argument --x: bad: value\n\n"
    assert preflight._argparse_message(stderr, 2) == "argument --x: bad: value"
    nested = "vllm serve: error: argument --y: error: in its JSON\n"
    assert preflight._argparse_message(nested, 2) == "argument --y: error: in its JSON"
    assert preflight._argparse_message(": error: at the start\n", 2) == "at the start"
    assert preflight._argparse_message("p: error: value 'XX' \t\n", 2) == "value 'XX' \t"
    assert preflight._argparse_message("p: error: choose XX\n", 2) == "choose XX"  # "\n" alone
    assert preflight._argparse_message("  something else \n", 2) == "something else"
    assert preflight._argparse_message("", 3) == (
        "vllm serve exits at once (status 3) with these arguments"
    )


# -- child and _pin ----------------------------------------------------------------------------


def run_child_side(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, argvs: Any) -> Any:
    monkeypatch.setattr(sys, "stdin", io.StringIO(json.dumps(argvs)))
    out = tmp_path / "results.json"
    assert preflight.child(str(out)) == 0
    return json.loads(out.read_text())


def test_the_child_writes_the_pin_and_each_message(
    calls: list[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    doc = run_child_side(monkeypatch, tmp_path, [["m"], ["m", "--bad"]])
    assert doc == {"pin": "0.30.0", "messages": [None, "TypeError: Error: --bad requires --good"]}


def test_the_child_of_a_moved_vllm_says_what_is_missing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fake_vllm(monkeypatch, [], setup=True)
    assert run_child_side(monkeypatch, tmp_path, [["m"]]) == {
        "error": f"cannot check with vLLM 0.30.0: {SERVE} has no setup_server (the pre-flight "
        "follows vllm serve's entry point as vLLM 0.30.0 has it)"
    }


def test_the_child_of_a_vllm_that_breaks_says_so(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def broken() -> list[str | None]:
        raise ImportError("libcuda.so.1: cannot open")

    monkeypatch.setattr(preflight, "_pin", lambda: "0.30.0")
    monkeypatch.setattr(preflight, "check_argvs", lambda argvs: broken())
    assert run_child_side(monkeypatch, tmp_path, [["m"]]) == {
        "error": "cannot build vLLM's parser: ImportError: libcuda.so.1: cannot open"
    }


def test_the_pin_drops_the_local_part(monkeypatch: pytest.MonkeyPatch) -> None:
    def installed(name: str) -> str:
        assert name == "vllm"
        return "0.30.0+cpu"

    monkeypatch.setattr(importlib.metadata, "version", installed)
    assert preflight._pin() == "0.30.0"

    def missing(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    vllm = types.ModuleType("vllm")
    # the local part: all after the first "+"
    vllm.__version__ = "0.9.1+rocm+x"  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    assert preflight._pin() == "0.9.1"
    monkeypatch.setitem(sys.modules, "vllm", types.ModuleType("vllm"))
    assert preflight._pin() == "?"
