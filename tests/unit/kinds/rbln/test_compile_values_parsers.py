"""The compile inputs' value parsers (``compile_values.py``), each called directly: what every
spelling of a value parses to, where a number stops being one (18 digits, the JSON message cut at
80 characters, an integer's at 40), and each refusal's whole line. The mutation campaign (#37)
found these held only through ``compile_inputs``, which prefixes and cuts the lines.
"""

from __future__ import annotations

from typing import Any

import pytest

from servefleet.base.errors import RecipeError
from servefleet.kinds.rbln.compile_values import (
    parse_bool,
    parse_canon,
    parse_float,
    parse_human_int,
    parse_int,
    parse_int_list,
    parse_json,
    parse_scalar,
    parse_str,
    parse_strategy,
)


def _refused(parse: Any, value: Any) -> str:
    with pytest.raises(RecipeError) as err:
        parse(value)
    return str(err.value)


@pytest.mark.parametrize(
    ("given", "value"),
    [(True, True), (False, False), ("true", True), ("TRUE", True), (" True ", True),
     ("1", True), (" 1 ", True), (1, True), ("0", False), (0, False), ("false", False),
     ("yes", False), ("", False), ("10", False)],
)  # fmt: skip
def test_parse_bool(given: Any, value: bool) -> None:
    assert parse_bool(given) is value


def test_parse_int_takes_up_to_18_characters() -> None:
    assert parse_int(" 7 ") == 7
    assert parse_int(-3) == -3
    assert parse_int("9" * 18) == 10**18 - 1
    assert _refused(parse_int, "9" * 19) == f"not an integer: {'9' * 19!r}"
    # a long text is cut at 40 characters
    assert _refused(parse_int, "1" * 50) == f"not an integer: {'1' * 40!r}"


def test_parse_int_refuses_what_is_no_integer() -> None:
    assert _refused(parse_int, " x ") == "not an integer: ' x '"
    assert _refused(parse_int, 1.5) == "not an integer: 1.5"
    assert _refused(parse_int, "1.0") == "not an integer: '1.0'"
    # a list or a mapping, whatever its text
    assert _refused(parse_int, [1]) == "not an integer: '[1]'"
    assert _refused(parse_int, {"a": 1}) == "not an integer: \"{'a': 1}\""


@pytest.mark.parametrize(
    ("given", "tokens"),
    [("12", 12), (12, 12), (" 2k ", 2000), ("0.5K", 512), ("3m", 3 * 10**6),
     ("1M", 2**20), ("2g", 2 * 10**9), ("2G", 2**31)],
)  # fmt: skip
def test_parse_human_int(given: Any, tokens: int) -> None:
    assert parse_human_int(given) == tokens


def test_parse_human_int_refuses_a_unit_it_does_not_know() -> None:
    assert _refused(parse_human_int, "1t") == "not an integer: '1t'"
    assert _refused(parse_human_int, " 1.5 ") == "not an integer: '1.5'"


def test_parse_float() -> None:
    assert parse_float(" 0.5 ") == 0.5
    assert parse_float(2) == 2.0
    assert _refused(parse_float, "most") == "not a number: 'most'"
    assert _refused(parse_float, " ") == "not a number: ' '"


def test_parse_str_strategy_and_canon() -> None:
    assert parse_str(3) == "3"
    assert parse_strategy(" EXP ") == "exponential"
    assert parse_strategy("Linear ") == "linear"
    assert parse_strategy("expo") == "expo"
    value = {"a": [1]}
    assert parse_canon(value) is value


def test_parse_int_list() -> None:
    assert parse_int_list([1, "2", " 3"]) == [1, 2, 3]
    assert parse_int_list(" [4, 16] ") == [4, 16]
    assert parse_int_list("1,,2, ") == [1, 2]
    assert parse_int_list(" 3 ") == [3]
    assert parse_int_list("") == []
    assert _refused(parse_int_list, "1,x") == "not an integer: 'x'"
    assert _refused(parse_int_list, "[1, 2") == (
        "not valid JSON: '[1, 2': malformed JSON at line 1 column 6: Expecting ',' delimiter"
    )


def test_parse_json() -> None:
    value = {"a": 1}
    assert parse_json(value) is value
    assert parse_json(' {"a": [1]} ') == {"a": [1]}
    assert _refused(parse_json, "nope") == (
        "not valid JSON: 'nope': malformed JSON at line 1 column 1: Expecting value"
    )
    # the text shown is cut at 80 characters
    assert _refused(parse_json, "x" * 100) == (
        f"not valid JSON: {'x' * 80!r}: malformed JSON at line 1 column 1: Expecting value"
    )


@pytest.mark.parametrize(
    ("given", "value"),
    [(True, True), (False, False), ("3", 3), (3, 3), ("0.5", 0.5), ("wide", "wide"),
     (None, "None"), ([1], "[1]")],
)  # fmt: skip
def test_parse_scalar(given: Any, value: Any) -> None:
    got = parse_scalar(given)
    assert got == value and type(got) is type(value)
