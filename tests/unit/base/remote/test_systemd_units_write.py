"""src/servefleet/base/remote/systemd_units.py ``write_atomic`` (#47): how root replaces a unit
file, a state file or a manifest on the host. A temporary file of a name of its own beside the
target (a link planted at the old fixed ``NAME.tmp``, or at the very name drawn, is never
followed), made with the file's mode, fsynced, renamed over the target, then the directory
fsynced; a failure at any step leaves the old file as it was and no temporary file behind."""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from repo_paths import REMOTE

sys.path.insert(0, str(REMOTE))
import systemd_units  # noqa: E402


@pytest.fixture(autouse=True)
def _umask_kept() -> Iterator[None]:
    """A test sets the umask it needs; the next one gets the old one back."""
    old = os.umask(0o022)
    os.umask(old)
    yield
    os.umask(old)


def names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def test_the_file_is_replaced_whole_with_its_mode(tmp_path: Path) -> None:
    path = tmp_path / "u.service"
    os.umask(0o077)
    systemd_units.write_atomic(path, "one\n")
    assert (path.read_text(), mode(path)) == ("one\n", 0o644)
    systemd_units.write_atomic(path, "two ✓\n", 0o600)
    assert (path.read_text(), mode(path)) == ("two ✓\n", 0o600)
    assert names(tmp_path) == ["u.service"]


def test_a_link_at_the_old_fixed_temporary_name_is_not_followed(tmp_path: Path) -> None:
    """The old writer wrote through ``u.service.tmp``: a link planted there sent root's text to
    the link's target. Now that name is not the writer's at all, and stays as it was."""
    sentinel = tmp_path / "sentinel"
    sentinel.write_text("root's\n")
    units = tmp_path / "units"
    units.mkdir()
    (units / "u.service.tmp").symlink_to(sentinel)
    systemd_units.write_atomic(units / "u.service", "unit\n")
    assert sentinel.read_text() == "root's\n"
    assert (units / "u.service").read_text() == "unit\n" and not (units / "u.service").is_symlink()
    assert os.readlink(units / "u.service.tmp") == str(sentinel)
    assert names(units) == ["u.service", "u.service.tmp"]


def test_a_link_at_the_drawn_name_is_passed_over_for_a_new_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever is at a name drawn (a link most of all) fails the exclusive open: the next name
    is drawn, and nothing is written through the link nor is it removed."""
    sentinel = tmp_path / "sentinel"
    sentinel.write_text("root's\n")
    draws = iter([b"\x01" * 8, b"\x02" * 8])
    monkeypatch.setattr(systemd_units.os, "urandom", lambda n: next(draws))
    planted = tmp_path / f".u.service.{'01' * 8}.tmp"
    planted.symlink_to(sentinel)
    systemd_units.write_atomic(tmp_path / "u.service", "unit\n")
    assert sentinel.read_text() == "root's\n" and planted.is_symlink()
    assert (tmp_path / "u.service").read_text() == "unit\n"
    assert names(tmp_path) == [planted.name, "sentinel", "u.service"]


def test_it_gives_up_after_its_tries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(systemd_units.os, "urandom", lambda n: b"\x01" * n)
    (tmp_path / f".u.service.{'01' * 8}.tmp").write_text("someone's")
    with pytest.raises(FileExistsError, match="no new temporary name after 16 tries"):
        systemd_units.write_atomic(tmp_path / "u.service", "unit\n")
    assert names(tmp_path) == [f".u.service.{'01' * 8}.tmp"]


def test_the_temporary_file_is_made_with_its_mode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under umask 0 a file made 0666 first and fixed later could be opened for writing by
    another user in between."""
    seen: list[int] = []
    real_fchmod = os.fchmod

    def record(fd: int, mode_: int) -> None:
        seen.append(stat.S_IMODE(os.fstat(fd).st_mode))
        real_fchmod(fd, mode_)

    monkeypatch.setattr(systemd_units.os, "fchmod", record)
    os.umask(0)
    systemd_units.write_atomic(tmp_path / "key.env", "K=v\n", 0o600)
    assert seen == [0o600] and mode(tmp_path / "key.env") == 0o600


def test_the_file_then_the_directory_are_synced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        calls.append("fsync dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "fsync file")
        real_fsync(fd)

    def replace(*a: Any, **kw: Any) -> None:
        calls.append("rename")
        real_replace(*a, **kw)

    monkeypatch.setattr(systemd_units.os, "fsync", fsync)
    monkeypatch.setattr(systemd_units.os, "replace", replace)
    systemd_units.write_atomic(tmp_path / "u.service", "unit\n")
    assert calls == ["fsync file", "rename", "fsync dir"]


@pytest.mark.parametrize("step", ["write", "fchmod", "fsync", "replace"])
def test_a_failure_half_way_leaves_the_old_file_and_no_temporary_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    path = tmp_path / "state.json"
    path.write_text("old\n")
    real = getattr(os, step)
    written: list[bytes] = []

    def fail(*a: Any, **kw: Any) -> Any:
        if step == "write":  # half the text written, then the disk is full
            written.append(bytes(a[1][:3]))
            real(a[0], a[1][:3])
        raise OSError(28, f"{step} failed")

    monkeypatch.setattr(systemd_units.os, step, fail)
    with pytest.raises(OSError, match=f"{step} failed"):
        systemd_units.write_atomic(path, "new text\n")
    assert path.read_text() == "old\n" and names(tmp_path) == ["state.json"]
    assert written == ([b"new"] if step == "write" else [])


def test_an_interrupt_half_way_removes_the_temporary_file_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupted(fd: int) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(systemd_units.os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        systemd_units.write_atomic(tmp_path / "u.service", "unit\n")
    assert names(tmp_path) == []


def test_a_missing_directory_fails_before_anything_is_made(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        systemd_units.write_atomic(tmp_path / "gone" / "u.service", "unit\n")
    assert names(tmp_path) == []
