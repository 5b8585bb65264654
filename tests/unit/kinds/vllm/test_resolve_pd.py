"""A ``pd_cluster`` selection in depth (``resolve.py``'s ``_resolve_pd``), as the mutation
campaign (#37) found most of it held only by the site parity of ``test_pd_roles.py``: each
role's whole argv, env and GPUs on a node of 8 and of 4 (a DEP pool's local ranks follow the
node's GPUs), a variant's own model id, the pools' parallelism as one word or per role, the
router's intra-node DP size, the models both roles name (a draft in one role only), a
feature offered with pd_cluster only, and the
refusals' whole lines (``--tp`` with the pool parallelisms offered, a KV-offload option, a
companion feature, a variant one node cannot hold)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from repo_paths import DATA
from vllm_cases import recipe_from, refused_line

from servefleet.kinds.vllm import load_vllm_recipe, resolve_vllm
from servefleet.kinds.vllm.recipe import VllmRecipe
from servefleet.spec import ServeSpec

# decode names a draft model its prefill does not; fp8 has a model id of its own; huge fits
# an h200 node (1128 GB) but no gb200 node (768 GB)
PD = """\
meta:
  hardware: {h200: verified, gb200: verified}
model:
  model_id: acme/pd-moe
variants:
  default: {vram_minimum_gb: 400}
  fp8: {model_id: acme/pd-moe-fp8, vram_minimum_gb: 200}
  huge: {vram_minimum_gb: 1000.5}
compatible_strategies: [single_node_tp, single_node_tep, single_node_dep, pd_cluster]
features:
  tools: {args: [--enable-auto-tool-choice]}
  pd_only: {strategies: [pd_cluster], args: [--pd-only]}
  helper:
    args: [--helper]
    companion: {label: helper, command: "helper-server --port 9000"}
opt_in_features: [helper]
strategy_overrides:
  pd_cluster:
    decode:
      extra_args: ["--speculative-config", '{"method":"eagle3","model":"acme/draft"}']
