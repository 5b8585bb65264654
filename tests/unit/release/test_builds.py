"""Wheels built on the controller from sdist-only packages (src/servefleet/release/builds.py), with the
lab's real arctic-inference sdist (it imports torch and compiles a C++20 extension) served by a
local index: built once, checked against the lock, refused clearly without a build tool."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_host import serving
from lab_sim_support import REPO, load

from servefleet.base import sandbox
from servefleet.fleet.lab.index import Config, make_server
from servefleet.fleet.lab.simulator import (
    fetched as lab_fetched,
    inputs as lab_inputs,
    sdist as lab_sdist,
    wheels as lab_wheels,
)
from servefleet.release import builds, sdists
from servefleet.release.builds import BuildError, build, sdist_only
from servefleet.release.pylock import packages
from servefleet.release.resolve import resolve
from servefleet.release.stack import stack
from servefleet.release.uvbin import uv_binary

PYTHON = "{}.{}".format(*sys.version_info[:2])
INSTALLER = REPO / "src" / "servefleet" / "base" / "remote" / "install_release.py"
installer = load(INSTALLER, "servefleet_remote_install_release")


@pytest.fixture(scope="module")
def public(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """An index with the arctic-inference sdist and what its build needs (setuptools, torch)."""
    root = tmp_path_factory.mktemp("public")
    lab_sdist.build_sdist(root)
    shutil.copy2(lab_fetched.setuptools_wheel(), root)
    lab_wheels.write_wheel(root, "torch", "2.13.0", lab_inputs.package_files("torch", "2.13.0"))
    with serving(make_server(Config("simple", root), "127.0.0.1", 0)) as url:
        yield url + "/simple"


def tree_depth(venv: Path) -> str:
    """What the compiled extension answers in ``venv`` (its output)."""
    return subprocess.run(
        [str(venv / "bin" / "python"), "-c",
         "from arctic_inference.suffix_decoding import _C; print(_C.max_tree_depth())"],
        capture_output=True, text=True,
    ).stdout  # fmt: skip


def arctic_stack(public: str):  # type: ignore[no-untyped-def]
    return stack("suffix", ["arctic-inference==0.1.1"], [], [], public, ">=3.10", ["127.0.0.1"])


@pytest.fixture(scope="module")
def locked(public: str) -> str:
    return resolve(arctic_stack(public))


def test_the_sdist_is_built_once_into_a_wheel_with_its_compiled_extension(
    public: str, locked: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (package,) = sdist_only(locked)
    assert package["name"] == "arctic-inference" and "wheels" not in package
    first = build(package, PYTHON, arctic_stack(public), tmp_path)
    tag = f"cp{PYTHON.replace('.', '')}"
    assert first.fresh and first.path.name == f"arctic_inference-0.1.1-{tag}-{tag}-linux_x86_64.whl"
    names = zipfile.ZipFile(first.path).namelist()
    assert any(n.startswith("arctic_inference/suffix_decoding/_C.cpython-") for n in names)

    def no_second_build(*_args: object) -> None:
        raise AssertionError("built twice")

    monkeypatch.setattr(builds, "build_wheel", no_second_build)
    again = build(package, PYTHON, arctic_stack(public), tmp_path)
    assert (again.fresh, again.path, again.sha256) == (False, first.path, first.sha256)


def test_an_sdist_that_differs_from_the_lock_is_not_built(
    public: str, locked: str, tmp_path: Path
) -> None:
    (package,) = sdist_only(locked.replace(packages(locked)[0]["sdist"]["hashes"]["sha256"],
                                           "0" * 64))  # fmt: skip
    with pytest.raises(BuildError, match=r"the lock has sha256:0{64}, the index served sha256:"):
        build(package, PYTHON, arctic_stack(public), tmp_path)
    assert not list(tmp_path.rglob("*.whl"))


def test_without_cmake_the_build_fails_in_one_line_naming_it(
    public: str, locked: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tools = tmp_path / "bin"
    tools.mkdir()
    for tool in ("c++", "g++", "gcc", "cc"):
        if shutil.which(tool):
            os.symlink(str(shutil.which(tool)), tools / tool)
    monkeypatch.setenv("PATH", str(tools))
    (package,) = sdist_only(locked)
    with pytest.raises(BuildError) as e:
        build(package, PYTHON, arctic_stack(public), tmp_path / "cache")
    assert str(e.value) == (
        "arctic_inference-0.1.1.tar.gz: the build failed on the controller: arctic-inference "
        "0.1.1 cannot be built here: it needs cmake >= 3.18 on PATH"
    )


def test_a_host_gets_the_built_wheel_in_place_of_the_sdist_and_never_builds(
    public: str, locked: str, tmp_path: Path
) -> None:
    (package,) = sdist_only(locked)
    wheel = build(package, PYTHON, arctic_stack(public), tmp_path / "cache")
    rewritten = installer.with_built(locked, [wheel.to_json(str(wheel.path.parent))])
    (entry,) = packages(rewritten)
    assert "sdist" not in entry
    assert entry["wheels"] == [{"path": str(wheel.path), "hashes": {"sha256": wheel.sha256}}]
    from servefleet.release.uvbin import uv_binary

    uv = str(uv_binary())
    subprocess.run([uv, "venv", "-q", "--python", sys.executable, str(tmp_path / "v")], check=True)
    (tmp_path / "pylock.toml").write_text(rewritten)
    done = subprocess.run(
        [uv, "pip", "install", "-q", "--preview-features", "pylock", "--no-build", "--python",
         str(tmp_path / "v" / "bin" / "python"), "-r", str(tmp_path / "pylock.toml")],
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert tree_depth(tmp_path / "v") == "24\n"
    with pytest.raises(SystemExit, match="the lock has no sdist"):
        installer.with_built(locked, [{**wheel.to_json("/x"), "sdist_sha256": "1" * 64}])


def test_a_controller_without_the_hosts_python_says_so() -> None:
    with sandbox.workspace() as space:
        space.put(uv_binary(), 0o500)
        with pytest.raises(BuildError, match="no Python 3.99 on the controller"):
            sdists.find_python("3.99", space)
        found = sdists.find_python(PYTHON, space)
    assert os.path.isabs(found) and found == os.path.realpath(found)


def test_an_offline_install_takes_the_built_wheel_in_place_of_the_sdist(
    public: str, locked: str, tmp_path: Path, reachable: Path
) -> None:
    """sdk_source wheelhouse: the requirements derived from the lock name the sdist's hash; the
    installer swaps in the built wheel's and finds it next to the copy, with no index at all."""
    import json

    from local_release import PYTHON as RELEASE_PYTHON  # one the check's nobody can run

    from servefleet.release.plan import Download, ReleasePlan
    from servefleet.release.uvbin import uv_binary
    from servefleet.release.wheelhouse import offline_requirements

    (package,) = sdist_only(locked)
    wheel = build(package, PYTHON, arctic_stack(public), tmp_path / "cache")
    copy = tmp_path / "copy"  # the wheelhouse copy on the host (no sdist is ever used)
    copy.mkdir()
    plan = ReleasePlan(
        id="rel-offline", path=str(reachable / "release"), python=RELEASE_PYTHON,
        downloads=[Download("arctic-inference", "0.1.1", "http://127.0.0.1:9/simple", False)],
        requirements=[], constraints=[], public_index=None, trusted_hosts=[],
        expect={"arctic-inference": "0.1.1"}, must_have=["arctic-inference"],
        imports=["arctic_inference.suffix_decoding"], installer="uv", uv=str(uv_binary()),
        pylock=locked, built=(wheel.to_json(str(wheel.path.parent)),),
        offline={"find_links": str(copy), "requirements": offline_requirements(locked)},
    )  # fmt: skip
    sdist_hash = f"sha256:{package['sdist']['hashes']['sha256']}"
    assert plan.offline and sdist_hash in plan.offline["requirements"]
    (tmp_path / "plan.json").write_text(json.dumps(plan.to_json()))
    done = subprocess.run([sys.executable, str(INSTALLER), str(tmp_path / "plan.json")],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert tree_depth(reachable / "release") == "24\n"
