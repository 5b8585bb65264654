"""What the mutation campaign (#37, docs/testing.md) found unpinned in kinds/rbln/fingerprint.py:
the hashed text itself (hosts keep warm markers and sealed compile caches under a fingerprint,
so the same inputs must hash to the same hex in every servefleet: sorted keys, no spaces, UTF-8
as it is), the served model given by ``--model`` alone, what a presence input is when the flag is
absent, and a compiler version's suffix in capitals."""

from __future__ import annotations

import hashlib

import pytest
from rbln_cases import COMPILER

from servefleet.kinds.rbln.fingerprint import (
    compile_fingerprint,
    compile_inputs,
    compiler_minor,
    fingerprint,
)

BASE = ["vllm", "serve", "m/x"]


def _inputs(argv: list[str]) -> dict[str, object]:
    return compile_inputs(argv, {}, 1, "RBLN-CR13", COMPILER)


def test_the_hashed_text_is_the_canonical_json() -> None:
    inputs = {"b": [1, 2.5], "a": "modèle/é", "c": {"z": None, "y": True}}
    text = '{"a":"modèle/é","b":[1,2.5],"c":{"y":true,"z":null}}'
    assert fingerprint(inputs) == hashlib.sha256(text.encode("utf-8")).hexdigest()


def test_the_model_flag_alone_is_the_served_model() -> None:
    by_flag = compile_fingerprint(["vllm", "serve", "--model", "o/y"], {}, 1, "RBLN-CR13", COMPILER)
    assert by_flag == compile_fingerprint(["vllm", "serve", "o/y"], {}, 1, "RBLN-CR13", COMPILER)
    assert _inputs(["vllm", "serve", "--model", "o/y"])["model"] == "o/y"


@pytest.mark.parametrize(
    ("given", "present"),
    [
        ([], False),
        (["--kv-transfer-config", '{"kv_connector": "A"}'], True),
        (["--kv-transfer-config.kv_connector", "A"], True),
    ],
)
def test_a_presence_input_is_whether_the_flag_is_given(given: list[str], present: bool) -> None:
    assert _inputs(BASE + given).get("vllm.kv_transfer_config", False) is present


@pytest.mark.parametrize("version", ["0.12.0RC1", "0.12.0+gA1B2", "0.12.0.Dev3"])
def test_a_compiler_version_with_capitals_in_its_suffix(version: str) -> None:
    assert compiler_minor(version) == "0.12"
