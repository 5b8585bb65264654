"""``remote/health.py``'s reading of systemd in-process (issue #37's mutation campaign; the gate
run as a program is test_health_gate.py's): ``unit_state`` from ``systemctl show`` (the command,
each property, defaults, numbers that are not, the unit's environment files), ``api_key`` (as
systemd reads an environment file: the last key, comments, quotes) and ``state_problem``'s
verdict and words for each state. ``systemctl`` is the test's (subprocess.run)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from repo_paths import REMOTE

sys.path.insert(0, str(REMOTE))
import health  # noqa: E402  (a host program: imported as the host imports it)

UNIT = "servefleet-vllm-0.service"


def shown(monkeypatch: pytest.MonkeyPatch, out: str) -> list[list[str]]:
    """``systemctl show`` prints ``out``; returns the calls made."""
    calls: list[list[str]] = []

    def run(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        calls.append(cmd)
        assert kw == {"capture_output": True, "text": True}
        return subprocess.CompletedProcess(cmd, 0, out, "")

    monkeypatch.setattr(subprocess, "run", run)
    return calls


def test_unit_state_asks_for_each_property_and_reads_them(monkeypatch: pytest.MonkeyPatch) -> None:
    out = (
        "LoadState=loaded\nActiveState=activating\nSubState=auto-restart\nResult=exit-code\n"
        "NRestarts=3\nExecMainCode=1\nExecMainStatus=7\nMainPID=4242\n"
        "ControlGroup=/system.slice/a=b.service\nnoise without equals\n"
        "EnvironmentFiles=/etc/servefleet/secrets/k.env (ignore_errors=no)\n"
        "EnvironmentFiles=/etc/a (b).env (ignore_errors=yes)\n"
        "EnvironmentFiles=/etc/c (ignore_errors=x).env (ignore_errors=no)\n"  # the last suffix
        "EnvironmentFiles=/etc/d e.env\n"  # without one
    )
    calls = shown(monkeypatch, out)
    assert health.unit_state(UNIT) == health.UnitState(
        load="loaded", active="activating", sub="auto-restart", result="exit-code", restarts=3,
        main_code=1, main_status=7, main_pid=4242, cgroup="/system.slice/a=b.service",
        env_files=("/etc/servefleet/secrets/k.env", "/etc/a (b).env", "/etc/c (ignore_errors=x).env",
                   "/etc/d e.env"),
    )  # fmt: skip
    wanted = [a for p in health.PROPERTIES for a in ("-p", p)]
    assert calls == [["systemctl", "show", *wanted, UNIT]]
    assert "EnvironmentFiles" in health.PROPERTIES and len(health.PROPERTIES) == 10


def test_unit_state_of_nothing_said(monkeypatch: pytest.MonkeyPatch) -> None:
    shown(monkeypatch, "NRestarts=many\nMainPID=\nEnvironmentFiles=\n")
    assert health.unit_state(UNIT) == health.UnitState(
        load="", active="unknown", sub="", result="", restarts=0, main_code=0, main_status=0,
        main_pid=0, cgroup="", env_files=(),
    )  # fmt: skip


# -- api_key -------------------------------------------------------------------------------------


def files(tmp_path: Path, *texts: str) -> health.UnitState:
    paths = []
    for i, text in enumerate(texts):
        path = tmp_path / f"{i}.env"
        path.write_text(text)
        paths.append(str(path))
    return health.UnitState("loaded", "active", "running", "", 0, 0, 0, 1, "", tuple(paths))


@pytest.mark.parametrize(
    ("texts", "key"),
    [
        (["VLLM_API_KEY=abc\n"], "abc"),
        (['VLLM_API_KEY="a b"\n'], "a b"),
        (["VLLM_API_KEY='q'\n"], "q"),
        (["VLLM_API_KEY=XkeyX\n"], "XkeyX"),  # only quotes are quotes
        (["VLLM_API_KEY='\n"], "\n"),  # a quote left open runs to the end, line ends and all
        (["VLLM_API_KEY=\"x'\n"], "x'\n"),  # (as systemd reads it)
        (["VLLM_API_KEY=x=y\n"], "x=y"),
        (["  VLLM_API_KEY  =  k1  \n"], "k1"),
        (["VLLM_API_KEY=a\nVLLM_API_KEY=b\n"], "b"),
        (["VLLM_API_KEY=a\n", "OTHER=1\n", "VLLM_API_KEY=c\n"], "c"),
        (["VLLM_API_KEY=a\n", "VLLM_API_KEY=\n"], None),  # the last one empties it
        (["VLLM_API_KEY\n", "XVLLM_API_KEY=z\n", "VLLM_API_KEYS=z\n"], None),
        (['VLLM_API_KEY=""\n'], None),
        ([], None),
    ],
)
def test_the_key_is_the_last_of_the_units_files(
    tmp_path: Path, texts: list[str], key: str | None
) -> None:
    assert health.api_key(files(tmp_path, *texts)) == key


def test_a_file_that_cannot_be_read_is_passed_over(tmp_path: Path) -> None:
    st = files(tmp_path, "VLLM_API_KEY=first\n")
    gone = dataclasses.replace(st, env_files=(*st.env_files, str(tmp_path / "gone")))
    assert health.api_key(gone) == "first"
    first_gone = dataclasses.replace(st, env_files=(str(tmp_path / "gone"), *st.env_files))
    assert health.api_key(first_gone) == "first"  # the files after it are still read


# -- state_problem -------------------------------------------------------------------------------


def st(**over: Any) -> health.UnitState:
    base: dict[str, Any] = dict(load="loaded", active="active", sub="running", result="success",
                                restarts=2, main_code=0, main_status=0, main_pid=9, cgroup="/c")  # fmt: skip
    return health.UnitState(**(base | over))


@pytest.mark.parametrize(
    ("over", "why"),
    [
        ({}, None),
        ({"load": ""}, None),  # systemd said nothing of it: not refused for that
        ({"load": "not-found"}, f"{UNIT} is not loaded (not-found)"),
        ({"active": "failed", "result": "signal", "main_status": 9, "restarts": 5},
         f"{UNIT} is failed (signal, status 9) after 3 automatic restart(s)"),
        ({"active": "inactive", "result": "success", "main_status": 0},
         f"{UNIT} exited cleanly (status 0); a server must keep running"),
        ({"active": "inactive", "result": "", "main_status": 4},
         f"{UNIT} exited cleanly (status 4); a server must keep running"),
        ({"active": "deactivating", "result": "timeout", "main_status": 1},
         f"{UNIT} is deactivating (timeout, status 1) after 0 automatic restart(s)"),
        ({"active": "inactive", "result": "exit-code", "main_status": 3, "restarts": 3},
         f"{UNIT} is inactive (exit-code, status 3) after 1 automatic restart(s)"),
        ({"main_code": 1}, f"{UNIT} exited cleanly (status 0); a server must keep running"),
        ({"main_code": 1, "main_status": 2}, None),  # exited 2, still active: not clean
        ({"main_code": 2}, None),  # killed, not exited
        ({"main_code": 1, "result": "exit-code"}, None),
        ({"active": "activating", "sub": "auto-restart", "result": "exit-code", "main_status": 5},
         f"{UNIT} is in an auto-restart loop (exit-code, status 5) after 0 automatic restart(s)"),
        ({"active": "activating", "sub": "start"}, None),
        ({"active": "reloading", "sub": "auto-restart"}, None),
        ({"restarts": 3}, f"{UNIT} is active (running) after 1 automatic restart(s)"),
        ({"restarts": 1}, None),
    ],
)  # fmt: skip
def test_each_state_and_its_words(over: dict[str, Any], why: str | None) -> None:
    assert health.state_problem(UNIT, st(**over), 2) == why


def test_numbers_that_are_not_count_as_zero() -> None:
    assert [health._int(t) for t in (None, "", "x", "7", "-1")] == [0, 0, 0, 7, -1]
