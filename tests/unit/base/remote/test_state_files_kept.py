"""src/servefleet/base/remote/state_files.py in-process (#37): a host's kept states and what they
keep. ``good.json`` without texts and stale units, ``previous.json`` only when the new good state
runs other units, a rollback's swap, the states' JSON (sorted, one-space indent, a newline), the
kept unit texts by sha (never rewritten), ``current`` pointed by rename (a leftover
``current.new`` replaced), the lock one run holds at a time, and what ``clean_up`` removes: a
release nothing names (with its plan), a set-aside release only once expired, a kept unit text
no state names; what it keeps: ``current``, the states' releases and their router's, every
release a unit on disk names."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from repo_paths import REMOTE

sys.path.insert(0, str(REMOTE))
import layout  # noqa: E402
import state_files  # noqa: E402
import systemd_units  # noqa: E402


def _inst(sha: str, unit: str = "servefleet-vllm-0.service") -> dict[str, Any]:
    return {"unit": unit, "sha": sha, "port": 8000, "text": f"[Service]\n# {sha}\n"}


def _state(release: str, *shas: str, router: str | None = None) -> dict[str, Any]:
    state: dict[str, Any] = {
        "release": release,
        "instances": [_inst(s, f"servefleet-vllm-{i}.service") for i, s in enumerate(shas)],
        "stale": ["servefleet-vllm-9.service"],
    }
    if router:
        state["router"] = {"release": router, "sha": "r0"}
    return state


@pytest.fixture
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """serve_root/state, and a unit directory of the test's own (empty)."""
    units = tmp_path / "units"
    units.mkdir()
    monkeypatch.setattr(systemd_units, "UNIT_DIR", units)
    return tmp_path / "root" / layout.STATE


# --- states --------------------------------------------------------------------------------------
def test_load_gives_none_for_a_missing_or_broken_state(tmp_path: Path) -> None:
    assert state_files.load(tmp_path / "none.json") is None
    (tmp_path / "bad.json").write_text("{not json")
    assert state_files.load(tmp_path / "bad.json") is None
    (tmp_path / "good.json").write_text('{"a": [1]}')
    assert state_files.load(tmp_path / "good.json") == {"a": [1]}


