"""Releases from the unit tests' local indexes (the ``index`` fixture of conftest.py, its
packages in local_indexes.py): a sound release plan over them, the host's release installer run
on a plan as the deploy runs it, and a lock's pylock.toml text."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

from lab_sim_support import PIP_ENV, REPO

from servefleet.release.plan import Download, ReleasePlan

INSTALLER = REPO / "src" / "servefleet" / "base" / "remote" / "install_release.py"
# The release's python: the installer checks a release as nobody (#46 item 4), so one nobody
# can run and read (this venv's base python may be in root's 0700 home, as pyenv's is)
PYTHON = "/usr/bin/python3"


@contextlib.contextmanager
def reachable_dir() -> Iterator[Path]:
    """A new directory in /tmp that ``nobody`` can reach (0711; a release's directories are
    0755 on hosts), removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix="servefleet-test-", dir="/tmp"))
    try:
        path.chmod(0o711)
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def release_plan(index: dict[str, str], path: Path) -> ReleasePlan:
    """A sound plan: everything pinned, sfowned from its owner, public packages constrained;
    ``path`` where nobody can reach it (:func:`reachable_dir`)."""
    return ReleasePlan(
        id="rel1",
        path=str(path),
        python=PYTHON,
        downloads=[Download("sfowned", "1.0", index["owner"], auth=True)],
        requirements=["sfpub==1.0"],
        constraints=["sfdep==1.0", "sfpub==1.0"],
        public_index=index["public"],
        trusted_hosts=[],
        expect={"sfdep": "1.0", "sfowned": "1.0", "sfpub": "1.0"},
        must_have=["sfdep", "sfowned", "sfpub"],
        imports=["sfowned", "sfpub"],
        netrc=index["netrc"],
    )


def with_uv(plan: ReleasePlan) -> ReleasePlan:
    """The plan installed by the project's uv instead of pip."""
    from servefleet.release.uvbin import uv_binary

    return replace(plan, installer="uv", uv=str(uv_binary()))


def write_plan(plan: ReleasePlan, tmp_path: Path) -> Path:
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(plan.to_json()))
    return plan_file


def pip_env() -> dict[str, str]:
    """This environment without the machine's pip settings (PIP_* and config files)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("PIP_")} | PIP_ENV


def install(plan: ReleasePlan, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """Run the installer CLI on ``plan``, as the deploy does (the version that installs it)."""
    return subprocess.run(
        [sys.executable, str(INSTALLER), str(write_plan(plan, tmp_path)), "9.8.7"],
        env=pip_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )


PYLOCK = """lock-version = "1.0"
created-by = "uv"
requires-python = ">=3.10"

[[packages]]
name = "a"
version = "1.0"
index = "https://i.example/simple"
wheels = [{ url = "https://i.example/files/a-1.0-py3-none-any.whl", hashes = { sha256 = "%s" } }]

[[packages]]
name = "b"
version = "2.0"
index = "https://i.example/simple"
sdist = { url = "https://i.example/files/b-2.0.tar.gz", hashes = { sha256 = "%s" } }
"""


def pylock(a: str = "1" * 64, b: str = "2" * 64) -> str:
    """A pylock.toml of two packages: a's wheel with sha256 ``a``, b's sdist with ``b``."""
    return PYLOCK % (a, b)
