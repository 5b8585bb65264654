"""A wheel built from this tree, installed (not editable) into a fresh venv that sees this
interpreter's dependencies through a .pth line: what an operator's `pip install servefleet`
gives. No network: the build runs without isolation, the install with --no-index. Used by
tests/unit/project/test_packaging.py and tests/hosts/test_from_a_wheel.py.

The README's "Install a controller" commands are read here (:func:`readme_install`) and run by
:func:`quick_start`, which the wheel test calls as they are written, its ``uv tool install``
included (in the environment :func:`tool_env` makes: the tools and their executables under the
test's directory, the versions this interpreter has): the README is their one source, and
tests/unit/project/test_readme.py holds what they may be."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
INSTALL_SECTION = "## Install a controller"
RUNNABLE = ("servefleet", "pyinfra")  # the installed commands quick_start runs after the install
INSTALL = ["uv", "tool", "install", "--with-executables-from", "pyinfra"]  # then the wheel


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


PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check"]


def build_wheel(tmp: Path) -> Path:
    """The wheel of this tree, built in ``tmp/dist`` (from a copy in ``tmp/tree``), offline."""
    tree = tmp / "tree"  # a copy: the build writes build/ and *.egg-info into its source tree
    tree.mkdir(parents=True)
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(REPO / name, tree / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    shutil.copytree(REPO / "src", tree / "src", ignore=ignore)
    build = [*PIP, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", "dist"]
    run([*build, str(tree)], cwd=tmp, env=os.environ)
    return built_wheel(tmp)


def wheel_venv(tmp: Path) -> Path:
    """The venv (``tmp/venv``) with the wheel built from this tree installed."""
    wheel = build_wheel(tmp)
    env = clean_env()
    run([sys.executable, "-m", "venv", "--without-pip", "venv"], cwd=tmp, env=env)
    python = tmp / "venv" / "bin" / "python"
    run([*PIP, "--python", str(python), "install", "--no-deps", "--no-index", str(wheel)], tmp, env)
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


def tool_env(tmp: Path) -> dict[str, str]:
    """An environment in which the README's ``uv tool install`` and the commands it puts on PATH
    run as on an operator's machine, kept under ``tmp``: ``uv`` (this interpreter's uv package's
    binary) on PATH, the tools in ``tmp/tools`` and their executables in ``tmp/bin`` (first on
    PATH; no directory holding another servefleet or pyinfra is), this interpreter as the tools'
    Python, and every package at the version this interpreter has (``UV_CONSTRAINT``): the set
    the tests ran with, from the index or uv's cache.

    + tmp: the test's directory
    """
    import uv

    links = tmp / "uv-bin"
    links.mkdir()
    (links / "uv").symlink_to(uv.find_uv_bin())
    pins: dict[str, str] = {}  # the first of a name on sys.path is the one imported
    for dist in metadata.distributions():
        name = canonicalize_name(dist.metadata["Name"] or "")
        if name and name != "servefleet":
            pins.setdefault(name, f"{name}=={dist.version}")
    constraints = tmp / "constraints.txt"
    constraints.write_text("\n".join(sorted(pins.values())) + "\n")
    others = [d for d in os.environ["PATH"].split(os.pathsep)
              if d and not any(Path(d, c).exists() for c in RUNNABLE)]  # fmt: skip
    return {
        **clean_env(),
        "PATH": os.pathsep.join([str(tmp / "bin"), str(links), *others]),
        "UV_TOOL_DIR": str(tmp / "tools"),
        "UV_TOOL_BIN_DIR": str(tmp / "bin"),
        "UV_PYTHON": sys.executable,
        "UV_PYTHON_DOWNLOADS": "never",
        "UV_CONSTRAINT": str(constraints),
    }


Run = Callable[[Path, list[str]], object]


def quick_start(commands: list[list[str]], wheel: Path, cwd: Path, run: Run) -> Path:
    """Run the README's install commands as an operator would, each as it is written.

    The first must install the wheel built here by its file name, with pyinfra's executables
    (``uv tool install --with-executables-from pyinfra FILE``), run where the wheel is
    (``cwd``); ``cd DIR`` moves on; ``servefleet`` and ``pyinfra`` (the ones that install put
    on PATH) run in the directory reached. Any other command is refused (AssertionError).
    Returns the directory the commands end in (the fleet repository).

    + commands: :func:`readme_install`'s
    + wheel: the wheel built from this tree
    + cwd: where the operator starts, with the wheel
    + run: runs one argv in a directory (the test's, in :func:`tool_env`, checking its status)
    """
    install, *rest = commands
    assert install == [*INSTALL, wheel.name], (
        f"README.md installs {shlex.join(install)}, the wheel test installs "
        f"{shlex.join([*INSTALL, wheel.name])} (the wheel built from this tree, pyinfra beside it)"
    )
    run(cwd, install)
    for argv in rest:
        if argv[0] == "cd" and len(argv) == 2:
            cwd = cwd / argv[1]
            continue
        assert argv[0] in RUNNABLE, (
            f"README.md's install block runs {shlex.join(argv)}: the wheel test runs only "
            f"{', '.join(RUNNABLE)} and cd"
        )
        run(cwd, argv)
    return cwd


def built_wheel(tmp: Path) -> Path:
    """The wheel :func:`wheel_venv` built in ``tmp``."""
    (wheel,) = (tmp / "dist").glob("servefleet-*.whl")
    return wheel
