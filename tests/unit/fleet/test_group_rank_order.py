"""A serving group's ranks follow inventory order where no host gives ``serve_group_rank``
(``fleet/groups.py`` ``ranks``, through ``FleetPlan.group``), never the hosts' names. Issue #52
bug 4: with the hosts without a rank taken by name (``rest = iter(sorted(...))``), node-b listed
before node-a became rank 1; ``test_ranks_without_serve_group_rank_follow_inventory_order_not_names``
and ``test_the_fleet_plans_group_ranks_hosts_by_inventory_order`` failed on that bug (the names
of ``test_serving_groups.py``'s test, a, b, c, are in both orders at once)."""

from __future__ import annotations

from group_inputs import fleet

from servefleet.fleet.groups import ranks


def test_ranks_without_serve_group_rank_follow_inventory_order_not_names() -> None:
    assert ranks("g", [("node-b", None), ("node-a", None)]) == ["node-b", "node-a"]
    assert ranks("g", [("z", None), ("y", 1), ("x", None)]) == ["z", "y", "x"]
    assert ranks("g", [("c", None), ("b", None), ("a", 0)]) == ["a", "c", "b"]


def test_the_fleet_plans_group_ranks_hosts_by_inventory_order() -> None:
    group = fleet(("node-b", {}), ("node-a", {})).group("g1")
    assert group.hosts == ("node-b", "node-a")
    assert [(m.host, m.rank, m.address) for m in group.members] == [
        ("node-b", 0, "10.0.0.1"),
        ("node-a", 1, "10.0.0.2"),
    ]
    assert group.head == "10.0.0.1"  # rank 0 is the rendezvous: the first host listed
