"""Lab settings and sources that need no root: the mirror lookup, host plans, state, env lines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servefleet.fleet.lab.base import find_mirror
from servefleet.fleet.lab.state import LabError, env_lines, load_state, write_state
from servefleet.fleet.lab.topology import plan_hosts

DEB822 = """\
Types: deb
# a comment
URIs: http://mirror.invalid/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://mirror.invalid/debian-security
Suites: bookworm-security
Components: main
"""


def test_mirror_from_deb822_sources(tmp_path: Path) -> None:
    (tmp_path / "debian.sources").write_text(DEB822)
    assert find_mirror(tmp_path, tmp_path / "none") == ("http://mirror.invalid/debian", "bookworm")


def test_mirror_skips_disabled_and_non_main_stanzas(tmp_path: Path) -> None:
    (tmp_path / "a.sources").write_text(
        "Enabled: no\nTypes: deb\nURIs: http://off.invalid/\nSuites: bookworm\nComponents: main\n\n"
        "Types: deb-src\nURIs: http://src.invalid/\nSuites: bookworm\nComponents: main\n"
    )
    (tmp_path / "b.sources").write_text(
        "Types: deb\nURIs: http://contrib.invalid/\nSuites: bookworm\nComponents: contrib\n"
    )
    listing = tmp_path / "sources.list"
    listing.write_text(
        "# deb http://commented.invalid/ bookworm main\n"
        "deb [arch=amd64 signed-by=/k.gpg] http://one.invalid/debian/ trixie main\n"
    )
    assert find_mirror(tmp_path, listing) == ("http://one.invalid/debian", "trixie")


def test_no_mirror_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(LabError, match="no Debian mirror"):
        find_mirror(tmp_path, tmp_path / "sources.list")


def test_host_plan_defaults_and_an_odd_sku() -> None:
    hosts = plan_hosts(3, 4, {"lab2": "RBLN-CA25"})
    assert [(h["name"], h["address"], h["sku"], h["pci_device"], h["netns"]) for h in hosts] == [
        ("lab1", "10.213.0.11", "RBLN-CR13", "2130", "sf-lab1"),
        ("lab2", "10.213.0.12", "RBLN-CA25", "1250", "sf-lab2"),
        ("lab3", "10.213.0.13", "RBLN-CR13", "2130", "sf-lab3"),
    ]
    assert {h["devices"] for h in hosts} == {4}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((0, 4, {}), "--hosts must be between 1 and 40, not 0"),
        ((2, 0, {}), "--devices must be between 1 and 16, not 0"),
        ((2, 4, {"lab3": "RBLN-CA25"}), "--odd-sku names host 'lab3'; the lab has lab1, lab2"),
        ((2, 4, {"lab1": "RBLN-X"}), "--odd-sku lab1=RBLN-X: unknown SKU; allowed: RBLN-CA02, "),
    ],
)
def test_bad_host_plans(args: tuple[int, int, dict[str, str]], message: str) -> None:
    with pytest.raises(LabError) as info:
        plan_hosts(*args)
    assert str(info.value).startswith(message)


def test_state_round_trip_and_errors(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    with pytest.raises(LabError, match=r"^the lab is not up \(no .*state.json\)"):
        load_state(path)
    path.write_text("{not json")
    with pytest.raises(LabError, match="not valid JSON"):
        load_state(path)
    state = {"hosts": [], "secrets": {"HF_TOKEN": "/s/hf token", "RBLN_INDEX_USER": "/s/u"}}
    write_state(state, path)
    assert load_state(path) == state and json.loads(path.read_text()) == state
    assert path.stat().st_mode & 0o777 == 0o644


def test_env_lines_read_secrets_from_files() -> None:
    state = {"secrets": {"RBLN_INDEX_USER": "/s/u", "HF_TOKEN": "/s/hf token"}}
    assert env_lines(state) == [
        "export HF_TOKEN=\"$(cat '/s/hf token')\"",
        'export RBLN_INDEX_USER="$(cat /s/u)"',
    ]


def test_lab_up_raises_the_inotify_limit_for_many_hosts_and_down_restores_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from servefleet.fleet.lab import layout, machine

    limit = tmp_path / "max_user_instances"
    limit.write_text("128\n")
    monkeypatch.setattr(machine, "INOTIFY_INSTANCES", limit)
    monkeypatch.setattr(layout, "SYSCTL_SAVED", tmp_path / "sysctl.json")
    machine.raise_sysctls(3)
    assert limit.read_text() == "128\n" and not (tmp_path / "sysctl.json").exists()
    machine.raise_sysctls(32)
    assert int(limit.read_text()) >= 32 * 8
    machine.restore_sysctls()
    assert limit.read_text() == "128\n" and not (tmp_path / "sysctl.json").exists()
