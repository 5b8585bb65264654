"""src/servefleet/base/remote/systemd_units.py in-process (#37): ``systemctl`` (its failure line:
stderr, else the exit status; unchecked, its output), ``systemctl show`` of several units read
back by their Id, in order, a reload only when systemd asks for one, what a unit's main process
runs read from ``/proc`` (its environment, its last ``--port``; children of the test's own with
a known argv and environment), every unit of ours as ``live`` reports it, the key file's key,
``running_desired``, a unit text's sha and the unit files written only where they differ (the
atomic write itself: test_systemd_units_write.py)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from repo_paths import REMOTE

sys.path.insert(0, str(REMOTE))
import layout  # noqa: E402
import release_check  # noqa: E402
import systemd_units  # noqa: E402

SHA = layout.UNIT_SHA_VAR


class Ran:
    """systemctl as the test says: each argv recorded, its answer given."""

    def __init__(
        self, monkeypatch: pytest.MonkeyPatch, code: int = 0, out: str = "", err: str = ""
    ) -> None:
        self.argv: list[list[str]] = []
        self.answer = (code, out, err)
        monkeypatch.setattr(systemd_units.subprocess, "run", self.run)

    def run(self, argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        assert kw == {"capture_output": True, "text": True}
        self.argv.append(argv)
        code, out, err = self.answer
        return subprocess.CompletedProcess(argv, code, out, err)


def test_failed_carries_its_line_and_journal() -> None:
    assert (str(systemd_units.Failed("gate")), systemd_units.Failed("gate").journal) == ("gate", "")
    assert systemd_units.Failed("gate", "tail").journal == "tail"


def test_log_is_one_flushed_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """Flushed at once: the deploy reads the host's lines as they come, in order with the
    journal tails and the subprocesses' own output."""
    seen: list[str] = []

    class Out:
        def write(self, text: str) -> int:
            seen.append(f"write {text!r}")
            return len(text)

        def flush(self) -> None:
            seen.append("flush")

    monkeypatch.setattr(sys, "stdout", Out())
    systemd_units.log("a line")
    assert seen == ["write 'a line'", "write '\\n'", "flush"]


def test_systemctl_fails_with_its_stderr_or_status(monkeypatch: pytest.MonkeyPatch) -> None:
    ran = Ran(monkeypatch, 0, "out\n")
    assert systemd_units.systemctl("is-active", "u") == "out\n"
    assert ran.argv == [["systemctl", "is-active", "u"]]
    ran.answer = (3, "partial\n", "  Unit u not found.\n")
    with pytest.raises(systemd_units.Failed) as got:
        systemd_units.systemctl("restart", "u")
    assert (str(got.value), got.value.journal) == ("systemctl restart u: Unit u not found.", "")
    ran.answer = (4, "", " \n")
    with pytest.raises(systemd_units.Failed) as got:
        systemd_units.systemctl("stop", "u", "v")
    assert str(got.value) == "systemctl stop u v: 4"
    assert systemd_units.systemctl("stop", "u", check=False) == ""


def test_show_reads_each_unit_back_by_its_id(monkeypatch: pytest.MonkeyPatch) -> None:
    out = (
        "Id=b.service\nActiveState=active\nExecStart=a=b c\nno equals sign\n\n\n"
        "Id=a.service\nActiveState=failed\n\n"
    )
    ran = Ran(monkeypatch, 1, out)  # systemctl show's status is not checked
    got = systemd_units.show(["a.service", "b.service", "c.service"], "ActiveState", "ExecStart")
    assert got == [
        {"Id": "a.service", "ActiveState": "failed"},
        {"Id": "b.service", "ActiveState": "active", "ExecStart": "a=b c"},
        {},
    ]
    assert ran.argv == [["systemctl", "show", "-p", "Id", "-p", "ActiveState", "-p", "ExecStart",
                         "a.service", "b.service", "c.service"]]  # fmt: skip
    assert systemd_units.show([], "ActiveState") == [] and len(ran.argv) == 1


def test_a_block_without_an_id_is_nobodys(monkeypatch: pytest.MonkeyPatch) -> None:
    Ran(monkeypatch, 0, "ActiveState=active\n")
    assert systemd_units.show(["", "a.service"]) == [{"ActiveState": "active"}, {}]


