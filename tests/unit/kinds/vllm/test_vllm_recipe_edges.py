"""vLLM recipes: every shipped recipe on every hardware it lists, and the edge cases of the format.

The edge-case recipes live in tests/unit/recipes/ (one small fixture per case, malformed ones in
recipes/bad/). The shipped recipes are the package's (src/servefleet/_files/recipes/vllm) and,
when present, the reference copies in shared/recipes beside the repository.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from repo_paths import RECIPES, REPO

from servefleet.base.errors import RecipeError
from servefleet.base.shipped import FILES
from servefleet.base.vllm_args import dedupe_args, flag_name, is_flag
from servefleet.kinds.vllm import (
    VllmRecipe,
    describe_vllm,
    load_vllm_recipe,
    offered_hardware,
    resolve_vllm,
    single_node_strategies,
)
from servefleet.kinds.vllm.hardware import fits_one_node, hardware_keys, is_cpu, variant_runs
from servefleet.kinds.vllm.multinode import is_multi_node, node_floor
from servefleet.kinds.vllm.pd import is_pd
from servefleet.kinds.vllm.words import items, words
from servefleet.spec import ServeSpec

SHIPPED = FILES / "recipes" / "vllm"
SHARED = REPO.parent / "shared" / "recipes"  # shared/ beside the repo, when present
EDGES = RECIPES
BAD = EDGES / "bad"
# Single-dash flags vLLM itself spells (-tp, -dp, -pp, -cc.pass_config..., -O3, -q).
SHORT_FLAG = re.compile(r"^-[A-Za-z]{1,3}([.=].*)?$|^-O\d?$")


def _shipped_files() -> list[Path]:
    files = sorted((SHIPPED / "models").glob("*/*.yaml")) + sorted(
        (SHIPPED / "json").rglob("*.json")
    )
    if SHARED.is_dir():
        files += sorted((SHARED / "vllm-yaml" / "models").glob("*/*.yaml"))
        files += sorted((SHARED / "vllm-json").rglob("*.json"))
    return files


def _label(path: Path) -> str:
    for base, tag in ((SHIPPED, "shipped"), (SHARED, "shared")):
        if path.is_relative_to(base):
            return f"{tag}/{path.relative_to(base)}"
    return str(path)


def _listed_hardware(r: VllmRecipe) -> list[str]:
    """The GPUs a recipe lists (``meta.hardware``, not ``unsupported``), else what it offers."""
    listed = [g for g, s in r.declared_hardware.items() if s != "unsupported" and g in r.profiles]
    return listed or offered_hardware(r)


def _cases() -> list[tuple[Path, str]]:
    return [(p, gpu) for p in _shipped_files() for gpu in _listed_hardware(load_vllm_recipe(p))]


CASES = _cases()


def _model_of(r: VllmRecipe, variant: str) -> str:
    return str(r.variants[variant].get("model_id") or r.model_id)


def _assert_sane(spec: ServeSpec, r: VllmRecipe, gpu: str, variant: str) -> None:
    """The argv starts with the model; no empty words; every word after the model is a flag
    (``--x``, or one of vLLM's short ones) or the value of the flag before it; each flag once."""
    main = spec.servers[0]
    argv = main.argv
    assert argv[:3] == ["vllm", "serve", _model_of(r, variant)], argv
    assert all(w != "" for w in argv), argv
    open_flag = False
    for w in argv[3:]:
        if is_flag(w):
            assert w.startswith("--") or SHORT_FLAG.match(w), f"{w!r} in {argv}"
            assert not any(c.isspace() for c in flag_name(w)), f"unsplit flag {w!r}"
            open_flag = "=" not in w
        else:
            assert open_flag, f"{w!r} is neither a flag nor a flag's value: {argv}"
            open_flag = False
    flags = [flag_name(w) for w in argv[3:] if is_flag(w)]
    assert len(flags) == len(set(flags)), f"a flag appears twice: {argv}"
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in main.env.items())
    # CPU hardware: gpu_count is no physical limit (the site does not cap its parallel size).
    assert 1 <= main.npus and (is_cpu(r.profiles[gpu]) or main.npus <= r.profiles[gpu]["gpu_count"])
    assert spec.requirements.models[0] == argv[2]


