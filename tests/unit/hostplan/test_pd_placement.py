"""Prefill/decode on one host (#21): the P/D card's roles on the host's device groups, their
placeholders bound to the host, behind its router in P/D mode; decode restarts before prefill."""

from __future__ import annotations

from typing import Any

import pytest
from host_inputs import CREDS, probe, settings
from repo_paths import DATA

from servefleet.base.errors import DataError
from servefleet.hostplan.plan import plan_host
from servefleet.hostplan.types import Place
from servefleet.kinds.roles import placeholders
from servefleet.kinds.vllm import defaults as vllm_defaults
from servefleet.settings.table import load_defaults, settings_from

PD_CARD = DATA / "rbln" / "gpt-oss-120b-pd.json"


def pd(**over: Any):
    return settings(serve_recipe=str(PD_CARD), serve_router="host", **over)


def test_one_pair_on_the_first_two_groups_behind_the_hosts_router() -> None:
    plan = plan_host(pd(), probe())
    assert plan.refusal is None
    assert [(i.role, i.port, i.devices) for i in plan.instances] == [
        ("prefill", 8000, "0"),
        ("decode", 8001, "1"),
    ]
    spec_roles = {x.role: x for x in plan.spec.servers}
    assert placeholders(plan.spec) == []  # every $PREFILL_NODE_1 etc. bound
    for inst in plan.instances:
        argv, env = list(inst.argv), dict(inst.env)
        # the card's argv as it is, then what the deploy adds (its port last: vLLM takes it)
        card = spec_roles[inst.role].argv
        assert argv[1 : len(card)] == card[1:]
        assert argv[len(card) : len(card) + 2] == ["--port", str(inst.port)]
        assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "127.0.0.1"
        assert env["RBLN_VISIBLE_DEVICES"] == inst.devices
    assert dict(plan.instances[0].env)["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "5557"
    assert dict(plan.instances[1].env)["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "5558"
    r = plan.router
    assert r is not None and r.roles == ("prefill", "decode")
    argv = list(r.argv)
    i = argv.index("--vllm-pd-disaggregation")
    assert argv[i : i + 5] == ["--vllm-pd-disaggregation", "--prefill", "http://127.0.0.1:8000",
                               "--decode", "http://127.0.0.1:8001"]  # fmt: skip
    assert "--worker-urls" not in argv
    state = plan.desired_state()
    assert state["pd"] is True and state["routers"] == []  # its worker API cannot re-add P/D
    assert [i["role"] for i in state["instances"]] == ["decode", "prefill"]  # decode first
    assert state["router"]["pd"] is True


def test_two_pairs_get_their_own_side_channel_ports() -> None:
    plan = plan_host(pd(serve_pd_pairs=2), probe())
    roles = [(i.role, dict(i.env)["VLLM_NIXL_SIDE_CHANNEL_PORT"]) for i in plan.instances]
    assert roles == [("prefill", "5557"), ("prefill", "5567"), ("decode", "5558"),
                     ("decode", "5568")]  # fmt: skip
    assert [i["role"] for i in plan.desired_state()["instances"]] == ["decode"] * 2 + [
        "prefill"
    ] * 2


def test_a_host_with_too_few_groups_is_refused_and_no_router_is_an_error() -> None:
    plan = plan_host(pd(serve_pd_pairs=3), probe())
    assert plan.refusal == (
        "the host has 4 device groups of 1; serve_pd_pairs 3 needs 6 (a prefill and a decode "
        "server each)"
    )
    with pytest.raises(DataError) as e:
        plan_host(settings(serve_recipe=str(PD_CARD)), probe())
    assert "serve_router: 'none', but the selection has the roles prefill and decode" in str(
        e.value
    )


def test_an_api_key_with_prefill_and_decode_is_refused_in_one_line() -> None:
    """vllm-router's P/D mode sends its workers its own OPENAI_API_KEY and checks no client's
    key (measured with 0.1.17: a client's key got 401 from the servers behind it)."""
    data = load_defaults()
    data.update(serve_recipe=str(PD_CARD), serve_router="host")
    keyed = settings_from(data.get, {**CREDS, "SERVEFLEET_API_KEY": "sk-" + "a" * 40})
    with pytest.raises(DataError) as e:
        plan_host(keyed, probe())
    message = str(e.value)
    assert message.startswith("creds_api_key_env: an API key, but the selection has the roles")
    assert "allowed: no API key" in message and "\n" not in message and "sk-a" not in message


def test_a_main_server_is_placed_as_before() -> None:
    plan = plan_host(settings(serve_router="host"), probe())
    assert {i.role for i in plan.instances} == {"main"}
    assert plan.router is not None and plan.router.roles == ()
    assert plan.desired_state()["pd"] is False


GLM = dict(serve_recipe="vllm/zai-org/GLM-5.2", serve_strategy="pd_cluster", serve_hardware="h200",
           serve_router="fleet", serve_roles={"prefill": "pre", "decode": "dec"},
           **vllm_defaults.DEFAULTS)  # fmt: skip
H200 = {"gpus": [f"{i}, NVIDIA H200, 143771, 570.86" for i in range(8)], "pci": [], "smi": None}


def test_serve_roles_place_each_role_on_its_groups_hosts_behind_fleet_routers() -> None:
    from servefleet.release.plan import plan_release

    s = settings(**GLM)
    routers = ("http://10.0.0.3:8080",)
    for groups, role, addr in ((["pre"], "prefill", "10.0.0.1"), (["dec"], "decode", "10.0.0.2")):
        plan = plan_host(s, probe(**H200), place=Place(addr, tuple(groups), fleet_routers=routers))
        assert plan.refusal is None, plan.refusal
        assert [(i.role, i.worker) for i in plan.instances] == [(role, f"http://{addr}:8000")]
        env = dict(plan.instances[0].env)
        assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == addr  # its own NIXL side channel
        assert plan.routers == ()  # a P/D worker is never taken out of rotation
        assert "nixl" in plan.spec.requirements.packages  # NixlConnector imports it
        assert "nixl==1.5.1" in plan_release(s, plan.spec, None).requirements
    neither = plan_host(
        s, probe(**H200), place=Place("10.0.0.9", ("other",), fleet_routers=routers)
    )
    assert neither.refusal == (
        "serve_roles: this host is in neither of the groups 'pre' (prefill) and 'dec' (decode); "
        "allowed: a host of one of them"
    )
    assert neither.instances == ()
    with pytest.raises(DataError) as e:
        plan_host(
            settings(**{**GLM, "serve_router": "host"}), probe(**H200), place=Place(groups=("pre",))
        )
    assert "serve_roles: {'prefill': 'pre', 'decode': 'dec'} places each role" in str(e.value)


def test_a_fleet_router_routes_prefill_and_decode_in_pd_mode() -> None:
    from servefleet.router.plan import fleet_order

    s = settings(**GLM)
    host = plan_host(s, probe(), place=Place(router_host=True))
    assert host.router is not None and host.instances == ()
    workers = fleet_order(["http://10.0.0.2:8000", "http://10.0.0.1:8000"])
    roles = {"http://10.0.0.1:8000": "prefill", "http://10.0.0.2:8000": "decode"}
    r = host.router.over(s, workers, [roles[w] for w in workers])
    argv = list(r.argv)
    assert "--vllm-pd-disaggregation" in argv and "--worker-urls" not in argv
    assert argv[argv.index("--prefill") + 1] == "http://10.0.0.1:8000"
    assert argv[argv.index("--decode") + 1] == "http://10.0.0.2:8000"
