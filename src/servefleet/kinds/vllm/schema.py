"""The shape of vLLM recipes and their shared files, checked once at load time.

Liberal where the recipe collection is: optional sections may be absent or empty, unknown keys
are ignored, and a reference to vocabulary the taxonomy does not define (a GPU id in
``meta.hardware``, a task, a platform, an ``opt_in_features`` name) is ignored as the recipes site
ignores it. Strict about shapes and closed value sets: a wrong type, or a value outside a
tri-state such as ``verified | unsupported``, raises a one-line RecipeError naming the field and
the allowed values. After this, resolving never meets a bad type.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from servefleet.base.errors import RecipeError
from servefleet.base.vllm_args import env_map
from servefleet.kinds.base import launcher_problem, model_problem
from servefleet.kinds.loader import NOT_A_NAME
from servefleet.kinds.vllm import words

DEPLOY_TYPES = ("single_node", "multi_node", "pd_cluster", "kv_store_lb")
ORIENTATIONS = ("latency", "balanced", "throughput", "production")
ARCHITECTURES = ("dense", "moe")
HARDWARE_STATES = ("verified", "unsupported")
# meta.hardware: the site only tests ``!== "unsupported"``; recipes also write ``supported``.
META_HARDWARE_STATES = ("verified", "supported", "unsupported")
STRATEGY_STATES = ("supported", "unsupported")
MODE_HARDWARE_STATES = ("supported", "unsupported", "verified")
INSTALL_MODES = ("pip", "docker")


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def mapping(value: Any, where: str) -> dict[str, Any]:
    """A mapping, ``{}`` for an absent (null) one.

    + value: the value from the file
    + where: the location, for the error message
    """
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise RecipeError(f"{where}: expected a mapping, got {_kind(value)}")
    return value


def entries(value: Any, where: str) -> dict[str, Any]:
    """A mapping of named blocks (``variants``, ``features``, ``hardware_overrides``, ...), each
    null one made ``{}`` in place (``amd_fp8:`` with nothing under it is a block with nothing
    in it, as the site reads it), so nothing after the checks meets a null block.

    + value: the value from the file
    + where: the location, for the error message
    """
    m = mapping(value, where)
    for key, block in m.items():
        if block is None:
            m[key] = {}
    return m


def _text(value: Any, where: str, required: bool = False) -> None:
    if value is None and not required:
        return
    if not isinstance(value, str) or (required and not value):
        raise RecipeError(f"{where}: expected a non-empty string, got {_kind(value)}")


def _model_id(value: Any, where: str, required: bool = False) -> None:
    """A model the servers serve: an id (``openai/gpt-oss-120b``) or a local directory."""
    if value is None and not required:
        return
    problem = model_problem(value, where, paths=True)
    if problem:
        raise RecipeError(problem)


def _texts(value: Any, where: str, what: str = "strings") -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise RecipeError(f"{where}: expected a list of {what}, got {_kind(value)}")
    for v in value:
        if NOT_A_NAME.search(v):  # a strategy, feature, task or GPU id
            raise RecipeError(
                f"{where}: {v[:80]!r} is not a name; allowed: {what} of printable text (no "
                "control characters or line breaks)"
            )
    return value


def _text_or_texts(value: Any, where: str) -> None:
    if value is not None and not isinstance(value, str):
        _texts(value, where)


def _flag(value: Any, where: str) -> None:
    if value is not None and not isinstance(value, bool):
        raise RecipeError(f"{where}: expected true or false, got {value!r}")


def _number(value: Any, where: str) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise RecipeError(f"{where}: expected a number, got {value!r}")


def _count(value: Any, where: str, required: bool = False) -> None:
    if value is None and not required:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise RecipeError(f"{where}: expected a positive integer, got {value!r}")


def _one_of(value: Any, where: str, allowed: Iterable[str]) -> None:
    allowed = tuple(allowed)
    if value is not None and value not in allowed:
        raise RecipeError(f"{where}: {value!r} is not one of {' | '.join(allowed)}")


def _states(value: Any, where: str, allowed: tuple[str, ...]) -> None:
    for key, state in mapping(value, where).items():
        if state not in allowed:
            raise RecipeError(f"{where}.{key}: {state!r} is not one of {' | '.join(allowed)}")


def _keyed_count(value: Any, where: str) -> None:
    """A positive integer, or a map ``gpu id | generation | brand | default -> integer``."""
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and value > 0):
        return
    if not isinstance(value, dict):
        raise RecipeError(
            f"{where}: expected a positive integer or a mapping of GPU id, generation, brand "
            f"or default to one, got {value!r}"
        )
    for key, n in value.items():
        _count(n, f"{where}.{key}", required=True)


def _env(value: Any, where: str) -> None:
    env_map(value, where)


def _block(value: Any, where: str, args: Iterable[str], envs: Iterable[str]) -> dict[str, Any]:
    b = mapping(value, where)
    for k in args:
        words.check(b.get(k), f"{where}.{k}")
    for k in envs:
        _env(b.get(k), f"{where}.{k}")
    return b


def _overrides(value: Any, where: str, args: str, env: str) -> dict[str, Any]:
    """``hardware_overrides``: key -> block with an argument list and an env map."""
    ho = entries(value, where)
    for key, block in ho.items():
        b = _block(block, f"{where}.{key}", (args,), (env,))
        _text(b.get("docker_image"), f"{where}.{key}.docker_image")
        mapping(b.get("install"), f"{where}.{key}.install")
    return ho


def _docker_image(value: Any, where: str) -> None:
    if value is None or isinstance(value, str):
        return
    for key, image in mapping(value, where).items():
        if isinstance(image, dict):
            for k, v in image.items():
                _text(v, f"{where}.{key}.{k}", required=True)
        else:
            _text(image, f"{where}.{key}", required=True)


def _companion(value: Any, where: str) -> None:
    c = mapping(value, where)
    if c:
        _text(c.get("command"), f"{where}.command", required=True)
        _text(c.get("label"), f"{where}.label")
        _text(c.get("description"), f"{where}.description")


# ---------------------------------------------------------------------------------------------
# Shared files: taxonomy.yaml, strategies/*.yaml, platforms.yaml


def check_taxonomy(taxonomy: Any, where: str) -> None:
    """``taxonomy.yaml``: hardware profiles, tasks, strategy ids, KV-offload options.

    + taxonomy: the parsed file
    + where: the file, for the error message
    """
    if not isinstance(taxonomy, dict) or not isinstance(taxonomy.get("hardware_profiles"), dict):
        raise RecipeError(f"{where}: no hardware_profiles mapping")
    for gpu, prof in taxonomy["hardware_profiles"].items():
        w = f"{where}: hardware_profiles.{gpu}"
        if not isinstance(prof, dict) or not isinstance(prof.get("gpu_count"), int):
            raise RecipeError(f"{w} has no gpu_count")
        _count(prof["gpu_count"], f"{w}.gpu_count", required=True)
        _text(prof.get("brand"), f"{w}.brand")
        for k in ("generation", "gpu_generation"):
            _text_or_texts(prof.get(k), f"{w}.{k}")
        _number(prof.get("vram_gb"), f"{w}.vram_gb")
        for k in ("multi_node", "scalable", "restricted"):
            _flag(prof.get(k), f"{w}.{k}")
        for k in ("display_name", "description", "compute_arch"):
            _text(prof.get(k), f"{w}.{k}")
    for i, task in enumerate(taxonomy.get("tasks") or []):
        if not isinstance(task, str):
            _text(mapping(task, f"{where}: tasks[{i}]").get("id"), f"{where}: tasks[{i}].id", True)
    _texts(taxonomy.get("strategies"), f"{where}: strategies")
    for key, group in entries(
        taxonomy.get("kv_offload_groups"), f"{where}: kv_offload_groups"
    ).items():
        mapping(group, f"{where}: kv_offload_groups.{key}")
    for key, opt in entries(taxonomy.get("kv_offload"), f"{where}: kv_offload").items():
        w = f"{where}: kv_offload.{key}"
        o = _block(opt, w, ("args",), ("env",))
        _texts(o.get("strategies"), f"{w}.strategies", "strategy ids")
        _texts(o.get("brands"), f"{w}.brands", "brands")
        _flag(o.get("requires_opt_in"), f"{w}.requires_opt_in")
        _companion(o.get("companion"), f"{w}.companion")
        for k in ("install", "docs_url", "group", "label", "display_name", "description"):
            _text(o.get(k), f"{w}.{k}")
        _number(o.get("order"), f"{w}.order")


def check_strategy(s: Any, where: str) -> None:
    """One ``strategies/*.yaml``.

    + s: the parsed file
    + where: the file, for the error message
    """
    if not isinstance(s, dict):
        raise RecipeError(f"{where}: a strategy must be a mapping")
    _text(s.get("name"), f"{where}: name")
    _one_of(s.get("deploy_type"), f"{where}: deploy_type", DEPLOY_TYPES)
    _one_of(s.get("orientation"), f"{where}: orientation", ORIENTATIONS)
    for k in ("display_name", "short_label", "description", "parallelism"):
        _text(s.get(k), f"{where}: {k}")
    match = mapping(s.get("hardware_match"), f"{where}: hardware_match")
    for k in ("min_gpus", "max_gpus"):
        _count(match.get(k), f"{where}: hardware_match.{k}")
    _flag(match.get("multi_node"), f"{where}: hardware_match.multi_node")
    _one_of(match.get("architecture"), f"{where}: hardware_match.architecture", ARCHITECTURES)
    words.check(s.get("vllm_args"), f"{where}: vllm_args")
    _env(s.get("env"), f"{where}: env")
    flag = s.get("parallel_flag")
    if flag is not None and (not isinstance(flag, str) or not flag.startswith("-")):
        raise RecipeError(f"{where}: parallel_flag: expected a flag such as --tensor-parallel-size")
    for role in ("prefill", "decode"):
        _block(s.get(role), f"{where}: {role}", ("vllm_args",), ("env",))
    mapping(s.get("router"), f"{where}: router")


def check_platforms(doc: Any, where: str) -> list[dict[str, Any]]:
    """``platforms.yaml``: ``platforms: [{id, name, url, blurb, install?}]``.

    + doc: the parsed file
    + where: the file, for the error message
    """
    platforms = mapping(doc, where).get("platforms") or []
    if not isinstance(platforms, list):
        raise RecipeError(f"{where}: platforms: expected a list")
    for i, p in enumerate(platforms):
        w = f"{where}: platforms[{i}]"
        mapping(p, w)
        _text(p.get("id"), f"{w}.id", required=True)
        for k in ("name", "url", "blurb", "install"):
            _text(p.get(k), f"{w}.{k}")
    return platforms


# ---------------------------------------------------------------------------------------------
# A recipe


def _check_platform_refs(value: Any, where: str) -> None:
    """``meta.platforms``: platform ids, or ``{id, blurb?, install?, url?, ...}`` objects that
    override the catalog entry's fields (the site's ``resolveRecipePlatforms``)."""
    if value is None:
        return
    if not isinstance(value, list):
        raise RecipeError(
            f"{where}: expected a list of platform ids or {{id, ...}} mappings, got {_kind(value)}"
        )
    for i, entry in enumerate(value):
        if isinstance(entry, str):
            continue
        if not isinstance(entry, dict):
            raise RecipeError(
                f"{where}[{i}]: expected a platform id or an {{id, ...}} mapping, got {_kind(entry)}"
            )
        _text(entry.get("id"), f"{where}[{i}].id", required=True)
        for k in ("name", "url", "blurb", "install"):
            _text(entry.get(k), f"{where}[{i}].{k}")


def _check_meta(meta: dict[str, Any], n: str) -> None:
    _states(meta.get("hardware"), f"{n}: meta.hardware", META_HARDWARE_STATES)
    _text(meta.get("default_hardware"), f"{n}: meta.default_hardware")
    _texts(meta.get("tasks"), f"{n}: meta.tasks", "task ids")
    _check_platform_refs(meta.get("platforms"), f"{n}: meta.platforms")


def _check_model(model: dict[str, Any], n: str) -> None:
    if not isinstance(model.get("model_id"), str) or not model["model_id"]:
        raise RecipeError(f"{n}: model.model_id is missing")
    _model_id(model["model_id"], f"{n}: model.model_id", required=True)
    words.check(model.get("base_args"), f"{n}: model.base_args")
    _env(model.get("base_env"), f"{n}: model.base_env")
    _docker_image(model.get("docker_image"), f"{n}: model.docker_image")
    _flag(model.get("nightly_required"), f"{n}: model.nightly_required")
    _text(model.get("architecture"), f"{n}: model.architecture")
    install = model.get("install")
    if install is not None and not isinstance(install, bool):
        mapping(install, f"{n}: model.install")


def _check_dependencies(deps: Any, n: str) -> None:
    if deps is None:
        return
    if not isinstance(deps, list):
        raise RecipeError(f"{n}: dependencies: expected a list of {{command, note?, ...}}")
    for i, dep in enumerate(deps):
        w = f"{n}: dependencies[{i}]"
        d = mapping(dep, w)
        _text(d.get("command"), f"{w}.command", required=True)
        _text(d.get("note"), f"{w}.note")
        _flag(d.get("optional"), f"{w}.optional")
        _text_or_texts(d.get("brand"), f"{w}.brand")
        for mode in _texts(d.get("install_modes"), f"{w}.install_modes", "install modes"):
            _one_of(mode, f"{w}.install_modes", INSTALL_MODES)


def _check_features(features: dict[str, Any], n: str) -> None:
    for fname, f in features.items():
        w = f"{n}: features.{fname}"
        f = _block(f, w, ("args",), ("env",))
        _text(f.get("label"), f"{w}.label")
        _text(f.get("description"), f"{w}.description")
        _texts(f.get("strategies"), f"{w}.strategies", "strategy ids")
        _overrides(f.get("hardware_overrides"), f"{w}.hardware_overrides", "args", "env")
        _companion(f.get("companion"), f"{w}.companion")
        _text(f.get("default_mode"), f"{w}.default_mode")
        for mname, m in entries(f.get("modes"), f"{w}.modes").items():
            mw = f"{w}.modes.{mname}"
            m = _block(m, mw, ("args",), ("env",))
            _texts(m.get("variants"), f"{mw}.variants", "variant names")
            _overrides(m.get("hardware_overrides"), f"{mw}.hardware_overrides", "args", "env")
            _states(m.get("hardware"), f"{mw}.hardware", MODE_HARDWARE_STATES)
            _text(m.get("label"), f"{mw}.label")


def _check_variant(v: Any, w: str) -> None:
    v = _block(v, w, ("extra_args",), ("extra_env",))
    _model_id(v.get("model_id"), f"{w}.model_id")
    _number(v.get("vram_minimum_gb"), f"{w}.vram_minimum_gb")
    _texts(v.get("supported_hardware"), f"{w}.supported_hardware", "GPU ids")
    need = mapping(v.get("precision_hardware"), f"{w}.precision_hardware")
    _text(need.get("brand"), f"{w}.precision_hardware.brand")
    _text(need.get("generation"), f"{w}.precision_hardware.generation")
    _keyed_count(v.get("tp"), f"{w}.tp")
    _flag(v.get("nightly_required"), f"{w}.nightly_required")
    for feat, mode in mapping(v.get("default_modes"), f"{w}.default_modes").items():
        _text(mode, f"{w}.default_modes.{feat}", required=True)
    _docker_image(v.get("docker_image"), f"{w}.docker_image")
    _overrides(v.get("hardware_overrides"), f"{w}.hardware_overrides", "extra_args", "extra_env")


def _check_strategy_overrides(so: dict[str, Any], n: str) -> None:
    for sname, block in so.items():
        w = f"{n}: strategy_overrides.{sname}"
        b = _block(block, w, ("extra_args", "vllm_args"), ("env", "extra_env"))
        _keyed_count(b.get("tp"), f"{w}.tp")
        _overrides(
            b.get("hardware_overrides"), f"{w}.hardware_overrides", "extra_args", "extra_env"
        )
        for role in ("prefill", "decode"):
            r = _block(b.get(role), f"{w}.{role}", ("extra_args", "vllm_args"), ("env",))
            _overrides(
                r.get("hardware_overrides"),
                f"{w}.{role}.hardware_overrides",
                "extra_args",
                "extra_env",
            )
        mapping(b.get("router"), f"{w}.router")
        _texts(b.get("pool_modes"), f"{w}.pool_modes", "pool modes")


def _check_strategy_min_gpus(value: Any, n: str) -> None:
    where = f"{n}: strategy_min_gpus"
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return
    if not isinstance(value, dict):
        raise RecipeError(
            f"{where}: expected a number or a mapping of strategy id or GPU id to a number"
        )
    for key, floor in value.items():
        if isinstance(floor, dict):
            for s, m in floor.items():
                _number(m, f"{where}.{key}.{s}")
        else:
            _number(floor, f"{where}.{key}")


def _check_omni(omni: Any, n: str) -> None:
    o = mapping(omni, f"{n}: omni")
    binary = o.get("serve_binary")
    problem = launcher_problem(binary, f"{n}: omni.serve_binary", "vllm") if binary else None
    if problem:
        raise RecipeError(problem)
    port = o.get("port")
    if not (isinstance(port, str) and port.isdigit()):
        _count(port, f"{n}: omni.port")
    tasks = o.get("tasks")
    if tasks is not None and not isinstance(tasks, list):
        raise RecipeError(f"{n}: omni.tasks: expected a list of task ids or {{id, ...}} mappings")
    for i, t in enumerate(tasks or []):
        if isinstance(t, str):
            continue
        w = f"{n}: omni.tasks[{i}]"
        t = _block(t, w, ("extra_args",), ())
        _text(t.get("id"), f"{w}.id", required=True)
        _model_id(t.get("model_id"), f"{w}.model_id")
        for k in ("key", "description", "label", "endpoint", "curl", "benchmark"):
            _text(t.get(k), f"{w}.{k}")
        _number(t.get("vram_minimum_gb"), f"{w}.vram_minimum_gb")
        for gpu, ho in entries(t.get("hardware_overrides"), f"{w}.hardware_overrides").items():
            hw = f"{w}.hardware_overrides.{gpu}"
            o = _block(ho, hw, ("extra_args",), ())
            _model_id(o.get("model_id"), f"{hw}.model_id")
            for k in ("label", "description", "endpoint", "curl"):
                _text(o.get(k), f"{hw}.{k}")
            _number(o.get("vram_minimum_gb"), f"{hw}.vram_minimum_gb")


# What the resolver reads of the JSON form's recommended_command: the selection it names
RECOMMENDED = {"hardware": "a GPU id", "strategy": "a strategy id", "variant": "a variant name"}


def check_recommended(rec: Any, n: str) -> None:
    """The recipes site's JSON form: its ``recommended_command`` (the default selection, and the
    strategies its ``alternatives`` link to). The rest of it (the site's rendered command) is
    not read.

    + rec: ``recommended_command``
    + n: the recipe's name, for the error message
    """
    r = mapping(rec, f"{n}: recommended_command")
    for key, what in RECOMMENDED.items():
        value = r.get(key)
        if value is not None and (not isinstance(value, str) or NOT_A_NAME.search(value)):
            shown = repr(value[:80]) if isinstance(value, str) else _kind(value)
            raise RecipeError(
                f"{n}: recommended_command.{key}: {shown} is not {what}; allowed: null or {what} "
                "(one line of text)"
            )
    alternatives = r.get("alternatives")
    if alternatives is not None and not isinstance(alternatives, dict):
        raise RecipeError(
            f"{n}: recommended_command.alternatives: expected a mapping, got "
            f"{_kind(alternatives)}; allowed: null or a mapping of strategy id to its page"
        )


def check_recipe(d: dict[str, Any], n: str, strategies: dict[str, Any]) -> None:
    """Every key the resolver or ``describe`` reads, with its type and allowed values.

    + d: the recipe mapping
    + n: the recipe's name, for the error message
    + strategies: the known strategies (``strategies/*.yaml``)
    """
    _check_meta(mapping(d.get("meta"), f"{n}: meta"), n)
    _check_model(mapping(d.get("model"), f"{n}: model"), n)
    _check_dependencies(d.get("dependencies"), n)
    features = entries(d.get("features"), f"{n}: features")
    _check_features(features, n)
    _texts(d.get("opt_in_features"), f"{n}: opt_in_features", "feature names")
    for gpu, names in mapping(
        d.get("hardware_opt_in_features"), f"{n}: hardware_opt_in_features"
    ).items():
        _texts(names, f"{n}: hardware_opt_in_features.{gpu}", "feature names")
    variants = entries(d.get("variants"), f"{n}: variants")
    if "default" not in variants:
        raise RecipeError(f"{n}: variants must include 'default' (has: {', '.join(variants)})")
    for vname, v in variants.items():
        _check_variant(v, f"{n}: variants.{vname}")
    compat = _texts(d.get("compatible_strategies"), f"{n}: compatible_strategies", "strategy ids")
    _text(d.get("default_strategy"), f"{n}: default_strategy")
    sh = mapping(d.get("strategy_hardware"), f"{n}: strategy_hardware")
    for s, gate in sh.items():
        _states(gate, f"{n}: strategy_hardware.{s}", STRATEGY_STATES)
    granted = [s for s, gate in sh.items() if "supported" in (gate or {}).values()]
    unknown = [s for s in dict.fromkeys(compat + granted) if s not in strategies]
    if unknown:
        raise RecipeError(
            f"{n}: compatible_strategies names unknown strategies {', '.join(unknown)} "
            f"(known: {', '.join(strategies)})"
        )
    _check_strategy_min_gpus(d.get("strategy_min_gpus"), n)
    _states(d.get("kv_offload_support"), f"{n}: kv_offload_support", HARDWARE_STATES)
    for kv, gate in mapping(
        d.get("kv_cache_strategy_hardware"), f"{n}: kv_cache_strategy_hardware"
    ).items():
        _states(gate, f"{n}: kv_cache_strategy_hardware.{kv}", ("unsupported", "supported"))
    _overrides(d.get("hardware_overrides"), f"{n}: hardware_overrides", "extra_args", "extra_env")
    _check_strategy_overrides(entries(d.get("strategy_overrides"), f"{n}: strategy_overrides"), n)
    _check_omni(d.get("omni"), n)
    _text(d.get("guide"), f"{n}: guide")
