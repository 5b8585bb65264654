"""``trusted.py``'s calls one at a time (the mutation campaign, #37, found them held only through
the host programs that use them): the directories ``open_below`` makes for an owner (0755 under
any umask, each chowned without following a link put in its place), root's links followed up to
the kernel's limit and no others, ``root_dir``'s mode and its descriptor 0, ``remove_in`` of
every kind of entry (best effort), ``names``, the digest of a file over several reads,
``is_file``, ``read``'s limit, ``write``'s temporary file (a left one replaced, a link at its
name never written through, never more open than its mode). A scratch working directory: a
call that lost its ``dir_fd`` acts there, not in the repository."""

from __future__ import annotations

import hashlib
import os
import pwd
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from repo_paths import REMOTE

sys.path.insert(0, str(REMOTE))
import trusted  # noqa: E402  (a host program: imported as the host imports it)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (chown, root's own links)")
NOBODY = pwd.getpwnam("nobody")
OWNER = (NOBODY.pw_uid, NOBODY.pw_gid)


@pytest.fixture(autouse=True)
def scratch_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")


@contextmanager
def opened(path: Path) -> Iterator[int]:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        yield fd
    finally:
        os.close(fd)


@contextmanager
def umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def owner_and_mode(path: Path) -> tuple[int, int, int]:
    st = path.lstat()
    return st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)


def test_the_missing_directories_are_made_0755_for_the_owner(tmp_path: Path) -> None:
    with umask(0o002), opened(tmp_path) as parent:
        os.close(trusted.open_below(parent, "a/b", OWNER))
        os.close(trusted.open_below(parent, "a/b", OWNER))  # there already: opened
        os.close(trusted.open_path(f"{tmp_path}/c/d", OWNER))
    for made in ("a", "a/b", "c", "c/d"):
        assert owner_and_mode(tmp_path / made) == (*OWNER, 0o755), made
    assert list((tmp_path / "cwd").iterdir()) == []


