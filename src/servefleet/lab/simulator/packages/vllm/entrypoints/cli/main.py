"""vLLM's ``vllm.entrypoints.cli.main``: the ``vllm`` command's parser built as vLLM 0.30.0
builds it (a ``vllm`` parser with ``--version`` and subcommands, each subcommand's parser from
its ``subparser_init``, ``validate`` after the parse, then its ``cmd``); only ``serve`` is
simulated. The console script ``vllm`` (:func:`vllm.sim.main`) runs ``vllm serve`` through
these objects. A SIMULATION for the servefleet lab."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from ...common import VERSION
from ...utils.argparse_utils import FlexibleArgumentParser
from . import serve

CMD_MODULES = [serve]


def build() -> tuple[argparse.ArgumentParser, dict[str, Any]]:
    """The ``vllm`` parser and its subcommands by name, as ``main()`` builds them."""
    parser = FlexibleArgumentParser(
        description="vLLM CLI",
        epilog=serve.VLLM_SUBCMD_PARSER_EPILOG.format(subcmd="[subcommand]"),
    )
    parser.add_argument("-v", "--version", action="version", version=VERSION)
    subparsers = parser.add_subparsers(required=False, dest="subparser")
    cmds: dict[str, Any] = {}
    for cmd_module in CMD_MODULES:
        for cmd in cmd_module.cmd_init():
            cmd.subparser_init(subparsers).set_defaults(dispatch_function=cmd.cmd)
            cmds[cmd.name] = cmd
    return parser, cmds


def main(argv: Sequence[str] | None = None) -> Any:
    """``vllm ARGS``: parse, the subcommand's ``validate``, then its ``cmd`` (vLLM's
    exceptions propagate, as they do from vLLM's ``main``)."""
    parser, cmds = build()
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.subparser in cmds:
        cmds[args.subparser].validate(args)
    if hasattr(args, "dispatch_function"):
        return args.dispatch_function(args)
    parser.print_help()
    return None


if __name__ == "__main__":
    sys.exit(main())
