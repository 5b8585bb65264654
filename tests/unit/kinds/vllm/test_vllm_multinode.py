"""vLLM's multi-node strategies resolve to a group (issue 34, resolution): one server per rank,
each with its argv and env, as vLLM's recipes site builds them.

Held to the site: every ``multi_node`` entry of the site's own output for the recipes in shared/
(``shared/recipes/vllm-yaml/expected/commands.json``) is resolved and each rank's argv and env
compared with the site's ``head_argv``/``worker_argvs`` and ``env`` (flags as vLLM's parser
reads them: order aside). Then the shapes the site's recipes do not reach (``tp_dp``, a DEP
node's local ranks from the recipe, more nodes than the floor), the refusals (too few nodes, a
strategy the hardware lacks, hardware that does not scale out, ``--tp``, a companion), the
binding of ``$HEAD_IP`` and ``$IFACE_NAME``, the CLI's JSON, the deploy path (still refused)
and the RBLN kind (untouched).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from site_commands import (
    EXPECTED,
    SITE,
    argv_units,
    feature_names,
    resolve_entry,
    site_entries,
    site_key,
)

from servefleet.base.errors import RecipeError
from servefleet.entry.cli import main
from servefleet.hostplan.extras import resolve_for
from servefleet.kinds.roles import bind_group, group_values, is_host, placeholders, shell_word
from servefleet.kinds.vllm import load_vllm_recipe, resolve_vllm
from servefleet.kinds.vllm.hardware import MAX_NODES
from servefleet.kinds.vllm.multinode import node_floor
from servefleet.settings.table import load_defaults, settings_from
from servefleet.spec import Requirements, Server, ServeSpec

SHIPPED = "vllm/openai/gpt-oss-120b"
CREDS = {"RBLN_INDEX_USER": "u", "RBLN_INDEX_PASSWORD": "p"}
IFACE = {"GLOO_SOCKET_IFNAME": "$IFACE_NAME", "NCCL_SOCKET_IFNAME": "$IFACE_NAME"}

# A recipe the site's collection does not have: every multi-node shape, a DEP floor of 32 GPUs,
# a variant needing 2 h200 nodes of memory, a strategy one GPU lacks, a workstation.
GROUP = """
meta:
  title: Group fixture
  hardware: {h200: verified, gb200: verified, b300: verified, dgx_station_gb300: verified}
model:
  model_id: acme/moe-1t
  base_args: [--trust-remote-code]
variants:
  default: {vram_minimum_gb: 1800}
  small: {model_id: acme/moe-1t-small, vram_minimum_gb: 100}
  huge: {model_id: acme/moe-1t-huge, vram_minimum_gb: 3000}
compatible_strategies: [single_node_tp, multi_node_tp, multi_node_tp_pp, multi_node_tp_dp,
  multi_node_tep, multi_node_dep]
strategy_min_gpus: {multi_node_dep: 32}
strategy_hardware:
  multi_node_tp: {gb200: unsupported}
