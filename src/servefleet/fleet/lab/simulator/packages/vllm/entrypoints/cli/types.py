"""vLLM's ``vllm.entrypoints.cli.types``: the base class of the ``vllm`` command's
subcommands. A SIMULATION for the servefleet lab."""

from __future__ import annotations

import argparse
from typing import Any


class CLISubcommand:
    """Base class for CLI argument handlers."""

    name: str

    @staticmethod
    def cmd(args: argparse.Namespace) -> Any:
        raise NotImplementedError("Subclasses should implement this method")

    def validate(self, args: argparse.Namespace) -> None:
        pass  # no validation by default

    def subparser_init(self, subparsers: Any) -> argparse.ArgumentParser:
        raise NotImplementedError("Subclasses should implement this method")
