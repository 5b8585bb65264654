#!/usr/bin/env python3
"""servefleet: would the release's own vLLM start these servers? Runs ON THE HOST with the
release venv's python (the standard library, and the vLLM it runs under); no GPU, no model.

usage: preflight.py INSTANCES_JSON     # [{"unit", "argv", "env"[, "cwd"]}]; "-": from stdin

For each instance, what ``vllm serve`` runs before it loads a model: vLLM's parser built as
``vllm/entrypoints/cli/main.py`` builds it (a ``serve`` subcommand whose arguments
``make_arg_parser`` adds: the general plugins, then the platform's ``pre_register_and_update``),
``parse_args``, then ``validate_parsed_serve_args`` (the chat template; flags that need another).
``argv`` is the server's command line (``.../vllm serve ...``), ``env`` its Environment=, ``cwd``
its working directory (default ``/``, systemd's for a unit without WorkingDirectory=). Each
distinct environment and directory gets a child process of this python, as vLLM reads both.

Prints one JSON line per instance, in order: ``{"unit": U, "ok": true}``, or ``{"unit": U,
"ok": false, "flag": F, "key": K, "message": M, "line": "U: F: M", "gap": G}``: M is vLLM's own
message on one line, K the config key vLLM does not know (else null), G (else null) says the
recipe needs a newer vLLM when the flag or key is not in this one (:func:`version_gap`).
Exit 0 when all pass, 1 when any is refused, 2 on bad input (one line, nothing run).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import io
import json
import os
import re
import subprocess
import sys
import tempfile
from typing import Any

CHILD = "--child"  # internal: preflight.py --child RESULTS_FILE, the argvs on stdin
DEFAULT_CWD = "/"
CHILD_TIMEOUT = 900  # seconds for one child to import vLLM and parse its argvs
MAX_MESSAGE = 2000  # characters of a message kept in the line
# What a unit's process gets from systemd besides its Environment= (and what vLLM may need)
BASE_ENV = ("PATH", "HOME", "LANG", "LC_ALL")
SYSTEMD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class BadInput(Exception):
    """The instances JSON is not what this program takes."""


# ---------------------------------------------------------------------------------------------
# Refusals: vLLM's message, its flag, its unknown key, the version gap (pure; the controller
# may import these)


def one_line(message: str) -> str:
    """vLLM's message on one line: lines joined by a space, pydantic's URL lines left out, cut
    to MAX_MESSAGE characters."""
    lines = [part.strip() for part in message.splitlines()]
    kept = [part for part in lines if part and not part.startswith("For further information")]
    text = " ".join(" ".join(kept).split())
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 3] + "..."


def flag_of(message: str) -> str:
    """The flag a vLLM message is about: argparse's ``argument --x/-x:``, the first of its
    ``unrecognized arguments``, ``--chat-template`` for the template check, else the first flag
    the message names (``vllm`` when it names none); the parser registries' KeyErrors name none,
    so theirs is said here."""
    found = re.match(r"argument ([^\s:/]+)", message)
    if found:
        return found.group(1)
    if message.startswith("unrecognized arguments: "):
        return message.split()[2].split("=", 1)[0]
    if "chat template" in message:
        return "--chat-template"
    for words, flag in (("invalid tool call parser", "--tool-call-parser"),
                        ("Reasoning parser ", "--reasoning-parser"),
                        ("invalid reasoning parser", "--reasoning-parser")):  # fmt: skip
        if words in message:
            return flag
    named = re.search(r"--[A-Za-z0-9][\w.-]*", message)
    return named.group(0) if named else "vllm"


def unknown_key(message: str) -> str | None:
    """The first config key pydantic calls an ``Unexpected keyword argument`` (its dotted
    location, e.g. ``use_fp4_indexer_cache`` or ``pass_config.fuse_x``), None when none."""
    found = re.search(r"(?m)^(\S[^\n]*)\n[ \t]+Unexpected keyword argument", message)
    return found.group(1).strip() if found else None


def version_gap(message: str, pin: str) -> str | None:
    """Why vLLM ``pin`` refused, when it is a flag or config key it does not have: the recipe
    needs a newer vLLM (as far as that flag or key shows); None for any other refusal.

    + message: vLLM's message (argparse's, or pydantic's)
    + pin: the vLLM version that refused, e.g. ``0.30.0``
    """
    words = message.split()
    if message.startswith("unrecognized arguments: ") and words[2].startswith("-"):
        what = f"flag {words[2].split('=', 1)[0]}"
    elif (key := unknown_key(message)) is not None:
        what = f"key {key} of {flag_of(message)}"
    else:
        return None
    return f"the recipe needs a newer vLLM than the pin {pin} ({what} is not in it)"


def refusal(unit: str, message: str, pin: str) -> dict[str, Any]:
    """The result line of a refused instance.

    + unit: the instance's unit
    + message: vLLM's message, as it printed it
    + pin: the vLLM version that refused
    """
    flag, text = flag_of(message), one_line(message)
    return {
        "unit": unit,
        "ok": False,
        "flag": flag,
        "key": unknown_key(message),
        "message": text,
        "line": f"{unit}: {flag}: {text}",
        "gap": version_gap(message, pin),
    }


# ---------------------------------------------------------------------------------------------
# The child: vLLM's parser, in the instance's environment and directory


def serve_args(argv: list[str]) -> list[str]:
    """The arguments after ``vllm serve`` in a command line (``.../vllm serve ...``)."""
    items = list(argv)
    if items and os.path.basename(items[0]) == "vllm":
        items = items[1:]
    if items[:1] != ["serve"]:
        raise BadInput(f"argv {argv!r} is not a vllm serve command line (.../vllm serve ...)")
    return items[1:]


def _pin() -> str:
    """The running vLLM's version, without its local part (``0.30.0+cpu``: ``0.30.0``)."""
    import importlib.metadata

    try:
        version = importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        import vllm

        version = str(getattr(vllm, "__version__", "?"))
    return version.split("+", 1)[0]


