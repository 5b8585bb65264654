"""Prefill/decode roles at resolve time (issue 21, the resolve side).

vLLM recipes: every ``pd_cluster`` entry the recipes site builds for the recipes in shared/
(``shared/recipes/vllm-yaml/expected/commands.json``) resolves to the site's prefill and decode
argv (by each flag's last value) and env (exactly), and its router command; the layers the shared
recipes do not exercise are in tests/data/vllm/pd-layers.yaml. RBLN cards: the P/D card written
for these tests (tests/data/rbln/gpt-oss-120b-pd.json) resolves to two roles and a router; the
card fields the resolver does not use yet are refused in one line. Placeholders stay symbolic;
``roles.bind`` fills them; a deploy refuses what it cannot place yet.
"""

from __future__ import annotations

import copy
import json
import shlex
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from repo_paths import REPO
from site_commands import EXPECTED, SITE, argv_units

from servefleet.base.errors import RecipeError
from servefleet.entry.cli import main
from servefleet.hostplan.extras import resolve_for
from servefleet.kinds.rbln.card import load_card
from servefleet.kinds.rbln.card_checks import card_from_dict
from servefleet.kinds.rbln.resolve import resolve_rbln
from servefleet.kinds.roles import bind, placeholders, serving_roles, shell_word
from servefleet.kinds.vllm import describe_vllm, load_vllm_recipe, resolve_vllm
from servefleet.kinds.vllm.pd import pool_modes
from servefleet.settings.table import load_defaults, settings_from

DATA = REPO / "tests" / "data"
PD_CARD = DATA / "rbln" / "gpt-oss-120b-pd.json"
SEED = REPO / "src" / "servefleet" / "_files" / "recipes" / "rbln" / "gpt-oss-120b.json"
LAYERS = DATA / "vllm" / "pd-layers.yaml"
CREDS = {"RBLN_INDEX_USER": "u", "RBLN_INDEX_PASSWORD": "p"}
COMPILER = "0.12.0"


def run(*args: str) -> Any:
    return CliRunner().invoke(main, list(args))


def _refused(fn: Any, *args: Any, **kw: Any) -> str:
    with pytest.raises(RecipeError) as err:
        fn(*args, **kw)
    msg = str(err.value)
    assert msg and "\n" not in msg and "Traceback" not in msg
    return msg


# ---------------------------------------------------------------------------------------------
# vLLM: every pd_cluster entry of the site's own output

# Selections servefleet refuses on purpose: a pool of one node cannot hold the variant (the
# same selections whose single-node commands the parity test refuses), and the site prints a
# pool of one node for them all the same.
PD_REFUSED = {
    ("deepseek-ai/DeepSeek-V3.2", "h100", "default", pool): "needs 805 GB (vram_minimum_gb) but "
    "one h100 node has 640 GB (vram_gb)"
    for pool in ("tp", "tep", "dep")
} | {
    ("zai-org/GLM-5.2", gpu, "bf16", pool): f"needs 1786 GB (vram_minimum_gb) but one {gpu} node "
    f"has {have} GB (vram_gb)"
    for gpu, have in (("b200", 1440), ("mi300x", 1536))
    for pool in ("tp", "tep", "dep")
}


def _pd_entries() -> list[dict[str, Any]]:
    return [e for e in json.loads(EXPECTED.read_text()) if e["deploy_type"] == "pd_cluster"]


def _router_words(command: str) -> list[str]:
    return shlex.split(command.replace("\\\n", " "))


