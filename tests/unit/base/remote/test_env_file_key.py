"""The servers' API key file read one way (#47): ``release_check.env_file_value`` reads an
``EnvironmentFile=`` as systemd does (src/basic/env-file.c: the last assignment wins; blanks,
comments, quotes, escapes, CR line ends), and its three readers, ``systemd_units.file_key`` (the
converge), the probe's ``key_current`` (plan, status) and ``health.api_key`` (the gate), give
the same key for every file: several lines, the key's line not the first, blank lines, CRLF, a
missing or an empty file, and more. Before, the first two took the first ``VLLM_API_KEY=`` line
as written and the gate the last one, unquoted."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from repo_paths import REMOTE

sys.path.insert(0, str(REMOTE))
import health  # noqa: E402
import layout  # noqa: E402
import probe  # noqa: E402
import release_check  # noqa: E402
import systemd_units  # noqa: E402

VAR = layout.API_KEY_VAR

# a key file's bytes (None: no file) -> the value systemd gives VLLM_API_KEY (None: unset)
FILES = {
    "one line": (b"VLLM_API_KEY=sk-1\n", "sk-1"),
    "several lines, the last wins": (b"A=1\nVLLM_API_KEY=one\nB=2\nVLLM_API_KEY=two\n", "two"),
    "the key's line not the first": (b"# servefleet\nOTHER=x\nVLLM_API_KEY=k\n", "k"),
    "blank lines": (b"\n\n  \t\nVLLM_API_KEY=k\n\n\n", "k"),
    "CRLF": (b"VLLM_API_KEY=k\r\nOTHER=1\r\n", "k"),
    "CRLF, the last wins": (b"VLLM_API_KEY=a\r\nVLLM_API_KEY=b\r\n", "b"),
    "a lone CR ends a line": (b"VLLM_API_KEY=a\rVLLM_API_KEY=b", "b"),
    "no line end at the end": (b"VLLM_API_KEY=k", "k"),
    "a missing file": (None, None),
    "an empty file": (b"", None),
    "no key in it": (b"OTHER=1\nVLLM_API_KEYS=x\nXVLLM_API_KEY=y\nVLLM_API_KEY\n", None),
    "comments": (b"#VLLM_API_KEY=a\n ;VLLM_API_KEY=b\nVLLM_API_KEY=k\n# VLLM_API_KEY=c\n", "k"),
    "blanks around": (b"  VLLM_API_KEY \t=  k  \t\n", "k"),
    "quoted": (b'VLLM_API_KEY="k 1"\n', "k 1"),
    "the last empties it": (b"VLLM_API_KEY=k\nVLLM_API_KEY=\n", ""),
    "a line carried on": (b"VLLM_API_KEY=a\\\nb\n", "ab"),
    "not UTF-8: systemd refuses the file": (b"VLLM_API_KEY=\xff\n", None),
    "a NUL ends it": (b"VLLM_API_KEY=k\x00VLLM_API_KEY=x\n", "k"),
}


@pytest.fixture
def key_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "vllm-api-key.env"
    monkeypatch.setattr(layout, "API_KEY_FILE", str(path))
    return path


def probe_key_current(monkeypatch: pytest.MonkeyPatch, runs: str | None) -> bool | None:
    """The probe's ``key_current`` of one unit that names the key file, its main process (this
    test's own pid) running with ``runs`` as its key (None: no key in its environment)."""
    unit, pid = layout.unit_name(0), os.getpid()
    shown = f"Id={unit}\nActiveState=active\nMainPID={pid}\nUnitFileState=enabled\n"
    environ = b"PATH=/usr/bin\x00" + (f"{VAR}={runs}\x00".encode() if runs is not None else b"")
    files = {
        os.path.join(layout.UNIT_DIR, unit): f"EnvironmentFile={layout.API_KEY_FILE}\n".encode(),
        f"/proc/{pid}/environ": environ,
    }
    monkeypatch.setattr(probe, "run", lambda cmd: shown)
    monkeypatch.setattr(probe, "read", lambda path, mode="r": files.get(path))
    return probe.units([unit])[unit]["key_current"]


