"""Resolve a selection of a vLLM recipe to one host's ``vllm serve`` argv and env.

Layering (the site's ``buildArgs``), each layer appended to one argument list:

1. ``model.base_args``
2. the variant's ``extra_args``, then its exact-GPU ``hardware_overrides.<gpu>.extra_args``
3. the strategy's ``vllm_args``, then its parallel flag with the parallel size
4. ``strategy_overrides.<strategy>`` ``extra_args`` / ``vllm_args``
5. hardware overrides: the recipe's block for the profile's generation (brand as fallback),
   then the variant's generation block, then the recipe's exact-GPU block; a
   ``strategy_overrides.<strategy>.hardware_overrides.<generation>`` block replaces the recipe
   and variant generation blocks; its exact-GPU block is added last
6. (advanced args: none, the CLI offers no such axis)
7. enabled features in the recipe's order (a feature's hardware override replaces its args; a
   feature with ``modes`` contributes its selected mode's args)
8. the composing KV-offload option (``taxonomy.kv_offload.<key>.args``), when one is chosen

The list becomes argv words as the site's shell command splits it (``words``: an item holding a
flag and its value, ``"--max-model-len 32768"``, gives two words), then ``dedupe_args``: the last
occurrence of each flag wins. Env: ``base_env`` -> variant ``extra_env`` (non-default variants)
-> strategy env -> KV-offload env -> hardware overrides (same order as the args) ->
``strategy_overrides`` env -> features' env.

A recipe without strategies renders its base command: the layers above without 3 and 4 (the
GPUs it takes come from its own arguments, 1 when they name none). An omni recipe
(``meta.tasks`` has ``omni``) renders as the site's ``resolveOmniCommand``: ``base_args``, the
non-default variant's ``extra_args``, the omni task's ``extra_args``, the recipe's and the
variant's generation overrides and the variant's exact-GPU override, ``--port`` from
``omni.port``, then ``--omni``; the served model is the task's ``model_id``, else the
variant's; no strategy, no features.

The server takes as many GPUs as its final argv asks for (tensor x data x pipeline parallel
size). A feature's or the KV-offload option's ``companion`` runs as a second server beside it.
"""

from __future__ import annotations

import json
import re
import shlex
from typing import Any

from servefleet.errors import RecipeError
from servefleet.kinds.vllm.features import _feature_block, _parse_features, _select_features
from servefleet.kinds.vllm.hardware import (
    _default_hardware,
    _default_strategy,
    _default_variant,
    _generation,
    _generation_block,
    _single_node,
    _strategy_on,
    _variant_runs,
    gpu_shortfall,
    offered_hardware,
    parallel_size,
    single_node_strategies,
)
from servefleet.kinds.vllm.recipe import VllmRecipe
from servefleet.kinds.vllm.words import Item, items, words
from servefleet.spec import Requirements, Server, ServeSpec
from servefleet.vllm_args import dedupe_args, env_map, flag_name, is_flag

# Flags whose values multiply into the GPUs one server takes (aliases as vLLM spells them).
_PARALLEL = {
    "--tensor-parallel-size": "tp",
    "-tp": "tp",
    "--data-parallel-size": "dp",
    "-dp": "dp",
    "--pipeline-parallel-size": "pp",
    "-pp": "pp",
}


def _layers(r: VllmRecipe, vname: str, strategy: str | None, gpu: str) -> list[tuple[str, Any]]:
    """The override blocks of steps 2, 4 and 5, in order: (label, block with extra_args/env)."""
    prof = r.profiles[gpu]
    variant = r.variants[vname]
    so = ((r.data.get("strategy_overrides") or {}).get(strategy) or {}) if strategy else {}
    v_ho = variant.get("hardware_overrides") or {}
    r_ho = r.data.get("hardware_overrides") or {}
    s_ho = so.get("hardware_overrides") or {}
    hw: list[tuple[str, Any]] = []
    strategy_gen = _generation_block(s_ho, prof)
    if strategy_gen is not None:
        hw.append(("strategy_generation", strategy_gen))
    else:
        hw.append(("recipe_generation", _generation_block(r_ho, prof)))
        hw.append(("variant_generation", _generation_block(v_ho, prof)))
    hw.append(("recipe_gpu", r_ho.get(gpu)))
    hw.append(("strategy_gpu", s_ho.get(gpu)))
    return [("variant_gpu", v_ho.get(gpu)), ("strategy_overrides", so), *hw]