@pytest.mark.skipif(not EXPECTED.is_file(), reason=f"no {EXPECTED} beside the repository")
def test_every_pd_cluster_selection_matches_the_site() -> None:
    entries = _pd_entries()
    assert len(entries) == 39
    differences, refused = [], {}
    for e in entries:
        key = (e["recipe"], e["hardware"], e["variant"], e["pool_parallelism"])
        r = load_vllm_recipe(SITE / "models" / f"{e['recipe']}.yaml")
        try:
            spec = resolve_vllm(
                r,
                hardware=e["hardware"],
                strategy="pd_cluster",
                variant=e["variant"],
                pool_parallelism=e["pool_parallelism"],
            )
        except RecipeError as err:
            refused[key] = str(err)
            continue
        assert [s.role for s in spec.servers] == ["prefill", "decode"]
        assert spec.selection["pool_parallelism"] == e["pool_parallelism"]
        ours = [f.partition("=")[0] for f in spec.selection["features"].split(",") if f]
        if ours != e["features"]:
            differences.append(f"{key}: features {ours} != {e['features']}")
        for server in spec.servers:
            site = e[server.role]
            if argv_units(server.argv) != argv_units(site["argv"]):
                differences.append(f"{key} {server.role}: argv {server.argv} != {site['argv']}")
            if server.env != site["env"]:
                differences.append(f"{key} {server.role}: env {server.env} != {site['env']}")
        if spec.router != _router_words(e["router_command"]):
            differences.append(f"{key}: router {spec.router} != {e['router_command']!r}")
    assert differences == []
    assert set(refused) == set(PD_REFUSED), "refused: " + "; ".join(refused.values())
    for key, reason in PD_REFUSED.items():
        assert reason in refused[key] and "pool of one node cannot hold it" in refused[key]
    assert len(entries) - len(refused) == 30


@pytest.mark.skipif(not EXPECTED.is_file(), reason=f"no {EXPECTED} beside the repository")
def test_placeholders_stay_symbolic_as_the_site_prints_them() -> None:
    r = load_vllm_recipe(SITE / "models" / "deepseek-ai" / "DeepSeek-V3.2.yaml")
    spec = resolve_vllm(r, hardware="h200", strategy="pd_cluster", pool_parallelism="dep")
    prefill, decode = spec.servers
    assert prefill.env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "$PREFILL_NODE_1"
    assert decode.env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "$DECODE_NODE_1"
    assert (
        prefill.argv[prefill.argv.index("--data-parallel-rpc-port") + 1] == "$PREFILL_DP_RPC_PORT"
    )
    assert placeholders(spec) == [
        "DECODE_DP_RPC_PORT",
        "DECODE_NODE_1",
        "PREFILL_DP_RPC_PORT",
        "PREFILL_NODE_1",
        "ROUTER_HOST",
        "ROUTER_PORT",
    ]
    assert spec.router[-2:] == ["--intra-node-data-parallel-size", "8"]


# ---------------------------------------------------------------------------------------------
# vLLM: the pd_cluster layers, on a fixture


