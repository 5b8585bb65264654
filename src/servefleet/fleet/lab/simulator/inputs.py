"""Where the lab builder's inputs are: the simulator sources (this directory), the packages'
sources under ``packages/``, the recipes the servefleet package ships; and a package's sources
read with its version filled in."""

from __future__ import annotations

from pathlib import Path

SIMULATOR = Path(__file__).resolve().parent
SERVEFLEET = SIMULATOR.parents[2]  # the servefleet package directory (fleet/lab/simulator)
PACKAGES = SIMULATOR / "packages"
RECIPES = SERVEFLEET / "_files" / "recipes"  # the package ships them


def package_files(
    top: str, version: str, squatter: bool = False, exclude: tuple[str, ...] = ()
) -> dict[str, str]:
    """The sources of package ``top`` (a dir under packages/) with the version filled in.

    + top: a path under packages/, e.g. ``rebel`` or ``optimum/rbln``
    + version: replaces ``@VERSION@``
    + squatter: flip ``__servefleet_squatter__`` to True
    + exclude: file names to leave out
    """
    out: dict[str, str] = {}
    for path in sorted((PACKAGES / top).rglob("*.py")):
        if path.name in exclude or "__pycache__" in path.parts:
            continue
        text = path.read_text().replace("@VERSION@", version)
        if squatter:
            text = text.replace("__servefleet_squatter__ = False", "__servefleet_squatter__ = True")
            text = text.replace('"""', '"""SQUATTER (not from the RBLN index). ', 1)
        out[path.relative_to(PACKAGES).as_posix()] = text
    return out
