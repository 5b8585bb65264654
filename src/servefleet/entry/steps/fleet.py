"""The state of one run's fleet pre-warm (``serve_prewarm_scope = "fleet"``): which hosts take
part, and each one's role (who compiles, who gives its cache, who gets the copy).

Deploy code runs for every host before any operation runs, so hosts join while planning, and
each pre-warm operation asks for its host's role when it runs (``_if``), once every host is
known: see :func:`servefleet.release.prewarm_store.prewarm_roles`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pyinfra import host

from servefleet.entry.steps.lib import per_run
from servefleet.hostplan.types import HostPlan
from servefleet.release.prewarm_store import Store, WarmEntry, prewarm_roles


def warm_entry(plan: HostPlan) -> WarmEntry:
    """This host as fleet pre-warm sees it."""
    s, fingerprint = plan.settings, plan.spec.compile_fingerprint
    fleet = s.serve_prewarm_scope == "fleet" and bool(fingerprint)
    return WarmEntry(
        host=host.name,
        fingerprint=fingerprint,
        fleet=fleet,
        warm=plan.warm,
        kept=fleet and Store(s.serve_prewarm_store).has(fingerprint or ""),
        builder=plan.builder,
    )


@dataclass
class FleetPrewarm:
    """The hosts of one pyinfra run that take part in a fleet pre-warm.

    + order: the run's hosts, in inventory order (who comes first compiles)
    """

    order: list[str]
    entries: dict[str, WarmEntry] = field(default_factory=dict)
    roles: dict[str, str] | None = None  # decided once, when the first operation asks

    @classmethod
    def of_run(cls, state: Any) -> FleetPrewarm:
        """The fleet pre-warm of the run ``state`` (pyinfra's State), made on first use."""
        return per_run(state, cls, cls)

    def join(self, entry: WarmEntry) -> None:
        self.entries[entry.host] = entry

    def role(self, name: str) -> str | None:
        if self.roles is None:
            self.roles = prewarm_roles([self.entries[h] for h in self.order if h in self.entries])
        return self.roles.get(name)

    def role_is(self, name: str, *wanted: str) -> Callable[[], bool]:
        """An ``_if`` for host ``name``: true when, at run time, its role is one of ``wanted``."""
        return lambda: self.role(name) in wanted
