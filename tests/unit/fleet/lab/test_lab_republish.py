"""``servefleet lab republish`` and offline hosts without a lab: the NAME==VERSION argument, the
choice of index, the rewritten wheel and sdist (other bytes, still installable), the per-lab
hard-link copy that keeps the build cache intact, the index serving a replaced file's new hash,
and the offline switch's checks."""

from __future__ import annotations

import base64
import hashlib
import io
import os
import re
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from fake_host import serving
from lab_sim_support import PIP_ENV
from packaging.version import Version

from servefleet.entry.cli import main as cli_main
from servefleet.fleet.lab import layout
from servefleet.fleet.lab.artifacts import serving_copy
from servefleet.fleet.lab.index import Config, fetch, make_server
from servefleet.fleet.lab.offline import check_hosts, ruleset
from servefleet.fleet.lab.republish import (
    MODULE,
    choose_index,
    dist_of,
    parse_spec,
    replace_file,
    rewrite,
    rewrite_sdist,
    rewrite_wheel,
    versions_on,
)
from servefleet.fleet.lab.simulator import sdist as lab_sdist, wheels as lab_wheels
from servefleet.fleet.lab.state import LabError


@pytest.mark.parametrize(
    ("spec", "name", "version"),
    [
        ("rebel-compiler==0.12.0", "rebel-compiler", "0.12.0"),
        (" Vllm_RBLN == 0.12.1 ", "vllm-rbln", "0.12.1"),
        ("vllm==0.30.0+cpu", "vllm", "0.30.0+cpu"),
        ("lmcache-rbln==0.12.0.post1", "lmcache-rbln", "0.12.0.post1"),
    ],
)
def test_a_spec_is_a_normalized_name_and_an_exact_version(
    spec: str, name: str, version: str
) -> None:
    assert parse_spec(spec) == (name, Version(version))


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ("rebel-compiler", "is not NAME==VERSION"),
        ("rebel-compiler>=0.12", "is not NAME==VERSION"),
        ("rebel-compiler===0.12.0", "is not NAME==VERSION"),
        ("rebel-compiler==0.12,!=0.12.1", "is not NAME==VERSION"),
        ("==0.12.0", "'' is not a package name"),
        ("vllm-rbln[kv-connectors]==0.12.1", "is not a package name"),
        ("rebel compiler==0.12.0", "is not a package name"),
        ("rebel-compiler==0.12.*", "is a wildcard"),
        ("rebel-compiler==twelve", "is not a version (PEP 440)"),
        ("rebel-compiler==", "is not a version (PEP 440)"),
    ],
)
def test_a_bad_spec_is_one_line_naming_the_problem_and_the_form(spec: str, problem: str) -> None:
    with pytest.raises(LabError) as caught:
        parse_spec(spec)
    message = str(caught.value)
    assert problem in message and "NAME==VERSION" in message and "\n" not in message
    assert "e.g. rebel-compiler==0.12.0" in message


def test_the_cli_refuses_a_bad_spec_or_index_in_one_line_before_reading_the_lab() -> None:
    runner = CliRunner()
    for args in (["rebel-compiler>=1"], ["rebel-compiler==0.12.0", "--index", "pypi"]):
        result = runner.invoke(cli_main, ["lab", "republish", *args])
        assert result.exit_code == 2, result.output
        lines = result.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("servefleet lab: "), lines
        assert "lab is not up" not in lines[0]
    assert "allowed: private, vllm, torch, public" in lines[0]


# the lab's indexes, as lab/simulator/build.py fills them (squatters and all)
SERVING: dict[str, dict[Version, list[str]]] = {
    "private": {
        Version("0.12.0"): ["rebel_compiler-0.12.0-py3-none-any.whl"],
        Version("0.12.1"): ["rebel_compiler-0.12.1-py3-none-any.whl"],
    },
    "vllm": {},
    "torch": {},
    "public": {Version("0.12.0"): ["rebel_compiler-0.12.0-py3-none-any.whl"]},
}


def test_the_owner_index_is_chosen_over_the_public_squatter() -> None:
    assert choose_index("rebel-compiler", Version("0.12.0"), SERVING, None) == "private"
    assert choose_index("rebel-compiler", Version("0.12.1"), SERVING, None) == "private"
    assert choose_index("rebel-compiler", Version("0.12.0"), SERVING, "public") == "public"


def test_an_unowned_package_and_an_owned_one_missing_from_its_owner_come_from_public() -> None:
    optimum = {"public": {Version("0.12.0"): ["optimum_rbln-0.12.0-py3-none-any.whl"]}}
    assert choose_index("optimum-rbln", Version("0.12.0"), optimum, None) == "public"
    vllm = {
        "vllm": {Version("0.30.0+cpu"): ["vllm-0.30.0+cpu-py3-none-any.whl"]},
        "public": {Version("0.30.0"): ["vllm-0.30.0-py3-none-any.whl"]},
    }
    assert choose_index("vllm", Version("0.30.0"), vllm, None) == "public"
    assert choose_index("vllm", Version("0.30.0+cpu"), vllm, None) == "vllm"


