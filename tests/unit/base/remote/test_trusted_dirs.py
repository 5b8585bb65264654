"""Root's warm markers in the serve user's cache root (#18 findings 3 and 5), with ``nobody``
standing in for a hostile serve user: what it plants is never followed, never trusted, and the
sentinels it points at stay as they were."""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from as_nobody import as_nobody
from repo_paths import REMOTE

sys.path.insert(0, str(REMOTE))
import probe  # noqa: E402
import trusted  # noqa: E402
import warm_state  # noqa: E402

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (chown to nobody)")
BUILT = "compile only (RBLN-CR13)"  # a compile-only build's marker: what pack takes
FP = "ab" * 32


def _sentinel(path: Path) -> tuple[int, int, str]:
    st = path.lstat()
    return st.st_uid, st.st_mode, hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def tree() -> Iterator[dict[str, Path]]:
    """A root-owned parent (0755: pytest's own are 0700), the serve user's cache root in it,
    and a root-only sentinel."""
    nobody = pwd.getpwnam("nobody")
    tmp_path = Path(tempfile.mkdtemp(prefix="servefleet-trusted-"))
    tmp_path.chmod(0o755)
    cache = tmp_path / "cache"
    cache.mkdir()
    os.chown(cache, nobody.pw_uid, nobody.pw_gid)
    secret = tmp_path / "root-only"
    secret.write_text("root's\n")
    secret.chmod(0o600)
    try:
        yield {"cache": cache, "secret": secret, "base": tmp_path}
    finally:
        shutil.rmtree(tmp_path)


def _as_nobody_plant(cache: Path, build: str) -> None:
    """Run ``build`` (Python, cwd = the cache root) as nobody; it must run through."""
    assert as_nobody(cache, build) == 0


def test_a_planted_tmp_link_is_not_written_through(tree: dict[str, Path]) -> None:
    cache, secret = tree["cache"], tree["secret"]
    state = {"cache_root": str(cache)}
    warm_state.mark_warm(state, FP, ["rbln/m/s"])  # root's own warm directory exists now
    before = _sentinel(secret)
    # the serve user cannot write in root's directory, so it replaces the directory itself
    plant = (f"os.rename('servefleet-warm', 'moved'); os.mkdir('servefleet-warm');"
             f"os.symlink({str(secret)!r}, 'servefleet-warm/{FP}.tmp');"
             f"os.symlink({str(secret)!r}, 'servefleet-warm/.{FP}.tmp-1')")  # fmt: skip
    _as_nobody_plant(cache, plant)
    assert warm_state.is_cold(state, {"fingerprint": FP})  # its directory never counts
    warm_state.mark_warm(state, FP, ["rbln/m/s"])
    assert _sentinel(secret) == before
    warm = cache / "servefleet-warm"
    assert warm.lstat().st_uid == 0 and not warm.is_symlink()
    assert json.loads((warm / FP).read_text())["dirs"] == ["rbln/m/s"]
    assert [p.name for p in cache.iterdir() if p.name.startswith("servefleet-warm.untrusted-")]


def test_a_linked_or_foreign_warm_directory_is_not_warm(
    tree: dict[str, Path], tmp_path: Path
) -> None:
    cache = tree["cache"]
    fake = tmp_path / "root-dir"
    fake.mkdir()
    (fake / FP).write_text("{}\n")  # a root-owned directory with a marker in it
    state = {"cache_root": str(cache)}
    _as_nobody_plant(cache, f"os.symlink({str(fake)!r}, 'servefleet-warm')")
    assert warm_state.is_cold(state, {"fingerprint": FP})
    assert probe.warm_markers(str(cache)) == []
    assert warm_state.warm_record(state, FP) is None
    _as_nobody_plant(cache, f"os.unlink('servefleet-warm'); os.mkdir('servefleet-warm');"
                            f"open('servefleet-warm/{FP}', 'w').write('{{}}')")  # fmt: skip
    assert warm_state.is_cold(state, {"fingerprint": FP})
    assert probe.warm_markers(str(cache)) == []
    warm_state.mark_warm(state, FP, [])
    assert probe.warm_markers(str(cache)) == [FP] and not warm_state.is_cold(
        state, {"fingerprint": FP}
    )


