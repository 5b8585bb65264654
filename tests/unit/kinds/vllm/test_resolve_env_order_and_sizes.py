"""Two rules of ``resolve_vllm`` no shipped recipe tells apart (issue #37's holes 2 and 3, each
shown failing on its mutant): the env layers' order (``kinds/vllm/layers.py``'s ``ENV_ORDER``:
the KV-offload option's env, then the strategy overrides', so a recipe's override of a variable
the option sets wins), and a parallel size of 0 in the final argv refused
(``kinds/vllm/sizing.py``), not a server on no GPU."""

from __future__ import annotations

from pathlib import Path

import pytest

from servefleet.base.errors import RecipeError
from servefleet.kinds.vllm import load_vllm_recipe, resolve_vllm

# One recipe with the KV-offload option whose taxonomy env sets PYTHONHASHSEED=0
ENV_RECIPE = """\
meta:
  hardware: {h200: verified}
model:
  model_id: acme/env-8b
variants:
  default: {precision: bf16, vram_minimum_gb: 16}
compatible_strategies: [single_node_tp]
kv_offload_support:
  offloading_fs: verified
"""


def test_a_strategy_override_env_wins_over_the_kv_offload_env(tmp_path: Path) -> None:
    plain = tmp_path / "plain.yaml"
    plain.write_text(ENV_RECIPE)
    # the taxonomy's offloading_fs sets PYTHONHASHSEED=0 (the shipped taxonomy: no root here)
    env = resolve_vllm(load_vllm_recipe(plain), kv_offload="offloading_fs").servers[0].env
    assert env["PYTHONHASHSEED"] == "0"
    override = tmp_path / "override.yaml"
    override.write_text(
        ENV_RECIPE + 'strategy_overrides:\n  single_node_tp:\n    env: {PYTHONHASHSEED: "7"}\n'
    )
    spec = resolve_vllm(load_vllm_recipe(override), kv_offload="offloading_fs")
    assert spec.servers[0].env["PYTHONHASHSEED"] == "7"
    assert spec.selection["kv_offload"] == "offloading_fs"


@pytest.mark.parametrize(
    "flag", ["--data-parallel-size", "--pipeline-parallel-size", "--tensor-parallel-size", "-dp"]
)
def test_a_parallel_size_of_zero_is_refused(tmp_path: Path, flag: str) -> None:
    path = tmp_path / "zero.yaml"
    path.write_text(ENV_RECIPE + f'hardware_overrides:\n  h200:\n    extra_args: ["{flag}", "0"]\n')
    with pytest.raises(RecipeError) as err:
        resolve_vllm(load_vllm_recipe(path), hardware="h200")
    msg = str(err.value)
    assert f"{flag} 0 on h200 is not a positive GPU count" in msg and "\n" not in msg
