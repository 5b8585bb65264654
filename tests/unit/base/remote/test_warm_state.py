"""A sealed compile cache is root's, and a drop killed midway leaves nothing behind (#36):
``remote/warm_state.py`` on a serve user's cache root (``nobody``'s here)."""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from as_nobody import as_nobody
from repo_paths import REMOTE

sys.path.insert(0, str(REMOTE))
import content_check  # noqa: E402
import fault_point  # noqa: E402
import layout  # noqa: E402
import systemd_units  # noqa: E402
import warm_state  # noqa: E402

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (chown to nobody)")
FP = "cd" * 32
NOBODY = pwd.getpwnam("nobody")


@pytest.fixture
def cache() -> Iterator[Path]:
    """nobody's cache root (in a root-owned 0755 directory) holding a compile of FP, by nobody:
    two rank directories (0700, as a serving process with umask 077 leaves them), a hard link
    of one bundle elsewhere in its tree; not yet marked warm."""
    top = Path(tempfile.mkdtemp(prefix="servefleet-warm-"))
    top.chmod(0o755)
    root = top / "cache"
    root.mkdir()
    os.chown(root, NOBODY.pw_uid, NOBODY.pw_gid)
    assert as_nobody(root, "os.umask(0o077); os.makedirs('rbln/m/s/rank0');"
                           "os.makedirs('rbln/m/s/rank1');"
                           "open('rbln/m/s/rank0/mega_cache.bin', 'w').write('zero');"
                           "open('rbln/m/s/rank1/mega_cache.bin', 'w').write('one');"
                           "os.link('rbln/m/s/rank1/mega_cache.bin', 'kept-elsewhere')") == 0  # fmt: skip
    try:
        yield root
    finally:
        shutil.rmtree(top)


def test_a_sealed_cache_is_roots_and_the_serve_user_cannot_write_into_it(cache: Path) -> None:
    warm_state.mark_warm({"cache_root": str(cache)}, FP, ["rbln/m/s"])
    record = content_check.cache_record(str(cache), FP)  # the seal is taken after: it matches
    assert record is not None and record["seal"]
    assert content_check.verify_cache(str(cache), record)["differ"] == []
    sig = cache / "rbln/m/s"
    for path, mode in ((sig, 0o750), (sig / "rank0", 0o750), (sig / "rank0/mega_cache.bin", 0o640)):
        st = path.lstat()
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, NOBODY.pw_gid, mode), path
    # the serve user reads it, as its servers load the bundle
    assert as_nobody(cache, "assert open('rbln/m/s/rank0/mega_cache.bin').read() == 'zero'") == 0
    for attempt in (
        "open('rbln/m/s/rank0/mega_cache.bin', 'r+').write('X')",  # write into a sealed file
        "open('rbln/m/s/rank0/new', 'w')",  # add a file
        "os.unlink('rbln/m/s/rank0/mega_cache.bin')",
        "os.rename('rbln/m/s/rank0', 'rbln/m/s/moved')",
        "os.chmod('rbln/m/s/rank0', 0o777)",
        "os.mkdir('rbln/m/s/rank0/sub')",
    ):
        assert as_nobody(cache, attempt) == 1, attempt
    assert sorted(os.listdir(sig / "rank0")) == ["mega_cache.bin"]
    # a file with a second link (it may be another tree's) stays as it was
    assert (sig / "rank1/mega_cache.bin").stat().st_uid == NOBODY.pw_uid


def test_a_link_in_the_cache_is_never_followed_by_the_seal(cache: Path) -> None:
    """The serve user's link (to a file of root's) stays the serve user's, its target too; a
    tree with a link has no seal (it is never copied). The target is a file of the test's own,
    never one of the machine's: a mutant that follows the link changes only that file."""
    target = cache.parent / "roots-file"
    target.write_text("root's\n")
    target.chmod(0o644)
    assert as_nobody(cache, f"os.symlink({str(target)!r}, 'rbln/m/s/passwd')") == 0
    before = os.stat(target)
    warm_state.mark_warm({"cache_root": str(cache)}, FP, ["rbln/m/s"])
    assert (cache / "rbln/m/s/passwd").lstat().st_uid == NOBODY.pw_uid
    after = os.stat(target)
    assert (after.st_uid, after.st_gid, after.st_mode) == (
        before.st_uid,
        before.st_gid,
        before.st_mode,
    )
    record = content_check.cache_record(str(cache), FP)
    assert record is not None and record["seal"] is None


