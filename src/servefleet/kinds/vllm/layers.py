"""The layer engine of a vLLM selection: which blocks of a recipe apply, in which order, and
the ``vllm serve`` arguments and env they add up to.

The layers and the order they apply in are data: :data:`ARG_ORDER` and :data:`ENV_ORDER` (the
site's ``buildArgs`` / ``buildEnv``). In short: base, variant, strategy, strategy overrides,
hardware class (generation, else brand), exact hardware, features, the composing KV-offload
option; for env the strategy's and the KV option's env, then the strategy overrides before every
hardware layer. A strategy's generation override replaces the recipe's and the variant's
generation blocks. An omni recipe's orders are :mod:`servefleet.kinds.vllm.omni`'s.

The argument list becomes argv words as the site's shell command splits it (``words``: an item
holding a flag and its value, ``"--max-model-len 32768"``, gives two words), then
``dedupe_args``: the last occurrence of each flag wins.

Features: without ``features`` / ``no_features`` the site's defaults are on (every feature not
opt-in, ``opt_in_features`` plus ``hardware_opt_in_features.<gpu>``, and every feature the
variant's ``default_modes`` names). A feature's hardware override replaces its args; a feature
with ``modes`` contributes its selected mode's args.
"""

from __future__ import annotations

from typing import Any

from servefleet.base.vllm_args import dedupe_args, env_map
from servefleet.kinds.vllm import pd
from servefleet.kinds.vllm.features import feature_block
from servefleet.kinds.vllm.hardware import generation_block
from servefleet.kinds.vllm.recipe import VllmRecipe
from servefleet.kinds.vllm.words import Item, items, words

# The order the layers of a selection apply in, as the site's builder applies them
# (``buildArgs`` / ``buildEnv``): each appends its arguments to one list (the last occurrence of
# a flag wins) and updates one env mapping (the last value of a variable wins).
#
# + base: ``model.base_args`` / ``base_env``
# + variant: ``variants.<v>.extra_args`` / ``extra_env`` (the ``default`` variant too)
# + variant_gpu: ``variants.<v>.hardware_overrides.<gpu>`` (exact GPU id)
# + strategy: ``strategies/<s>.yaml`` ``vllm_args``, then its parallel flag with the size (a
#   multi-node rank: its parallel and rendezvous arguments instead) / ``env``
# + strategy_overrides: ``strategy_overrides.<s>`` ``extra_args`` + ``vllm_args`` /
#   ``env`` + ``extra_env``
# + strategy_generation: ``strategy_overrides.<s>.hardware_overrides.<generation>`` (brand as
#   fallback); when present it replaces recipe_generation and variant_generation
# + recipe_generation / variant_generation: ``hardware_overrides.<generation>`` of the recipe,
#   then of the variant (hardware class: generation, else brand)
# + recipe_gpu / strategy_gpu: ``hardware_overrides.<gpu>`` of the recipe, then of
#   ``strategy_overrides.<s>`` (exact hardware)
# + role_gpu: a pd_cluster role's ``strategy_overrides.<s>.<role>.hardware_overrides.<gpu>``
# (HARDWARE_ORDER: the hardware layers, the hardware class before the exact hardware)
#
# A pd_cluster role (prefill, decode) takes the same layers, with its own: strategy is the
# role's ``vllm_args`` and its pool's arguments (``pd.pool_items``) / the role's ``env`` and
# its node's GPUs; strategy_overrides is ``strategy_overrides.<s>.<role>`` ``extra_args`` +
# ``vllm_args`` / ``strategy_overrides.<s>.env`` + ``.<role>.env``.
# + features: the enabled features in recipe order
# + kv_offload: the composing KV-offload option (``taxonomy.kv_offload.<key>``)
HARDWARE_ORDER = (
    "strategy_generation",
    "recipe_generation",
    "variant_generation",
    "recipe_gpu",
    "strategy_gpu",
    "role_gpu",
)


ARG_ORDER = (
    "base",
    "variant",
    "variant_gpu",
    "strategy",
    "strategy_overrides",
    *HARDWARE_ORDER,
    "features",
    "kv_offload",
)


# Env: the strategy's own env, the KV-offload option's, then the recipe's strategy overrides
# before every hardware layer.
ENV_ORDER = (
    "base",
    "variant",
    "variant_gpu",
    "strategy",
    "kv_offload",
    "strategy_overrides",
    *HARDWARE_ORDER,
    "features",
)


# One layer: its argument items and env (empty when it does not apply).
Layer = tuple[list[Item], dict[str, str]]


def block_layer(block: Any, where: str, args: tuple[str, ...], envs: tuple[str, ...]) -> Layer:
    """One recipe block as a layer: the items of its ``args`` keys, then the env of its ``envs``
    keys (later keys win).

    + block: the block (None: an empty layer)
    + where: where it sits in the recipe, for error messages
    + args: its argument keys, in order
    + envs: its env keys, in order
    """
    b = block or {}
    seq = [t for k in args for t in items(b.get(k), f"{where}.{k}")]
    env: dict[str, str] = {}
    for k in envs:
        env.update(env_map(b.get(k), f"{where}.{k}"))
    return seq, env


