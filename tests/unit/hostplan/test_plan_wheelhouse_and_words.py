"""Two small parts of the host plan no other unit test calls (#37's campaign found them):

- the servefleet version a host's good state names (``status`` shows it) is taken from the probe
  only when it is one version word, never odd probe output;
- ``wheelhouse_copies``: which wheelhouse files a host's steps need this run, asked of the
  wheelhouse with exactly the plan's parts (the release only when it installs, the driver only
  when it installs, the missing models), and nothing at all for another source, a refused host
  or data without a lock or a wheelhouse.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from host_inputs import converged_probe, probe, settings

from servefleet.hostplan import plan as plan_module
from servefleet.hostplan.plan import plan_host, wheelhouse_copies


@pytest.mark.parametrize(
    ("word", "taken"),
    [
        ("0.1.0", "0.1.0"),
        ("1.2.3rc1+local_build.4!x-y", "1.2.3rc1+local_build.4!x-y"),  # every allowed character
        ("v" * 64, "v" * 64),
        ("0.2.0RC1.Dev", "0.2.0RC1.Dev"),  # capitals
        ("v" * 65, None),  # longer than a version
        ("", None),
        ("0.1.0 and more", None),
        ("0.1.0\n", None),
        ("0.1.0;rm", None),
        (7, None),
        (None, None),
        (["0.1.0"], None),
    ],
)
def test_the_good_states_servefleet_version_is_one_version_word(word: Any, taken: Any) -> None:
    plan = plan_host(settings(), converged_probe(good_servefleet=word))
    assert plan.good_servefleet == taken


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """``host_copies`` and ``load_lock`` as the plan module calls them, recorded."""
    seen: list[tuple[Any, ...]] = []
    monkeypatch.setattr(plan_module, "load_lock", lambda path: ("lock of", path))

    def host_copies(*args: Any) -> list[str]:
        seen.append(args)
        return ["a copy"]

    monkeypatch.setattr(plan_module, "host_copies", host_copies)
    return seen


def wheelhouse_plan(over: dict[str, Any] | None = None, **fields: Any) -> Any:
    """A fresh host's plan with the wheelhouse source in its data (``over`` on top), its
    ``fields`` replaced."""
    plan = plan_host(settings(), probe())
    data = {"sdk_source": "wheelhouse", "sdk_lock": "locks/prod", "sdk_wheelhouse": "~/wh"}
    s = dataclasses.replace(plan.settings, **{**data, **(over or {})})
    return dataclasses.replace(plan, settings=s, **fields)


def test_the_wheelhouse_is_asked_for_exactly_what_the_plan_installs(
    calls: list[tuple[Any, ...]],
) -> None:
    release = dataclasses.replace(plan_host(settings(), probe()).release, pylock="[lock]\n")
    plan = wheelhouse_plan(
        release=release,
        release_complete=False,
        driver_needed=True,
        missing_models=("org/a", "org/b"),
    )
    assert wheelhouse_copies(plan) == ["a copy"]
    s = plan.settings
    assert calls == [
        ("~/wh", s.serve_root, ("lock of", "locks/prod"), "[lock]\n", s.driver_version, ("org/a", "org/b"))
    ]  # fmt: skip
    calls.clear()
    done = wheelhouse_plan(
        release=release, release_complete=True, driver_needed=False, missing_models=()
    )
    assert wheelhouse_copies(done) == ["a copy"]
    assert calls == [("~/wh", s.serve_root, ("lock of", "locks/prod"), None, None, ())]


@pytest.mark.parametrize(
    ("over", "fields"),
    [
        ({"sdk_source": "index"}, {}),
        ({}, {"refusal": "the host's SKU RBLN-CA25; allowed: RBLN-CR13"}),
        ({"sdk_lock": None}, {}),
        ({"sdk_wheelhouse": None}, {}),
    ],
)
def test_no_wheelhouse_copy_for_another_source_a_refused_host_or_no_lock_or_wheelhouse(
    calls: list[tuple[Any, ...]], over: dict[str, Any], fields: dict[str, Any]
) -> None:
    assert wheelhouse_copies(wheelhouse_plan(over, **fields)) == []
    assert calls == []
