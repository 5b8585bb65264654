"""Errors, each one line: bad data or recipe stops the run before any host changes (a
PyinfraError), and a host that must not serve the recipe fails alone (a failing command)."""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from contextlib import contextmanager

from pyinfra import host
from pyinfra.api.exceptions import PyinfraError
from pyinfra.operations import server

from servefleet.errors import RecipeError, ServefleetError
from servefleet.hostplan import HostPlan


@contextmanager
def one_line(recipe: bool = True) -> Iterator[None]:
    """servefleet's errors as one PyinfraError naming this host (the run stops before any
    change), a RecipeError naming the data keys of the recipe.

    + recipe: name serve_recipe/serve_selection for a RecipeError
    """
    try:
        yield
    except RecipeError as e:
        if not recipe:
            raise PyinfraError(f"servefleet: {host.name}: {e}") from None
        raise PyinfraError(f"servefleet: {host.name}: serve_recipe/serve_selection: {e}") from None
    except ServefleetError as e:
        raise PyinfraError(f"servefleet: {host.name}: {e}") from None


def refused(plan: HostPlan) -> bool:
    """Fail this host, before anything is installed, when it must not serve this recipe."""
    if plan.refusal is None:
        return False
    message = f"servefleet: {host.name}: {plan.refusal}"
    server.shell(
        name="Check the host's accelerators", commands=[f"echo {shlex.quote(message)} >&2; exit 1"]
    )
    return True