class Unsupported(Exception):
    """The installed vLLM lacks a name its ``vllm serve`` entry point had when this program was
    written (vLLM 0.30.0): the pre-flight cannot check, so it refuses, naming what is missing."""


def _named(owner: Any, name: str, where: str) -> Any:
    """``owner.name``, or Unsupported naming ``where.name``."""
    try:
        return getattr(owner, name)
    except AttributeError:
        raise Unsupported(f"{where} has no {name}") from None


class ServeCli:
    """``vllm serve`` as the installed vLLM's ``vllm/entrypoints/cli/main.py`` builds it: a
    ``vllm`` parser with ``--version`` and subcommands, the ``serve`` subcommand of
    ``vllm.entrypoints.cli.serve`` (its ``cmd_init``, ``subparser_init``, ``validate``), and
    what serving runs before the engine, found through the names that module itself imports:
    ``setup_server``'s module's ``validate_api_server_args``, and the ``ToolParserManager`` and
    ``ReasoningParserManager`` that function consults. No module path is guessed: a name the
    installed vLLM moved raises :class:`Unsupported`."""

    SERVE_MODULE = "vllm.entrypoints.cli.serve"  # one of main.py's CMD_MODULES since vLLM 0.8

    def __init__(self) -> None:
        import importlib

        try:
            serve = importlib.import_module(self.SERVE_MODULE)
        except ModuleNotFoundError as exc:
            raise Unsupported(f"no module {self.SERVE_MODULE} ({exc})") from None
        where = self.SERVE_MODULE
        parser_class = _named(serve, "FlexibleArgumentParser", where)
        setup_server = _named(serve, "setup_server", where)
        launcher = sys.modules.get(getattr(setup_server, "__module__", ""), None)
        self.validate_api_server_args = _named(
            launcher, "validate_api_server_args", f"{where}.setup_server's module"
        )
        # the registries validate_api_server_args consults (its module's own imports)
        self.tools = _named(launcher, "ToolParserManager", "validate_api_server_args' module")
        self.reasoning = _named(launcher, "ReasoningParserManager", "the same module")
        self.top = parser_class(description="vLLM CLI")
        self.top.add_argument("-v", "--version", action="version", version=_pin())
        subparsers = self.top.add_subparsers(required=False, dest="subparser")
        self.cmds = {}
        for cmd in _named(serve, "cmd_init", where)():
            cmd.subparser_init(subparsers).set_defaults(dispatch_function=cmd.cmd)
            self.cmds[cmd.name] = cmd
        if "serve" not in self.cmds:
            raise Unsupported(f"{where}.cmd_init() gives no serve subcommand")

    def check(self, argv: list[str]) -> None:
        """Raise what ``vllm serve argv`` dies of before it loads a model: argparse's exit (also
        for ``--help``: no server starts), the subcommand's ``validate``, the API server's
        ``validate_api_server_args`` (after its plugin imports, as ``setup_server`` runs them;
        not for ``--headless`` or ``--grpc``, which start no API server), and the engine's
        lookup of ``--reasoning-parser`` (``ReasoningParserManager.get_reasoning_parser``)."""
        args = self.top.parse_args(["serve", *argv])
        self.cmds[args.subparser].validate(args)
        if getattr(args, "headless", False) or getattr(args, "grpc", False):
            return
        for plugin, manager, load in (
            ("tool_parser_plugin", self.tools, "import_tool_parser"),
            ("reasoning_parser_plugin", self.reasoning, "import_reasoning_parser"),
        ):
            path = getattr(args, plugin, None)
            if path and len(path) > 3:
                getattr(manager, load)(path)
        self.validate_api_server_args(args)
        name = getattr(args, "reasoning_parser", None)
        if name:
            try:
                self.reasoning.get_reasoning_parser(name)
            except Exception as exc:  # unknown (KeyError), or its module does not import
                raise EngineStartError(f"{type(exc).__name__}: {exc}") from None