"""


def _group(tmp_path: Path, extra: str = "") -> Any:
    path = tmp_path / "group.yaml"
    path.write_text(GROUP + extra)
    return load_vllm_recipe(path)


def _refused(r: Any, **kw: Any) -> str:
    with pytest.raises(RecipeError) as err:
        resolve_vllm(r, **kw)
    msg = str(err.value)
    assert msg and "\n" not in msg and "Traceback" not in msg
    return msg


def _tail(server: Server) -> list[str]:
    return server.argv[3:]


# ---------------------------------------------------------------------------------------------
# Held to the site: every multi_node entry of commands.json


@pytest.mark.skipif(not EXPECTED.is_file(), reason=f"no {EXPECTED} beside the repository")
def test_every_multi_node_selection_matches_the_site() -> None:
    entries = site_entries("multi_node")
    assert len(entries) == 244
    differences = []
    for e in entries:
        key = site_key(e)
        try:
            spec = resolve_entry(e)
        except RecipeError as err:
            differences.append(f"{key}: refused: {err}")
            continue
        site = [e["head_argv"], *e["worker_argvs"]]
        if spec.nodes != e["nodes"] or len(spec.servers) != len(site):
            differences.append(f"{key}: {spec.nodes} nodes, {len(spec.servers)} servers")
            continue
        ours = feature_names(spec)
        if ours != e["features"]:
            differences.append(f"{key}: features {ours} != {e['features']}")
        for rank, (server, argv) in enumerate(zip(spec.servers, site, strict=True)):
            if server.rank != rank or server.role != "main":
                differences.append(f"{key}: server {rank} is {server.role} rank {server.rank}")
            if argv_units(server.argv) != argv_units(argv):
                differences.append(f"{key} rank {rank}: argv {server.argv} != {argv}")
            if server.env != e["env"]:
                differences.append(f"{key} rank {rank}: env {server.env} != {e['env']}")
    assert differences == []
    strategies = {e["strategy"] for e in entries}
    assert strategies == {"multi_node_tp", "multi_node_tp_pp", "multi_node_tep", "multi_node_dep"}


@pytest.mark.skipif(not EXPECTED.is_file(), reason=f"no {EXPECTED} beside the repository")
def test_a_site_group_rank_by_rank() -> None:
    """DeepSeek-V3.2 on h200 (the issue's lab case): TP 8 within a node, PP over 2 nodes."""
    r = load_vllm_recipe(SITE / "models" / "deepseek-ai" / "DeepSeek-V3.2.yaml")
    spec = resolve_vllm(r, hardware="h200", strategy="multi_node_tp_pp")
    head, worker = spec.servers
    rendezvous = ["--nnodes", "2", "--node-rank", "0", "--master-addr", "$HEAD_IP"]
    sized = ["--tensor-parallel-size", "8", "--pipeline-parallel-size", "2"]
    assert _tail(head)[2:10] == [*sized, *rendezvous[:4]]
    assert argv_units(worker.argv)[1] == {
        **argv_units(head.argv)[1],
        "--node-rank": "1",
        "--headless": None,
    }
    assert head.npus == worker.npus == 8 and head.env == worker.env == IFACE
    assert spec.requirements.models == ["deepseek-ai/DeepSeek-V3.2"]
    assert placeholders(spec) == ["HEAD_IP", "IFACE_NAME"]


@pytest.mark.skipif(not EXPECTED.is_file(), reason=f"no {EXPECTED} beside the repository")
def test_what_a_single_node_refusal_names_resolves() -> None:
    """A variant too big for one node names the multi-node strategies that fit and their nodes:
    each resolves to that many ranks."""
    r = load_vllm_recipe(SITE / "models" / "deepseek-ai" / "DeepSeek-V3.2.yaml")
    msg = _refused(r, hardware="h100", strategy="single_node_tp")
    assert "multi-node strategies that fit: multi_node_tp (2 nodes)" in msg
    assert resolve_vllm(r, hardware="h100", strategy="multi_node_tp").nodes == 2


# ---------------------------------------------------------------------------------------------
# The shapes, and the node count


def test_tp_dp_one_replica_per_node(tmp_path: Path) -> None:
    r = _group(tmp_path)
    spec = resolve_vllm(r, hardware="h200", strategy="multi_node_tp_dp", nodes=3)
    base = ["--trust-remote-code", "--tensor-parallel-size", "8", "--data-parallel-size", "3"]
    base += ["--data-parallel-size-local", "1", "--data-parallel-address", "$HEAD_IP"]
    assert [_tail(s) for s in spec.servers] == [
        base,
        [*base, "--data-parallel-start-rank", "1"],
        [*base, "--data-parallel-start-rank", "2"],
    ]
    assert [s.npus for s in spec.servers] == [8, 8, 8]
    assert not any("--headless" in s.argv for s in spec.servers)


def test_tp_and_tep_span_every_gpu_of_the_group(tmp_path: Path) -> None:
    r = _group(tmp_path)
    spec = resolve_vllm(r, hardware="b300", strategy="multi_node_tep", nodes=4)
    for rank, server in enumerate(spec.servers):
        flags = argv_units(server.argv)[1]
        assert flags["--enable-expert-parallel"] is None
        assert flags["--tensor-parallel-size"] == "32" and flags["--nnodes"] == "4"
        assert flags["--node-rank"] == str(rank) and flags["--master-addr"] == "$HEAD_IP"
        assert ("--headless" in flags) == (rank > 0) and server.npus == 8


def test_dep_nodes_start_at_their_first_rank(tmp_path: Path) -> None:
    r = _group(tmp_path)
    spec = resolve_vllm(r, hardware="h200", strategy="multi_node_dep", variant="small")
    assert spec.nodes == node_floor(r, "small", "multi_node_dep", "h200") == 4  # 32 GPUs / 8
    starts = [argv_units(s.argv)[1].get("--data-parallel-start-rank") for s in spec.servers]
    assert starts == [None, "8", "16", "24"]
    for server in spec.servers:  # every DEP node serves HTTP (hybrid load balancing)
        flags = argv_units(server.argv)[1]
        assert "--headless" not in flags and flags["--data-parallel-size"] == "32"
        assert flags["--data-parallel-size-local"] == "8" and server.npus == 8
    grown = resolve_vllm(r, hardware="h200", strategy="multi_node_dep", variant="small", nodes=6)
    assert argv_units(grown.servers[5].argv)[1]["--data-parallel-start-rank"] == "40"
    assert argv_units(grown.servers[0].argv)[1]["--data-parallel-size"] == "48"


def test_a_dep_nodes_local_ranks_come_from_the_recipe(tmp_path: Path) -> None:
    """The recipe's --data-parallel-size-local for the strategy offsets each node's first rank
    (the site's dp_local); a data-parallel size the nodes' local ranks do not add up to is
    refused (vLLM would wait for ranks no node starts)."""
    extra = (
        "strategy_overrides:\n  multi_node_dep:\n    extra_args: [--data-parallel-size-local, '4', "
        "'--tensor-parallel-size 2', --data-parallel-size, '16']\n"
    )
    r = _group(tmp_path, extra)
    spec = resolve_vllm(r, hardware="h200", strategy="multi_node_dep", variant="small")
    starts = [argv_units(s.argv)[1].get("--data-parallel-start-rank") for s in spec.servers]
    assert starts == [None, "4", "8", "12"] and [s.npus for s in spec.servers] == [8] * 4
    msg = _refused(r, hardware="h200", strategy="multi_node_dep", variant="small", nodes=5)
    assert "asks for 16 data-parallel ranks but 5 nodes of --data-parallel-size-local 4" in msg


def test_the_floor_grows_with_the_variants_memory(tmp_path: Path) -> None:
    r = _group(tmp_path)
    assert resolve_vllm(r, hardware="h200", strategy="multi_node_tp").nodes == 2  # 1800 / 1128
    huge = resolve_vllm(r, hardware="h200", strategy="multi_node_tp", variant="huge")
    assert huge.nodes == 3  # 3000 GB at 1128 GB a node
    msg = _refused(r, hardware="h200", strategy="multi_node_tp", variant="huge", nodes=2)
    assert "a node count of 2 for multi_node_tp on h200, which takes at least 3" in msg
    assert "huge's 3000 GB (vram_minimum_gb) at 1128 GB a node: 3 nodes" in msg
    assert msg.endswith("allowed: 3..16")


# ---------------------------------------------------------------------------------------------
# Refusals, one line each


@pytest.mark.parametrize(
    ("kw", "needle"),
    [
        # too few nodes: the message names the floor
        ({"nodes": 1}, "a node count of 1 for multi_node_tp on h200, which takes at least 2"),
        ({"strategy": "multi_node_dep", "nodes": 3}, "takes at least 4 (a group has 2 nodes"),
        ({"strategy": "multi_node_dep", "nodes": 3}, "strategy_min_gpus 32 at 8 GPUs a node"),
        ({"nodes": MAX_NODES + 1}, f"at most the recipes site's {MAX_NODES}; allowed: 2..16"),
        ({"nodes": "3"}, "a node count of '3'"),
        ({"nodes": True}, "a node count of 'True'"),
        # a multi-node strategy on hardware that lacks it (strategy_hardware: unsupported)
        ({"hardware": "gb200"}, "strategy not compatible: 'multi_node_tp' on gb200"),
        # hardware that does not scale out
        (
            {"hardware": "dgx_station_gb300", "variant": "small"},
            "dgx_station_gb300 does not scale out (scalable: false), so multi_node_tp cannot",
        ),
        ({"tp": 8}, "--tp sizes a single-node strategy; multi_node_tp takes every GPU"),
        ({"strategy": "single_node_tp", "variant": "small", "nodes": 2}, "runs on one node"),
        ({"strategy": "single_node_tp", "variant": "small", "nodes": 2}, "multi_node_dep)"),
    ],
)
def test_a_group_is_refused_in_one_line(tmp_path: Path, kw: dict[str, Any], needle: str) -> None:
    sel = {"hardware": "h200", "strategy": "multi_node_tp", **kw}
    assert needle in _refused(_group(tmp_path), **sel)


def test_a_strategy_the_recipe_lacks_is_refused() -> None:
    r = load_vllm_recipe(Path(SITE / "models" / "Qwen" / "Qwen3.8-27B.yaml"))  # dense: no TP>8
    msg = _refused(r, hardware="gb300", strategy="multi_node_tp")
    assert "strategy not compatible: 'multi_node_tp' on gb300" in msg


def test_a_companion_beside_a_rank_is_refused(tmp_path: Path) -> None:
    extra = (
        "features:\n  sidecar:\n    description: x\n    args: [--x-sidecar]\n"
        "    companion: {label: S, command: 'sidecar --port 9'}\n"
    )
    r = _group(tmp_path, extra)
    msg = _refused(r, hardware="h200", strategy="multi_node_tp")
    assert "feature sidecar runs a companion beside its server, which multi_node_tp" in msg
    assert "allowed: --no-feature sidecar" in msg
    spec = resolve_vllm(r, hardware="h200", strategy="multi_node_tp", no_features=["sidecar"])
    assert [s.role for s in spec.servers] == ["main", "main"]


# ---------------------------------------------------------------------------------------------
# The spec: ranks only in a group; its JSON unchanged for one node


def test_one_nodes_json_shows_no_ranks(tmp_path: Path) -> None:
    r = _group(tmp_path)
    one = resolve_vllm(r, hardware="h200", strategy="single_node_tp", variant="small").to_json()
    assert "nodes" not in one and all(
        set(s) == {"role", "argv", "env", "npus"} for s in one["servers"]
    )
    group = resolve_vllm(r, hardware="h200", strategy="multi_node_tp").to_json()
    assert list(group)[:4] == ["recipe", "kind", "selection", "nodes"] and group["nodes"] == 2
    assert [list(s)[:2] for s in group["servers"]] == [["role", "rank"]] * 2
    assert [s["rank"] for s in group["servers"]] == [0, 1]


@pytest.mark.parametrize(
    ("nodes", "ranks", "needle"),
    [
        (2, [0, 0], "ranks [0, 0] are not one per node of 2; allowed: 0, 1"),
        (2, [0], "ranks [0] are not one per node of 2"),
        (1, [1], "ranks [1] are not one per node of 1"),
        (0, [0], "nodes '0' is not a node count; allowed: 1 or more"),
    ],
)
def test_a_spec_whose_ranks_are_not_its_nodes_is_refused(
    nodes: int, ranks: list[int], needle: str
) -> None:
    servers = [Server("main", ["vllm", "serve", "m"], {}, 1, rank) for rank in ranks]
    with pytest.raises(RecipeError, match="x: the servers' |x: nodes") as err:
        ServeSpec("x", "vllm", {}, servers, Requirements(), nodes=nodes)
    assert needle in str(err.value)


def test_a_bad_word_names_its_rank(tmp_path: Path) -> None:
    servers = [
        Server("main", ["vllm", "serve", "m"], {}, 1, 0),
        Server("main", ["vllm", "serve", "m", "a --b"], {}, 1, 1),
    ]
    with pytest.raises(RecipeError, match=r"the main server \(rank 1\): argv\[3\]"):
        ServeSpec("x", "vllm", {}, servers, Requirements(), nodes=2)


# ---------------------------------------------------------------------------------------------
# Binding $HEAD_IP and $IFACE_NAME (a host plan's, at plan time)


def test_a_group_binds_rank_0s_address_and_the_interface(tmp_path: Path) -> None:
    spec = resolve_vllm(
        _group(tmp_path), hardware="h200", strategy="multi_node_dep", variant="small"
    )
    bound = bind_group(spec, "10.0.0.5", "ens5f0np0")
    assert placeholders(bound) == [] and bound.nodes == 4
    for server in bound.servers:
        assert argv_units(server.argv)[1]["--data-parallel-address"] == "10.0.0.5"
        assert server.env == {"GLOO_SOCKET_IFNAME": "ens5f0np0", "NCCL_SOCKET_IFNAME": "ens5f0np0"}
    assert [s.rank for s in bound.servers] == [0, 1, 2, 3]
    tp = resolve_vllm(_group(tmp_path), hardware="h200", strategy="multi_node_tp")
    for head in ("fd00::5", "head-0.lab", "gpu7"):
        argv = bind_group(tp, head, "eth0").servers[1].argv
        assert argv[argv.index("--master-addr") + 1] == head
    one = resolve_vllm(
        _group(tmp_path), hardware="h200", strategy="single_node_tp", variant="small"
    )
    assert bind_group(one, "10.0.0.5", "eth0") == one  # nothing to bind


@pytest.mark.parametrize(
    ("head", "iface", "needle"),
    [
        ("10.0.0.300", "eth0", "$HEAD_IP='10.0.0.300' is not an address or host name"),
        ("[fd00::5]", "eth0", "$HEAD_IP='[fd00::5]' is not an address"),
        ("head; reboot", "eth0", "$HEAD_IP='head; reboot' is not an address"),
        ("-head", "eth0", "$HEAD_IP='-head' is not"),
        ("", "eth0", "$HEAD_IP='' is not"),
        ("10.0.0.5", "eth 0", "$IFACE_NAME='eth 0' is not an interface name"),
        ("10.0.0.5", "e" * 16, "is not an interface name; allowed: an interface name: 1-15"),
        ("10.0.0.5", "eth/0", "$IFACE_NAME='eth/0' is not an interface name"),
        ("10.0.0.5", "", "$IFACE_NAME='' is not"),
    ],
)
def test_a_bad_binding_is_refused(head: str, iface: str, needle: str) -> None:
    with pytest.raises(RecipeError) as err:
        group_values(head, iface)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_hosts() -> None:
    assert all(is_host(h) for h in ("10.1.2.3", "::1", "fe80::1%eth0", "a", "a-b.c.", "x1.lab"))
    assert not any(is_host(h) for h in ("1.2.3.4.5", "a_b", "a..b", "a" * 64, "[::1]", "a b"))


def test_the_shell_form_leaves_the_placeholders_to_the_shell() -> None:
    assert shell_word("$HEAD_IP") == "$HEAD_IP" and shell_word("$IFACE_NAME") == "$IFACE_NAME"
    assert shell_word("$HEAD_IPX") == "'$HEAD_IPX'"


# ---------------------------------------------------------------------------------------------
# The CLI, the deploy path, the RBLN kind


def test_resolve_shows_every_rank_as_json() -> None:
    args = ["resolve", SHIPPED, "--hardware", "h200", "--strategy", "multi_node_tp"]
    result = CliRunner().invoke(main, [*args, "--format", "json"])
    assert result.exit_code == 0, result.output
    spec = json.loads(result.output)
    assert spec["nodes"] == 2 and [s["rank"] for s in spec["servers"]] == [0, 1]
    head, worker = (argv_units(s["argv"])[1] for s in spec["servers"])
    assert head["--tensor-parallel-size"] == worker["--tensor-parallel-size"] == "16"
    assert "--headless" not in head and worker["--headless"] is None
    shell = CliRunner().invoke(main, [*args, "--format", "shell"])
    assert shell.exit_code == 0 and shell.output.count("vllm serve openai/gpt-oss-120b") == 2
    assert "--master-addr $HEAD_IP" in shell.output and "=$IFACE_NAME " in shell.output


def test_the_deploy_path_resolves_a_group_and_a_host_plan_without_one_refuses_it() -> None:
    from servefleet.base.errors import DataError
    from servefleet.hostplan.plan import plan_host

    data = load_defaults()
    data.update(serve_recipe=SHIPPED, serve_hardware="h200", serve_strategy="multi_node_tp",
                serve_nodes=3)  # fmt: skip
    spec = resolve_for(settings_from(data.get, CREDS))
    assert spec.nodes == 3 and [s.rank for s in spec.servers] == [0, 1, 2]
    data.update(serve_nodes=None)
    s = settings_from(data.get, CREDS)
    with pytest.raises(DataError) as err:
        plan_host(s, {"gpus": [], "pci": []})
    msg = str(err.value)
    assert "serve_strategy: 'multi_node_tp' of" in msg and "spans 2 hosts" in msg
    assert "allowed: the same serve_group on 2 hosts" in msg and "\n" not in msg


def test_the_rbln_kind_is_untouched() -> None:
    """An RBLN card resolves to one node as before: no node count, no ranks, and nothing to
    bind; its options take no node count."""
    from servefleet.kinds import find

    source, path = find("rbln/gpt-oss-120b")
    assert "--nodes" not in [getattr(o, "flag", o) for o in source.options]
    result = CliRunner().invoke(main, ["resolve", "rbln/gpt-oss-120b", "--format", "json"])
    assert result.exit_code == 0, result.output
    spec = json.loads(result.output)
    assert "nodes" not in spec and all("rank" not in s for s in spec["servers"])
    resolved = source.resolve(path, "rbln/gpt-oss-120b", None, {})
    assert resolved.nodes == 1 and {s.rank for s in resolved.servers} == {0}
    assert bind_group(resolved, "10.0.0.5", "eth0") == resolved
