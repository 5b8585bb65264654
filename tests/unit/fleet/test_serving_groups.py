"""Serving groups (#34): the fleet plan's groups from the inventory (ranks by inventory order or
``serve_group_rank``, each check in one line before any host is planned), and each host's plan
holding its rank: the rank's argv with ``$HEAD_IP`` and ``$IFACE_NAME`` bound, one unit with
the group's hash, no port on a headless rank, and rank 0 as the only worker."""

from __future__ import annotations

from typing import Any

import pytest
from group_inputs import data, fleet, rank_plan
from host_inputs import gpu_probe

from servefleet.base.errors import DataError
from servefleet.base.remote.layout import GROUP_SHA_VAR
from servefleet.fleet.fleetplan import FleetHost, fleet_of
from servefleet.fleet.groups import ranks
from servefleet.hostplan.plan import plan_host
from servefleet.settings.table import load_defaults, settings_from


def test_each_rank_runs_the_sites_argv_with_the_placeholders_bound() -> None:
    f = fleet(("h1", {}), ("h2", {}))
    head, worker = rank_plan(f, "h1"), rank_plan(f, "h2")
    assert head.refusal is None and worker.refusal is None
    assert head.group and worker.group and head.group.sha == worker.group.sha
    (h,), (w,) = head.instances, worker.instances
    words = list(h.argv)
    assert words[words.index("--node-rank") + 1] == "0" and "--headless" not in words
    assert words[words.index("--master-addr") + 1] == "10.0.0.1" and "--port" in words
    wwords = list(w.argv)
    assert wwords[wwords.index("--node-rank") + 1] == "1" and "--headless" in wwords
    assert wwords[wwords.index("--master-addr") + 1] == "10.0.0.1"
    assert "--port" not in wwords and not w.serves and h.serves
    assert dict(w.env)["NCCL_SOCKET_IFNAME"] == "ib0" == dict(h.env)["GLOO_SOCKET_IFNAME"]
    assert dict(h.env)[GROUP_SHA_VAR] == head.group.sha == dict(w.env)[GROUP_SHA_VAR]
    assert "Restart=no" in h.text and "rank 1 of group g1, headless" in w.text
    assert "$" not in " ".join([*words, *wwords])  # nothing left unbound
    assert head.desired_state()["group"] == {"name": "g1", "rank": 0, "sha": head.group.sha,
                                             "hosts": ["h1", "h2"]}  # fmt: skip


def test_a_change_of_any_rank_changes_the_groups_hash() -> None:
    one = fleet(("h1", {}), ("h2", {})).group("g1").sha
    moved = fleet(("h1", {"serve_group_rank": 1}), ("h2", {})).group("g1")
    assert moved.hosts == ("h2", "h1") and moved.sha != one
    assert fleet(("h1", {}), ("h2", {})).group("g1").sha == one  # the same fleet: the same hash


def test_serve_iface_names_the_nic_else_the_one_with_the_hosts_address() -> None:
    f = fleet(("h1", {"serve_iface": "eth9"}), ("h2", {"serve_iface": "eth9"}))
    plan = rank_plan(f, "h1", serve_iface="eth9")
    assert dict(plan.instances[0].env)["NCCL_SOCKET_IFNAME"] == "eth9"
    s = data()
    bare = plan_host(s, gpu_probe(addresses={"lo": ["127.0.0.1/8"]}), place=fleet(
        ("h1", {}), ("h2", {})).place("h1", s))  # fmt: skip
    assert (
        bare.refusal and "no interface of this host carries its address '10.0.0.1'" in bare.refusal
    )


@pytest.mark.parametrize(
    ("hosts", "message"),
    [
        (
            (("h1", {}),),
            "serve_group 'g1': 1 hosts (h1), but multi_node_tp_pp of "
            "vllm/deepseek-ai/DeepSeek-V3.2 spans 2 nodes; allowed: exactly 2 hosts",
        ),
        ((("h1", {}), ("h2", {}), ("h3", {})), "serve_group 'g1': 3 hosts (h1, h2, h3)"),
        (
            (("h1", {}), ("h2", {"serve_hardware": "h100"})),
            "serve_group 'g1': serve_hardware on h2 is 'h100', on h1 'h200'; allowed: the same",
        ),
        (
            (("h1", {"serve_group_rank": 1}), ("h2", {"serve_group_rank": 1})),
            "serve_group_rank: 1 on both h1 and h2 (group 'g1'); allowed: each rank on one host",
        ),
        (
            (("h1", {"serve_group_rank": 2}), ("h2", {})),
            "serve_group_rank: 2 on h1, but the group 'g1' has 2 hosts; allowed: 0-1",
        ),
        (
            (
                ("h1", {"serve_strategy": "single_node_tp"}),
                ("h2", {"serve_strategy": "single_node_tp"}),
            ),
            "which runs on one host; allowed: a multi-node strategy",
        ),
        (
            (("h1", {"serve_router": "host"}), ("h2", {"serve_router": "host"})),
            "serve_router is 'host', but a group serves one API, rank 0's; allowed: 'none', or",
        ),
    ],
)
def test_a_bad_group_is_refused_in_one_line_before_any_host_is_planned(
    hosts: tuple[tuple[str, dict[str, Any]], ...], message: str
) -> None:
    f = fleet(*hosts)
    with pytest.raises(DataError) as e:
        f.place("h1", data(**hosts[0][1]))
    assert message in str(e.value) and "\n" not in str(e.value)


