"""A wheel built from this tree, installed (not editable) into a fresh venv that sees this
interpreter's dependencies through a .pth line: what an operator's `pip install servefleet`
gives. No network: the build runs without isolation, the install with --no-index. Used by
tests/unit/test_packaging.py and tests/hosts/test_from_a_wheel.py."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def clean_env() -> dict[str, str]:
    """This environment without what would make the venv import this tree's servefleet."""
    drop = ("PYTHONPATH", "SERVEFLEET_RECIPES", "SERVEFLEET_TEMPLATES", "VIRTUAL_ENV")
    return {k: v for k, v in os.environ.items() if k not in drop}


def run(cmd: list[str], cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run(
        cmd, cwd=cwd, env=clean_env() if env is None else env, capture_output=True, text=True
    )
    assert proc.returncode == 0, f"{cmd}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def wheel_venv(tmp: Path) -> Path:
    """The venv (``tmp/venv``) with the wheel built from this tree installed."""
    tree = tmp / "tree"  # a copy: the build writes build/ and *.egg-info into its source tree
    tree.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, tree / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    shutil.copytree(REPO / "src", tree / "src", ignore=ignore)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    build = [*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", "dist"]
    run([*build, str(tree)], cwd=tmp, env=os.environ)
    (wheel,) = (tmp / "dist").glob("servefleet-*.whl")
    env = clean_env()
    run([sys.executable, "-m", "venv", "--without-pip", "venv"], cwd=tmp, env=env)
    python = tmp / "venv" / "bin" / "python"
    run([*pip, "--python", str(python), "install", "--no-deps", "--no-index", str(wheel)], tmp, env)
    site = run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"])
    deps = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (Path(site.strip()) / "servefleet-test-deps.pth").write_text("\n".join(sorted(deps)) + "\n")
    # pyinfra's console script, as installing the dependency would have made it
    script = tmp / "venv" / "bin" / "pyinfra"
    script.write_text(
        f"#!{python}\nimport sys\nfrom pyinfra_cli.main import main\nsys.exit(main())\n"
    )
    script.chmod(0o755)
    return tmp / "venv"