def test_pd_layers_per_role() -> None:
    r = load_vllm_recipe(LAYERS)
    assert pool_modes(r) == ["tp", "dep"]  # tep is narrowed away by pool_modes
    shown = describe_vllm(r)["strategy_details"]
    assert shown["pd_cluster"]["pool_parallelism"] == ["tp", "dep"]
    assert "pool_parallelism" not in shown["single_node_tp"]
    spec = resolve_vllm(r, hardware="h200", strategy="pd_cluster")
    prefill, decode = spec.servers
    nixl = '{"kv_connector":"NixlConnector","kv_role":"kv_%s","kv_load_failure_policy":"fail"}'
    model = ["vllm", "serve", "acme/pd-moe", "--trust-remote-code"]
    tools = ["--tool-call-parser", "hermes", "--enable-auto-tool-choice"]
    assert prefill.argv == [
        *model,
        *("--port", "8001", "--kv-transfer-config", nixl % "producer"),
        *("--tensor-parallel-size", "8"),  # its pool: tp, every GPU of the node
        *("--max-num-batched-tokens", "8192"),  # strategy_overrides.pd_cluster.prefill
        *("--kv-cache-dtype", "fp8"),  # the recipe's hopper block
        *tools,  # single_only is for single_node_tp only, helper is opt-in
    ]
    # NCCL_*/UCX_NET_DEVICES of the strategy are for GB200/GB300 only
    assert prefill.env == {
        "FROM_BASE": "1",
        "VLLM_NIXL_SIDE_CHANNEL_PORT": "5557",
        "VLLM_NIXL_SIDE_CHANNEL_HOST": "$PREFILL_NODE_1",
        "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7",
        "FROM_SO": "1",
        "ROLE_ENV": "prefill",
    }
    assert decode.argv == [
        *model,
        *("--kv-transfer-config", nixl % "consumer"),
        *("--compilation-config", '{"cudagraph_mode":"FULL_DECODE_ONLY"}'),
        *("--tensor-parallel-size", "2", "--data-parallel-size", "4"),  # dep with tp 2
        *("--data-parallel-size-local", "4", "--data-parallel-start-rank", "0"),
        *("--data-parallel-address", "$DECODE_NODE_1"),
        *("--data-parallel-rpc-port", "$DECODE_DP_RPC_PORT", "--enable-expert-parallel"),
        *("--port", "8102"),  # the role's extra_args move it (the last --port wins)
        *("--kv-cache-dtype", "fp8"),
        *("--max-num-seqs", "64"),  # the role's exact-GPU block
        *tools,
    ]
    assert decode.env == {
        "FROM_BASE": "1",
        "VLLM_NIXL_SIDE_CHANNEL_PORT": "5558",
        "VLLM_NIXL_SIDE_CHANNEL_HOST": "$DECODE_NODE_1",
        "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7",
        "FROM_SO": "1",
        "ROLE_GPU": "decode-h200",
    }
    assert prefill.npus == decode.npus == 8
    assert spec.selection["pool_parallelism"] == "prefill=tp,decode=dep"
    assert spec.router == [
        *("vllm-router", "--policy", "round_robin", "--vllm-pd-disaggregation"),
        *("--prefill", "http://$PREFILL_NODE_1:8001", "--decode", "http://$DECODE_NODE_1:8102"),
        *("--host", "$ROUTER_HOST", "--port", "$ROUTER_PORT"),
        *("--intra-node-data-parallel-size", "4"),  # the DEP pool's local ranks (8 / tp 2)
    ]
    assert spec.requirements.models == ["acme/pd-moe"]


def test_pd_layers_on_gb200_and_a_chosen_pool() -> None:
    r = load_vllm_recipe(LAYERS)
    gb = resolve_vllm(r, hardware="gb200", strategy="pd_cluster")
    prefill, decode = gb.servers
    assert {k: prefill.env[k] for k in ("NCCL_CUMEM_ENABLE", "UCX_NET_DEVICES")} == {
        "NCCL_CUMEM_ENABLE": "1",
        "UCX_NET_DEVICES": "all",
    }
    assert prefill.env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"
    assert "--kv-cache-dtype" not in prefill.argv and "ROLE_GPU" not in decode.env
    assert gb.router[-1] == "2"  # 4 GPUs / tp 2
    both_tp = resolve_vllm(r, hardware="h200", strategy="pd_cluster", pool_parallelism="tp")
    decode_tp = both_tp.servers[1]
    assert argv_units(decode_tp.argv)[1]["--tensor-parallel-size"] == "8"
    assert "--data-parallel-size" not in decode_tp.argv
    assert both_tp.selection["pool_parallelism"] == "tp" and both_tp.router[-1] == "1"


def test_pd_refusals_are_one_line() -> None:
    r = load_vllm_recipe(LAYERS)
    pd = {"hardware": "h200", "strategy": "pd_cluster"}
    msg = _refused(resolve_vllm, r, pool_parallelism="tep", **pd)
    assert "pool parallelism 'tep' is not offered" in msg and "(allowed: tp, dep)" in msg
    msg = _refused(resolve_vllm, r, hardware="h200", pool_parallelism="dep")
    assert "only a pd_cluster strategy has pools" in msg
    msg = _refused(resolve_vllm, r, tp=4, **pd)
    assert "--tp sizes a single-node strategy" in msg and "tp, dep" in msg
    msg = _refused(resolve_vllm, r, kv_offload="offloading_cpu", **pd)
    assert "not with strategy pd_cluster" in msg
    msg = _refused(resolve_vllm, r, features=["helper"], **pd)
    assert "feature helper runs a companion" in msg and "--no-feature helper" in msg
    bad_router = replace(
        r,
        strategies={
            **r.strategies,
            "pd_cluster": {**r.strategies["pd_cluster"], "router": {"policy": "nope"}},
        },
    )
    msg = _refused(resolve_vllm, bad_router, **pd)
    assert "router.policy 'nope'" in msg and "round_robin" in msg and "cache_aware" in msg