def _one_line(err: pytest.ExceptionInfo[RecipeError]) -> str:
    msg = str(err.value)
    assert msg and "\n" not in msg and "Traceback" not in msg
    return msg


# ---------------------------------------------------------------------------------------------
# Every shipped recipe, on every hardware it lists x every strategy x every variant, plus each
# opt-in feature alone


def test_the_shipped_matrix_is_not_empty() -> None:
    assert {p.suffix for p, _ in CASES} == {".yaml", ".json"}
    assert len({p for p, _ in CASES}) == len(_shipped_files())


@pytest.mark.parametrize(("path", "gpu"), CASES, ids=[f"{_label(p)}@{g}" for p, g in CASES])
def test_every_shipped_recipe_resolves_on_every_listed_hardware(path: Path, gpu: str) -> None:
    r = load_vllm_recipe(path)
    assert gpu in offered_hardware(r)
    try:
        default = resolve_vllm(r, hardware=gpu)
        _assert_sane(default, r, gpu, default.selection["variant"])
    except RecipeError as e:
        # The default variant does not fit one node of this GPU: refused, naming both sizes.
        assert "vram_minimum_gb" in str(e) and "vram_gb" in str(e) and "\n" not in str(e)
    usable = single_node_strategies(r, gpu)
    assert usable, f"{r.name}: no single-node strategy on {gpu}"
    resolved = 0
    for strategy in r.compatible_strategies:
        for variant in r.variants:
            kw: dict[str, Any] = {"hardware": gpu, "strategy": strategy, "variant": variant}
            runs = variant_runs(r, variant, gpu) and fits_one_node(r, variant, gpu)
            if is_pd(r, strategy) and runs:
                # prefill/decode: two roles, each a sane command of one node, and the router
                pd_spec = resolve_vllm(r, **kw)
                assert [s.role for s in pd_spec.servers] == ["prefill", "decode"]
                for server in pd_spec.servers:
                    _assert_sane(replace(pd_spec, servers=[server]), r, gpu, variant)
                assert pd_spec.router[:4] == [
                    "vllm-router",
                    "--policy",
                    "round_robin",
                    "--vllm-pd-disaggregation",
                ]
                continue
            if is_multi_node(r, strategy) and variant_runs(r, variant, gpu):
                # a group: one sane command per rank of its floor's nodes, only rank 0 the head
                group = resolve_vllm(r, **kw)
                assert group.nodes == node_floor(r, variant, strategy, gpu) >= 2
                assert [s.rank for s in group.servers] == list(range(group.nodes))
                for server in group.servers:
                    one = replace(group, servers=[replace(server, rank=0)], nodes=1)
                    _assert_sane(one, r, gpu, variant)
                    assert server.env == group.servers[0].env
                    headless = "--headless" in server.argv
                    assert headless == (server.rank > 0 and "--nnodes" in server.argv)
                continue
            if strategy not in usable or not runs:
                with pytest.raises(RecipeError) as err:
                    resolve_vllm(r, **kw)
                msg = _one_line(err)
                assert strategy in msg or variant in msg
                continue
            spec = resolve_vllm(r, **kw)
            _assert_sane(spec, r, gpu, variant)
            flag = r.strategies[strategy].get("parallel_flag") or "--tensor-parallel-size"
            assert flag in spec.servers[0].argv
            assert spec.selection["strategy"] == strategy
            resolved += 1
            for feature in r.opt_in_features:
                _check_opt_in_alone(r, kw, feature)
    # Nothing resolves only where no variant fits one node (DeepSeek-V3.2 on h100).
    assert resolved or not any(
        variant_runs(r, v, gpu) and fits_one_node(r, v, gpu) for v in r.variants
    )