def resolve_vllm(
    recipe: VllmRecipe,
    *,
    hardware: str | None = None,
    strategy: str | None = None,
    variant: str | None = None,
    tp: int | None = None,
    features: list[str] | tuple[str, ...] = (),
    no_features: list[str] | tuple[str, ...] = (),
    kv_offload: str | None = None,
    task: str | None = None,
) -> ServeSpec:
    """Resolve a selection of a vLLM recipe to the ``vllm serve`` argv and env of one host.

    Unset axes take the recipe's defaults (the JSON form: its ``recommended_command``).

    + recipe: a loaded recipe
    + hardware: a GPU id of the taxonomy (``h200``, ``mi300x``, ...)
    + strategy: a single-node strategy the recipe is compatible with (none for a recipe
      without strategies)
    + variant: a variant name (``default``, ``fp8``, ...)
    + tp: the parallel size, overriding the recipe's rule and any later layer
    + features: ``NAME`` (turn on) or ``NAME=MODE`` (turn on with a mode)
    + no_features: feature names to turn off
    + kv_offload: a composing KV-offload option of the taxonomy (``simple``, ``lmcache``, ...)
    + task: an omni recipe's task (``omni.tasks`` key or id; default: the first)
    """
    r = recipe
    rec = r.recommended or {}
    features, no_features = list(features), list(no_features)
    offered = offered_hardware(r)
    if variant is not None and variant not in r.variants:
        raise RecipeError(
            f"{r.name}: unknown variant {variant!r} (variants: {', '.join(r.variants)})"
        )
    if hardware is not None and hardware not in offered:
        what = "unknown hardware" if hardware not in r.profiles else "hardware not offered:"
        raise RecipeError(f"{r.name}: {what} {hardware!r} (hardware: {', '.join(offered)})")
    if hardware is None:
        rec_variant = str(rec.get("variant"))
        vpick = variant or (rec_variant if rec_variant in r.variants else "default")
        rec_hw = str(rec.get("hardware"))
        if rec_hw in offered and _variant_runs(r, vpick, rec_hw):
            hardware = rec_hw
        else:
            hardware = _default_hardware(r, vpick)
    if variant is None:
        variant = _default_variant(r, hardware, rec.get("variant"))
    elif not _variant_runs(r, variant, hardware):
        where = [g for g in offered if _variant_runs(r, variant, g)]
        raise RecipeError(
            f"{r.name}: variant {variant} does not run on {hardware} "
            f"(hardware for {variant}: {', '.join(where) or 'none'})"
        )
    count = int(r.profiles[hardware]["gpu_count"])
    if tp is not None and (isinstance(tp, bool) or not isinstance(tp, int) or not 1 <= tp <= count):
        raise RecipeError(f"{r.name}: --tp {tp} out of range for {hardware} (1..{count})")
    if r.is_omni or not r.compatible_strategies:
        if strategy is not None:
            kind = "an omni recipe" if r.is_omni else "a recipe without strategies"
            raise RecipeError(
                f"{r.name}: strategy {strategy!r} given, but {kind} has none: it renders "
                f"one server as it is (strategies: none)"
            )
        return _resolve_unstrategied(
            r, variant, hardware, tp, features, no_features, kv_offload, task
        )
    if task is not None:
        raise RecipeError(f"{r.name}: task {task!r} given, but only omni recipes have tasks")
    if strategy is None:
        strategy = _default_strategy(r, hardware)
    usable = single_node_strategies(r, hardware)
    if strategy not in r.compatible_strategies or not _strategy_on(r, strategy, hardware):
        what = "unknown strategy" if strategy not in r.strategies else "strategy not compatible:"
        raise RecipeError(
            f"{r.name}: {what} {strategy!r} on {hardware} "
            f"(single-node strategies: {', '.join(usable) or 'none'})"
        )
    if not _single_node(r, strategy):
        raise RecipeError(
            f"{r.name}: strategy {strategy} is {r.strategies[strategy].get('deploy_type')} and "
            f"cannot be rendered for one host (single-node strategies: {', '.join(usable) or 'none'})"
        )
    if strategy not in usable:
        raise RecipeError(
            f"{r.name}: strategy {strategy} does not fit one {hardware} host: "
            f"{gpu_shortfall(r, strategy, hardware)} (single-node strategies: "
            f"{', '.join(usable) or 'none'})"
        )
    size = parallel_size(r, variant, strategy, hardware) if tp is None else tp
    enabled = _select_features(r, variant, strategy, hardware, features, no_features)
    kv = _kv_option(r, kv_offload, strategy, hardware)
    flag = str(r.strategies[strategy].get("parallel_flag") or "--tensor-parallel-size")
    args, env = _build(r, variant, strategy, hardware, size, enabled, kv)
    model_id = str(r.variants[variant].get("model_id") or r.data["model"]["model_id"])
    return _spec(
        r,
        {"hardware": hardware, "strategy": strategy, "variant": variant},
        enabled,
        kv_offload,
        ["vllm", "serve", model_id],
        _with_size(args, flag, tp),
        env,
        kv,
    )


