"""src/servefleet/base/remote/warm_state.py in-process (#37), on a serve user's cache root
(``nobody``'s): what is cold (``-`` never; no warm directory, or no marker of the fingerprint),
the warm marker's record (its time, directories, source, ``compiled`` by default, the seal taken
or given), the seal of a tree (each file's size and sha256; none for a missing directory or a
cache root that is no directory), the modes a seal gives (0750 for a directory and an executable
file, 0640 for the rest, nothing changed when they are right already), the bundle directories a
start saved or loaded (from its journal, else the bundles written since it started: three parts
under the cache root, on disk now), and each line of a drop (not warm, kept, what differed,
dropped) with the cache moved out and swept."""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from repo_paths import REMOTE

sys.path.insert(0, str(REMOTE))
import content_check  # noqa: E402
import layout  # noqa: E402
import systemd_units  # noqa: E402
import warm_state  # noqa: E402

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (chown to nobody)")
FP = "ab" * 32
NOBODY = pwd.getpwnam("nobody")
UNIT = "servefleet-vllm-0.service"


@pytest.fixture
def cache() -> Iterator[Path]:
    """nobody's cache root (in a root-owned 0755 directory) holding two signatures' bundles,
    nobody's: ``rbln/m/s`` (ranks 0 and 1) and ``rbln/m/t`` (rank 0, with an executable)."""
    top = Path(tempfile.mkdtemp(prefix="servefleet-warm-"))
    top.chmod(0o755)
    root = top / "cache"
    for rel, data in (("rbln/m/s/rank0/mega_cache.bin", "zero"),
                      ("rbln/m/s/rank1/mega_cache.bin", "one"),
                      ("rbln/m/t/rank0/mega_cache.bin", "other"),
                      ("rbln/m/t/rank0/run.sh", "#!/bin/sh\n")):  # fmt: skip
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(data)
    (root / "rbln/m/t/rank0/run.sh").chmod(0o755)
    for path in (root, *root.rglob("*")):
        os.chown(path, NOBODY.pw_uid, NOBODY.pw_gid)
    try:
        yield root
    finally:
        shutil.rmtree(top)


def _mode(path: Path) -> tuple[int, int, int]:
    st = path.lstat()
    return st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)


# --- cold and warm -------------------------------------------------------------------------------
def test_what_is_cold(cache: Path) -> None:
    state = {"cache_root": str(cache)}
    assert warm_state.is_cold(state, {"fingerprint": "-"}) is False  # nothing compiles
    assert warm_state.is_cold(state, {"fingerprint": FP}) is True  # no warm directory yet
    assert warm_state.warm_dir(state) is None
    warm_state.mark_warm(state, "cd" * 32, ["rbln/m/t"])
    assert warm_state.is_cold(state, {"fingerprint": FP}) is True  # another fingerprint's marker
    warm_state.mark_warm(state, FP, ["rbln/m/s"])
    assert warm_state.is_cold(state, {"fingerprint": FP}) is False
    assert warm_state.warm_record(state, FP)["dirs"] == ["rbln/m/s"]  # type: ignore[index]
    assert warm_state.warm_record(state, "ef" * 32) is None
    assert warm_state.is_cold({"cache_root": str(cache / "none")}, {"fingerprint": FP}) is True


def test_the_warm_directory_is_made_roots_on_demand(tmp_path: Path) -> None:
    state = {"cache_root": str(tmp_path / "new" / "cache")}
    fd = warm_state.warm_dir(state, create=True)
    assert fd is not None
    try:
        st = os.fstat(fd)
        assert (st.st_uid, stat.S_IMODE(st.st_mode) & 0o022) == (0, 0)
    finally:
        os.close(fd)
    assert (tmp_path / "new" / "cache" / layout.WARM_DIR).is_dir()
    again = warm_state.warm_dir(state)
    assert again is not None
    os.close(again)


def test_a_cache_root_that_is_a_file_has_no_warm_directory(tmp_path: Path) -> None:
    (tmp_path / "cache").write_text("not a directory\n")
    with pytest.raises(FileExistsError):
        warm_state.warm_dir({"cache_root": str(tmp_path / "cache")}, create=True)
    (tmp_path / "cache").unlink()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "cache").symlink_to(tmp_path / "elsewhere")  # the serve user's link
    os.lchown(tmp_path / "cache", NOBODY.pw_uid, NOBODY.pw_gid)
    with pytest.raises(systemd_units.Failed) as got:
        warm_state.warm_dir({"cache_root": str(tmp_path / "cache")}, create=True)
    assert str(got.value) == f"{tmp_path / 'cache'} is not a directory"


