"""The uv binary releases are installed with: the one inside the controller's own ``uv`` Python
package, shipped to each host by the deploy (hosts need no uv package), named by its version."""

from __future__ import annotations

import functools
import importlib.metadata
from pathlib import Path


@functools.lru_cache(maxsize=1)
def uv_version() -> str:
    """The version of the controller's uv."""
    return importlib.metadata.version("uv")


def uv_binary() -> Path:
    """The uv executable on the controller."""
    from uv import find_uv_bin

    return Path(find_uv_bin())


def host_uv(root: str) -> str:
    """Where a host keeps that uv: ``<serve_root>/lib/uv-<version>``.

    + root: serve_root
    """
    return f"{root}/lib/uv-{uv_version()}"


def last_error(text: str) -> str:
    """uv's reason for a failure, in one line (its ``error:``/``cause:`` lines).

    + text: uv's stderr
    """
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith(("error:", "×", "Caused by", "cause:"))]
    return " ".join((errors or lines[-1:] or ["no output"])[:3])
