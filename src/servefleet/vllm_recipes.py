"""vLLM recipes (GPU hosts): load a recipe YAML or the recipes site's JSON, resolve a selection.

The recipe format is vllm-project/recipes' (``models/<org>/<name>.yaml`` with the shared
``taxonomy.yaml`` and ``strategies/*.yaml``); the site's JSON form of a model carries the same
keys plus a ``recommended_command``. Both resolve with the same code. Pure: no pyinfra import.

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
8. (KV offload: not offered here)

then ``dedupe_args``: the last occurrence of each flag wins. Env: ``base_env`` -> variant
``extra_env`` (non-default variants) -> strategy env -> hardware overrides (same order as the
args) -> ``strategy_overrides`` env -> features' env.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from servefleet.errors import RecipeError
from servefleet.spec import Requirements, Server, ServeSpec
from servefleet.vllm_args import dedupe_args, env_map, token_list

# Precision -> the hardware it needs, unless the variant sets ``precision_hardware``.
PRECISION_HARDWARE = {
    "nvfp4": {"brand": "NVIDIA", "generation": "blackwell"},
    "fp4": {"brand": "NVIDIA", "generation": "blackwell"},
}


def _shipped_vllm_dir() -> Path:
    try:
        from servefleet.recipes import RECIPES_DIR
    except ImportError:  # pragma: no cover - the recipes module is written in parallel
        return Path(__file__).resolve().parents[2] / "recipes" / "vllm"
    return Path(RECIPES_DIR) / "vllm"


@dataclass(frozen=True)
class VllmRecipe:
    """A loaded vLLM recipe with the shared vocabulary it resolves against.

    + name: qualified name ``vllm/<org>/<name>``, or the path it was loaded from
    + path: the recipe file
    + form: ``yaml`` (recipe YAML) or ``json`` (the recipes site's JSON)
    + data: the recipe mapping
    + profiles: ``taxonomy.hardware_profiles`` (GPU id -> profile)
    + strategies: strategy name -> strategy mapping (``strategies/*.yaml``)
    + platforms: ``platforms.yaml`` entries (for display)
    + recommended: the JSON form's ``recommended_command`` (None for YAML)
    """

    name: str
    path: Path
    form: str
    data: dict[str, Any]
    profiles: dict[str, dict[str, Any]]
    strategies: dict[str, dict[str, Any]]
    platforms: list[dict[str, Any]] = field(default_factory=list)
    recommended: dict[str, Any] | None = None

    @property
    def model_id(self) -> str:
        return str(self.data["model"]["model_id"])

    @property
    def variants(self) -> dict[str, dict[str, Any]]:
        return self.data["variants"]

    @property
    def features(self) -> dict[str, dict[str, Any]]:
        return self.data.get("features") or {}

    @property
    def opt_in_features(self) -> list[str]:
        return list(self.data.get("opt_in_features") or [])

    @property
    def declared_hardware(self) -> dict[str, str]:
        return (self.data.get("meta") or {}).get("hardware") or {}

    @property
    def compatible_strategies(self) -> list[str]:
        """``compatible_strategies`` plus strategies granted ``supported`` in ``strategy_hardware``."""
        listed = list(self.data.get("compatible_strategies") or [])
        if self.recommended is not None and not listed:
            # The JSON form drops the list; its recommended strategy and the alternatives
            # it links to are the same set.
            cands = [self.recommended.get("strategy")]
            cands += list((self.recommended.get("alternatives") or {}).keys())
            listed = [c for c in dict.fromkeys(cands) if c in self.strategies]
        for s, gate in (self.data.get("strategy_hardware") or {}).items():
            if s not in listed and isinstance(gate, dict) and "supported" in gate.values():
                listed.append(s)
        return listed


# ---------------------------------------------------------------------------------------------
# Loading


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _parse(path: Path, text: str) -> Any:
    if path.suffix == ".json":
        try:
            return json.loads(text)
        except json.JSONDecodeError as e:
            raise RecipeError(
                f"{path}: malformed JSON at line {e.lineno} column {e.colno}: {e.msg}"
            ) from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e)
        raise RecipeError(f"{path}: malformed YAML{where}: {_one_line(str(problem))}") from None


def _read(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise RecipeError(f"{path}: cannot read: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise RecipeError(f"{path}: not UTF-8 text") from None
    return _parse(path, text)


@lru_cache(maxsize=64)
def _shared(root: str, stamp: tuple[int, ...]) -> tuple[dict[str, Any], dict[str, Any], list[Any]]:
    """Hardware profiles, strategies and platforms of one recipes root (cached per mtime)."""
    base = Path(root)
    taxonomy = _read(base / "taxonomy.yaml")
    if not isinstance(taxonomy, dict) or not isinstance(taxonomy.get("hardware_profiles"), dict):
        raise RecipeError(f"{base / 'taxonomy.yaml'}: no hardware_profiles mapping")
    profiles = taxonomy["hardware_profiles"]
    for gpu, prof in profiles.items():
        if not isinstance(prof, dict) or not isinstance(prof.get("gpu_count"), int):
            raise RecipeError(f"{base / 'taxonomy.yaml'}: hardware profile {gpu} has no gpu_count")
    strategies: dict[str, Any] = {}
    for f in sorted((base / "strategies").glob("*.yaml")):
        s = _read(f)
        if not isinstance(s, dict):
            raise RecipeError(f"{f}: a strategy must be a mapping")
        strategies[str(s.get("name") or f.stem)] = s
    platforms: list[Any] = []
    if (base / "platforms.yaml").is_file():
        platforms = (_read(base / "platforms.yaml") or {}).get("platforms") or []
    return profiles, strategies, platforms


def _stamp(root: Path) -> tuple[int, ...]:
    files = [root / "taxonomy.yaml", root / "platforms.yaml", *(root / "strategies").glob("*.yaml")]
    return tuple(f.stat().st_mtime_ns for f in sorted(files) if f.is_file())


def _find_root(path: Path) -> Path:
    for parent in path.resolve().parents:
        if (parent / "taxonomy.yaml").is_file():
            return parent
    return _shipped_vllm_dir()


def _qualified_name(path: Path, root: Path) -> str:
    try:
        rel = path.resolve().relative_to(root / "models")
    except ValueError:
        return str(path)
    if path.suffix == ".yaml" and len(rel.parts) == 2:
        return "vllm/" + rel.with_suffix("").as_posix()
    return str(path)


def load_vllm_recipe(path: Path) -> VllmRecipe:
    """Load a vLLM recipe YAML or the recipes site's JSON form, with its taxonomy and strategies.

    The shared files come from the nearest parent directory holding ``taxonomy.yaml``, else
    the shipped ``recipes/vllm``.

    + path: ``models/<org>/<name>.yaml`` or a site JSON file
    """
    path = Path(path)
    data = _read(path)
    if not isinstance(data, dict):
        raise RecipeError(f"{path}: a vLLM recipe must be a mapping, got {type(data).__name__}")
    root = _find_root(path)
    if not (root / "taxonomy.yaml").is_file():
        raise RecipeError(f"{path}: no taxonomy.yaml above it and none in {root}")
    profiles, strategies, platforms = _shared(str(root), _stamp(root))
    recommended = data.get("recommended_command") if path.suffix == ".json" else None
    if path.suffix == ".json" and not isinstance(recommended, dict):
        raise RecipeError(f"{path}: the JSON form has no recommended_command mapping")
    recipe = VllmRecipe(
        name=_qualified_name(path, root),
        path=path,
        form="json" if path.suffix == ".json" else "yaml",
        data=data,
        profiles=profiles,
        strategies=strategies,
        platforms=list(platforms),
        recommended=recommended,
    )
    _validate(recipe)
    return recipe


def _mapping(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise RecipeError(f"{where}: expected a mapping, got {type(value).__name__}")
    return value


_ARGS = ("extra_args", "args", "vllm_args")
_ENVS = ("extra_env", "env", "base_env")


def _validate_block(block: Any, where: str, overrides: bool = True) -> dict[str, Any]:
    """Check a block's argument lists, env maps and (one level of) hardware overrides."""
    b = _mapping(block, where)
    for k in _ARGS + ("base_args",):
        token_list(b.get(k), f"{where}.{k}")
    for k in _ENVS:
        env_map(b.get(k), f"{where}.{k}")
    if overrides:
        ho = f"{where}.hardware_overrides"
        for key, sub in _mapping(b.get("hardware_overrides"), ho).items():
            _validate_block(sub, f"{ho}.{key}", overrides=False)
    return b


def _validate(r: VllmRecipe) -> None:
    """Check the shape of every key the resolver reads, so resolving never meets a bad type."""
    d, n = r.data, r.name
    model = _validate_block(d.get("model"), f"{n}: model", overrides=False)
    if not isinstance(model.get("model_id"), str) or not model["model_id"]:
        raise RecipeError(f"{n}: model.model_id is missing")
    variants = _mapping(d.get("variants"), f"{n}: variants")
    if "default" not in variants:
        raise RecipeError(f"{n}: variants must include 'default' (has: {', '.join(variants)})")
    for vname, v in variants.items():
        v = _validate_block(v, f"{n}: variants.{vname}")
        if v.get("supported_hardware") is not None and not isinstance(
            v["supported_hardware"], list
        ):
            raise RecipeError(f"{n}: variants.{vname}.supported_hardware: expected a list")
    features = _mapping(d.get("features"), f"{n}: features")
    for fname, f in features.items():
        f = _validate_block(f, f"{n}: features.{fname}")
        for mname, m in _mapping(f.get("modes"), f"{n}: features.{fname}.modes").items():
            _validate_block(m, f"{n}: features.{fname}.modes.{mname}")
    opt_in = d.get("opt_in_features") or []
    if not isinstance(opt_in, list) or any(o not in features for o in opt_in):
        raise RecipeError(
            f"{n}: opt_in_features must list features of the recipe ({', '.join(features)})"
        )
    _validate_block({"hardware_overrides": d.get("hardware_overrides")}, f"{n}: recipe")
    for sname, so in _mapping(d.get("strategy_overrides"), f"{n}: strategy_overrides").items():
        _validate_block(so, f"{n}: strategy_overrides.{sname}")
    compat = d.get("compatible_strategies")
    if compat is not None and not isinstance(compat, list):
        raise RecipeError(f"{n}: compatible_strategies must be a list")
    unknown = [s for s in r.compatible_strategies if s not in r.strategies]
    if unknown:
        raise RecipeError(
            f"{n}: compatible_strategies names unknown strategies {', '.join(unknown)} "
            f"(known: {', '.join(r.strategies)})"
        )
    if not r.compatible_strategies:
        raise RecipeError(f"{n}: no compatible_strategies")
    _mapping((d.get("meta") or {}).get("hardware"), f"{n}: meta.hardware")


# ---------------------------------------------------------------------------------------------
# Hardware, variants, strategies


def _generation(profile: dict[str, Any]) -> str | None:
    gen = profile.get("generation") or profile.get("gpu_generation")
    if isinstance(gen, list):
        gen = gen[0] if gen else None
    return str(gen) if gen else None


def _brand(profile: dict[str, Any]) -> str | None:
    brand = profile.get("brand")
    return brand.lower() if isinstance(brand, str) else None


def _keyed(mapping: Any, gpu: str, profile: dict[str, Any]) -> Any:
    """A hardware-keyed value: exact GPU id > generation > brand > ``default``."""
    if not isinstance(mapping, dict):
        return None
    for key in (gpu, _generation(profile), _brand(profile), "default"):
        if key is not None and mapping.get(key) is not None:
            return mapping[key]
    return None


def _generation_block(overrides: Any, profile: dict[str, Any]) -> dict[str, Any] | None:
    """The override block for the profile's generation, else for its brand (``nvidia``)."""
    if not isinstance(overrides, dict):
        return None
    gen, brand = _generation(profile), _brand(profile)
    block = overrides.get(gen) if gen else None
    if block is None and brand:
        block = overrides.get(brand)
    return block


def _precision_need(variant: dict[str, Any]) -> dict[str, Any]:
    """The hardware a variant's precision needs (``precision_hardware`` or the built-in table)."""
    need = variant.get("precision_hardware")
    if isinstance(need, dict):
        return need
    return PRECISION_HARDWARE.get(str(variant.get("precision")), {})


def _precision_ok(profile: dict[str, Any], variant: dict[str, Any]) -> bool:
    need = _precision_need(variant)
    if not need:
        return True
    if need.get("brand") and profile.get("brand") != need["brand"]:
        return False
    return not need.get("generation") or _generation(profile) == need["generation"]


def _variant_runs(r: VllmRecipe, vname: str, gpu: str) -> bool:
    """Whether a variant may run on a GPU: precision, ``supported_hardware``, and for
    non-scalable hardware (one box, no scale-out) its ``vram_minimum_gb``."""
    v, prof = r.variants[vname], r.profiles[gpu]
    supported = v.get("supported_hardware")
    if supported and gpu not in supported:
        return False
    if not _precision_ok(prof, v):
        return False
    if prof.get("scalable") is False:
        need, have = v.get("vram_minimum_gb") or 0, prof.get("vram_gb") or 0
        return need <= 0 or have <= 0 or need <= have
    return True


def offered_hardware(r: VllmRecipe) -> list[str]:
    """GPU ids the recipe can be resolved for, in taxonomy order.

    A profile is offered unless ``meta.hardware`` marks it ``unsupported``, it is restricted
    and the recipe does not declare it, or no variant runs on it.

    + r: the recipe
    """
    declared = r.declared_hardware
    out = []
    for gpu, prof in r.profiles.items():
        if declared.get(gpu) == "unsupported":
            continue
        if prof.get("restricted") and gpu not in declared:
            continue
        if any(_variant_runs(r, v, gpu) for v in r.variants):
            out.append(gpu)
    return out


def _default_hardware(r: VllmRecipe, vname: str) -> str:
    """The site's landing hardware for a variant: ``meta.default_hardware``, B200/GB200 for
    Blackwell-only precisions, H200, else NVIDIA first then alphabetical."""
    offered = [g for g in offered_hardware(r) if _variant_runs(r, vname, g)]
    if not offered:
        raise RecipeError(f"{r.name}: variant {vname} runs on none of the recipe's hardware")
    authored = (r.data.get("meta") or {}).get("default_hardware")
    if authored in offered:
        return str(authored)
    if _precision_need(r.variants[vname]).get("generation") == "blackwell":
        for gpu in ("b200", "gb200"):
            if gpu in offered:
                return gpu
    if "h200" in offered:
        return "h200"
    order = {"NVIDIA": 0, "AMD": 1}
    return sorted(offered, key=lambda g: (order.get(str(r.profiles[g].get("brand")), 9), g))[0]


def _default_variant(r: VllmRecipe, gpu: str, preferred: str | None) -> str:
    for cand in (preferred, "default"):
        if cand in r.variants and _variant_runs(r, cand, gpu):
            return str(cand)
    fitting = [v for v in r.variants if _variant_runs(r, v, gpu)]
    if not fitting:
        raise RecipeError(
            f"{r.name}: no variant runs on {gpu}; hardware offered: "
            f"{', '.join(offered_hardware(r))}"
        )
    # Highest fidelity that fits: the largest footprint (the site's pickFittingVariant).
    fitting.sort(key=lambda v: -(r.variants[v].get("vram_minimum_gb") or 0))
    return fitting[0]


def _strategy_on(r: VllmRecipe, strategy: str, gpu: str) -> bool:
    gate = _keyed((r.data.get("strategy_hardware") or {}).get(strategy), gpu, r.profiles[gpu])
    if gate is not None:
        return gate != "unsupported"
    return strategy in (r.data.get("compatible_strategies") or r.compatible_strategies)


def _single_node(r: VllmRecipe, strategy: str) -> bool:
    return r.strategies[strategy].get("deploy_type", "single_node") == "single_node"


def _gpus_ok(r: VllmRecipe, strategy: str, gpu: str) -> bool:
    match = r.strategies[strategy].get("hardware_match") or {}
    count = r.profiles[gpu]["gpu_count"]
    return match.get("min_gpus", 1) <= count <= match.get("max_gpus", count)


def single_node_strategies(r: VllmRecipe, gpu: str) -> list[str]:
    """Compatible strategies that render as one ``vllm serve`` on one host of this GPU.

    + r: the recipe
    + gpu: a GPU id of the taxonomy
    """
    return [
        s
        for s in r.compatible_strategies
        if _strategy_on(r, s, gpu) and _single_node(r, s) and _gpus_ok(r, s, gpu)
    ]


def _default_strategy(r: VllmRecipe, gpu: str) -> str:
    usable = single_node_strategies(r, gpu)
    rec = (r.recommended or {}).get("strategy")
    for cand in (rec, r.data.get("default_strategy"), "single_node_tp"):
        if cand in usable:
            return str(cand)
    if usable:
        return usable[0]
    raise RecipeError(
        f"{r.name}: no single-node strategy runs on {gpu} (compatible: "
        f"{', '.join(r.compatible_strategies)}; multi-node strategies cannot be rendered for one host)"
    )


def parallel_size(r: VllmRecipe, vname: str, strategy: str, gpu: str) -> int:
    """GPUs the strategy's parallel flag spans on one host.

    ``single_node_tp``: the variant's ``tp``, else ``strategy_overrides.single_node_tp.tp``
    (a number or a map keyed by GPU id > generation > brand > ``default``), capped at the
    profile's ``gpu_count``; else 1 when ``vram_minimum_gb`` fits one GPU, else ``gpu_count``.
    Other strategies: ``gpu_count``.

    + r: the recipe
    + vname: the variant
    + strategy: the strategy
    + gpu: the GPU id
    """
    prof = r.profiles[gpu]
    count = int(prof["gpu_count"])
    if strategy != "single_node_tp":
        return count
    variant = r.variants[vname]
    so = ((r.data.get("strategy_overrides") or {}).get(strategy) or {}).get("tp")
    for raw in (variant.get("tp"), so):
        declared = raw if isinstance(raw, int) else _keyed(raw, gpu, prof)
        if isinstance(declared, int) and not isinstance(declared, bool) and declared > 0:
            return min(declared, count)
    need = variant.get("vram_minimum_gb") or 0
    per_gpu = (prof.get("vram_gb") or 0) / count if count else 0
    if not need or per_gpu <= 0:
        return count
    return 1 if need <= per_gpu else count


# ---------------------------------------------------------------------------------------------
# Features


def _parse_features(
    r: VllmRecipe, features: list[str], no_features: list[str]
) -> dict[str, str | None]:
    known = r.features
    names = ", ".join(known) or "none"
    wanted: dict[str, str | None] = {}
    for item in features:
        name, sep, mode = item.partition("=")
        if name not in known:
            raise RecipeError(f"{r.name}: unknown feature {name!r} (features: {names})")
        if sep and not mode:
            raise RecipeError(f"{r.name}: --feature {item!r} names no mode")
        wanted[name] = mode if sep else None
    for name in no_features:
        if name not in known:
            raise RecipeError(f"{r.name}: unknown feature {name!r} (features: {names})")
        if name in wanted:
            raise RecipeError(f"{r.name}: feature {name} is both turned on and off")
    return wanted


def _mode_allowed(mode: dict[str, Any], vname: str, gpu: str, prof: dict[str, Any]) -> bool:
    allow = mode.get("variants")
    if isinstance(allow, list) and allow and vname not in allow:
        return False
    hw = mode.get("hardware")
    if isinstance(hw, dict):
        if hw.get(_generation(prof)) == "unsupported" or hw.get(gpu) == "unsupported":
            return False
    return True


def _select_features(
    r: VllmRecipe, vname: str, strategy: str, gpu: str, features: list[str], no_features: list[str]
) -> dict[str, str | None]:
    """Enabled features (recipe order) -> selected mode (None for a plain feature)."""
    wanted = _parse_features(r, features, no_features)
    prof, variant = r.profiles[gpu], r.variants[vname]
    on: dict[str, str | None] = {}
    for name, feat in r.features.items():
        explicit = name in wanted
        if name in no_features or (not explicit and name in r.opt_in_features):
            continue
        allow = feat.get("strategies")
        if isinstance(allow, list) and allow and strategy not in allow:
            if explicit:
                raise RecipeError(
                    f"{r.name}: feature {name} is not offered with strategy {strategy} "
                    f"(its strategies: {', '.join(allow)})"
                )
            continue
        picked = wanted.get(name)
        modes = feat.get("modes")
        if not isinstance(modes, dict) or not modes:
            if picked is not None:
                raise RecipeError(f"{r.name}: feature {name} has no modes; use --feature {name}")
            on[name] = None
            continue
        here = [m for m, spec in modes.items() if _mode_allowed(spec or {}, vname, gpu, prof)]
        if picked is not None:
            if picked not in modes:
                raise RecipeError(
                    f"{r.name}: unknown mode {picked!r} of feature {name} (modes: {', '.join(modes)})"
                )
            if picked not in here:
                raise RecipeError(
                    f"{r.name}: mode {picked} of feature {name} does not run with variant "
                    f"{vname} on {gpu} (modes here: {', '.join(here) or 'none'})"
                )
        cands = [picked, (variant.get("default_modes") or {}).get(name), feat.get("default_mode")]
        mode = next((c for c in cands if c in here), here[0] if here else None)
        if mode is None:
            if explicit:
                raise RecipeError(
                    f"{r.name}: feature {name} has no mode for variant {vname} on {gpu} "
                    f"(modes: {', '.join(modes)})"
                )
            continue
        on[name] = mode
    return on


def _feature_block(r: VllmRecipe, name: str, mode: str | None, gpu: str) -> dict[str, Any]:
    """The args/env a feature (or its mode) contributes; a hardware override replaces them."""
    feat = r.features[name]
    spec = feat["modes"][mode] if mode is not None else feat
    ho = _keyed(spec.get("hardware_overrides"), gpu, r.profiles[gpu]) or {}
    w = f"{r.name}: features.{name}"
    args = ho.get("args") if ho.get("args") is not None else spec.get("args")
    env = ho.get("env") if ho.get("env") is not None else spec.get("env")
    return {"args": token_list(args, w), "env": env_map(env, w)}


# ---------------------------------------------------------------------------------------------
# Resolution


def _layers(r: VllmRecipe, vname: str, strategy: str, gpu: str) -> list[tuple[str, Any]]:
    """The override blocks of steps 2, 4 and 5, in order: (label, block with extra_args/env)."""
    prof = r.profiles[gpu]
    variant = r.variants[vname]
    so = (r.data.get("strategy_overrides") or {}).get(strategy) or {}
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
) -> ServeSpec:
    """Resolve a selection of a vLLM recipe to the ``vllm serve`` argv and env of one host.

    Unset axes take the recipe's defaults (the JSON form: its ``recommended_command``).

    + recipe: a loaded recipe
    + hardware: a GPU id of the taxonomy (``h200``, ``mi300x``, ...)
    + strategy: a single-node strategy the recipe is compatible with
    + variant: a variant name (``default``, ``fp8``, ...)
    + tp: the parallel size, overriding the recipe's rule
    + features: ``NAME`` (turn on) or ``NAME=MODE`` (turn on with a mode)
    + no_features: feature names to turn off
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
            f"{r.name}: strategy {strategy} does not fit {hardware}'s "
            f"{r.profiles[hardware]['gpu_count']} GPUs (single-node strategies: "
            f"{', '.join(usable) or 'none'})"
        )
    count = int(r.profiles[hardware]["gpu_count"])
    size = parallel_size(r, variant, strategy, hardware)
    if tp is not None:
        if isinstance(tp, bool) or not isinstance(tp, int) or not 1 <= tp <= count:
            raise RecipeError(f"{r.name}: --tp {tp} out of range for {hardware} (1..{count})")
        size = tp
    enabled = _select_features(r, variant, strategy, hardware, features, no_features)
    argv, env = _build(r, variant, strategy, hardware, size, enabled)
    selection = {
        "hardware": hardware,
        "strategy": strategy,
        "variant": variant,
        "features": ",".join(n if m is None else f"{n}={m}" for n, m in enabled.items()),
    }
    return ServeSpec(
        recipe=r.name,
        kind="vllm",
        selection=selection,
        servers=[Server(role="main", argv=argv, env=env, npus=size)],
        requirements=Requirements(models=_models(argv[2], argv)),
        compile_fingerprint=None,
    )


def _build(
    r: VllmRecipe,
    vname: str,
    strategy: str,
    gpu: str,
    size: int,
    enabled: dict[str, str | None],
) -> tuple[list[str], dict[str, str]]:
    n = r.name
    model = r.data["model"]
    variant = r.variants[vname]
    strat = r.strategies[strategy]
    layers = dict(_layers(r, vname, strategy, gpu))

    def block_args(label: str, *keys: str) -> list[str]:
        b = layers.get(label) or {}
        return [t for k in keys for t in token_list(b.get(k), f"{n}: {label}.{k}")]

    def block_env(label: str, *keys: str) -> dict[str, str]:
        b = layers.get(label) or {}
        out: dict[str, str] = {}
        for k in keys:
            out.update(env_map(b.get(k), f"{n}: {label}.{k}"))
        return out

    hw_labels = [k for k in layers if k not in ("variant_gpu", "strategy_overrides")]
    args: list[str] = []
    args += token_list(model.get("base_args"), f"{n}: model.base_args")  # 1
    args += token_list(variant.get("extra_args"), f"{n}: variants.{vname}.extra_args")  # 2
    args += block_args("variant_gpu", "extra_args")
    args += token_list(strat.get("vllm_args"), f"strategy {strategy}.vllm_args")  # 3
    args += [str(strat.get("parallel_flag") or "--tensor-parallel-size"), str(size)]
    args += block_args("strategy_overrides", "extra_args", "vllm_args")  # 4
    for label in hw_labels:  # 5
        args += block_args(label, "extra_args")
    blocks = {name: _feature_block(r, name, mode, gpu) for name, mode in enabled.items()}
    for b in blocks.values():  # 7
        args += b["args"]

    env: dict[str, str] = {}
    env.update(env_map(model.get("base_env"), f"{n}: model.base_env"))
    if vname != "default":
        env.update(env_map(variant.get("extra_env"), f"{n}: variants.{vname}.extra_env"))
    env.update(env_map(strat.get("env"), f"strategy {strategy}.env"))
    for label in ("strategy_generation", "recipe_generation", "variant_generation"):
        env.update(block_env(label, "extra_env"))
    env.update(block_env("variant_gpu", "extra_env"))
    env.update(block_env("recipe_gpu", "extra_env"))
    env.update(block_env("strategy_overrides", "env", "extra_env"))
    env.update(block_env("strategy_gpu", "extra_env"))
    for b in blocks.values():
        env.update(b["env"])

    model_id = str(variant.get("model_id") or model["model_id"])
    return ["vllm", "serve", model_id, *dedupe_args(args)], env


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


# ---------------------------------------------------------------------------------------------
# Display and listing


def describe_vllm(recipe: VllmRecipe) -> dict[str, Any]:
    """What a recipe offers, for ``servefleet recipes show``.

    + recipe: a loaded recipe
    """
    r = recipe
    offered = offered_hardware(r)
    feats: dict[str, Any] = {}
    for name, f in r.features.items():
        modes = f.get("modes") if isinstance(f.get("modes"), dict) else None
        feats[name] = {
            "description": str(f.get("description") or ""),
            "opt_in": name in r.opt_in_features,
            "modes": list(modes or {}),
            "default_mode": f.get("default_mode") if modes else None,
        }
    variants = {
        name: {
            "model_id": str(v.get("model_id") or r.model_id),
            "precision": v.get("precision"),
            "vram_minimum_gb": v.get("vram_minimum_gb"),
            "hardware": [g for g in offered if _variant_runs(r, name, g)],
        }
        for name, v in r.variants.items()
    }
    try:
        spec = resolve_vllm(r)
        recommended: dict[str, Any] = dict(spec.selection)
    except RecipeError as e:
        recommended = {"error": str(e)}
    return {
        "recipe": r.name,
        "kind": "vllm",
        "form": r.form,
        "model": r.model_id,
        "hardware": offered,
        "strategies": r.compatible_strategies,
        "single_node_strategies": {g: single_node_strategies(r, g) for g in offered},
        "variants": variants,
        "features": feats,
        "recommended": recommended,
    }


def list_vllm_recipes(root: Path) -> list[str]:
    """Qualified names ``vllm/<org>/<name>`` of every model YAML under a recipes directory.

    + root: ``recipes/`` or ``recipes/vllm`` (the directory holding ``models/``)
    """
    root = Path(root)
    models = root / "models" if (root / "models").is_dir() else root / "vllm" / "models"
    return [
        "vllm/" + p.relative_to(models).with_suffix("").as_posix()
        for p in sorted(models.glob("*/*.yaml"))
    ]
