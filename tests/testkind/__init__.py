"""A test-only recipe family and its platform, which servefleet's package knows nothing of
("testbox" hosts), registered by the tests (:func:`servefleet.kinds.register`,
:func:`servefleet.platforms.register`: :func:`register_both`) to prove both seams: its recipes
resolve, plan, render and run their own driver step through the interfaces alone (no file under
``src/`` names it). Everything it touches on a host lives in its ``state`` directory.
"""

from __future__ import annotations

from servefleet import kinds, platforms
from testkind.kind import RECIPE, Testkind
from testkind.platform import Testbox

__all__ = ["RECIPE", "Testbox", "Testkind", "register_both", "unregister_both"]


def register_both(state: str, writes: str | None = None) -> tuple[Testkind, Testbox]:
    """The family and its platform, registered (the platform first: the family names it).

    + state: the directory that stands for the host's devices and driver
    + writes: the driver version its install writes (default: the wanted one)
    """
    platform, kind = Testbox(state, writes), Testkind()
    platforms.register(platform)
    try:
        kinds.register(kind)
    except Exception:
        platforms.unregister(platform)
        raise
    return kind, platform


def unregister_both(kind: Testkind, platform: Testbox) -> None:
    """Take them out of the registries again."""
    kinds.unregister(kind)
    platforms.unregister(platform)
