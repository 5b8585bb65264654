"""``resolve_vllm``'s own checks (``resolve.py``), each refusal's whole line with its list of what
is allowed (and ``none`` when nothing is), as the mutation campaign (#37) found the words, the
lists and the bounds held by no unit test: an unknown variant or hardware, hardware the recipe
does not offer, a variant's hardware, ``--tp`` at and past its bounds, a pool parallelism
outside ``pd_cluster``, a task, an unknown or incompatible strategy, a node count for one node,
a multi-node strategy on one host, a variant too big for one node, a strategy short of GPUs.
Also the defaults read from a JSON form's ``recommended_command`` (its variant and hardware), a
strategy's ``parallel_flag`` for ``--tp`` (``--tensor-parallel-size`` when it has none), and
the selection handed on whole to the multi-node and pd_cluster paths."""

from __future__ import annotations

from dataclasses import replace

import pytest
from repo_paths import RECIPES
from vllm_cases import recipe_from, refused_line

from servefleet.kinds.vllm import load_vllm_recipe, resolve_vllm
from servefleet.kinds.vllm.recipe import VllmRecipe

# h100 declared unsupported; nvfp4 runs on Blackwell only; huge fits no h200 node; stranded
# runs on no offered hardware (h100 only)
RICH = """\
meta:
  hardware: {h200: verified, b200: verified, mi300x: verified, h100: unsupported}
model:
  model_id: acme/rich-70b
variants:
  default: {precision: bf16, vram_minimum_gb: 140}
  nvfp4: {model_id: acme/rich-70b-nvfp4, precision: nvfp4, vram_minimum_gb: 40}
  huge: {vram_minimum_gb: 1300}
  stranded: {precision: bf16, vram_minimum_gb: 10, supported_hardware: [h100]}
compatible_strategies: [single_node_tp, single_node_dep, multi_node_tp, multi_node_dep, pd_cluster]
"""
OFFERED = "h200, b200, gb200, b300, gb300, mi300x, mi325x, mi355x"
USABLE = "single_node_tp, single_node_dep"
MIN_GPUS = load_vllm_recipe(RECIPES / "min-gpus.yaml")  # gb300: no single-node strategy


@pytest.fixture(scope="module")
def rich(tmp_path_factory: pytest.TempPathFactory) -> VllmRecipe:
    return recipe_from(tmp_path_factory, "rich.yaml", RICH)


def _refused(r: VllmRecipe, **kw: object) -> str:
    return refused_line(resolve_vllm, r, **kw)


def test_an_unknown_variant_names_every_variant(rich: VllmRecipe) -> None:
    assert _refused(rich, variant="fp8") == (
        "unknown variant 'fp8' (variants: default, nvfp4, huge, stranded)"
    )


def test_unknown_hardware_and_hardware_not_offered_name_what_is(rich: VllmRecipe) -> None:
    assert _refused(rich, hardware="tpu9") == f"unknown hardware 'tpu9' (hardware: {OFFERED})"
    assert _refused(rich, hardware="h100") == (
        f"hardware not offered: 'h100' (hardware: {OFFERED})"
    )


def test_a_variant_on_hardware_it_does_not_run_on(rich: VllmRecipe) -> None:
    assert _refused(rich, variant="nvfp4", hardware="h200") == (
        "variant nvfp4 does not run on h200 (hardware for nvfp4: b200, gb200, b300, gb300)"
    )
    assert _refused(rich, variant="stranded", hardware="h200") == (
        "variant stranded does not run on h200 (hardware for stranded: none)"
    )


def test_tp_from_1_to_the_hosts_gpus(rich: VllmRecipe) -> None:
    for tp in (1, 8):
        spec = resolve_vllm(rich, tp=tp)
        assert spec.servers[0].argv[3:] == ["--tensor-parallel-size", str(tp)]
        assert spec.servers[0].npus == tp
    for bad in (0, 9, -1, True, "2", 2.0):
        assert _refused(rich, tp=bad) == f"--tp {bad} out of range for h200 (1..8)"
    assert _refused(rich, hardware="gb200", tp=5) == "--tp 5 out of range for gb200 (1..4)"


