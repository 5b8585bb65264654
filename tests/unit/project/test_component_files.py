"""A component's files beside its code (``router/templates/``) ship in the wheel: each matches a
glob of pyproject's package data (test_packaging.py beside this builds and installs the wheel;
this is the cheap check that a new file is not left out of it), and its templates are found
where the package is installed from (``base/shipped.templates_of``)."""

from __future__ import annotations

import sys
from pathlib import Path

from layer_table import COMPONENTS, SRC

from servefleet.router import render

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

PYPROJECT = SRC.parents[1] / "pyproject.toml"


def shipped() -> set[Path]:
    """Every file pyproject's package data puts in the wheel beside servefleet's code."""
    globs = tomllib.loads(PYPROJECT.read_text())["tool"]["setuptools"]["package-data"]
    return {p for pattern in globs["servefleet"] for p in SRC.glob(pattern) if p.is_file()}


def test_every_file_beside_a_components_code_is_package_data() -> None:
    data = shipped()
    for component in COMPONENTS:
        beside = [p for p in (SRC / component).rglob("*")
                  if p.is_file() and p.suffix not in (".py", ".pyc")]  # fmt: skip
        assert beside, component
        assert [p for p in beside if p not in data] == [], component


def test_the_routers_templates_are_found_beside_it() -> None:
    assert render.TEMPLATES.resolve() == SRC / "router" / "templates"
    names = {p.name for p in render.TEMPLATES.iterdir()}
    assert {"router.service.j2", "router-proxy.service.j2", "router-proxy.conf.j2"} <= names
