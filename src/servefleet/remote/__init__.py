"""The programs servefleet runs on hosts: stdlib-only files, each importing only the standard
library and its neighbours here (``layout`` is the host contract). The deploy uploads them to
``<serve_root>/lib``; a fact that must work on a host that holds nothing yet sends its program
inline (:func:`inline`).

This package's own code runs on the controller only and is never uploaded.
"""

from __future__ import annotations

from pathlib import Path

REMOTE = Path(__file__).resolve().parent


def source(name: str) -> str:
    """The text of the host program ``name`` (``probe.py``)."""
    return (REMOTE / name).read_text()


def inline(name: str) -> str:
    """The host program ``name`` as one ``python3 -c`` argument: it runs as ``__main__`` (its
    arguments in ``sys.argv[1:]``), with ``import layout`` giving the layout it carries along."""
    return (
        "import sys, types\n"
        "layout = sys.modules['layout'] = types.ModuleType('layout')\n"
        f"exec(compile({source('layout.py')!r}, 'layout.py', 'exec'), layout.__dict__)\n"
        f"exec(compile({source(name)!r}, {name!r}, 'exec'))\n"
    )
