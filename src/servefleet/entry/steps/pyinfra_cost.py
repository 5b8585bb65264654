"""Three of pyinfra's per-operation costs, removed without changing what it computes (#32 item 8:
the controller's CPU for each host of a first deploy).

Measured with a CPU-time profile of an 8-host first deploy (docs/benchmarks.md): about 30 % of
the controller's CPU went to ``pyinfra.api.util.get_operation_order_from_stack``, which calls
``inspect.stack()`` and then ``getframeinfo`` on every frame for every operation on every host:
each reads the frame's source lines (``findsource``, ``getmodule`` over ``sys.modules``) only
to take its file name and line number. Another 8 % went to
``pyinfra.api.arguments.all_global_arguments``, which evaluates the type hints of the same
TypedDict for every operation. And about 17 % of what was left went to paramiko comparing
each SSH packet's MAC a byte at a time in Python (``paramiko.util.constant_time_bytes_eq``).

:func:`install` puts in their place :func:`operation_order`, the same list from the frames'
code objects (``f_code.co_filename``, ``f_lineno``: what ``getframeinfo`` returns for them), and
a cached ``all_global_arguments``, and for the MAC the standard library's constant-time
``hmac.compare_digest``. pyinfra is pinned to the minor tested (pyproject), and a unit
test holds both equal to pyinfra's own on that version.

Each is written up as a change to propose upstream in docs/pyinfra-upstream.md; the test
(tests/unit/entry/steps/test_pyinfra_cost.py) also fails when pyinfra's or paramiko's own
version of a replaced function, or the modules that call it, change.
"""

from __future__ import annotations

import functools
import hmac
import importlib
import sys
from typing import Any

import paramiko.util
import pyinfra

# the modules (pyinfra.api exports functions named operation and facts too)
arguments: Any = importlib.import_module("pyinfra.api.arguments")
facts: Any = importlib.import_module("pyinfra.api.facts")
operation: Any = importlib.import_module("pyinfra.api.operation")
util: Any = importlib.import_module("pyinfra.api.util")

_ORIGINAL_ORDER = util.get_operation_order_from_stack  # pyinfra's own (the tests compare)
_ORIGINAL_ARGUMENTS = arguments.all_global_arguments
_ORIGINAL_MAC_EQ = paramiko.util.constant_time_bytes_eq


def operation_order(state: Any) -> list[int]:
    """``get_operation_order_from_stack(state)``: the line numbers of the calling frames from the
    deploy file's outermost frame on (pyinfra's own frames left out), after the CLI's operation
    file number; from the frames' code objects, reading no source.

    + state: pyinfra's State
    """
    frames = []
    me = frame = sys._getframe(0)  # in pyinfra's list too (its own frame, which it leaves out)
    while frame is not None:
        frames.append(frame)
        frame = frame.f_back  # type: ignore[assignment]
    frames.reverse()
    start = 0
    if state.current_deploy_filename:
        for start, found in enumerate(frames):  # noqa: B007 (start is read after the loop)
            if found.f_code.co_filename == state.current_deploy_filename:
                break
    line_numbers = [state.current_op_file_number] if pyinfra.is_cli else []
    for found in frames[start:]:
        if found is not me and not found.f_code.co_filename.startswith(util.PYINFRA_INSTALL_DIR):
            line_numbers.append(found.f_lineno)
    return line_numbers


def install() -> None:
    """Put :func:`operation_order` and a cached ``all_global_arguments`` in pyinfra's place (once;
    again is a no-op)."""
    if operation.get_operation_order_from_stack is operation_order:
        return
    cached = functools.cache(_ORIGINAL_ARGUMENTS)
    arguments.all_global_arguments = cached
    facts.all_global_arguments = cached
    util.get_operation_order_from_stack = operation_order
    operation.get_operation_order_from_stack = operation_order
    paramiko.util.constant_time_bytes_eq = hmac.compare_digest  # type: ignore[assignment]  # per MAC
