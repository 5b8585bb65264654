"""vLLM's ``vllm.entrypoints.cli.serve``: the ``serve`` subcommand, by the names vLLM 0.30.0
gives it (``ServeSubcommand``, ``cmd_init``) and the names it imports (``make_arg_parser`` and
``validate_parsed_serve_args`` from ``vllm.entrypoints.launchers.cli_args``, ``setup_server``
from ``vllm.entrypoints.launchers.launcher``, ``FlexibleArgumentParser``,
``ReasoningParserManager``). Its ``cmd`` runs the simulated server (:func:`vllm.sim.start`).
A SIMULATION for the servefleet lab."""

from __future__ import annotations

import argparse
import os
from typing import Any

from ...reasoning import ReasoningParserManager
from ...utils.argparse_utils import FlexibleArgumentParser
from ..launchers.cli_args import make_arg_parser, validate_parsed_serve_args
from ..launchers.launcher import setup_server
from .types import CLISubcommand

__all__ = [
    "FlexibleArgumentParser",
    "ReasoningParserManager",
    "ServeSubcommand",
    "cmd_init",
    "make_arg_parser",
    "setup_server",
    "validate_parsed_serve_args",
]

DESCRIPTION = """Launch a local OpenAI-compatible API server to serve LLM
completions via HTTP. Defaults to Qwen/Qwen3-0.6B if no model is specified.

Search by using: `--help=<ConfigGroup>` to explore options by section (e.g.,
--help=ModelConfig, --help=Frontend)
  Use `--help=all` to show all available flags at once.
"""
VLLM_SUBCMD_PARSER_EPILOG = (
    "For full list:            vllm {subcmd} --help=all\n"
    "For a section:            vllm {subcmd} --help=ModelConfig    (case-insensitive)\n"
    "For a flag:               vllm {subcmd} --help=max-model-len  (_ or - accepted)\n"
    "Documentation:            https://docs.vllm.ai\n"
)


class ServeSubcommand(CLISubcommand):
    """The ``serve`` subcommand for the vLLM CLI."""

    name = "serve"

    @staticmethod
    def cmd(args: argparse.Namespace) -> int:
        """Serve (the simulated server): the positional model wins over ``--model``, the
        platform fills in what it defaults, then :func:`vllm.sim.start`."""
        from ...flag_table import PLATFORM_DEFAULTS
        from ...serve_args import platform_of
        from ...sim import start

        if getattr(args, "model_tag", None) is not None:
            args.model = args.model_tag
        env = dict(os.environ)
        platform = platform_of(env)
        for dest, value in PLATFORM_DEFAULTS[platform].items():
            if getattr(args, dest) is None:
                setattr(args, dest, value)
        return start(args, env, platform)

    def validate(self, args: argparse.Namespace) -> None:
        validate_parsed_serve_args(args)

    def subparser_init(self, subparsers: Any) -> argparse.ArgumentParser:
        serve_parser = subparsers.add_parser(
            self.name,
            help="Launch a local OpenAI-compatible API server to serve LLM completions via HTTP.",
            description=DESCRIPTION,
            usage="vllm serve [model_tag] [options]",
        )
        serve_parser = make_arg_parser(serve_parser)
        serve_parser.epilog = VLLM_SUBCMD_PARSER_EPILOG.format(subcmd=self.name)
        return serve_parser


def cmd_init() -> list[CLISubcommand]:
    return [ServeSubcommand()]