def test_the_fetcher_never_chowns_or_writes_through_a_planted_model_directory(
    tree: dict[str, Path],
) -> None:
    import refusal
    import snapshot_place

    hub, secret = tree["cache"], tree["secret"]  # the serve user's hub
    victim = tree["base"] / "etc"
    victim.mkdir()
    (victim / "shadow").write_text("root:x\n")
    before = [_sentinel(victim / "shadow"), _sentinel(secret)]
    repo = "models--org--name"
    _as_nobody_plant(hub, f"os.symlink({str(victim)!r}, {repo!r});"
                          f"os.makedirs('.locks'); os.symlink({str(victim)!r}, '.locks/{repo}')")  # fmt: skip
    for step in (
        lambda: snapshot_place.give(hub / repo, 65534, 65534),
        lambda: snapshot_place.give(hub / ".locks" / repo, 65534, 65534),
        lambda: snapshot_place.mark_complete(hub / repo, "a" * 40, 65534, 65534),
        lambda: snapshot_place.point_main(hub / repo, "a" * 40, 65534, 65534),
    ):
        with pytest.raises(refusal.Refusal, match="not a directory"):
            step()
    assert victim.stat().st_uid == 0 and sorted(p.name for p in victim.iterdir()) == ["shadow"]
    assert [_sentinel(victim / "shadow"), _sentinel(secret)] == before
    # a real tree is given to the serve user, links chowned, nothing behind them
    real = hub / "models--org--real"
    (real / "snapshots").mkdir(parents=True)
    (real / "snapshots" / "out").symlink_to(secret)
    snapshot_place.give(real, 65534, 65534)
    assert (real / "snapshots").stat().st_uid == 65534
    assert (real / "snapshots" / "out").lstat().st_uid == 65534 and secret.stat().st_uid == 0
    snapshot_place.mark_complete(real, "b" * 40, 65534, 65534)
    assert (real / ".servefleet-complete").read_text() == "b" * 40


@pytest.mark.parametrize("bad", ["rbln/../..", "rbln/m/..", "rbln/./s", "rbln/m/s/x"])
def test_a_cache_directory_never_climbs_out(tree: dict[str, Path], bad: str) -> None:
    import prewarm

    state = {"cache_root": str(tree["cache"])}
    warm_state.mark_warm(state, FP, [bad], source=BUILT)
    with pytest.raises(prewarm.NoCopy, match="names no cache directory"):
        prewarm.marker_dirs(tree["cache"], FP)
    manifest = {"fingerprint": FP, "dirs": [bad], "files": {}}
    with pytest.raises(prewarm.NoCopy, match="not one of fingerprint"):
        prewarm._check_manifest(manifest, FP)
    warm_state.mark_warm(state, FP, ["rbln/m/s"], source=BUILT)
    assert prewarm.marker_dirs(tree["cache"], FP)[0] == ["rbln/m/s"]


def test_pack_never_follows_the_serve_users_links(tree: dict[str, Path]) -> None:
    import prewarm

    cache, secret = tree["cache"], tree["secret"]
    state = {"cache_root": str(cache)}
    root_only = tree["base"] / "root-only-dir"
    (root_only / "m" / "s").mkdir(parents=True)
    (root_only / "m" / "s" / "key").write_text("root's own\n")
    warm_state.mark_warm(state, FP, ["rbln/m/s"], source=BUILT)
    out = tree["base"] / "out" / f"{FP}.tar"
    # cache/rbln -> a root-only tree: nothing of it is packed
    _as_nobody_plant(cache, f"os.symlink({str(root_only)!r}, 'rbln')")
    with pytest.raises(prewarm.NoCopy, match="not a directory"):
        prewarm.pack(cache, FP, out)
    # a link inside the cache directory, to a root-only file: refused, not read
    _as_nobody_plant(cache, f"os.unlink('rbln'); os.makedirs('rbln/m/s');"
                            f"os.symlink({str(secret)!r}, 'rbln/m/s/mega_cache.bin')")  # fmt: skip
    with pytest.raises(prewarm.NoCopy, match="not a regular file"):
        prewarm.pack(cache, FP, out)
    assert not out.exists()


