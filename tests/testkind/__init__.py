"""A test-only kind: a platform servefleet's package knows nothing of ("testbox" hosts), registered
by the tests (:func:`servefleet.kinds.register`) to prove the platform seam: its recipes resolve,
plan, render and run their own driver step through the kind's interface alone (no file under
``src/`` names it). Everything it touches on a host lives in its ``state`` directory.
"""

from testkind.kind import RECIPE, Testkind

__all__ = ["RECIPE", "Testkind"]
