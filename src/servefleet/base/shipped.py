"""What the package ships besides code, found with importlib.resources so that an installed
servefleet reads its own copy: ``_files/recipes`` and ``_files/templates`` (the unit template),
a component's templates beside its code (``router/templates``, :func:`templates_of`), and the
reference data of each vLLM release, one directory a version (``reference/vllm``, read by
:mod:`servefleet.base.vllm_reference` only).

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
VLLM_REFERENCE_DIR = Path(str(files("servefleet") / "reference" / "vllm"))


def templates_of(package: str) -> Path:
    """The templates a component ships beside its code: ``<package>/templates``, or the
    directory ``SERVEFLEET_TEMPLATES`` names.

    + package: the component's package (``servefleet.router``)
    """
    return Path(os.environ.get("SERVEFLEET_TEMPLATES") or str(files(package) / "templates"))
