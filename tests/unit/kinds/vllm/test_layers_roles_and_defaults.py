"""The layer engine's own layers and defaults (``layers.py``): a strategy override's
``extra_env``, a ``pd_cluster`` role's own ``vllm_args``, a role's pool parallelism when none is
given (``tp``), the parallel flag of a strategy that names none (``--tensor-parallel-size``), the
NVL4-only env kept outside a role, and no strategy override without a strategy; each held by no
test before the mutation campaign (#37).
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

# strategy_overrides.pd_cluster: env FROM_SO, a prefill and a decode block; the strategy files
# shipped (pd_cluster's roles, single_node_tp's --tensor-parallel-size)
LAYERS = load_vllm_recipe(REPO / "tests" / "data" / "vllm" / "pd-layers.yaml")


def _data(**changes: Any) -> VllmRecipe:
    """The recipe with top-level keys of its mapping replaced (the schema is not run again)."""
    return replace(LAYERS, data={**copy.deepcopy(LAYERS.data), **changes})


def _strategy(name: str, **changes: Any) -> VllmRecipe:
    """The recipe with keys of one strategy file replaced (None: the key removed)."""
    s = {k: v for k, v in {**LAYERS.strategies[name], **changes}.items() if v is not None}
    return replace(LAYERS, strategies={**LAYERS.strategies, name: s})


def test_a_strategy_override_adds_its_extra_env_after_its_env() -> None:
    r = _data(
        strategy_overrides={
            "single_node_tp": {"env": {"A": "env", "B": "env"}, "extra_env": {"B": "extra"}}
        }
    )
    _, env = build_layers(r, "default", "single_node_tp", "h200", 8, {}, None)
    assert env == {"FROM_BASE": "1", "A": "env", "B": "extra"}


def test_a_pd_role_override_adds_its_vllm_args_after_its_extra_args() -> None:
    so = copy.deepcopy(LAYERS.data["strategy_overrides"])
    so["pd_cluster"]["prefill"] = {
        "extra_args": ["--max-num-seqs", "8"],
        "vllm_args": ["--own", "1"],
    }
    args, _ = build_layers(
        _data(strategy_overrides=so), "default", "pd_cluster", "h200", 8, {}, None, role="prefill"
    )
    assert args[-6:] == ["--max-num-seqs", "8", "--own", "1", "--kv-cache-dtype", "fp8"]


def test_a_role_pool_is_tp_when_no_parallelism_is_given() -> None:
    args, _ = build_layers(LAYERS, "default", "pd_cluster", "h200", 8, {}, None, role="decode")
    assert "--data-parallel-size" not in args and "--enable-expert-parallel" not in args
    assert args[args.index("--tensor-parallel-size") + 1] == "8"
    # the pool's items are named by its parallelism: tp
    r = _strategy("pd_cluster", parallel_flag="--tensor-parallel-size 'x")
    with pytest.raises(RecipeError) as err:
        build_layers(r, "default", "pd_cluster", "h200", 8, {}, None, role="prefill")
    assert str(err.value) == (
        f'{LAYERS.name}: pd_cluster prefill pool (tp): "--tensor-parallel-size \'x" does not '
        "split as a shell command line would (No closing quotation)"
    )


def test_a_strategy_without_a_parallel_flag_sizes_the_tensor_parallel_size() -> None:
    r = _strategy("single_node_tp", parallel_flag=None)
    args, _ = build_layers(r, "default", "single_node_tp", "h200", 4, {}, None)
    assert args == ["--trust-remote-code", "--tensor-parallel-size", "4", "--kv-cache-dtype", "fp8"]
    named = _strategy("single_node_tp", parallel_flag="--pipeline-parallel-size")
    args, _ = build_layers(named, "default", "single_node_tp", "h200", 4, {}, None)
    assert args[1:3] == ["--pipeline-parallel-size", "4"]


def test_the_nvl4_only_env_is_dropped_for_a_role_only() -> None:
    nvl4 = {"NCCL_MNNVL_ENABLE": "1", "UCX_NET_DEVICES": "all", "KEEP": "1"}
    r = _data(model={**LAYERS.data["model"], "base_env": nvl4})
    _, env = build_layers(r, "default", "single_node_tp", "h200", 8, {}, None)
    assert env == nvl4
    _, env = build_layers(r, "default", "pd_cluster", "h200", 8, {}, None, role="decode")
    assert "KEEP" in env and not {"NCCL_MNNVL_ENABLE", "UCX_NET_DEVICES"} & env.keys()


def test_no_strategy_takes_no_strategy_override() -> None:
    # not even one keyed null (``~:`` in YAML), the key a missing strategy would look up
    r = _data(strategy_overrides={None: {"extra_args": ["--nope"], "env": {"NOPE": "1"}}})
    args, env = build_layers(r, "default", None, "h200", 8, {}, None)
    assert args == ["--trust-remote-code", "--kv-cache-dtype", "fp8"]
    assert env == {"FROM_BASE": "1"}
