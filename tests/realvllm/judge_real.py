"""A direct parse by the real vLLM, the reference the pre-flight is held to. Run with a real-wheel
python (tests/realvllm/build.py): reads a JSON list of argvs (the words after ``vllm serve``) on
stdin and prints a JSON list, for each, of None (it would start) or ``[stage, message]``. An item
may also be ``{"argv": [...], "cwd": DIR}``: that argv is judged in directory DIR (a relative
``--chat-template`` or ``--config`` is looked for there), then the judge returns to its own.

It runs vLLM's own ``vllm/entrypoints/cli/main.py`` ``main()`` once, with ``sys.argv`` of
``vllm serve``, and takes the top-level parser that ``main()`` builds when it is about to parse
(``main()`` builds it, its subcommands and their plugins exactly as ``vllm`` does). Then, for each
argv, what ``vllm serve`` runs before it loads a model, by the names vLLM 0.30.0 defines them
at: ``parse_args`` (stage ``parse``: argparse's error, or ``--help``), the serve subcommand's
``validate`` (``validate``), ``vllm.entrypoints.launchers.launcher.validate_api_server_args``
(``server``; not for ``--headless``/``--grpc``, which start no API server), and the engine's
``ReasoningParserManager.get_reasoning_parser`` (``engine``). Messages are vLLM's own, as
printed (argparse's text after ``error: ``, else ``ExceptionName: text``).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
from typing import Any

import vllm.entrypoints.cli.main as cli_main
import vllm.entrypoints.cli.serve as serve
import vllm.utils.argparse_utils as argparse_utils
from vllm.entrypoints.launchers.launcher import validate_api_server_args
from vllm.reasoning import ReasoningParserManager


class Built(Exception):
    """main() built its parser and is about to parse."""


def real_parser() -> Any:
    """The top-level parser vLLM's own main() builds."""
    original = argparse_utils.FlexibleArgumentParser
    captured: list[Any] = []

    class Capture(original):  # type: ignore[misc,valid-type]
        def parse_args(self, args: Any = None, namespace: Any = None) -> Any:
            if not captured:
                captured.append(self)
                raise Built
            return super().parse_args(args, namespace)

    argparse_utils.FlexibleArgumentParser = Capture
    saved = sys.argv
    sys.argv = ["vllm", "serve"]
    try:
        cli_main.main()
    except Built:
        pass
    finally:
        sys.argv = saved
        argparse_utils.FlexibleArgumentParser = original
    assert captured, "vllm's main() built no parser"
    return captured[0]


def judge(top: Any, argv: list[str]) -> list[str] | None:
    err = io.StringIO()
    stage = "parse"
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            args = top.parse_args(["serve", *argv])
            stage = "validate"
            serve.ServeSubcommand().validate(args)
            if args.headless or args.grpc:
                return None
            stage = "server"
            validate_api_server_args(args)
            stage = "engine"
            if args.reasoning_parser:
                ReasoningParserManager.get_reasoning_parser(args.reasoning_parser)
    except SystemExit as exc:
        text = err.getvalue()
        at = text.find(": error: ")
        return [stage, text[at + 9 :].rstrip("\n") if at >= 0 else f"exit {exc.code}"]
    except Exception as exc:
        return [stage, f"{type(exc).__name__}: {exc}"]
    return None


def judge_in(top: Any, item: list[str] | dict[str, Any]) -> list[str] | None:
    """:func:`judge` of an argv, or of ``{"argv", "cwd"}`` in that directory."""
    if isinstance(item, list):
        return judge(top, item)
    home = os.getcwd()
    os.chdir(item["cwd"])
    try:
        return judge(top, item["argv"])
    finally:
        os.chdir(home)


def main() -> int:
    items = json.load(sys.stdin)
    top = real_parser()
    print(json.dumps([judge_in(top, item) for item in items]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
