"""The health gate (src/servefleet/base/remote/health.py) run as on a host: a fake systemctl and
journalctl on PATH, a vllm-like HTTP stub on 127.0.0.1, and the real /proc for who holds the
port."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from fake_host import FakeSystemd, Stub, running, stub_process
from lab_sim_support import REPO, free_port, load

HEALTH = REPO / "src" / "servefleet" / "base" / "remote" / "health.py"
UNIT = "servefleet-vllm-0.service"
MODEL = "openai/gpt-oss-120b"
JOURNAL = "vllm: starting\nvllm: simulated trouble\n"
health = load(HEALTH, "servefleet_remote_health")
OWN_CGROUP = health.pid_cgroup("self")
OTHER_CGROUP = "/system.slice/other.service"


@pytest.fixture
def systemd(tmp_path: Path) -> FakeSystemd:
    fake = FakeSystemd(tmp_path / "host")
    fake.journal(JOURNAL)
    return fake


def gate(
    systemd: FakeSystemd, port: int, timeout: float = 2, *extra: str
) -> subprocess.CompletedProcess[str]:
    """Run the gate; a path that must fail at once gets a long TIMEOUT and still ends fast."""
    cmd = [sys.executable, str(HEALTH), UNIT, str(port), MODEL, f"{timeout:g}", *extra]
    return subprocess.run(cmd, env=systemd.env(), capture_output=True, text=True, timeout=15)


def refused(proc: subprocess.CompletedProcess[str], why: str) -> None:
    """The gate failed with ``why`` and the journal tail."""
    assert proc.returncode == 1, proc
    assert proc.stdout == ""
    assert proc.stderr == (
        f"servefleet: health gate: {UNIT}: {why}\n--- journal tail of {UNIT} ---\n{JOURNAL}"
    )


def ours(**props: Any) -> dict[str, Any]:
    """A running unit that owns this test process (so the in-thread stub)."""
    return running(MainPID=os.getpid(), ControlGroup=OWN_CGROUP) | props


@pytest.mark.parametrize(
    "owner",
    [
        {"MainPID": os.getpid(), "ControlGroup": OTHER_CGROUP},  # the main process
        {"MainPID": 1, "ControlGroup": OWN_CGROUP},  # a process in the unit's cgroup
    ],
    ids=["main-pid", "cgroup"],
)
def test_healthy_passes_and_writes_the_warm_marker(
    systemd: FakeSystemd, tmp_path: Path, owner: dict[str, Any]
) -> None:
    systemd.show(running(NRestarts=4, **owner))  # restarts from before the gate do not count
    marker = tmp_path / "cache" / "warm"
    with Stub() as stub:
        proc = gate(systemd, stub.port, 30, "--warm-marker", str(marker))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"{UNIT}: healthy on port {stub.port}\n"
    assert marker.read_text().strip()
    assert stub.requests[0] == ("/health", None)
    path, body = stub.requests[1]
    assert path == "/v1/chat/completions"
    assert body["model"] == MODEL and body["max_tokens"] == 1
    shows = [c for c in systemd.calls() if c[:2] == ["systemctl", "show"]]
    assert all(c[-1] == UNIT and "ControlGroup" in c and "MainPID" in c for c in shows)
    assert not [c for c in systemd.calls() if c[0] == "journalctl"]


def test_check_and_journal_tail_are_importable(
    systemd: FakeSystemd, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", systemd.env()["PATH"])
    systemd.show(ours())
    with Stub() as stub:
        assert health.check(UNIT, stub.port, MODEL, 5.0, host="0.0.0.0") is None
    with Stub(chat={"choices": []}) as stub:
        assert health.check(UNIT, stub.port, MODEL, 0.5) == (
            "not healthy within 0.5s: chat completion had no choices"
        )
    assert health.journal_tail(UNIT, lines=3) == JOURNAL
    assert systemd.calls()[-1] == ["journalctl", "-u", UNIT, "-n", "3", "--no-pager", "-o", "cat"]


def test_times_out_while_health_answers_503(systemd: FakeSystemd) -> None:
    systemd.show(ours())
    with Stub(health=503) as stub:
        started = time.monotonic()
        proc = gate(systemd, stub.port, 2)
    assert time.monotonic() - started >= 2
    refused(proc, f"not healthy within 2s: http://127.0.0.1:{stub.port}/health answered 503")
    assert ["journalctl", "-u", UNIT, "-n", "25", "--no-pager", "-o", "cat"] in systemd.calls()


def test_a_reply_without_choices_fails(systemd: FakeSystemd) -> None:
    systemd.show(ours())
    with Stub(chat={"id": "x", "choices": []}) as stub:
        refused(
            gate(systemd, stub.port, 1), "not healthy within 1s: chat completion had no choices"
        )


# Each state below fails at once although the stub would answer healthy (TIMEOUT 60 s; the run
# is cut at 15 s).
EXITED_CLEANLY = f"{UNIT} exited cleanly (status 0); a server must keep running"
STATES = {
    "inactive": (
        {"ActiveState": "inactive", "SubState": "dead", "ExecMainCode": 1, "MainPID": 0},
        EXITED_CLEANLY,
    ),
    "deactivating": (
        {"ActiveState": "deactivating", "SubState": "stop-sigterm", "ExecMainCode": 1},
        EXITED_CLEANLY,
    ),
    "remain-after-exit": ({"SubState": "exited", "ExecMainCode": 1}, EXITED_CLEANLY),
    "restart-always-after-exit-0": (
        {"ActiveState": "activating", "SubState": "auto-restart", "ExecMainCode": 1},
        EXITED_CLEANLY,
    ),
    "auto-restart-loop": (
        {
            "ActiveState": "activating",
            "SubState": "auto-restart",
            "Result": "exit-code",
            "ExecMainCode": 1,
            "ExecMainStatus": 3,
        },
        f"{UNIT} is in an auto-restart loop (exit-code, status 3) after 0 automatic restart(s)",
    ),
    "failed": (
        {"ActiveState": "failed", "SubState": "failed", "Result": "exit-code", "ExecMainStatus": 1},
        f"{UNIT} is failed (exit-code, status 1) after 0 automatic restart(s)",
    ),
}


@pytest.mark.parametrize("props, why", STATES.values(), ids=STATES.keys())
def test_systemd_state_fails_at_once(systemd: FakeSystemd, props: dict[str, Any], why: str) -> None:
    systemd.show(ours(**props))
    with Stub() as stub:
        refused(gate(systemd, stub.port, 60), why)
    assert not stub.requests


def test_restarts_since_the_check_began_fail(systemd: FakeSystemd) -> None:
    # baseline 2 (from an earlier crash) at the first poll (health 503), then a restart
    systemd.show(ours(NRestarts=2), ours(NRestarts=3, MainPID=1))
    with Stub(health=503) as stub:
        refused(
            gate(systemd, stub.port, 60), f"{UNIT} is active (running) after 1 automatic restart(s)"
        )
    assert [path for path, _ in stub.requests] == ["/health"]


def test_a_port_held_by_another_process_is_refused(systemd: FakeSystemd) -> None:
    """An old instance answering healthy on the port (its own process and cgroup) never passes."""
    systemd.show(running(MainPID=os.getpid(), ControlGroup=OTHER_CGROUP))
    with stub_process() as (other, port):
        comm = Path(f"/proc/{other.pid}/comm").read_text().strip()
        proc = gate(systemd, port, 60)
        assert other.poll() is None
    refused(proc, f"port {port} is held by pid {other.pid} ({comm}), not by {UNIT}")


def test_nothing_listening_is_not_answering(systemd: FakeSystemd) -> None:
    systemd.show(ours())
    proc = gate(systemd, free_port(), 1)
    assert proc.returncode == 1
    assert f"servefleet: health gate: {UNIT}: not healthy within 1s: not answering: " in proc.stderr
    assert "Connection refused" in proc.stderr
    assert proc.stderr.endswith(f"--- journal tail of {UNIT} ---\n{JOURNAL}")


def test_a_prewarm_answering_unhealthy_fails_after_answered_timeout(
    systemd: FakeSystemd, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pre-warm may take its whole timeout to compile (not answering), but once the server
    answers, an unhealthy one fails within answered_timeout, not hours later."""
    monkeypatch.setenv("PATH", systemd.env()["PATH"])
    systemd.show(ours())
    with Stub(health=500) as stub:
        started = time.monotonic()
        why = health.check(UNIT, stub.port, MODEL, 3600.0, answered_timeout=1.0)
    assert time.monotonic() - started < 10
    assert why == f"not healthy within 1s: http://127.0.0.1:{stub.port}/health answered 500"


