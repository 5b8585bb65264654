"""servefleet's own version, written once: ``servefleet --version`` prints it, and it is recorded
where an operator later asks "which servefleet did this": in the lock, in each release's marker
(the servefleet that installed it) and in the host's desired and good states (the one that last
converged its instances); ``status`` shows it."""

from __future__ import annotations

import importlib.metadata

try:
    VERSION = importlib.metadata.version("servefleet")
except importlib.metadata.PackageNotFoundError:  # pragma: no cover (run from a bare checkout)
    VERSION = "0+unknown"
