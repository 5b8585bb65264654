"""A ``multi_node`` selection (``resolve.py``'s ``_resolve_group``) and the companions refused
beside a group's ranks (``_no_companions``), as the mutation campaign (#37) found them held by no
unit test: the group's spec from rank 0 (the variant's own model id, a draft model, the
KV-offload option's packages, ``nodes``), the features and KV-offload option reaching every
rank, a feature or option limited to some strategies gated by the group's, and each refusal's
whole line (a feature's companion, the first of two named; a KV-offload option's companion; an
option without a companion command passes). The KV-offload options with a companion or an
install line on a multi-node strategy are added to the taxonomy here (the shipped taxonomy's
one companion, ``lmcache``, is for single-node strategies only)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from vllm_cases import recipe_from, refused_line

from servefleet.kinds.vllm import resolve_vllm
from servefleet.kinds.vllm.recipe import VllmRecipe
from servefleet.spec import ServeSpec

GROUP = """\
meta:
  hardware: {h200: verified, mi300x: verified}
model:
  model_id: acme/group-moe
variants:
  default: {vram_minimum_gb: 400}
  fp8: {model_id: acme/group-moe-fp8, vram_minimum_gb: 200}
compatible_strategies: [single_node_tp, multi_node_tp, multi_node_dep]
features:
  tools: {args: [--enable-auto-tool-choice], env: {TOOLS: "1"}}
  grouped: {strategies: [multi_node_tp], args: [--grouped]}
  single: {strategies: [single_node_tp], args: [--single]}
  helper:
    args: [--helper]
    companion: {label: helper, command: "helper-server --port 9000"}
  helper2:
    args: [--helper2]
    companion: {label: helper2, command: "helper2-server"}
opt_in_features: [helper, helper2]
"""
# two KV-offload options open to every strategy: one runs a companion, one has none to run
SIDECAR = {
    "args": ["--kv-transfer-config", '{"kv_connector":"X","kv_role":"kv_both"}'],
    "install": 'uv pip install "sidecar-kv==1.0"',
    "companion": {"label": "sidecar", "command": "sidecar serve"},
}
QUIET = {
    "args": ["--kv-transfer-config", '{"kv_connector":"Q","kv_role":"kv_both"}'],
    "env": {"Q": "1"},
    "install": 'uv pip install "quiet-kv>=2" other-kv',
    "companion": {"label": "quiet"},
    "strategies": ["single_node_tp", "multi_node_tp"],
}
TOOLS_ENV = {"GLOO_SOCKET_IFNAME": "$IFACE_NAME", "NCCL_SOCKET_IFNAME": "$IFACE_NAME"}


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> VllmRecipe:
    r = recipe_from(tmp_path_factory, "group.yaml", GROUP)
    kv = {**r.taxonomy["kv_offload"], "sidecar": SIDECAR, "quiet": QUIET}
    return replace(r, taxonomy={**r.taxonomy, "kv_offload": kv})


def _group(r: VllmRecipe, strategy: str = "multi_node_tp", **kw: object) -> ServeSpec:
    return resolve_vllm(r, strategy=strategy, **kw)  # type: ignore[arg-type]


def _refused(r: VllmRecipe, **kw: object) -> str:
    return refused_line(_group, r, **kw)


def test_a_group_of_the_variants_model_from_rank_0(group: VllmRecipe) -> None:
    spec = _group(group, variant="fp8", nodes=3)
    assert spec.nodes == 3 and [s.rank for s in spec.servers] == [0, 1, 2]
    head = spec.servers[0]
    assert head.argv == [
        "vllm",
        "serve",
        "acme/group-moe-fp8",
        *["--tensor-parallel-size", "24", "--nnodes", "3", "--node-rank", "0"],
        *["--master-addr", "$HEAD_IP", "--enable-auto-tool-choice", "--grouped"],
    ]
    assert head.env == {**TOOLS_ENV, "TOOLS": "1"} and head.npus == 8
    assert spec.servers[2].argv[-3:] == ["--headless", "--enable-auto-tool-choice", "--grouped"]
    assert spec.selection == {
        "hardware": "h200",
        "strategy": "multi_node_tp",
        "variant": "fp8",
        "features": "tools,grouped",
    }
    assert spec.requirements.models == ["acme/group-moe-fp8"]
    assert spec.requirements.packages == []
    assert (spec.recipe, spec.kind, spec.router) == (group.name, "vllm", [])


def test_no_feature_reaches_every_rank(group: VllmRecipe) -> None:
    spec = _group(group, no_features=["tools", "grouped"])
    assert spec.selection["features"] == ""
    assert [s.argv[-1] for s in spec.servers] == ["$HEAD_IP", "--headless"]
    assert all(s.env == TOOLS_ENV for s in spec.servers)
    # a feature offered with one strategy only is on there by default, off with the other
    assert _group(group, no_features=["tools"]).selection["features"] == "grouped"
    one = resolve_vllm(group, strategy="single_node_tp", no_features=["tools"])
    assert one.selection["features"] == "single"
    assert one.servers[0].argv[-3:] == ["--tensor-parallel-size", "8", "--single"]


def test_the_models_are_rank_0s(group: VllmRecipe) -> None:
    # a draft in one word right after the model (the base's first argument)
    base = '--speculative-config={"method":"eagle3","model":"acme/draft"}'
    model = {**group.data["model"], "base_args": [base]}
    spec = _group(replace(group, data={**group.data, "model": model}))
    assert spec.servers[0].argv[3] == base
    assert spec.requirements.models == ["acme/group-moe", "acme/draft"]


def test_a_kv_offload_option_without_a_companion_reaches_every_rank(group: VllmRecipe) -> None:
    spec = _group(group, kv_offload="quiet")
    assert spec.selection["kv_offload"] == "quiet"
    for s in spec.servers:
        assert s.argv[-2:] == ["--kv-transfer-config", '{"kv_connector":"Q","kv_role":"kv_both"}']
        assert s.env["Q"] == "1"
    # the option's install line: its packages, once for the group
    assert spec.requirements.packages == ["quiet-kv", "other-kv"]
    assert len(spec.servers) == 2
    # the option is gated by the group's strategy (multi_node_dep is not among its strategies)
    assert _refused(group, kv_offload="quiet", strategy="multi_node_dep") == (
        "KV offload quiet is not offered here: not with strategy multi_node_dep (its "
        "strategies: single_node_tp, multi_node_tp) (options here: simple, sidecar)"
    )


def test_a_companion_beside_a_rank_is_refused(group: VllmRecipe) -> None:
    assert _refused(group, features=["helper"]) == (
        "feature helper runs a companion beside its server, which multi_node_tp does not render; "
        "allowed: --no-feature helper"
    )
    assert _refused(group, features=["helper2", "helper"]) == (
        "feature helper runs a companion beside its server, which multi_node_tp does not render; "
        "allowed: --no-feature helper"
    )
    assert _refused(group, kv_offload="sidecar") == (
        "KV offload sidecar runs a companion beside its server, which multi_node_tp does not "
        "render; allowed: no --kv-offload, or another option"
    )
    # on one node the same option runs its companion as a second server
    spec = resolve_vllm(group, strategy="single_node_tp", kv_offload="sidecar")
    assert [s.role for s in spec.servers] == ["main", "companion-kv-sidecar"]
    assert spec.requirements.packages == ["sidecar-kv"]
