"""An omni recipe and a recipe without strategies (``resolve.py``'s ``_resolve_unstrategied``),
as the mutation campaign (#37) found them held by no unit test: an omni recipe that has features
refuses every one asked for (its whole line, each ``--feature`` named; turning one off passes),
its KV-offload refusal, its task in the selection (none without tasks), ``--tp`` on its argv; a
variant of a recipe without strategies too big for one node (the whole line naming the
variant and the hardware)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from repo_paths import RECIPES
from vllm_cases import recipe_from, refused_line

from servefleet.kinds.vllm import load_vllm_recipe, resolve_vllm
from servefleet.kinds.vllm.recipe import VllmRecipe

SPEECH = RECIPES / "omni-speech.yaml"


@pytest.fixture(scope="module")
def omni(tmp_path_factory: pytest.TempPathFactory) -> VllmRecipe:
    """omni-speech.yaml with two features (an omni recipe may list some; it renders none)."""
    features = "features:\n  stream: {args: [--stream]}\n  fast: {args: [--fast]}"
    return recipe_from(
        tmp_path_factory, "omni.yaml", SPEECH.read_text().replace("features: {}", features)
    )


def _refused(r: VllmRecipe, **kw: object) -> str:
    return refused_line(resolve_vllm, r, **kw)


def test_an_omni_recipe_refuses_the_features_it_lists(omni: VllmRecipe) -> None:
    head = "an omni recipe renders no features (the site's omni command takes none); drop"
    assert _refused(omni, features=["stream"]) == f"{head} --feature stream"
    assert _refused(omni, features=["stream", "fast"]) == (
        f"{head} --feature stream --feature fast"
    )
    # an unknown name is refused as unknown first
    assert _refused(omni, features=["nope"]) == "unknown feature 'nope' (features: stream, fast)"
    spec = resolve_vllm(omni, no_features=["stream"])
    assert spec.servers[0].argv == ["vllm", "serve", "acme/tts-1b", "--trust-remote-code", "--omni"]
    assert spec.selection == {
        "hardware": "h200",
        "strategy": "",
        "variant": "default",
        "task": "t2a",
        "features": "",
    }


def test_an_omni_recipe_refuses_kv_offload(omni: VllmRecipe) -> None:
    assert _refused(omni, kv_offload="simple") == (
        "KV offload 'simple' composes with a serving strategy; an omni recipe has none"
    )


def test_an_omni_recipe_without_tasks_selects_none(omni: VllmRecipe) -> None:
    data = {**omni.data, "omni": {}}
    spec = resolve_vllm(replace(omni, data=data), tp=2)
    assert "task" not in spec.selection
    assert spec.servers[0].argv[-2:] == ["--tensor-parallel-size", "2"]
    assert spec.servers[0].npus == 2
    assert spec.requirements.models == ["acme/tts-1b"] and spec.requirements.packages == []


def test_a_plain_variant_too_big_for_one_node() -> None:
    plain = load_vllm_recipe(RECIPES / "no-strategies.yaml")
    big = {**plain.data["variants"], "big": {"precision": "bf16", "vram_minimum_gb": 2000}}
    r = replace(plain, data={**plain.data, "variants": big})
    for gpu, have in (("h200", 1128), ("mi300x", 1536)):
        assert _refused(r, variant="big", hardware=gpu) == (
            f"variant big needs 2000 GB (vram_minimum_gb) but one {gpu} node has {have} GB "
            "(vram_gb), so no single-node command; no multi-node strategy of the recipe fits "
            "it. servefleet renders one host per server and cannot deploy a model spanning "
            "several hosts yet"
        )
    # the variants that fit still resolve, with their own model
    assert resolve_vllm(r, variant="fp8").servers[0].argv[2] == "acme/plain-3b-fp8"