def test_the_router_override_of_a_recipe(tmp_path: Path) -> None:
    import yaml

    data = yaml.safe_load(LAYERS.read_text())
    for value, expect in ((3, "3"), ("x", None), (0, None)):
        data["strategy_overrides"]["pd_cluster"]["router"] = {
            "intra_node_data_parallel_size": value
        }
        path = tmp_path / f"pd-{value}.yaml"
        path.write_text(yaml.safe_dump(data))
        r = load_vllm_recipe(path)
        if expect is None:
            msg = _refused(resolve_vllm, r, hardware="h200", strategy="pd_cluster")
            assert "intra_node_data_parallel_size" in msg and "positive whole number" in msg
        else:
            spec = resolve_vllm(r, hardware="h200", strategy="pd_cluster")
            assert spec.router[-1] == expect


# ---------------------------------------------------------------------------------------------
# The RBLN P/D card written for these tests


def test_the_test_card_says_it_is_made_for_tests() -> None:
    raw = json.loads(PD_CARD.read_text())
    assert raw["made_for"] == "servefleet tests"
    assert (
        raw["text"].startswith("MADE FOR SERVEFLEET'S TESTS")
        and "not a Rebellions recipe" in raw["text"]
    )


def test_the_pd_card_resolves_to_two_roles_and_a_router() -> None:
    card = load_card(PD_CARD)
    spec = resolve_rbln(card, compiler_version=COMPILER)
    assert serving_roles(spec) == ["prefill", "decode"]
    prefill, decode = spec.servers
    for server, kv_role, port, side, node in (
        (prefill, "kv_producer", "8001", "5557", "$PREFILL_NODE_1"),
        (decode, "kv_consumer", "8002", "5558", "$DECODE_NODE_1"),
    ):
        argv = server.argv
        assert argv[:3] == ["vllm", "serve", "openai/gpt-oss-120b"]
        kv = json.loads(argv[argv.index("--kv-transfer-config") + 1])
        assert kv == {
            "kv_connector": "RblnNixlConnector",
            "kv_role": kv_role,
            "kv_buffer_device": "cpu",
        }
        assert argv[argv.index("--model-impl") + 1] == "vllm"
        assert argv[argv.index("--port") + 1] == port
        assert server.env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == node
        assert server.env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == side
        assert server.npus == 1
    assert prefill.argv[prefill.argv.index("--max-num-seqs") + 1] == "1"
    assert decode.argv[decode.argv.index("--max-num-seqs") + 1] == "4"
    assert spec.router == [
        *("vllm-router", "--policy", "round_robin", "--vllm-pd-disaggregation"),
        *("--prefill", "http://$PREFILL_NODE_1:8001", "--decode", "http://$DECODE_NODE_1:8002"),
        *("--host", "$ROUTER_HOST", "--port", "$ROUTER_PORT"),
        *("--intra-node-data-parallel-size", "1"),
    ]
    # nixl-rbln comes with vllm-rbln's kv-connectors extra
    assert spec.requirements.vllm_rbln_extras == ["kv-connectors"]
    assert spec.selection == {
        "prefix_caching": "off",
        "tool_calling": "on",
        "target": "Latency",
        "strategy": "pd",
        "sku": "RBLN-CR13",
    }
    # one fingerprint for the pair, moved by the compile inputs of either role
    raw = json.loads(PD_CARD.read_text())
    raw["strategies"][0]["options"][0]["grid"]["base"][1]["args"]["--max-num-seqs"] = (
        "--max-num-seqs 8"
    )
    other = resolve_rbln(card_from_dict(raw, name=card.name), compiler_version=COMPILER)
    assert spec.compile_fingerprint and other.compile_fingerprint != spec.compile_fingerprint
    assert other.servers[0] == spec.servers[0]


