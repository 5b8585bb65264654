"""The argv scan (``argv_scan.py``) and its flag names (``argv_flags.py``), called directly: a
``vllm serve`` argv read as vLLM's parser reads it (the launcher, ``--flag=v``, switches and
their ``no-`` form, flags that always take a value, dotted JSON fields, one-dash spellings, the
last occurrence winning) and a JSON config flag's value with its refusals' whole lines. The
mutation campaign (#37) found these held only through the fingerprint.
"""

from __future__ import annotations

import pytest

from servefleet.base.errors import RecipeError
from servefleet.kinds.rbln.argv_flags import norm_flag, short_spellings
from servefleet.kinds.rbln.argv_scan import ScannedArgv, json_flag, json_value, scan_argv

SC = "speculative-config"


def _scan(*tokens: str) -> ScannedArgv:
    return scan_argv(["vllm", "serve", "m/x", *tokens])


# ---------------------------------------------------------------------------------------------
# argv_flags


def test_short_spellings_are_vllms_one_dash_names() -> None:
    short = short_spellings()
    assert short["tp"] == "tensor-parallel-size" and short["pp"] == "pipeline-parallel-size"
    assert short["dp"] == "data-parallel-size" and short["dpl"] == "data-parallel-size-local"
    assert short["cc"] == "compilation-config" and short["sc"] == SC
    assert short["q"] == "quantization" and short["ep"] == "enable-expert-parallel"
    assert not [k for k in short if k.startswith("-")]
    assert not [v for v in short.values() if v.startswith("-")]


@pytest.mark.parametrize(
    ("token", "name"),
    [("--max_num_seqs", "max-num-seqs"), ("--max-num-seqs", "max-num-seqs"),
     ("-tp", "tensor-parallel-size"), ("--tp", "tensor-parallel-size"), ("-q", "quantization"),
     ("--speculative-config.num_speculative_tokens", "speculative-config.num_speculative_tokens"),
     ("--speculative_config.draft_model", "speculative-config.draft_model"),
     ("-sc.method", "speculative-config.method"), ("model", "model"), ("--Xmx", "Xmx")],
)  # fmt: skip
def test_norm_flag(token: str, name: str) -> None:
    assert norm_flag(token) == name


# ---------------------------------------------------------------------------------------------
# scan_argv


def test_the_launcher_is_skipped() -> None:
    assert scan_argv(["vllm", "serve", "m/x", "extra"]).positionals == ["m/x", "extra"]
    assert scan_argv(["python3", "m/x", "serve"]).positionals == ["m/x", "serve"]
    assert scan_argv(["vllm"]) == ScannedArgv([], {}, {})
    assert scan_argv(["vllm", "serve"]) == ScannedArgv([], {}, {})
    assert _scan("-").positionals == ["m/x", "-"]


def test_a_flag_with_its_value_in_one_token_or_two() -> None:
    got = _scan("--max_num_seqs=4", "--block-size", "16", "--dtype=", "-tp", "2")
    assert got.flags == {
        "max-num-seqs": "4",
        "block-size": "16",
        "dtype": "",
        "tensor-parallel-size": "2",
    }
    assert got.positionals == ["m/x"] and got.dotted == {}
    # the last occurrence wins, in any spelling
    assert _scan("-tp", "2", "--tensor_parallel_size=4").flags == {"tensor-parallel-size": "4"}


def test_switches_take_no_value() -> None:
    got = _scan("--enforce-eager", "other", "--no-trust-remote-code", "more", "-ep", "last")
    assert got.flags == {
        "enforce-eager": True,
        "trust-remote-code": False,
        "enable-expert-parallel": True,
    }
    assert got.positionals == ["m/x", "other", "more", "last"]


def test_an_unknown_flag_takes_a_value_unless_a_flag_follows() -> None:
    got = _scan("--knob", "wide", "--flag", "--no-other", "--tail")
    assert got.flags == {"knob": "wide", "flag": True, "other": False, "tail": True}
    assert _scan("--no-knob", "x").flags == {"no-knob": "x"}


def test_a_value_flag_takes_the_next_token_whatever_it_is() -> None:
    assert _scan("--port", "-1").flags == {"port": "-1"}
    assert _scan("--max-num-seqs", "--4").flags == {"max-num-seqs": "--4"}
    # but not past the end
    assert _scan("--port").flags == {"port": True}


def test_dotted_fields_are_json_or_text() -> None:
    got = _scan(
        f"--{SC}.num_speculative_tokens",
        "2",
        f"--{SC}.method=ngram",
        f"--{SC}.draft",
        "-1",
        "-cc.level",
        '{"a": [1]}',
    )
    assert got.dotted == {
        SC: {"num_speculative_tokens": 2, "method": "ngram", "draft": -1},
        "compilation-config": {"level": {"a": [1]}},
    }
    assert got.flags == {} and got.positionals == ["m/x"]
    # a field's own dots stay in the field
    assert _scan(f"--{SC}.a.b", "1").dotted == {SC: {"a.b": 1}}


# ---------------------------------------------------------------------------------------------
# json_flag, json_value


def test_a_json_flag_merges_its_dotted_fields() -> None:
    assert json_flag(_scan(), SC) is None
    assert json_flag(_scan(f"--{SC}", '{"method": "ngram", "n": 1}'), SC) == {
        "method": "ngram",
        "n": 1,
    }
    both = _scan(f"--{SC}", '{"method": "ngram", "n": 1}', f"--{SC}.n", "3")
    assert json_flag(both, SC) == {"method": "ngram", "n": 3}
    assert json_flag(_scan(f"--{SC}.n", "3"), SC) == {"n": 3}
    # given last without a value: no object, its dotted fields only
    assert json_flag(_scan(f"--{SC}"), SC) == {}


def test_a_json_flag_that_is_no_object_is_refused() -> None:
    with pytest.raises(RecipeError) as err:
        json_flag(_scan(f"--{SC}", "nope"), SC)
    assert str(err.value) == (
        f"--{SC}: not valid JSON: 'nope': malformed JSON at line 1 column 1: Expecting value"
    )
    with pytest.raises(RecipeError) as err:
        json_flag(_scan(f"--{SC}", "[1]"), SC)
    assert str(err.value) == f"--{SC}: expected a JSON object, got '[1]'"
    long = "[" + "1," * 60 + "1]"
    with pytest.raises(RecipeError) as err:
        json_flag(_scan(f"--{SC}", long), SC)
    assert str(err.value) == f"--{SC}: expected a JSON object, got {long[:80]!r}"
    with pytest.raises(RecipeError) as err:
        json_flag(_scan(f"--{SC}", "x" * 90), SC)
    assert str(err.value).startswith(f"--{SC}: not valid JSON: {'x' * 80!r}: malformed JSON")


def test_json_value_is_the_text_when_it_is_no_object() -> None:
    assert json_value(_scan("-cc", "3"), "compilation-config") == "3"
    assert json_value(_scan("-cc", "nope"), "compilation-config") == "nope"
    assert json_value(_scan("-cc", '{"level": 3}'), "compilation-config") == {"level": 3}
    assert json_value(_scan(), "compilation-config") is None
