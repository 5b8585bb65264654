"""A function computed once for each argument tuple, even when several callers ask at the same
time: the deploy plans every host at once, in gevent greenlets, and an ``lru_cache`` lets each of
them miss while the first is still waiting on its subprocess or download (an 8-host first deploy
ran ``uv lock`` 8 times). The lock is ``threading``'s, which gevent makes a greenlet lock. A call
that raises is not kept: the next caller tries again."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Hashable
from typing import Any, TypeVar, cast

F = TypeVar("F", bound=Callable[..., Any])


def once(fn: F) -> F:
    """``fn`` memoized by its positional arguments, one computation at a time for each.

    + fn: a function of hashable positional arguments
    """
    done: dict[tuple[Hashable, ...], Any] = {}
    locks: dict[tuple[Hashable, ...], threading.Lock] = {}
    guard = threading.Lock()

    @functools.wraps(fn)
    def wrapper(*args: Hashable) -> Any:
        with guard:
            lock = locks.setdefault(args, threading.Lock())
        with lock:
            if args not in done:
                done[args] = fn(*args)
            return done[args]

    def cache_clear() -> None:
        with guard:
            done.clear()
            locks.clear()

    wrapper.cache_clear = cache_clear  # type: ignore[attr-defined]
    return cast(F, wrapper)