class EngineStartError(Exception):
    """What the engine dies of at start, after the server's checks (vLLM's message)."""


def _argparse_message(stderr: str, code: Any) -> str:
    """argparse's error message (after ``PROG: error: ``) from what the parser printed."""
    at = stderr.find(": error: ")
    if at >= 0:
        return stderr[at + len(": error: ") :].rstrip("\n")
    return stderr.strip() or f"vllm serve exits at once (status {code}) with these arguments"


def check_argvs(argvs: list[list[str]]) -> list[str | None]:
    """vLLM's message refusing each command line, None when it passes."""
    cli = ServeCli()
    out: list[str | None] = []
    for argv in argvs:
        err = io.StringIO()
        message: str | None = None
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            try:
                cli.check(argv)
            except SystemExit as exc:  # argparse's error (or --help/--version: no server)
                message = _argparse_message(err.getvalue(), exc.code)
            except EngineStartError as exc:
                message = f"at engine start: {exc}"
            except Exception as exc:  # what vllm serve would die of, traceback's last line
                message = f"{type(exc).__name__}: {exc}"
        out.append(message)
    return out


def child(results_file: str) -> int:
    """``--child``: check the argvs on stdin, write ``{"pin", "messages"}`` to results_file."""
    argvs = json.load(sys.stdin)
    try:
        doc: dict[str, Any] = {"pin": _pin(), "messages": check_argvs(argvs)}
    except Unsupported as exc:  # a vLLM whose entry point moved: say which and what, never pass
        doc = {"error": f"cannot check with vLLM {_pin()}: {exc} (the pre-flight follows "
               "vllm serve's entry point as vLLM 0.30.0 has it)"}  # fmt: skip
    except Exception as exc:  # vLLM does not import, or its parser cannot be built
        doc = {"error": f"cannot build vLLM's parser: {type(exc).__name__}: {exc}"}
    with open(results_file, "w") as fh:
        json.dump(doc, fh)
    return 0


# ---------------------------------------------------------------------------------------------
# The parent: read the instances, one child per environment and directory, the result lines