def test_the_record_of_a_compile_and_of_a_copy(cache: Path, monkeypatch: Any) -> None:
    state = {"cache_root": str(cache)}
    monkeypatch.setattr(warm_state.time, "strftime", lambda fmt: f"at {fmt}")
    warm_state.mark_warm(state, FP, ["rbln/m/s"])
    fd = warm_state.warm_dir(state)
    assert fd is not None
    try:
        text = os.read(os.open(FP, os.O_RDONLY, dir_fd=fd), 1 << 16).decode()
    finally:
        os.close(fd)
    zero, one = b"zero", b"one"
    import hashlib

    assert (
        text
        == json.dumps(
            {
                "dirs": ["rbln/m/s"],
                "seal": {
                    "rbln/m/s/rank0/mega_cache.bin": [4, hashlib.sha256(zero).hexdigest()],
                    "rbln/m/s/rank1/mega_cache.bin": [3, hashlib.sha256(one).hexdigest()],
                },
                "source": "compiled",
                "time": "at %Y-%m-%dT%H:%M:%S",
            },
            sort_keys=True,
        )
        + "\n"
    )
    given = {"rbln/m/t/x": [1, "00"]}
    warm_state.mark_warm(state, FP, ["rbln/m/t"], source="host-a", seal=given)
    record = warm_state.warm_record(state, FP)
    assert record is not None
    assert (record["source"], record["seal"], record["dirs"]) == ("host-a", given, ["rbln/m/t"])


def test_a_seal_of_what_is_not_a_plain_tree_is_none(cache: Path) -> None:
    assert warm_state.cache_seal(str(cache / "none"), ["rbln/m/s"]) is None
    assert warm_state.cache_seal(str(cache), ["rbln/m/none"]) is None
    assert warm_state.cache_seal(str(cache), []) == {}
    assert sorted(warm_state.cache_seal(str(cache), ["rbln/m/s", "rbln/m/t"]) or {}) == [
        "rbln/m/s/rank0/mega_cache.bin", "rbln/m/s/rank1/mega_cache.bin",
        "rbln/m/t/rank0/mega_cache.bin", "rbln/m/t/rank0/run.sh",
    ]  # fmt: skip


# --- sealing -------------------------------------------------------------------------------------
def test_a_seal_gives_each_directory_and_file_its_mode(cache: Path) -> None:
    warm_state.seal_tree(str(cache), ["rbln/m/none", "rbln/m/t"])  # a missing one is skipped
    t = cache / "rbln/m/t"
    assert _mode(t) == (0, NOBODY.pw_gid, 0o750)
    assert _mode(t / "rank0") == (0, NOBODY.pw_gid, 0o750)
    assert _mode(t / "rank0/mega_cache.bin") == (0, NOBODY.pw_gid, 0o640)
    assert _mode(t / "rank0/run.sh") == (0, NOBODY.pw_gid, 0o750)
    assert _mode(cache / "rbln/m/s/rank0/mega_cache.bin")[0] == NOBODY.pw_uid  # not named
    assert _mode(cache / "rbln/m")[0] == NOBODY.pw_uid  # above the named directory


def test_a_seal_changes_nothing_that_is_right_and_fixes_what_is_not(cache: Path) -> None:
    bundle = cache / "rbln/m/t/rank0/mega_cache.bin"
    warm_state.seal_tree(str(cache), ["rbln/m/t"])
    before = bundle.stat().st_ctime_ns
    warm_state.seal_tree(str(cache), ["rbln/m/t"])
    assert bundle.stat().st_ctime_ns == before
    os.chmod(bundle, 0o660)  # root's, its group may write: made 0640 again
    warm_state.seal_tree(str(cache), ["rbln/m/t"])
    assert _mode(bundle) == (0, NOBODY.pw_gid, 0o640)
    os.chown(bundle, 0, 0)  # root's, another group: the cache root's group again
    warm_state.seal_tree(str(cache), ["rbln/m/t"])
    assert _mode(bundle) == (0, NOBODY.pw_gid, 0o640)


def test_a_cache_root_that_is_no_directory_is_not_sealed(tmp_path: Path) -> None:
    warm_state.seal_tree(str(tmp_path / "none"), ["rbln/m/s"])
    assert list(tmp_path.iterdir()) == []