def _check_opt_in_alone(r: VllmRecipe, kw: dict[str, Any], feature: str) -> None:
    """One opt-in feature on, every other feature off: its words close the command."""
    others = [f for f in r.features if f != feature]
    try:
        spec = resolve_vllm(r, features=[feature], no_features=others, **kw)
    except RecipeError as e:
        # Not offered with this strategy, or no mode of the feature runs with this variant.
        assert "\n" not in str(e) and feature in str(e)
        return
    _assert_sane(spec, r, kw["hardware"], kw["variant"])
    name, _, mode = spec.selection["features"].partition("=")
    assert name == feature
    spec_block = r.features[feature]["modes"][mode] if mode else r.features[feature]
    gpu = kw["hardware"]
    overrides = spec_block.get("hardware_overrides") or {}
    keys = hardware_keys(gpu, r.profiles[gpu])
    block = next((overrides[k] for k in keys if overrides.get(k) is not None), {})
    own = dedupe_args(words(items(block.get("args") or spec_block.get("args"), feature)))
    if own:
        assert spec.servers[0].argv[-len(own) :] == own


@pytest.mark.parametrize("path", [p for p in _shipped_files() if p.suffix == ".json"], ids=_label)
def test_json_form_resolves_to_its_recommended_command(path: Path) -> None:
    rec = json.loads(path.read_text())["recommended_command"]
    spec = resolve_vllm(load_vllm_recipe(path))
    assert spec.servers[0].argv == rec["argv"]
    assert spec.servers[0].env == rec["env"]
    sel = spec.selection
    assert (sel["hardware"], sel["strategy"], sel["variant"]) == (
        rec["hardware"],
        rec["strategy"],
        rec["variant"],
    )


@pytest.mark.skipif(not SHARED.is_dir(), reason="no shared/ beside the repository")
def test_shared_copies_resolve_as_the_shipped_ones() -> None:
    pairs = [
        (
            SHIPPED / "json" / "openai" / "gpt-oss-120b.json",
            SHARED / "vllm-json/openai/gpt-oss-120b.json",
        )
    ]
    pairs += [
        (p, SHARED / "vllm-yaml" / "models" / p.relative_to(SHIPPED / "models"))
        for p in sorted((SHIPPED / "models").glob("*/*.yaml"))
    ]
    for shipped, shared in pairs:
        if not shared.is_file():
            continue
        a, b = load_vllm_recipe(shipped), load_vllm_recipe(shared)
        for gpu in offered_hardware(a):
            try:
                want = resolve_vllm(a, hardware=gpu).servers
            except RecipeError as e:  # refused (a model too big for one node): the same refusal
                with pytest.raises(RecipeError) as err:
                    resolve_vllm(b, hardware=gpu)
                assert str(err.value) == str(e).replace(a.name, b.name)
                continue
            assert resolve_vllm(b, hardware=gpu).servers == want


# ---------------------------------------------------------------------------------------------
# Edge case: a recipe without strategies (omni / speech / diffusion) is one server, not refused


def _edge(name: str) -> VllmRecipe:
    return load_vllm_recipe(EDGES / name)


def test_omni_speech_recipe_resolves_to_one_server() -> None:
    r = _edge("omni-speech.yaml")
    assert r.is_omni and r.compatible_strategies == []
    spec = resolve_vllm(r)
    assert len(spec.servers) == 1
    main = spec.servers[0]
    # --omni from base_args moves last (the site emits it last; last-wins keeps one)
    assert main.argv == ["vllm", "serve", "acme/tts-1b", "--trust-remote-code", "--omni"]
    assert main.env == {} and main.npus == 1
    assert spec.selection == {
        "hardware": "h200",
        "strategy": "",
        "variant": "default",
        "task": "t2a",
        "features": "",
    }
    small = resolve_vllm(r, hardware="mi300x", variant="small").servers[0]
    assert small.argv == [
        "vllm",
        "serve",
        "acme/tts-0.5b",
        "--trust-remote-code",
        "--max-num-seqs",
        "8",
        "--omni",
    ]
    assert small.env == {"SMALL": "1", "VLLM_ROCM_USE_AITER": "1"}


