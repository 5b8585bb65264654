"""The compile fingerprint: what counts (the table), what does not, normalisation."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st
from rbln_cases import COMPILER, combinations, seed

from servefleet.base.errors import RecipeError
from servefleet.kinds.rbln.compile_table import (
    ADDED_AT_DEFAULT_OMITTED,
    COMPILE_INPUTS,
    NOT_COUNTED,
)
from servefleet.kinds.rbln.compile_values import parse_bool
from servefleet.kinds.rbln.fingerprint import compile_fingerprint, compile_inputs, compiler_minor
from servefleet.kinds.rbln.resolve import resolve_rbln

SEED = seed()
SEED_COMBOS = list(combinations(SEED))
BASE = ["vllm", "serve", "m/x", "--max-num-seqs", "4", "--block-size", "1024"]
ENV: dict[str, str] = {}


def fp(argv: list[str], env: dict[str, str] | None = None, **kw: object) -> str:
    args: dict = {"npus": 1, "sku": "RBLN-CR13", "compiler_version": COMPILER, **kw}
    return compile_fingerprint(argv, env if env is not None else ENV, **args)


def units(argv: list[str]) -> list[list[str]]:
    """Split an argv after the model into flag units (a flag and its value, if any)."""
    out: list[list[str]] = []
    for tok in argv[3:]:
        if tok.startswith("--") or not out:
            out.append([tok])
        else:
            out[-1].append(tok)
    return out


def test_table_has_one_key_each_and_reasons() -> None:
    keys = [e.key for e in COMPILE_INPUTS]
    assert len(keys) == len(set(keys))
    assert all(e.reason for e in COMPILE_INPUTS)
    # the inputs added after fingerprints were first recorded are left out at their default
    assert set(compile_inputs(BASE, {}, 1, "S", "0.12.0")) == set(keys) - ADDED_AT_DEFAULT_OMITTED
    assert ADDED_AT_DEFAULT_OMITTED <= set(keys)


def _changed_value(entry) -> list[str]:  # type: ignore[no-untyped-def]
    if entry.parse is parse_bool:
        return [] if not entry.default else None  # type: ignore[return-value]
    if entry.key.endswith("manual_buckets"):
        return ["1,2,4"]
    if entry.key.endswith("optimum_overrides"):
        return ['{"a": 1}']
    if entry.key.endswith("strategy"):
        return ["linear"]
    if entry.key.endswith("gpu_memory_utilization"):
        return ["0.5"]
    return ["7"] if entry.parse.__name__ in ("parse_int", "parse_human_int") else ["bf16"]


@pytest.mark.parametrize(
    "entry", [e for e in COMPILE_INPUTS if e.source == "flag"], ids=lambda e: e.key
)
def test_every_counted_flag_changes_the_fingerprint(entry) -> None:  # type: ignore[no-untyped-def]
    flag = "--" + entry.names[0]
    value = _changed_value(entry)
    argv = BASE + ([flag, *value] if value is not None else ["--no-" + entry.names[0]])
    assert fp(argv) != fp(BASE)
    for env_name in entry.env:  # deprecated env spelling counts when no flag is given
        env_value = "0" if entry.default is True else ",".join(value or ["1"])
        assert fp(BASE, {env_name: env_value}) != fp(BASE)
        assert fp(argv, {env_name: env_value}) == fp(argv)  # the flag wins


@pytest.mark.parametrize(
    "entry", [e for e in COMPILE_INPUTS if e.source == "env"], ids=lambda e: e.key
)
def test_every_compile_env_var_changes_the_fingerprint(entry) -> None:  # type: ignore[no-untyped-def]
    changed = {
        "VLLM_RBLN_USE_VLLM_MODEL": "true",
        "VLLM_RBLN_NUM_HIDDEN_LAYERS": "2",
        "VLLM_RBLN_USE_DEVICE_TENSOR": "0",
    }[entry.names[0]]
    assert fp(BASE, {entry.names[0]: changed}) != fp(BASE)


def test_inputs_model_spec_presence() -> None:
    assert fp(["vllm", "serve", "m/y", *BASE[3:]]) != fp(BASE)
    assert fp(BASE, npus=2) != fp(BASE)
    assert fp(BASE, sku="RBLN-CR14") != fp(BASE)
    assert fp(BASE, compiler_version="0.13.0") != fp(BASE)
    assert fp(BASE, compiler_version="0.12.7") == fp(BASE)
    spec = '{"method": "eagle3", "model": "d/1", "num_speculative_tokens": 3}'
    with_spec = fp(BASE + ["--speculative-config", spec])
    assert with_spec != fp(BASE)
    for other in (
        '{"method": "suffix", "model": "d/1", "num_speculative_tokens": 3}',
        '{"method": "eagle3", "model": "d/2", "num_speculative_tokens": 3}',
        '{"method": "eagle3", "model": "d/1", "num_speculative_tokens": 4}',
        '{"method": "eagle3", "model": "d/1", "num_speculative_tokens": 3, '
        '"draft_tensor_parallel_size": 2}',
    ):
        assert fp(BASE + ["--speculative-config", other]) != with_spec
    # key order and spacing inside the JSON do not count
    assert (
        fp(
            BASE
            + [
                "--speculative-config",
                '{"num_speculative_tokens":3,"model":"d/1","method":"eagle3"}',
            ]
        )
        == with_spec
    )
    assert (
        fp(
            BASE
            + [
                "--speculative-config.method",
                "eagle3",
                "--speculative-config.model",
                "d/1",
                "--speculative-config.num_speculative_tokens",
                "3",
            ]
        )
        == with_spec
    )


def test_kv_transfer_presence_counts_content_does_not() -> None:
    a = fp(BASE + ["--kv-transfer-config", '{"kv_connector": "A", "kv_role": "kv_both"}'])
    b = fp(BASE + ["--kv-transfer-config", '{"kv_connector": "B"}'])
    assert a == b != fp(BASE)


NOT_COUNTED_ARGS = {
    "--port": ["--port", "9000"],
    "--host": ["--host", "0.0.0.0"],
    "--served-model-name": ["--served-model-name", "x"],
    "--enable-prefix-caching": ["--enable-prefix-caching"],
    "--no-enable-prefix-caching": ["--no-enable-prefix-caching"],
    "--rbln-enable-sub-block-cache": ["--rbln-enable-sub-block-cache"],
    "--rbln-sub-block-size": ["--rbln-sub-block-size", "128"],
    "--rbln-use-custom-sampler": ["--no-rbln-use-custom-sampler"],
    "--tool-call-parser": ["--tool-call-parser", "openai"],
    "--reasoning-parser": ["--reasoning-parser", "openai_gptoss"],
    "--enable-auto-tool-choice": ["--enable-auto-tool-choice"],
}
NOT_COUNTED_ENV = {
    "VLLM_RBLN_SUB_BLOCK_CACHE": "0",
    "VLLM_RBLN_SUB_BLOCK_SIZE": "64",
    "VLLM_RBLN_SAMPLER": "0",
    "LMCACHE_*": "4096",
    "PYTHONHASHSEED": "42",
    "VLLM_ENGINE_READY_TIMEOUT_S": "9600",
}


@pytest.mark.parametrize("name", [n for n in NOT_COUNTED if n != "--kv-transfer-config content"])
def test_not_counted(name: str) -> None:
    if name.startswith("--"):
        assert fp(BASE + NOT_COUNTED_ARGS[name]) == fp(BASE)
    else:
        var = name.replace("*", "CHUNK_SIZE")
        assert fp(BASE, {var: NOT_COUNTED_ENV[name]}) == fp(BASE)


def test_normalisation() -> None:
    ref = fp(BASE)
    assert fp(["vllm", "serve", "m/x", "--max-num-seqs=4", "--block_size", "1024"]) == ref
    assert (
        fp(
            BASE
            + [
                "--dtype",
                "auto",
                "--gpu-memory-utilization",
                "0.90",
                "-tp",
                "1",
                "--no-enable-expert-parallel",
                "--model-impl=auto",
            ]
        )
        == ref
    )
    assert fp(BASE + ["--max-model-len", "128K"]) == fp(BASE + ["--max-model-len", "131072"])
    assert fp(["/opt/venv/bin/vllm", "serve", *BASE[2:]]) == ref
    assert fp(BASE + ["--rbln-foo", "3"]) != ref  # unknown --rbln-* options count too


def test_bad_values_are_one_line_errors() -> None:
    with pytest.raises(RecipeError, match="vllm.max_num_seqs: not an integer: 'many'"):
        fp(BASE + ["--max-num-seqs", "many"])
    with pytest.raises(RecipeError, match="--speculative-config: not valid JSON"):
        fp(BASE + ["--speculative-config", "{nope"])
    with pytest.raises(RecipeError, match="not a version like 0.12.0"):
        compiler_minor("twelve")
    assert compiler_minor("0.12.0rc1") == "0.12"


combo_index = st.integers(min_value=0, max_value=len(SEED_COMBOS) - 1)


@settings(max_examples=80, deadline=None)
@given(combo_index, st.randoms(use_true_random=False), st.integers(1024, 65535))
def test_independent_of_key_order_and_ports(i: int, rnd, port: int) -> None:  # type: ignore[no-untyped-def]
    strategy, target, sel = SEED_COMBOS[i]
    server = resolve_rbln(
        SEED, strategy=strategy, target=target, sets=sel, compiler_version=COMPILER
    ).servers[0]
    ref = fp(server.argv, server.env)
    parts = units(server.argv) + [["--port", str(port)], ["--host", "127.0.0.1"]]
    rnd.shuffle(parts)
    env_items = list(server.env.items())
    rnd.shuffle(env_items)
    argv = server.argv[:3] + [t for p in parts for t in p]
    assert fp(argv, dict(env_items)) == ref
