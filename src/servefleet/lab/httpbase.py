"""What every lab HTTP server's handler shares (stdlib only): one log line per request on stderr,
HEAD and GET answered by one ``_serve``, and ``_send`` for a whole response."""

from __future__ import annotations

import sys
from http.server import BaseHTTPRequestHandler


class Handler(BaseHTTPRequestHandler):
    """A handler whose subclass implements ``_serve(head)``."""

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib signature
        sys.stderr.write(f"{self.address_string()} {format % args}\n")

    def do_HEAD(self) -> None:  # noqa: N802 - stdlib name
        self._serve(head=True)

    def do_GET(self) -> None:  # noqa: N802 - stdlib name
        self._serve(head=False)

    def _serve(self, head: bool) -> None:
        raise NotImplementedError

    def _send(
        self,
        code: int,
        body: bytes,
        ctype: str,
        headers: dict[str, str] | None = None,
        head: bool = False,
    ) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if not head:
            self.wfile.write(body)
