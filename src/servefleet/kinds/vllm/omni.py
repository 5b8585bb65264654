"""An omni recipe's command (``meta.tasks`` has ``omni``), as the site's ``resolveOmniCommand``
renders it: the layers and their order (:data:`OMNI_ARG_ORDER`, :data:`OMNI_ENV_ORDER`), the
selected task, and the served model: the task's exact-GPU override's ``model_id``, else the
task's, else the variant's. No strategy, no features.
"""

from __future__ import annotations

from typing import Any

from servefleet.base.errors import RecipeError
from servefleet.base.vllm_args import env_map
from servefleet.kinds.vllm.hardware import generation_block
from servefleet.kinds.vllm.layers import Layer, apply_layers, block_layer
from servefleet.kinds.vllm.recipe import VllmRecipe
from servefleet.kinds.vllm.words import items

# An omni recipe (the site's ``resolveOmniCommand``): no strategy, no features; the variant's
# own args and env apply to non-default variants only; ``--port`` and ``--omni`` close it.
OMNI_ARG_ORDER = (
    "base",
    "variant",
    "task",
    "recipe_generation",
    "variant_generation",
    "variant_gpu",
    "port",
    "omni",
)


OMNI_ENV_ORDER = ("base", "variant", "recipe_generation", "variant_generation", "variant_gpu")


def omni_task(r: VllmRecipe, task: str | None) -> tuple[str | None, dict[str, Any]]:
    """The selected omni task (key, entry): the one named, else the first; none declared: {}."""
    tasks = r.omni_tasks
    if task is None:
        return next(iter(tasks.items()), (None, {}))
    if task in tasks:
        return task, tasks[task]
    by_id = [k for k, t in tasks.items() if t.get("id") == task]
    if by_id:
        return by_id[0], tasks[by_id[0]]
    raise RecipeError(f"{r.name}: unknown omni task {task!r} (tasks: {', '.join(tasks) or 'none'})")


def build_omni(
    r: VllmRecipe, vname: str, gpu: str, task: dict[str, Any]
) -> tuple[list[str], list[str], dict[str, str]]:
    """The site's ``resolveOmniCommand`` (:data:`OMNI_ARG_ORDER`, :data:`OMNI_ENV_ORDER`):
    launcher (with the model), arguments, env. The task's exact-GPU override
    (``omni.tasks[].hardware_overrides.<gpu>``) adds its ``extra_args`` after the task's and may
    swap its ``model_id``."""
    n = r.name
    model = r.data["model"]
    variant = r.variants[vname]
    prof = r.profiles[gpu]
    omni = r.data.get("omni") or {}
    r_ho = r.data.get("hardware_overrides") or {}
    v_ho = variant.get("hardware_overrides") or {}
    extra = (("extra_args",), ("extra_env",))
    tw = f"{n}: omni.tasks.{task.get('key') or task.get('id')}"
    task_ho = (task.get("hardware_overrides") or {}).get(gpu) or {}
    layers: dict[str, Layer] = {
        "base": (
            items(model.get("base_args"), f"{n}: model.base_args"),
            env_map(model.get("base_env"), f"{n}: model.base_env"),
        ),
        "task": (
            items(task.get("extra_args"), f"{tw}.extra_args")
            + items(task_ho.get("extra_args"), f"{tw}.hardware_overrides.{gpu}.extra_args"),
            {},
        ),
        "recipe_generation": block_layer(
            generation_block(r_ho, prof), f"{n}: hardware_overrides", *extra
        ),
        "variant_generation": block_layer(
            generation_block(v_ho, prof), f"{n}: variants.{vname}.hardware_overrides", *extra
        ),
        "variant_gpu": block_layer(
            v_ho.get(gpu), f"{n}: variants.{vname}.hardware_overrides.{gpu}", *extra
        ),
        "omni": ([("--omni", "omni")], {}),
    }
    if vname != "default":
        layers["variant"] = block_layer(variant, f"{n}: variants.{vname}", *extra)
    if omni.get("port"):
        layers["port"] = (
            [("--port", f"{n}: omni.port"), (str(omni["port"]), f"{n}: omni.port")],
            {},
        )
    args, env = apply_layers(layers, OMNI_ARG_ORDER, OMNI_ENV_ORDER)
    launcher = str(omni.get("serve_binary") or "vllm serve").split()  # one of LAUNCHERS
    model_id = str(
        task_ho.get("model_id")
        or task.get("model_id")
        or variant.get("model_id")
        or model["model_id"]
    )
    return [*launcher, model_id], args, env
