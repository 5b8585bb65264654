"""The glibc trap (issue #10): the lab's wheels carry the real platform tags and uv enforces them;
the probe reads the host's glibc; a package two indexes own comes from the one whose wheels the
host's glibc takes, and a host none fits is refused before any change, in one line; the lock
covers every choice a host can make."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import zipfile
from pathlib import Path
from typing import Any

import pytest
from host_inputs import CR13, probe, run_probe, settings
from local_release import pylock

from servefleet.fleet.lab.base import base_note, base_paths, ensure_base
from servefleet.fleet.lab.simulator import wheels as lab_wheels
from servefleet.fleet.lab.state import LabError
from servefleet.fleet.lab.topology import plan_hosts
from servefleet.fleet.lockfleet import alternatives
from servefleet.hostplan.extras import resolve_for
from servefleet.hostplan.plan import plan_host
from servefleet.hostplan.probe_input import probe_args
from servefleet.release.glibc import choose, glibc_refusal, host_glibc, levels
from servefleet.release.uvbin import uv_binary
from servefleet.settings.table import load_defaults

VLLM = {"url": "https://wheels.example/cpu", "packages": ["vllm"], "glibc": "2.39"}
ASSETS = {"url": "https://assets.example/simple", "packages": ["vllm"], "glibc": "2.35"}
TWO = {**load_defaults()["pip_indexes"], "vllm": VLLM, "vllm-rbln-assets": ASSETS}
NEEDS_239 = "vllm==0.30.0+cpu needs glibc >= 2.39 (sources: vllm 2.39)"


# --- the probe ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("libc", "version"),
    [
        ("glibc 2.36", "2.36"),
        ("glibc 2.41\n", "2.41"),
        ("glibc 2.39", "2.39"),
        (None, None),  # os.confstr has no answer (musl)
        ("", None),
        ("musl 1.2.5", None),
        ("glibc 2", None),
        ("glibc 2.36; rm -rf /", None),
        (2.36, None),
    ],
)
def test_probe_libc_parsed(libc: Any, version: str | None) -> None:
    assert host_glibc(libc) == version


def test_the_probe_reads_this_machines_glibc(tmp_path: Path) -> None:
    result = run_probe(tmp_path, CR13, driver=True)
    assert result["libc"] == os.confstr("CS_GNU_LIBC_VERSION")
    mine = host_glibc(result["libc"])
    assert mine is not None
    plan = plan_host(settings(), result)  # the default data: vllm's wheels need 2.39
    if tuple(map(int, mine.split("."))) < (2, 39):
        assert plan.refusal == f"glibc {mine} here; {NEEDS_239}"
    else:
        assert plan.refusal is None


# --- choosing the source -----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("glibc", "owner"),
    [("2.41", "vllm"), ("2.39", "vllm"), ("2.38", "vllm-rbln-assets"), ("2.36", "vllm-rbln-assets"),
     ("2.35", "vllm-rbln-assets"), ("2.40", "vllm"), ("3.0", "vllm"), (None, "vllm")],
)  # fmt: skip
def test_the_source_whose_wheels_fit_is_chosen(glibc: str | None, owner: str) -> None:
    s = settings(pip_indexes=TWO)
    chosen = choose(s.pip_indexes, glibc)
    assert chosen["vllm"].name == owner
    assert chosen["rebel-compiler"].name == "rbln" and chosen["torch"].name == "torch"
    assert glibc_refusal(s.pip_indexes, {"vllm": "0.30.0+cpu"}, glibc or "2.39") is None


def test_no_source_fits_one_line_naming_both_versions() -> None:
    two = settings(pip_indexes=TWO).pip_indexes
    one = settings().pip_indexes  # upstream's vllm index alone
    pins = {"vllm": "0.30.0+cpu", "rebel-compiler": "0.12.0"}
    assert glibc_refusal(one, pins, "2.36") == f"glibc 2.36 here; {NEEDS_239}"
    assert glibc_refusal(one, pins, None) == f"no glibc found here; {NEEDS_239}"
    assert glibc_refusal(two, pins, "2.34") == (
        "glibc 2.34 here; vllm==0.30.0+cpu needs glibc >= 2.35 "
        "(sources: vllm 2.39, vllm-rbln-assets 2.35)"
    )
    assert glibc_refusal(two, pins, "2.35") is None
    assert glibc_refusal(one, {"rebel-compiler": "0.12.0"}, "2.17") is None  # vllm not installed


def test_levels_cover_every_choice() -> None:
    assert levels(settings(pip_indexes=TWO).pip_indexes) == ["2.39", "2.35"]
    assert levels(settings().pip_indexes) == ["2.39"]
    assert levels(settings(pip_indexes={}).pip_indexes) == [None]


def test_bookworm_and_trixie_hosts_get_different_stacks() -> None:
    s = settings(pip_indexes=TWO)
    old = plan_host(s, probe(libc="glibc 2.36"))
    new = plan_host(s, probe(libc="glibc 2.41"))
    assert old.refusal is None and new.refusal is None
    vllm = {plan.release.stack.name: next(d.index for d in plan.release.downloads  # type: ignore[union-attr]
            if d.name == "vllm") for plan in (old, new)}  # fmt: skip
    assert vllm == {"rbln-glibc2_35": ASSETS["url"], "rbln-glibc2_39": VLLM["url"]}
    assert old.release.id != new.release.id
    for plan, owner in ((old, "vllm-rbln-assets"), (new, "vllm")):
        assert plan.release.stack is not None
        assert plan.release.stack.owners()["vllm"] == owner  # only the chosen owner is locked
        names = [i["name"] for i in plan.release.stack.inputs["indexes"]]
        assert names == sorted(["rbln", "torch", owner])
    refused = plan_host(s, probe(libc="glibc 2.34"))
    assert refused.refusal and refused.refusal.startswith("glibc 2.34 here; vllm==0.30.0+cpu")


def test_one_source_keeps_the_stack_and_release_of_before() -> None:
    s = settings()
    plan = plan_host(s, probe(libc="glibc 2.39"))
    assert plan.release.stack is not None and plan.release.stack.name == "rbln"
    no_glibc = dataclasses.replace(
        s, pip_indexes=tuple(dataclasses.replace(i, glibc=None) for i in s.pip_indexes)
    )
    again = plan_host(no_glibc, probe(libc="glibc 2.39"))
    assert again.release.id == plan.release.id and again.release.stack == plan.release.stack


def test_the_probe_watches_the_plan_file_of_every_choice(tmp_path: Path) -> None:
    s = settings(pip_indexes=TWO)
    ids = {plan_host(s, probe(libc=f"glibc {v}")).release.id for v in ("2.36", "2.41")}
    args = probe_args(s, resolve_for(s))
    for release in ids:
        assert f"/opt/servefleet/plans/{release}.json" in args


def test_the_lock_holds_every_choice_no_host_is_refused() -> None:
    s = settings(pip_indexes=TWO)
    names = [st.name for st in alternatives(s, resolve_for(s))]
    assert names == ["rbln-glibc2_39", "rbln-glibc2_35"]
    assert [st.name for st in alternatives(settings(), resolve_for(settings()))] == ["rbln"]
    # a torch index for glibc >= 2.38: no host below it installs, so no 2.35 stack
    torch = {**TWO["torch"], "glibc": "2.38"}
    t = settings(pip_indexes={**TWO, "torch": torch})
    stacks = alternatives(t, resolve_for(t))
    assert [st.name for st in stacks] == ["rbln-glibc2_39", "rbln-glibc2_35"]
    assert [st.owners()["vllm"] for st in stacks] == ["vllm", "vllm-rbln-assets"]  # 2.38: assets


# --- the lab's wheels --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    index = tmp_path_factory.mktemp("glibc") / "index"
    lab_wheels.build_wheels(index)
    return index


def _wheel_file(whl: Path) -> dict[str, list[str]]:
    with zipfile.ZipFile(whl) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/WHEEL"))
        lines = zf.read(name).decode().splitlines()
    out: dict[str, list[str]] = {}
    for line in lines:
        key, _, value = line.partition(": ")
        out.setdefault(key, []).append(value)
    return out


def test_lab_wheels_carry_the_real_platform_tags(wheels: Path) -> None:
    names = {p.parent.name + "/" + p.name for p in wheels.rglob("*.whl")}
    assert "vllm/vllm-0.30.0+cpu-cp38-abi3-manylinux_2_39_x86_64.whl" in names
    assert "assets/vllm-0.30.0+cpu-cp38-abi3-manylinux_2_35_x86_64.whl" in names
    assert sorted(n for n in names if n.startswith("vllm/") or n.startswith("assets/")) == [
        "assets/vllm-0.30.0+cpu-cp38-abi3-manylinux_2_35_x86_64.whl",
        "vllm/vllm-0.30.0+cpu-cp38-abi3-manylinux_2_39_x86_64.whl",
    ]
    for version in ("0.12.0", "0.12.1"):
        assert sorted(n for n in names if n.startswith(f"public/torch_rbln-{version}-")) == [
            f"public/torch_rbln-{version}-cp3{m}-cp3{m}-manylinux_2_34_x86_64.whl"
            for m in range(10, 15)
        ]
    for whl in wheels.rglob("*.whl"):  # WHEEL agrees with the file name, every wheel
        tag = whl.name[: -len(".whl")].split("-", 2)[2]
        pythons, abis, platforms = (part.split(".") for part in tag.split("-"))
        wheel = _wheel_file(whl)
        assert sorted(wheel["Tag"]) == sorted(
            f"{p}-{a}-{pl}" for p in pythons for a in abis for pl in platforms
        ), whl.name
        assert wheel["Root-Is-Purelib"] == ["true" if platforms == ["any"] else "false"], whl.name


def _uv_dry_run(wheels: Path, platform: str, *dirs: str) -> subprocess.CompletedProcess[str]:
    links = [a for d in dirs for a in ("--find-links", str(wheels / d))]
    cmd = [str(uv_binary()), "pip", "install", "--dry-run", "--no-deps", "--no-index",
           "--python-platform", platform, "--python-version", "3.11", "--target",
           str(wheels.parent / "target"), *links, "vllm==0.30.0+cpu"]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def test_uv_enforces_the_tags(wheels: Path) -> None:
    old = _uv_dry_run(wheels, "x86_64-manylinux_2_36", "vllm")
    assert old.returncode != 0 and "no wheels with a matching platform tag" in old.stderr
    assert _uv_dry_run(wheels, "x86_64-manylinux_2_39", "vllm").returncode == 0
    both = _uv_dry_run(wheels, "x86_64-manylinux_2_36", "vllm", "assets")
    assert both.returncode == 0, both.stderr


# --- the lab's bases ---------------------------------------------------------------------------
def test_lab_hosts_of_two_bases() -> None:
    hosts = plan_hosts(3, 4, {}, odd_base={"lab2": "trixie"})
    assert [(h["base"], h["glibc"], h["python"]) for h in hosts] == [
        ("bookworm", "2.36", "3.11"), ("trixie", "2.41", "3.13"), ("bookworm", "2.36", "3.11"),
    ]  # fmt: skip
    assert {h["base"] for h in plan_hosts(2, 4, {}, base="trixie")} == {"trixie"}
    assert [base_note(h) for h in hosts] == ["", " (trixie: glibc 2.41)", ""]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"base": "buster"}, "--base buster: unknown base; allowed: bookworm, trixie"),
        ({"odd_base": {"lab3": "trixie"}}, "--odd-base names host 'lab3'; the lab has lab1, lab2"),
        ({"odd_base": {"lab1": "sid"}}, "--odd-base lab1=sid: unknown base; allowed: bookworm, trixie"),
    ],
)  # fmt: skip
def test_bad_lab_bases_one_line(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(LabError) as info:
        plan_hosts(2, 4, {}, **kwargs)
    assert str(info.value) == message


def test_each_base_has_its_own_cache_the_default_keeps_its_layout(tmp_path: Path) -> None:
    assert base_paths(tmp_path, "bookworm") == (tmp_path / "base", tmp_path)
    assert base_paths(tmp_path, "trixie") == (
        tmp_path / "base-trixie/root",
        tmp_path / "base-trixie",
    )
    with pytest.raises(LabError, match="^--base sid: unknown base; allowed: bookworm, trixie$"):
        ensure_base(tmp_path, "sid")


def test_a_lock_of_every_choice_serves_each_host_its_own(tmp_path: Path) -> None:
    from servefleet.release.lock import write_lock
    from servefleet.release.pylock import release_id

    torch = {**TWO["torch"], "glibc": "2.38"}  # 2.35 hosts are refused, that stack not locked
    s = settings(pip_indexes={**TWO, "torch": torch})
    stacks = alternatives(s, resolve_for(s))
    texts = {st: pylock(a=str(i) * 64) for i, st in enumerate(stacks, start=1)}
    write_lock(tmp_path, texts, {}, {})
    locked = dataclasses.replace(s, sdk_lock=str(tmp_path))
    args = probe_args(locked, resolve_for(locked))  # the unlocked 2.35 choice is left out
    for libc, number in (("glibc 2.41", 1), ("glibc 2.38", 2)):
        plan = plan_host(locked, probe(libc=libc))
        assert plan.refusal is None and plan.release.id == release_id(pylock(a=str(number) * 64))
        assert f"/plans/{plan.release.id}.json" in args
    refused = plan_host(locked, probe(libc="glibc 2.36"))
    assert refused.refusal == (
        "glibc 2.36 here; torch==2.13.0+cpu needs glibc >= 2.38 (sources: torch 2.38)"
    )


def test_a_host_whose_choice_is_not_locked_is_refused_not_failed(tmp_path: Path) -> None:
    from servefleet.release.lock import write_lock

    torch = {"url": "https://torch.example/a", "packages": ["torch"], "glibc": "2.40"}
    old_torch = {"url": "https://torch.example/b", "packages": ["torch"], "glibc": "2.37"}
    s = settings(pip_indexes={**TWO, "torch": torch, "torch-old": old_torch})
    stacks = alternatives(s, resolve_for(s))  # 2.40, 2.39, 2.37; at 2.35 no torch fits
    assert [(st.owners()["vllm"], st.owners()["torch"]) for st in stacks] == [
        ("vllm", "torch"), ("vllm", "torch-old"), ("vllm-rbln-assets", "torch-old"),
    ]  # fmt: skip
    write_lock(tmp_path, {st: pylock() for st in stacks}, {}, {})
    locked = dataclasses.replace(s, sdk_lock=str(tmp_path))
    plan = plan_host(locked, probe(libc="glibc 2.36"))  # vllm: assets; torch: none
    assert plan.refusal == (
        "glibc 2.36 here; torch==2.13.0+cpu needs glibc >= 2.37 (sources: torch 2.40, "
        "torch-old 2.37)"
    )
