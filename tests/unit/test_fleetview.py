"""plan and status summaries from a HostPlan (pure): what would change, what drifts."""

from __future__ import annotations

from test_deploy_plan import probe, settings
from test_host_state import _units

from servefleet.fleetview import (
    plan_summary,
    plan_table,
    prometheus_targets,
    status_problems,
    status_summary,
    status_table,
)
from servefleet.hostplan import plan_host

SMI = {"KMD_version": "3.5.1", "devices": [{"npu": n, "name": "RBLN-CR13"} for n in range(4)]}


def converged_probe(**over: object) -> dict:
    first = plan_host(settings(), probe(smi=SMI))
    pins = dict(first.release.expect)
    state = {
        "smi": SMI,
        "releases": [first.release.id],
        "current": first.release.id,
        "current_pins": pins,
        "warm": [first.spec.compile_fingerprint],
        "models": list(first.spec.requirements.models),
        "units": _units(first, {}),
        "good": first.release.id,
        "good_shas": [i.sha for i in first.instances],
    }
    return probe(**{**state, **over})


def test_fresh_host_plans_everything() -> None:
    p = plan_summary(plan_host(settings(), probe()))
    assert p["changes"] and p["recompile"] and p["install_release"]
    assert p["driver"] == [None, "3.5.1"] and len(p["restarts"]) == 4
    assert "openai/gpt-oss-120b" in p["models"]


def test_converged_host_plans_nothing_and_status_is_clean() -> None:
    plan = plan_host(settings(), converged_probe())
    p = plan_summary(plan)
    assert not p["changes"] and not p["recompile"] and p["restarts"] == [] and p["packages"] == {}
    st = status_summary(plan, {str(8000 + i): "ok" for i in range(4)}, "10.0.0.5")
    assert status_problems("h1", st) == []
    assert prometheus_targets({"h1": st}) == [
        {
            "targets": [f"10.0.0.5:{8000 + i}" for i in range(4)],
            "labels": {"host": "h1", "release": st["release"], "job": "servefleet-vllm"},
        }
    ]
    assert "h1" in status_table({"h1": st}) and "h1" in plan_table({"h1": p})


def test_upgrade_shows_package_versions() -> None:
    from servefleet.settings import load_defaults

    pins = [x.replace("==0.12.0", "==0.12.1") for x in load_defaults()["sdk_pins"]]
    p = plan_summary(plan_host(settings(sdk_pins=pins), converged_probe()))
    assert p["packages"]["rebel-compiler"] == ["0.12.0", "0.12.1"]
    assert p["release"] and p["install_release"] and len(p["restarts"]) == 4
    assert not p["recompile"]


def test_status_names_drift_and_unhealthy_instances() -> None:
    plan = plan_host(settings(), converged_probe())
    first = plan.instances[2]
    units = _units(plan, {2: "0" * 16})
    drifted = plan_host(settings(), converged_probe(units=units))
    health = {"8000": "ok", "8001": "not answering: refused", "8002": "ok", "8003": "ok"}
    lines = status_problems("h2", status_summary(drifted, health, "h2"))
    assert lines == [
        "h2: servefleet-vllm-1.service (port 8001) unhealthy: not answering: refused",
        f"h2: {first.unit} drifts: runs {'0' * 16}, wants {first.sha}",
    ]
