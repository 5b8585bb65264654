"""A vLLM recipe without strategies (``resolve.py``'s ``_resolve_unstrategied``): its KV offload,
its refusals of a task and of a node count, as the mutation campaign (#37) found no mirror test
holding them."""

from __future__ import annotations

import json

import pytest
from repo_paths import RECIPES

from servefleet.base.errors import RecipeError
from servefleet.kinds.vllm import load_vllm_recipe, resolve_vllm

PLAIN = load_vllm_recipe(RECIPES / "no-strategies.yaml")


def _refused(**kw: object) -> str:
    with pytest.raises(RecipeError) as err:
        resolve_vllm(PLAIN, **kw)  # type: ignore[arg-type]
    return str(err.value)


def test_a_kv_offload_option_layers_onto_the_base_command() -> None:
    spec = resolve_vllm(PLAIN, kv_offload="simple")
    argv = spec.servers[0].argv
    kv = json.loads(argv[argv.index("--kv-transfer-config") + 1])
    assert kv["kv_connector"] == "SimpleCPUOffloadConnector" and kv["kv_role"] == "kv_both"
    assert spec.selection["kv_offload"] == "simple"
    assert "kv_offload" not in resolve_vllm(PLAIN).selection


def test_a_task_is_refused_as_only_omni_recipes_have_tasks() -> None:
    assert _refused(task="t2v") == (
        f"{PLAIN.name}: task 't2v' given, but only omni recipes have tasks"
    )


def test_a_node_count_is_refused_in_one_line() -> None:
    assert _refused(nodes=2) == (
        f"{PLAIN.name}: a node count (2) sizes a multi-node strategy; a recipe without "
        "strategies runs on one node (multi-node strategies on h200: none)"
    )
    # a count too long to show is cut at 40 characters
    assert f"a node count ({'1' + '0' * 39}) sizes" in _refused(nodes=10**45)