def test_omni_recipe_on_every_offered_hardware_and_variant() -> None:
    for name in ("omni-speech.yaml", "omni-diffusion.yaml"):
        r = _edge(name)
        for gpu in offered_hardware(r):
            for variant in r.variants:
                if variant_runs(r, variant, gpu):
                    argv = resolve_vllm(r, hardware=gpu, variant=variant).servers[0].argv
                    assert argv[-1] == "--omni" and argv.count("--omni") == 1


def test_omni_task_picks_the_checkpoint_args_port_and_binary() -> None:
    r = _edge("omni-diffusion.yaml")
    first = resolve_vllm(r)
    # omni.port is emitted after base_args, so it shadows base_args' --port 9000
    assert first.servers[0].argv == [
        "vllm-omni",
        "serve",
        "acme/video-14b",
        "--port",
        "8091",
        "--omni",
    ]
    assert first.selection["task"] == "t2v" and first.selection["strategy"] == ""
    i2v = resolve_vllm(r, task="i2v")
    assert i2v.servers[0].argv == [
        "vllm-omni",
        "serve",
        "acme/video-i2v-14b",
        "--max-num-seqs",
        "2",
        "--port",
        "8091",
        "--omni",
    ]
    assert i2v.requirements.models == ["acme/video-i2v-14b"]
    fast = resolve_vllm(r, task="t2v-fast").servers[0].argv
    assert fast[2:5] == ["acme/video-14b", "--cache-backend", "tea_cache"]
    with pytest.raises(RecipeError) as err:
        resolve_vllm(r, task="t2i")
    assert "unknown omni task 't2i' (tasks: t2v, i2v, t2v-fast)" in _one_line(err)


def test_omni_recipe_refuses_a_strategy_features_and_kv_offload() -> None:
    r = _edge("omni-speech.yaml")
    with pytest.raises(RecipeError) as err:
        resolve_vllm(r, strategy="single_node_tp")
    assert "strategy 'single_node_tp' given, but an omni recipe has none" in _one_line(err)
    with pytest.raises(RecipeError) as err:
        resolve_vllm(r, features=["tool_calling"])
    assert "unknown feature 'tool_calling'" in _one_line(err)
    with pytest.raises(RecipeError) as err:
        resolve_vllm(r, kv_offload="simple")
    assert "an omni recipe has none" in _one_line(err)
    # the listed strategy of an omni recipe is not offered either
    assert _edge("omni-diffusion.yaml").compatible_strategies == []


def test_omni_tp_adds_the_parallel_flag() -> None:
    spec = resolve_vllm(_edge("omni-speech.yaml"), tp=2)
    assert spec.servers[0].argv[-2:] == ["--tensor-parallel-size", "2"]
    assert spec.servers[0].npus == 2


def test_recipe_without_strategies_resolves_to_its_base_command() -> None:
    r = _edge("no-strategies.yaml")
    assert not r.is_omni and r.compatible_strategies == []
    spec = resolve_vllm(r)
    main = spec.servers[0]
    assert main.argv == [
        "vllm",
        "serve",
        "acme/plain-3b",
        "--max-model-len",
        "8192",
        "--max-num-seqs",
        "64",
        "--tool-call-parser",
        "hermes",
        "--enable-auto-tool-choice",
    ]
    assert main.env == {"BASE": "1", "HOPPER": "1"} and main.npus == 1
    assert spec.selection["strategy"] == "" and spec.selection["features"] == "tool_calling"
    fp8 = resolve_vllm(r, variant="fp8", tp=2, features=["spec_decoding"]).servers[0]
    assert fp8.argv[2] == "acme/plain-3b-fp8" and "--kv-cache-dtype" in fp8.argv
    assert fp8.argv[-2:] == ["--tensor-parallel-size", "2"] and fp8.npus == 2
    assert "--speculative-config" in fp8.argv


