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
    arguments in ``sys.argv[1:]``), with ``import layout``, ``import trusted``, ``import release_check``
    and ``import content_check`` giving the modules it carries along."""
    carried = "".join(
        f"{mod} = sys.modules[{mod!r}] = types.ModuleType({mod!r})\n"
        f"exec(compile({source(mod + '.py')!r}, {mod + '.py'!r}, 'exec'), {mod}.__dict__)\n"
        for mod in CARRIED
    )
    return f"import sys, types\n{carried}exec(compile({source(name)!r}, {name!r}, 'exec'))\n"


CARRIED = ("layout", "trusted", "release_check", "content_check")  # what a program may import