def test_the_pd_card_deltas_apply_to_each_role() -> None:
    card = load_card(PD_CARD)
    spec = resolve_rbln(card, sets={"prefix_caching": "on", "tool_calling": "off"})
    for server in spec.servers:
        assert "--no-enable-prefix-caching" not in server.argv
        assert server.env["VLLM_RBLN_SUB_BLOCK_CACHE"] == "0"
        assert "--enable-auto-tool-choice" not in server.argv
        assert "--tool-call-parser" not in server.argv
        assert "--reasoning-parser" in server.argv


def test_resolve_shows_the_roles_as_json_and_shell() -> None:
    out = run("resolve", str(PD_CARD), "--compiler-version", COMPILER)
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output)
    assert [s["role"] for s in doc["servers"]] == ["prefill", "decode"]
    assert doc["router"][0] == "vllm-router"
    shell = run("resolve", str(PD_CARD), "--compiler-version", COMPILER, "--format", "shell")
    assert shell.exit_code == 0, shell.output
    lines = shell.output.splitlines()
    assert lines[0::2] == ["# role: prefill", "# role: decode", "# router"]
    for line, server in zip(lines[1::2], doc["servers"], strict=False):
        words = shlex.split(line)
        n = len(server["env"])
        assert dict(w.split("=", 1) for w in words[:n]) == server["env"]
        assert words[n:] == server["argv"]
    assert shlex.split(lines[5]) == doc["router"]
    unit = run("resolve", str(PD_CARD), "--format", "unit")
    assert (
        unit.exit_code == 2
        and "renders one server; this selection has prefill, decode" in unit.output
    )