def test_polls_every_tenth_of_a_second_for_five_seconds_then_back_off_to_one(
    systemd: FakeSystemd, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A warm restart (about a second) is seen within 0.1 s of answering; past five seconds (a
    compile) the pause doubles up to one second. On a clock that only the gate's sleeps move."""
    monkeypatch.setenv("PATH", systemd.env()["PATH"])
    systemd.show(ours())
    now, pauses = [1000.0], []

    class Clock:
        @staticmethod
        def monotonic() -> float:
            return now[0]

        @staticmethod
        def sleep(seconds: float) -> None:
            pauses.append(round(seconds, 6))
            now[0] += seconds

    monkeypatch.setattr(health, "time", Clock)
    with Stub(health=503) as stub:
        why = health.check(UNIT, stub.port, MODEL, 9.0)
    assert why == f"not healthy within 9s: http://127.0.0.1:{stub.port}/health answered 503"
    quick = next(i for i, p in enumerate(pauses) if p != 0.1)
    assert sum(pauses[:quick]) == pytest.approx(5.0, abs=0.05)  # 0.1 s apart for five seconds
    slow = pauses[quick:]
    assert slow[:5] == [0.2, 0.4, 0.8, 1.0, 1.0] and len(slow) == 6  # then doubled up to 1 s
    assert sum(pauses) == pytest.approx(9.0)  # until the deadline


# -- the API key: read from the files the unit's EnvironmentFile= names, sent as a Bearer ------

KEY = "sk-" + "0123456789abcdef" * 2


def keyed(env_file: Path, **props: Any) -> dict[str, Any]:
    """Our running unit whose EnvironmentFile= is ``env_file`` (as ``systemctl show`` says it)."""
    return ours(EnvironmentFiles=f"{env_file} (ignore_errors=no)", **props)


def test_the_gate_sends_the_key_of_the_units_environment_file(
    systemd: FakeSystemd, tmp_path: Path
) -> None:
    env_file = tmp_path / "vllm-api-key.env"
    env_file.write_text(f"# written by servefleet\nVLLM_API_KEY={KEY}\n")
    env_file.chmod(0o600)
    systemd.show(keyed(env_file))
    with Stub(api_key=KEY) as stub:
        proc = gate(systemd, stub.port, 10)
    assert proc.returncode == 0, proc.stderr
    assert [path for path, _ in stub.requests] == ["/health", "/v1/chat/completions"]
    assert stub.auth == [None, f"Bearer {KEY}"]  # /health is open: the key goes to /v1 only
    assert KEY not in proc.stdout + proc.stderr
    assert all(KEY not in " ".join(call) for call in systemd.calls())


def test_without_the_units_key_the_server_answers_401_and_the_gate_fails(
    systemd: FakeSystemd, tmp_path: Path
) -> None:
    """The stub answers 401 without the key: the gate must send it to pass (so it can fail).
    A 401 fails at once (TIMEOUT 60 s; the run is cut at 15 s): waiting cannot change the key."""
    systemd.show(ours())  # a unit without EnvironmentFile=
    with Stub(api_key=KEY) as stub:
        proc = gate(systemd, stub.port, 60)
    url = f"http://127.0.0.1:{stub.port}/v1/chat/completions"
    refused(proc, f"{url} answered 401 Unauthorized without an API key (the unit has none)")
    assert set(stub.auth) == {None}
    wrong = tmp_path / "wrong.env"
    wrong.write_text('VLLM_API_KEY="sk-another-key-of-16-chars"\n')
    systemd.show(keyed(wrong))
    with Stub(api_key=KEY) as stub:
        proc = gate(systemd, stub.port, 60)
    url = f"http://127.0.0.1:{stub.port}/v1/chat/completions"
    refused(proc, f"{url} answered 401 Unauthorized with the unit's API key")
    assert "Bearer sk-another-key-of-16-chars" in stub.auth  # quotes as systemd reads them


def test_the_last_key_of_the_units_files_counts(
    systemd: FakeSystemd, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", systemd.env()["PATH"])
    first, second = tmp_path / "a.env", tmp_path / "b.env"
    first.write_text("VLLM_API_KEY=sk-first-key-0000000\nOTHER=1\n")
    second.write_text(f"; a comment\n VLLM_API_KEY = '{KEY}'\n")
    st = health.UnitState("loaded", "active", "running", "", 0, 0, 0, 1, "", (str(first),))
    assert health.api_key(st) == "sk-first-key-0000000"
    both = health.UnitState("loaded", "active", "running", "", 0, 0, 0, 1, "", (str(first), str(second)))  # fmt: skip
    assert health.api_key(both) == KEY
    gone = health.UnitState("loaded", "active", "running", "", 0, 0, 0, 1, "", (str(tmp_path / "x"),))  # fmt: skip
    assert health.api_key(gone) is None


def status_of(systemd: FakeSystemd, checks: dict[str, Any]) -> dict[str, str]:
    cmd = [sys.executable, str(HEALTH), "status", json.dumps(checks)]
    out = subprocess.run(cmd, env=systemd.env(), capture_output=True, text=True, timeout=15)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.mark.parametrize("props, why", [({}, "ok"), *STATES.values()],
                         ids=["running", *STATES.keys()])  # fmt: skip
def test_status_judges_a_headless_rank_by_its_unit_alone(
    systemd: FakeSystemd, props: dict[str, Any], why: str
) -> None:
    # a group's headless rank: nothing listens on its port (asking it would fail every time)
    systemd.show(running(**props))
    checks = {"model": MODEL, "host": "127.0.0.1", "instances": [], "headless": [[UNIT, 8000]]}
    assert status_of(systemd, checks) == {"8000": why}