def test_a_version_no_index_has_lists_what_the_indexes_have() -> None:
    with pytest.raises(LabError) as caught:
        choose_index("rebel-compiler", Version("9.9"), SERVING, None)
    assert str(caught.value) == (
        "no lab index serves rebel-compiler==9.9; the indexes have rebel-compiler "
        "private: 0.12.0, 0.12.1; public: 0.12.0"
    )
    with pytest.raises(LabError, match=r"^no lab index serves nosuch \(any version\)"):
        choose_index("nosuch", Version("1"), {"public": {}}, None)


def test_an_index_that_lacks_the_version_or_two_unowned_copies_are_refused() -> None:
    with pytest.raises(LabError, match=r"--index vllm does not serve .* it is on private, public"):
        choose_index("rebel-compiler", Version("0.12.0"), SERVING, "vllm")
    two = {
        "torch": {Version("1.0"): ["odd-1.0-py3-none-any.whl"]},
        "vllm": {Version("1.0"): ["odd-1.0-py3-none-any.whl"]},
    }
    with pytest.raises(LabError, match="none owns it; choose one with --index"):
        choose_index("odd", Version("1.0"), two, None)


def test_dist_of_reads_wheel_and_sdist_names() -> None:
    assert dist_of("vllm-0.30.0+cpu-py3-none-any.whl") == ("vllm", Version("0.30.0+cpu"))
    assert dist_of("arctic_inference-0.1.1.tar.gz") == ("arctic-inference", Version("0.1.1"))
    assert dist_of("notes.txt") is None and dist_of("bad.whl") is None


# --- rewriting ----------------------------------------------------------------------------------
def _wheel(tmp_path: Path) -> Path:
    return lab_wheels.write_wheel(
        tmp_path / "built",
        "rebel-compiler",
        "0.12.0",
        {"rebel/__init__.py": "__version__ = '0.12.0'\n", "rebel/core.py": "X = 1\n"},
        requires=["numpy>=1"],
    )


def _check_record(data: bytes) -> dict[str, bytes]:
    """Every file of the wheel is in its RECORD with its hash and size, and nothing else is."""
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        files = {name: zf.read(name) for name in zf.namelist()}
    record_name = next(n for n in files if n.endswith(".dist-info/RECORD"))
    listed = {}
    for line in files[record_name].decode().splitlines():
        path, digest, size = line.rsplit(",", 2)
        listed[path] = (digest, size)
    assert set(listed) == set(files)
    for path, body in files.items():
        if path == record_name:
            assert listed[path] == ("", "")
            continue
        want = base64.urlsafe_b64encode(hashlib.sha256(body).digest()).rstrip(b"=").decode()
        assert listed[path] == (f"sha256={want}", str(len(body))), path
    return files


def test_a_rewritten_wheel_has_one_more_module_a_consistent_record_and_installs(
    tmp_path: Path,
) -> None:
    wheel = _wheel(tmp_path)
    old = wheel.read_bytes()
    new = rewrite(wheel.name, old, "private/rebel #1")
    assert hashlib.sha256(new).digest() != hashlib.sha256(old).digest()
    old_files, new_files = _check_record(old), _check_record(new)
    added = set(new_files) - set(old_files)
    assert added == {f"rebel/{MODULE}"}
    for name in old_files:
        if not name.endswith("RECORD"):
            assert new_files[name] == old_files[name], name  # METADATA, WHEEL, modules unchanged
    # again, from the republished one: still one such module, other bytes again
    again = rewrite_wheel(new, "private/rebel #2")
    assert again != new and set(_check_record(again)) == set(new_files)
    assert rewrite_wheel(old, "private/rebel #1") == new  # the same mark gives the same bytes
    target = tmp_path / "site"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--isolated", "--no-deps", "--no-index"]
        + ["--target", str(target), str(_write(tmp_path / "re" / wheel.name, again))],
        capture_output=True,
        text=True,
        env=dict(os.environ, **PIP_ENV),
    )
    assert proc.returncode == 0, proc.stderr
    module = (target / "rebel" / MODULE).read_text()
    assert "REPUBLISHED = 'private/rebel #2'" in module
    assert (target / "rebel_compiler-0.12.0.dist-info" / "METADATA").is_file()


def _write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def _members(data: bytes) -> dict[str, bytes | None]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        out: dict[str, bytes | None] = {}
        for member in tar:
            handle = tar.extractfile(member) if member.isfile() else None
            out[member.name] = handle.read() if handle is not None else None
        return out


