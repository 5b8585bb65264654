"""What the package ships besides code, found with importlib.resources so that an installed
servefleet reads its own copy: ``_files/recipes`` and ``_files/templates`` (the unit template).

``SERVEFLEET_RECIPES`` / ``SERVEFLEET_TEMPLATES`` point at other directories instead.
"""

from __future__ import annotations

import os
from importlib.resources import files
from pathlib import Path

FILES = Path(str(files("servefleet") / "_files"))
RECIPES_DIR = Path(os.environ.get("SERVEFLEET_RECIPES") or FILES / "recipes")
TEMPLATES_DIR = Path(os.environ.get("SERVEFLEET_TEMPLATES") or FILES / "templates")
