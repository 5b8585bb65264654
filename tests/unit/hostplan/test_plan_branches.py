"""The host plan's branches that #37's campaign found held only by slow or host tests: a
compile-only build host (its hardware, its spec, its refusals), the release planned for the
host's glibc and its lock read only when the host takes a wheel, the kernel word, the serve user
refused as root or as a login user (each line whole), a fleet router's host (no servers, no
driver), and the devices variable in every server's unit."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from host_inputs import CR13, SMI, converged_probe, probe, settings
from rbln_cases import DATA

from servefleet.base.errors import DataError
from servefleet.base.remote.layout import NETRC
from servefleet.hostplan import plan as plan_module
from servefleet.hostplan.extras import resolve_for
from servefleet.hostplan.plan import plan_host
from servefleet.hostplan.types import GroupPlace, Place
from servefleet.kinds import Hardware
from servefleet.release.plan import plan_release, unlocked

BUILD = Place(builder=True)


def test_a_build_host_compiles_for_the_cards_first_sku_with_its_npus_and_no_driver() -> None:
    s = settings()
    spec = resolve_for(s)
    sku = spec.skus[0]
    plan = plan_host(s, probe(smi=None, pci=[]), place=BUILD)  # no NPU at all
    npus = resolve_for(s, sku).servers[0].npus
    assert plan.hardware == Hardware(
        "compile only", (sku,) * npus, tuple(range(npus)), s.driver_version
    )
    assert plan.spec == resolve_for(s, sku)
    assert plan.refusal is None and plan.builder
    assert not plan.driver_needed  # it compiles; it never loads the driver


def test_a_build_host_that_serves_is_refused_in_one_line() -> None:
    units = {
        "servefleet-vllm-1.service": {"active": "active"},
        "servefleet-vllm-0.service": {"active": "failed"},
    }
    plan = plan_host(settings(), probe(units=units), place=BUILD)
    assert plan.refusal == (
        "serve_prewarm_host: this host has servers of ours (servefleet-vllm-0.service, "
        "servefleet-vllm-1.service); allowed: a host that serves nothing (remove them, or name "
        "another build host)"
    )
    assert plan_host(settings(), probe(units=units)).refusal is None  # a serving host


@pytest.fixture
def releases(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """Each ``plan_release`` call the host plan makes: its arguments."""
    seen: list[tuple[Any, ...]] = []

    def recorded(*args: Any) -> Any:
        seen.append(args)
        return plan_release(*args)

    monkeypatch.setattr(plan_module, "plan_release", recorded)
    return seen


def test_the_release_is_planned_for_the_hosts_glibc_then_from_the_lock(
    releases: list[tuple[Any, ...]], monkeypatch: pytest.MonkeyPatch
) -> None:
    s = settings()
    plan = plan_host(s, probe(libc="glibc 2.39"))
    spec = plan.spec
    assert releases == [(unlocked(s), spec, NETRC, "2.39")] and plan.refusal is None
    releases.clear()
    # with a lock, planned again from it (a stand-in lock: the plan reads no file here)
    monkeypatch.setattr(plan_module, "plan_release", lambda *a: releases.append(a) or plan.release)
    locked = dataclasses.replace(s, sdk_lock="locks/prod")
    plan_host(locked, probe(libc="glibc 2.39"))
    assert releases == [(unlocked(locked), spec, NETRC, "2.39"), (locked, spec, NETRC, "2.39")]


def test_a_host_no_wheel_fits_is_refused_and_its_lock_never_read(
    releases: list[tuple[Any, ...]], monkeypatch: pytest.MonkeyPatch
) -> None:
    s = settings()
    plan = plan_host(s, probe(libc="glibc 2.35"))
    assert plan.refusal == (
        "glibc 2.35 here; vllm==0.30.0+cpu needs glibc >= 2.39 (sources: vllm 2.39)"
    )
    releases.clear()
    monkeypatch.setattr(plan_module, "plan_release", lambda *a: releases.append(a) or plan.release)
    locked = dataclasses.replace(s, sdk_lock="locks/prod")
    assert plan_host(locked, probe(libc="glibc 2.35")).refusal == plan.refusal
    assert [a[0] for a in releases] == [unlocked(locked)]  # a lock holds no stack for it
    # a host refused for its SKU keeps that refusal; its glibc is not asked, its lock is read
    releases.clear()
    other = {"smi": {**SMI, "devices": [{"npu": 0, "name": "RBLN-CA25"}]}}
    refused = plan_host(locked, probe(libc="glibc 2.35", **other))
    assert refused.refusal and "glibc" not in refused.refusal
    assert [a[0] for a in releases] == [unlocked(locked), locked]
    # a fleet router's host runs no server: no glibc refusal either
    releases.clear()
    router = plan_host(s, probe(libc="glibc 2.35"), place=Place(router_host=True))
    assert router.refusal is None and len(releases) == 1


def test_a_kernel_release_that_names_no_headers_package_is_refused() -> None:
    p = probe()
    del p["kernel"]
    assert plan_host(settings(), p).refusal == (
        "the host's kernel release '' cannot name its headers package (driver_apt_packages); "
        "allowed: letters, digits and . + ~ _ -"
    )
    assert plan_host(settings(), probe(kernel="6.8.0-49-generic")).refusal is None
    assert plan_host(settings(), converged_probe(kernel="")).refusal is None  # no driver step


def test_the_serve_user_is_never_root_nor_a_login_user() -> None:
    root = dataclasses.replace(settings(), serve_user="root")
    with pytest.raises(DataError) as e:
        plan_host(root, probe())
    assert str(e.value) == "serve_user: 'root' is root; allowed: a system user"
    with pytest.raises(DataError) as e:
        plan_host(settings(), probe(user={"uid": 0, "shell": "/usr/sbin/nologin"}))
    assert str(e.value) == "serve_user: 'servefleet' is root; allowed: a system user"
    with pytest.raises(DataError) as e:
        plan_host(settings(), probe(user={"uid": 1000, "shell": "/bin/bash"}))
    assert str(e.value) == (
        "serve_user: 'servefleet' is an existing login user (shell /bin/bash); "
        "allowed: a system user servefleet creates (no login shell)"
    )
    for shell in ("/usr/sbin/nologin", "/sbin/nologin", "/bin/false", "/usr/bin/false"):
        assert plan_host(settings(), probe(user={"uid": 998, "shell": shell})).refusal is None


def test_a_fleet_routers_host_plans_no_server_and_no_driver() -> None:
    plan = plan_host(settings(), probe(), place=Place(router_host=True))
    assert plan.instances == () and not plan.driver_needed and plan.router_host


def test_every_server_names_its_devices() -> None:
    plan = plan_host(settings(), converged_probe())
    assert [i.devices for i in plan.instances] == [str(n) for n in range(CR13["devices"])]
    for inst in plan.instances:
        assert dict(inst.env)["RBLN_VISIBLE_DEVICES"] == inst.devices


def test_the_spec_is_resolved_for_the_hosts_own_sku(monkeypatch: pytest.MonkeyPatch) -> None:
    """A card verifies an option on several SKUs, and the SKU is a compile input: a host's spec
    is resolved for the SKU its NPUs report, a build host's for the card's first."""
    seen: list[tuple[Any, ...]] = []
    converged = converged_probe()  # (plans a host itself)

    def recorded(*args: Any) -> Any:
        seen.append(args[1:])
        return resolve_for(*args)

    monkeypatch.setattr(plan_module, "resolve_for", recorded)
    plan_host(settings(), converged)
    assert seen == [(), ("RBLN-CR13",)]
    seen.clear()
    plan_host(settings(), probe(), place=BUILD)
    assert seen == [(), (resolve_for(settings()).skus[0],)]


def test_a_build_host_compiles_a_pd_cards_first_server_without_placing_roles() -> None:
    """A build host has no device groups to place a prefill and a decode server on: it compiles
    as the first instance of a host with NPUs, and is not refused for the pairs it lacks."""
    card = DATA / "rbln" / "gpt-oss-120b-pd.json"
    plan = plan_host(settings(serve_recipe=str(card), serve_router="host"), probe(), place=BUILD)
    assert plan.refusal is None
    assert [(i.role, i.devices) for i in plan.instances] == [("main", "0")]


def test_a_serving_groups_rank_is_one_main_server_on_the_first_device_group(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Whatever device groups a host has, its rank of a serving group is one server, as the
    rank's own (``place_rank``'s, stood in for here: the real one is held by
    ``fleet/test_serving_groups.py``), on the first device group, in no P/D role."""
    s = settings()
    spec = resolve_for(s, "RBLN-CR13")
    rank = GroupPlace("g1", 1, 2, "10.0.0.1", "ab" * 32, ("h1", "h2"))
    seen: list[tuple[Any, ...]] = []

    def place_rank(*args: Any) -> Any:
        seen.append(args)
        return spec, spec.servers[0], "the rank's refusal"

    monkeypatch.setattr(plan_module, "place_rank", place_rank)
    smi = {**SMI, "KMD_version": s.driver_version}
    plan = plan_host(s, probe(smi=smi), place=Place(address="10.0.0.2", group=rank))
    assert seen and seen[0][2:] == (rank, probe(smi=smi), "10.0.0.2")
    assert [(i.role, i.devices) for i in plan.instances] == [("main", "0")]
    assert plan.group == rank and plan.refusal == "the rank's refusal"
