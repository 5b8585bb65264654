"""#31 finding 2 on the lab: a hostile sdist on the lab's public index, in place of the
arctic-inference sdist that suffix decoding needs, with dynamic metadata and a build backend that
looks for the lab's secrets (the index password, the hub token, the API and router admin keys)
in its environment, in every ``/proc/<pid>/environ`` and ``cmdline`` it can read, and in the
lab's SSH key and secrets files. ``servefleet lock`` must build it for its metadata, and a
deploy's controller builds its wheel (the hosts never build): both with every secret in the
controller's environment, as an operator runs them. The backend runs both times and finds
nothing."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from faults import REPO, run, secrets
from hostile_sdist import hostile_sdist, report_dir, reports

from servefleet.base import sandbox
from servefleet.fleet.lab import layout
from servefleet.release.pylock import packages

SERVEFLEET = str(Path(sys.executable).parent / "servefleet")
SUFFIX = ("--data", "serve_selection=spec_decode=suffix")


@pytest.fixture()
def hostile(lab: dict[str, Any], tmp_path: Path) -> Iterator[Path]:
    """The public index serves a hostile arctic-inference 0.1.1 sdist; the lab's own is put back
    afterwards (the index's files are hard links to the built artifacts: moved, never written)."""
    public = Path(lab["index_roots"]["public"])
    (original,) = public.glob("arctic_inference-0.1.1.tar.gz")
    kept = tmp_path / "kept"
    kept.mkdir()
    shutil.move(str(original), kept / original.name)
    report = report_dir()
    files = [layout.STATE_SSH / "id_ed25519", *layout.STATE_SECRETS.glob("*")]
    try:
        hostile_sdist(
            public, report, secrets(lab).values(), files, name="arctic-inference", version="0.1.1"
        )
        yield report
    finally:
        (public / original.name).unlink(missing_ok=True)
        shutil.move(str(kept / original.name), public / original.name)
        shutil.rmtree(report, ignore_errors=True)


def assert_found_nothing(report: Path, hook: str) -> None:
    found = reports(report)
    assert {r["hook"] for r in found} >= {hook}, f"the backend's {hook} never ran: {found}"
    for r in found:
        assert r["found"] == [], r
        assert r["uid"] == sandbox.build_ids()[0]  # type: ignore[index]  # the lab runs as root
        assert len(r["procs"]) < 40  # its own namespace, not the controller's processes


def test_a_hostile_sdist_finds_no_secret_in_lock_or_in_the_controller_build(
    lab: dict[str, Any], hostile: Path, tmp_path: Path
) -> None:
    env = {**os.environ, **secrets(lab), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    made = subprocess.run(
        [SERVEFLEET, "lock", "inventories/lab.py", "--lock-dir", str(tmp_path / "lock"), *SUFFIX],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert made.returncode == 0, made.stdout + made.stderr
    assert_found_nothing(hostile, "build_wheel")
    pylocks = list((tmp_path / "lock").glob("pylock.*.toml"))
    arctic = [
        p for f in pylocks for p in packages(f.read_text()) if p["name"] == "arctic-inference"
    ]
    assert arctic and all("sdist" in p and "wheels" not in p for p in arctic)

    for p in hostile.glob("*.json"):
        p.unlink()
    # locked: the release is the hostile sdist's (its hash is in the release id), so no host
    # has it complete and the controller must build its wheel
    dry = run(lab, "--dry", "--limit", "lab1", *SUFFIX, "--data", f"sdk_lock={tmp_path / 'lock'}",
              "--data", f"sdk_wheel_cache={tmp_path / 'wheels'}",
              env={**env, "PYINFRA_PROGRESS": "off"})  # fmt: skip
    assert dry.returncode == 0, dry.stdout[-4000:] + dry.stderr[-4000:]
    assert "arctic-inference==0.1.1 for Python 3." in dry.stdout + dry.stderr
    assert list((tmp_path / "wheels").glob("*/py*/arctic_inference-0.1.1-py3-none-any.whl"))
    assert_found_nothing(hostile, "build_wheel")