def test_a_cache_of_another_users_file_is_not_taken_over(cache: Path) -> None:
    """A file in the cache that neither the serve user nor root owns keeps its owner."""
    other = cache / "rbln/m/s/rank0/other"
    shutil.copy(cache / "rbln/m/s/rank0/mega_cache.bin", other)
    os.chown(other, 4242, 4242)
    warm_state.mark_warm({"cache_root": str(cache)}, FP, ["rbln/m/s"])
    assert (other.stat().st_uid, other.stat().st_gid) == (4242, 4242)


class Killed(Exception):
    """The drop's process died at the test's fault point."""


def _dropped(cache: Path) -> list[str]:
    return sorted(os.listdir(cache / layout.DROPPED))


def test_a_drop_killed_midway_is_finished_by_the_next_drop_or_converge(
    cache: Path, monkeypatch: Any
) -> None:
    state = {"cache_root": str(cache)}
    warm_state.mark_warm(state, FP, ["rbln/m/s"])
    stopped: list[tuple[str, ...]] = []
    monkeypatch.setattr(systemd_units, "systemctl", lambda *a, check=True: stopped.append(a))
    (cache / "rbln/m/s/rank0/mega_cache.bin").write_text("drifted")  # root's hand, a disk fault

    def die(point: str, deadline: float = 600) -> None:
        if point == "cache-moved-out":
            raise Killed(point)

    # killed right after the cache left its place: the marker is still there
    monkeypatch.setattr(fault_point, "barrier", die)
    with pytest.raises(Killed):
        warm_state.drop(str(cache), FP, "servefleet-vllm-0.service")
    assert not (cache / "rbln/m/s").exists() and len(_dropped(cache)) == 1
    assert content_check.cache_record(str(cache), FP) is not None
    # the next run's drop: the cache still differs (it is missing), the marker goes, all swept
    monkeypatch.setattr(fault_point, "barrier", lambda point, deadline=600: None)
    warm_state.drop(str(cache), FP, "servefleet-vllm-0.service")
    assert content_check.cache_record(str(cache), FP) is None and _dropped(cache) == []
    assert stopped == [("stop", "servefleet-vllm-0.service")] * 2

    # killed after the marker went, before the sweep: the next converge sweeps (the run after
    # has no drop to run: the cache is cold, not drifted)
    os.makedirs(cache / layout.DROPPED / "s-1")
    (cache / layout.DROPPED / "s-1" / "mega_cache.bin").write_text("left")
    warm_state.sweep(str(cache))
    assert _dropped(cache) == []


def test_a_sweep_never_takes_the_serve_users_look_alike(cache: Path) -> None:
    """The serve user's own ``.servefleet-dropped`` (a link to root's files, say) is not root's:
    nothing in it or behind it is removed."""
    victim = cache.parent / "victim"
    victim.mkdir()
    (victim / "keep").write_text("root's\n")
    assert as_nobody(cache, f"os.symlink({str(victim)!r}, {layout.DROPPED!r})") == 0
    warm_state.sweep(str(cache))
    assert (victim / "keep").read_text() == "root's\n"


def test_a_cache_sealed_before_seals_were_roots_is_made_roots_at_the_converge(
    cache: Path, monkeypatch: Any
) -> None:
    """A warm marker written while the cache stayed the serve user's (before #36): the
    converge's ``seal_warm`` makes it root's, once; the seal still matches."""
    state = {"cache_root": str(cache)}
    with monkeypatch.context() as before:
        before.setattr(warm_state, "seal_tree", lambda cache_root, dirs: None)
        warm_state.mark_warm(state, FP, ["rbln/m/s"])
    bundle = cache / "rbln/m/s/rank0/mega_cache.bin"
    assert bundle.stat().st_uid == NOBODY.pw_uid
    warm_state.seal_warm(str(cache), [FP, "-", "ef" * 32])  # "-" compiles nothing; one not warm
    st = bundle.stat()
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, NOBODY.pw_gid, 0o640)
    changed = st.st_ctime_ns
    warm_state.seal_warm(str(cache), [FP])  # root's already: nothing changed
    assert bundle.stat().st_ctime_ns == changed
    record = content_check.cache_record(str(cache), FP)
    assert record is not None
    assert content_check.verify_cache(str(cache), record)["differ"] == []
