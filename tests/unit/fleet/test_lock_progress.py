"""#50: `lock` shows progress on a terminal: a line before each long step (a stack's resolve,
which waits on its indexes: 33 s of silence against one that does not answer), then one every
TICK seconds while it lasts; nothing when the step is quick, nothing at all off a terminal."""

from __future__ import annotations

import threading

import pytest

from servefleet.fleet import lockfleet


def test_a_long_step_says_it_starts_and_how_long_it_has_taken(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(lockfleet, "TICK", 0.05)
    lines: list[str] = []
    ticked = threading.Event()

    def say(line: str) -> None:
        lines.append(line)
        if len(lines) >= 3:
            ticked.set()

    with lockfleet._telling(say, "stack rbln: resolving"):
        assert ticked.wait(10)
    count = len(lines)
    assert lines[0] == "stack rbln: resolving ..."
    assert all(
        line.startswith("stack rbln: resolving: ") and line.endswith(" s") for line in lines[1:]
    )
    assert ticked.wait(0.2) and len(lines) == count  # no tick after it ended


def test_without_a_terminal_nothing_is_said() -> None:
    with lockfleet._telling(None, "stack rbln: resolving"):
        pass
