"""What the package ships besides code, found with importlib.resources so that an installed
servefleet reads its own copy: ``_files/recipes`` and ``_files/templates`` (the unit template),
a component's templates beside its code (``router/templates``, :func:`templates_of`), and the
dumps of vLLM's real ``vllm serve`` parser that the lab's simulator parses with (the one flag
table, :mod:`servefleet.base.flags`).

``SERVEFLEET_RECIPES`` / ``SERVEFLEET_TEMPLATES`` point at other directories instead (the latter
at one that holds every template: the components' too).
"""

from __future__ import annotations

import os
from importlib.resources import files
from pathlib import Path

FILES = Path(str(files("servefleet") / "_files"))
RECIPES_DIR = Path(os.environ.get("SERVEFLEET_RECIPES") or FILES / "recipes")
TEMPLATES_DIR = Path(os.environ.get("SERVEFLEET_TEMPLATES") or FILES / "templates")
VLLM_FLAGS_DIR = Path(
    str(files("servefleet") / "fleet" / "lab" / "simulator" / "packages" / "vllm" / "flags")
)


def templates_of(package: str) -> Path:
    """The templates a component ships beside its code: ``<package>/templates``, or the
    directory ``SERVEFLEET_TEMPLATES`` names.

    + package: the component's package (``servefleet.router``)
    """
    return Path(os.environ.get("SERVEFLEET_TEMPLATES") or str(files(package) / "templates"))
