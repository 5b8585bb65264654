"""Errors, each one line: bad data or recipe stops the run before any host changes (a
PyinfraError), and a host that must not serve the recipe, whose probe output cannot be read, or
whose plan meets an error servefleet did not expect (a bug) fails alone (a failing command),
the other hosts go on."""

from __future__ import annotations

import shlex
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pyinfra import host
from pyinfra.api.exceptions import PyinfraError
from pyinfra.operations import server

from servefleet.base.errors import ProbeError, RecipeError, ServefleetError
from servefleet.hostplan.types import HostPlan

_OURS = Path(__file__).resolve().parents[2]  # the servefleet package: "our code"


@contextmanager
def one_line(recipe: bool = True) -> Iterator[None]:
    """servefleet's errors as one PyinfraError naming this host (the run stops before any
    change), a RecipeError naming the data keys of the recipe. A ProbeError (this host's
    output) passes through: it fails this host alone (:func:`fail_host`).

    + recipe: name serve_recipe/serve_selection for a RecipeError
    """
    try:
        yield
    except ProbeError:
        raise
    except RecipeError as e:
        if not recipe:
            raise PyinfraError(f"servefleet: {host.name}: {e}") from None
        raise PyinfraError(f"servefleet: {host.name}: serve_recipe/serve_selection: {e}") from None
    except ServefleetError as e:
        raise PyinfraError(f"servefleet: {host.name}: {e}") from None


def unexpected(exc: BaseException) -> str:
    """One line for an exception servefleet did not expect: that it is a bug, its type, the
    innermost frame of servefleet's own code it passed, and its message (no traceback).

    + exc: the exception
    """
    frames = traceback.extract_tb(exc.__traceback__)
    ours = [f for f in frames if Path(f.filename).resolve().is_relative_to(_OURS)] or frames
    where = ""
    if ours:
        frame = ours[-1]
        path = Path(frame.filename).resolve()
        shown = path.relative_to(_OURS.parent) if path.is_relative_to(_OURS) else path
        where = f" at {shown}:{frame.lineno} in {frame.name}"
    text = " ".join(str(exc).split())
    text = text if len(text) <= 200 else text[:197] + "..."
    return f"unexpected {type(exc).__name__}{where} (a bug in servefleet; please report it)" + (
        f": {text}" if text else ""
    )


def fail_host(message: str, name: str = "Plan this host") -> None:
    """Fail this host alone, before any change: one failing command prints
    ``servefleet: <host>: <message>``; the other hosts go on.

    + message: what is wrong, one line
    + name: the operation's name
    """
    line = f"servefleet: {host.name}: {' '.join(message.splitlines())}"
    # printf, not echo: a shell's echo may read the backslashes of a repr'd value as escapes
    server.shell(name=name, commands=[f"printf '%s\\n' {shlex.quote(line)} >&2; exit 1"])


def refused(plan: HostPlan) -> bool:
    """Fail this host, before anything is installed, when it must not serve this recipe."""
    if plan.refusal is None:
        return False
    fail_host(plan.refusal, name="Check the host's accelerators")
    return True
