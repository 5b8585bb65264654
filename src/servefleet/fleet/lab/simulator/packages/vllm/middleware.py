"""vLLM's ``--middleware`` (``vllm/entrypoints/serve/middleware/register.py``), run around the
simulated routes: each name is ``module.attribute``, imported when the app is built (after the
engine started: a name that does not import fails the server there, with Python's error); a
class is added as Starlette adds it (``app.add_middleware``: the last named outermost, all of
them before vLLM's own API key check), anything else but a coroutine function is vLLM's
``ValueError``. A request goes through the classes as an ASGI call; when the innermost app is
reached, the simulated route answers it, else what the middleware sent is the answer. As
Starlette builds its middleware stack on the first call, a class whose ``__init__`` raises makes
every request a 500. A SIMULATION for the servefleet lab: coroutine-function middleware (vLLM's
``app.middleware("http")``) is not simulated and refused at start.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import threading
import urllib.parse
from collections.abc import Sequence
from typing import Any

from .common import SimError, _log

INTERNAL = (500, [("content-type", "text/plain; charset=utf-8")], b"Internal Server Error")

Answer = tuple[int, list[tuple[str, str]], bytes]


def load(name: str) -> type:
    """The class ``name`` (``module.attribute``) names, as vLLM imports it; SimError as the
    server fails on it."""
    module_path, _, attribute = name.rpartition(".")
    try:
        imported = getattr(importlib.import_module(module_path), attribute)
    except (ImportError, AttributeError, ValueError) as exc:
        raise SimError(f"{type(exc).__name__}: {exc}") from None
    if inspect.isclass(imported):
        return imported
    if inspect.iscoroutinefunction(imported):
        raise SimError(f"the lab's simulated vllm runs middleware classes only, not {name}")
    raise SimError(f"ValueError: Invalid middleware {name}. Must be a function or a class.")


class Stack:
    """The ``--middleware`` classes around the simulated routes (see the module's text)."""

    def __init__(self, names: Sequence[str], root_path: str = "") -> None:
        self.root_path = root_path
        self.app: Any = None
        self.broken = False
        self._here = threading.local()  # the request in hand reached the routes
        classes = [load(name) for name in names]
        if not classes:
            return

        async def routes(scope: Any, receive: Any, send: Any) -> None:
            self._here.reached = True

        app: Any = routes
        try:
            for cls in classes:  # each added later wraps the ones before (Starlette's order)
                app = cls(app)
        except Exception as exc:  # noqa: BLE001 - any error: Starlette's stack is never built
            _log(f"Exception in ASGI application: {type(exc).__name__}: {exc}", "ERROR")
            self.broken = True
        self.app = app

    def answer(
        self, method: str, target: str, headers: Sequence[tuple[str, str]], body: bytes,
        client: tuple[str, int], server: tuple[str, int],
    ) -> Answer | None:  # fmt: skip
        """What the middleware answers a request, or None when it reached the routes."""
        if self.app is None:
            return None
        if self.broken:
            return INTERNAL
        path, _, query = target.partition("?")
        scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "method": method,
            "scheme": "http",
            "path": urllib.parse.unquote(path),
            "raw_path": path.encode("latin-1"),
            "root_path": self.root_path,
            "query_string": query.encode("latin-1"),
            "headers": [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers],
            "client": client,
            "server": server,
            "state": {},
        }
        sent: list[dict[str, Any]] = []
        fed = False

        async def receive() -> dict[str, Any]:
            nonlocal fed
            if fed:
                await asyncio.Event().wait()  # no more: the client keeps the connection
            fed = True
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        self._here.reached = False
        try:
            asyncio.run(self.app(scope, receive, send))
        except Exception as exc:  # noqa: BLE001 - uvicorn answers any error 500
            _log(f"Exception in ASGI application: {type(exc).__name__}: {exc}", "ERROR")
            return INTERNAL
        if self._here.reached and not sent:
            return None
        starts = [m for m in sent if m.get("type") == "http.response.start"]
        if len(starts) != 1:  # uvicorn: returned without starting (or twice): 500
            return INTERNAL
        out = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in starts[0].get("headers", [])]
        data = b"".join(m.get("body", b"") for m in sent if m.get("type") == "http.response.body")
        return int(starts[0]["status"]), out, data
