"""servefleet's stand-ins for three of pyinfra's and paramiko's per-operation costs
(steps/pyinfra_cost.py, written up as changes to propose upstream in docs/pyinfra-upstream.md)
compute what the originals do, on the pinned pyinfra: the operation order from the call stack
(which orders every host's operations, so a difference would reorder a deploy), the global
arguments and the MAC comparison. And the originals are still the ones they were written
against: the source of each, and the modules that call it, as recorded below; a new pyinfra
or paramiko that changes one fails here until its stand-in is checked again."""

from __future__ import annotations

import hashlib
import importlib.metadata
import inspect
import types
from pathlib import Path
from typing import Any

import paramiko
import pyinfra
import pytest

from servefleet.entry.steps import pyinfra_cost

# each original: (its distribution, the version its source was hashed on, the sha256 of
# inspect.getsource, the modules of that distribution whose source names it: those install()
# must reach, by attribute or by replacing the name they imported)
ORIGINALS = {
    "pyinfra.api.util.get_operation_order_from_stack": (
        "pyinfra", "3.10.0",
        "f4807f61585570e091fd453c7552d9e2b49329555f07f395a8e8f1d2a398a0b2",
        {"pyinfra.api.util", "pyinfra.api.operation"},
    ),
    "pyinfra.api.arguments.all_global_arguments": (
        "pyinfra", "3.10.0",
        "f7afbc472d78c5d2f0bb282994175647651e888543da001968d903cc4a26a5a1",
        {"pyinfra.api.arguments", "pyinfra.api.facts"},
    ),
    "paramiko.util.constant_time_bytes_eq": (
        "paramiko", "4.0.0",
        "140c13a7469e0068b69674eb88c4058674f0bbd3ab1e173ddbd985002cf3cf5f",
        # packet.py calls util.constant_time_bytes_eq (the attribute install() replaces);
        # hostkeys.py imported the name itself and keeps paramiko's (once per known host)
        {"paramiko.util", "paramiko.packet", "paramiko.hostkeys"},
    ),
}  # fmt: skip
STAND_INS = {
    "pyinfra.api.util.get_operation_order_from_stack": pyinfra_cost._ORIGINAL_ORDER,
    "pyinfra.api.arguments.all_global_arguments": pyinfra_cost._ORIGINAL_ARGUMENTS,
    "paramiko.util.constant_time_bytes_eq": pyinfra_cost._ORIGINAL_MAC_EQ,
}


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


def _modules_naming(package: types.ModuleType, name: str) -> set[str]:
    """The modules of ``package`` whose source holds ``name`` (read from disk, none imported)."""
    top = Path(str(package.__file__)).parent
    found = set()
    for path in top.rglob("*.py"):
        if name in path.read_text(encoding="utf-8"):
            parts = path.relative_to(top.parent).with_suffix("").parts
            found.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return found


@pytest.mark.parametrize("where", sorted(ORIGINALS))
def test_the_original_is_the_one_its_stand_in_was_written_against(where: str) -> None:
    """Fails when pyinfra or paramiko changes the function a stand-in replaces: re-check the
    stand-in in steps/pyinfra_cost.py against the new source (and docs/pyinfra-upstream.md:
    has upstream made it unnecessary?), then record the new hash and version here."""
    dist, version, sha256, _ = ORIGINALS[where]
    source = inspect.getsource(STAND_INS[where])
    got = hashlib.sha256(source.encode()).hexdigest()
    installed = importlib.metadata.version(dist)
    assert got == sha256, (
        f"{where} changed in {dist} {installed} (hashed on {version}): re-check its stand-in in "
        f"src/servefleet/entry/steps/pyinfra_cost.py against this source, then update the hash "
        f"and the version in ORIGINALS:\n{source}"
    )


@pytest.mark.parametrize("where", sorted(ORIGINALS))
def test_the_original_is_called_from_the_modules_recorded(where: str) -> None:
    """A new caller, or one that now imports the name itself, would keep the original (and its
    cost) where install() does not reach."""
    dist, version, _, callers = ORIGINALS[where]
    package = {"pyinfra": pyinfra, "paramiko": paramiko}[dist]
    found = _modules_naming(package, where.rsplit(".", 1)[1])
    assert found == callers, (
        f"{dist} {importlib.metadata.version(dist)} (recorded on {version}) names "
        f"{where.rsplit('.', 1)[1]} in {sorted(found)}: check that install() in "
        "src/servefleet/entry/steps/pyinfra_cost.py reaches each caller, then update ORIGINALS"
    )
    if dist == "paramiko":
        assert "util.constant_time_bytes_eq(" in inspect.getsource(paramiko.packet)