def test_a_state_is_written_sorted_indented_and_ended(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    state_files.write_state(path, {"b": 1, "a": [2]})
    assert path.read_text() == '{\n "a": [\n  2\n ],\n "b": 1\n}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.json"]


def test_record_good_drops_texts_and_stale_and_keeps_previous_only_on_a_change(
    state_dir: Path,
) -> None:
    state_dir.mkdir(parents=True)
    state_files.record_good(state_dir, _state("r1", "a1"))
    good = json.loads((state_dir / layout.GOOD).read_text())
    assert good == {"release": "r1", "instances": [
        {"unit": "servefleet-vllm-0.service", "sha": "a1", "port": 8000}]}  # fmt: skip
    assert not (state_dir / layout.PREVIOUS).exists()  # no good state before it
    state_files.record_good(state_dir, _state("r2", "a1"))  # the same units: no previous
    assert not (state_dir / layout.PREVIOUS).exists()
    assert json.loads((state_dir / layout.GOOD).read_text())["release"] == "r2"
    state_files.record_good(state_dir, _state("r3", "b2"))
    assert json.loads((state_dir / layout.PREVIOUS).read_text())["release"] == "r2"
    assert json.loads((state_dir / layout.GOOD).read_text())["release"] == "r3"
    state_files.record_good(state_dir, _state("r4", "b2", "c3"))  # one unit more: a change
    assert json.loads((state_dir / layout.PREVIOUS).read_text())["release"] == "r3"


def test_record_rollback_swaps_good_and_previous(state_dir: Path) -> None:
    state_dir.mkdir(parents=True)
    good, target = {"release": "r2", "instances": []}, {"release": "r1", "instances": []}
    state_files.record_rollback(state_dir, good, target)
    assert json.loads((state_dir / layout.GOOD).read_text()) == target
    assert json.loads((state_dir / layout.PREVIOUS).read_text()) == good


def test_unit_texts_are_kept_by_sha_once_and_restored_from_there(state_dir: Path) -> None:
    state_files.keep_units(state_dir, _state("r1", "a1", "b2"))
    kept = state_dir / layout.KEPT_UNITS
    assert sorted(p.name for p in kept.iterdir()) == ["a1.service", "b2.service"]
    assert (kept / "a1.service").read_text() == "[Service]\n# a1\n"
    (kept / "a1.service").write_text("as it was kept\n")
    state_files.keep_units(state_dir, _state("r1", "a1"))
    assert (kept / "a1.service").read_text() == "as it was kept\n"  # never rewritten
    target: dict[str, Any] = {
        "release": "r1",
        "instances": [{"unit": "u0", "sha": "a1"}, {"unit": "u1", "sha": "b2"}],
    }
    assert state_files.kept_instances(state_dir, target) == [
        {"unit": "u0", "sha": "a1", "text": "as it was kept\n"},
        {"unit": "u1", "sha": "b2", "text": "[Service]\n# b2\n"},
    ]
    target["instances"].append({"unit": "u2", "sha": "c3"})
    with pytest.raises(systemd_units.Failed) as got:
        state_files.kept_instances(state_dir, target)
    assert str(got.value) == f"cannot restore u2: {kept / 'c3.service'} is missing"


# --- current -------------------------------------------------------------------------------------
def test_current_is_pointed_by_rename(tmp_path: Path) -> None:
    state_files.point_current(tmp_path, "r1")
    assert os.readlink(tmp_path / layout.CURRENT) == f"{layout.RELEASES}/r1"
    (tmp_path / layout.CURRENT_NEW).write_text("left by a killed run")
    state_files.point_current(tmp_path, "r2")
    assert os.readlink(tmp_path / layout.CURRENT) == f"{layout.RELEASES}/r2"
    assert sorted(p.name for p in tmp_path.iterdir()) == [layout.CURRENT]


def test_current_already_there_is_left_alone(tmp_path: Path) -> None:
    state_files.point_current(tmp_path, "r1")
    before = (tmp_path / layout.CURRENT).lstat().st_ino
    (tmp_path / layout.CURRENT_NEW).write_text("a leftover the early return leaves")
    state_files.point_current(tmp_path, "r1")
    assert (tmp_path / layout.CURRENT).lstat().st_ino == before
    assert (tmp_path / layout.CURRENT_NEW).exists()


# --- the lock ------------------------------------------------------------------------------------
def test_one_run_holds_the_state_lock_at_a_time(tmp_path: Path) -> None:
    """Held: another open of the lock file cannot take it; released: it can."""
    state_dir = tmp_path / "made" / "state"

    def free() -> bool:
        with open(state_dir / layout.STATE_LOCK) as other:
            try:
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            fcntl.flock(other, fcntl.LOCK_UN)
            return True

    with state_files.state_lock(state_dir):
        assert (state_dir / layout.STATE_LOCK).is_file()
        assert not free()
    assert free()


# --- clean_up ------------------------------------------------------------------------------------
def _releases(root: Path, *names: str) -> None:
    for name in names:
        (root / layout.RELEASES / name).mkdir(parents=True)
        (root / layout.PLANS).mkdir(exist_ok=True)
        (root / layout.PLANS / f"{name}.json").write_text("{}")


def test_clean_up_keeps_what_something_names_and_removes_the_rest(
    state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = state_dir.parent
    state_dir.mkdir(parents=True)
    _releases(root, "a0", "b1", "c2", "d3", "e4", "f5", "0a0")
    state_files.write_state(state_dir / layout.GOOD, _state("b1", "s1", router="c2"))
    state_files.write_state(state_dir / layout.PREVIOUS, _state("d3", "s2"))
    os.symlink(f"{layout.RELEASES}/e4", root / layout.CURRENT)
    units = systemd_units.UNIT_DIR
    (units / "servefleet-vllm-0.service").write_text(f"ExecStart={root}/releases/f5/bin/vllm\n")
    (units / layout.ROUTER_UNIT).write_text(f"ExecStart={root}/releases/0a0/bin/router\n")
    (units / "other.service").write_text(f"ExecStart={root}/releases/a0/bin/x\n")  # not ours
    kept = state_dir / layout.KEPT_UNITS
    kept.mkdir()
    for sha in ("s1", "s2", "s3"):
        (kept / f"{sha}.service").write_text(sha)
    state_files.clean_up(state_dir)
    assert sorted(p.name for p in (root / layout.RELEASES).iterdir()) == [
        "0a0", "b1", "c2", "d3", "e4", "f5"
    ]  # fmt: skip
    assert sorted(p.name for p in (root / layout.PLANS).iterdir()) == [
        "0a0.json", "b1.json", "c2.json", "d3.json", "e4.json", "f5.json"
    ]  # fmt: skip
    assert sorted(p.name for p in kept.iterdir()) == ["s1.service", "s2.service"]
    assert capsys.readouterr().out == "release a0: removed (no unit or state names it)\n"


def test_the_units_name_releases_by_their_hex_id(state_dir: Path) -> None:
    units = systemd_units.UNIT_DIR
    (units / "servefleet-vllm-0.service").write_text("x /releases/ab12/bin y /releases/cd34/z\n")
    (units / "servefleet-vllm-1.service").write_text("/releases/XY/ /releases/ef/\n")
    (units / layout.ROUTER_UNIT).write_text("/releases/99/bin\n")
    (units / "servefleet-vllm-2.service").mkdir()  # unreadable as a file: skipped
    assert state_files.released_in_units() == {"ab12", "cd34", "ef", "99"}


def test_a_release_without_good_or_previous_state_or_plan_goes(
    state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = state_dir.parent
    (root / layout.RELEASES / "a1").mkdir(parents=True)
    state_files.clean_up(state_dir)  # no state dir, no plans, no kept units, no current
    assert list((root / layout.RELEASES).iterdir()) == []
    assert capsys.readouterr().out == "release a1: removed (no unit or state names it)\n"


def test_a_set_aside_release_is_kept_until_it_expires(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = state_dir.parent
    aside = f"a1{layout.TAMPERED}2026-01-01T00:00:00"
    _releases(root, aside)
    made = (root / layout.RELEASES / aside).lstat().st_ctime
    now = [made + layout.TAMPERED_KEEP]  # exactly its keep: not expired yet
    monkeypatch.setattr(state_files.time, "time", lambda: now[0])
    state_files.clean_up(state_dir)
    assert (root / layout.RELEASES / aside).is_dir()
    now[0] = made + layout.TAMPERED_KEEP + 1
    state_files.clean_up(state_dir)
    assert not (root / layout.RELEASES / aside).exists()
    assert not (root / layout.PLANS / f"{aside}.json").exists()


def test_a_release_gone_meanwhile_is_not_expired(tmp_path: Path) -> None:
    assert state_files._expired(tmp_path / "gone") is False


def test_clean_up_without_releases_removes_only_unnamed_kept_units(state_dir: Path) -> None:
    (state_dir / layout.KEPT_UNITS).mkdir(parents=True)
    (state_dir / layout.KEPT_UNITS / "old.service").write_text("old")
    state_files.clean_up(state_dir)  # no releases directory: nothing to remove there
    assert list((state_dir / layout.KEPT_UNITS).iterdir()) == []


def test_a_set_aside_release_kept_does_not_stop_the_clean_up(state_dir: Path) -> None:
    root = state_dir.parent
    aside = f"a1{layout.TAMPERED}2026-01-01T00:00:00"  # sorts before b2, and is kept
    _releases(root, aside, "b2")
    state_files.clean_up(state_dir)
    assert sorted(p.name for p in (root / layout.RELEASES).iterdir()) == [aside]


def test_a_release_that_cannot_be_removed_is_left_and_the_rest_goes(
    state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Best effort: a release root cannot remove whole (an immutable file in it) keeps what is
    left, and the clean-up goes on."""
    root = state_dir.parent
    _releases(root, "a1", "b2")
    stuck = root / layout.RELEASES / "a1" / "stuck"
    stuck.write_text("immutable")
    if subprocess.run(["chattr", "+i", str(stuck)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not available here")
    try:
        state_files.clean_up(state_dir)
        assert sorted(p.name for p in (root / layout.RELEASES).iterdir()) == ["a1"]
        assert sorted(p.name for p in (root / layout.RELEASES / "a1").iterdir()) == ["stuck"]
    finally:
        subprocess.run(["chattr", "-i", str(stuck)], check=True)
    assert capsys.readouterr().out == (
        "release a1: removed (no unit or state names it)\n"
        "release b2: removed (no unit or state names it)\n"
    )
