"""What the package ships besides code: the recipes (``SERVEFLEET_RECIPES`` overrides)."""

from __future__ import annotations

import os
from pathlib import Path

RECIPES_DIR = Path(
    os.environ.get("SERVEFLEET_RECIPES") or (Path(__file__).resolve().parents[2] / "recipes")
)
