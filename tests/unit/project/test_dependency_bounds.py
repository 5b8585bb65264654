"""#32: the dependencies servefleet is tested with are the ones pyproject.toml allows. pyinfra
(whose private ``pyinfra_cli`` servefleet imports) and uv (whose binary goes to the hosts) are
bounded to one minor version, and the environment the tests run in (setup.sh's, CI's) has a
version inside every bound."""

from __future__ import annotations

import sys
from importlib import metadata

import pytest
from packaging.requirements import Requirement
from packaging.version import Version
from repo_paths import REPO

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

PYPROJECT = REPO / "pyproject.toml"
REQUIRED = [
    r
    for r in map(Requirement, tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"])
    if r.marker is None or r.marker.evaluate()
]


@pytest.mark.parametrize("req", REQUIRED, ids=lambda r: r.name)
def test_the_installed_version_is_inside_the_bound(req: Requirement) -> None:
    installed = metadata.version(req.name)
    assert req.specifier.contains(installed, prereleases=True), f"{req.name} {installed}: {req}"


@pytest.mark.parametrize("name", ["pyinfra", "uv"])
def test_pyinfra_and_uv_are_bounded_to_the_minor_tested(name: str) -> None:
    (req,) = [r for r in REQUIRED if r.name == name]
    installed = Version(metadata.version(name))
    uppers = [Version(s.version) for s in req.specifier if s.operator == "<"]
    lowers = [Version(s.version) for s in req.specifier if s.operator == ">="]
    assert uppers and lowers, f"{req}: needs a lower and an upper bound"
    minor = (installed.major, installed.minor)
    assert lowers[0].release[:2] == minor and uppers[0].release[:2] == (minor[0], minor[1] + 1), (
        f"{req}: bound it to the minor tested ({installed}): >={minor[0]}.{minor[1]},"
        f"<{minor[0]}.{minor[1] + 1}"
    )
