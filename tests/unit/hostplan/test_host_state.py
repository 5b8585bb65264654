"""The host probe (run for real against the lab's rbln-smi/lspci stand-ins) and the plan's
judgement of what runs: an instance is converged only when its main process runs its unit."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from host_inputs import CR13, CREDS, probe, probed_units, run_probe, settings
from repo_paths import REPO

from servefleet.base.errors import DataError
from servefleet.hostplan.plan import plan_host
from servefleet.settings.table import load_defaults, settings_from

TINY = REPO / "tests" / "data" / "rbln" / "tiny-moe.json"


@pytest.mark.parametrize("driver", [True, False])
def test_probe_reads_the_stand_ins(tmp_path: Path, driver: bool) -> None:
    result = run_probe(tmp_path, CR13, driver=driver)
    plan = plan_host(settings(), {**result, "libc": "glibc 2.39"})  # test_glibc: this machine's
    assert plan.hardware.source == ("rbln-smi" if driver else "lspci")
    assert plan.hardware.skus == ("RBLN-CR13",) * 4
    assert plan.refusal is None and len(plan.instances) == 4
    assert plan.driver_needed is not driver
    assert result["units"] == {} and result["models"] == [] and result["user"] is None


@pytest.mark.parametrize("driver", [True, False])
def test_probe_mixed_skus_are_refused(tmp_path: Path, driver: bool) -> None:
    mixed = {**CR13, "per_device": [{}, {"sku": "RBLN-CA25", "pci_device": "1250"}]}
    plan = plan_host(settings(), run_probe(tmp_path, mixed, driver=driver))
    assert plan.refusal and "RBLN-CA25, RBLN-CR13" in plan.refusal


def test_probe_device_count_npus_does_not_divide(tmp_path: Path) -> None:
    # tiny-moe takes 2 NPUs a server: 3 devices give one instance, the odd device stays idle
    result = run_probe(tmp_path, {**CR13, "devices": 3}, driver=True, serve_recipe=str(TINY))
    plan = plan_host(settings(serve_recipe=str(TINY)), result)
    assert [i.devices for i in plan.instances] == ["0,1"]


def test_probe_counts_a_model_only_when_complete(tmp_path: Path) -> None:
    repo = tmp_path / "hf" / "hub" / "models--openai--gpt-oss-120b"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("a" * 40)  # what the hub client writes first
    assert run_probe(tmp_path, CR13, driver=True)["models"] == []
    (repo / "snapshots" / ("a" * 40)).mkdir(parents=True)
    (repo / ".servefleet-complete").write_text("a" * 40 + "\n")
    assert run_probe(tmp_path, CR13, driver=True)["models"] == ["openai/gpt-oss-120b"]
    pinned = {"openai/gpt-oss-120b": "b" * 40}
    assert run_probe(tmp_path, CR13, driver=True, models_revisions=pinned)["models"] == []


# -- what runs decides ---------------------------------------------------------------------------


def test_converged_only_when_every_process_runs_its_unit() -> None:
    s = settings()
    first = plan_host(s, probe())
    good = {"good": first.release.id, "good_shas": [i.sha for i in first.instances],
            "releases": [first.release.id]}  # fmt: skip
    warm = [first.spec.compile_fingerprint]
    done = plan_host(s, probe(units=probed_units(first, {}), warm=warm, **good))
    assert done.converged and all(i.written and i.converged for i in done.instances)
    # everything runs, but the run died before it recorded the good state: converge again
    assert not plan_host(s, probe(units=probed_units(first, {}), warm=warm)).converged
    # ... or its release is not (or no longer) complete: it installs, then each restarts onto it
    unreleased = plan_host(s, probe(units=probed_units(first, {}), warm=warm,
                                    **{**good, "releases": []}))  # fmt: skip
    assert not unreleased.converged and not any(i.converged for i in unreleased.instances)
    # unit files say the new selection but instance 2 still runs what it was started with
    stale = plan_host(s, probe(units=probed_units(first, {2: "0" * 16}), warm=warm, **good))
    assert not stale.converged
    assert [i.index for i in stale.instances if not i.converged] == [2]
    assert all(i.written for i in stale.instances)
    failed = plan_host(s, probe(units=probed_units(first, {}, active="failed"), warm=warm))
    assert not failed.converged
    cold = plan_host(s, probe(units=probed_units(first, {})))
    assert not cold.converged, "an interrupted pre-warm resumes"


def test_unit_sha_covers_the_whole_unit_and_is_in_it() -> None:
    a = plan_host(settings(), probe()).instances[0]
    b = plan_host(settings(serve_health_timeout=5, serve_target="Throughput"), probe()).instances[0]
    assert a.sha != b.sha
    assert f'Environment="SERVEFLEET_UNIT={a.sha}"' in a.text
    without = "".join(x for x in a.text.splitlines(True) if "SERVEFLEET_UNIT" not in x)
    assert hashlib.sha256(without.encode()).hexdigest()[:16] == a.sha


def test_the_whole_port_range_must_fit() -> None:
    with pytest.raises(
        DataError, match=r"serve_base_port: 65533 \+ 3 instances ends at port 65536"
    ):
        plan_host(settings(serve_base_port=65533), probe())
    assert plan_host(settings(serve_base_port=65532), probe()).instances[-1].port == 65535


@pytest.mark.parametrize(
    ("account", "message"),
    [
        ({"uid": 1000, "shell": "/bin/bash"}, "is an existing login user"),
        ({"uid": 0, "shell": "/usr/sbin/nologin"}, "is root"),
    ],
)
def test_serve_user_must_not_be_a_login_user_or_root(account: dict, message: str) -> None:
    with pytest.raises(DataError, match=f"serve_user: 'servefleet' {message}"):
        plan_host(settings(), probe(user=account))
    assert plan_host(settings(), probe(user={"uid": 998, "shell": "/usr/sbin/nologin"}))


def test_unknown_key_with_our_prefix_is_refused() -> None:
    data = load_defaults()
    with pytest.raises(DataError, match="serve_targte.*did you mean serve_target"):
        settings_from(data.get, CREDS, keys=[*data, "serve_targte", "ssh_user"])


def test_the_gate_asks_for_the_served_model_name() -> None:
    from servefleet.hostplan.instance_unit import served_name

    assert served_name(["vllm", "serve", "m", "--served-model-name", "a b", "c"], "m") == "a b"
    assert served_name(["vllm", "serve", "m", "--served_model_name=x"], "m") == "x"
    assert served_name(["vllm", "serve", "m"], "m") == "m"
    plan = plan_host(settings(serve_recipe=str(TINY)), probe())
    assert plan.desired_state()["model"] == "tiny moe=fast"


def test_the_desired_state_records_the_servefleet_that_converges_the_host() -> None:
    from servefleet.base.version import VERSION

    plan = plan_host(settings(serve_recipe=str(TINY)), probe())
    assert plan.desired_state()["servefleet"] == VERSION
