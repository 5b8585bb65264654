"""vLLM's ``vllm.entrypoints.cli.main``: the ``vllm`` command's parser built as vLLM 0.30.0
builds it (a ``vllm`` parser with ``--version`` and subcommands, each subcommand's parser from
its ``subparser_init``, ``validate`` after the parse, then its ``cmd``); only ``serve`` is
simulated. The console script ``vllm`` (:func:`vllm.sim.main`) runs ``vllm serve`` through
these objects. A SIMULATION for the servefleet lab."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ...common import VERSION
from . import serve

_CMD_MODULES = [serve]  # vLLM's main() lists six; only serve is simulated


def _build() -> tuple[argparse.ArgumentParser, dict[str, Any]]:
    """The ``vllm`` parser and its subcommands by name, as ``main()`` builds them (it imports
    ``FlexibleArgumentParser`` when it runs, as vLLM's ``main()`` does)."""
    from ...utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(
        description="vLLM CLI",
        epilog=serve.VLLM_SUBCMD_PARSER_EPILOG.format(subcmd="[subcommand]"),
    )
    parser.add_argument("-v", "--version", action="version", version=VERSION)
    subparsers = parser.add_subparsers(required=False, dest="subparser")
    cmds: dict[str, Any] = {}
    for cmd_module in _CMD_MODULES:
        for cmd in cmd_module.cmd_init():
            cmd.subparser_init(subparsers).set_defaults(dispatch_function=cmd.cmd)
            cmds[cmd.name] = cmd
    return parser, cmds


def main() -> Any:
    """``vllm ARGS`` (``sys.argv``): parse, the subcommand's ``validate``, then its ``cmd``
    (vLLM's exceptions propagate, as they do from vLLM's ``main``)."""
    parser, cmds = _build()
    args = parser.parse_args(sys.argv[1:])
    if args.subparser in cmds:
        cmds[args.subparser].validate(args)
    if hasattr(args, "dispatch_function"):
        return args.dispatch_function(args)
    parser.print_help()
    return None


if __name__ == "__main__":
    sys.exit(main())