def _resolve_unstrategied(
    r: VllmRecipe,
    variant: str,
    hardware: str,
    tp: int | None,
    features: list[str],
    no_features: list[str],
    kv_offload: str | None,
    task: str | None,
) -> ServeSpec:
    """An omni recipe, or one without strategies: its base command as one server."""
    selection = {"hardware": hardware, "strategy": "", "variant": variant}
    if not r.is_omni:
        if task is not None:
            raise RecipeError(f"{r.name}: task {task!r} given, but only omni recipes have tasks")
        enabled = _select_features(r, variant, None, hardware, features, no_features)
        kv = _kv_option(r, kv_offload, None, hardware)
        args, env = _build(r, variant, None, hardware, 0, enabled, kv)
        model_id = str(r.variants[variant].get("model_id") or r.data["model"]["model_id"])
        launcher = ["vllm", "serve", model_id]
        return _spec(
            r, selection, enabled, kv_offload, launcher, _with_size(args, None, tp), env, kv
        )
    _parse_features(r, features, no_features)  # unknown names are errors all the same
    if features:
        raise RecipeError(
            f"{r.name}: an omni recipe renders no features (the site's omni command takes "
            f"none); drop --feature {' --feature '.join(features)}"
        )
    if kv_offload is not None:
        raise RecipeError(
            f"{r.name}: KV offload {kv_offload!r} composes with a serving strategy; an omni "
            "recipe has none"
        )
    key, spec = _omni_task(r, task)
    if key is not None:
        selection["task"] = key
    launcher, args, env = _build_omni(r, variant, hardware, spec)
    return _spec(r, selection, {}, None, launcher, _with_size(args, None, tp), env, None)


def _spec(
    r: VllmRecipe,
    selection: dict[str, str],
    enabled: dict[str, str | None],
    kv_offload: str | None,
    launcher: list[str],
    args: list[str],
    env: dict[str, str],
    kv: dict[str, Any] | None,
) -> ServeSpec:
    gpu = selection["hardware"]
    selection["features"] = ",".join(n if m is None else f"{n}={m}" for n, m in enabled.items())
    if kv is not None and kv_offload is not None:
        selection["kv_offload"] = kv_offload
    npus = _devices(r, gpu, args)
    servers = [Server(role="main", argv=[*launcher, *args], env=env, npus=npus)]
    servers += _companions(r, enabled, kv_offload, kv)
    packages = _install_names(r, kv.get("install")) if kv is not None else []
    return ServeSpec(
        recipe=r.name,
        kind="vllm",
        selection=selection,
        servers=servers,
        requirements=Requirements(packages=packages, models=_models(launcher[-1], args)),
        compile_fingerprint=None,
    )


