"""The simulated server's requests in flight, the engine's queue (``--max-num-seqs``) and its
shutdown: vLLM 0.30's ``--shutdown-timeout``. A SIMULATION for the servefleet lab.

The queue, as vLLM's scheduler (first come, first served): an admitted generation request waits
until fewer than ``--max-num-seqs`` requests run and none came before it, then runs until it
ends (:meth:`Requests.schedule`, :meth:`Requests.unschedule`); ``vllm:num_requests_running`` and
``vllm:num_requests_waiting`` are the two sets. Each request's times (monotonic) and progress are
its :class:`Flight`. One engine per server (a data-parallel server's engines share the queue).

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
from collections import deque
from dataclasses import dataclass

ABORT_GRACE = 5.0  # seconds the aborted requests get to close their connections


@dataclass(eq=False)
class Flight:
    """One generation request's times (``time.monotonic()``) and progress.

    + prompt: its prompt's tokens
    + arrived: when the server took it
    + scheduled: when it started to run (None: not yet)
    + first: when its first token was ready (None: not yet)
    + last: when its last token so far was ready
    + generated: its tokens so far
    """

    prompt: int
    arrived: float
    scheduled: float | None = None
    first: float | None = None
    last: float | None = None
    generated: int = 0


class Requests:
    """The generation requests in flight, the engine's queue, and the shutdown that drains or
    aborts them.

    + max_num_seqs: the most requests running at once (``--max-num-seqs``)
    """

    def __init__(self, max_num_seqs: int = 1 << 30) -> None:
        self._cond = threading.Condition()
        self._running = 0
        self._aborted = 0
        self.max_num_seqs = max_num_seqs
        self._queue: deque[Flight] = deque()  # admitted, waiting to run, in arrival order
        self._batch: list[Flight] = []  # running
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

    def schedule(self, flight: Flight) -> bool:
        """Queue an admitted request until it may run (fewer than ``max_num_seqs`` running and
        none queued before it), then count it running from now (``flight.scheduled``). False
        when the shutdown aborted it in the queue. Waits on the condition, never polls.

        + flight: the request
        """
        with self._cond:
            self._queue.append(flight)
            try:
                self._cond.wait_for(lambda: self.abort.is_set() or self._next(flight))
            finally:
                self._queue.remove(flight)
                self._cond.notify_all()  # the next one in the queue may run too
            if self.abort.is_set():
                return False
            flight.scheduled = time.monotonic()
            self._batch.append(flight)
            return True

    def _next(self, flight: Flight) -> bool:
        """Whether ``flight`` may run now (the condition held)."""
        return self._queue[0] is flight and len(self._batch) < self.max_num_seqs

    def unschedule(self, flight: Flight) -> None:
        """A request has ended: it no longer runs (nothing if it never ran)."""
        with self._cond:
            if flight in self._batch:  # by identity (eq=False)
                self._batch.remove(flight)
                self._cond.notify_all()

    @property
    def batch(self) -> int:
        """The requests running now."""
        with self._cond:
            return len(self._batch)

    def load(self) -> tuple[int, int, int]:
        """(requests running, requests waiting, tokens the running ones hold: prompt and
        generated)."""
        with self._cond:
            held = sum(f.prompt + f.generated for f in self._batch)
            return len(self._batch), len(self._queue), held

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
        with self._cond:
            self._cond.notify_all()  # the queue's waiters see the abort
        self._idle_within(ABORT_GRACE)
        with self._cond:
            return at_start, self._aborted
