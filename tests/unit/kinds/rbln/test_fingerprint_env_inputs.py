"""Every environment variable the compile reads changes the compile fingerprint
(``kinds/rbln/compile_table.py`` ``COMPILE_INPUTS``: each entry's ``env`` names and each
``env`` source, hashed by ``fingerprint.py``): the flag table's property test
(``test_fingerprint_property.py``) covers vLLM's flags, this one each variable, set to a value
other than its default, against a server without it. Issue #52 bug 2: with
``VLLM_RBLN_TP_SIZE`` (deprecated, still read by vllm-rbln) dropped from
``num_devices_per_local_rank``'s names, a server with ``VLLM_RBLN_TP_SIZE=4`` got the
fingerprint of one without it: ``test_the_variables_include_the_deprecated_tp_size`` and
``test_tp_size_four_is_not_the_fingerprint_of_none`` failed on that bug (the parametrized test
reads its names from the table, so it holds each name the table has, not one it lost)."""

from __future__ import annotations

from typing import Any

import pytest
from rbln_cases import COMPILER

from servefleet.kinds.rbln.compile_table import COMPILE_INPUTS
from servefleet.kinds.rbln.compile_values import (
    parse_bool,
    parse_int,
    parse_int_list,
    parse_str,
    parse_strategy,
)
from servefleet.kinds.rbln.fingerprint import compile_fingerprint

ARGV = ["vllm", "serve", "acme/tiny-moe"]


def _other(parse: Any, default: Any) -> str:
    """A value of the variable that parses to something other than ``default``."""
    if parse is parse_bool:
        return "0" if default else "1"
    if parse is parse_int:
        return str((default or 0) + 3)
    if parse is parse_int_list:
        return "[1, 2, 8]"
    if parse is parse_strategy:
        return "linear" if default != "linear" else "exponential"
    if parse is parse_str:
        return "other"
    raise AssertionError(f"no other value for {parse.__name__}")  # a new parser: add it here


VARIABLES = sorted(
    {(name, entry.parse, repr(entry.default)) for entry in COMPILE_INPUTS for name in entry.env}
    | {
        (entry.names[0], entry.parse, repr(entry.default))
        for entry in COMPILE_INPUTS
        if entry.source == "env"
    },  # fmt: skip
    key=lambda v: v[0],
)


def test_the_variables_include_the_deprecated_tp_size() -> None:
    names = [v[0] for v in VARIABLES]
    assert "VLLM_RBLN_TP_SIZE" in names and "VLLM_RBLN_NUM_DEVICES_PER_LOCAL_RANK" in names
    assert len(names) == len(set(names)) >= 18


@pytest.mark.parametrize("name", [v[0] for v in VARIABLES])
def test_each_compile_variable_changes_the_fingerprint(name: str) -> None:
    _, parse, default = next(v for v in VARIABLES if v[0] == name)
    entry = next(e for e in COMPILE_INPUTS if name in e.env or e.names == (name,))
    value = _other(parse, entry.default)
    without = compile_fingerprint(ARGV, {}, 1, "RBLN-CR13", COMPILER)
    with_it = compile_fingerprint(ARGV, {name: value}, 1, "RBLN-CR13", COMPILER)
    assert with_it != without, f"{name}={value} (default {default}) left the fingerprint"
    # a variable the compile does not read leaves it
    assert compile_fingerprint(ARGV, {"UNREAD_" + name: value}, 1, "RBLN-CR13", COMPILER) == without


def test_tp_size_four_is_not_the_fingerprint_of_none() -> None:
    without = compile_fingerprint(ARGV, {}, 1, "RBLN-CR13", COMPILER)
    tp4 = compile_fingerprint(ARGV, {"VLLM_RBLN_TP_SIZE": "4"}, 1, "RBLN-CR13", COMPILER)
    new = compile_fingerprint(ARGV, {"VLLM_RBLN_NUM_DEVICES_PER_LOCAL_RANK": "4"}, 1, "RBLN-CR13",
                              COMPILER)  # fmt: skip
    assert tp4 != without and tp4 == new  # the deprecated name reads as the new one
