"""The servers' path guard (#46 item 1): an ASGI middleware vLLM loads from
``--middleware servefleet_paths.OpenPaths``, outermost (vLLM adds ``--middleware`` last, so it
runs before its API key check), answering only the paths of ``$SERVEFLEET_OPEN_PATHS``
(``serve_open_paths``, split by spaces; one ending in ``/`` takes every path under it) and
``404`` to any other, as FastAPI answers a path it does not serve. vLLM's ``--api-key`` guards
``/v1`` and a few other prefixes only: ``/invocations`` runs inference without it and
``/scale_elastic_ep`` changes the engine.

The path is the one vLLM's routes and its key check match: the request's (percent-decoded) path
without the app's ``root_path``. A request that is not HTTP or a WebSocket (the lifespan) passes.
Without ``$SERVEFLEET_OPEN_PATHS`` the guard refuses to start: it never serves everything.

Runs inside every server, as the serve user, from ``<serve_root>/lib/asgi`` (root's; on the
servers' ``PYTHONPATH``, the directory holds this file only). Stdlib only.
"""

from __future__ import annotations

import os
from typing import Any

OPEN_PATHS_VAR = "SERVEFLEET_OPEN_PATHS"  # layout.OPEN_PATHS_VAR (this file imports nothing)
NOT_FOUND = b'{"detail":"Not Found"}'  # FastAPI's answer to a path it does not serve


def rules(text: str) -> tuple[frozenset[str], tuple[str, ...]]:
    """The exact paths and the prefixes (those ending in ``/``) of ``text``, split by spaces."""
    words = text.split()
    return (
        frozenset(w for w in words if not w.endswith("/")),
        tuple(w for w in words if w.endswith("/")),
    )


class OpenPaths:
    """vLLM's ``--middleware``: a pure ASGI app around vLLM's (see the module's text)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        text = os.environ.get(OPEN_PATHS_VAR)
        if text is None:
            raise RuntimeError(f"${OPEN_PATHS_VAR} is not set: the path guard serves no path")
        self.exact, self.prefixes = rules(text)

    def allows(self, path: str) -> bool:
        """Whether ``path`` (without the app's root path) is one the server answers."""
        return path in self.exact or path.startswith(self.prefixes)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        kind = scope["type"]
        if kind not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        path = scope["path"].removeprefix(scope.get("root_path", ""))
        if self.allows(path):
            await self.app(scope, receive, send)
        elif kind == "websocket":  # closed before it is accepted: the server answers 403
            await send({"type": "websocket.close", "code": 1008})
        else:
            headers = [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(NOT_FOUND)).encode()),
            ]
            await send({"type": "http.response.start", "status": 404, "headers": headers})
            await send({"type": "http.response.body", "body": NOT_FOUND})
