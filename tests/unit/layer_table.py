"""servefleet's layers and components, written once: test_layers.py holds every module's imports
to them (and docs/design.md's table to the tree), test_component_files.py each component's files
to the wheel's package data."""

from __future__ import annotations

from pathlib import Path

import servefleet

SRC = Path(servefleet.__file__).resolve().parent

# Top first: a module may import its own layer and the ones after it, never one before it. A
# layer is a package of the same name (``servefleet/<layer>/``; ``spec`` is one module), so a
# module's layer is its package: a new module cannot sit outside one. PLACED would name a package
# that keeps a name of its own inside a layer.
LAYERS = [
    "entry", "fleet", "hostplan", "release", "render", "settings", "kinds", "platforms", "spec", "base",
]  # fmt: skip
PLACED: dict[str, str] = {}  # none left: every package sits in its layer's
ROOT = {"servefleet", "servefleet.__main__"}  # the package's own face: entry
# A component is a package of its own name (``servefleet/<component>/``) that keeps one part of
# the system together across layers; each of its modules sits in the layer its role names here
# (its ``__init__`` too), so a module of a component with no role sits in no layer.
COMPONENTS: dict[str, dict[str, str]] = {
    "router": {"__init__": "base", "plan": "hostplan", "render": "render", "step": "entry"},
}
