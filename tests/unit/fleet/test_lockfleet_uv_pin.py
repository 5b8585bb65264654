"""#53: a lock does not depend on which uv the controller has today. The hosts run the uv the
lock pins; ``lock --check`` passes under another uv patch release; re-locking under it keeps the
pin when it resolves each unchanged stack the same, and refuses in one line when it does not;
``--move-uv`` is the explicit step that pins the controller's uv.

The stack is resolved for real (the project's uv, conftest.py's local ``index``); only the
controller's uv *version* and the public index's uv wheel are stood in."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from host_inputs import defaults
from local_indexes import OWNER_LOGIN

from servefleet.fleet import lockfleet
from servefleet.release import plan as release_plan
from servefleet.release.lock import LOCK_FILE, load_lock
from servefleet.release.stack import LockError, Stack, stack

OLD, NEW = "0.13.9", "0.13.10"


def wheel(index: str | None, version: str | None = None) -> dict[str, Any]:
    """The public index's uv wheel of ``version`` (default: the controller's), as uv_wheel
    answers; the file and digest name the version, so a moved pin shows in the bytes."""
    v = version or lockfleet.uv_version()
    name = f"uv-{v}-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"
    return {"version": v, "file": name, "url": f"{index}/../files/{name}", "sha256": v[-1] * 64}


def controller_uv(monkeypatch: pytest.MonkeyPatch, version: str) -> None:
    monkeypatch.setattr(lockfleet, "uv_version", lambda: version)
    monkeypatch.setattr(release_plan, "uv_version", lambda: version)


def fleet(
    index: dict[str, str], lock_dir: Path, constraints: tuple[str, ...] = ("sfdep==1.0",)
) -> lockfleet.FleetLock:
    st: Stack = stack(
        name="test",
        requirements=["sfowned==1.0", "sfpub==1.0"],
        constraints=constraints,
        indexes=[{"name": "owner", "url": index["owner"], "packages": ("sfowned",), "auth": True}],
        public_index=index["public"],
        python=">=3.10",
        trusted_hosts=["127.0.0.1"],
    )
    creds = SimpleNamespace(index_user=OWNER_LOGIN[0], index_password=OWNER_LOGIN[1])
    return lockfleet.FleetLock(lock_dir, {st: creds}, {}, {}, {})  # type: ignore[dict-item]


def files(lock_dir: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(lock_dir.iterdir())}


@pytest.fixture()
def locked(
    index: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> lockfleet.FleetLock:
    """A lock made under uv 0.13.9."""
    monkeypatch.setattr(lockfleet, "uv_wheel", wheel)
    controller_uv(monkeypatch, OLD)
    fl = fleet(index, tmp_path / "lock")
    lockfleet.make_lock(fl, lambda _: None)
    assert load_lock(fl.lock_dir).uv["version"] == OLD  # type: ignore[index]
    return fl


def test_a_lock_made_under_one_uv_passes_check_and_relocks_the_same_under_another(
    locked: lockfleet.FleetLock, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = files(locked.lock_dir)
    controller_uv(monkeypatch, NEW)
    assert lockfleet.check_lock(locked) == []  # the hosts would install the same
    lines: list[str] = []
    lockfleet.make_lock(locked, lines.append)
    assert files(locked.lock_dir) == before  # the same resolution: the pin stays, same bytes
    assert f"uv {OLD}: uv-{OLD}-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl" in lines


def test_a_uv_that_resolves_an_unchanged_stack_otherwise_is_refused_in_one_line(
    locked: lockfleet.FleetLock, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = files(locked.lock_dir)
    release = load_lock(locked.lock_dir).stacks["test"].release
    controller_uv(monkeypatch, NEW)
    real = lockfleet.resolve

    def otherwise(st: Stack, user: str | None, password: str | None) -> str:
        """Another uv's resolution: sfdep at another version."""
        text = real(st, user, password)
        return text.replace('name = "sfdep"\nversion = "1.0"', 'name = "sfdep"\nversion = "2.0"')

    monkeypatch.setattr(lockfleet, "resolve", otherwise)
    with pytest.raises(LockError) as refused:
        lockfleet.make_lock(locked, lambda _: None)
    line = str(refused.value)
    assert "\n" not in line
    assert line == (
        f"stack test: uv {NEW} resolves its unchanged inputs to other versions than uv {OLD} "
        "(the lock's) did (-sfdep==1.0, +sfdep==2.0); to move the lock to uv 0.13.10, run "
        "`servefleet lock INVENTORY --move-uv`"
    )
    assert files(locked.lock_dir) == before  # nothing written
    assert lockfleet.check_lock(locked) == []  # and the lock still serves the hosts

    lockfleet.make_lock(locked, lambda _: None, move_uv=True)  # the explicit step
    moved = load_lock(locked.lock_dir)
    assert moved.uv["version"] == NEW  # type: ignore[index]
    assert moved.stacks["test"].release != release


def test_a_file_the_index_serves_with_other_bytes_is_relocked_under_the_pin(
    locked: lockfleet.FleetLock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same versions with another file hash: the index's change (it shows in the lock's
    diff), not the uv's; the lock keeps its uv."""
    release = load_lock(locked.lock_dir).stacks["test"].release
    controller_uv(monkeypatch, NEW)
    real = lockfleet.resolve

    def rehashed(st: Stack, user: str | None, password: str | None) -> str:
        text = real(st, user, password)
        digest = re.search(r'sha256 = "([0-9a-f]{64})"', text)
        assert digest
        return text.replace(digest[1], "0" * 64, 1)

    monkeypatch.setattr(lockfleet, "resolve", rehashed)
    lockfleet.make_lock(locked, lambda _: None)
    lock = load_lock(locked.lock_dir)
    assert lock.uv["version"] == OLD  # type: ignore[index]
    assert lock.stacks["test"].release != release


def test_changed_inputs_are_resolved_by_the_controllers_uv_under_the_locked_pin(
    locked: lockfleet.FleetLock, index: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stack whose inputs changed has no earlier resolution to compare: it is resolved anew
    by the controller's uv, and the hosts keep the pinned uv."""
    controller_uv(monkeypatch, NEW)
    changed = fleet(index, locked.lock_dir, constraints=("sfdep==2.0",))
    lockfleet.make_lock(changed, lambda _: None)
    lock = load_lock(locked.lock_dir)
    assert lock.uv["version"] == OLD  # type: ignore[index]
    assert lock.stacks["test"].inputs["constraints"] == ["sfdep==2.0"]


def test_the_hosts_run_the_uv_the_lock_pins_not_the_controllers(
    locked: lockfleet.FleetLock, monkeypatch: pytest.MonkeyPatch
) -> None:
    controller_uv(monkeypatch, NEW)
    settings = defaults(sdk_installer="uv", sdk_lock=str(locked.lock_dir), serve_root="/opt/sf")
    assert release_plan.host_uv_version(settings) == OLD
    assert release_plan.host_uv_path(settings) == f"/opt/sf/lib/uv-{OLD}"
    source = release_plan.uv_source(settings)
    assert source is not None and source["version"] == OLD
    assert source == json.loads((locked.lock_dir / LOCK_FILE).read_text())["uv"]
    unlocked = defaults(sdk_installer="uv", serve_root="/opt/sf", pip_public_index=None)
    assert (
        release_plan.host_uv_path(unlocked) == f"/opt/sf/lib/uv-{NEW}"
    )  # no lock: the controller's
    assert release_plan.host_uv_path(defaults(sdk_installer="pip")) is None
