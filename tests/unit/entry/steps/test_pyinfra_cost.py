"""servefleet's stand-ins for two of pyinfra's per-operation costs (steps/pyinfra_cost.py) compute
what pyinfra's own do, on the pinned pyinfra: the operation order from the call stack (which
orders every host's operations, so a difference would reorder a deploy), and the global
arguments."""

from __future__ import annotations

import types
from typing import Any

import pyinfra
import pytest

from servefleet.entry.steps import pyinfra_cost


def nested(depth: int, probe: Any) -> Any:
    """``probe()`` called ``depth`` frames down, each frame on its own line of this file."""
    if depth == 0:
        return probe()
    return nested(depth - 1, probe)


@pytest.mark.parametrize("is_cli", [True, False])
@pytest.mark.parametrize("deploy_file", [__file__, None, "/not/on/the/stack.py"])
@pytest.mark.parametrize("depth", [0, 3, 9])
def test_the_operation_order_is_pyinfras(
    monkeypatch: pytest.MonkeyPatch, is_cli: bool, deploy_file: str | None, depth: int
) -> None:
    monkeypatch.setattr(pyinfra, "is_cli", is_cli)
    state = types.SimpleNamespace(current_deploy_filename=deploy_file, current_op_file_number=7)

    def both() -> tuple[list[int], list[int]]:
        # each called from this same line, as pyinfra's solve_operation_consistency would
        return pyinfra_cost._ORIGINAL_ORDER(state), pyinfra_cost.operation_order(state)  # type: ignore[no-any-return]

    theirs, ours = nested(depth, both)
    assert ours == theirs
    if deploy_file != "/not/on/the/stack.py":  # (a deploy file not on the stack: the last only)
        assert len(theirs) > depth  # the stack was really walked


def test_install_puts_them_in_pyinfras_place_once() -> None:
    pyinfra_cost.install()
    pyinfra_cost.install()
    assert pyinfra_cost.operation.get_operation_order_from_stack is pyinfra_cost.operation_order
    assert pyinfra_cost.util.get_operation_order_from_stack is pyinfra_cost.operation_order
    cached = pyinfra_cost.arguments.all_global_arguments
    assert cached is pyinfra_cost.facts.all_global_arguments
    assert cached() == pyinfra_cost._ORIGINAL_ARGUMENTS()
    assert cached() is cached()  # evaluated once


@pytest.mark.parametrize(
    ("a", "b"),
    [(b"", b""), (b"x" * 32, b"x" * 32), (b"x" * 32, b"x" * 31 + b"y"), (b"ab", b"abc"),
     (bytes(range(32)), bytes(range(32))), (b"\x00" * 20, b"\x00" * 19 + b"\x01")],
)  # fmt: skip
def test_the_mac_comparison_answers_as_paramikos(a: bytes, b: bytes) -> None:
    import hmac

    import paramiko.util

    pyinfra_cost.install()
    assert paramiko.util.constant_time_bytes_eq is hmac.compare_digest
    assert hmac.compare_digest(a, b) == pyinfra_cost._ORIGINAL_MAC_EQ(a, b)