def test_recipe_without_strategies_refuses_a_strategy_and_strategy_bound_features() -> None:
    r = _edge("no-strategies.yaml")
    with pytest.raises(RecipeError) as err:
        resolve_vllm(r, strategy="single_node_tp")
    assert "a recipe without strategies has none" in _one_line(err)
    with pytest.raises(RecipeError) as err:
        resolve_vllm(r, features=["pd_only"])
    msg = _one_line(err)
    assert "pd_only is not offered with a recipe without strategies" in msg and "pd_cluster" in msg


# ---------------------------------------------------------------------------------------------
# Edge case: a flag and its value in one args item split as the site's shell command would


def test_flag_and_value_in_one_item_split_as_the_shell_would() -> None:
    r = _edge("flag-value-in-one-item.yaml")
    argv = resolve_vllm(r, hardware="h200").servers[0].argv
    assert argv == [
        "vllm",
        "serve",
        "acme/split-7b",
        "--max-model-len",
        "32768",
        "--served-model-name",
        "acme split",  # shell quotes inside the item group the words
        "--override-generation-config",
        '{"temperature": 0.6, "top_p": 0.95}',  # a flag's value stays one word
        "--tensor-parallel-size",
        "1",
        "--gpu-memory-utilization",
        "0.97",  # "--gpu-memory-utilization 0.97" (hopper) shadows the base 0.90
        "--max-num-seqs",
        "16",
        "--reasoning-parser",
        "deepseek_r1",
    ]
    amd = resolve_vllm(r, hardware="mi300x").servers[0].argv
    assert amd[amd.index("--gpu-memory-utilization") + 1] == "0.90"


def test_words_follow_the_sites_quoting() -> None:
    def w(*toks: Any) -> list[str]:
        return words(items(list(toks), "x"))

    assert w("--a 1", "--b", "two words") == ["--a", "1", "--b", "two words"]
    assert w("--a", "--b 2") == ["--a", "--b", "2"]  # "--b 2" is no value: written unquoted
    assert w("--x='{\"k\": 1}'") == ['--x={"k": 1}']
    assert w('--hf-overrides={"a":1}') == ['--hf-overrides={"a":1}']  # no whitespace: verbatim
    assert w("--a \\\n  1") == ["--a", "1"]  # a line continuation is a space
    assert w(7, 0.5, True) == ["7", "0.5", "true"]  # numbers and booleans as the site spells them


def test_an_item_that_does_not_split_is_one_line_error() -> None:
    with pytest.raises(RecipeError) as err:
        load_vllm_recipe(BAD / "unbalanced-quote.yaml")
    msg = _one_line(err)
    assert "model.base_args[0]" in msg and "does not split" in msg


# ---------------------------------------------------------------------------------------------
# Edge case: a flag given twice keeps the last value


def test_flag_given_twice_keeps_the_last_value() -> None:
    r = _edge("flag-twice.yaml")
    argv = resolve_vllm(r, hardware="h200").servers[0].argv
    assert argv[3:] == [
        "--max-num-seqs",
        "128",  # base_args gives it twice: the second wins
        "--max-model-len",
        "32768",
        "--block-size",
        "32",  # the variant's --block-size 32 shadows base --block-size=16
        "--tensor-parallel-size",
        "1",
    ]
    b200 = resolve_vllm(r, hardware="b200", features=["long_context"]).servers[0].argv
    assert [t for t in b200 if flag_name(t) == "--max-num-seqs"] == ["--max-num-seqs"]
    assert b200[b200.index("--max-num-seqs") + 1] == "512"  # "--max-num-seqs 512" (blackwell)
    assert [t for t in b200 if flag_name(t) == "--max-model-len"] == ["--max-model-len=131072"]


# ---------------------------------------------------------------------------------------------
# Schema: liberal in what parses