def _override_layers(
    r: VllmRecipe, vname: str, strategy: str | None, gpu: str, role: str | None = None
) -> dict[str, Layer]:
    """The override layers: variant_gpu, strategy_overrides and the hardware ones (a pd_cluster
    role's own strategy_overrides and role_gpu when ``role`` is given)."""
    n = r.name
    prof = r.profiles[gpu]
    variant = r.variants[vname]
    so = ((r.data.get("strategy_overrides") or {}).get(strategy) or {}) if strategy else {}
    v_ho = variant.get("hardware_overrides") or {}
    r_ho = r.data.get("hardware_overrides") or {}
    s_ho = so.get("hardware_overrides") or {}
    sw = f"{n}: strategy_overrides.{strategy}"
    extra = (("extra_args",), ("extra_env",))
    out = {
        "variant_gpu": block_layer(
            v_ho.get(gpu), f"{n}: variants.{vname}.hardware_overrides.{gpu}", *extra
        ),
        "strategy_overrides": block_layer(
            so, sw, ("extra_args", "vllm_args"), ("env", "extra_env")
        ),
        "recipe_gpu": block_layer(r_ho.get(gpu), f"{n}: hardware_overrides.{gpu}", *extra),
        "strategy_gpu": block_layer(s_ho.get(gpu), f"{sw}.hardware_overrides.{gpu}", *extra),
    }
    if role is not None:
        rb, rw = so.get(role) or {}, f"{sw}.{role}"
        role_args, role_env = block_layer(rb, rw, ("extra_args", "vllm_args"), ("env",))
        out["strategy_overrides"] = (role_args, {**env_map(so.get("env"), f"{sw}.env"), **role_env})
        r_gpu = (rb.get("hardware_overrides") or {}).get(gpu)
        out["role_gpu"] = block_layer(r_gpu, f"{rw}.hardware_overrides.{gpu}", *extra)
    strategy_gen = generation_block(s_ho, prof)
    if strategy_gen is not None:
        out["strategy_generation"] = block_layer(strategy_gen, f"{sw}.hardware_overrides", *extra)
    else:
        out["recipe_generation"] = block_layer(
            generation_block(r_ho, prof), f"{n}: hardware_overrides", *extra
        )
        out["variant_generation"] = block_layer(
            generation_block(v_ho, prof), f"{n}: variants.{vname}.hardware_overrides", *extra
        )
    return out


def apply_layers(
    layers: dict[str, Layer], arg_order: tuple[str, ...], env_order: tuple[str, ...]
) -> tuple[list[str], dict[str, str]]:
    """The deduplicated argv words and the env of the layers, each in its order."""
    seq: list[Item] = []
    for label in arg_order:
        seq += layers.get(label, ([], {}))[0]
    env: dict[str, str] = {}
    for label in env_order:
        env.update(layers.get(label, ([], {}))[1])
    return dedupe_args(words(seq)), env


def build_layers(
    r: VllmRecipe,
    vname: str,
    strategy: str | None,
    gpu: str,
    size: int,
    enabled: dict[str, str | None],
    kv: dict[str, Any] | None,
    role: str | None = None,
    pool_mode: str = "tp",
    parallel: list[Item] | None = None,
) -> tuple[list[str], dict[str, str]]:
    """The deduplicated arguments (after the model) and the env of a selection
    (:data:`ARG_ORDER`, :data:`ENV_ORDER`); of one pd_cluster role and its pool's parallelism
    ``pool_mode`` when ``role`` is given; with ``parallel``, the strategy layer's parallel
    arguments (a multi-node rank's, :mod:`servefleet.kinds.vllm.multinode`) in place of its
    parallel flag and ``size``."""
    n = r.name
    model = r.data["model"]
    variant = r.variants[vname]
    layers = _override_layers(r, vname, strategy, gpu, role)
    layers["base"] = (
        items(model.get("base_args"), f"{n}: model.base_args"),
        env_map(model.get("base_env"), f"{n}: model.base_env"),
    )
    layers["variant"] = block_layer(
        variant, f"{n}: variants.{vname}", ("extra_args",), ("extra_env",)
    )
    if strategy and role is not None:
        count = int(r.profiles[gpu]["gpu_count"])
        block, where = r.strategies[strategy].get(role) or {}, f"strategy {strategy}.{role}"
        layers["strategy"] = (
            items(block.get("vllm_args"), f"{where}.vllm_args")
            + pd.pool_items(r, strategy, role, pool_mode, count),
            {**env_map(block.get("env"), f"{where}.env"), **pd.pool_env(count)},
        )
    elif strategy:
        strat = r.strategies[strategy]
        flag = str(strat.get("parallel_flag") or "--tensor-parallel-size")
        sized = [(flag, f"strategy {strategy}.parallel_flag"), (str(size), "parallel size")]
        layers["strategy"] = (
            items(strat.get("vllm_args"), f"strategy {strategy}.vllm_args")
            + (sized if parallel is None else parallel),
            env_map(strat.get("env"), f"strategy {strategy}.env"),
        )
    feature_args: list[Item] = []
    feature_env: dict[str, str] = {}
    for name, mode in enabled.items():
        f_args, f_env = feature_block(r, name, mode, gpu)
        feature_args += f_args
        feature_env.update(f_env)
    layers["features"] = (feature_args, feature_env)
    if kv is not None:
        layers["kv_offload"] = (
            items(kv.get("args"), "taxonomy kv_offload.args"),
            env_map(kv.get("env"), "taxonomy kv_offload.env"),
        )
    args, env = apply_layers(layers, ARG_ORDER, ENV_ORDER)
    return args, (pd.drop_nvl4_env(env, gpu) if role is not None else env)
