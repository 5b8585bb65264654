"""What the host plan takes from one probe of the host, field by field (#37's campaign: the
plan's reading of the probe was held only through the deploy's operations): every part of the
host's state the deploy, ``plan`` and ``status`` read from the plan is the probe's, under the
probe's own name, with odd or missing parts read as nothing."""

from __future__ import annotations

from typing import Any

from host_inputs import converged_probe, settings

from servefleet.hostplan.plan import plan_host


def test_every_state_field_is_the_probes_own() -> None:
    base = plan_host(settings(), converged_probe())
    fp = base.spec.compile_fingerprint
    models = list(base.spec.requirements.models)
    rid = base.release.id
    units = dict(converged_probe()["units"])
    first = next(iter(units))
    units[first] = {**units[first], "reload": True}
    units["servefleet-vllm-9.service"] = {"active": "inactive", "running": None}
    over: dict[str, Any] = {
        "verified": {rid: "the whole tree read"},
        "release_drift": {"zzz": ["b: 2", "c: 3"], "aaa": ["a: 1"]},
        "current": "cur-id",
        "current_pins": {"vllm": "0.30.0"},
        "current_files": {"x.json": "abc"},
        "kernel": "6.8.0-49-generic",
        "python": "3.11.7",
        "good": "good-id",
        "good_shas": ["s1", "s2"],
        "units": units,
        "paths": {"/opt/x": {"kind": "file"}},
        "group": {"gid": 990},
        "preflight": ["p1", "p2"],
        "model_drift": {models[0]: ["config.json: sha256 differs"]},
        "cache_drift": {fp: ["a.rbln: missing"]},
    }
    plan = plan_host(settings(), converged_probe(**over))
    assert plan.release_verified == {rid: "the whole tree read"}
    assert plan.release_drift == ("release aaa: a: 1", "release zzz: b: 2", "release zzz: c: 3")
    assert plan.release_complete  # drift of other releases is not this one's
    assert (plan.current, plan.current_pins, plan.current_files) == (
        "cur-id",
        {"vllm": "0.30.0"},
        {"x.json": "abc"},
    )
    assert (plan.kernel, plan.python) == ("6.8.0-49-generic", "3.11.7")
    assert (plan.good_release, plan.good_shas) == ("good-id", ("s1", "s2"))
    assert plan.units == units and plan.paths == {"/opt/x": {"kind": "file"}}
    assert plan.stale_units == ("servefleet-vllm-9.service",)
    assert plan.active_units == frozenset(set(units) - {"servefleet-vllm-9.service"})
    assert plan.reload_needed
    assert plan.group_exists
    assert plan.preflights == frozenset({"p1", "p2"})
    assert plan.missing_models == (models[0],)  # present, but its files drifted
    assert plan.model_drift == (f"model {models[0]}: config.json: sha256 differs",)
    assert plan.cache_drift == (f"cache {fp}: a.rbln: missing",)
    assert not plan.warm  # marked warm, but its files differ from the seal
    assert not plan.builder and not plan.router_host and plan.router is None
    assert not plan.router_stale


def test_missing_or_empty_parts_read_as_nothing() -> None:
    p = converged_probe()
    for k in ("verified", "current_pins", "current_files", "good_shas", "preflight", "paths"):
        p.pop(k, None)
    p.update(
        {"verified": None, "current_files": None, "preflight": None, "group": None, "units": {}}
    )
    plan = plan_host(settings(), p)
    assert plan.release_verified == {} and plan.current_files == {}
    assert plan.current_pins is None and plan.good_shas == () and plan.paths == {}
    assert plan.preflights == frozenset() and not plan.group_exists
    assert plan.stale_units == () and plan.active_units == frozenset()
    assert not plan.reload_needed
    assert plan.release_drift == plan.model_drift == plan.cache_drift == ()
    assert plan.warm and plan.missing_models == ()


def test_a_model_or_cache_missing_from_the_probe() -> None:
    base = plan_host(settings(), converged_probe())
    models = list(base.spec.requirements.models)
    plan = plan_host(settings(), converged_probe(models=models[1:], warm=[]))
    assert plan.missing_models == (models[0],) and not plan.warm
    other_cache = plan_host(settings(), converged_probe(cache_drift={"other-fp": ["x: missing"]}))
    assert other_cache.warm and other_cache.cache_drift == ()


def test_a_router_file_without_a_router_in_the_data_is_stale() -> None:
    stale = plan_host(settings(), converged_probe(router={"file": "abc"}))
    assert stale.router is None and stale.router_stale
    assert not plan_host(settings(), converged_probe(router={})).router_stale
    assert not plan_host(settings(), converged_probe(router=None)).router_stale


def test_the_serve_users_account_and_a_probe_without_releases() -> None:
    user = {"uid": 998, "shell": "/usr/sbin/nologin"}
    assert plan_host(settings(), converged_probe(user=user)).account == user
    bare = converged_probe()
    del bare["releases"]
    plan = plan_host(settings(), bare)
    assert not plan.release_complete and not plan.converged  # its release installs first


def test_a_probe_without_units_caches_or_models_plans_them_all() -> None:
    base = plan_host(settings(), converged_probe())
    bare = converged_probe()
    for k in ("units", "warm", "models", "releases"):
        del bare[k]
    plan = plan_host(settings(), bare)
    assert plan.units == {} and plan.stale_units == () and not plan.warm
    assert plan.missing_models == tuple(base.spec.requirements.models)
    assert not any(i.converged or i.written for i in plan.instances)