def test_tp_is_the_strategys_parallel_flag(rich: VllmRecipe) -> None:
    spec = resolve_vllm(rich, strategy="single_node_dep", tp=2)
    assert spec.servers[0].argv[3:] == ["--enable-expert-parallel", "--data-parallel-size", "2"]
    # a strategy without a parallel flag: --tensor-parallel-size, the layers' default too
    flagless = {k: v for k, v in rich.strategies["single_node_dep"].items() if k != "parallel_flag"}
    r = replace(rich, strategies={**rich.strategies, "single_node_dep": flagless})
    argv = resolve_vllm(r, strategy="single_node_dep", tp=2).servers[0].argv
    assert argv[3:] == ["--enable-expert-parallel", "--tensor-parallel-size", "2"]
    assert resolve_vllm(r, strategy="single_node_dep").servers[0].argv[3:] == [
        "--enable-expert-parallel",
        "--tensor-parallel-size",
        "8",
    ]


def test_a_pool_parallelism_outside_pd_cluster(rich: VllmRecipe) -> None:
    tail = "is given, but only a pd_cluster strategy has pools"
    assert _refused(rich, pool_parallelism="tp") == (
        f"a pool parallelism ('tp') {tail} (strategy: the default)"
    )
    for strategy in ("single_node_tp", "multi_node_tp", "nope"):
        assert _refused(rich, strategy=strategy, pool_parallelism="dep") == (
            f"a pool parallelism ('dep') {tail} (strategy: {strategy})"
        )
    spec = resolve_vllm(rich, strategy="pd_cluster", pool_parallelism="tp")
    assert spec.selection["pool_parallelism"] == "tp"


def test_a_task_or_a_strategy_where_there_is_none(rich: VllmRecipe) -> None:
    assert _refused(rich, task="t2v") == "task 't2v' given, but only omni recipes have tasks"
    plain = load_vllm_recipe(RECIPES / "no-strategies.yaml")
    omni = load_vllm_recipe(RECIPES / "omni-speech.yaml")
    for r, kind in ((plain, "a recipe without strategies"), (omni, "an omni recipe")):
        assert _refused(r, strategy="single_node_tp") == (
            f"strategy 'single_node_tp' given, but {kind} has none: it renders one server as it "
            "is (strategies: none)"
        )


def test_an_unknown_or_incompatible_strategy(rich: VllmRecipe) -> None:
    assert _refused(rich, strategy="nope") == (
        f"unknown strategy 'nope' on h200 (single-node strategies: {USABLE})"
    )
    assert _refused(rich, strategy="single_node_tep") == (
        f"strategy not compatible: 'single_node_tep' on h200 (single-node strategies: {USABLE})"
    )
    # gb300's GPU floor leaves it no single-node strategy
    assert _refused(MIN_GPUS, hardware="gb300", strategy="nope") == (
        "unknown strategy 'nope' on gb300 (single-node strategies: none)"
    )


def test_a_node_count_for_a_strategy_of_one_node(rich: VllmRecipe) -> None:
    for strategy in ("single_node_tp", "pd_cluster"):
        assert _refused(rich, strategy=strategy, nodes=2) == (
            f"a node count (2) sizes a multi-node strategy; {strategy} runs on one node "
            "(multi-node strategies on h200: multi_node_tp, multi_node_dep)"
        )
    assert _refused(rich, hardware="mi300x", strategy="single_node_tp", nodes=3) == (
        "a node count (3) sizes a multi-node strategy; single_node_tp runs on one node "
        "(multi-node strategies on mi300x: multi_node_tp, multi_node_dep)"
    )


def test_a_multi_node_strategy_on_one_host(rich: VllmRecipe) -> None:
    assert _refused(rich, strategy="multi_node_tp", one_host=True) == (
        "strategy multi_node_tp is multi_node and cannot be rendered for one host "
        f"(single-node strategies: {USABLE})"
    )
    assert _refused(MIN_GPUS, hardware="gb300", strategy="multi_node_tp", one_host=True) == (
        "strategy multi_node_tp is multi_node and cannot be rendered for one host "
        "(single-node strategies: none)"
    )
    # without one_host it is a group of ranks
    assert resolve_vllm(rich, strategy="multi_node_tp").nodes == 2


