"""The hosts take uv from its wheel, by hash, instead of from the controller (#32 item 8): which
wheel (uvbin.uv_wheel, from a real index server), the lock's pin, the wheelhouse copy, and the
host program that unpacks it (install_release.ensure_uv, run as the host runs it)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_host import serving
from lab_sim_support import REPO, load

from servefleet.fleet.lab.index import Config, make_server
from servefleet.release import simpleindex, uvbin
from servefleet.release.lock import LOCK_FILE, load_lock, write_lock
from servefleet.release.stack import LockError, stack
from servefleet.release.wheelhouse import lock_files

INSTALLER = REPO / "src" / "servefleet" / "base" / "remote" / "install_release.py"
installer = load(INSTALLER, "servefleet_remote_install_release_uv")
VERSION = "0.13.9"
HOST_TAGS = "manylinux_2_17_x86_64.manylinux2014_x86_64"
BINARY = b"#!/bin/sh\necho uv-from-the-wheel\n"


def uv_wheel_bytes(version: str = VERSION, member: str | None = None) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        z.writestr(member or f"uv-{version}.data/scripts/uv", BINARY)
        z.writestr(f"uv-{version}.dist-info/METADATA", f"Name: uv\nVersion: {version}\n")
    return out.getvalue()


@pytest.fixture()
def index(tmp_path: Path) -> Iterator[str]:
    """A public index with uv wheels for several platforms, the hosts' among them."""
    root = tmp_path / "public"
    root.mkdir()
    for tags in (HOST_TAGS, "musllinux_1_1_x86_64", "macosx_11_0_arm64",
                 "manylinux_2_28_aarch64", "manylinux_2_28_x86_64"):  # fmt: skip
        (root / f"uv-{VERSION}-py3-none-{tags}.whl").write_bytes(uv_wheel_bytes() + tags.encode())
    (root / f"uv-0.13.8-py3-none-{HOST_TAGS}.whl").write_bytes(uv_wheel_bytes("0.13.8"))
    with serving(make_server(Config("simple", root), "127.0.0.1", 0)) as url:
        yield url + "/simple"


def test_the_hosts_wheel_is_the_version_for_manylinux_x86_64_with_the_lowest_glibc(
    index: str,
) -> None:
    uvbin.uv_wheel.cache_clear()
    wheel = uvbin.uv_wheel(index, VERSION)
    assert wheel is not None
    assert wheel["file"] == f"uv-{VERSION}-py3-none-{HOST_TAGS}.whl"
    assert wheel["version"] == VERSION and wheel["url"].endswith("/" + wheel["file"])
    assert len(wheel["sha256"]) == 64
    assert uvbin.uv_wheel(None) is None  # no public index: the deploy sends the binary
    with pytest.raises(simpleindex.PageError, match="no uv 9.9.9 wheel for manylinux x86_64"):
        uvbin.uv_wheel(index, "9.9.9")


def test_an_index_that_does_not_answer_is_unreachable_not_bad_data() -> None:
    from servefleet.base.errors import Unreachable
    from servefleet.base.remote import retry

    uvbin.uv_wheel.cache_clear()
    real = retry.attempts

    def once(try_once, tries=1, first_wait=0.0, sleep=None):  # type: ignore[no-untyped-def]
        return real(try_once, tries=1)

    retry.attempts, saved = once, real  # type: ignore[assignment]
    try:
        with pytest.raises(Unreachable, match="127.0.0.1:9/simple/uv/: not reachable"):
            uvbin.uv_wheel("http://127.0.0.1:9/simple", VERSION)
    finally:
        retry.attempts = saved  # type: ignore[assignment]


