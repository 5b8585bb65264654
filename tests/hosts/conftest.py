"""The lab fleet for host tests: one 3-host lab for the whole session (``servefleet lab up``),
torn down at the end. Tests that take the lab down or crash it are marked ``lab_destructive``
and run last; they leave a fresh 3-host lab behind and refresh the fixture's state in place."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from labhelpers import lab_up, servefleet


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "lab_destructive: takes the session lab down or crashes it (runs last)"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.get_closest_marker("lab_destructive") is not None)


@pytest.fixture(scope="session")
def lab() -> Iterator[dict[str, Any]]:
    """The lab state (``servefleet.fleet.lab.state.load_state()``) of a 3-host lab up for the session."""
    state = lab_up()
    try:
        yield state
    finally:
        servefleet("lab", "down", check=False)


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return Path(__file__).resolve().parents[2]
