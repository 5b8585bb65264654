"""Where the unit tests find the repository's files, wherever under tests/unit/ a test sits."""

from __future__ import annotations

from pathlib import Path

UNIT = Path(__file__).resolve().parent  # tests/unit: these helpers, recipes/ (recipe fixtures)
REPO = UNIT.parents[1]
DATA = REPO / "tests" / "data"
RECIPES = UNIT / "recipes"
REMOTE = REPO / "src" / "servefleet" / "base" / "remote"  # the host programs
SHARED = REPO.parent / "shared"  # the reference copies beside the repository, when present