def test_liberal_shapes_parse_and_resolve() -> None:
    r = _edge("liberal.yaml")
    spec = resolve_vllm(r)
    assert spec.servers[0].argv == [
        "vllm",
        "serve",
        "acme/liberal-8b",
        "--tensor-parallel-size",
        "4",
    ]
    assert resolve_vllm(r, variant="fp8").servers[0].npus == 2  # tp map: hopper
    assert resolve_vllm(r, variant="fp8", hardware="mi300x").servers[0].npus == 1  # default
    assert r.opt_in_features == []  # a name that is no feature is ignored
    info = describe_vllm(r)
    assert [p["id"] for p in info["platforms"]] == ["modal"]  # unknown platform ids ignored
    assert info["tasks"] == ["text", "speech"]
    assert info["docker_image"]["amd"] == "acme/img:rocm"
    assert len(info["dependencies"]) == 2
    assert "not_a_gpu_yet" not in info["hardware"]


def test_missing_optional_sections() -> None:
    r = _edge("omni-diffusion.yaml")  # no features, opt_in_features or overrides at all
    assert r.features == {} and r.opt_in_features == []
    info = describe_vllm(r)
    assert info["omni"] is True and list(info["omni_tasks"]) == ["t2v", "i2v", "t2v-fast"]
    assert info["recommended"]["task"] == "t2v"


# ---------------------------------------------------------------------------------------------
# Schema: malformed input is one line naming the field and the allowed values


@pytest.mark.parametrize(
    ("name", "needle"),
    [
        (
            "meta-hardware-state.yaml",
            "meta.hardware.h200: 'tested' is not one of verified | supported | unsupported",
        ),
        (
            "strategy-hardware-state.yaml",
            "strategy_hardware.single_node_tep.h200: 'maybe' is not one of supported | unsupported",
        ),
        ("tp-text.yaml", "variants.default.tp: expected a positive integer or a mapping of GPU id"),
        (
            "unbalanced-quote.yaml",
            'model.base_args[0]: "--served-model-name \'acme" does not split',
        ),
        ("omni-task-no-id.yaml", "omni.tasks[0].id: expected a non-empty string"),
        ("omni-port-text.yaml", "omni.port: expected a positive integer, got 'eighty'"),
        ("min-gpus-text.yaml", "strategy_min_gpus: expected a number or a mapping of strategy id"),
        (
            "kv-support-state.yaml",
            "kv_offload_support.offloading_cpu: 'maybe' is not one of verified | unsupported",
        ),
        ("dependency-no-command.yaml", "dependencies[0].command: expected a non-empty string"),
        ("install-mode.yaml", "dependencies[0].install_modes: 'conda' is not one of pip | docker"),
        ("tasks-not-list.yaml", "meta.tasks: expected a list of task ids, got str"),
        (
            "mode-hardware-state.yaml",
            "features.spec_decoding.modes.mtp.hardware.hopper: 'broken' is not one of supported",
        ),
        ("vram-text.yaml", "variants.default.vram_minimum_gb: expected a number, got '80GB'"),
        ("env-not-mapping.yaml", "hardware_overrides.hopper.extra_env: expected a mapping"),
        ("companion-no-command.yaml", "features.helper.companion.command: expected a non-empty"),
    ],
)
def test_malformed_recipes_are_one_line_errors(name: str, needle: str) -> None:
    with pytest.raises(RecipeError) as err:
        load_vllm_recipe(BAD / name)
    msg = _one_line(err)
    assert needle in msg, msg
    assert msg.startswith(str(BAD / name))


def _root(tmp_path: Path) -> Path:
    """A copy of the shipped shared files with one model, to break the shared files."""
    root = tmp_path / "vllm"
    shutil.copytree(SHIPPED, root, ignore=shutil.ignore_patterns("models", "json"))
    (root / "models" / "acme").mkdir(parents=True)
    (root / "models" / "acme" / "m.yaml").write_text(
        "model: {model_id: acme/m}\nvariants: {default: {precision: bf16}}\n"
        "compatible_strategies: [single_node_tp]\n"
    )
    return root


