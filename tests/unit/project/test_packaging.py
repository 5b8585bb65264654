"""The package works installed: a wheel built from the tree, installed into a fresh venv, run
from a directory outside the repository, finds its recipes, unit template and data defaults.

The build runs without build isolation and the installs with --no-index: no network. Building
needs bdist_wheel in this interpreter (the dev extra's ``wheel``; ./setup.sh installs it): without
it the test skips, except in CI (``CI=true``), where it fails.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from pathlib import Path

import pytest
from click.testing import CliRunner
from wheel_venv import clean_env, run, wheel_venv

from servefleet.base.vllm_reference import MANIFEST, known, reference
from servefleet.entry.cli import main
from servefleet.fleet.datadoc import data_table
from servefleet.kinds import list_recipes

CREDS = {"RBLN_INDEX_USER": "u", "RBLN_INDEX_PASSWORD": "p"}
SEED = ["rbln/gpt-oss-120b", "--target", "throughput", "--set", "lmcache=cpu"]

# Run by pyinfra from outside the repository: the installed package's defaults reach a deploy
# through @deploy(data_defaults=...), host_settings() outside any deploy, and every servefleet
# deploy holds them.
DEPLOY = """
from pyinfra import host
from pyinfra.api import deploy

from servefleet.entry import deploys
from servefleet.settings.table import DEFAULTS


@deploy("Show the data", data_defaults=DEFAULTS)
def show() -> None:
    print(f"inside a deploy: serve_base_port={host.data.get('serve_base_port')}")


print(f"outside: serve_base_port={host.data.get('serve_base_port')}")
print(f"host_settings: base_port={deploys.host_settings().serve_base_port}")
names = ("driver", "stack", "models", "serve", "rollback")
# the defaults reach a deploy through host_settings (the key table), not through pyinfra's
# data_defaults, which would be set only after host_plan() has read the data (#33)
held = [n for n in names if getattr(getattr(deploys, n)._inner, "deploy_data", None)]
print(f"servefleet deploys hold data_defaults: {held}")
show()
"""


def _can_build_wheels() -> bool:
    return any(
        importlib.util.find_spec(m) is not None for m in ("wheel", "setuptools.command.bdist_wheel")
    )


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the built wheel installed (not editable), seeing this interpreter's
    dependencies through a .pth line (so not its editable servefleet, whose .pth is not read)."""
    if not _can_build_wheels():
        reason = "no bdist_wheel in this interpreter (the dev extra's wheel: run ./setup.sh)"
        if os.environ.get("CI", "").lower() in ("true", "1"):
            pytest.fail(f"CI=true: {reason}", pytrace=False)
        pytest.skip(reason)
    return wheel_venv(tmp_path_factory.mktemp("packaging"))


def installed(venv: Path, tmp_path: Path, *cmd: str) -> str:
    """Run a command of the venv (bin/NAME) from a directory outside the repository."""
    return run([str(venv / "bin" / cmd[0]), *cmd[1:]], cwd=tmp_path, env={**clean_env(), **CREDS})


def here(*args: str) -> str:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def test_the_venv_imports_the_installed_package(venv: Path, tmp_path: Path) -> None:
    path = installed(
        venv, tmp_path, "python", "-c", "import servefleet; print(servefleet.__file__)"
    )
    assert Path(path.strip()).is_relative_to(venv)


def test_installed_cli_finds_the_shipped_recipes_and_template(venv: Path, tmp_path: Path) -> None:
    names = installed(venv, tmp_path, "servefleet", "recipes", "list").splitlines()
    assert names == list_recipes() and "rbln/gpt-oss-120b" in names
    shell = ["resolve", "rbln/gpt-oss-120b", "--format", "shell"]
    assert installed(venv, tmp_path, "servefleet", *shell) == here(*shell)
    unit = ["resolve", *SEED, "--format", "unit"]
    assert installed(venv, tmp_path, "servefleet", *unit) == here(*unit)
    assert installed(venv, tmp_path, "python", "-m", "servefleet.fleet.datadoc") == data_table()


def test_installed_defaults_reach_a_deploy(venv: Path, tmp_path: Path) -> None:
    (tmp_path / "deploy.py").write_text(DEPLOY)
    out = installed(venv, tmp_path, "python", "-m", "pyinfra", "-y", "@local", "deploy.py")
    assert "outside: serve_base_port=None" in out
    assert "host_settings: base_port=8000" in out
    assert "servefleet deploys hold data_defaults: []" in out
    assert "inside a deploy: serve_base_port=8000" in out


REFERENCE_FILES = """
import hashlib
from servefleet.base.vllm_reference import MANIFEST, known, reference
for version in known():
    ref = reference(version)
    for path in (ref.root / MANIFEST, *ref.files()):
        print(version, path.relative_to(ref.root.parent), hashlib.sha256(path.read_bytes()).hexdigest())
print(reference().root)
"""


def test_the_wheel_ships_the_vllm_reference_data(venv: Path, tmp_path: Path) -> None:
    """Every vLLM version's reference data is in the wheel (package data ``reference/**``), and
    the installed package reads its own copy, byte for byte the tree's."""
    out = installed(venv, tmp_path, "python", "-c", REFERENCE_FILES).splitlines()
    assert Path(out[-1]).is_relative_to(venv)
    tree = [
        f"{v} {p.relative_to(reference(v).root.parent)} {hashlib.sha256(p.read_bytes()).hexdigest()}"
        for v in known()
        for p in (reference(v).root / MANIFEST, *reference(v).files())
    ]
    assert out[:-1] == tree and len(tree) == 10 * len(known())
