"""Resolving RBLN selections: defaults, overlays, deltas, exclusions, requirements."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings, strategies as st
from rbln_cases import COMPILER, TINY, combinations, seed

from servefleet.base.errors import RecipeError
from servefleet.kinds.rbln.card import load_card
from servefleet.kinds.rbln.resolve import resolve_rbln

SEED = seed()
TINY_CARD = load_card(TINY, name="tiny")
SEED_COMBOS = list(combinations(SEED))


def resolve(card, **kw):  # type: ignore[no-untyped-def]
    kw.setdefault("compiler_version", COMPILER)
    return resolve_rbln(card, **kw)


def flag_values(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == flag]


def test_seed_has_108_combinations_and_all_resolve() -> None:
    assert len(SEED_COMBOS) == 108
    prints = set()
    for strategy, target, sel in SEED_COMBOS:
        spec = resolve(SEED, strategy=strategy, target=target, sets=sel)
        assert spec.selection == {**sel, "target": target, "strategy": strategy, "sku": "RBLN-CR13"}
        argv = spec.servers[0].argv
        assert argv[:3] == ["vllm", "serve", "openai/gpt-oss-120b"]
        prints.add(spec.compile_fingerprint)
    # prefix caching and tool calling never change the compile inputs: 2 targets x 3 x 3
    assert len(prints) == 18


def test_default_selection() -> None:
    spec = resolve(SEED)
    assert spec.selection == {
        "lmcache": "off",
        "prefix_caching": "off",
        "spec_decode": "off",
        "tool_calling": "on",
        "target": "Latency",
        "strategy": "aggregated",
        "sku": "RBLN-CR13",
    }
    argv = spec.servers[0].argv
    assert argv == [
        "vllm",
        "serve",
        "openai/gpt-oss-120b",
        "--block-size",
        "4096",
        "--distributed-executor-backend",
        "mp",
        "--enable-auto-tool-choice",
        "--max-model-len",
        "131072",
        "--max-num-batched-tokens",
        "512",
        "--max-num-seqs",
        "1",
        "--model-impl",
        "vllm",
        "--no-enable-prefix-caching",
        "--reasoning-parser",
        "openai_gptoss",
        "--tool-call-parser",
        "openai",
        "--trust-remote-code",
    ]
    assert spec.servers[0].env == {"VLLM_ENGINE_READY_TIMEOUT_S": "9600"}
    assert spec.requirements.to_json() == {
        "vllm_rbln_extras": [],
        "packages": [],
        "imports": ["rebel", "vllm_rbln"],
        "models": ["openai/gpt-oss-120b"],
    }


def test_target_is_case_insensitive_and_recorded_as_the_card_spells_it() -> None:
    spec = resolve(SEED, target="tHrOuGhPuT")
    assert spec.selection["target"] == "Throughput"
    assert flag_values(spec.servers[0].argv, "--max-num-seqs") == ["8"]


def test_recommended_then_set() -> None:
    spec = resolve(SEED, recommended=True, sets={"spec_decode": "suffix"})
    assert spec.selection["lmcache"] == "rds" and spec.selection["spec_decode"] == "suffix"
    assert spec.requirements.vllm_rbln_extras == ["kv-connectors"]
    assert spec.requirements.packages == ["arctic-inference"]
    assert spec.requirements.imports == ["rebel", "vllm_rbln", "lmcache_rbln", "arctic_inference"]
    assert spec.requirements.models == ["openai/gpt-oss-120b"]


def test_eagle3_draft_model_is_required() -> None:
    spec = resolve(SEED, sets={"spec_decode": "eagle3"})
    assert spec.requirements.models == ["openai/gpt-oss-120b", "nvidia/gpt-oss-120b-Eagle3-v3"]


@pytest.mark.parametrize(
    "sets, match",
    [
        ({"kv_connector": "off"}, "axis 'kv_connector' is shown on the card but is not offered"),
        ({"spec_decode": "ngram"}, "spec_decode='ngram' is shown on the card but is not offered"),
        (
            {"spec_decode": "warp"},
            r"spec_decode='warp' is not offered .*allowed spec_decode: off, eagle3, suffix",
        ),
        (
            {"colour": "red"},
            r"axis 'colour' is not offered by this grid \(offered: lmcache: off, cpu, rds;",
        ),
    ],
)
def test_not_offered(sets: dict[str, str], match: str) -> None:
    with pytest.raises(RecipeError, match=match):
        resolve(SEED, sets=sets)


def test_unknown_strategy_target_sku() -> None:
    with pytest.raises(RecipeError, match=r"unknown strategy 'x' \(allowed: aggregated\)"):
        resolve(SEED, strategy="x")
    with pytest.raises(RecipeError, match=r"no target 'fast' \(allowed: Latency, Throughput\)"):
        resolve(SEED, target="fast")
    with pytest.raises(RecipeError, match=r"SKU 'RBLN-CA25' .*allowed: RBLN-CR13"):
        resolve(SEED, sku="RBLN-CA25")


# -- the fixture card: one row per rule ---------------------------------------------------------


def tiny(**kw):  # type: ignore[no-untyped-def]
    return resolve(TINY_CARD, **kw).servers[0]


def test_option_base_off_applies_its_delta_by_default() -> None:
    server = tiny()
    assert server.argv[-1] == "--no-rbln-use-custom-sampler"
    assert server.env == {"EXTRA_NOTE": 'a b=c $HOME 100% "q" \\\\ ;', "VLLM_RBLN_SAMPLER": "0"}
    assert server.npus == 2


def test_replacing_delta_keeps_place_new_key_appended() -> None:
    base = tiny(sets={"sampler": "on"}).argv
    cpu = tiny(sets={"sampler": "on", "lmcache": "cpu"}).argv
    assert base.index("--max-num-seqs") == cpu.index("--max-num-seqs") == 3
    assert cpu[4] == "2" and base[4] == "4"
    assert cpu[-2] == "--kv-transfer-config"
    assert json.loads(cpu[-1]) == {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}


def test_flag_equals_form_and_quoted_values_kept() -> None:
    argv = tiny(sets={"spec_decode": "eagle3"}).argv
    assert "--model-impl=vllm" in argv
    i = argv.index("--served-model-name")
    assert argv[i + 1] == "tiny moe=fast"
    spec_arg = [a for a in argv if a.startswith("--speculative-config=")]
    assert json.loads(spec_arg[0].split("=", 1)[1])["model"] == "acme/tiny-draft"
    assert resolve(TINY_CARD, sets={"spec_decode": "eagle3"}).requirements.models == [
        "acme/tiny-moe",
        "acme/tiny-draft",
    ]


def test_excluded_combination_refused() -> None:
    with pytest.raises(
        RecipeError, match="combination lmcache=cpu, spec_decode=suffix is excluded"
    ):
        resolve(TINY_CARD, sets={"lmcache": "cpu", "spec_decode": "suffix"})
    with pytest.raises(RecipeError, match="is excluded"):
        resolve(TINY_CARD, recommended=True, sets={"spec_decode": "suffix"})


def test_mode_without_off_defaults_to_first_and_sku_choice() -> None:
    spec = resolve(TINY_CARD, target="throughput")
    assert spec.selection["quant"] == "w8a16" and spec.servers[0].npus == 4
    assert resolve(TINY_CARD, target="throughput", recommended=True).servers[0].argv[-1] == (
        "--rbln-use-w8a8"
    )
    assert resolve(TINY_CARD, sku="RBLN-CR14").selection["sku"] == "RBLN-CR14"
    assert resolve(TINY_CARD, strategy="single").servers[0].npus == 1


def test_lmcache_connector_name_decides_the_extra() -> None:
    spec = resolve(TINY_CARD, sets={"lmcache": "cpu"})
    assert spec.requirements.vllm_rbln_extras == ["kv-connectors"]


def test_all_fixture_combinations_resolve_or_are_excluded() -> None:
    refused = 0
    for strategy, target, sel in combinations(TINY_CARD):
        try:
            resolve(TINY_CARD, strategy=strategy, target=target, sets=sel)
        except RecipeError as exc:
            assert "is excluded" in str(exc)
            refused += 1
    assert refused == 2  # lmcache=cpu, spec_decode=suffix x sampler on/off


# -- properties ---------------------------------------------------------------------------------

combo_index = st.integers(min_value=0, max_value=len(SEED_COMBOS) - 1)


@settings(max_examples=60, deadline=None)
@given(combo_index)
def test_json_args_keep_their_json_value(i: int) -> None:
    strategy, target, sel = SEED_COMBOS[i]
    opt = next(o for o in SEED.strategies[0].options if o.target == target)
    argv = resolve(SEED, strategy=strategy, target=target, sets=sel).servers[0].argv
    for flag in ("--kv-transfer-config", "--speculative-config"):
        values = flag_values(argv, flag)
        assert len(values) <= 1
        if values:
            fragments = [
                d["main"].add_args[flag]
                for k, d in opt.grid.deltas.items()
                if flag in d["main"].add_args and sel[k.split("=")[0]] == k.split("=")[1]
            ]
            assert json.loads(values[0]) == json.loads(fragments[-1][1])


@settings(max_examples=60, deadline=None)
@given(combo_index)
def test_deletions_remove_the_flag_and_its_value(i: int) -> None:
    strategy, target, sel = SEED_COMBOS[i]
    opt = next(o for o in SEED.strategies[0].options if o.target == target)
    argv = resolve(SEED, strategy=strategy, target=target, sets=sel).servers[0].argv
    base_args = opt.grid.base[0].args
    for key, value in sel.items():
        delta = opt.grid.deltas.get(f"{key}={value}", {}).get("main")
        for deleted in delta.del_args if delta else ():
            assert deleted not in argv
            tokens = base_args[deleted]
            # the value token is gone as well: argv is exactly the rest of the base args
            assert len(tokens) == 1 or tokens[1] not in argv
    # every token is accounted for: base args that survive plus keys the deltas appended
    kept = [k for k in base_args if k in argv]
    n_base = sum(len(base_args[k]) for k in kept)
    n_added = sum(
        len(toks)
        for k, v in sel.items()
        for d in [opt.grid.deltas.get(f"{k}={v}", {}).get("main")]
        if d
        for key2, toks in d.add_args.items()
        if key2 not in base_args
    )
    assert len(argv) == 3 + n_base + n_added