def _edit(path: Path, change: Any) -> None:
    doc = yaml.safe_load(path.read_text())
    change(doc)
    path.write_text(yaml.safe_dump(doc))


@pytest.mark.parametrize(
    ("file", "change", "needle"),
    [
        (
            "strategies/single_node_tp.yaml",
            lambda d: d.update(deploy_type="cluster"),
            "deploy_type: 'cluster' is not one of single_node | multi_node | pd_cluster | kv_store_lb",
        ),
        (
            "strategies/single_node_tp.yaml",
            lambda d: d.update(orientation="fast"),
            "orientation: 'fast' is not one of latency | balanced | throughput | production",
        ),
        (
            "strategies/single_node_tp.yaml",
            lambda d: d["hardware_match"].update(min_gpus=0),
            "hardware_match.min_gpus: expected a positive integer",
        ),
        (
            "strategies/single_node_tp.yaml",
            lambda d: d.update(parallel_flag="tp"),
            "parallel_flag: expected a flag such as --tensor-parallel-size",
        ),
        (
            "taxonomy.yaml",
            lambda d: d["hardware_profiles"]["h200"].update(gpu_count=0),
            "hardware_profiles.h200.gpu_count: expected a positive integer",
        ),
        (
            "taxonomy.yaml",
            lambda d: d["hardware_profiles"]["h200"].update(scalable="no"),
            "hardware_profiles.h200.scalable: expected true or false",
        ),
        (
            "taxonomy.yaml",
            lambda d: d["kv_offload"]["lmcache"].update(strategies="single_node_tp"),
            "kv_offload.lmcache.strategies: expected a list of strategy ids",
        ),
        ("platforms.yaml", lambda d: d["platforms"][0].pop("id"), "platforms[0].id: expected"),
    ],
)
def test_malformed_shared_files_are_one_line_errors(
    tmp_path: Path, file: str, change: Any, needle: str
) -> None:
    root = _root(tmp_path)
    _edit(root / file, change)
    with pytest.raises(RecipeError) as err:
        load_vllm_recipe(root / "models" / "acme" / "m.yaml")
    msg = _one_line(err)
    assert needle in msg and str(root / file) in msg, msg


def test_a_copied_root_resolves(tmp_path: Path) -> None:
    spec = resolve_vllm(load_vllm_recipe(_root(tmp_path) / "models" / "acme" / "m.yaml"))
    assert spec.servers[0].argv == ["vllm", "serve", "acme/m", "--tensor-parallel-size", "8"]


# ---------------------------------------------------------------------------------------------
# Schema fields that reach argv: strategy_min_gpus, the parallel size of the final argv,
# companions, KV offload


def test_strategy_min_gpus_drops_single_node_strategies_below_the_floor() -> None:
    r = _edge("min-gpus.yaml")
    assert single_node_strategies(r, "h200") == ["single_node_tp", "single_node_tep"]
    assert single_node_strategies(r, "gb200") == ["single_node_tep"]  # tp needs 8
    assert single_node_strategies(r, "h100") == ["single_node_tp"]  # h100: tep needs 16
    assert resolve_vllm(r, hardware="gb200").selection["strategy"] == "single_node_tep"
    with pytest.raises(RecipeError) as err:
        resolve_vllm(r, hardware="gb200", strategy="single_node_tp")
    assert "single_node_tp needs 8 GPUs (strategy_min_gpus), gb200 has 4" in _one_line(err)
    with pytest.raises(RecipeError) as err:
        resolve_vllm(r, hardware="gb300")  # gb300: 16 for every strategy
    msg = _one_line(err)
    assert "no single-node strategy runs on gb300" in msg and "multi_node_tp" in msg


