"""#32: a pyinfra whose Python cannot import servefleet (installed on its own, another venv's)
run on a fleet repository stops at the first of its files that imports servefleet with one
line: that file, and how to install both (``scaffold.INSTALL_BOTH``), never a
ModuleNotFoundError traceback. Every file `servefleet init` writes that imports servefleet is
run so, alone in a directory, by pyinfra's own CLI in a Python where ``import servefleet``
fails (tests/hosts/test_from_a_wheel.py does it with a pyinfra installed by uv)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from servefleet.fleet.scaffold import INSTALL_BOTH, files

# pyinfra's CLI in a Python where servefleet cannot be imported (a finder ahead of every other)
BARE_PYINFRA = """
import sys
class NoServefleet:
    def find_spec(self, name, path=None, target=None):
        if name == "servefleet" or name.startswith("servefleet."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, NoServefleet())
from pyinfra_cli.main import main
sys.argv = ["pyinfra", *sys.argv[1:]]
main()
"""
IMPORTING = sorted(p for p, text in files().items() if "from servefleet" in text)


def bare_pyinfra(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", BARE_PYINFRA, "-y", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "PYINFRA_PROGRESS": "off"},
    )


def test_the_scaffold_files_that_import_servefleet_are_the_ones_checked() -> None:
    assert "group_data/lab.py" in IMPORTING and "inventories/lab.py" in IMPORTING
    assert {f"deploys/{n}" for n in ("serve.py", "rollback.py")} <= set(IMPORTING)


@pytest.mark.parametrize("rel", IMPORTING)
def test_a_pyinfra_without_servefleet_stops_in_one_line(rel: str, tmp_path: Path) -> None:
    (tmp_path / rel).parent.mkdir(parents=True)
    (tmp_path / rel).write_text(files()[rel])
    (tmp_path / "here.py").write_text('hosts = ["@local"]\n')  # an inventory of its own
    args = {"inventories": [rel, "exec", "--", "true"], "group_data": ["here.py", "exec", "--",
            "true"], "deploys": ["@local", rel]}[rel.split("/")[0]]  # fmt: skip
    proc = bare_pyinfra(tmp_path, *args)
    shown = rel if rel.startswith(("inventories", "deploys")) else str(tmp_path / rel)
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr
    said = [line for line in proc.stderr.splitlines() if line.strip()]  # after pyinfra's own
    assert said[-1] == (
        f"{shown}: No module named 'servefleet'; run the pyinfra installed with servefleet "
        f"({INSTALL_BOTH})"
    ), proc.stderr
    assert all(line.startswith(("-->", "    ")) for line in said[:-1]), proc.stderr


def test_the_check_sees_a_traceback(tmp_path: Path) -> None:
    """The test above can fail: a file importing servefleet unguarded gives pyinfra's
    traceback."""
    (tmp_path / "deploy.py").write_text("from servefleet.entry.deploys import serve\n")
    proc = bare_pyinfra(tmp_path, "@local", "deploy.py")
    assert proc.returncode == 1 and "ModuleNotFoundError" in proc.stderr, proc.stderr
