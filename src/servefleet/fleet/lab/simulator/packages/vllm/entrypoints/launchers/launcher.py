"""vLLM's ``vllm.entrypoints.launchers.launcher``: what the API server checks in
``setup_server``, after the parse and before the engine (``validate_api_server_args``: the
tool-call and reasoning parser names against the registries). A SIMULATION for the servefleet
lab."""

from __future__ import annotations

import argparse
from typing import Any

from ...common import VERSION, _log
from ...reasoning import ReasoningParserManager
from ...tool_parsers import ToolParserManager

__all__ = [
    "ReasoningParserManager",
    "ToolParserManager",
    "setup_server",
    "validate_api_server_args",
]


def _field(config: Any, name: str) -> Any:
    """A field of a parsed config argument: the simulator keeps the JSON object (a dict, or
    None when the flag is not given: the class's default, whose string fields are empty)."""
    if isinstance(config, dict):
        return config.get(name)
    return getattr(config, name, None)


def validate_api_server_args(args: argparse.Namespace) -> None:
    """vLLM's ``validate_api_server_args``: with ``--enable-auto-tool-choice`` the tool-call
    parser must be registered, and a reasoning parser named in ``--structured-outputs-config``
    too (``--reasoning-parser`` reaches that config only when the engine's config is built, so
    it is not checked here). Raises KeyError as vLLM does."""
    valid_tool_parsers = ToolParserManager.list_registered()
    if args.enable_auto_tool_choice and args.tool_call_parser not in valid_tool_parsers:
        raise KeyError(
            f"invalid tool call parser: {args.tool_call_parser} "
            f"(chose from {{ {','.join(valid_tool_parsers)} }})"
        )
    valid_reasoning_parsers = ReasoningParserManager.list_registered()
    reasoning_parser = _field(args.structured_outputs_config, "reasoning_parser")
    if reasoning_parser and reasoning_parser not in valid_reasoning_parsers:
        raise KeyError(
            f"invalid reasoning parser: {reasoning_parser} "
            f"(chose from {{ {','.join(valid_reasoning_parsers)} }})"
        )


def setup_server(args: argparse.Namespace, *, reuse_port: bool = False) -> tuple[str, None]:
    """vLLM's ``setup_server``: log the version and the arguments, import the parser plugins,
    :func:`validate_api_server_args`; returns the listen address (the simulated server binds
    its socket itself, so none is returned)."""
    _log(f"vLLM API server version {VERSION} (simulated for the servefleet lab)")
    _log(f"non-default args: model={args.model!r} port={args.port} host={args.host!r}")
    if args.tool_parser_plugin and len(args.tool_parser_plugin) > 3:
        ToolParserManager.import_tool_parser(args.tool_parser_plugin)
    if args.reasoning_parser_plugin and len(args.reasoning_parser_plugin) > 3:
        ReasoningParserManager.import_reasoning_parser(args.reasoning_parser_plugin)
    validate_api_server_args(args)
    if args.uds:
        return f"unix:{args.uds}", None
    host = args.host or "0.0.0.0"
    scheme = "https" if args.ssl_keyfile and args.ssl_certfile else "http"
    return f"{scheme}://{host}:{args.port}", None