def test_seal_warm_seals_each_warm_fingerprint_once(cache: Path, monkeypatch: Any) -> None:
    state = {"cache_root": str(cache)}
    with monkeypatch.context() as m:
        m.setattr(warm_state, "seal_tree", lambda cache_root, dirs: None)
        warm_state.mark_warm(state, FP, ["rbln/m/s", "rbln/m/t"])
    sealed: list[tuple[str, list[str]]] = []
    monkeypatch.setattr(warm_state, "seal_tree", lambda root, dirs: sealed.append((root, dirs)))
    warm_state.seal_warm(str(cache), [FP, "-", "", FP, "cd" * 32])
    assert sealed == [(str(cache), ["rbln/m/s", "rbln/m/t"])]


# --- bundle directories --------------------------------------------------------------------------
class Journal:
    """systemd's side of bundle_dirs: the unit's invocation and what its journal says."""

    def __init__(self, monkeypatch: Any, invocation: str | None, lines: list[list[str]]) -> None:
        self.asked: list[list[str]] = []
        self.slept: list[float] = []
        self.lines = lines
        monkeypatch.setattr(
            systemd_units,
            "show",
            lambda units, *props: (
                [{"Id": units[0]} | ({} if invocation is None else {"InvocationID": invocation})]
                if props == ("InvocationID",)
                else [{}]
            ),
        )
        monkeypatch.setattr(warm_state.subprocess, "run", self.run)
        monkeypatch.setattr(warm_state.time, "sleep", self.slept.append)

    def run(self, argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        assert kw == {"capture_output": True, "text": True}
        self.asked.append(argv)
        out = "\n".join(self.lines.pop(0) if self.lines else [])
        return subprocess.CompletedProcess(argv, 0, out, "")


def test_the_bundles_a_start_saved_or_loaded_are_read_from_its_journal(
    cache: Path, monkeypatch: Any
) -> None:
    saved = f"Saved rbln mega-cache bundle to {cache}/rbln/m/s/rank0/mega_cache.bin"
    loaded = f"INFO Loaded rbln mega-cache bundle from {cache}/rbln/m/t/rank0/mega_cache.bin (2 s)"
    journal = Journal(monkeypatch, "inv-1", [[], [saved, loaded, saved]])
    assert warm_state.bundle_dirs({"cache_root": str(cache)}, UNIT, time.time() + 3600) == [
        "rbln/m/s", "rbln/m/t"
    ]  # fmt: skip
    assert (
        journal.asked
        == [["journalctl", "-o", "cat", "--no-pager", "_SYSTEMD_INVOCATION_ID=inv-1"]] * 2
    )
    assert journal.slept == [0.5]  # journald lagged once


def test_bundles_outside_the_layout_or_gone_are_not_copied(cache: Path, monkeypatch: Any) -> None:
    lines = [
        f"Saved rbln mega-cache bundle to {cache}/rbln/m/s/rank0/mega_cache.bin",
        f"Saved rbln mega-cache bundle to {cache}/rbln/m/gone/rank0/mega_cache.bin",  # not on disk
        f"Saved rbln mega-cache bundle to {cache}/rbln/m/s/rank0/x/mega_cache.bin",  # four parts
        f"Saved rbln mega-cache bundle to {cache}/rbln/m/rank0/mega_cache.bin",  # two parts
        f"Saved rbln mega-cache bundle to {cache}/rbln/../m/rank0/mega_cache.bin",
        "Saved rbln mega-cache bundle to /elsewhere/a/b/rank0/mega_cache.bin",  # not below
    ]
    (cache / "rbln/m/s/rank0/x").mkdir()
    (cache / "rbln/m/s/rank0/x/mega_cache.bin").write_text("deeper")
    (cache / "rbln/m/rank0").mkdir()
    (cache / "rbln/m/rank0/mega_cache.bin").write_text("shallower")
    (cache / "m/rank0").mkdir(parents=True)  # what rbln/../m/rank0 names is on disk
    (cache / "m/rank0/mega_cache.bin").write_text("by a path with ..")
    Journal(monkeypatch, "inv-1", [lines])
    assert warm_state.bundle_dirs({"cache_root": str(cache)}, UNIT, 0) == ["rbln/m/s"]


def test_without_journal_lines_the_bundles_written_since_the_start_count(
    cache: Path, monkeypatch: Any
) -> None:
    """Ten looks at the journal half a second apart, then the bundles of the layout whose
    mtime is the start's or later."""
    old, new = cache / "rbln/m/s/rank0/mega_cache.bin", cache / "rbln/m/t/rank0/mega_cache.bin"
    os.utime(old, (1000, 1000))
    os.utime(cache / "rbln/m/s/rank1/mega_cache.bin", (1000, 1000))
    os.utime(new, (2000, 2000))
    journal = Journal(monkeypatch, "inv-1", [])
    assert warm_state.bundle_dirs({"cache_root": str(cache)}, UNIT, 2000) == ["rbln/m/t"]
    assert len(journal.asked) == 10 and journal.slept == [0.5] * 10
    assert warm_state.bundle_dirs({"cache_root": str(cache)}, UNIT, 1000) == [
        "rbln/m/s", "rbln/m/t"
    ]  # fmt: skip
    no_invocation = Journal(monkeypatch, "", [])
    assert warm_state.bundle_dirs({"cache_root": str(cache)}, UNIT, 2001) == []
    assert no_invocation.asked == [] == no_invocation.slept  # no journal to read or wait for
    not_shown = Journal(monkeypatch, None, [])  # systemd shows no InvocationID at all
    assert warm_state.bundle_dirs({"cache_root": str(cache)}, UNIT, 2001) == []
    assert not_shown.asked == [] == not_shown.slept


# --- drop ----------------------------------------------------------------------------------------
def test_each_line_of_a_drop(cache: Path, monkeypatch: Any, capsys: Any) -> None:
    state = {"cache_root": str(cache)}
    stopped: list[tuple[Any, ...]] = []
    monkeypatch.setattr(
        systemd_units, "systemctl", lambda *a, check=True: stopped.append((*a, check))
    )
    warm_state.drop(str(cache), FP, UNIT)
    assert capsys.readouterr().out == f"cache {FP}: not warm here: nothing to drop\n"
    warm_state.mark_warm(state, FP, ["rbln/m/s", "rbln/m/gone"])
    (cache / "rbln/m/gone").mkdir()
    warm_state.mark_warm(state, FP, ["rbln/m/s"])
    warm_state.drop(str(cache), FP, UNIT)
    assert capsys.readouterr().out == f"cache {FP}: matches its seal: kept\n"
    assert stopped == []
    os.chmod(cache / "rbln/m/s/rank1/mega_cache.bin", 0o644)
    (cache / "rbln/m/s/rank1/mega_cache.bin").write_text("drifted")
    record = content_check.cache_record(str(cache), FP)
    assert record is not None
    differ = content_check.verify_cache(str(cache), record)["differ"]
    assert differ
    warm_state.drop(str(cache), FP, UNIT)
    assert capsys.readouterr().out == "".join(f"cache {FP}: {line}\n" for line in differ) + (
        f"cache {FP}: dropped; {UNIT} compiles it again at its restart\n"
    )
    assert stopped == [("stop", UNIT, False)]  # a unit that will not stop fails nothing here
    assert not (cache / "rbln/m/s").exists() and (cache / "rbln/m/t").is_dir()
    assert os.listdir(cache / layout.DROPPED) == []
    assert content_check.cache_record(str(cache), FP) is None


def test_moving_out_takes_each_directory_whole_and_skips_what_is_gone(cache: Path) -> None:
    warm_state._move_out(str(cache), ["rbln/m/s", "rbln/none/x", "rbln/m/none", "rbln/m/t"])
    moved = sorted(os.listdir(cache / layout.DROPPED))
    assert [re.sub(r"-\d+$", "-N", m) for m in moved] == ["s-N", "t-N"]
    assert sorted(os.listdir(cache / layout.DROPPED / moved[0])) == ["rank0", "rank1"]
    assert _mode(cache / layout.DROPPED)[0] == 0
    assert not (cache / "rbln/m/s").exists() and not (cache / "rbln/m/t").exists()
    warm_state.sweep(str(cache))
    assert os.listdir(cache / layout.DROPPED) == []


def test_nothing_to_move_or_sweep_without_a_cache_root(tmp_path: Path) -> None:
    warm_state._move_out(str(tmp_path / "none"), ["rbln/m/s"])
    warm_state.sweep(str(tmp_path / "none"))
    warm_state.sweep(str(tmp_path))  # no dropped directory: none made
    assert list(tmp_path.iterdir()) == []


def test_a_link_to_roots_file_is_never_followed_by_the_seal(cache: Path) -> None:
    """The serve user's link in its cache to a file of root's (a file of the test's own, never a
    system file: a mutant that follows it must change nothing that matters), and a fifo: the
    seal leaves both as they are, and the target keeps its owner, group and mode."""
    target = cache.parent / "roots-own"
    target.write_text("root's\n")
    target.chmod(0o644)
    link = cache / "rbln/m/t/rank0/link"
    link.symlink_to(target)
    os.lchown(link, NOBODY.pw_uid, NOBODY.pw_gid)
    fifo = cache / "rbln/m/t/rank0/fifo"
    os.mkfifo(fifo)  # opened without O_NONBLOCK, it would wait for a writer forever
    os.chown(fifo, NOBODY.pw_uid, NOBODY.pw_gid)
    warm_state.mark_warm({"cache_root": str(cache)}, FP, ["rbln/m/t"])
    assert _mode(target) == (0, 0, 0o644)
    assert link.lstat().st_uid == NOBODY.pw_uid and fifo.lstat().st_uid == NOBODY.pw_uid
    assert _mode(cache / "rbln/m/t/rank0/mega_cache.bin") == (0, NOBODY.pw_gid, 0o640)
    record = warm_state.warm_record({"cache_root": str(cache)}, FP)
    assert record is not None and record["seal"] is None  # not a plain tree: never copied


def test_a_dropped_directory_root_cannot_make_moves_nothing(cache: Path, monkeypatch: Any) -> None:
    """The serve user racing root's dropped directory until root gives up (``root_dir``'s
    OSError): nothing is moved, nothing swept, no error."""
    import trusted

    def racing(parent: int, name: str, create: bool = False) -> int | None:
        raise OSError(f"cannot make root's own directory {name}")

    monkeypatch.setattr(trusted, "root_dir", racing)
    warm_state._move_out(str(cache), ["rbln/m/s"])
    warm_state.sweep(str(cache))
    assert (cache / "rbln/m/s").is_dir() and not (cache / layout.DROPPED).exists()


def test_a_drop_whose_marker_went_meanwhile_still_drops(cache: Path, monkeypatch: Any) -> None:
    """The marker removed between its reading and its removal (another drop, by hand): the
    drop goes on and ends as dropped."""
    import fault_point

    state = {"cache_root": str(cache)}
    warm_state.mark_warm(state, FP, ["rbln/m/s"])
    os.chmod(cache / "rbln/m/s/rank1/mega_cache.bin", 0o644)
    (cache / "rbln/m/s/rank1/mega_cache.bin").write_text("drifted")
    monkeypatch.setattr(systemd_units, "systemctl", lambda *a, check=True: "")

    def marker_gone(point: str, deadline: float = 600) -> None:
        fd = warm_state.warm_dir(state)
        assert fd is not None
        try:
            os.unlink(FP, dir_fd=fd)
        finally:
            os.close(fd)

    monkeypatch.setattr(fault_point, "barrier", marker_gone)
    warm_state.drop(str(cache), FP, UNIT)
    assert warm_state.warm_record(state, FP) is None
    assert not (cache / "rbln/m/s").exists()


def test_a_seal_never_walks_through_a_link_and_seals_every_file_beside_links(cache: Path) -> None:
    """Links (to a directory of root's, to files) among the files: the walk never enters the
    linked directory (its file keeps its mode), and every regular file beside the links is
    sealed, whatever order the directory lists them in; a file is executable by any x bit, and
    a group write bit alone makes none."""
    elsewhere = cache.parent / "roots-dir"
    elsewhere.mkdir(mode=0o755)
    elsewhere.chmod(0o755)
    (elsewhere / "f").write_text("root's\n")
    (elsewhere / "f").chmod(0o644)
    rank = cache / "rbln/m/t/rank0"
    for i in range(5):
        (rank / f"link-{i}").symlink_to(elsewhere if i == 0 else elsewhere / "f")
        os.lchown(rank / f"link-{i}", NOBODY.pw_uid, NOBODY.pw_gid)
        (rank / f"file-{i}").write_text(str(i))
        os.chown(rank / f"file-{i}", NOBODY.pw_uid, NOBODY.pw_gid)
    (rank / "file-0").chmod(0o660)  # group write, no x: not executable
    (rank / "file-1").chmod(0o601)  # others' x: executable
    warm_state.seal_tree(str(cache), ["rbln/m/t"])
    assert _mode(elsewhere) == (0, 0, 0o755)
    assert _mode(elsewhere / "f") == (0, 0, 0o644)
    assert _mode(rank / "file-0") == (0, NOBODY.pw_gid, 0o640)
    assert _mode(rank / "file-1") == (0, NOBODY.pw_gid, 0o750)
    for i in range(2, 5):
        assert _mode(rank / f"file-{i}") == (0, NOBODY.pw_gid, 0o640), i
