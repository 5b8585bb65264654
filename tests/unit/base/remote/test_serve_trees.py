"""remote/trees.py (#31 finding 3): the serve user's directories are made and checked again on
the host before they are given to it, with ``nobody`` standing in for the serve user and a
temporary root-owned directory standing in for ``/var/lib``: a link or a bind mount in the path,
or a directory someone else owns, is refused in one line and nothing is chowned."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from repo_paths import REMOTE

sys.path.insert(0, str(REMOTE))
import trees  # noqa: E402

from servefleet.base.remote.layout import SERVE_TREE_ROOTS  # noqa: E402

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (chown to nobody)")
NOBODY = pwd.getpwnam("nobody")


@pytest.fixture
def root(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A root-owned 0755 directory standing in for /var/lib (the only root allowed), and a
    root-only sentinel directory next to it."""
    base = Path(tempfile.mkdtemp(prefix="servefleet-trees-"))
    base.chmod(0o755)
    (base / "varlib").mkdir()
    (base / "sentinel").mkdir(mode=0o700)
    monkeypatch.setattr(trees, "ROOTS", (str(base / "varlib"),))
    try:
        yield base / "varlib"
    finally:
        shutil.rmtree(base)


def make(*paths: Path) -> subprocess.CompletedProcess[str]:
    """trees.py as the host runs it, its ROOTS those of the fixture (through an import)."""
    code = (f"import sys; sys.path.insert(0, {str(REMOTE)!r}); import trees; "
            f"trees.ROOTS = {trees.ROOTS!r}; sys.exit(trees.main(sys.argv[1:]))")  # fmt: skip
    return subprocess.run([sys.executable, "-c", code, "nobody", "755", *map(str, paths)],
                          capture_output=True, text=True)  # fmt: skip


def one_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 1 and proc.stdout == "", (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr and len(proc.stderr.splitlines()) == 1, proc.stderr
    return proc.stderr.strip()


def owner(path: Path) -> tuple[int, int, int]:
    st = path.lstat()
    return st.st_uid, st.st_gid, st.st_mode & 0o7777


def test_the_roots_are_the_ones_the_data_allows() -> None:
    assert SERVE_TREE_ROOTS == ("/var/lib", "/var/cache", "/srv", "/opt", "/home")
    assert trees.root_of("/var/lib/x") == "/var/lib" and trees.root_of("/var/lib") is None
    assert trees.root_of("/etc/systemd/system") is None and trees.root_of("/var/libx/a") is None


def test_new_trees_are_made_the_serve_users_their_parents_roots(root: Path) -> None:
    proc = make(root / "sf", root / "sf" / "hf", root / "cache" / "sf" / "vllm")
    assert proc.returncode == 0, proc.stderr
    user = (NOBODY.pw_uid, NOBODY.pw_gid, 0o755)
    assert owner(root / "sf") == owner(root / "sf" / "hf") == owner(root / "cache/sf/vllm") == user
    assert owner(root / "cache") == owner(root / "cache" / "sf") == (0, 0, 0o755)
    (root / "sf" / "hf").chmod(0o700)  # the serve user's own, its mode set again
    assert make(root / "sf" / "hf").returncode == 0 and owner(root / "sf" / "hf") == user


def test_a_link_in_the_path_is_refused_before_anything_is_chowned(root: Path) -> None:
    sentinel = root.parent / "sentinel"
    before = owner(sentinel)
    (root / "sf").mkdir()
    os.chown(root / "sf", NOBODY.pw_uid, NOBODY.pw_gid)
    (root / "sf" / "hf").symlink_to(sentinel)  # as the serve user can, in its own home
    line = one_line(make(root / "sf" / "hf"))
    assert line.startswith(f"servefleet: {root}/sf/hf is a link (")
    assert line.endswith(f"); allowed: real directories below {root}")
    (root / "x").symlink_to(sentinel)  # a link above the tree
    assert one_line(make(root / "x" / "hf")).startswith(f"servefleet: {root}/x is a link (")
    assert owner(sentinel) == before and not (sentinel / "hf").exists()


def test_a_directory_someone_else_owns_is_never_given_away(root: Path) -> None:
    (root / "dpkg").mkdir()  # as /var/lib/dpkg: root's
    assert one_line(make(root / "dpkg")) == (
        f"servefleet: {root}/dpkg is there, owned by root, not nobody: servefleet gives nobody "
        "only a directory it makes or one that is nobody's already; allowed: a path that does not "
        "exist yet, or nobody's own directory"
    )
    assert owner(root / "dpkg") == (0, 0, 0o755)


def test_a_path_outside_the_roots_is_refused(root: Path) -> None:
    assert one_line(make(root)) == (
        f"servefleet: {root}: not a directory of its own below {root}; nothing changed"
    )


def test_a_bind_mount_in_the_path_is_refused(root: Path) -> None:
    """A system directory bound into the path (the sentinel standing in for /etc): refused,
    and a disk of its own mounted there would pass (mountinfo's root of the mount is /)."""
    sentinel = root.parent / "sentinel"
    (root / "sf").mkdir()
    code = (f"import sys; sys.path.insert(0, {str(REMOTE)!r}); import trees; "
            f"trees.ROOTS = {trees.ROOTS!r}; sys.exit(trees.main(sys.argv[1:]))")  # fmt: skip
    script = (
        f'mount --bind {sentinel} {root}/sf && exec {sys.executable} -c "$0" nobody 755 {root}/sf'
    )
    proc = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script, code],
                          capture_output=True, text=True)  # fmt: skip
    if "mount:" in proc.stderr or "unshare:" in proc.stderr:
        pytest.skip(f"no mount namespace here: {proc.stderr.strip()}")
    assert one_line(proc) == (
        f"servefleet: {root}/sf is a bind mount of {sentinel} of another file system; allowed: "
        f"real directories below {root}"
    )
    assert owner(sentinel) == (0, 0, 0o700)


def test_mountinfo_whole_file_systems_pass_binds_do_not() -> None:
    table = trees.mounts(
        "22 1 254:0 / / rw - ext4 /dev/vda rw\n"
        "30 22 8:17 / /srv/models rw - xfs /dev/sdb1 rw\n"
        "31 22 254:0 /etc /srv/etc rw - ext4 /dev/vda rw\n"
        "32 22 8:1 / /boot rw - ext4 /dev/sda1 rw\n"
        "33 22 8:1 / /srv/boot rw - ext4 /dev/sda1 rw\n"
    )
    assert trees.bind_problem(30, table) is None
    assert trees.bind_problem(31, table) == "a bind mount of /etc of another file system"
    assert trees.bind_problem(33, table) == "a file system (8:1) that is mounted elsewhere too"