def test_shell_lines_leave_placeholders_to_the_shell() -> None:
    assert shell_word("$PREFILL_NODE_1") == "$PREFILL_NODE_1"
    assert shell_word("http://$DECODE_NODE_1:8002") == "http://$DECODE_NODE_1:8002"
    assert shell_word("$HOME and $PREFILL_NODE_1") == "'$HOME and '$PREFILL_NODE_1"
    assert shell_word("a b") == "'a b'"
    shell = run("resolve", str(PD_CARD), "--format", "shell").output.splitlines()
    env = {"PATH": "/usr/bin:/bin", "PREFILL_NODE_1": "10.0.0.5", "DECODE_NODE_1": "10.0.0.6"}
    env |= {"ROUTER_HOST": "0.0.0.0", "ROUTER_PORT": "8080"}
    router = subprocess.run(
        ["sh", "-c", 'printf "%s\\n" ' + shell[5]],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert router[router.index("--prefill") + 1] == "http://10.0.0.5:8001"
    assert router[router.index("--port") + 1] == "8080"
    assignments = shell[1].split(" vllm serve ")[0]
    prefill = subprocess.run(
        ["sh", "-c", f"{assignments} env"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert "VLLM_NIXL_SIDE_CHANNEL_HOST=10.0.0.5" in prefill


def test_the_seed_card_stays_one_role_without_a_router() -> None:
    spec = resolve_rbln(load_card(SEED, name="rbln/gpt-oss-120b"))
    assert serving_roles(spec) == ["main"] and spec.router == []
    assert "router" not in spec.to_json() and placeholders(spec) == []
    # the tiny card's $HOME is its own text, not a placeholder
    tiny = resolve_rbln(load_card(DATA / "rbln" / "tiny-moe.json"))
    assert "$HOME" in tiny.servers[0].env["EXTRA_NOTE"] and placeholders(tiny) == []


# ---------------------------------------------------------------------------------------------
# Card fields refused until they mean something


def _seed() -> dict[str, Any]:
    return json.loads(SEED.read_text())


def _pd() -> dict[str, Any]:
    return json.loads(PD_CARD.read_text())


def _grid(card: dict[str, Any]) -> dict[str, Any]:
    return card["strategies"][0]["options"][0]["grid"]


def _set(where: str, value: Any) -> Any:
    def change(card: dict[str, Any]) -> None:
        target: Any = card
        *path, last = where.split(".")
        for part in path:
            target = target[int(part)] if part.isdigit() else target[part]
        target[last] = value

    return change


CARD_REFUSALS = [
    (_seed, _set("strategies.0.nodes", 2), "strategy aggregated.nodes is set (2) but servefleet "
     "does not use it yet; allowed: null"),
    (_seed, _set("strategies.0.nodes", "two"), "strategy aggregated.nodes 'two' is not a node "
     "count; allowed: null"),
    (_seed, _set("strategies.0.options.0.grid.base.0.ranks", 4), "base[0].ranks is set (4) but "
     "servefleet does not use it yet; allowed: null"),
    (_seed, _set("strategies.0.options.0.grid.base.0.scale", {"min": 1}), "base[0].scale is set "
     "({'min': 1}) but servefleet does not use it yet; allowed: null"),
    (_seed, _set("strategies.0.options.1.grid.base.0.varies", ["npus"]), "base[0].varies is set "
     "(['npus']) but servefleet does not use it yet; allowed: null"),
    (_seed, _set("strategies.0.options.0.grid.router", "nope"), "grid.router 'nope' is not a "
     "router; allowed: null or {\"policy\": round_robin|random|consistent_hash|power_of_two|"
     "cache_aware}"),
    (_pd, _set("strategies.0.options.0.grid.router", {"policy": "fastest"}), "grid.router "
     "{'policy': 'fastest'} is not a router; allowed: null or {\"policy\": round_robin|"),
    (_pd, _set("strategies.0.options.0.grid.router", {"policy": "random", "port": 1}), "is not a "
     "router; allowed: null or"),
    (_seed, _set("strategies.0.options.0.grid.router", {"policy": "random"}), "grid.router is "
     "set on a grid of one role; allowed: null (a router stands in front of the roles prefill "
     "and decode)"),
    (_pd, _set("strategies.0.options.0.grid.base.1.role", "main"), "grid.base has the roles "
     "prefill, main; allowed: one role, or the two roles prefill and decode"),
    (_seed, _set("strategies.0.options.0.grid.base.0.role", "Main Role"), "role 'Main Role' has "
     "characters outside [a-z0-9_-]"),
]  # fmt: skip


@pytest.mark.parametrize(("base", "change", "expect"), CARD_REFUSALS)
def test_card_fields_refused_in_one_line(base: Any, change: Any, expect: str) -> None:
    card = base()
    change(card)
    msg = _refused(card_from_dict, card, name="card")
    assert expect in msg, msg


def test_a_refused_card_is_one_line_from_the_cli(tmp_path: Path) -> None:
    card = _seed()
    card["strategies"][0]["nodes"] = "two"
    _grid(card)["router"] = "nope"
    path = tmp_path / "card.json"
    path.write_text(json.dumps(card))
    out = run("resolve", str(path))
    assert out.exit_code == 2 and isinstance(out.exception, SystemExit)
    lines = out.output.strip().splitlines()
    assert len(lines) == 1 and "nodes 'two'" in lines[0] and "grid.router 'nope'" in lines[0]


def test_null_fields_and_the_seed_card_pass() -> None:
    card = _seed()
    assert card["strategies"][0]["nodes"] is None and _grid(card)["router"] is None
    assert _grid(card)["base"][0]["ranks"] is None
    card_from_dict(card, name="card")


@pytest.mark.parametrize(
    ("role", "kv", "expect"),
    [
        (0, None, "role prefill has no --kv-transfer-config"),
        (0, {"kv_connector": "RblnNixlConnector", "kv_role": "kv_consumer"}, "role prefill has "
         "kv_role 'kv_consumer'; allowed: a --kv-transfer-config naming a kv_connector and "
         "kv_role kv_producer or kv_both"),
        (1, {"kv_role": "kv_consumer"}, "role decode has kv_role 'kv_consumer'"),
        (1, {"kv_connector": "RblnNixlConnector", "kv_role": "kv_producer"}, "kv_role kv_consumer "
         "or kv_both"),
    ],
)  # fmt: skip
def test_a_pd_role_must_hand_its_kv_over(role: int, kv: Any, expect: str) -> None:
    card = _pd()
    args = _grid(card)["base"][role]["args"]
    if kv is None:
        del args["--kv-transfer-config"]
    else:
        args["--kv-transfer-config"] = f"--kv-transfer-config '{json.dumps(kv)}'"
    msg = _refused(resolve_rbln, card_from_dict(card, name="card"))
    assert expect in msg, msg
    both = copy.deepcopy(_pd())
    for r in _grid(both)["base"]:
        r["args"]["--kv-transfer-config"] = (
            '--kv-transfer-config \'{"kv_connector": "RblnNixlConnector", "kv_role": "kv_both"}\''
        )
    assert resolve_rbln(card_from_dict(both, name="card")).router[0] == "vllm-router"


# ---------------------------------------------------------------------------------------------
# Placeholders bound per host; deploys refuse what they cannot place yet


def test_bind_fills_every_placeholder() -> None:
    spec = resolve_rbln(load_card(PD_CARD))
    values = {"PREFILL_NODE_1": "10.0.0.5", "DECODE_NODE_1": "lab2", "ROUTER_HOST": "0.0.0.0"}
    msg = _refused(bind, spec, values)
    assert "no value for $ROUTER_PORT" in msg
    bound = bind(spec, {**values, "ROUTER_PORT": "8080"})
    assert placeholders(bound) == []
    assert bound.servers[0].env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "10.0.0.5"
    assert bound.servers[1].env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "lab2"
    assert bound.router[bound.router.index("--decode") + 1] == "http://lab2:8002"
    assert bound.router[bound.router.index("--port") + 1] == "8080"
    assert spec.servers[0].env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "$PREFILL_NODE_1"  # unchanged
    for bad in ("10.0.0.5; rm -rf /", "a b", "$(id)", ""):
        msg = _refused(bind, spec, {**values, "ROUTER_PORT": bad})
        assert "is not a host, address or port" in msg
    assert bind(spec, {**values, "ROUTER_PORT": "8080", "PREFILL_NODE_1": "[fd00::5]"}).router


def _data(**over: Any) -> Any:
    data = load_defaults()
    data.update(over)
    return settings_from(data.get, CREDS)


def test_a_deploy_places_prefill_and_decode_and_refuses_what_it_cannot() -> None:
    spec = resolve_for(_data(serve_recipe=str(PD_CARD)))  # placed on one host (test_pd_placement)
    assert [x.role for x in spec.servers] == ["prefill", "decode"]
    gpu = _data(
        serve_recipe="vllm/zai-org/GLM-5.2", serve_strategy="pd_cluster", serve_hardware="b200"
    )
    assert [x.role for x in resolve_for(gpu).servers] == ["prefill", "decode"]
    # one role with a placeholder left in it is refused
    card = _seed()
    _grid(card)["base"][0]["envs"]["VLLM_NIXL_SIDE_CHANNEL_HOST"] = (
        "VLLM_NIXL_SIDE_CHANNEL_HOST=$PREFILL_NODE_1"
    )
    from servefleet.kinds.roles import deployable

    spec = resolve_rbln(card_from_dict(card, name="card"))
    msg = _refused(deployable, spec, "x")
    assert "holds $PREFILL_NODE_1, which only a placement of roles on several hosts binds" in msg
    assert resolve_for(_data()).servers[0].role == "main"  # the default data still deploys
