"""Rollout planning (pure): inventory order, --limit, canary and batches."""

from __future__ import annotations

from pathlib import Path

import pytest

from servefleet.errors import ServefleetError
from servefleet.rollout import batches, inventory_hosts, limit_hosts

INVENTORY = """
web = [("h3", {"x": 1}), "h1"]
npu = (["h2", "h1", "h4"], {"serve_target": "Throughput"})
canary = ["h2"]
_private = ["nope"]
not_hosts = 3
"""


def test_inventory_order_is_first_appearance(tmp_path: Path) -> None:
    path = tmp_path / "inv.py"
    path.write_text(INVENTORY)
    order, groups = inventory_hosts(str(path))
    assert order == ["h3", "h1", "h2", "h4"]
    assert groups == {"web": ["h3", "h1"], "npu": ["h2", "h1", "h4"], "canary": ["h2"]}
    assert limit_hosts(order, groups, ["npu"]) == ["h1", "h2", "h4"]
    assert limit_hosts(order, groups, ["h4", "canary"]) == ["h2", "h4"]
    assert limit_hosts(order, groups, ["h[34]"]) == ["h3", "h4"]
    with pytest.raises(ServefleetError, match="matches no host"):
        limit_hosts(order, groups, ["zz"])


@pytest.mark.parametrize(
    ("canary", "size", "percent", "want"),
    [
        (1, 2, None, [["a"], ["b", "c"], ["d"]]),
        (0, 3, None, [["a", "b", "c"], ["d"]]),
        (2, None, None, [["a", "b"], ["c", "d"]]),
        (1, None, 50, [["a"], ["b", "c"], ["d"]]),
        (0, None, 25, [["a"], ["b"], ["c"], ["d"]]),
    ],
)
def test_batches(canary: int, size: int | None, percent: float | None, want: list) -> None:
    assert batches(["a", "b", "c", "d"], canary, size, percent) == want


def test_an_inventory_that_exits_gives_one_line(tmp_path: Path) -> None:
    path = tmp_path / "inv.py"
    path.write_text("raise SystemExit('inv.py: the lab is not up')\n")
    with pytest.raises(ServefleetError, match="the lab is not up"):
        inventory_hosts(str(path))


@pytest.mark.parametrize("body", ["hosts = [undefined_name]\n", "1/0\n", "def (:\n"])
def test_an_inventory_that_raises_gives_one_line_to_rollout_and_lock(
    tmp_path: Path, body: str
) -> None:
    from servefleet.lockfleet import fleet_lock

    path = tmp_path / "inv.py"
    path.write_text(body)
    for read in (lambda: inventory_hosts(str(path)), lambda: fleet_lock(str(path), {})):
        with pytest.raises(ServefleetError) as e:
            read()
        assert str(e.value).startswith(f"{path}: cannot read the inventory: ")
        assert "\n" not in str(e.value)
