"""The scalar checks of ``settings/checks.py`` called directly. The key table builds its checks
at import (``whole(1, 65535)`` and the rest), before a mutation campaign's mutant is active, so
the table-driven tests of the data keys cannot tell a mutant of ``whole`` (#37: all 29 of its
mutants survived them); these tests make their checks at test time."""

from __future__ import annotations

from typing import Any

import pytest

from servefleet.settings.checks import Refused, prewarm_scope, router, router_policy, whole


def _refusal(check: Any, value: Any) -> str:
    with pytest.raises(Refused) as err:
        check(value)
    return str(err.value.error("key"))


@pytest.mark.parametrize(("value", "number"), [(1, 1), (3, 3), ("2", 2), ("003", 3)])
def test_whole_takes_an_int_or_digits_within_its_bounds(value: Any, number: int) -> None:
    got = whole(1, 3)(value)
    assert got == number and type(got) is int


WHOLE_REFUSALS = [
    (0, "key: 0 is out of range; allowed: 1-3"),
    (4, "key: 4 is out of range; allowed: 1-3"),
    ("4", "key: '4' is out of range; allowed: 1-3"),
    (True, "key: expected a whole number, got True; allowed: 1-3"),
    (2.0, "key: expected a whole number, got 2.0; allowed: 1-3"),
    ("2a", "key: expected a whole number, got '2a'; allowed: 1-3"),
    ("", "key: expected a whole number, got ''; allowed: 1-3"),
    (None, "key: expected a whole number, got None; allowed: 1-3"),
]


@pytest.mark.parametrize(("value", "expect"), WHOLE_REFUSALS)
def test_whole_refuses_in_one_line(value: Any, expect: str) -> None:
    assert _refusal(whole(1, 3), value) == expect


def test_whole_without_a_high_bound() -> None:
    check = whole(5)
    assert check(5) == 5 and check(10**9) == 10**9
    assert _refusal(check, 4) == "key: 4 is out of range; allowed: a whole number >= 5"


def test_the_word_checks_return_the_word() -> None:
    assert prewarm_scope("fleet") == "fleet" and prewarm_scope("host") == "host"
    assert router("host") == "host" and router("none") == "none"
    assert router_policy("cache_aware") == "cache_aware"
    assert _refusal(router_policy, "fastest") == (
        "key: 'fastest' is not a router policy; allowed: "
        "round_robin, random, cache_aware, power_of_two, consistent_hash"
    )
