"""The compile fingerprint's table (``kinds/rbln/compile_table.py``'s ``COMPILE_INPUTS``: the
flags it reads, the ``--rbln-*`` options but ``RBLN_NOT_COMPILED``, the speculative config's
fields) against vLLM's own flag table (the dump of vllm-rbln 0.12.0's parser, flags.py's): each
flag the table counts changes the fingerprint, every other flag of vLLM's table does not, and
``--quantization`` is among those that count. Issue #37's hole 8 (``--quantization`` left out
was caught only by golden files; shown failing here and in test_fingerprint_property.py, whose
oracle is the lab simulator's compile cache key)."""

from __future__ import annotations

from typing import Any

import pytest
from flag_settings import FLAGS, settings, spelling
from rbln_cases import COMPILER

from servefleet.base import flags
from servefleet.kinds.rbln import compile_table, fingerprint as fpm

BASE = ["vllm", "serve", "m/x"]
SPEC_A = '{"method": "eagle3", "model": "d/1", "num_speculative_tokens": 2, "x": 1}'
SPEC_B = '{"method": "suffix", "model": "d/2", "num_speculative_tokens": 3, "x": 2}'


_READ = {
    n
    for e in compile_table.COMPILE_INPUTS
    if e.source in ("model", "flag", "json", "presence")
    for n in e.names
}
_SPEC = any(e.source == "spec" for e in compile_table.COMPILE_INPUTS)


def _counted(dest: str) -> bool:
    """Whether the fingerprint's table counts the flag that sets ``dest``."""
    if dest.replace("_", "-") in _READ:
        return True
    if dest == "speculative_config":
        return _SPEC
    return dest.startswith("rbln_") and dest[len("rbln_") :] not in compile_table.RBLN_NOT_COMPILED


COUNTED = [e for e in FLAGS if _counted(e["dest"])]
NOT_COUNTED = [e for e in FLAGS if not _counted(e["dest"])]


def _settings(entry: dict[str, Any]) -> list[list[str]]:
    """Two settings of the flag that differ (a JSON flag: two speculative configs)."""
    return settings(entry, lambda _: [SPEC_A, SPEC_B])


def _fp(argv: list[str], env: dict[str, str] | None = None) -> str:
    return fpm.compile_fingerprint(argv, env or {}, 1, "RBLN-CR13", COMPILER)


def _ids(entries: list[dict[str, Any]]) -> list[str]:
    return [spelling(e) for e in entries]


def test_the_table_splits_vllms_flags_and_quantization_counts() -> None:
    spellings = {spelling(e) for e in COUNTED}
    # what rbln.md §3.5 names as triggers, --quantization among them (the golden-only catch)
    assert {
        "--quantization",
        "--model",
        "--dtype",
        "--max-model-len",
        "--block-size",
        "--max-num-seqs",
        "--max-num-batched-tokens",
        "--gpu-memory-utilization",
        "--num-gpu-blocks-override",
        "--tensor-parallel-size",
        "--pipeline-parallel-size",
        "--data-parallel-size",
        "--enable-expert-parallel",
        "--speculative-config",
        "--kv-transfer-config",
        "--rbln-use-w8a8",
    } <= spellings
    # every flag the fingerprint reads is one vLLM has (a renamed flag would count nothing)
    table = {n.lstrip("-") for e in FLAGS for n in e["flags"]}
    assert _READ <= table
    # what the fingerprint documents as not counted is on the other side
    not_counted = {n for e in NOT_COUNTED for n in e["flags"]}
    assert {
        k for k in compile_table.NOT_COUNTED if k.startswith("--") and " " not in k
    } <= not_counted
    assert len(COUNTED) > 30 and len(NOT_COUNTED) > 200


@pytest.mark.parametrize("entry", COUNTED, ids=_ids(COUNTED))
def test_every_counted_flag_changes_the_fingerprint(entry: dict[str, Any]) -> None:
    settings = _settings(entry)
    # the positional model wins over --model (vllm serve's model_tag): --model alone, here
    base = BASE[:2] if entry["dest"] == "model" else BASE
    prints = [_fp(base + s) for s in settings]
    if entry["dest"] == "kv_transfer_config":  # its presence counts, its content does not
        assert prints[0] == prints[1] != _fp(BASE)
    elif len(settings) == 1:
        assert prints[0] != _fp(BASE), settings
    else:
        assert prints[0] != prints[1], settings


@pytest.mark.parametrize("entry", NOT_COUNTED, ids=_ids(NOT_COUNTED))
def test_every_other_flag_leaves_the_fingerprint(entry: dict[str, Any]) -> None:
    base = _fp(BASE)
    for setting in _settings(entry):
        assert _fp(BASE + setting) == base, setting


def test_compile_env_vars_change_it_and_the_others_of_vllms_list_do_not() -> None:
    counted = {e.names[0] for e in compile_table.COMPILE_INPUTS if e.source == "env"}
    counted |= {v for e in compile_table.COMPILE_INPUTS for v in e.env}
    base = _fp(BASE)
    for var in sorted(counted):
        assert _fp(BASE, {var: "1"}) != _fp(BASE, {var: "0"}), var
    for var in sorted(flags.table("rbln").envs - counted):
        assert _fp(BASE, {var: "1"}) == _fp(BASE, {var: "0"}) == base, var


def test_every_spelling_of_a_counted_flag_counts() -> None:
    """vLLM's one-dash spellings (-q, -sc, -cc, ...) count as their long flags: the fingerprint
    reads them from the flag table (it knew -tp/-pp/-dp/-ep only)."""
    differ: set[str] = set()
    for entry in COUNTED:
        for short in [f for f in entry["flags"] if not f.startswith("--")]:
            for setting in _settings(entry):
                if setting[0] == spelling(entry) and _fp(BASE + [short, *setting[1:]]) != _fp(
                    BASE + setting
                ):
                    differ.add(short)
    assert differ == set()
