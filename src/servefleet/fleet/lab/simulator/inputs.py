"""Where the lab builder's inputs are: the simulator sources (this directory), the packages'
sources under ``packages/``, the recipes and the vLLM reference data the servefleet package
ships; and a package's sources read with its version filled in."""

from __future__ import annotations

import json
from pathlib import Path

SIMULATOR = Path(__file__).resolve().parent
SERVEFLEET = SIMULATOR.parents[2]  # the servefleet package directory (fleet/lab/simulator)
PACKAGES = SIMULATOR / "packages"
RECIPES = SERVEFLEET / "_files" / "recipes"  # the package ships them
# servefleet's reference data of each vLLM release (one directory a version, its files named by
# its reference.json): the simulated vllm carries its version's files in vllm/flags/
REFERENCE = SERVEFLEET / "reference" / "vllm"


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


def reference_files(version: str) -> dict[str, bytes]:
    """The reference data files of vLLM ``version`` that a simulated vllm wheel carries, by
    their archive path (``vllm/flags/<name>``, where the simulator reads them), verbatim and in
    the order of their names.

    + version: a directory under :data:`REFERENCE` (``X.Y.Z``)
    """
    root = REFERENCE / version
    manifest = json.loads((root / "reference.json").read_text())
    names = {manifest[what] for what in ("envs", "metrics", "routes", "parsers", "chat_templates")}
    for table in manifest["tables"].values():
        names |= {table["flags"], table["configs"]}
    return {f"vllm/flags/{name}": (root / name).read_bytes() for name in sorted(names)}
