"""servefleet: model-serving recipes -> warm, health-checked ``vllm serve`` instances on a fleet.

The core (``recipes``, ``resolve``, ``systemd``) is pure Python with no pyinfra import; the
pyinfra layer (``servefleet.entry.deploys``) only moves a resolved :class:`ServeSpec` onto hosts.
"""

from servefleet.base.errors import RecipeError, ServefleetError
from servefleet.spec import Requirements, Server, ServeSpec

__all__ = ["RecipeError", "Requirements", "ServeSpec", "Server", "ServefleetError"]
