"""The simulated server's requests in flight and its shutdown: vLLM 0.30's ``--shutdown-timeout``.
A SIMULATION for the servefleet lab.

What vLLM does on SIGTERM (or SIGINT), read from its source (``vllm/entrypoints/launchers/
launcher.py``: ``serve_http``'s ``handle_shutdown``; the PRs that added the flag, #34730 and
#36666; its test ``tests/entrypoints/launchers/test_shutdown.py``), and what this module models:

- a second signal changes nothing;
- from the signal on, the engine takes no new request: the HTTP listener stays open (uvicorn is
  told to exit only once the engine has stopped) and a new generation request is refused. Here:
  HTTP 503 with vLLM's error body, and ``/health`` answers 503 (vLLM's docs of the drain,
  #36258). NOT CONFIRMED: the exact status and body of that refusal in 0.30.0 (vLLM's own test
  accepts a 503, a 500 or a refused connection) and whether 0.30.0's /health already says 503;
- ``--shutdown-timeout 0`` (the default, vLLM's "abort" mode): every request in flight is
  aborted at once; ``N > 0`` ("drain"): the requests in flight run on for up to N seconds (the
  wait ends as soon as none is left), then the rest are aborted;
- then the listener closes and the process exits 0.

An aborted request here gets nothing more: a streamed one stops after its last token event,
without ``data: [DONE]`` and without the end of its chunked body; a whole answer is never sent,
the connection is closed. NOT CONFIRMED: real vLLM may instead end an aborted request with
``finish_reason: "abort"`` (its shutdown test counts that, a 500 or a connection error as an
abort); a client gets less than its whole answer either way.
"""

from __future__ import annotations

import threading
import time

ABORT_GRACE = 5.0  # seconds the aborted requests get to close their connections


class Requests:
    """The generation requests in flight, and the shutdown that drains or aborts them."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._running = 0
        self._aborted = 0
        self.draining = False  # set at the signal: no request is admitted any more
        self.abort = threading.Event()  # set when the requests still running must stop

    @property
    def running(self) -> int:
        with self._cond:
            return self._running

    def admit(self) -> bool:
        """Count a new request in flight; False once the server is shutting down."""
        with self._cond:
            if self.draining:
                return False
            self._running += 1
            return True

    def done(self, aborted: bool = False) -> None:
        """A request admitted by :meth:`admit` has ended (``aborted``: cut by the shutdown)."""
        with self._cond:
            self._running -= 1
            self._aborted += aborted
            self._cond.notify_all()

    def _idle_within(self, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        with self._cond:
            return self._cond.wait_for(
                lambda: self._running == 0, timeout=max(0.0, deadline - time.monotonic())
            )

    def shut_down(self, timeout: float) -> tuple[int, int]:
        """Stop admitting, let the requests in flight run for up to ``timeout`` seconds (0 or
        less: not at all), then abort the rest and give them :data:`ABORT_GRACE` to close.
        Returns (requests in flight at the start, requests aborted)."""
        with self._cond:
            self.draining = True
            at_start = self._running
        if timeout > 0:
            self._idle_within(timeout)
        self.abort.set()
        self._idle_within(ABORT_GRACE)
        with self._cond:
            return at_start, self._aborted
