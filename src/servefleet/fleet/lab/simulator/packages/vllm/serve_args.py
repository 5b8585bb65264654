"""What ``vllm serve`` runs before it loads a model, behind vLLM's own names: the parser
(``make_arg_parser``, on the host's platform), ``validate_parsed_serve_args`` with its chat
template check, and the config classes vLLM builds from JSON arguments at engine start. The
façade modules (``vllm.entrypoints.launchers.cli_args``, ``vllm.entrypoints.chat_utils``,
``vllm.utils.argparse_utils``) import these, so a program written for the real vLLM runs
unchanged here; ``vllm serve`` itself (:mod:`vllm.sim`) uses the same ones. A SIMULATION for
the servefleet lab."""

from __future__ import annotations

import argparse
import functools
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .common import BUILD, FLAGS_DIR, sim_platform
from .config_schemas import check_config, config_classes
from .exceptions import VLLMValidationError
from .flag_table import add_serve_args, flag_table

CHAT_TEMPLATES_FILE = "vllm-0.30.0-chat-templates.txt"
# Where the wheel keeps its chat templates (vllm/transformers_utils/chat_templates); the
# simulated wheel lists them (flags/) instead of shipping them
CHAT_TEMPLATES_DIR = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "transformers_utils", "chat_templates"
)
JINJA_CHARS = "{}\n"  # vLLM's rule: a template without any of these is a path


def platform_of(env: Mapping[str, str]) -> str:
    """The flag table this build serves with: the CUDA build is upstream vLLM whatever the host
    says; the CPU build asks the host (/etc/rbln-sim/platform).

    + env: the environment (RBLN_SIM_ROOT)
    """
    return "upstream" if BUILD["device"] == "cuda" else sim_platform(env)


def make_arg_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """vLLM's ``make_arg_parser``: ``vllm serve``'s arguments on ``parser``, the current
    platform's (its ``pre_register_and_update`` is in the dump)."""
    return add_serve_args(parser, platform_of(os.environ))


@functools.cache
def shipped_chat_templates() -> frozenset[str]:
    """The file names in the wheel's chat template folder (flags/, one a line)."""
    with open(os.path.join(FLAGS_DIR, CHAT_TEMPLATES_FILE)) as fh:
        return frozenset(line.strip() for line in fh if line.strip())


def _exists(path: str) -> bool:
    """``Path(path).exists()``, the wheel's listed chat templates counted as files."""
    if os.path.exists(path):
        return True
    full = os.path.normpath(os.path.join(os.getcwd(), path))
    inside = os.path.dirname(full) == CHAT_TEMPLATES_DIR
    return inside and os.path.basename(full) in shipped_chat_templates()


def validate_chat_template(chat_template: Path | str | None) -> None:
    """vLLM's ``validate_chat_template``: a template string without ``{``, ``}`` or a newline is
    a path, which must exist as given (from the current directory) or in the wheel's chat
    template folder. Raises as vLLM does (``VLLMValidationError``, FileNotFoundError for a
    missing Path)."""
    if chat_template is None:
        return
    if isinstance(chat_template, Path):
        if not _exists(str(chat_template)):
            raise FileNotFoundError("the supplied chat template path doesn't exist")
    elif isinstance(chat_template, str):
        path_like = not any(c in chat_template for c in JINJA_CHARS)
        if path_like and not _exists(chat_template):
            builtin = os.path.join(CHAT_TEMPLATES_DIR, chat_template)
            if not _exists(builtin):
                raise VLLMValidationError(
                    f"The supplied chat template string ({chat_template}) appears path-like, "
                    f"but doesn't exist! Tried: {chat_template} and {builtin}",
                    parameter="chat_template",
                )
    else:
        raise VLLMValidationError(
            f"{type(chat_template)} is not a valid chat template type", parameter="chat_template"
        )


def validate_parsed_serve_args(args: argparse.Namespace) -> None:
    """vLLM's ``validate_parsed_serve_args``: the quick checks that raise before a model loads
    (the chat template, flags that need another flag)."""
    if hasattr(args, "subparser") and args.subparser not in ("serve", "launch"):
        return
    validate_chat_template(args.chat_template)
    if args.enable_auto_tool_choice and not args.tool_call_parser:
        raise TypeError("Error: --enable-auto-tool-choice requires --tool-call-parser")
    if args.enable_log_outputs and not args.enable_log_requests:
        raise TypeError("Error: --enable-log-outputs requires --enable-log-requests")
    if getattr(args, "sse_keep_alive_interval", 0) < 0:
        raise ValueError(
            "Error: --sse-keep-alive-interval must be a non-negative integer "
            "(0 disables keep-alive comments)."
        )
    if args.enable_per_request_metrics and args.disable_log_stats:
        raise ValueError(
            "Error: --enable-per-request-metrics requires engine statistics logging; remove "
            "--disable-log-stats to enable per-request metrics."
        )
    if args.data_parallel_multi_port_external_lb:
        validate_multi_port_external_lb_args(args)


def validate_multi_port_external_lb_args(args: argparse.Namespace) -> None:
    """vLLM's ``validate_multi_port_external_lb_args`` (vllm/entrypoints/launchers/
    dp_supervisor.py), its checks of the flags alone; the rank and port range checks that
    follow them are not modelled."""
    mp = "--data-parallel-multi-port-external-lb"
    if getattr(args, "grpc", False):
        raise ValueError(f"Error: {mp} does not support --grpc")
    if args.uds is not None:
        raise ValueError(f"Error: {mp} does not support --uds")
    if bool(args.ssl_keyfile) != bool(args.ssl_certfile):
        raise ValueError("Error: --ssl-keyfile and --ssl-certfile must be provided together")
    if args.api_server_count not in (None, 1):
        raise ValueError(f"Error: {mp} currently requires --api-server-count=1")
    if args.data_parallel_rank is not None:
        raise ValueError(f"Error: {mp} manages child --data-parallel-rank values internally")
    if args.data_parallel_external_lb or args.data_parallel_hybrid_lb:
        raise ValueError(
            f"Error: {mp} cannot be combined with --data-parallel-external-lb or "
            "--data-parallel-hybrid-lb"
        )
    if args.data_parallel_size < 2:
        raise ValueError(f"Error: {mp} requires --data-parallel-size > 1")
    local_size = args.data_parallel_size_local
    if local_size is None or local_size < 2:
        raise ValueError(f"Error: {mp} requires --data-parallel-size-local >= 2")
    if local_size > args.data_parallel_size:
        raise ValueError("Error: --data-parallel-size-local cannot exceed --data-parallel-size")
    if args.data_parallel_size % local_size != 0:
        raise ValueError(
            "Error: --data-parallel-size must be divisible by --data-parallel-size-local"
        )


def engine_config_error(args: argparse.Namespace, platform: str) -> str | None:
    """pydantic's message for the first config argument that vLLM parses as plain JSON and
    builds its class from at engine start (``--watermark-config``, ``--diffusion-config``:
    schemas in the dumps; ``--speculative-config`` has none), None when they pass.

    + args: the parsed arguments
    + platform: ``rbln`` or ``upstream``
    """
    plain = {e["flags"][0]: e["dest"] for e in flag_table(platform) if "loads" in str(e["type"])}
    for flag in config_classes(platform):
        value: Any = getattr(args, plain.get(flag, ""), None)
        if isinstance(value, dict):
            message = check_config(flag, value, platform, json_input=False)
            if message is not None:
                return message
    return None
