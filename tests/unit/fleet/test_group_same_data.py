"""The data every rank of a serving group must share, and who the group's hash covers
(``fleet/groups.py`` ``group_of``, ``ServingGroup.sha``). Issue #52: survivors of
``bench/ast_mutation.py`` on ``groups.py``, each killed here: one key dropped from ``SAME``
(``elt``: ranks with other extra arguments, pins or NIC joined one group), a member's host or
address dropped from the hash (a rank moved to another host or address kept every unit), and
``serve_host`` no longer the member's address (``bool``). The list of keys is written here,
not read from ``SAME``, so a key dropped there fails it."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from group_inputs import data

from servefleet.base.errors import DataError
from servefleet.fleet.groups import group_of

SHARED = (
    "serve_recipe",
    "serve_strategy",
    "serve_hardware",
    "serve_variant",
    "serve_features",
    "serve_nodes",
    "serve_extra_args",
    "serve_extra_env",
    "serve_base_port",
    "sdk_pins",
    "serve_iface",
)


def _group(second: Any, names: tuple[str, str] = ("h1", "h2"), addresses=("10.0.0.1", "10.0.0.2")):
    first = data()
    return group_of("g1", [(names[0], addresses[0], lambda: first),
                           (names[1], addresses[1], lambda: second)])  # fmt: skip


@pytest.mark.parametrize("key", SHARED)
def test_a_rank_whose_shared_data_differs_is_refused_naming_the_key(key: str) -> None:
    other = dataclasses.replace(data(), **{key: "other"})
    with pytest.raises(DataError) as e:
        _group(other)
    assert str(e.value).startswith(f"serve_group 'g1': {key} on h2 is 'other', on h1 ")


def test_the_groups_hash_covers_each_members_host_and_address() -> None:
    base = _group(data()).sha
    assert _group(data(), names=("h1", "h3")).sha != base
    assert _group(data(), addresses=("10.0.0.1", "10.0.0.9")).sha != base
    assert _group(data()).sha == base


def test_a_ranks_serve_host_is_its_address_in_the_group() -> None:
    g = _group(data(serve_host="192.168.7.2"))
    assert [m.address for m in g.members] == ["10.0.0.1", "192.168.7.2"]
    assert g.sha != _group(data()).sha
