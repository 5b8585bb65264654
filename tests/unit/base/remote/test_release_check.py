"""Drift inside a release (#36): what the marker records at install (each distribution's
version and RECORD digest), the probe's cheap check (versions, RECORD digests, every listed
file there at its size), the full check (every file's sha256), and a server started before its
release was installed again."""

from __future__ import annotations

import base64
import hashlib
import os
import sys
import time
from pathlib import Path

import pytest
from repo_paths import REMOTE

sys.path.insert(0, str(REMOTE))
import release_check  # noqa: E402


def b64(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def dist(release: Path, name: str, version: str, files: dict[str, bytes]) -> None:
    site = release / "lib" / "python3.11" / "site-packages"
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\nx\n"
    )
    rows = []
    for rel, data in files.items():
        path = (site / rel).resolve()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        rows.append(f"{rel},{b64(data)},{len(data)}")
    rows += [f"{info.name}/METADATA,,", f"{info.name}/RECORD,,"]
    (info / "RECORD").write_text("\n".join(rows) + "\n")


@pytest.fixture
def release(tmp_path: Path) -> Path:
    rel = tmp_path / "releases" / "abc123"
    dist(rel, "vllm", "0.30.0", {"vllm/__init__.py": b"x = 1\n", "vllm/serve_args.py": b"a\n",
                                 "../../../bin/vllm": b"#!/bin/sh\n"})  # fmt: skip
    dist(rel, "Typing_Extensions", "4.12.0", {"typing_extensions.py": b"pass\n"})
    return rel


def replace(path: Path, data: bytes) -> None:
    """Replace a file as installers and ``sed -i`` do: a new file renamed over it."""
    tmp = path.with_name(path.name + ".new")
    tmp.write_bytes(data)
    tmp.rename(path)


def test_a_fresh_release_is_what_its_marker_recorded(release: Path) -> None:
    recorded = release_check.manifest(str(release))
    assert set(recorded["dists"]) == {"vllm", "typing-extensions"}
    assert recorded["dists"]["vllm"]["version"] == "0.30.0"
    assert recorded["dists"]["vllm"]["files"] == 5 and recorded["rewritten"] == {}
    assert release_check.drift(str(release), recorded) == []
    assert release_check.drift(str(release), None) == []  # a marker from before: nothing to say
    assert release_check.drift(str(release), {"id": "x", "pins": {}}) == []
    full = release_check.verify(str(release), recorded)
    assert full["differ"] == [] and full["files"] == 4 and full["bytes"] == 23


def site(release: Path) -> Path:
    return release / "lib" / "python3.11" / "site-packages"


def test_an_edited_version_a_removed_module_and_a_changed_file_are_each_named(
    release: Path,
) -> None:
    recorded = release_check.manifest(str(release))
    meta = site(release) / "vllm-0.30.0.dist-info" / "METADATA"
    text = meta.read_text()
    meta.write_text(text.replace("Version: 0.30.0", "Version: 9.9.9"))  # in place, as an editor
    assert release_check.drift(str(release), recorded) == ["vllm: version 9.9.9, installed 0.30.0"]
    replace(meta, text.encode())  # back, by rename: its directory changed, nothing else
    assert release_check.drift(str(release), recorded) == ["vllm 0.30.0: its METADATA changed"]
    recorded = release_check.manifest(str(release))
    (site(release) / "vllm" / "serve_args.py").unlink()
    assert release_check.drift(str(release), recorded) == [
        "vllm: lib/python3.11/site-packages/vllm/serve_args.py is missing"
    ]
    replace(site(release) / "vllm" / "serve_args.py", b"b\n")  # same size, other bytes
    assert release_check.drift(str(release), recorded) == []  # the cheap check: sizes only
    assert release_check.verify(str(release), recorded)["differ"] == [
        "vllm: lib/python3.11/site-packages/vllm/serve_args.py differs from the sha256 it was "
        "installed with"
    ]
    replace(release / "bin" / "vllm", b"#!/bin/sh\nexit 0\n")
    assert release_check.drift(str(release), recorded) == [
        "vllm: bin/vllm has 17 bytes, installed 10"
    ]
    (site(release) / "typing_extensions.py").write_bytes(b"pass  \n")  # in place: --verify's
    assert release_check.drift(str(release), recorded) == [
        "vllm: bin/vllm has 17 bytes, installed 10"
    ]
    assert (
        "typing-extensions: lib/python3.11/site-packages/typing_extensions.py has 7 bytes, "
        "installed 5" in release_check.verify(str(release), recorded)["differ"]
    )