"""
DRAFT = json.dumps({"method": "eagle3", "model": "acme/draft"}, separators=(",", ":"))
PRODUCER = (
    '{"kv_connector":"NixlConnector","kv_role":"kv_producer","kv_load_failure_policy":"fail"}'
)
CONSUMER = (
    '{"kv_connector":"NixlConnector","kv_role":"kv_consumer","kv_load_failure_policy":"fail"}'
)
DECODE_HEAD = ["--port", "8002", "--kv-transfer-config", CONSUMER]
DECODE_HEAD += ["--compilation-config", '{"cudagraph_mode":"FULL_DECODE_ONLY"}']


@pytest.fixture(scope="module")
def pd(tmp_path_factory: pytest.TempPathFactory) -> VllmRecipe:
    return recipe_from(tmp_path_factory, "pd.yaml", PD)


def _pd(r: VllmRecipe, **kw: object) -> ServeSpec:
    return resolve_vllm(r, strategy="pd_cluster", **kw)  # type: ignore[arg-type]


def _refused(r: VllmRecipe, **kw: object) -> str:
    return refused_line(_pd, r, **kw)


def _router(decode_port: str, intra: str) -> list[str]:
    return [
        "vllm-router",
        "--policy",
        "round_robin",
        "--vllm-pd-disaggregation",
        "--prefill",
        "http://$PREFILL_NODE_1:8001",
        "--decode",
        f"http://$DECODE_NODE_1:{decode_port}",
        "--host",
        "$ROUTER_HOST",
        "--port",
        "$ROUTER_PORT",
        "--intra-node-data-parallel-size",
        intra,
    ]


def test_both_roles_of_a_tp_pool_on_a_node_of_8(pd: VllmRecipe) -> None:
    spec = _pd(pd)
    prefill, decode = spec.servers
    assert (prefill.role, decode.role) == ("prefill", "decode")
    assert prefill.argv == [
        "vllm",
        "serve",
        "acme/pd-moe",
        *["--port", "8001", "--kv-transfer-config", PRODUCER],
        *["--tensor-parallel-size", "8", "--enable-auto-tool-choice", "--pd-only"],
    ]
    assert decode.argv == [
        "vllm",
        "serve",
        "acme/pd-moe",
        *DECODE_HEAD,
        *["--tensor-parallel-size", "8", "--speculative-config", DRAFT],
        *["--enable-auto-tool-choice", "--pd-only"],
    ]
    gpus = "0,1,2,3,4,5,6,7"
    assert prefill.env == {
        "VLLM_NIXL_SIDE_CHANNEL_PORT": "5557",
        "VLLM_NIXL_SIDE_CHANNEL_HOST": "$PREFILL_NODE_1",
        "CUDA_VISIBLE_DEVICES": gpus,
    }
    assert decode.env == {
        "VLLM_NIXL_SIDE_CHANNEL_PORT": "5558",
        "VLLM_NIXL_SIDE_CHANNEL_HOST": "$DECODE_NODE_1",
        "CUDA_VISIBLE_DEVICES": gpus,
    }
    assert (prefill.npus, decode.npus) == (8, 8)
    assert spec.selection == {
        "hardware": "h200",
        "strategy": "pd_cluster",
        "variant": "default",
        "pool_parallelism": "tp",
        "features": "tools,pd_only",
    }
    assert spec.router == _router("8002", "1")
    assert spec.requirements.models == ["acme/pd-moe", "acme/draft"]
    assert spec.requirements.packages == []
    assert (spec.recipe, spec.kind, spec.nodes) == (pd.name, "vllm", 1)


def test_a_dep_pool_on_a_node_of_4_with_the_variants_model(pd: VllmRecipe) -> None:
    spec = _pd(pd, hardware="gb200", variant="fp8", pool_parallelism="dep")
    prefill, decode = spec.servers

    def dep(role: str) -> list[str]:
        node = role.upper()
        return [
            *["--data-parallel-size", "4", "--data-parallel-size-local", "4"],
            *["--data-parallel-start-rank", "0", "--data-parallel-address", f"${node}_NODE_1"],
            *["--data-parallel-rpc-port", f"${node}_DP_RPC_PORT", "--enable-expert-parallel"],
        ]

    assert prefill.argv == [
        "vllm",
        "serve",
        "acme/pd-moe-fp8",
        *["--port", "8001", "--kv-transfer-config", PRODUCER],
        *dep("prefill"),
        *["--enable-auto-tool-choice", "--pd-only"],
    ]
    assert decode.argv == [
        "vllm",
        "serve",
        "acme/pd-moe-fp8",
        *DECODE_HEAD,
        *dep("decode"),
        *["--speculative-config", DRAFT, "--enable-auto-tool-choice", "--pd-only"],
    ]
    # the NVL4 tray keeps the NVL4-only env on its prefill role
    assert prefill.env["CUDA_VISIBLE_DEVICES"] == decode.env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"
    assert prefill.env["NCCL_MNNVL_ENABLE"] == "1"
    assert (prefill.npus, decode.npus) == (4, 4)
    assert spec.selection["pool_parallelism"] == "dep"
    assert spec.selection["variant"] == "fp8" and spec.selection["hardware"] == "gb200"
    # the router's intra-node DP size: a DEP pool's local ranks, the node's 4 GPUs
    assert spec.router == _router("8002", "4")
    assert spec.requirements.models == ["acme/pd-moe-fp8", "acme/draft"]


def test_pools_of_two_parallelisms_are_named_per_role() -> None:
    r = load_vllm_recipe(DATA / "vllm" / "pd-layers.yaml")
    spec = _pd(r, hardware="h200")
    assert spec.selection["pool_parallelism"] == "prefill=tp,decode=dep"
    assert [s.role for s in spec.servers] == ["prefill", "decode"]
    # decode's DEP pool: tp 2, so 8 / 2 = 4 local ranks, the router's intra-node DP size
    assert spec.router[-2:] == ["--intra-node-data-parallel-size", "4"]
    assert spec.servers[1].npus == 8


def test_features_and_no_features_reach_both_roles(pd: VllmRecipe) -> None:
    spec = _pd(pd, no_features=["tools"])
    assert spec.selection["features"] == "pd_only"
    assert all("--enable-auto-tool-choice" not in s.argv for s in spec.servers)
    assert all(s.argv[-1] == "--pd-only" for s in spec.servers)


def test_the_pd_refusals_in_one_line(pd: VllmRecipe) -> None:
    assert _refused(pd, tp=2) == (
        "--tp sizes a single-node strategy; pd_cluster's pools take every GPU of their node "
        "(pool parallelism: tp, tep, dep)"
    )
    assert _refused(pd, kv_offload="simple") == (
        "KV offload simple is not offered here: not with strategy pd_cluster (it sets "
        "--kv-transfer-config itself) (options here: none)"
    )
    assert _refused(pd, hardware="gb200", kv_offload="offloading_cpu") == (
        "KV offload offloading_cpu is not offered here: not with strategy pd_cluster (it sets "
        "--kv-transfer-config itself) (options here: none)"
    )
    assert _refused(pd, features=["helper"]) == (
        "feature helper runs a companion beside its server, which pd_cluster does not render; "
        "allowed: --no-feature helper"
    )
    assert _refused(pd, variant="huge", hardware="gb200") == (
        "variant huge needs 1000.5 GB (vram_minimum_gb) but one gb200 node has 768 GB "
        "(vram_gb), so a pd_cluster pool of one node cannot hold it; servefleet renders one "
        "node per pool and cannot render pools spanning several nodes yet"
    )
    # the same variant fits an h200 node
    assert _pd(pd, variant="huge", hardware="h200").servers[0].npus == 8


def test_the_models_of_both_roles_once_each_in_order(pd: VllmRecipe) -> None:
    # the base's draft, in one word right after the model, stays on prefill; decode's own
    # --speculative-config replaces it there
    base = '--speculative-config={"method":"eagle3","model":"acme/base-draft"}'
    r = replace(pd, data={**pd.data, "model": {**pd.data["model"], "base_args": [base]}})
    spec = _pd(r)
    assert spec.servers[0].argv[3] == base and base not in spec.servers[1].argv
    assert spec.requirements.models == ["acme/pd-moe", "acme/base-draft", "acme/draft"]
    assert _pd(r, variant="fp8").requirements.models == [
        "acme/pd-moe-fp8",
        "acme/base-draft",
        "acme/draft",
    ]