def load_instances(text: str) -> list[dict[str, Any]]:
    """The instances of the JSON input, checked: BadInput names what is wrong."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise BadInput(f"instances are not JSON: {exc}") from None
    if not isinstance(data, list):
        raise BadInput(f"instances must be a JSON list, not {type(data).__name__}")
    out = []
    for i, item in enumerate(data):
        if not isinstance(item, dict) or not {"unit", "argv", "env"} <= set(item) <= {
            "unit",
            "argv",
            "env",
            "cwd",
        }:
            raise BadInput(f"instance {i} must be an object of unit, argv, env and optional cwd")
        unit, argv, env, cwd = item["unit"], item["argv"], item["env"], item.get("cwd", DEFAULT_CWD)
        if not isinstance(unit, str) or not unit or any(c in unit for c in "\n\r\0"):
            raise BadInput(f"instance {i}: unit must be a one-line name, not {unit!r}")
        if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
            raise BadInput(f"instance {i} ({unit}): argv must be a list of strings")
        if not isinstance(env, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and k and "=" not in k for k, v in env.items()
        ):
            raise BadInput(f"instance {i} ({unit}): env must map names to strings")
        if any("\0" in s for s in [*argv, *env, *env.values()]):
            raise BadInput(f"instance {i} ({unit}): argv and env may not hold NUL bytes")
        if not isinstance(cwd, str) or not cwd.startswith("/") or "\0" in cwd:
            raise BadInput(f"instance {i} ({unit}): cwd must be an absolute path")
        out.append({"unit": unit, "args": serve_args(argv), "env": env, "cwd": cwd})
    return out


def child_env(env: dict[str, str]) -> dict[str, str]:
    """A unit's environment: systemd's few variables (PATH its default), then its own."""
    base = {k: os.environ[k] for k in BASE_ENV if k in os.environ}
    base.setdefault("PATH", SYSTEMD_PATH)
    return {**base, **env}


def run_child(argvs: list[list[str]], env: dict[str, str], cwd: str) -> dict[str, Any]:
    """One child of this python over ``argvs``: its results, or ``{"error"}``."""
    with tempfile.TemporaryDirectory(prefix="servefleet-preflight-") as tmp:
        results = os.path.join(tmp, "results.json")
        try:
            proc = subprocess.run(
                [sys.executable, os.path.abspath(__file__), CHILD, results],
                input=json.dumps(argvs),
                capture_output=True,
                text=True,
                env=child_env(env),
                cwd=cwd,
                timeout=CHILD_TIMEOUT,
            )
        except subprocess.TimeoutExpired:
            return {"error": f"vLLM's parser gave no answer within {CHILD_TIMEOUT} s"}
        except OSError as exc:
            return {"error": f"cannot run {sys.executable} in {cwd}: {exc.strerror}"}
        try:
            with open(results) as fh:
                doc: dict[str, Any] = json.load(fh)
        except (OSError, ValueError):
            tail = (proc.stderr.strip() or proc.stdout.strip()).splitlines()[-1:] or ["no output"]
            return {"error": f"vLLM's parser died (status {proc.returncode}): {tail[0]}"}
    return doc


def preflight(instances: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The result of each instance, in order (children run side by side)."""
    groups: dict[tuple[str, str], list[int]] = {}
    for i, inst in enumerate(instances):
        key = (json.dumps(inst["env"], sort_keys=True), inst["cwd"])
        groups.setdefault(key, []).append(i)
    workers = max(1, min(len(groups), os.cpu_count() or 1))
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {
            key: pool.submit(
                run_child,
                [instances[i]["args"] for i in members],
                instances[members[0]]["env"],
                instances[members[0]]["cwd"],
            )
            for key, members in groups.items()
        }
    out: list[dict[str, Any]] = [{} for _ in instances]
    for key, members in groups.items():
        doc = futures[key].result()
        for n, i in enumerate(members):
            unit = instances[i]["unit"]
            if "error" in doc:
                text = one_line(str(doc["error"]))
                result = {"unit": unit, "ok": False, "flag": "vllm", "key": None}
                result.update(message=text, line=f"{unit}: vllm: {text}", gap=None)
            elif doc["messages"][n] is None:
                result = {"unit": unit, "ok": True}
            else:
                result = refusal(unit, doc["messages"][n], str(doc["pin"]))
            out[i] = result
    return out


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[1] == CHILD:
        return child(argv[2])
    if len(argv) != 2:
        print("usage: preflight.py INSTANCES_JSON (or - to read it from stdin)", file=sys.stderr)
        return 2
    try:
        instances = load_instances(sys.stdin.read() if argv[1] == "-" else argv[1])
    except BadInput as exc:
        print(f"preflight: {exc}", file=sys.stderr)
        return 2
    results = preflight(instances)
    for result in results:
        print(json.dumps(result, sort_keys=True))
    refused = [r for r in results if not r["ok"]]
    if refused:  # one line for the operator (the JSON lines above say it all)
        first = refused[0]
        more = f" (and {len(refused) - 1} more instance(s))" if len(refused) > 1 else ""
        gap = f"; {first['gap']}" if first.get("gap") else ""
        print(f"servefleet: pre-flight: {first['line']}{gap}{more}", file=sys.stderr)
    return 0 if not refused else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
