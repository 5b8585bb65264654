"""A wheel built from this tree, installed (not editable) into a fresh venv that sees this
interpreter's dependencies through a .pth line: what an operator's `pip install servefleet`
gives. No network: the build runs without isolation, the install with --no-index. Used by
tests/unit/test_packaging.py and tests/hosts/test_from_a_wheel.py.

The README's "Install a controller" commands are read here (:func:`readme_install`) and run by
:func:`quick_start`, which the wheel test calls: the README is their one source, and
tests/unit/test_readme.py holds what they may be."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
INSTALL_SECTION = "## Install a controller"
RUNNABLE = ("servefleet", "pyinfra")  # the installed commands quick_start runs from the venv


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
    wheel = built_wheel(tmp)
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


def readme_install(text: str | None = None) -> list[list[str]]:
    """The commands the README's "Install a controller" block shows, in order, one argv each
    (its lines split at ``&&``, comments dropped): what an operator types.

    + text: a README's text (default: README.md's)
    """
    text = README.read_text() if text is None else text
    _, found, section = text.partition(f"\n{INSTALL_SECTION}\n")
    block = re.search(r"```sh\n(.*?)\n```", section, re.S)
    assert found and block, f"README.md: no {INSTALL_SECTION!r} section with an sh block"
    out: list[list[str]] = []
    for line in block.group(1).splitlines():
        argv: list[str] = []
        for word in [*shlex.split(line, comments=True), "&&"]:
            if word != "&&":
                argv.append(word)
            elif argv:
                out.append(argv)
                argv = []
    return out


Run = Callable[[Path, list[str]], object]


def quick_start(commands: list[list[str]], wheel: Path, venv: Path, cwd: Path, run: Run) -> Path:
    """Run the README's install commands as an operator would, from the installed wheel.

    The first command must install the wheel built here by its file name (``uv tool install
    FILE``; the venv has it installed already, as the README's ``pip install ... in a venv``
    gives, with no network); ``cd DIR`` moves on; ``servefleet`` and ``pyinfra`` run from the
    venv's bin/ in the directory reached. Any other command is refused (AssertionError).
    Returns the directory the commands end in (the fleet repository).

    + commands: :func:`readme_install`'s
    + wheel: the wheel built from this tree
    + venv: the venv it is installed in
    + cwd: where the operator starts
    + run: runs one argv in a directory (the test's, which checks its exit status)
    """
    install, *rest = commands
    assert install == ["uv", "tool", "install", wheel.name], (
        f"README.md installs {shlex.join(install)}, the wheel built from this tree is {wheel.name}"
    )
    for argv in rest:
        if argv[0] == "cd" and len(argv) == 2:
            cwd = cwd / argv[1]
            continue
        assert argv[0] in RUNNABLE, (
            f"README.md's install block runs {shlex.join(argv)}: the wheel test runs only "
            f"{', '.join(RUNNABLE)} and cd"
        )
        run(cwd, [str(venv / "bin" / argv[0]), *argv[1:]])
    return cwd


def built_wheel(tmp: Path) -> Path:
    """The wheel :func:`wheel_venv` built in ``tmp``."""
    (wheel,) = (tmp / "dist").glob("servefleet-*.whl")
    return wheel
