"""What every lab HTTP server shares (stdlib only).

The handler: TCP_NODELAY on each connection, one log line per request on stderr, HEAD and GET
answered by one ``_serve``, and ``_send`` for a whole response. A 200 carries an ETag (its body's
sha256 unless the handler gives its own) and a request whose ``If-None-Match`` names it gets 304,
as a real index answers an installer that revalidates its cache (uv re-downloaded and unpacked
every wheel on every install before).

The server: a thread per connection and a listen backlog of 128. The stdlib's 5 dropped the SYNs
of an installer's parallel connections, and each dropped one waited for the kernel's 1 s
retransmission (a 0.9 s stall in uv's resolution).
"""

from __future__ import annotations

import hashlib
import socket
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Handler(BaseHTTPRequestHandler):
    """A handler whose subclass implements ``_serve(head)``."""

    def setup(self) -> None:
        # the headers and the body are two writes: with Nagle's algorithm on, the body waited for
        # the client's delayed ACK (40 ms on Linux) on every response, so every index page and
        # file a host's installer fetched took 40 ms more
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        super().setup()

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
        headers = dict(headers or {})
        if code == 200:
            etag = headers.setdefault("ETag", f'"{hashlib.sha256(body).hexdigest()}"')
            if etag in (t.strip() for t in self.headers.get("If-None-Match", "").split(",")):
                code, body, head = 304, b"", True
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        if not head:
            self.wfile.write(body)


class Server(ThreadingHTTPServer):
    """A threading HTTP server with a listen backlog for parallel installers."""

    daemon_threads = True
    request_queue_size = 128