def _build(
    r: VllmRecipe,
    vname: str,
    strategy: str | None,
    gpu: str,
    size: int,
    enabled: dict[str, str | None],
    kv: dict[str, Any] | None,
) -> tuple[list[str], dict[str, str]]:
    """The deduplicated arguments (after the model) and the env of a selection."""
    n = r.name
    model = r.data["model"]
    variant = r.variants[vname]
    strat = r.strategies[strategy] if strategy else {}
    layers = dict(_layers(r, vname, strategy, gpu))
    so_where = f"{n}: strategy_overrides.{strategy}"
    where = {
        "variant_gpu": f"{n}: variants.{vname}.hardware_overrides.{gpu}",
        "strategy_overrides": so_where,
        "strategy_generation": f"{so_where}.hardware_overrides",
        "recipe_generation": f"{n}: hardware_overrides",
        "variant_generation": f"{n}: variants.{vname}.hardware_overrides",
        "recipe_gpu": f"{n}: hardware_overrides.{gpu}",
        "strategy_gpu": f"{so_where}.hardware_overrides.{gpu}",
    }

    def block_args(label: str, *keys: str) -> list[Item]:
        b = layers.get(label) or {}
        return [t for k in keys for t in items(b.get(k), f"{where[label]}.{k}")]

    def block_env(label: str, *keys: str) -> dict[str, str]:
        b = layers.get(label) or {}
        out: dict[str, str] = {}
        for k in keys:
            out.update(env_map(b.get(k), f"{where[label]}.{k}"))
        return out

    hw_labels = [k for k in layers if k not in ("variant_gpu", "strategy_overrides")]
    seq: list[Item] = []
    seq += items(model.get("base_args"), f"{n}: model.base_args")  # 1
    seq += items(variant.get("extra_args"), f"{n}: variants.{vname}.extra_args")  # 2
    seq += block_args("variant_gpu", "extra_args")
    if strategy:
        seq += items(strat.get("vllm_args"), f"strategy {strategy}.vllm_args")  # 3
        flag = str(strat.get("parallel_flag") or "--tensor-parallel-size")
        seq += [(flag, f"strategy {strategy}.parallel_flag"), (str(size), "parallel size")]
        seq += block_args("strategy_overrides", "extra_args", "vllm_args")  # 4
    for label in hw_labels:  # 5
        seq += block_args(label, "extra_args")
    blocks = {name: _feature_block(r, name, mode, gpu) for name, mode in enabled.items()}
    for feature_args, _ in blocks.values():  # 7
        seq += feature_args
    if kv is not None:  # 8
        seq += items(kv.get("args"), "taxonomy kv_offload.args")

    env: dict[str, str] = {}
    env.update(env_map(model.get("base_env"), f"{n}: model.base_env"))
    if vname != "default":
        env.update(env_map(variant.get("extra_env"), f"{n}: variants.{vname}.extra_env"))
    env.update(env_map(strat.get("env"), f"strategy {strategy}.env"))
    if kv is not None:
        env.update(env_map(kv.get("env"), "taxonomy kv_offload.env"))
    for label in ("strategy_generation", "recipe_generation", "variant_generation"):
        env.update(block_env(label, "extra_env"))
    env.update(block_env("variant_gpu", "extra_env"))
    env.update(block_env("recipe_gpu", "extra_env"))
    env.update(block_env("strategy_overrides", "env", "extra_env"))
    env.update(block_env("strategy_gpu", "extra_env"))
    for _, feature_env in blocks.values():
        env.update(feature_env)
    return dedupe_args(words(seq)), env


def _omni_task(r: VllmRecipe, task: str | None) -> tuple[str | None, dict[str, Any]]:
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


