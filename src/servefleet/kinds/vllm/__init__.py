"""vLLM recipes (GPU hosts): load a recipe YAML or the recipes site's JSON, resolve a selection.

The recipe format is vllm-project/recipes' (``models/<org>/<name>.yaml`` with the shared
``taxonomy.yaml`` and ``strategies/*.yaml``); the site's JSON form of a model carries the same
keys plus a ``recommended_command``. Both resolve with the same code. Pure: no pyinfra import.

Modules: ``recipe`` (the loaded recipe), ``load`` (reading, listing), ``schema`` (the checks
of every field), ``words`` (argument lists as the site's shell command splits them),
``hardware`` (what runs where, defaults, parallel size), ``features``, ``layers`` (the layer
engine), ``omni`` (an omni recipe's command), ``kv_offload``, ``companions``, ``sizing`` (the GPUs
a command takes), ``pd`` (pd_cluster roles), ``resolve`` (a selection checked, defaulted and
resolved), ``describe``.
"""

from servefleet.kinds.vllm.describe import describe_vllm
from servefleet.kinds.vllm.hardware import (
    PRECISION_HARDWARE,
    offered_hardware,
    parallel_size,
    single_node_strategies,
)
from servefleet.kinds.vllm.load import list_vllm_recipes, load_vllm_recipe
from servefleet.kinds.vllm.recipe import VllmRecipe
from servefleet.kinds.vllm.resolve import resolve_vllm

__all__ = [
    "PRECISION_HARDWARE",
    "VllmRecipe",
    "describe_vllm",
    "list_vllm_recipes",
    "load_vllm_recipe",
    "offered_hardware",
    "parallel_size",
    "resolve_vllm",
    "single_node_strategies",
]