def test_gpus_follow_the_final_argv() -> None:
    r = _edge("parallel-override.yaml")
    assert resolve_vllm(r, hardware="h200").servers[0].npus == 1  # strategy_overrides tp: 1
    xpu = resolve_vllm(r, hardware="arc_pro_b60").servers[0]
    assert xpu.argv[-2:] == ["--tensor-parallel-size", "4"] and xpu.npus == 4
    forced = resolve_vllm(r, hardware="arc_pro_b60", tp=2).servers[0]  # --tp beats the override
    assert forced.argv.count("--tensor-parallel-size") == 1 and forced.npus == 2
    assert forced.argv[forced.argv.index("--tensor-parallel-size") + 1] == "2"
    cpu = resolve_vllm(r, hardware="xeon6").servers[0]  # -tp 8, last: vLLM takes 8
    assert cpu.npus == 8  # a CPU profile's gpu_count (4) is no limit
    with pytest.raises(RecipeError) as err:
        resolve_vllm(r, hardware="mi300x")
    assert "asks for 16 GPUs (--tensor-parallel-size 16) but mi300x has 8" in _one_line(err)


def test_feature_companion_is_a_second_server() -> None:
    r = _edge("companion-kv.yaml")
    assert len(resolve_vllm(r).servers) == 1  # the feature is opt-in
    spec = resolve_vllm(r, features=["sidecar"])
    main, companion = spec.servers
    assert main.argv[-1] == "--enable-log-requests" and main.env == {"SIDECAR": "1"}
    assert companion.role == "companion-sidecar" and companion.npus == 0
    assert companion.argv == [
        "acme-sidecar",
        "--port",
        "7000",
        "--upstream",
        "http://localhost:8000",
    ]
    assert describe_vllm(r)["features"]["sidecar"]["companion"] == "Sidecar"


def test_kv_offload_composes_last_with_its_gates() -> None:
    r = _edge("companion-kv.yaml")
    taxonomy = yaml.safe_load((SHIPPED / "taxonomy.yaml").read_text())["kv_offload"]
    cpu = resolve_vllm(r, kv_offload="offloading_cpu")
    assert cpu.servers[0].argv[-2:] == taxonomy["offloading_cpu"]["args"]
    assert cpu.selection["kv_offload"] == "offloading_cpu"
    lm = resolve_vllm(r, kv_offload="lmcache", strategy="single_node_dep")
    assert lm.servers[0].argv[-2:] == taxonomy["lmcache"]["args"]
    assert [s.role for s in lm.servers] == ["main", "companion-kv-lmcache"]
    assert lm.servers[1].argv[:4] == ["lmcache", "server", "--port", "5555"]
    assert lm.requirements.packages == ["lmcache"]
    for key, kw, needle in [
        ("offloading_fs", {}, "needs kv_offload_support.offloading_fs: verified"),
        ("simple", {}, "marks it unsupported (kv_offload_support.simple)"),
        ("offloading_cpu", {"hardware": "xeon6"}, "not on xeon6 (Intel; its brands: NVIDIA, AMD)"),
        ("nope", {}, "unknown KV offload option 'nope' (options: simple, offloading_cpu"),
    ]:
        with pytest.raises(RecipeError) as err:
            resolve_vllm(r, kv_offload=key, **kw)
        assert needle in _one_line(err)
    assert describe_vllm(r)["kv_offload_here"] == ["offloading_cpu", "lmcache"]
    assert "kv_offload" not in resolve_vllm(r).selection


def test_describe_shows_the_taxonomy_and_strategy_fields() -> None:
    info = describe_vllm(load_vllm_recipe(SHIPPED / "models" / "zai-org" / "GLM-5.2.yaml"))
    assert info["hardware_details"]["h200"]["display_name"] == "H200"
    assert info["hardware_details"]["b300"]["status"] == "verified"
    tep = info["strategy_details"]["single_node_tep"]
    assert tep["orientation"] == "balanced" and tep["hardware_match"]["architecture"] == "moe"
    assert info["kv_offload"]["lmcache"]["strategies"] == [
        "single_node_tp",
        "single_node_tep",
        "single_node_dep",
    ]
    assert info["kv_offload"]["offloading_cpu"]["support"] == "verified"
    assert "offloading" in info["kv_offload_groups"]
    assert info["docker_image"]["nvidia"].startswith("vllm/")
