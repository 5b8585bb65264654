"""The release installer (src/servefleet/base/remote/install_release.py) against local package
indexes (the ``index`` fixture of conftest.py): each failed check withholds the completion
marker with a clear line. Each run makes a real venv with the real pip (about 5 s each)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from lab_sim_support import load
from local_release import INSTALLER, install, pip_env, release_plan, with_uv, write_plan

from servefleet.release.plan import MARKER, Download, ReleasePlan

CHECK_PREFIX = "servefleet: release check: "


def withheld(plan: ReleasePlan, stderr: str, *problems: str) -> None:
    """The checks found exactly ``problems`` and the release is not marked complete."""
    assert [line for line in stderr.splitlines() if line.startswith(CHECK_PREFIX)] == [
        CHECK_PREFIX + p for p in problems
    ], stderr
    assert f"servefleet: release {plan.id} failed its checks; it is not marked complete" in stderr
    assert not (Path(plan.path) / MARKER).exists()


def test_a_sound_plan_is_installed_and_marked(index: dict[str, str], reachable: Path) -> None:
    """The control for the failures below: same indexes, nothing wrong, marker written."""
    plan = release_plan(index, reachable / "release")
    proc = install(plan, reachable)
    assert proc.returncode == 0, proc.stderr
    assert CHECK_PREFIX not in proc.stderr
    marker = json.loads((reachable / "release" / MARKER).read_text())
    assert {k: v for k, v in marker.items() if k not in ("dists", "rewritten", "dirs")} == {
        "id": "rel1",
        "pins": plan.expect,
        "servefleet": "9.8.7",  # the servefleet that installed it
    }
    assert marker["dists"]["sfowned"]["version"] == "1.0"  # what the probe compares (#36)
    python = str(reachable / "release" / "bin" / "python")
    origin = subprocess.run(
        [python, "-c", "import sfowned; print(sfowned.ORIGIN)"], capture_output=True, text=True
    )
    assert origin.stdout == "owner\n"  # not the public squatter's 9.0
    again = install(plan, reachable)
    assert (again.returncode, again.stdout) == (0, "release rel1 is complete\n")


def test_a_version_other_than_the_pin_is_refused(index: dict[str, str], reachable: Path) -> None:
    # sfdep is pinned but not constrained: pip takes the newest public one, 2.0
    plan = replace(release_plan(index, reachable / "release"), constraints=["sfpub==1.0"])
    proc = install(plan, reachable)
    assert proc.returncode == 1
    withheld(plan, proc.stderr, "sfdep 2.0 is installed, 1.0 is pinned")


def test_a_package_not_from_its_own_index_is_refused(
    index: dict[str, str],
    reachable: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """sfowned installed from a file outside the wheelhouse its owner's download went to."""
    installer = load(INSTALLER, "servefleet_remote_install_release")
    elsewhere = reachable / "elsewhere"
    elsewhere.mkdir()
    real_downloaded = installer.downloaded

    def downloaded_elsewhere(wheelhouse: Path, name: str, version: str) -> Path:
        return Path(shutil.copy(real_downloaded(wheelhouse, name, version), elsewhere))

    monkeypatch.setattr(installer, "downloaded", downloaded_elsewhere)
    env = pip_env()
    for key in os.environ.keys() - env.keys():
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    plan = release_plan(index, reachable / "release")
    with pytest.raises(SystemExit) as exited:
        installer.main(str(write_plan(plan, reachable)))
    stray = (elsewhere / "sfowned-1.0-py3-none-any.whl").as_uri()
    problem = f"sfowned did not come from its own index ({index['owner']}): {stray}"
    withheld(plan, f"{capfd.readouterr().err}{exited.value.code}\n", problem)


def test_a_failed_import_is_refused(index: dict[str, str], reachable: Path) -> None:
    base = release_plan(index, reachable / "release")
    plan = replace(
        base,
        requirements=[*base.requirements, "sfbroken==1.0"],
        constraints=[*base.constraints, "sfbroken==1.0"],
        expect={**base.expect, "sfbroken": "1.0"},
        imports=[*base.imports, "sfbroken"],
    )
    proc = install(plan, reachable)
    assert proc.returncode == 1
    withheld(plan, proc.stderr, "import sfbroken failed: RuntimeError: no NPU here")


def test_uv_installs_a_sound_plan_from_each_owner_with_hashes(
    index: dict[str, str], reachable: Path
) -> None:
    plan = with_uv(release_plan(index, reachable / "release"))
    proc = install(plan, reachable)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (reachable / "release" / MARKER).exists()
    python = str(reachable / "release" / "bin" / "python")
    origin = subprocess.run(
        [python, "-c", "import sfowned; print(sfowned.ORIGIN)"], capture_output=True, text=True
    )
    assert origin.stdout == "owner\n"  # the owner's 1.0 behind basic auth, not the squatter
    locked = (reachable / "release" / "locked.txt").read_text()
    assert "sfowned==1.0" in locked and f"# from {index['owner'].rstrip('/')}" in locked
    assert locked.count("--hash=sha256:") >= 3
    assert "sf-pass" not in proc.stdout + proc.stderr + locked


def test_uv_refuses_an_owned_package_its_owner_does_not_serve(
    index: dict[str, str], reachable: Path
) -> None:
    """sfpub claimed by the owner index, which lacks it: uv finds it on the public index only,
    and the installer refuses before installing anything."""
    base = with_uv(release_plan(index, reachable / "release"))
    plan = replace(
        base,
        downloads=[*base.downloads, Download("sfpub", "1.0", index["owner"], auth=True)],
        requirements=[],
    )
    proc = install(plan, reachable)
    assert proc.returncode == 1
    owner = index["owner"].rstrip("/")
    assert (
        f"servefleet: sfpub resolved from {index['public'].rstrip('/')}, not from its owner {owner}"
        in proc.stderr
    )
    assert not (reachable / "release" / MARKER).exists()
    assert not (reachable / "release" / "lib").exists() or not list(
        (reachable / "release" / "lib").glob("python*/site-packages/sfowned")
    )


def test_a_drifted_release_is_set_aside_and_installed_again(
    index: dict[str, str], reachable: Path
) -> None:
    """#36: never patched in place: the drifted tree is renamed beside it, a fresh one checked."""
    plan = release_plan(index, reachable / "release")
    assert install(plan, reachable).returncode == 0
    (meta,) = (reachable / "release").glob(
        "lib/python*/site-packages/sfowned-1.0.dist-info/METADATA"
    )
    meta.write_text(meta.read_text().replace("Version: 1.0", "Version: 9.9.9"))
    again = install(plan, reachable)
    assert again.returncode == 0, again.stderr
    (aside,) = reachable.glob("release.tampered-*")
    assert again.stderr == (
        "servefleet: release rel1 drifted (sfowned: version 9.9.9, installed 1.0): kept as "
        f"{aside} for inspection; installing it again\n"
    )
    assert (
        "Version: 9.9.9"
        in next(aside.glob("lib/python*/site-packages/sfowned-*/METADATA")).read_text()
    )
    assert "Version: 1.0\n" in meta.read_text()  # the fresh install
    assert install(plan, reachable).stdout == "release rel1 is complete\n"