def _build_omni(
    r: VllmRecipe, vname: str, gpu: str, task: dict[str, Any]
) -> tuple[list[str], list[str], dict[str, str]]:
    """The site's ``resolveOmniCommand``: launcher (with the model), arguments, env."""
    n = r.name
    model = r.data["model"]
    variant = r.variants[vname]
    prof = r.profiles[gpu]
    omni = r.data.get("omni") or {}
    r_ho = r.data.get("hardware_overrides") or {}
    v_ho = variant.get("hardware_overrides") or {}
    hw = [
        (f"{n}: hardware_overrides", _generation_block(r_ho, prof) or {}),
        (f"{n}: variants.{vname}.hardware_overrides", _generation_block(v_ho, prof) or {}),
        (f"{n}: variants.{vname}.hardware_overrides.{gpu}", v_ho.get(gpu) or {}),
    ]
    seq = items(model.get("base_args"), f"{n}: model.base_args")
    if vname != "default":
        seq += items(variant.get("extra_args"), f"{n}: variants.{vname}.extra_args")
    seq += items(task.get("extra_args"), f"{n}: omni.tasks.{task.get('id')}.extra_args")
    for w, block in hw:
        seq += items(block.get("extra_args"), f"{w}.extra_args")
    if omni.get("port"):
        seq += [("--port", f"{n}: omni.port"), (str(omni["port"]), f"{n}: omni.port")]
    seq.append(("--omni", "omni"))
    env = dict(env_map(model.get("base_env"), f"{n}: model.base_env"))
    if vname != "default":
        env.update(env_map(variant.get("extra_env"), f"{n}: variants.{vname}.extra_env"))
    for w, block in hw:
        env.update(env_map(block.get("extra_env"), f"{w}.extra_env"))
    binary = str(omni.get("serve_binary") or "vllm serve")
    try:
        launcher = shlex.split(binary)
    except ValueError as e:
        raise RecipeError(f"{n}: omni.serve_binary {binary!r} does not split ({e})") from None
    model_id = str(task.get("model_id") or variant.get("model_id") or model["model_id"])
    return [*launcher, model_id], dedupe_args(words(seq)), env


def _kv_option(
    r: VllmRecipe, key: str | None, strategy: str | None, gpu: str
) -> dict[str, Any] | None:
    """The chosen KV-offload option after the site's gates, or None when none is chosen."""
    if key is None:
        return None
    options = r.kv_offload_options
    here = kv_offload_offered(r, gpu, strategy)
    if key not in options:
        raise RecipeError(
            f"{r.name}: unknown KV offload option {key!r} (options: {', '.join(options) or 'none'})"
        )
    if key not in here:
        why = _kv_refusal(r, key, strategy, gpu)
        raise RecipeError(
            f"{r.name}: KV offload {key} is not offered here: {why} "
            f"(options here: {', '.join(here) or 'none'})"
        )
    return dict(options[key])


def _kv_refusal(r: VllmRecipe, key: str, strategy: str | None, gpu: str) -> str | None:
    """Why a KV-offload option is not offered (None when it is)."""
    opt = r.kv_offload_options[key]
    allow = opt.get("strategies")
    if allow and strategy not in allow:
        with_what = f"strategy {strategy}" if strategy else "a recipe without strategies"
        return f"not with {with_what} (its strategies: {', '.join(allow)})"
    support = (r.data.get("kv_offload_support") or {}).get(key)
    if support == "unsupported":
        return f"the recipe marks it unsupported (kv_offload_support.{key})"
    if opt.get("requires_opt_in") and support != "verified":
        return f"it needs kv_offload_support.{key}: verified in the recipe"
    brands = opt.get("brands")
    brand = r.profiles[gpu].get("brand")
    if brands and brand not in brands:
        return f"not on {gpu} ({brand}; its brands: {', '.join(brands)})"
    return None


def kv_offload_offered(r: VllmRecipe, gpu: str, strategy: str | None) -> list[str]:
    """The KV-offload options of the taxonomy a selection may compose with (none for omni).

    + r: the recipe
    + gpu: the GPU id
    + strategy: the serving strategy (None for a recipe without strategies)
    """
    if r.is_omni:
        return []
    return [k for k in r.kv_offload_options if _kv_refusal(r, k, strategy, gpu) is None]


def _companions(
    r: VllmRecipe, enabled: dict[str, str | None], kv_key: str | None, kv: dict[str, Any] | None
) -> list[Server]:
    """Helper processes that run beside ``vllm serve`` on the same host (no GPU of their own):
    the ``companion`` of each enabled feature, then the KV-offload option's."""
    out: list[tuple[str, str, Any]] = []
    for name in enabled:
        companion = r.features[name].get("companion") or {}
        if companion.get("command"):
            out.append((f"companion-{name}", f"{r.name}: features.{name}.companion", companion))
    if kv is not None and (kv.get("companion") or {}).get("command"):
        out.append((f"companion-kv-{kv_key}", f"kv_offload.{kv_key}.companion", kv["companion"]))
    servers = []
    for role, where, companion in out:
        text = str(companion["command"]).replace("\\\n", " ")
        try:
            argv = shlex.split(text, comments=True)
        except ValueError as e:
            raise RecipeError(f"{where}.command does not split as a shell command ({e})") from None
        if not argv:
            raise RecipeError(f"{where}.command holds no command")
        servers.append(Server(role=role, argv=argv, env={}, npus=0))
    return servers