def test_a_rewritten_sdist_keeps_its_layout_and_builds_a_wheel_with_the_module(
    tmp_path: Path,
) -> None:
    sdist = lab_sdist.build_sdist(tmp_path / "public")
    old = sdist.read_bytes()
    new = rewrite(sdist.name, old, "public/arctic #1")
    assert new != old
    before, after = _members(old), _members(new)
    assert set(after) - set(before) == {f"arctic_inference-0.1.1/arctic_inference/{MODULE}"}
    assert all(after[name] == body for name, body in before.items())
    assert rewrite_sdist(new, "public/arctic #2") != new
    out = tmp_path / "wheels"
    _write(tmp_path / "buildenv" / "torch" / "__init__.py", b"")  # its build imports torch
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--isolated", "--no-deps", "--no-index"]
        + ["--no-build-isolation", "-w", str(out), str(_write(tmp_path / "re" / sdist.name, new))],
        capture_output=True,
        text=True,
        env=dict(os.environ, **PIP_ENV, PYTHONPATH=str(tmp_path / "buildenv")),
    )
    assert proc.returncode == 0, proc.stderr
    (built,) = out.glob("arctic_inference-0.1.1-*.whl")
    assert f"arctic_inference/{MODULE}" in zipfile.ZipFile(built).namelist()


def test_only_wheels_and_tar_gz_sdists_are_rewritten() -> None:
    with pytest.raises(LabError, match="only wheels and .tar.gz sdists"):
        rewrite("thing-1.0.zip", b"", "x")


# --- the per-lab copy and the index -------------------------------------------------------------
@pytest.fixture
def cache_and_copy(tmp_path: Path) -> tuple[Path, Path]:
    cache = tmp_path / "cache" / "index"
    for index in ("private", "public"):
        (cache / index).mkdir(parents=True)
    wheel = _wheel(tmp_path)
    wheel.rename(cache / "private" / wheel.name)
    serving_copy(cache, tmp_path / "lab" / "index")
    return cache, tmp_path / "lab" / "index"


@pytest.fixture
def served(cache_and_copy: tuple[Path, Path]) -> Iterator[str]:
    with serving(make_server(Config("simple", cache_and_copy[1] / "private"), "127.0.0.1", 0)) as b:
        yield b


def _page_hash(base: str, filename: str) -> str:
    code, _, page = fetch(f"{base}/simple/rebel-compiler/")
    assert code == 200
    found = re.search(rf"{re.escape(filename)}#sha256=([0-9a-f]{{64}})", page.decode())
    assert found, page
    return found.group(1)


def test_a_replaced_file_is_served_with_its_new_hash_and_the_cache_is_untouched(
    cache_and_copy: tuple[Path, Path], served: str
) -> None:
    cache, copy = cache_and_copy
    name = "rebel_compiler-0.12.0-py3-none-any.whl"
    cached = cache / "private" / name
    original = cached.read_bytes()
    assert (copy / "private" / name).stat().st_ino == cached.stat().st_ino  # a hard link
    assert _page_hash(served, name) == hashlib.sha256(original).hexdigest()
    assert versions_on(copy / "private", "rebel-compiler") == {Version("0.12.0"): [name]}
    new = rewrite(name, original, "#1")
    replace_file(copy / "private" / name, new)
    assert _page_hash(served, name) == hashlib.sha256(new).hexdigest()
    assert fetch(f"{served}/files/{name}")[2] == new
    assert cached.read_bytes() == original and cached.stat().st_nlink == 1
    assert [p.name for p in (copy / "private").iterdir()] == [name]  # no temporary left


# --- offline hosts ------------------------------------------------------------------------------
def test_the_offline_ruleset_rejects_new_connections_to_the_bridge_only() -> None:
    rules = ruleset()
    assert f"table inet {layout.OFFLINE_TABLE} {{" in rules
    assert rules.count(f"ip daddr {layout.BRIDGE_IP} ct state new ") == 2
    assert "reject with tcp reset" in rules and "drop" not in rules
    assert rules.index("delete table") < rules.index("chain output")  # replaces an earlier one


def test_offline_hosts_must_be_hosts_of_the_lab() -> None:
    hosts = ["lab1", "lab2", "lab3"]
    assert check_hosts(["lab3", "lab1", "lab3"], hosts, "--offline") == ["lab1", "lab3"]
    with pytest.raises(LabError, match=r"^--offline names host 'lab9'; the lab has lab1, lab2"):
        check_hosts(["lab9"], hosts, "--offline")


def test_lab_up_refuses_an_unknown_offline_host_before_touching_anything(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from servefleet.fleet.lab import fleet

    def never(*_: Any) -> None:
        raise AssertionError("lab up went past its checks")

    monkeypatch.setattr(fleet, "check_can_run", never)
    with pytest.raises(LabError, match="--offline names host 'lab4'"):
        fleet.up(hosts=3, offline=["lab4"])