def test_a_multi_node_selection_without_a_group_and_a_run_over_part_of_one() -> None:
    s = data(serve_group=None)
    with pytest.raises(DataError, match="spans 2 hosts; allowed: the same serve_group on 2 hosts"):
        plan_host(s, gpu_probe())
    part = fleet(("h1", {}), ("h2", {}), limit=("h1",))
    assert part.group_outside("g1") == (
        "serve_group 'g1': this run does not reach h2 (rank 1), and a group restarts as one; "
        "allowed: a run over every host of the group (h1, h2)"
    )
    assert fleet(("h1", {}), ("h2", {})).group_outside("g1") is None


def test_rbln_hosts_refuse_a_serving_group() -> None:
    d = load_defaults()
    d["serve_group"] = "g1"
    s = settings_from(d.get, {"RBLN_INDEX_USER": "u", "RBLN_INDEX_PASSWORD": "p"})
    f = fleet_of([FleetHost("h1", "10.0.0.1", (), lambda: s, "g1"),
                  FleetHost("h2", "10.0.0.2", (), lambda: s, "g1")])  # fmt: skip
    with pytest.raises(DataError, match="runs on one host; allowed: a multi-node strategy"):
        f.place("h1", s)


def test_ranks_follow_inventory_order_unless_given() -> None:
    assert ranks("g", [("a", None), ("b", None), ("c", None)]) == ["a", "b", "c"]
    assert ranks("g", [("a", None), ("b", 0), ("c", None)]) == ["b", "a", "c"]
    assert ranks("g", [("a", 2), ("b", None), ("c", 0)]) == ["c", "b", "a"]


def test_status_reports_a_headless_rank_by_its_unit_and_the_group_as_one() -> None:
    from servefleet.fleet.statusview import (
        group_lines,
        group_problems,
        prometheus_targets,
        status_summary,
    )

    f = fleet(("h1", {}), ("h2", {}))
    head, worker = rank_plan(f, "h1"), rank_plan(f, "h2")
    ok = {"8000": "ok"}
    statuses = {"h1": status_summary(head, ok, "10.0.0.1"),
                "h2": status_summary(worker, ok, "10.0.0.2")}  # fmt: skip
    assert statuses["h2"]["instances"][0]["headless"] and "headless" not in statuses["h1"][
        "instances"][0]  # fmt: skip
    sha = head.group.sha
    assert statuses["h2"]["group"] == {"name": "g1", "rank": 1, "hosts": ["h1", "h2"], "sha": sha}
    # the group in one line: each rank, its host, whether it runs the group's hash, its gate
    assert group_lines(statuses) == [
        f"group g1 ({sha}): rank 0 h1 (port 8000): runs no group hash, ok; "
        "rank 1 h2 (headless): runs no group hash, ok"
    ]
    statuses["h2"]["instances"][0]["group_running"] = sha
    assert "rank 1 h2 (headless): runs the group's hash, ok" in group_lines(statuses)[0]
    # only rank 0 serves an API: the headless rank is no scrape target
    targets = [t for g in prometheus_targets(statuses) for t in g["targets"]]
    assert targets == ["10.0.0.1:8000"]
    # every rank up but never converged here (the probe ran nothing): both ranks drift
    assert group_problems(statuses) == [
        "group g1 (h1, h2) does not serve: h1 (rank 0), h2 (rank 1)"
    ]
    statuses["h2"] = {"unreachable": "ssh: timed out"}  # a rank not reached: the group is named
    assert group_problems(statuses) == [
        "group g1 (h1, h2) does not serve: h1 (rank 0), h2 (rank 1)"
    ]
    del statuses["h2"]
    assert group_problems(statuses)[0].endswith("h2 (rank 1)")
