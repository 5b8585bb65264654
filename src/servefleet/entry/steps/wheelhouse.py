"""``sdk_source = "wheelhouse"``: which wheelhouse files this run's steps need and the host
lacks (one more read of the host), and their copy (``servefleet.release.wheelhouse``)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable

from pyinfra import host

from servefleet.base.errors import ProbeError
from servefleet.base.remote.layout import WHEELHOUSE
from servefleet.entry.steps.facts import WheelhouseFiles
from servefleet.entry.steps.operations import wheelhouse_copy
from servefleet.hostplan.plan import wheelhouse_copies
from servefleet.hostplan.types import HostPlan


def with_wheelhouse(plan: HostPlan) -> HostPlan:
    """The plan with the files this run needs, and which of them the host lacks (read only when
    some step needs a file).

    Raises ProbeError (this host fails alone, one line) when the host's check gives no answer:
    ``remote/have_files.py`` failed (pyinfra has shown its output) or printed nothing.
    """
    copies = wheelhouse_copies(plan)
    if not copies:
        return plan
    wanted = json.dumps({c.dest: c.sha256 for c in copies}, sort_keys=True)
    held = host.get_fact(WheelhouseFiles, files=wanted)
    if held is None:
        raise ProbeError(
            "wheelhouse files: no answer (remote/have_files.py failed or printed nothing)"
        )
    have = set(held)
    missing = frozenset(c.dest for c in copies if c.dest not in have)
    return dataclasses.replace(plan, wheelhouse=tuple(copies), wheelhouse_missing=missing)


def copy(plan: HostPlan, kinds: Iterable[str]) -> None:
    """Copy the wheelhouse files that these steps need and the host lacks (a re-run: none)."""
    todo = [c for c in plan.wheelhouse if c.kind in kinds and c.dest in plan.wheelhouse_missing]
    if todo:
        size = sum(c.size for c in todo)
        wheelhouse_copy(
            name=f"Copy {len(todo)} wheelhouse file(s) ({size} bytes) to "
            f"{plan.settings.serve_root}/{WHEELHOUSE}, each checked by sha256",
            copies=todo,
        )
