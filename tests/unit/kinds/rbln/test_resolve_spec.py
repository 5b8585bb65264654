"""What ``resolve_rbln`` puts in the spec and the rules the mutation campaign (#37) found no mirror
test for: the spec's fields and fingerprint inputs, the defaults' ``off`` and ``recommended``,
a delta deleting what is not there, the refusals' lists, the requirements counted once over
several roles, and the prefill/decode router's KV rules."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest
from rbln_cases import COMPILER, DATA, TINY

from servefleet.base.errors import RecipeError
from servefleet.kinds.rbln.card import load_card
from servefleet.kinds.rbln.card_checks import card_from_dict
from servefleet.kinds.rbln.fingerprint import compile_fingerprint
from servefleet.kinds.rbln.resolve import default_selection, resolve_rbln, select

PD_CARD = DATA / "rbln" / "gpt-oss-120b-pd.json"
TINY_CARD = load_card(TINY, name="tiny")
TINY_GRID = TINY_CARD.strategies[0].options[0].grid


def _tiny() -> dict[str, Any]:
    return json.loads(TINY.read_text())


def _pd() -> dict[str, Any]:
    return json.loads(PD_CARD.read_text())


def _grid(raw: dict[str, Any]) -> dict[str, Any]:
    grid: dict[str, Any] = raw["strategies"][0]["options"][0]["grid"]
    return grid


def _refused(card: Any, **kw: Any) -> str:
    with pytest.raises(RecipeError) as err:
        resolve_rbln(card, compiler_version=COMPILER, **kw)
    return str(err.value)


def test_the_spec_names_the_card_its_kind_skus_roles_and_no_router() -> None:
    spec = resolve_rbln(TINY_CARD, compiler_version=COMPILER)
    assert (spec.recipe, spec.kind, spec.skus) == ("tiny", "rbln", ["RBLN-CR13", "RBLN-CR14"])
    assert [s.role for s in spec.servers] == ["main"] and spec.router == []


def test_the_fingerprint_is_of_the_server_its_npus_sku_and_compiler() -> None:
    for sku in ("RBLN-CR13", "RBLN-CR14"):
        spec = resolve_rbln(TINY_CARD, sku=sku, compiler_version=COMPILER)
        (s,) = spec.servers
        assert s.npus == 2
        assert spec.compile_fingerprint == compile_fingerprint(s.argv, s.env, 2, sku, COMPILER)
    cr13, cr14 = (resolve_rbln(TINY_CARD, sku=k, compiler_version=COMPILER) for k in ("RBLN-CR13", "RBLN-CR14"))  # fmt: skip
    assert cr13.compile_fingerprint != cr14.compile_fingerprint


def test_defaults_leave_recommended_off_unless_asked() -> None:
    plain = {"lmcache": "off", "spec_decode": "off", "sampler": "off"}
    assert default_selection(TINY_GRID) == plain
    assert select(TINY_CARD, TINY_GRID) == plain
    assert select(TINY_CARD, TINY_GRID, recommended=True) == TINY_GRID.recommended


def test_a_mode_defaults_to_off_wherever_off_is_listed() -> None:
    raw = _tiny()
    _grid(raw)["modes"]["spec_decode"] = ["suffix", "eagle3", "off"]
    card = card_from_dict(raw, name="tiny")
    grid = card.strategies[0].options[0].grid
    assert default_selection(grid)["spec_decode"] == "off"
    _grid(raw)["modes"]["spec_decode"] = ["suffix", "eagle3"]
    _grid(raw)["recommended"]["spec_decode"] = "eagle3"
    grid = card_from_dict(raw, name="tiny").strategies[0].options[0].grid
    assert default_selection(grid)["spec_decode"] == "suffix"


def test_a_delta_may_delete_an_env_or_arg_the_role_does_not_have() -> None:
    raw = _tiny()
    off = _grid(raw)["deltas"]["sampler=off"]["main"]
    off["del_envs"] = ["NOT_THERE", "VLLM_RBLN_USE_DEVICE_TENSOR"]
    off["del_args"] = ["--not-there"]
    spec = resolve_rbln(card_from_dict(raw, name="tiny"), compiler_version=COMPILER)
    assert "VLLM_RBLN_USE_DEVICE_TENSOR" not in spec.servers[0].env


def test_the_refusals_list_what_is_allowed() -> None:
    msg = _refused(TINY_CARD, strategy="nope")
    assert msg == "tiny: unknown strategy 'nope' (allowed: tp2, single)"
    msg = _refused(TINY_CARD, sku="RBLN-CA12")
    assert msg.endswith("(allowed: RBLN-CR13, RBLN-CR14)"), msg
    # an offered axis the card's display axes do not name: no hint, the values allowed
    msg = _refused(TINY_CARD, sets={"spec_decode": "bogus"})
    assert msg == (
        "tiny: spec_decode='bogus' is not offered by this grid "
        "(allowed spec_decode: off, suffix, eagle3)"
    )
    raw = _tiny()
    grid = _grid(raw)
    grid.update(modes={}, options={}, option_base={}, recommended={}, excluded=[])
    grid["deltas"] = {}
    bare = card_from_dict(raw, name="tiny")
    assert _refused(bare, sets={"lmcache": "cpu"}).endswith("(offered: none)")


def _pd_with(kv: list[Any], extra: dict[str, str] | None = None, router: Any = None) -> Any:
    raw = _pd()
    grid = _grid(raw)
    grid["router"] = router
    for role, config in zip(grid["base"], kv, strict=True):
        if config is None:
            del role["args"]["--kv-transfer-config"]
        else:
            role["args"]["--kv-transfer-config"] = "--kv-transfer-config " + json.dumps(
                json.dumps(config)
            )
        role["args"].update(extra or {})
    return card_from_dict(raw, name="pd")


def test_requirements_are_counted_once_over_both_roles() -> None:
    suffix = {"--speculative-config": '--speculative-config \'{"method": "suffix"}\''}
    lm = {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}
    req = resolve_rbln(_pd_with([lm, lm], suffix), compiler_version=COMPILER).requirements
    assert req.vllm_rbln_extras == ["kv-connectors"]
    assert req.imports == ["rebel", "vllm_rbln", "lmcache_rbln", "arctic_inference"]
    assert req.packages == ["arctic-inference"]
    nixl = {"kv_connector": "RblnNixlSomething", "kv_role": "kv_both"}
    req = resolve_rbln(_pd_with([nixl, nixl]), compiler_version=COMPILER).requirements
    assert req.vllm_rbln_extras == ["kv-connectors"] and req.imports == ["rebel", "vllm_rbln"]


@pytest.mark.parametrize(
    ("router", "policy"), [(None, "round_robin"), ({"policy": "cache_aware"}, "cache_aware")]
)
def test_the_pd_router_takes_the_grid_policy_and_the_roles_in_order(
    router: Any, policy: str
) -> None:
    both = {"kv_connector": "X", "kv_role": "kv_both"}
    spec = resolve_rbln(_pd_with([both, both], router=router), compiler_version=COMPILER)
    assert spec.router[:3] == ["vllm-router", "--policy", policy]
    words = spec.router
    assert words[words.index("--prefill") + 1] == "http://$PREFILL_NODE_1:8001"
    assert words[words.index("--decode") + 1] == "http://$DECODE_NODE_1:8002"


def test_the_pd_fingerprint_is_the_hash_of_both_roles_in_order() -> None:
    both = {"kv_connector": "X", "kv_role": "kv_both"}
    spec = resolve_rbln(_pd_with([both, both]), compiler_version=COMPILER)
    prints = [
        compile_fingerprint(s.argv, s.env, s.npus, "RBLN-CR13", COMPILER) for s in spec.servers
    ]
    assert prints[0] != prints[1]
    assert spec.compile_fingerprint == hashlib.sha256("\n".join(prints).encode()).hexdigest()


PD_REFUSALS = [
    ([{"kv_connector": "X", "kv_role": "kv_consumer"}, None], "role prefill has kv_role "
     "'kv_consumer'; allowed: a --kv-transfer-config naming a kv_connector and kv_role "
     "kv_producer or kv_both"),
    ([{"kv_connector": "X", "kv_role": "kv_producer"}, {"kv_connector": "X", "kv_role":
      "kv_producer"}], "role decode has kv_role 'kv_producer'; allowed: a --kv-transfer-config "
     "naming a kv_connector and kv_role kv_consumer or kv_both"),
    ([{"kv_role": "kv_both"}, None], "role prefill has kv_role 'kv_both'; allowed"),
    ([{"kv_connector": "", "kv_role": "kv_both"}, None], "role prefill has kv_role 'kv_both'"),
    ([{"kv_connector": "X"}, None], "role prefill has kv_role None; allowed"),
    ([{"kv_connector": "X", "kv_role": "kv_both"}, None], "role decode has no "
     "--kv-transfer-config; allowed"),
]  # fmt: skip


@pytest.mark.parametrize(("kv", "expect"), PD_REFUSALS)
def test_the_pd_roles_must_hand_their_kv_over(kv: list[Any], expect: str) -> None:
    msg = _refused(_pd_with(kv))
    assert msg.startswith("pd: ") and expect in msg, msg