def test_the_seal_and_the_pack_walk_the_cache_alike(tree: dict[str, Path]) -> None:
    """One walk (trusted.each_file) for both: the pack's files are the seal's digests, and a
    fifo the serve user plants stops both, named, without blocking on it."""
    import prewarm
    import trusted

    cache = tree["cache"]
    state = {"cache_root": str(cache)}
    _as_nobody_plant(cache, "os.makedirs('rbln/m/s/sub'); open('rbln/m/s/a', 'w').write('a');"
                            "open('rbln/m/s/sub/b', 'w').write('bb')")  # fmt: skip
    warm_state.mark_warm(state, FP, ["rbln/m/s"], source=BUILT)
    out = tree["base"] / "out" / f"{FP}.tar"
    out.parent.mkdir()
    prewarm.pack(cache, FP, out)
    files = json.loads(Path(f"{out}.json").read_text())["files"]
    fd = os.open(cache / "rbln" / "m" / "s", os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert (
            files
            == trusted.digests(fd, "rbln/m/s")
            == {
                "rbln/m/s/a": [1, hashlib.sha256(b"a").hexdigest()],
                "rbln/m/s/sub/b": [2, hashlib.sha256(b"bb").hexdigest()],
            }
        )
        # sealed, the tree is root's: the serve user can plant nothing in it; a fifo root's
        # own process left there (or one the serve user made before the seal) stops both
        assert as_nobody(cache, "os.mkfifo('rbln/m/s/sub/fifo')") == 1
        os.mkfifo(cache / "rbln/m/s/sub/fifo")
        with pytest.raises(trusted.NotRegular, match="rbln/m/s/sub/fifo: not a regular file"):
            trusted.digests(fd, "rbln/m/s")
        os.unlink(cache / "rbln/m/s/sub/fifo")
        os.symlink("/etc", cache / "rbln/m/s/sub/etc")  # a link to a directory: named too
        with pytest.raises(trusted.NotRegular, match="rbln/m/s/sub/etc: not a regular file"):
            trusted.digests(fd, "rbln/m/s")
        os.unlink(cache / "rbln/m/s/sub/etc")
        os.mkfifo(cache / "rbln/m/s/sub/fifo")
    finally:
        os.close(fd)
    with pytest.raises(prewarm.NoCopy, match="rbln/m/s/sub/fifo: not a regular file"):
        prewarm.pack(cache, FP, out)


def test_unpack_never_writes_through_a_planted_incoming_directory(tree: dict[str, Path]) -> None:
    import prewarm

    warm_cache = tree["base"] / "warm"
    (warm_cache / "rbln" / "m" / "s" / "rank0").mkdir(parents=True)
    (warm_cache / "rbln" / "m" / "s" / "rank0" / "mega_cache.bin").write_bytes(b"bundle")
    warm_state.mark_warm({"cache_root": str(warm_cache)}, FP, ["rbln/m/s"], source=BUILT)
    out = tree["base"] / "copies" / f"{FP}.tar"
    prewarm.pack(warm_cache, FP, out)
    cache, victim = tree["cache"], tree["base"] / "victim"
    victim.mkdir()
    _as_nobody_plant(cache, f"os.symlink({str(victim)!r}, '.servefleet-incoming');"
                            f"os.makedirs('rbln/m'); os.symlink({str(victim)!r}, 'rbln/m/s')")  # fmt: skip
    prewarm.unpack(cache, FP, out, "nobody")
    assert list(victim.iterdir()) == [] and victim.stat().st_uid == 0
    bundle = cache / "rbln" / "m" / "s" / "rank0" / "mega_cache.bin"
    st = bundle.stat()  # in place, sealed: root's, readable by the serve user's group
    assert bundle.read_bytes() == b"bundle" and (st.st_uid, st.st_gid, st.st_mode & 0o777) == (
        0,
        pwd.getpwnam("nobody").pw_gid,
        0o640,
    )
    assert not (cache / "rbln" / "m" / "s").is_symlink()
    assert not warm_state.is_cold({"cache_root": str(cache)}, {"fingerprint": FP})


def test_the_fetcher_refuses_a_hub_swapped_for_a_link(
    tree: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    import fetch_model

    hf_home, victim = tree["cache"], tree["base"] / "victim"
    victim.mkdir()
    _as_nobody_plant(hf_home, f"os.symlink({str(victim)!r}, 'hub')")
    argv = ["--archive", str(tree["base"] / "none.tar.gz"), "--sha256", "0" * 64, "--",
            "org/name", str(hf_home), "nobody"]  # fmt: skip
    assert fetch_model.main(argv) != 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{hf_home}/hub" in err and "not a directory" in err, err
    assert list(victim.iterdir()) == [] and victim.stat().st_uid == 0


def test_a_walk_follows_roots_own_links_only(tree: dict[str, Path]) -> None:
    """The walk from ``/`` follows a link root owns in a directory only root writes (a system's
    ``/var -> /private/var``), and no other: not the serve user's link in its own tree, nor a
    root-owned link in a directory the serve user can write (it could rename it away and plant
    its own), nor the components above a path's last (``open_dir`` once followed those)."""
    base, cache = tree["base"], tree["cache"]
    (base / "real" / "sub").mkdir(parents=True)
    (base / "var").symlink_to("real")  # root's, in a root-only directory
    (base / "abs").symlink_to(base / "real")
    for path in (f"{base}/var/sub", f"{base}/abs/sub"):
        fd = trusted.open_path(path)
        try:
            assert os.fstat(fd).st_ino == (base / "real" / "sub").stat().st_ino
        finally:
            os.close(fd)
    # the serve user's link in its cache root, pointing at root's directory: refused
    _as_nobody_plant(cache, f"os.symlink({str(base / 'real')!r}, 'mine')")
    with pytest.raises(OSError, match="mine is not a directory"):
        trusted.open_path(f"{cache}/mine/sub")
    assert trusted.open_dir(f"{cache}/mine/sub") is None
    # a root-owned link in the serve user's directory: refused as well
    os.symlink(base / "real", cache / "roots")
    with pytest.raises(OSError, match="roots is not a directory"):
        trusted.open_path(f"{cache}/roots/sub")
    # a loop of root's links ends in one OSError
    (base / "loop1").symlink_to("loop2")
    (base / "loop2").symlink_to("loop1")
    with pytest.raises(OSError, match="is not a directory"):
        trusted.open_path(f"{base}/loop1")


def test_a_planted_link_in_roots_place_is_removed_and_a_directory_left(
    tree: dict[str, Path],
) -> None:
    """What the serve user put in place of root's directory is moved aside; a link (or file) is
    then removed (unlinkat follows no link: its target is untouched), a directory is left as
    ``.untrusted-*`` for the serve user to remove."""
    cache, secret = tree["cache"], tree["secret"]
    state = {"cache_root": str(cache)}
    before = _sentinel(secret)
    _as_nobody_plant(cache, f"os.symlink({str(secret)!r}, 'servefleet-warm')")
    warm_state.mark_warm(state, FP, [], source=BUILT)
    assert _sentinel(secret) == before
    assert not [p for p in cache.iterdir() if ".untrusted-" in p.name]
    _as_nobody_plant(cache, "os.rename('servefleet-warm', 'x'); os.mkdir('servefleet-warm')")
    warm_state.mark_warm(state, FP, [], source=BUILT)
    left = [p for p in cache.iterdir() if ".untrusted-" in p.name]
    assert len(left) == 1 and left[0].is_dir() and left[0].stat().st_uid != 0