def test_a_link_put_in_place_of_a_new_directory_is_not_chowned_through(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The serve user swaps the directory just made for a link: chown changes the link alone,
    and the walk refuses it (the serve user's tree: no root link there is followed)."""
    tree, victim = tmp_path / "tree", tmp_path / "victim"
    tree.mkdir()
    victim.mkdir()
    os.chown(tree, *OWNER)
    real_mkdir = os.mkdir

    def mkdir_then_swap(path: str, mode: int = 0o777, *, dir_fd: int | None = None) -> None:
        real_mkdir(path, mode, dir_fd=dir_fd)
        os.rename(path, f"{path}.made", src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        os.symlink(str(victim), path, dir_fd=dir_fd)

    with opened(tree) as parent, monkeypatch.context() as m:
        m.setattr(os, "mkdir", mkdir_then_swap)
        with pytest.raises(OSError, match="x: x is not a directory"):
            trusted.open_below(parent, "x", OWNER)
    assert owner_and_mode(victim)[:2] == (0, 0)
    assert (tree / "x").lstat().st_uid == NOBODY.pw_uid  # the link itself


def _chain(base: Path, prefix: str, n: int) -> None:
    """``<prefix>0 -> <prefix>1 -> ... -> real``: n links, root's, in root's own directory."""
    for i in range(n):
        (base / f"{prefix}{i}").symlink_to(f"{prefix}{i + 1}" if i + 1 < n else "real")


def test_root_links_are_followed_up_to_the_kernels_limit(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    _chain(tmp_path, "a", trusted.MAX_LINKS)
    _chain(tmp_path, "b", trusted.MAX_LINKS + 1)
    fd = trusted.open_path(f"{tmp_path}/a0")
    try:
        assert os.fstat(fd).st_ino == (tmp_path / "real").stat().st_ino
    finally:
        os.close(fd)
    with pytest.raises(OSError, match=f"b{trusted.MAX_LINKS}: b{trusted.MAX_LINKS} is not a dir"):
        trusted.open_path(f"{tmp_path}/b0")


def test_a_link_root_did_not_make_and_a_file_are_not_directories(tmp_path: Path) -> None:
    (tmp_path / "real" / "sub").mkdir(parents=True)
    (tmp_path / "theirs").symlink_to("real")
    os.lchown(tmp_path / "theirs", *OWNER)  # in root's own directory, but not root's link
    (tmp_path / "file").write_text("x")
    with pytest.raises(OSError, match="theirs is not a directory"):
        trusted.open_path(f"{tmp_path}/theirs/sub")
    with pytest.raises(OSError, match="file is not a directory"):
        trusted.open_path(f"{tmp_path}/file/sub")


def test_a_relative_path_is_refused_in_one_line() -> None:
    with pytest.raises(OSError) as err:
        trusted.open_path("var/cache")
    assert str(err.value) == "var/cache is not absolute"


def test_roots_own_directory_is_made_0755_under_any_umask(tmp_path: Path) -> None:
    with umask(0o002), opened(tmp_path) as parent:
        fd = trusted.root_dir(parent, "own", create=True)
        assert fd is not None
        os.close(fd)
    assert owner_and_mode(tmp_path / "own") == (0, 0, 0o755)


def test_roots_own_directory_on_descriptor_0(tmp_path: Path) -> None:
    """A host program run with stdin closed gets descriptor 0 for the directory: still root's."""
    (tmp_path / "own").mkdir(mode=0o755)
    with opened(tmp_path) as parent:
        own = trusted.root_dir(parent, "own")  # here as well: a campaign sees the call
        assert own is not None
        os.close(own)
        pid = os.fork()
        if pid == 0:  # the child closes its stdin
            try:
                os.close(0)
                fd = trusted.root_dir(parent, "own")
                os._exit(0 if fd == 0 else 3)
            except BaseException:  # noqa: BLE001
                os._exit(4)
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert (tmp_path / "own").is_dir() and not list(tmp_path.glob("own.untrusted-*"))


def test_roots_own_directory_given_up_when_always_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def plant_a_link(path: str, mode: int = 0o777, *, dir_fd: int | None = None) -> None:
        os.symlink("/", path, dir_fd=dir_fd)  # the serve user wins every race

    tries: list[str] = []
    real_open = os.open

    def counted(path: str, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        if path == "own":
            tries.append(path)
        return real_open(path, flags, mode, dir_fd=dir_fd)

    with opened(tmp_path) as parent, monkeypatch.context() as m:
        m.setattr(os, "mkdir", plant_a_link)
        m.setattr(os, "open", counted)
        with pytest.raises(OSError) as err:
            trusted.root_dir(parent, "own", create=True)
    assert str(err.value) == "cannot make root's own directory own"
    assert len(tries) == 3  # three tries, then it gives up


def test_a_regular_file_that_cannot_be_opened_is_an_oserror_not_a_non_regular_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Out of descriptors (EMFILE) a regular file of the tree is still a regular file: the
    OSError is raised as it is, asked of the walked directory, never of the working one."""
    (tmp_path / "tree").mkdir()
    (tmp_path / "tree" / "weights.bin").write_text("x")
    real_open = os.open

    def exhausted(path: str, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        if path == "weights.bin":
            raise OSError(24, "Too many open files")
        return real_open(path, flags, mode, dir_fd=dir_fd)

    monkeypatch.chdir(tmp_path)  # the working directory holds no weights.bin
    with opened(tmp_path / "tree") as base, monkeypatch.context() as m:
        m.setattr(os, "open", exhausted)
        with pytest.raises(OSError) as err:
            trusted.each_file(base, "m", lambda rel, fd, st: st.st_size)
    assert err.type is OSError and err.value.errno == 24


def test_remove_in_removes_every_kind_of_entry_and_follows_no_link(tmp_path: Path) -> None:
    d, target = tmp_path / "d", tmp_path / "target"
    (d / "tree" / "sub").mkdir(parents=True)
    (d / "tree" / "sub" / "f").write_text("x")
    (d / "file").write_text("x")
    (target / "keep").mkdir(parents=True)
    (d / "link").symlink_to(target)
    (d / "dangling").symlink_to(tmp_path / "none")
    with opened(d) as fd:
        for name in ("tree", "file", "link", "dangling", "missing"):
            trusted.remove_in(fd, name)
    assert list(d.iterdir()) == []
    assert (target / "keep").is_dir()


@pytest.mark.skipif(shutil.which("chattr") is None, reason="needs chattr (e2fsprogs)")
def test_remove_in_leaves_what_it_cannot_remove_without_an_error(tmp_path: Path) -> None:
    stuck = tmp_path / "d" / "tree" / "stuck"
    stuck.parent.mkdir(parents=True)
    stuck.write_text("x")
    if subprocess.run(["chattr", "+i", str(stuck)], capture_output=True).returncode != 0:
        pytest.skip(f"{tmp_path}'s file system has no immutable files")
    try:
        with opened(tmp_path / "d") as fd:
            trusted.remove_in(fd, "tree")  # best effort: what is left stays, no error
        assert stuck.exists()
    finally:
        subprocess.run(["chattr", "-i", str(stuck)], check=True)


def test_names_are_the_regular_files_but_temporary_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("b", "a", ".a.tmp-1"):
        (tmp_path / name).write_text(name)
    (tmp_path / "sub").mkdir()
    (tmp_path / "ln").symlink_to("a")
    real_listdir = os.listdir
    with opened(tmp_path) as fd, monkeypatch.context() as m:
        # a temporary file listed first, then a name removed before it is looked at
        m.setattr(os, "listdir", lambda at: [".a.tmp-1", "gone", *sorted(real_listdir(at))])
        assert trusted.names(fd) == ["a", "b"]


def test_the_digest_of_a_file_read_in_several_blocks(tmp_path: Path) -> None:
    data = os.urandom(1 << 19) * 3  # 1.5 MiB: more than one read
    (tmp_path / "tree").mkdir()
    (tmp_path / "tree" / "big").write_bytes(data)
    with opened(tmp_path / "tree") as fd:
        assert trusted.digests(fd, "p") == {"p/big": [len(data), hashlib.sha256(data).hexdigest()]}


def test_is_file_is_a_regular_file_only(tmp_path: Path) -> None:
    (tmp_path / "a").write_text("a")
    (tmp_path / "ln").symlink_to("a")
    with opened(tmp_path) as fd:
        assert [trusted.is_file(fd, n) for n in ("a", "ln", "cwd", "missing")] == [
            True, False, False, False,
        ]  # fmt: skip


def test_read_takes_up_to_its_limit_and_refuses_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "full").write_bytes(b"x" * trusted.MAX_READ)
    (tmp_path / "over").write_bytes(b"x" * (trusted.MAX_READ + 1))
    with opened(tmp_path) as fd:
        assert trusted.read(fd, "full") == "x" * trusted.MAX_READ
        for name, line in (
            ("over", f"over is larger than {trusted.MAX_READ} bytes"),
            ("cwd", "cwd is not a regular file"),
        ):
            with pytest.raises(OSError) as err:
                trusted.read(fd, name)
            assert str(err.value) == line


def test_write_replaces_a_left_temporary_file_and_sets_mode_and_owner(tmp_path: Path) -> None:
    sentinel = tmp_path / "sentinel"
    sentinel.write_text("root's\n")
    d = tmp_path / "own"
    d.mkdir()
    with opened(d) as fd:
        os.symlink(sentinel, f".m.tmp-{os.getpid()}", dir_fd=fd)  # left by a killed write
        trusted.write(fd, "m", "text")
        trusted.write(fd, "o", "other", mode=0o600, owner=OWNER)
    assert (d / "m").read_text() == "text" and owner_and_mode(d / "m") == (0, 0, 0o644)
    assert (d / "o").read_text() == "other" and owner_and_mode(d / "o") == (*OWNER, 0o600)
    assert sorted(p.name for p in d.iterdir()) == ["m", "o"]
    assert sentinel.read_text() == "root's\n"


def test_write_never_writes_through_a_link_at_its_temporary_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Even one planted between the removal of a left temporary file and the new one's open."""
    sentinel = tmp_path / "sentinel"
    sentinel.write_text("root's\n")
    real_unlink = os.unlink

    def unlink_then_plant(path: str, *, dir_fd: int | None = None) -> None:
        real_unlink(path, dir_fd=dir_fd)
        os.symlink(sentinel, path, dir_fd=dir_fd)

    with opened(tmp_path) as fd:
        os.symlink(sentinel, f".m.tmp-{os.getpid()}", dir_fd=fd)
        with monkeypatch.context() as m:
            m.setattr(os, "unlink", unlink_then_plant)
            with pytest.raises(FileExistsError):
                trusted.write(fd, "m", "text")
    assert sentinel.read_text() == "root's\n" and not (tmp_path / "m").exists()


def test_the_temporary_file_is_never_more_open_than_its_mode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Created with the mode (not the umask's 0777 first, fixed later): under umask 0 another
    user could open it for writing before the fchmod."""
    seen: list[int] = []
    real_fchmod = os.fchmod

    def record(fd: int, mode: int) -> None:
        seen.append(stat.S_IMODE(os.fstat(fd).st_mode))
        real_fchmod(fd, mode)

    with umask(0), opened(tmp_path) as fd, monkeypatch.context() as m:
        m.setattr(os, "fchmod", record)
        trusted.write(fd, "m", "text")
    assert seen == [0o644] and owner_and_mode(tmp_path / "m") == (0, 0, 0o644)