def test_the_lock_pins_the_wheel_and_the_wheelhouse_holds_it(tmp_path: Path, index: str) -> None:
    uvbin.uv_wheel.cache_clear()
    wheel = uvbin.uv_wheel(index, VERSION)
    st = stack("s", ["a==1"], [], [], index, ">=3.10", ["127.0.0.1"])
    write_lock(tmp_path, {st: 'lock-version = "1.0"\n'}, {}, {}, uv=wheel)
    lock = load_lock(tmp_path)
    assert lock.uv == wheel
    files, _ = lock_files(lock)
    assert [(f.path, f.sha256) for f in files] == [(f"packages/{wheel['file']}", wheel["sha256"])]  # type: ignore[index]
    doc = json.loads((tmp_path / LOCK_FILE).read_text())
    doc["uv"]["sha256"] = "not-a-hash"
    (tmp_path / LOCK_FILE).write_text(json.dumps(doc))
    with pytest.raises(LockError, match="uv: malformed"):
        load_lock(tmp_path)


def ensure(plan: dict[str, object], cwd: Path) -> subprocess.CompletedProcess[str]:
    """``ensure_uv`` as the host runs it: the host program's own module, in a child process."""
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); import install_release as i; "
        "i.ensure_uv(json.loads(sys.argv[2]))"
    )
    return subprocess.run([sys.executable, "-c", code, str(INSTALLER.parent), json.dumps(plan)],
                          cwd=cwd, capture_output=True, text=True, timeout=60)  # fmt: skip


def test_the_host_takes_uv_from_the_wheel_by_its_hash(tmp_path: Path, index: str) -> None:
    uvbin.uv_wheel.cache_clear()
    wheel = uvbin.uv_wheel(index, VERSION)
    assert wheel is not None
    dest = tmp_path / "lib" / f"uv-{VERSION}"
    dest.parent.mkdir()
    done = ensure({"uv": str(dest), "uv_wheel": wheel}, tmp_path)
    assert done.returncode == 0, done.stderr
    assert dest.read_bytes() == BINARY and oct(dest.stat().st_mode & 0o777) == "0o755"
    assert (
        subprocess.run([str(dest)], capture_output=True, text=True).stdout == "uv-from-the-wheel\n"
    )
    assert sorted(p.name for p in dest.parent.iterdir()) == [dest.name]  # no temporary left
    # there already: nothing is fetched (a wheel that no longer exists is never asked for)
    again = ensure(
        {"uv": str(dest), "uv_wheel": {**wheel, "url": "http://127.0.0.1:9/x.whl"}}, tmp_path
    )
    assert (again.returncode, again.stdout) == (0, "")


def test_a_wheel_with_another_hash_or_without_uv_places_nothing(tmp_path: Path) -> None:
    data = uv_wheel_bytes()
    wheel = tmp_path / f"uv-{VERSION}-py3-none-{HOST_TAGS}.whl"
    wheel.write_bytes(data)
    dest = tmp_path / f"uv-{VERSION}"
    source = {
        "version": VERSION,
        "path": str(wheel),
        "sha256": "0" * 64,
        "url": "",
        "file": wheel.name,
    }
    bad = ensure({"uv": str(dest), "uv_wheel": source}, tmp_path)
    assert bad.returncode == 1
    assert bad.stderr.strip() == (
        f"servefleet: {wheel}: sha256:{hashlib.sha256(data).hexdigest()}, the plan names "
        f"sha256:{'0' * 64}; uv not installed"
    )
    assert not dest.exists()
    other = uv_wheel_bytes(member="uv-0.13.9.data/scripts/uvx")
    wheel.write_bytes(other)
    source["sha256"] = hashlib.sha256(other).hexdigest()
    missing = ensure({"uv": str(dest), "uv_wheel": source}, tmp_path)
    assert missing.returncode == 1 and "no uv-0.13.9.data/scripts/uv in it" in missing.stderr
    assert sorted(os.listdir(tmp_path)) == [wheel.name]
    none = ensure({"uv": str(dest), "uv_wheel": None}, tmp_path)
    assert none.returncode == 1 and "no uv wheel is named" in none.stderr
