"""servefleet.base.once: one computation per argument tuple, however many callers ask at once (the
deploy plans its hosts at the same time; an lru_cache let an 8-host deploy run uv lock 8 times)."""

from __future__ import annotations

import threading
import time

import pytest

from servefleet.base.once import once


def test_callers_at_the_same_time_share_one_computation() -> None:
    calls: list[str] = []

    @once
    def slow(key: str) -> str:
        calls.append(key)
        time.sleep(0.2)  # the others arrive while the first waits, as greenlets do on uv lock
        return key.upper()

    got: list[str] = []
    threads = [threading.Thread(target=lambda: got.append(slow("a"))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert got == ["A"] * 8 and calls == ["a"]
    assert slow("b") == "B" and calls == ["a", "b"]
    slow.cache_clear()  # type: ignore[attr-defined]
    assert slow("a") == "A" and calls == ["a", "b", "a"]


def test_a_call_that_raises_is_tried_again_by_the_next_caller() -> None:
    tries: list[int] = []

    @once
    def flaky(n: int) -> int:
        tries.append(n)
        if len(tries) == 1:
            raise OSError("not now")
        return n

    with pytest.raises(OSError):
        flaky(1)
    assert flaky(1) == 1 and flaky(1) == 1 and tries == [1, 1]