@pytest.mark.parametrize(
    ("need", "reloaded"), [(["no", "yes"], True), (["no", "no"], False), (["YES", ""], False)]
)
def test_a_reload_only_when_systemd_asks(
    need: list[str], reloaded: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[str, ...]] = []
    monkeypatch.setattr(
        systemd_units, "show", lambda units, *p: [{"NeedDaemonReload": n} for n in need]
    )

    def systemctl(*args: str, check: bool = True) -> str:
        calls.append(args)
        return ""

    monkeypatch.setattr(systemd_units, "systemctl", systemctl)
    systemd_units.daemon_reload_if_needed(["a", "b"])
    assert calls == ([("daemon-reload",)] if reloaded else [])


# --- /proc ---------------------------------------------------------------------------------------
@pytest.fixture
def child() -> Iterator[Any]:
    """Start a child (argv after python's ``-c CODE``, environment as given) that waits on its
    stdin, once its /proc entry shows it (a fork shows an empty cmdline until its exec); it ends
    when the test ends."""
    started: list[subprocess.Popen[bytes]] = []

    def start(*argv: str, env: dict[bytes, bytes] | None = None) -> int:
        code = "import sys; sys.stdin.read()"
        proc = subprocess.Popen([sys.executable, "-c", code, *argv], stdin=subprocess.PIPE, env=env)
        started.append(proc)
        cmdline = Path(f"/proc/{proc.pid}/cmdline")
        deadline = time.monotonic() + 10
        while code.encode() not in cmdline.read_bytes():  # until it has exec'd python
            assert time.monotonic() < deadline, "the child never started"
            time.sleep(0.01)
        return proc.pid

    yield start
    for proc in started:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=30)


def test_a_processs_environment(child: Any) -> None:
    pid = child(env={b"A": b"1", b"B": b"x=y", b"C": b"", b"D": b"\xff", b"\xfeE": b"2"})
    assert systemd_units.process_env(pid) == {
        "A": "1", "B": "x=y", "C": "", "D": "\ufffd", "\ufffdE": "2"
    }  # fmt: skip
    assert systemd_units.process_env(1 << 30) == {}  # no such process


@pytest.mark.parametrize(
    ("argv", "port"),
    [
        (["--port", "8000"], 8000),
        (["--port=8001"], 8001),
        (["--port", "8000", "--port=9000"], 9000),
        (["--port=9000", "--port", "8000"], 8000),
        (["--port", "8000", "--port", "x"], 8000),
        (["--port=", "--port=-1"], None),
        (["--ports", "8000", "--port"], None),
        (["--port", "--port=7000"], 7000),
        (["--port=80=1"], None),
        (["--port", "8000", "caf\udcff"], 8000),  # a byte that is not UTF-8 in its argv
        ([], None),
    ],
)
def test_a_processs_last_port(argv: list[str], port: int | None, child: Any) -> None:
    assert systemd_units.process_port(child(*argv)) == port


def test_no_process_no_port() -> None:
    assert systemd_units.process_port(1 << 30) is None


