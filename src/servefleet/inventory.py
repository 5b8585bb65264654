"""Reading an operator's inventory file on the controller (``lock``, ``rollout``): whatever the
file raises (a NameError, ``SystemExit('the lab is not up')``, a syntax error) becomes one line
naming the file, never a traceback."""

from __future__ import annotations

from typing import Any

from servefleet.errors import ServefleetError


def inventory_error(path: str, e: BaseException) -> ServefleetError:
    """One line for an exception an inventory file raised while it was read.

    + path: the inventory file
    + e: what reading it raised (pyinfra wraps the file's own exception)
    """
    if isinstance(e, SystemExit):
        return ServefleetError(str(e.code))
    inner: Any = getattr(e, "exception", None) or e  # pyinfra's UnexpectedExternalError
    try:
        said = str(inner)
    except Exception:  # noqa: BLE001 (an exception whose str() fails: name its type)
        said = ""
    said = " ".join(said.split()) or type(inner).__name__
    return ServefleetError(f"{path}: cannot read the inventory: {type(inner).__name__}: {said}")
