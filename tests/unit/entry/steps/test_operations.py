"""servefleet's own pyinfra operations, run by pyinfra's API on the ``@local`` connector: what
each command of an operation receives.

pyinfra gives a fact loaded inside an operation that operation's global arguments, ``_stdin``
included (``pyinfra/api/facts.py``, ``_handle_fact_kwargs``). A secret written from stdin then
went to the ``stat`` and ``sha256sum`` of the operation's facts too: a credential on the stdin of
commands that do not need it, and, when such a command had already exited and its channel closed
before the controller wrote (a loaded controller, 16 hosts), ``OSError('Socket is closed')`` and
a failed host (issue #17).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pyinfra.api import Config, HiddenValue, Inventory, State
from pyinfra.api.connect import connect_all
from pyinfra.api.operation import add_op
from pyinfra.api.operations import run_ops
from pyinfra.connectors.local import LocalConnector
from repo_paths import DATA

from servefleet.entry.steps.operations import secret_file


def _secret(tmp_path: Path, text: str | None, mode: int = 0o600) -> Path:
    """``tmp_path/secret`` holding ``text`` with ``mode`` (None: no file)."""
    dest = tmp_path / "secret"
    if text is not None:
        dest.write_text(text)
        dest.chmod(mode)
    return dest


def _run_secret_file(monkeypatch: pytest.MonkeyPatch, dest: Path, line: str) -> list[Any]:
    seen: list[Any] = []
    real = LocalConnector.run_shell_command

    def recording(self: LocalConnector, command: Any, **kwargs: Any) -> Any:
        seen.append((str(command), kwargs.get("_stdin")))
        return real(self, command, **kwargs)

    monkeypatch.setattr(LocalConnector, "run_shell_command", recording)
    state = State(Inventory((["@local"], {})), Config())
    connect_all(state)
    add_op(
        state, secret_file, name="secret", dest=str(dest), content=HiddenValue(line), _stdin=line
    )
    run_ops(state)
    assert not state.failed_hosts
    return seen


@pytest.mark.parametrize("before", [None, "old\n"], ids=["missing", "differs"])
def test_a_secret_reaches_only_the_command_that_writes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, before: str | None
) -> None:
    dest = _secret(tmp_path, before)
    seen = _run_secret_file(monkeypatch, dest, "s3cret\n")
    assert dest.read_text() == "s3cret\n" and dest.stat().st_mode & 0o777 == 0o600
    with_stdin = [command for command, stdin in seen if stdin]
    assert len(with_stdin) == 1 and "cat >" in with_stdin[0], seen
    # no fact reads the file: nothing of the old secret (its sha256) reaches any output
    assert len(seen) == 1 and "sha256sum" not in seen[0][0] and "stat -c '" not in seen[0][0]
    assert not list(tmp_path.glob("*.servefleet-tmp"))


def test_an_up_to_date_secret_is_not_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dest = _secret(tmp_path, "s3cret\n")
    before = dest.stat()
    seen = _run_secret_file(monkeypatch, dest, "s3cret\n")
    assert hashlib.sha256(dest.read_bytes()).hexdigest() == hashlib.sha256(b"s3cret\n").hexdigest()
    after = dest.stat()  # not replaced: the same file, untouched
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns), seen
    assert not list(tmp_path.glob("*.servefleet-tmp"))


def test_a_secret_file_of_another_mode_is_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dest = _secret(tmp_path, "s3cret\n", 0o644)
    _run_secret_file(monkeypatch, dest, "s3cret\n")
    assert dest.stat().st_mode & 0o777 == 0o600


PYINFRA = str(Path(sys.executable).parent / "pyinfra")
DEPLOY = DATA / "deploy_secret.py"


@pytest.mark.parametrize("how", [["--debug-operations"], ["--debug-operations", "--json"],
                                 ["--dry", "--json", "-vvv"], ["-y", "-vvv"]])  # fmt: skip
def test_pyinfra_never_prints_the_secret(tmp_path: Path, how: list[str]) -> None:
    dest = tmp_path / "secret"
    secret = "pw-8c1e57d0-in-no-output"
    env = {
        **os.environ,
        "SECRET_DEST": str(dest),
        "SECRET_VALUE": secret,
        "PYINFRA_PROGRESS": "off",
    }
    old = "old-pw-5d1f-before\n"  # the secret being replaced: nothing of it is printed either
    dest.write_text(old)
    dest.chmod(0o600)
    proc = subprocess.run([PYINFRA, *how, "@local", str(DEPLOY)], env=env, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert secret not in out, out
    assert old.strip() not in out and hashlib.sha256(old.encode()).hexdigest() not in out, out
    if "--debug-operations" in how:
        assert "***" in out, out  # the arguments are printed, the secret masked
    if "-y" in how:
        assert dest.read_text() == secret + "\n"
