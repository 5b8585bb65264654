"""A host is converged (``hostplan/types.py`` ``HostPlan.converged``, each instance's
``converged`` and ``written`` from ``hostplan/plan.py``) only when every input the plan compares
is current: one test per field, both ways. Each starts from the probe of a host the default
data converged (``host_inputs.converged_probe``: converged) and makes one field stale (not
converged, and the other fields as they were); the first test holds the other direction, the
probe with every field current. The API key file is
``test_key_file_converged.py``'s (it needs a key in the data). Issue #52 item 4: each term of
``converged`` deleted alone from a copy of the module (``running`` sha, ``key_current``,
``older_than_release``, ``after_good``, ``reinstalled`` in ``plan.py``; ``warm``,
``stale_units``, ``reload_needed``, ``good_shas``, ``good_release``, ``router_stale`` in
``types.py``), this file fails."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import pytest
from host_inputs import SMI, converged_probe, probe, probed_units, settings

from servefleet.hostplan.plan import plan_host
from servefleet.hostplan.types import HostPlan

FIRST = "servefleet-vllm-0.service"


def _plan(change: Callable[[dict[str, Any]], None] | None = None) -> HostPlan:
    p = converged_probe()
    if change:
        change(p)
    return plan_host(settings(), p)


def _unit(**over: Any) -> Callable[[dict[str, Any]], None]:
    def change(p: dict[str, Any]) -> None:
        p["units"][FIRST] = {**p["units"][FIRST], **over}

    return change


def _set(**over: Any) -> Callable[[dict[str, Any]], None]:
    def change(p: dict[str, Any]) -> None:
        p.update(over)

    return change


def test_every_field_current_is_converged() -> None:
    done = _plan()
    assert done.converged
    assert all(i.converged and i.written for i in done.instances)
    assert done.warm and not done.stale_units and not done.reload_needed


# field -> how the probe makes it stale, and which instances are then not converged ("first":
# the first alone, "all", or "none": the host's own fields)
STALE: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "unit active": (_unit(active="failed"), "first"),
    "unit running sha": (_unit(running="0123456789abcdef"), "first"),
    "unit key_current": (_unit(key_current=False), "first"),
    "unit older_than_release": (_unit(older_than_release=True), "first"),
    "unit after_good": (_unit(after_good=True), "first"),
    "unit file written": (_unit(file="0" * 64), "first"),
    "release installed": (_set(releases=[]), "all"),
    "release drift": (lambda p: p.update(release_drift={p["current"]: ["a: changed"]}), "all"),
    "warm": (_set(warm=[]), "none"),
    "cache drift": (
        lambda p: p.update(cache_drift={p["warm"][0]: ["cache: x changed"]}),
        "none",
    ),
    "stale units": (
        lambda p: p["units"].update({"servefleet-vllm-9.service": dict(p["units"][FIRST])}),
        "none",
    ),
    "reload": (_unit(reload=True), "none"),
    "good shas": (lambda p: p.update(good_shas=list(reversed(p["good_shas"]))), "none"),
    "good shas missing": (_set(good_shas=[]), "none"),
    "good release": (_set(good="0" * 16), "none"),
    "no good state": (_set(good=None), "none"),
    "router left": (_set(router={"file": "0" * 64}), "none"),
}


@pytest.mark.parametrize("field", list(STALE))
def test_one_stale_field_is_not_converged(field: str) -> None:
    change, which = STALE[field]
    stale = _plan(change)
    assert not stale.converged, field
    each = [i.converged and i.written for i in stale.instances]
    want = {"first": [False] + [True] * (len(each) - 1), "all": [False] * len(each),
            "none": [True] * len(each)}[which]  # fmt: skip
    assert each == want, field


def _routed(router: Callable[[Any], dict[str, Any]]) -> HostPlan:
    """A host with ``serve_router = "host"`` the data converged, its router as ``router(the
    first plan's router)`` says."""
    s = settings(serve_router="host")
    first = plan_host(s, probe(smi=SMI))
    r = first.router
    assert r is not None
    state = probe(smi=SMI, releases=[first.release.id, r.release.id], current=first.release.id,
                  current_pins=dict(first.release.expect),
                  warm=[first.spec.compile_fingerprint],
                  models=list(first.spec.requirements.models), units=probed_units(first, {}),
                  good=first.release.id, good_shas=[i.sha for i in first.restart_order],
                  router=router(r))  # fmt: skip
    return plan_host(s, state)


def _router(r: Any, workers: list[str] | None, active: str = "active") -> dict[str, Any]:
    return {"active": active, "running": r.sha, "workers": workers,
            "file": hashlib.sha256(r.text.encode()).hexdigest()}  # fmt: skip


def test_a_host_router_that_is_not_current_is_not_converged() -> None:
    """Issue #52: ``(self.router is None or ...)`` dropped from ``converged`` survived
    ``bench/ast_mutation.py``: a host whose router left an instance out of rotation (or does
    not run) counted as converged, and nothing put it back."""
    assert _routed(lambda r: _router(r, list(r.workers))).converged
    for stale in (
        lambda r: _router(r, list(r.workers)[1:]),  # one instance out of rotation
        lambda r: _router(r, None),  # not answering
        lambda r: _router(r, list(r.workers), "failed"),
    ):
        plan = _routed(stale)
        assert all(i.converged and i.written for i in plan.instances)
        assert plan.router is not None and not plan.router.converged
        assert not plan.converged