def test_a_variant_too_big_for_one_node(rich: VllmRecipe) -> None:
    assert _refused(rich, variant="huge") == (
        "variant huge needs 1300 GB (vram_minimum_gb) but one h200 node has 1128 GB (vram_gb), "
        "so no single-node command; multi-node strategies that fit: multi_node_tp (2 nodes), "
        "multi_node_dep (2 nodes). servefleet renders one host per server and cannot deploy a "
        "model spanning several hosts yet"
    )


def test_a_strategy_short_of_gpus(rich: VllmRecipe) -> None:
    assert _refused(MIN_GPUS, hardware="h100", strategy="single_node_tep") == (
        "strategy single_node_tep does not fit one h100 host: single_node_tep needs 16 GPUs "
        "(strategy_min_gpus), h100 has 8 (single-node strategies: single_node_tp)"
    )
    assert _refused(MIN_GPUS, hardware="gb300", strategy="single_node_tp") == (
        "strategy single_node_tp does not fit one gb300 host: single_node_tp needs 16 GPUs "
        "(strategy_min_gpus), gb300 has 4 (single-node strategies: none)"
    )
    # two strategies that fit, listed apart
    compatible = ["single_node_tp", "single_node_tep", "single_node_dep"]
    data = {**rich.data, "compatible_strategies": compatible}
    r = replace(rich, data={**data, "strategy_min_gpus": {"single_node_dep": 16}})
    assert _refused(r, strategy="single_node_dep") == (
        "strategy single_node_dep does not fit one h200 host: single_node_dep needs 16 GPUs "
        "(strategy_min_gpus), h200 has 8 (single-node strategies: single_node_tp, "
        "single_node_tep)"
    )


def test_the_recommended_variant_and_hardware_are_the_defaults(rich: VllmRecipe) -> None:
    def landed(rec: dict[str, str], **kw: str) -> tuple[str, str]:
        spec = resolve_vllm(replace(rich, recommended=rec), **kw)  # type: ignore[arg-type]
        return spec.selection["hardware"], spec.selection["variant"]

    assert landed({}) == ("h200", "default")
    assert landed({"variant": "nvfp4", "hardware": "gb200"}) == ("gb200", "nvfp4")
    # the recommended variant picks the hardware it runs on when the recommended one is not it
    assert landed({"variant": "nvfp4", "hardware": "h200"}) == ("b200", "nvfp4")
    assert landed({"variant": "nvfp4"}) == ("b200", "nvfp4")
    # a variant asked for is the one the hardware is picked for
    assert landed({"variant": "default", "hardware": "h200"}, variant="nvfp4") == ("b200", "nvfp4")
    # an unknown recommended variant: the default's hardware; hardware not offered: the default
    assert landed({"variant": "gone", "hardware": "mi300x"}) == ("mi300x", "default")
    assert landed({"variant": "default", "hardware": "h100"}) == ("h200", "default")
    assert landed({"hardware": "mi300x"}) == ("mi300x", "default")


def test_the_selection_reaches_a_group_whole(rich: VllmRecipe) -> None:
    spec = resolve_vllm(rich, hardware="mi300x", strategy="multi_node_tp", nodes=3)
    assert spec.nodes == 3 and [s.rank for s in spec.servers] == [0, 1, 2]
    assert spec.selection == {
        "hardware": "mi300x",
        "strategy": "multi_node_tp",
        "variant": "default",
        "features": "",
    }
    assert _refused(rich, strategy="multi_node_tp", tp=8) == (
        "--tp sizes a single-node strategy; multi_node_tp takes every GPU of each of its nodes "
        "(allowed: a node count)"
    )
    kv = resolve_vllm(rich, strategy="multi_node_tp", kv_offload="simple")
    assert kv.selection["kv_offload"] == "simple"
    assert all("--kv-transfer-config" in s.argv for s in kv.servers)