@pytest.mark.parametrize("case", FILES)
def test_the_three_readers_agree_with_systemd(
    case: str, key_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    raw, systemd_gives = FILES[case]
    if raw is not None:
        key_file.write_bytes(raw)
    assert release_check.env_file_value([str(key_file)], VAR) == systemd_gives
    assert systemd_units.file_key() == systemd_gives
    st = health.UnitState("loaded", "active", "running", "", 0, 0, 0, 1, "", (str(key_file),))
    assert health.api_key(st) == (systemd_gives or None)  # an empty key asks for none
    assert probe_key_current(monkeypatch, systemd_gives) is True
    assert probe_key_current(monkeypatch, "another") is False
    if systemd_gives is not None:
        assert probe_key_current(monkeypatch, None) is False


def test_a_process_with_the_key_twice_runs_the_last(
    key_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As Python's ``os.environ`` (vLLM) reads its environment: the last one."""
    key_file.write_text(f"{VAR}=b\n")
    assert probe_key_current(monkeypatch, f"a\x00{VAR}=b") is True
    assert probe_key_current(monkeypatch, f"b\x00{VAR}=a") is False


@pytest.mark.parametrize(
    ("text", "pairs"),
    [
        ("A=1\nB=2\n", [("A", "1"), ("B", "2")]),
        ("A=1\nA=2", [("A", "1"), ("A", "2")]),  # in order: the caller takes the last
        ("A=\n", [("A", "")]),
        ("A", []),  # no "=": nothing
        ("A\nB=1", [("B", "1")]),
        ("  A  =  x y  \n", [("A", "x y")]),
        ("A=x=y\n", [("A", "x=y")]),
        ("#A=1\n;B=2\n  # C=3\nD=4 # not a comment\n", [("D", "4 # not a comment")]),
        ("# comment \\\nA=1\n", [("A", "1")]),  # systemd 254 on (252 carries the comment on)
        ("A='a b'\n", [("A", "a b")]),
        ("A='a\\nb'\n", [("A", "a\\nb")]),  # nothing is an escape in single quotes
        ('A="a\\"b\\\\c\\`d\\$e\\nf"\n', [("A", 'a"b\\c`d$e\\nf')]),  # others keep the backslash
        ('A="x\\\ny"\n', [("A", "xy")]),  # a line end escaped in double quotes is dropped
        ("A='x'y'z'\n", [("A", "xy'z'")]),  # after a closing quote: unquoted again
        ("A='x'  \n", [("A", "x")]),
        ('A="open\nB=1\n', [("A", "open\nB=1\n")]),  # an open quote runs to the end
        ("A=a\\ b\\\\\n", [("A", "a b\\")]),  # unquoted: a backslash takes the next character
        ("A=a\\ \n", [("A", "a ")]),  # an escaped blank is not trailing
        ("A=a \\\n  b\n", [("A", "a   b")]),  # carried on: the next line's leading blanks stay
        ("A=x\\", [("A", "x")]),  # a backslash at the very end
        ("A=1\r\nB=2\r\n", [("A", "1"), ("B", "2")]),
        ('A="1\r\n"\n', [("A", "1\r\n")]),  # inside quotes a line end is the value's
        ("A=1\x00B=2\n", [("A", "1")]),
        ("\ufeffA=1\n", [("\ufeffA", "1")]),  # a BOM is part of the first name
    ],
)
def test_an_environment_file_as_systemd_reads_it(text: str, pairs: list[tuple[str, str]]) -> None:
    assert release_check.env_assignments(text) == pairs


def test_the_files_are_read_in_order_and_an_unreadable_one_passed_over(tmp_path: Path) -> None:
    first, second, bad = tmp_path / "a.env", tmp_path / "b.env", tmp_path / "c.env"
    first.write_text(f"{VAR}=one\nOTHER=1\n")
    second.write_text(f"OTHER=2\n{VAR}='two'\n")
    bad.write_bytes(f"{VAR}=three\nX=\xff\n".encode("latin-1"))  # refused whole
    paths = [str(first), str(tmp_path / "gone"), str(second), str(bad), str(tmp_path)]
    assert release_check.env_file_value(paths, VAR) == "two"
    assert release_check.env_file_value(paths[:2], VAR) == "one"
    assert release_check.env_file_value(paths, "OTHER") == "2"
    assert release_check.env_file_value([], VAR) is None