def _install_names(r: VllmRecipe, install: Any) -> list[str]:
    """Distribution names a ``pip install`` line installs (``uv pip install "lmcache==0.5.1"``)."""
    if not isinstance(install, str):
        return []
    try:
        toks = shlex.split(install)
    except ValueError:
        return []
    if "install" not in toks:
        return []
    reqs = [t for t in toks[toks.index("install") + 1 :] if not t.startswith("-")]
    return [re.split(r"[<>=!~\[;@ ]", req, maxsplit=1)[0] for req in reqs if req]


def _canonical(tok: str) -> str:
    name = flag_name(tok)
    return "--" + name[2:].replace("_", "-") if name.startswith("--") else name


def _parallel_values(args: list[str]) -> dict[str, tuple[str, str]]:
    """The last value of each parallel size flag: kind -> (flag as written, value)."""
    out: dict[str, tuple[str, str]] = {}
    for i, tok in enumerate(args):
        kind = _PARALLEL.get(_canonical(tok)) if is_flag(tok) else None
        if kind is None:
            continue
        if "=" in tok:
            out[kind] = (flag_name(tok), tok.split("=", 1)[1])
        elif i + 1 < len(args) and not is_flag(args[i + 1]):
            out[kind] = (tok, args[i + 1])
    return out


def _with_size(args: list[str], flag: str | None, tp: int | None) -> list[str]:
    """The arguments with an explicit ``--tp`` as the strategy's parallel flag's value, wherever
    a layer left that flag (added at the end when no layer names it)."""
    if tp is None:
        return args
    flag = flag or "--tensor-parallel-size"
    kind = _PARALLEL.get(_canonical(flag))
    out, found = [], False
    i = 0
    while i < len(args):
        tok = args[i]
        same = is_flag(tok) and (
            _canonical(tok) == _canonical(flag) or (kind and _PARALLEL.get(_canonical(tok)) == kind)
        )
        if same and "=" in tok:
            out.append(f"{flag_name(tok)}={tp}")
            found = True
        elif same and i + 1 < len(args) and not is_flag(args[i + 1]):
            out += [tok, str(tp)]
            found = True
            i += 1
        else:
            out.append(tok)
        i += 1
    return out if found else [*out, flag, str(tp)]


def _devices(r: VllmRecipe, gpu: str, args: list[str]) -> int:
    """GPUs the server takes: tensor x data x pipeline parallel size of its final arguments."""
    total = 1
    for flag, value in _parallel_values(args).values():
        try:
            n = int(value)
        except ValueError:
            raise RecipeError(
                f"{r.name}: {flag} {value!r} on {gpu} is not a whole number of GPUs"
            ) from None
        if n < 1:
            raise RecipeError(f"{r.name}: {flag} {value} on {gpu} is not a positive GPU count")
        total *= n
    count = int(r.profiles[gpu]["gpu_count"])
    # A CPU profile's gpu_count is no physical limit (the site does not cap its TP either).
    if total > count and _generation(r.profiles[gpu]) != "cpu":
        sizes = " x ".join(f"{f} {v}" for f, v in _parallel_values(args).values())
        raise RecipeError(
            f"{r.name}: the command asks for {total} GPUs ({sizes}) but {gpu} has {count}"
        )
    return total


def _models(model_id: str, argv: list[str]) -> list[str]:
    """The served model and a draft model named in ``--speculative-config``."""
    models = [model_id]
    for i, tok in enumerate(argv):
        raw = None
        if tok == "--speculative-config" and i + 1 < len(argv):
            raw = argv[i + 1]
        elif tok.startswith("--speculative-config="):
            raw = tok.split("=", 1)[1]
        if raw is None:
            continue
        try:
            cfg = json.loads(raw)
        except json.JSONDecodeError:
            continue
        draft = cfg.get("model") if isinstance(cfg, dict) else None
        if isinstance(draft, str) and draft and draft not in models:
            models.append(draft)
    return models
