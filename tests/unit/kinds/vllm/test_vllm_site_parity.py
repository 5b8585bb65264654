"""vLLM recipes resolve as vLLM's recipes site builds them (issue 20).

One fixture per class of difference in tests/data/vllm (same fields as upstream recipes), each
with the exact argv and env; then every ``single_node`` entry of the site's own output for the
recipes in shared/ (``shared/recipes/vllm-yaml/expected/commands.json``), resolved with
servefleet's default features, compared with the site's argv and env.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from repo_paths import REPO
from site_commands import (
    EXPECTED,
    argv_units,
    feature_names,
    resolve_entry,
    site_entries,
    site_key,
)

from servefleet.base.errors import RecipeError
from servefleet.entry.cli import main
from servefleet.kinds.vllm import describe_vllm, list_vllm_recipes, load_vllm_recipe, resolve_vllm
from servefleet.kinds.vllm.layers import ARG_ORDER, ENV_ORDER

DATA = REPO / "tests" / "data"
FIXTURES = DATA / "vllm"
UPSTREAM = DATA / "vllm-upstream"


def _fixture(name: str) -> Any:
    return load_vllm_recipe(FIXTURES / name)


def _main(r: Any, **kw: Any) -> Any:
    return resolve_vllm(r, **kw).servers[0]


def _error(r: Any, **kw: Any) -> str:
    with pytest.raises(RecipeError) as err:
        resolve_vllm(r, **kw)
    msg = str(err.value)
    assert msg and "\n" not in msg
    return msg


# ---------------------------------------------------------------------------------------------
# 1. Forced features: a variant's default_modes switches an opt-in feature on


def test_default_modes_force_an_opt_in_feature_on() -> None:
    r = _fixture("forced-features.yaml")
    tools = ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
    mtp = ["--speculative-config", '{"method":"mtp","num_speculative_tokens":2}']
    dspark = ["--speculative-config", '{"method":"dspark","num_speculative_tokens":7}']
    tp1 = ["--tensor-parallel-size", "1"]
    default = resolve_vllm(r, hardware="h200")
    assert default.servers[0].argv == ["vllm", "serve", "acme/forced-30b", *tp1, *tools, *mtp]
    assert default.servers[0].env == {}
    assert default.selection["features"] == "tool_calling,spec_decoding=mtp"
    spark = _main(r, hardware="h200", variant="dspark")
    assert spark.argv == ["vllm", "serve", "acme/forced-30b-dspark", *tp1, *tools, *dspark]
    # Without default_modes the feature stays opt-in; turned off explicitly, forced or not.
    plain = _main(r, hardware="h200", variant="plain")
    assert plain.argv == ["vllm", "serve", "acme/forced-30b-plain", *tp1, *tools]
    off = _main(r, hardware="h200", variant="dspark", no_features=["spec_decoding"])
    assert off.argv == ["vllm", "serve", "acme/forced-30b-dspark", *tp1, *tools]
    assert r.default_features("dspark", "h200") == ["tool_calling", "spec_decoding"]
    assert describe_vllm(r)["variants"]["dspark"]["forces_features"] == ["spec_decoding"]


# ---------------------------------------------------------------------------------------------
# 2. hardware_opt_in_features.<hw>: opt-in on that hardware only


def test_hardware_opt_in_features_apply_on_that_hardware_only() -> None:
    r = _fixture("hardware-opt-in.yaml")
    enc = ["--mm-encoder-tp-mode", "data"]
    reasoning = ["--reasoning-parser", "deepseek_r1"]
    model = ["vllm", "serve", "acme/vision-70b", "--tensor-parallel-size", "1"]
    assert _main(r, hardware="h200").argv == [*model, *enc, *reasoning]
    assert _main(r, hardware="gb200").argv == [*model, *reasoning]
    on = _main(r, hardware="gb200", features=["encoder_parallel"])
    assert on.argv[-4:] == [*enc, *reasoning] and on.env == {}
    assert describe_vllm(r)["features"]["encoder_parallel"]["opt_in_on"] == ["gb200"]


# ---------------------------------------------------------------------------------------------
# 3. A variant's extra_env applies to the default variant too; the env order


def test_default_variant_env_and_env_order() -> None:
    r = _fixture("default-variant-env.yaml")
    model = ["vllm", "serve", "acme/env-8b", "--tensor-parallel-size", "1"]
    common = {"FROM_BASE": "1", "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED": "1", "FROM_STRATEGY": "1"}
    h200 = _main(r, hardware="h200")  # strategy_overrides env, then the hopper block
    assert h200.argv == model and h200.env == {"LAYER": "hopper", **common}
    mi300x = _main(r, hardware="mi300x")  # no hardware block: the strategy overrides win
    assert mi300x.argv == model and mi300x.env == {"LAYER": "strategy", **common}
    b200 = _main(r, hardware="b200")  # the exact-GPU strategy block comes last
    assert b200.argv == model and b200.env == {"LAYER": "strategy-b200", **common}


def test_the_order_is_written_once_as_data() -> None:
    assert ARG_ORDER.index("base") < ARG_ORDER.index("strategy") < ARG_ORDER.index("features")
    hardware_class = ("strategy_generation", "recipe_generation", "variant_generation")
    exact = ("recipe_gpu", "strategy_gpu")
    for order in (ARG_ORDER, ENV_ORDER):
        assert max(order.index(k) for k in hardware_class) < min(order.index(k) for k in exact)
        assert order.index("strategy") < min(order.index(k) for k in hardware_class)
        assert order[-1] in ("features", "kv_offload")
    assert ENV_ORDER.index("strategy_overrides") < min(ENV_ORDER.index(k) for k in hardware_class)


# ---------------------------------------------------------------------------------------------
# 4. CPU tensor-parallel size is not capped by the profile's gpu_count


def test_cpu_tensor_parallel_size_is_not_capped() -> None:
    r = _fixture("cpu-tp.yaml")
    cpu = _main(r, hardware="xeon6")
    assert cpu.argv == ["vllm", "serve", "acme/dense-70b", "--tensor-parallel-size", "8"]
    assert cpu.env == {} and cpu.npus == 8
    gpu = _main(r, hardware="h200")  # a GPU node still caps the declared 16 at its 8 GPUs
    assert gpu.argv == ["vllm", "serve", "acme/dense-70b", "--tensor-parallel-size", "8"]


# ---------------------------------------------------------------------------------------------
# 5. Omni task per-hardware overrides


def test_omni_task_hardware_override() -> None:
    r = _fixture("omni-task-hardware.yaml")
    h200 = _main(r, hardware="h200")
    assert h200.argv == ["vllm", "serve", "acme/h3-video", "--max-num-seqs", "4", "--omni"]
    assert h200.env == {}
    spark = _main(r, hardware="dgx_spark_gb10")
    assert spark.argv == [
        "vllm",
        "serve",
        "/models/acme-h3-fl2va",
        "--max-num-seqs",
        "4",
        "--task-type",
        "fl2va",
        "--omni",
    ]
    assert spark.env == {}


# ---------------------------------------------------------------------------------------------
# 6. Schema forms the site accepts


def test_platform_objects_and_supported_hardware_load() -> None:
    r = _fixture("schema-forms.yaml")
    main_ = _main(r, hardware="h200")
    assert main_.argv == ["vllm", "serve", "acme/forms-8b", "--tensor-parallel-size", "1"]
    assert main_.env == {}
    info = describe_vllm(r)
    assert "h200" in info["hardware"] and "h100" not in info["hardware"]
    bare, own = info["platforms"]
    assert bare["id"] == own["id"] == "modal" and bare["url"] == own["url"]
    assert own["blurb"] == "Our own Modal deploy script"
    assert own["install"] == "pip install modal acme-deploy"


# ---------------------------------------------------------------------------------------------
# 7. A model that does not fit one node is refused, naming both sizes and what would fit


def test_a_model_too_big_for_one_node_is_refused() -> None:
    r = _fixture("too-big.yaml")
    msg = _error(r, hardware="h200")
    assert "needs 1152 GB (vram_minimum_gb)" in msg and "has 1128 GB (vram_gb)" in msg
    assert "multi_node_tp (2 nodes), multi_node_dep (4 nodes)" in msg  # dep: 32 GPUs floor
    assert "single_node_tep" not in msg
    assert _error(r, hardware="h200", strategy="single_node_tep") == msg
    fp8 = _main(r, hardware="h200", variant="fp8")  # 576 GB fits one node
    assert fp8.argv == ["vllm", "serve", "acme/huge-480b-fp8", "--tensor-parallel-size", "8"]
    b300 = _main(r, hardware="b300")  # 1152 GB <= 2144 GB
    assert b300.argv == ["vllm", "serve", "acme/huge-480b", "--tensor-parallel-size", "8"]


def test_format_unit_writes_no_unit_for_a_model_too_big(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        main,
        ["resolve", str(FIXTURES / "too-big.yaml"), "--hardware", "h200", "--format", "unit"],
    )
    assert result.exit_code == 2
    assert "[Service]" not in result.output and "ExecStart" not in result.output
    assert "1152 GB" in result.output and "1128 GB" in result.output


# ---------------------------------------------------------------------------------------------
# 8. Recipe directories in the upstream layout; a directory without recipes


def test_recipes_list_reads_the_upstream_layout() -> None:
    assert list_vllm_recipes(UPSTREAM) == ["vllm/acme/tiny-1b"]
    result = CliRunner().invoke(main, ["recipes", "list", str(UPSTREAM)])
    assert result.exit_code == 0 and result.output.splitlines() == ["vllm/acme/tiny-1b"]
    r = load_vllm_recipe(UPSTREAM / "models" / "acme" / "tiny-1b.yaml")
    assert r.name == "vllm/acme/tiny-1b" and list(r.profiles) == ["h200"]
    server = _main(r)
    assert server.argv == ["vllm", "serve", "acme/tiny-1b", "--tensor-parallel-size", "1"]


def test_servefleet_recipes_may_be_an_upstream_checkout() -> None:
    env = {**os.environ, "SERVEFLEET_RECIPES": str(UPSTREAM)}
    cmd = [sys.executable, "-m", "servefleet"]
    listed = subprocess.run([*cmd, "recipes", "list"], env=env, capture_output=True, text=True)
    assert listed.returncode == 0 and listed.stdout.splitlines() == ["vllm/acme/tiny-1b"]
    shell = subprocess.run(
        [*cmd, "resolve", "vllm/acme/tiny-1b", "--format", "shell"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert shell.returncode == 0
    assert shell.stdout.strip() == "vllm serve acme/tiny-1b --tensor-parallel-size 1"


def test_a_directory_without_recipes_is_one_line_error(tmp_path: Path) -> None:
    (tmp_path / "models").mkdir()
    for d in (tmp_path, tmp_path / "models"):
        result = CliRunner().invoke(main, ["recipes", "list", str(d)])
        assert result.exit_code != 0
        lines = result.output.strip().splitlines()
        assert len(lines) == 1 and f"{d}: holds no recipe" in lines[0]


# ---------------------------------------------------------------------------------------------
# Every single-node selection the site builds for the recipes in shared/

# Selections servefleet refuses on purpose, with the reason its message gives. The site prints a
# single-node command for them that cannot hold the model: the variant's vram_minimum_gb exceeds
# the node's vram_gb (multi-node strategies are named instead). No entry of commands.json meets
# servefleet's other deliberate refusals (a strategy's hardware_match GPU range, or more GPUs
# asked for than the host has): the site does not offer those.
REFUSED = {
    ("deepseek-ai/DeepSeek-V3.2", "h100", s, "default"): "needs 805 GB (vram_minimum_gb) but "
    "one h100 node has 640 GB (vram_gb)"
    for s in ("single_node_tp", "single_node_tep", "single_node_dep")
} | {
    ("zai-org/GLM-5.2", gpu, s, "bf16"): f"needs 1786 GB (vram_minimum_gb) but one {gpu} node "
    f"has {have} GB (vram_gb)"
    for gpu, have in (("b200", 1440), ("mi300x", 1536))
    for s in ("single_node_tp", "single_node_tep")
}


@pytest.mark.skipif(not EXPECTED.is_file(), reason=f"no {EXPECTED} beside the repository")
def test_every_single_node_selection_matches_the_site() -> None:
    entries = site_entries()
    assert len(entries) > 100
    differences, refused = [], {}
    for e in entries:
        key = site_key(e)
        try:
            spec = resolve_entry(e)
        except RecipeError as err:
            refused[key] = str(err)
            continue
        server = spec.servers[0]
        ours = feature_names(spec)
        if ours != e["features"]:
            differences.append(f"{key}: features {ours} != {e['features']}")
        if argv_units(server.argv) != argv_units(e["argv"]):
            differences.append(f"{key}: argv {server.argv} != {e['argv']}")
        if server.env != e["env"]:
            differences.append(f"{key}: env {server.env} != {e['env']}")
    assert differences == []
    assert set(refused) == set(REFUSED), "refused: " + "; ".join(refused.values())
    for key, reason in REFUSED.items():
        assert reason in refused[key], (key, refused[key])
        assert "multi-node strategies that fit: multi_node_tp (2 nodes)" in refused[key]
    assert len(entries) - len(refused) == 144
