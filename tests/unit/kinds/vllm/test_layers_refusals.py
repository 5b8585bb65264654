"""The layer engine's refusals (``layers.py``): each malformed block a layer reads is refused in
one line naming the place it sits at in the recipe, the strategy file or the taxonomy.

The load-time schema refuses these blocks first, so a loaded recipe never reaches the layers with
one; each test here builds its layers from a recipe whose mapping was changed after the load
(``dataclasses.replace``), which is how the mutation campaign (#37) found every ``where`` of
``layers.py`` unheld: the whole message is asserted, the place and the type given.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

import pytest
from repo_paths import REPO

from servefleet.base.errors import RecipeError
from servefleet.kinds.vllm import load_vllm_recipe
from servefleet.kinds.vllm.layers import build_layers
from servefleet.kinds.vllm.recipe import VllmRecipe

# model.base_args, variants.default, strategy_overrides.pd_cluster (with a decode role's
# hardware_overrides.h200), the recipe's hardware_overrides.hopper; h200 is a hopper GPU
LAYERS = load_vllm_recipe(REPO / "tests" / "data" / "vllm" / "pd-layers.yaml")
N = LAYERS.name
ARGS = "expected a list of arguments (strings or numbers), got"
ENV = "expected a mapping of variables, got"


def _with(path: tuple[str, ...], value: Any, strategies: bool = False) -> VllmRecipe:
    """The recipe with ``value`` set at ``path`` of its mapping (of its strategies' with
    ``strategies``), every block on the way made when missing; the schema is not run again."""
    data = copy.deepcopy(LAYERS.strategies if strategies else LAYERS.data)
    block = data
    for key in path[:-1]:
        if block.get(key) is None:
            block[key] = {}
        block = block[key]
    block[path[-1]] = value
    return replace(LAYERS, strategies=data) if strategies else replace(LAYERS, data=data)


def _refused(
    r: VllmRecipe,
    strategy: str | None = None,
    role: str | None = None,
    kv: dict[str, Any] | None = None,
) -> str:
    with pytest.raises(RecipeError) as err:
        build_layers(r, "default", strategy, "h200", 8, {}, kv, role=role)
    msg = str(err.value)
    assert "\n" not in msg
    return msg


def test_the_model_and_the_variant_blocks_are_named() -> None:
    assert _refused(_with(("model", "base_args"), {"a": 1})) == f"{N}: model.base_args: {ARGS} dict"
    assert _refused(_with(("model", "base_env"), ["A"])) == f"{N}: model.base_env: {ENV} list"
    variant = ("variants", "default")
    assert _refused(_with((*variant, "extra_args"), "--x")) == (
        f"{N}: variants.default.extra_args: {ARGS} str"
    )
    assert _refused(_with((*variant, "extra_env"), 3)) == (
        f"{N}: variants.default.extra_env: {ENV} int"
    )
    exact = (*variant, "hardware_overrides", "h200")
    assert _refused(_with((*exact, "extra_args"), 1.5)) == (
        f"{N}: variants.default.hardware_overrides.h200.extra_args: {ARGS} float"
    )
    assert _refused(_with((*exact, "extra_env"), "A=1")) == (
        f"{N}: variants.default.hardware_overrides.h200.extra_env: {ENV} str"
    )
    # a generation block is named by the overrides it sits in (not its key)
    gen = (*variant, "hardware_overrides", "hopper")
    assert _refused(_with((*gen, "extra_args"), {})) == (
        f"{N}: variants.default.hardware_overrides.extra_args: {ARGS} dict"
    )
    assert _refused(_with((*gen, "extra_env"), [])) == (
        f"{N}: variants.default.hardware_overrides.extra_env: {ENV} list"
    )


def test_the_recipe_hardware_blocks_are_named() -> None:
    assert _refused(_with(("hardware_overrides", "h200", "extra_args"), "x")) == (
        f"{N}: hardware_overrides.h200.extra_args: {ARGS} str"
    )
    assert _refused(_with(("hardware_overrides", "h200", "extra_env"), 1)) == (
        f"{N}: hardware_overrides.h200.extra_env: {ENV} int"
    )
    assert _refused(_with(("hardware_overrides", "hopper", "extra_args"), "x")) == (
        f"{N}: hardware_overrides.extra_args: {ARGS} str"
    )
    assert _refused(_with(("hardware_overrides", "hopper", "extra_env"), 1)) == (
        f"{N}: hardware_overrides.extra_env: {ENV} int"
    )


@pytest.mark.parametrize(
    ("key", "value", "expect"),
    [
        ("extra_args", "x", f"{ARGS} str"),
        ("vllm_args", {}, f"{ARGS} dict"),
        ("env", [], f"{ENV} list"),
        ("extra_env", "A", f"{ENV} str"),
    ],
)
def test_a_strategy_override_block_is_named(key: str, value: Any, expect: str) -> None:
    r = _with(("strategy_overrides", "single_node_tp", key), value)
    assert (
        _refused(r, "single_node_tp") == f"{N}: strategy_overrides.single_node_tp.{key}: {expect}"
    )


def test_a_strategy_override_hardware_block_is_named() -> None:
    so = ("strategy_overrides", "single_node_tp", "hardware_overrides")
    assert _refused(_with((*so, "h200", "extra_args"), "x"), "single_node_tp") == (
        f"{N}: strategy_overrides.single_node_tp.hardware_overrides.h200.extra_args: {ARGS} str"
    )
    assert _refused(_with((*so, "h200", "extra_env"), 2), "single_node_tp") == (
        f"{N}: strategy_overrides.single_node_tp.hardware_overrides.h200.extra_env: {ENV} int"
    )
    assert _refused(_with((*so, "hopper", "extra_args"), "x"), "single_node_tp") == (
        f"{N}: strategy_overrides.single_node_tp.hardware_overrides.extra_args: {ARGS} str"
    )
    assert _refused(_with((*so, "nvidia", "extra_env"), 2), "single_node_tp") == (
        f"{N}: strategy_overrides.single_node_tp.hardware_overrides.extra_env: {ENV} int"
    )


def test_a_pd_role_override_block_is_named() -> None:
    so = ("strategy_overrides", "pd_cluster")
    sw = f"{N}: strategy_overrides.pd_cluster"
    for key, value, expect in (
        ("extra_args", "x", f"{ARGS} str"),
        ("vllm_args", 3, f"{ARGS} int"),
        ("env", ["A"], f"{ENV} list"),
    ):
        assert _refused(_with((*so, "decode", key), value), "pd_cluster", "decode") == (
            f"{sw}.decode.{key}: {expect}"
        )
    # the strategy override's own env, under a role
    assert _refused(_with((*so, "env"), "A=1"), "pd_cluster", "prefill") == (f"{sw}.env: {ENV} str")
    gpu = (*so, "decode", "hardware_overrides", "h200")
    assert _refused(_with((*gpu, "extra_args"), "x"), "pd_cluster", "decode") == (
        f"{sw}.decode.hardware_overrides.h200.extra_args: {ARGS} str"
    )
    assert _refused(_with((*gpu, "extra_env"), 1), "pd_cluster", "decode") == (
        f"{sw}.decode.hardware_overrides.h200.extra_env: {ENV} int"
    )


def test_a_strategy_file_block_is_named() -> None:
    assert _refused(_with(("single_node_tp", "vllm_args"), {}, True), "single_node_tp") == (
        f"strategy single_node_tp.vllm_args: {ARGS} dict"
    )
    assert _refused(_with(("single_node_tp", "env"), [], True), "single_node_tp") == (
        f"strategy single_node_tp.env: {ENV} list"
    )
    assert _refused(
        _with(("pd_cluster", "decode", "vllm_args"), "x", True), "pd_cluster", "decode"
    ) == (f"strategy pd_cluster.decode.vllm_args: {ARGS} str")
    assert _refused(_with(("pd_cluster", "prefill", "env"), 1, True), "pd_cluster", "prefill") == (
        f"strategy pd_cluster.prefill.env: {ENV} int"
    )


def test_a_parallel_flag_that_does_not_split_is_named() -> None:
    # the schema asks only that a strategy's parallel_flag start with "-"
    r = _with(("single_node_tp", "parallel_flag"), "--tensor-parallel-size 'x", True)
    assert _refused(r, "single_node_tp") == (
        'strategy single_node_tp.parallel_flag: "--tensor-parallel-size \'x" does not split as '
        "a shell command line would (No closing quotation)"
    )


def test_a_kv_offload_option_block_is_named() -> None:
    assert _refused(LAYERS, kv={"args": "--x"}) == f"taxonomy kv_offload.args: {ARGS} str"
    assert _refused(LAYERS, kv={"env": ["A"]}) == f"taxonomy kv_offload.env: {ENV} list"
