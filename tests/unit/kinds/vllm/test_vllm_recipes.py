"""vLLM recipes: loading both forms, the layering order, last-wins dedupe, parallel size, errors.

Golden cases live in tests/data/golden/vllm/<case>.json (the recipe file, the resolve arguments
and the expected ServeSpec JSON); broken recipes in tests/data/vllm/.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, strategies as st
from regen_goldens import vllm_expected
from repo_paths import REPO

from servefleet.base.errors import RecipeError
from servefleet.base.shipped import FILES
from servefleet.base.vllm_args import dedupe_args, flag_name, is_flag
from servefleet.kinds.vllm import (
    VllmRecipe,
    describe_vllm,
    list_vllm_recipes,
    load_vllm_recipe,
    offered_hardware,
    resolve_vllm,
    single_node_strategies,
)
from servefleet.kinds.vllm.hardware import fits_one_node, is_cpu

VLLM = FILES / "recipes" / "vllm"
SEED = VLLM / "json" / "openai" / "gpt-oss-120b.json"
MODELS = sorted((VLLM / "models").glob("*/*.yaml"))
GOLDEN = sorted((REPO / "tests" / "data" / "golden" / "vllm").glob("*.json"))
BROKEN = REPO / "tests" / "data" / "vllm"
LAYERED = BROKEN / "layered.yaml"


def _model(rel: str) -> VllmRecipe:
    return load_vllm_recipe(VLLM / "models" / rel)


def _argv(recipe: VllmRecipe, **kw: Any) -> list[str]:
    return resolve_vllm(recipe, **kw).servers[0].argv


def _last_value(argv: list[str], flag: str) -> str | None:
    """The value the command gives a flag (last occurrence, either spelling), None if absent."""
    value = None
    for i, tok in enumerate(argv):
        if tok == flag:
            value = argv[i + 1] if i + 1 < len(argv) and not is_flag(argv[i + 1]) else ""
        elif tok.startswith(flag + "="):
            value = tok.split("=", 1)[1]
    return value


def _units(args: list[str]) -> list[tuple[str, str]]:
    """(flag, value) pairs of an argument list, as the recipe writes them."""
    out = []
    i = 0
    while i < len(args):
        tok = args[i]
        if "=" in tok:
            out.append((flag_name(tok), tok.split("=", 1)[1]))
        elif i + 1 < len(args) and not is_flag(args[i + 1]):
            out.append((tok, args[i + 1]))
            i += 1
        else:
            out.append((tok, ""))
        i += 1
    return out


def _flags(argv: list[str]) -> list[str]:
    return [flag_name(t) for t in argv if is_flag(t)]


# ---------------------------------------------------------------------------------------------
# Every shipped recipe resolves


def _matrix() -> list[tuple[str, str, str]]:
    cases = []
    for path in MODELS:
        recipe = load_vllm_recipe(path)
        declared = [g for g, v in recipe.declared_hardware.items() if v != "unsupported"]
        hardware = declared or offered_hardware(recipe)
        for gpu in hardware:
            if not fits_one_node(recipe, "default", gpu):
                continue  # refused: see test_a_model_too_big_for_one_node_is_refused
            for strategy in single_node_strategies(recipe, gpu):
                cases.append((str(path.relative_to(VLLM / "models")), gpu, strategy))
    return cases


MATRIX = _matrix()


def test_matrix_covers_every_recipe_and_strategy_kind() -> None:
    assert {c[0] for c in MATRIX} == {str(p.relative_to(VLLM / "models")) for p in MODELS}
    assert {c[2] for c in MATRIX} == {"single_node_tp", "single_node_tep", "single_node_dep"}


@pytest.mark.parametrize(("rel", "gpu", "strategy"), MATRIX)
def test_every_recipe_resolves(rel: str, gpu: str, strategy: str) -> None:
    recipe = _model(rel)
    spec = resolve_vllm(recipe, hardware=gpu, strategy=strategy)
    server = spec.servers[0]
    variant = recipe.variants[spec.selection["variant"]]
    model_id = variant.get("model_id") or recipe.data["model"]["model_id"]
    assert spec.kind == "vllm" and spec.recipe == "vllm/" + rel[: -len(".yaml")]
    assert server.argv[:3] == ["vllm", "serve", model_id]
    assert spec.selection["hardware"] == gpu and spec.selection["strategy"] == strategy
    flags = _flags(server.argv)
    assert len(flags) == len(set(flags)), f"a flag appears twice: {server.argv}"
    strat = yaml.safe_load((VLLM / "strategies" / f"{strategy}.yaml").read_text())
    assert _last_value(server.argv, strat["parallel_flag"]) == str(server.npus)
    for arg in strat.get("vllm_args") or []:
        assert arg in server.argv
    gpus = recipe.profiles[gpu]["gpu_count"]
    assert 1 <= server.npus and (is_cpu(recipe.profiles[gpu]) or server.npus <= gpus)
    if strategy != "single_node_tp":
        assert server.npus == gpus
    assert spec.requirements.models[0] == model_id
    assert all(isinstance(v, str) for v in server.env.values())


# ---------------------------------------------------------------------------------------------
# The seed JSON form


def test_seed_json_gives_its_recommended_command() -> None:
    recipe = load_vllm_recipe(SEED)
    rec = json.loads(SEED.read_text())["recommended_command"]
    spec = resolve_vllm(recipe)
    assert spec.servers[0].argv == rec["argv"]
    assert spec.servers[0].env == rec["env"]
    sel = spec.selection
    assert (sel["hardware"], sel["strategy"], sel["variant"]) == (
        rec["hardware"],
        rec["strategy"],
        rec["variant"],
    )
    assert "--tensor-parallel-size" in rec["argv"]
    assert spec.servers[0].npus == int(rec["argv"][rec["argv"].index("--tensor-parallel-size") + 1])


@pytest.mark.parametrize(("gpu", "block"), [("mi300x", "amd"), ("b200", "blackwell")])
def test_seed_json_hardware_overrides(gpu: str, block: str) -> None:
    data = json.loads(SEED.read_text())
    override = data["hardware_overrides"][block]
    spec = resolve_vllm(load_vllm_recipe(SEED), hardware=gpu)
    argv = spec.servers[0].argv
    for flag, value in _units(override["extra_args"]):
        assert _last_value(argv, flag) == value
    extra = override["extra_args"]
    start = argv.index(extra[0])
    assert argv[start : start + len(extra)] == extra
    assert spec.servers[0].env == (override.get("extra_env") or {})


def test_seed_json_and_yaml_share_the_resolver() -> None:
    from_json = resolve_vllm(load_vllm_recipe(SEED), hardware="mi355x")
    from_yaml = resolve_vllm(_model("openai/gpt-oss-120b.yaml"), hardware="mi355x")
    assert from_json.servers == from_yaml.servers


@pytest.mark.parametrize("case", GOLDEN, ids=[p.stem for p in GOLDEN])
def test_golden(case: Path) -> None:
    doc = json.loads(case.read_text())
    assert vllm_expected(doc) == doc["expected"]


def test_goldens_cover_the_required_cases() -> None:
    names = {p.stem for p in GOLDEN}
    assert {"seed-json-recommended", "seed-json-mi300x", "seed-json-b200"} <= names


# ---------------------------------------------------------------------------------------------
# Hardware overrides appear where the recipe defines them


def _generation_cases() -> list[tuple[str, str, str]]:
    cases = []
    for path in MODELS:
        recipe = load_vllm_recipe(path)
        for gpu in offered_hardware(recipe):
            gen = recipe.profiles[gpu]["generation"]
            if gen in ("amd", "blackwell") and gen in (recipe.data.get("hardware_overrides") or {}):
                cases.append((str(path.relative_to(VLLM / "models")), gpu, gen))
    return cases


@pytest.mark.parametrize(("rel", "gpu", "gen"), _generation_cases())
def test_amd_and_blackwell_overrides_appear(rel: str, gpu: str, gen: str) -> None:
    recipe = _model(rel)
    override = recipe.data["hardware_overrides"][gen]
    spec = resolve_vllm(recipe, hardware=gpu, no_features=list(recipe.features))
    argv, env = spec.servers[0].argv, spec.servers[0].env
    for flag, value in _units([str(a) for a in override.get("extra_args") or []]):
        assert _last_value(argv, flag) == value, (flag, argv)
    for name, value in (override.get("extra_env") or {}).items():
        assert env[name] == str(value)


def test_both_generations_are_exercised() -> None:
    gens = {c[2] for c in _generation_cases()}
    assert gens == {"amd", "blackwell"}


def test_hardware_override_absent_on_other_generations() -> None:
    recipe = _model("openai/gpt-oss-120b.yaml")
    argv = _argv(recipe, hardware="h200")
    assert "--attention-backend" not in argv
    assert resolve_vllm(recipe, hardware="h200").servers[0].env == {}


# ---------------------------------------------------------------------------------------------
# Layering and dedupe


def test_flag_set_by_two_layers_appears_once_with_the_later_value() -> None:
    recipe = _model("zai-org/GLM-5.2.yaml")
    assert recipe.data["model"]["base_args"][:2] == ["--kv-cache-dtype", "fp8_e4m3"]
    hopper = _argv(recipe, hardware="h200")
    assert hopper.count("--kv-cache-dtype") == 1
    assert _last_value(hopper, "--kv-cache-dtype") == "fp8"
    blackwell = _argv(recipe, hardware="b200")
    assert _last_value(blackwell, "--kv-cache-dtype") == "fp8_e4m3"


def test_flag_equals_form_is_the_same_flag() -> None:
    recipe = load_vllm_recipe(LAYERED)
    # base --max-model-len 4096, variant --max-model-len=8192
    argv = _argv(recipe, hardware="h200", variant="fast")
    assert [t for t in argv if flag_name(t) == "--max-model-len"] == ["--max-model-len=8192"]
    # base --block-size=16, hopper --block-size 32
    assert _last_value(argv, "--block-size") == "32"
    assert "--block-size=16" not in argv
    # a feature is the last layer: --feature long_context wins over the variant
    argv = _argv(recipe, hardware="h200", variant="fast", features=["long_context"])
    assert _last_value(argv, "--max-model-len") == "32768"
    assert _flags(argv).count("--max-model-len") == 1


def test_layer_order_of_env() -> None:
    recipe = load_vllm_recipe(LAYERED)
    env = resolve_vllm(recipe, hardware="h200", variant="fast").servers[0].env
    assert env == {"LAYER": "hopper", "BASE_ONLY": "1"}  # variant env < hardware override
    env = resolve_vllm(recipe, hardware="b200", variant="fast").servers[0].env
    # the variant's exact-GPU env follows the variant's; the hardware class (nvidia) comes later
    assert env["LAYER"] == "nvidia"
    env = resolve_vllm(recipe, hardware="h200", strategy="single_node_tep").servers[0].env
    assert env["LAYER"] == "strategy"  # its hopper block replaces the recipe's and sets no env
    env = resolve_vllm(recipe, hardware="h200", features=["long_context"]).servers[0].env
    assert env["LAYER"] == "feature"


def test_generation_beats_brand_and_exact_gpu_comes_last() -> None:
    recipe = load_vllm_recipe(LAYERED)
    assert _last_value(_argv(recipe, hardware="h200"), "--max-num-seqs") == "128"  # hopper
    assert _last_value(_argv(recipe, hardware="b200"), "--max-num-seqs") == "256"  # nvidia
    assert _last_value(_argv(recipe, hardware="gb200"), "--max-num-seqs") == "384"  # gb200
    # the strategy's generation block replaces the recipe's
    tep = _argv(recipe, hardware="h200", strategy="single_node_tep")
    assert _last_value(tep, "--max-num-seqs") == "32"
    assert _last_value(tep, "--block-size") == "16"


def test_variant_exact_gpu_override() -> None:
    recipe = _model("zai-org/GLM-5.2.yaml")
    spec = resolve_vllm(recipe, hardware="mi355x", variant="mxfp4")
    assert "--trust-remote-code" in spec.servers[0].argv
    assert spec.servers[0].env["VLLM_USE_V2_MODEL_RUNNER"] == "1"
    assert spec.servers[0].env["VLLM_ROCM_USE_AITER"] == "1"


def test_feature_hardware_override_replaces_args() -> None:
    recipe = load_vllm_recipe(LAYERED)
    argv = _argv(recipe, hardware="mi300x")
    assert _last_value(argv, "--tool-call-parser") == "amd_hermes"
    assert "--enable-auto-tool-choice" not in argv


def test_dedupe_keeps_positionals_and_bare_flags() -> None:
    args = ["pos", "--a", "1", "--b", "--a=2", "pos2", "--c", "-1", "--b"]
    # "pos2" follows "--a=2", which takes no separate value
    assert dedupe_args(args) == ["pos", "--a=2", "pos2", "--c", "-1", "--b"]


_FLAG = st.sampled_from(["--a", "--b", "--c", "-x"])
_VALUE = st.sampled_from(["1", "v", "{}", "-3", "a=b"])
_UNIT = st.one_of(
    st.tuples(_FLAG).map(list),
    st.tuples(_FLAG, _VALUE).map(list),
    st.tuples(_FLAG, _VALUE).map(lambda fv: [f"{fv[0]}={fv[1]}"]),
)


@given(st.lists(_UNIT, max_size=12))
def test_dedupe_property(units: list[list[str]]) -> None:
    args = [t for u in units for t in u]
    out = dedupe_args(args)
    flags = _flags(out)
    assert len(flags) == len(set(flags))
    assert set(flags) == set(_flags(args))
    for flag in flags:
        assert _last_value(out, flag) == _last_value(args, flag)
    assert dedupe_args(out) == out


# ---------------------------------------------------------------------------------------------
# Parallel size


@pytest.mark.parametrize(
    ("rel", "kw", "size"),
    [
        ("openai/gpt-oss-120b.yaml", {"hardware": "h200"}, 1),  # 96 GB fits 141 GB/GPU
        ("openai/gpt-oss-120b.yaml", {"hardware": "h100"}, 8),  # 96 GB > 80 GB/GPU
        ("openai/gpt-oss-20b.yaml", {"hardware": "b200"}, 1),  # strategy_overrides tp: 1
        ("meta-llama/Llama-3.3-70B-Instruct.yaml", {"hardware": "xeon6"}, 8),  # CPU: not capped
        ("meta-llama/Llama-4-Scout-17B-16E-Instruct.yaml", {"hardware": "xeon6"}, 4),
        ("openai/gpt-oss-120b.yaml", {"hardware": "h200", "tp": 2}, 2),
        ("Qwen/Qwen3-Next-80B-A3B-Instruct.yaml", {"hardware": "gb200"}, 1),  # 192 <= 192
    ],
)
def test_parallel_size(rel: str, kw: dict[str, Any], size: int) -> None:
    spec = resolve_vllm(_model(rel), **kw)
    assert spec.servers[0].npus == size
    assert _last_value(spec.servers[0].argv, "--tensor-parallel-size") == str(size)


def test_variant_tp_map_beats_strategy_override() -> None:
    recipe = load_vllm_recipe(LAYERED)
    assert resolve_vllm(recipe, hardware="b200", variant="fast").servers[0].npus == 2  # gpu id
    assert resolve_vllm(recipe, hardware="h200", variant="fast").servers[0].npus == 4  # gen
    assert resolve_vllm(recipe, hardware="mi300x", variant="fast").servers[0].npus == 8  # cap
    assert resolve_vllm(recipe, hardware="mi300x").servers[0].npus == 2  # strategy_overrides


# ---------------------------------------------------------------------------------------------
# Features


def test_opt_in_feature_and_draft_model() -> None:
    recipe = load_vllm_recipe(SEED)
    spec = resolve_vllm(recipe, features=["spec_decoding"])
    cfg = json.loads(_last_value(spec.servers[0].argv, "--speculative-config") or "{}")
    assert cfg["method"] == "eagle3"
    assert spec.requirements.models == ["openai/gpt-oss-120b", cfg["model"]]
    assert spec.selection["features"] == "tool_calling,spec_decoding"
    off = resolve_vllm(recipe, no_features=["tool_calling"])
    assert "--tool-call-parser" not in off.servers[0].argv
    assert off.selection["features"] == ""


def test_feature_modes() -> None:
    recipe = _model("zai-org/GLM-5.2.yaml")
    default = resolve_vllm(recipe, hardware="b200", features=["spec_decoding"])
    assert default.selection["features"].endswith("spec_decoding=mtp")
    dspark = resolve_vllm(recipe, hardware="b200", features=["spec_decoding=dspark"])
    modes = recipe.features["spec_decoding"]["modes"]
    assert _last_value(dspark.servers[0].argv, "--speculative-config") == modes["dspark"]["args"][1]
    with pytest.raises(RecipeError, match="modes here: mtp"):
        resolve_vllm(recipe, hardware="b200", variant="nvfp4", features=["spec_decoding=dspark"])
    with pytest.raises(RecipeError, match="modes: mtp, dspark"):
        resolve_vllm(recipe, hardware="b200", features=["spec_decoding=eagle"])
    with pytest.raises(RecipeError, match="has no modes"):
        resolve_vllm(recipe, hardware="b200", features=["reasoning=on"])


def test_variant_default_mode() -> None:
    recipe = _model("Qwen/Qwen3.8-27B.yaml")
    spec = resolve_vllm(
        recipe, hardware="ascend_950pr", variant="ascend_w8a8", features=["spec_decoding"]
    )
    assert "spec_decoding=qwen3_5_mtp" in spec.selection["features"].split(",")


def test_mode_gated_by_hardware() -> None:
    recipe = load_vllm_recipe(LAYERED)
    with pytest.raises(RecipeError, match="does not run"):
        resolve_vllm(recipe, hardware="mi300x", features=["spec_decoding=eagle"])


# ---------------------------------------------------------------------------------------------
# Errors: one line, naming the problem and the allowed values


@pytest.mark.parametrize(
    ("kw", "needle", "allowed"),
    [
        ({"hardware": "h999"}, "unknown hardware 'h999'", "h200"),
        ({"hardware": "rtx_5090"}, "not offered", "mi300x"),
        ({"hardware": "h200", "strategy": "warp"}, "unknown strategy 'warp'", "single_node_tp"),
        ({"hardware": "h200", "strategy": "single_node_tep"}, "not compatible", "single_node_tp"),
        ({"hardware": "h200", "strategy": "multi_node_tp", "nodes": 1}, "at least 2", "2..16"),
        ({"hardware": "h200", "strategy": "multi_node_tp", "tp": 8}, "--tp sizes", "node count"),
        ({"hardware": "h200", "nodes": 2}, "runs on one node", "multi_node_tp, multi_node_tp_pp"),
        (  # the deploy path: a group of several hosts is not placed yet
            {"hardware": "h200", "strategy": "multi_node_tp", "one_host": True},
            "multi_node and cannot be rendered for one host",
            "single-node strategies: single_node_tp",
        ),
        ({"variant": "int3"}, "unknown variant 'int3'", "amd_fp8"),
        ({"features": ["bogus"]}, "unknown feature 'bogus'", "tool_calling, spec_decoding"),
        ({"no_features": ["bogus"]}, "unknown feature 'bogus'", "spec_decoding"),
        ({"features": ["tool_calling"], "no_features": ["tool_calling"]}, "both", ""),
        ({"hardware": "h200", "tp": 9}, "--tp 9", "1..8"),
        ({"hardware": "h200", "tp": 0}, "--tp 0", "1..8"),
    ],
)
def test_selection_errors(kw: dict[str, Any], needle: str, allowed: str) -> None:
    with pytest.raises(RecipeError) as err:
        resolve_vllm(_model("openai/gpt-oss-120b.yaml"), **kw)
    msg = str(err.value)
    assert needle in msg and allowed in msg and "\n" not in msg


def test_variant_not_on_hardware() -> None:
    recipe = _model("meta-llama/Llama-3.3-70B-Instruct.yaml")
    with pytest.raises(RecipeError, match=r"nvfp4 does not run on h200 .*b200"):
        resolve_vllm(recipe, hardware="h200", variant="nvfp4")


def test_unsupported_hardware_is_not_offered() -> None:
    recipe = load_vllm_recipe(LAYERED)
    assert "h100" not in offered_hardware(recipe)
    with pytest.raises(RecipeError, match="not offered"):
        resolve_vllm(recipe, hardware="h100")


@pytest.mark.parametrize(
    ("name", "needle"),
    [
        ("malformed.yaml", "malformed YAML at line 4"),
        ("truncated.json", "malformed JSON at line 1"),
        ("no-default-variant.yaml", "variants must include 'default' (has: fp8)"),
        ("args-not-list.yaml", "model.base_args: expected a list"),
        ("unknown-strategy.yaml", "unknown strategies single_node_warp (known: "),
        ("not-a-mapping.yaml", "must be a mapping"),
        ("missing.yaml", "cannot read"),
    ],
)
def test_broken_recipes(name: str, needle: str) -> None:
    with pytest.raises(RecipeError) as err:
        load_vllm_recipe(BROKEN / name)
    assert needle in str(err.value) and "\n" not in str(err.value)


# ---------------------------------------------------------------------------------------------
# Listing and describing


def test_list_vllm_recipes() -> None:
    expected = sorted(f"vllm/{p.parent.name}/{p.stem}" for p in (VLLM / "models").rglob("*.yaml"))
    assert sorted(list_vllm_recipes(FILES / "recipes")) == expected
    assert list_vllm_recipes(VLLM) == list_vllm_recipes(FILES / "recipes")
    assert "vllm/openai/gpt-oss-120b" in expected


def test_describe_vllm() -> None:
    info = describe_vllm(load_vllm_recipe(SEED))
    data = json.loads(SEED.read_text())
    assert set(info["hardware"]) >= {"h200", "mi300x", "b200", "ironwood", "arc_pro_b70"}
    assert info["recommended"]["hardware"] == data["recommended_command"]["hardware"]
    assert info["features"]["spec_decoding"]["opt_in"] is True
    assert info["features"]["tool_calling"]["opt_in"] is False
    assert set(info["variants"]) == set(data["variants"])
    assert "single_node_tp" in info["strategies"]
    glm = describe_vllm(_model("zai-org/GLM-5.2.yaml"))
    assert glm["features"]["spec_decoding"]["modes"] == ["mtp", "dspark"]
    assert glm["variants"]["mxfp4"]["hardware"] == ["mi355x"]


# ---------------------------------------------------------------------------------------------
# CLI


def _cli_has_resolve() -> bool:
    try:
        from servefleet.entry.cli import main
    except ImportError:
        return False
    return "resolve" in getattr(main, "commands", {})


@pytest.mark.skipif(not _cli_has_resolve(), reason="the CLI has no resolve command yet")
def test_cli_resolve_json() -> None:
    from click.testing import CliRunner

    from servefleet.entry.cli import main

    result = CliRunner().invoke(
        main, ["resolve", "vllm/openai/gpt-oss-120b", "--hardware", "h200", "--format", "json"]
    )
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    rec = json.loads(SEED.read_text())["recommended_command"]
    assert out["recipe"] == "vllm/openai/gpt-oss-120b"
    assert out["servers"][0]["argv"] == rec["argv"]
    assert out["selection"]["hardware"] == "h200"
    assert out["compile_fingerprint"] is None


@pytest.mark.skipif(not _cli_has_resolve(), reason="the CLI has no resolve command yet")
def test_cli_resolve_error_is_one_line() -> None:
    from click.testing import CliRunner

    from servefleet.entry.cli import main

    result = CliRunner().invoke(main, ["resolve", "vllm/openai/gpt-oss-120b", "--hardware", "x"])
    assert result.exit_code == 2
    assert "unknown hardware 'x'" in result.output and "h200" in result.output
    assert "Traceback" not in result.output