@pytest.mark.parametrize(
    ("cmdline", "port"),
    [
        (b"vllm\0serve\0m\0--port\x008000", 8000),
        (b"vllm\0serve\0m\0--port", None),
        (b"vllm\0serve\0m\0--port=8001", 8001),
    ],
)
def test_a_process_that_rewrote_its_argv_area(
    cmdline: bytes, port: int | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process that rewrote its argv area (as setproctitle does) may leave its
    /proc/PID/cmdline without the last NUL: its last word is still read, and a last ``--port``
    without a value is no port."""
    (tmp_path / "cmdline").write_bytes(cmdline)
    monkeypatch.setattr(
        systemd_units, "Path", lambda p: tmp_path / "cmdline" if p == "/proc/7/cmdline" else Path(p)
    )
    assert systemd_units.process_port(7) == port


# --- live ----------------------------------------------------------------------------------------
def test_live_reports_each_unit_of_ours(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(systemd_units, "UNIT_DIR", tmp_path)
    (tmp_path / "servefleet-vllm-1.service").write_text("one")
    (tmp_path / "servefleet-vllm-0.service").write_text("zero")
    (tmp_path / "other.service").write_text("not ours")
    shown = {
        "servefleet-vllm-0.service": {"ActiveState": "active", "MainPID": "41"},
        "servefleet-vllm-1.service": {},  # no MainPID shown at all: no process
    }
    asked: list[tuple[Any, ...]] = []

    def show(units: list[str], *props: str) -> list[dict[str, str]]:
        asked.append((units, props))
        return [shown[u] for u in units]

    monkeypatch.setattr(systemd_units, "show", show)
    env = {SHA: "a1", layout.API_KEY_VAR: "k", "RBLN_VISIBLE_DEVICES": "0,,3"}
    monkeypatch.setattr(systemd_units, "process_env", lambda pid: env if pid == 41 else {"X": "y"})
    monkeypatch.setattr(systemd_units, "process_port", lambda pid: 8000 + pid)
    older: list[tuple[Any, ...]] = []

    def older_than_release(*args: Any) -> bool:
        older.append(args)
        return bool(args[0] == 41)

    monkeypatch.setattr(release_check, "older_than_release", older_than_release)
    got = systemd_units.live("RBLN_VISIBLE_DEVICES")
    assert asked == [(["servefleet-vllm-0.service", "servefleet-vllm-1.service"],
                      ("ActiveState", "SubState", "MainPID"))]  # fmt: skip
    assert got == {
        "servefleet-vllm-0.service": {"active": "active", "pid": 41, "sha": "a1", "key": "k",
                                      "port": 8041, "devices": {"0", "3"},
                                      "older_than_release": True},
        "servefleet-vllm-1.service": {"active": "unknown", "pid": 0, "sha": None, "key": None,
                                      "port": None, "devices": set(),
                                      "older_than_release": False},
    }  # fmt: skip
    assert older == [(41, "zero", layout.RELEASE_MARKER), (0, "one", layout.RELEASE_MARKER)]


def test_live_of_a_unit_whose_file_went_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert systemd_units._text(tmp_path / "none.service") is None
    assert systemd_units._text(tmp_path) is None  # a directory
    (tmp_path / "u").write_text("text")
    assert systemd_units._text(tmp_path / "u") == "text"


# --- the key, the sha, the files -----------------------------------------------------------------
def test_the_key_file_holds_the_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "key.env"
    monkeypatch.setattr(layout, "API_KEY_FILE", str(path))
    assert systemd_units.file_key() is None
    var = layout.API_KEY_VAR
    path.write_text(f"# {var}=no\nX{var}=no\n{var}=first\n{var}=k=1 2\n")
    assert systemd_units.file_key() == "k=1 2"  # the last one, as systemd reads it
    path.write_text(f"{var}=\n")
    assert systemd_units.file_key() == ""
    path.write_text("OTHER=1\n")
    assert systemd_units.file_key() is None


@pytest.mark.parametrize(
    ("now", "want"),
    [
        ({"active": "active", "sha": "a1", "key": "k"}, True),
        ({"active": "active", "sha": "a1"}, False),
        ({"active": "activating", "sha": "a1", "key": "k"}, False),
        ({"active": "active", "sha": "b2", "key": "k"}, False),
        ({"active": "active", "sha": "a1", "key": "other"}, False),
        (None, False),
    ],
)
def test_running_desired(now: dict[str, Any] | None, want: bool) -> None:
    assert systemd_units.running_desired(now, "a1", "k") is want
    assert systemd_units.running_desired({"active": "active", "sha": "a1"}, "a1") is True


@pytest.mark.parametrize(
    ("text", "sha"),
    [
        (f'[Service]\nEnvironment="{SHA}=ab12"\nExecStart=x\n', "ab12"),
        (f'Environment="{SHA}=ab12" \n', None),
        (f' Environment="{SHA}=ab12"\n', None),
        (f'Environment="{SHA}=AB12"\n', None),
        (f'Environment="{SHA}="\n', None),
        (f'Environment="X{SHA}=ab"\n', None),
        ("", None),
    ],
)
def test_a_units_sha(text: str, sha: str | None) -> None:
    assert systemd_units.unit_sha(text) == sha


def test_unit_files_are_written_where_they_differ(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(systemd_units, "UNIT_DIR", tmp_path)
    text = {s: f'Environment="{SHA}={s}"\n' for s in ("a1", "b2")}
    (tmp_path / "u0.service").write_text(text["a1"])
    before = (tmp_path / "u0.service").stat().st_ino
    state = {"instances": [{"unit": "u0.service", "sha": "a1", "text": text["a1"]},
                           {"unit": "u1.service", "sha": "b2", "text": text["b2"]}]}  # fmt: skip
    systemd_units.write_units(state)
    assert (tmp_path / "u0.service").stat().st_ino == before  # the same: not rewritten
    assert (tmp_path / "u1.service").read_text() == text["b2"]
    assert capsys.readouterr().out == "u1.service: written (sha b2)\n"
    state["instances"][0]["text"] = text["a1"] + "# changed\n"
    systemd_units.write_units(state)
    assert (tmp_path / "u0.service").read_text().endswith("# changed\n")
    assert capsys.readouterr().out == "u0.service: written (sha a1)\n"
    state["instances"][1]["sha"] = "c3"
    with pytest.raises(systemd_units.Failed) as got:
        systemd_units.write_units(state)
    assert str(got.value) == "u1.service: its text does not carry sha c3"
