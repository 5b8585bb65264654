"""The compile fingerprint's value normalisers (kinds/rbln/compile_values.py), found unchecked by
the mutation campaign (issue #37, bench/mutation.py): the same input in another spelling gives
the same compile inputs (``exp`` is ``exponential`` in any case, a bucket list as JSON or as a
comma list, ``1k``/``1K`` lengths), another value other ones, and a value that is none of its
type is refused in one line naming the input."""

from __future__ import annotations

from typing import Any

import pytest

from servefleet.base.errors import RecipeError
from servefleet.kinds.rbln.fingerprint import compile_inputs

BASE = ["vllm", "serve", "m/x"]


def _inputs(*flags: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    return compile_inputs([*BASE, *flags], env or {}, 1, "RBLN-CR13", "0.12.0")


STRATEGY = "rbln.decode_batch_bucket_strategy"
BUCKETS = "rbln.decode_batch_bucket_manual_buckets"


@pytest.mark.parametrize("spelling", ["exp", "EXP", " Exp ", "exponential", "EXPONENTIAL"])
def test_the_exponential_strategy_in_any_spelling_is_the_default(spelling: str) -> None:
    flag = ["--rbln-decode-batch-bucket-strategy", spelling]
    assert _inputs(*flag)[STRATEGY] == "exponential" == _inputs()[STRATEGY]
    assert _inputs(env={"VLLM_RBLN_DECODE_BATCH_BUCKET_STRATEGY": spelling})[STRATEGY] == (
        "exponential"
    )
    assert _inputs("--rbln-decode-batch-bucket-strategy", "Linear")[STRATEGY] == "linear"


@pytest.mark.parametrize("given", ["1,2,8", "[1, 2, 8]", " [1,2,8] ", "1, 2, 8,"])
def test_manual_buckets_as_json_or_a_comma_list(given: str) -> None:
    assert _inputs("--rbln-decode-batch-bucket-manual-buckets", given)[BUCKETS] == [1, 2, 8]
    env = {"VLLM_RBLN_DECODE_BATCH_BUCKET_MANUAL_BUCKETS": given}
    assert _inputs(env=env)[BUCKETS] == [1, 2, 8]


def test_manual_buckets_from_additional_config_as_a_json_list() -> None:
    extra = ["--additional-config", '{"decode_batch_bucket_manual_buckets": [4, 16]}']
    assert _inputs(*extra)[BUCKETS] == [4, 16]


@pytest.mark.parametrize(
    ("given", "why"),
    [("[1, 2", "not valid JSON"), ("[1, [2]]", "not an integer"),
     ('["x"]', "not an integer"), ("1,x", "not an integer")],
)  # fmt: skip
def test_manual_buckets_that_are_no_integers_are_refused(given: str, why: str) -> None:
    with pytest.raises(RecipeError) as err:
        _inputs("--rbln-decode-batch-bucket-manual-buckets", given)
    assert str(err.value).startswith(f"compile input {BUCKETS}: {why}")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("given", "tokens"),
    [("1000", 1000), ("1k", 1000), ("1K", 1024), ("1.5k", 1500), ("2m", 2_000_000),
     ("2M", 2 * 2**20), ("1g", 10**9), ("1G", 2**30), (" 4k ", 4000)],
)  # fmt: skip
def test_max_model_len_takes_vllms_human_readable_numbers(given: str, tokens: int) -> None:
    assert _inputs("--max-model-len", given)["vllm.max_model_len"] == tokens


@pytest.mark.parametrize("given", ["1x", "k", "1.5", "lots"])
def test_a_max_model_len_that_is_no_number_is_refused(given: str) -> None:
    with pytest.raises(RecipeError) as err:
        _inputs("--max-model-len", given)
    assert str(err.value).startswith("compile input vllm.max_model_len: not an integer: ")


def test_a_memory_fraction_that_is_no_number_is_refused() -> None:
    assert _inputs("--gpu-memory-utilization", "0.50")["vllm.gpu_memory_utilization"] == 0.5
    with pytest.raises(RecipeError) as err:
        _inputs("--gpu-memory-utilization", "most")
    assert str(err.value) == "compile input vllm.gpu_memory_utilization: not a number: 'most'"


def test_an_rbln_option_the_table_does_not_know_counts_by_its_value() -> None:
    assert _inputs("--rbln-future-knob", "3")["rbln.future_knob"] == 3
    assert _inputs("--rbln-future-knob", "0.5")["rbln.future_knob"] == 0.5
    assert _inputs("--rbln-future-knob", "wide")["rbln.future_knob"] == "wide"
    assert _inputs("--rbln-future-knob")["rbln.future_knob"] is True
    assert _inputs("--no-rbln-future-knob")["rbln.future_knob"] is False