def test_a_file_the_installer_rewrote_is_held_to_what_it_left(release: Path) -> None:
    # uv rewrites a console script's #!python after the wheel's RECORD gave its size
    replace(release / "bin" / "vllm", b"#!/opt/servefleet/releases/abc/bin/python\n")
    recorded = release_check.manifest(str(release))
    assert recorded["rewritten"] == {
        "bin/vllm": [42, b64(b"#!/opt/servefleet/releases/abc/bin/python\n")]
    }
    assert release_check.drift(str(release), recorded) == []
    assert release_check.verify(str(release), recorded)["differ"] == []
    replace(release / "bin" / "vllm", b"#!/bin/sh\n")  # back to the RECORD's: that is drift now
    assert release_check.drift(str(release), recorded) == [
        "vllm: bin/vllm has 10 bytes, installed 42"
    ]


def test_distributions_added_removed_or_rerecorded_and_links_are_drift(release: Path) -> None:
    recorded = release_check.manifest(str(release))
    dist(release, "evil", "1.0", {"evil.py": b"import os\n"})
    assert release_check.drift(str(release), recorded) == [
        "evil 1.0: installed since (not by servefleet)"
    ]
    recorded = release_check.manifest(str(release))
    record = site(release) / "evil-1.0.dist-info" / "RECORD"
    replace(record, record.read_bytes() + b"\n")
    assert release_check.drift(str(release), recorded) == ["evil 1.0: its RECORD changed"]
    import shutil

    shutil.rmtree(site(release) / "evil-1.0.dist-info")
    assert release_check.drift(str(release), recorded) == ["evil 1.0: not installed any more"]
    recorded = release_check.manifest(str(release))
    target = site(release) / "vllm"
    os.rename(target, site(release) / "vllm.real")
    os.symlink(site(release) / "vllm.real", target)  # a link inside: never followed
    lines = release_check.drift(str(release), recorded)
    assert lines and all("is outside the release or behind a link" in x for x in lines), lines


def test_many_differing_files_are_counted_not_all_listed(release: Path) -> None:
    recorded = release_check.manifest(str(release))
    for f in (site(release) / "vllm").iterdir():
        f.unlink()
    lines = release_check.drift(str(release), recorded, limit=1)
    assert len(lines) == 2 and lines[1] == "... and 1 more file(s)"


def test_a_server_started_before_its_release_was_installed_again(tmp_path: Path) -> None:
    rel = tmp_path / "releases" / "abc123"
    rel.mkdir(parents=True)
    marker = rel / ".servefleet-release.json"
    marker.write_text("{}")
    unit = f'[Service]\nExecStart="{rel}/bin/vllm" "serve"\n'
    me = os.getpid()
    started = release_check.process_started(me)
    assert started is not None and abs(started - time.time()) < 3600 * 24 * 365
    os.utime(marker, (started - 60, started - 60))  # installed before this process started
    assert not release_check.older_than_release(me, unit, marker.name)
    # within the second's slack (/proc's start time is in clock ticks, btime whole seconds)
    os.utime(marker, (started + 0.5, started + 0.5))
    assert not release_check.older_than_release(me, unit, marker.name)
    os.utime(marker, (started + 5, started + 5))  # installed again since: it runs old files
    assert release_check.older_than_release(me, unit, marker.name)
    assert not release_check.older_than_release(0, unit, marker.name)  # no process
    assert not release_check.older_than_release(me, "[Service]\n", marker.name)  # no release


def test_a_drifted_release_is_planned_again_and_named_by_plan_and_status() -> None:
    from host_inputs import converged_probe, settings

    from servefleet.fleet.fleetview import plan_summary
    from servefleet.fleet.statusview import status_problems, status_summary
    from servefleet.hostplan.plan import plan_host

    clean = plan_host(settings(), converged_probe())
    assert clean.converged and clean.release_complete and clean.release_drift == ()
    rid = clean.release.id
    lines = ["vllm: version 9.9.9, installed 0.30.0"]
    plan = plan_host(settings(), converged_probe(release_drift={rid: lines}))
    assert not plan.release_complete and not plan.converged  # installed again, then restarted
    assert plan.release_drift == (f"release {rid}: vllm: version 9.9.9, installed 0.30.0",)
    assert not any(i.converged for i in plan.instances)
    summary = plan_summary(plan, None, 0)
    assert summary["changes"] and summary["install_release"] and summary["release_drift"]
    status = status_summary(plan, {str(i.port): "ok" for i in plan.instances}, "10.0.0.1")
    assert (
        status_problems("h1", status)[0]
        == f"h1: release {rid}: vllm: version 9.9.9, installed 0.30.0"
    )
    # a server started before its release was installed again: it restarts, nothing reinstalls
    units = converged_probe()["units"]
    first = next(iter(units))
    units[first] = {**units[first], "older_than_release": True}
    stale = plan_host(settings(), converged_probe(units=units))
    assert stale.release_complete and not stale.converged
    assert [i.converged for i in stale.instances].count(False) == 1
