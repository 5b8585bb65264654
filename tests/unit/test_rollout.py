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


class _Scripted:
    """A Rollout whose pyinfra runs answer from a script: hosts -> (failed hosts, stderr)."""

    def __init__(self, answers: list[tuple[set[str], str]]) -> None:
        from servefleet.rollout import Rollout

        self.runs: list[list[str]] = []
        answers = list(answers)

        class R(Rollout):
            def pyinfra(inner, hosts, deploy, compiling=()):  # type: ignore[no-untyped-def]
                self.runs.append(list(hosts))
                failed, err = answers.pop(0)
                return (1 if failed else 0), {"failed_hosts": sorted(failed)}, err

        self.rollout = R(inventory="inv.py", deploy="serve.py", pyinfra_args=[],
                         report=lambda kind, hosts: {}, echo=lambda m: None)  # fmt: skip


LOST_LAB1 = "[lab1] servefleet: connection lost during 'Restart servefleet-vllm-1' (retry)\n"


def test_a_host_whose_connection_was_lost_runs_once_more_alone() -> None:
    s = _Scripted([({"lab1"}, LOST_LAB1 + "[lab10] Error: executed 0 commands\n"), (set(), "")])
    assert s.rollout.run([["lab1", "lab10"]], max_failures=0)
    assert s.runs == [["lab1", "lab10"], ["lab1"]]
    r = s.rollout.results["lab1"]
    assert (r.result, r.retried, r.why) == ("ok", True, "")
    assert (s.rollout.results["lab10"].result, s.rollout.results["lab10"].retried) == ("ok", False)


def test_a_host_lost_twice_counts_as_failed_and_a_failed_step_is_not_retried() -> None:
    step = "[lab2] servefleet: lab2: the gate failed: instance 0 answered 500\n"
    s = _Scripted([({"lab1", "lab2"}, LOST_LAB1 + step), ({"lab1"}, LOST_LAB1)])
    assert not s.rollout.run([["lab1", "lab2"], ["lab3"]], max_failures=1)
    assert s.runs == [["lab1", "lab2"], ["lab1"]]  # lab2 failed a step: no second run
    assert s.rollout.results["lab1"].why.startswith("connection lost during 'Restart")
    assert s.rollout.results["lab1"].retried and s.rollout.results["lab1"].result == "failed"
    assert s.rollout.results["lab2"].why.startswith("lab2: the gate failed")
    assert s.rollout.results["lab3"].result == "not reached"


def test_lab1_is_not_lab10() -> None:
    lost10 = "[lab10] servefleet: connection lost during 'Fetch a model'\n"
    step1 = "[lab1] servefleet: lab1: refused: rbln-smi reports 8 devices, the recipe needs 16\n"
    s = _Scripted([({"lab1", "lab10"}, lost10 + step1), (set(), "")])
    assert not s.rollout.run([["lab1", "lab10"]], max_failures=0)
    assert s.runs == [["lab1", "lab10"], ["lab10"]]
    assert (
        s.rollout.results["lab1"].why.startswith("lab1: refused")
        and not s.rollout.results["lab1"].retried
    )
    assert s.rollout.results["lab10"].result == "ok" and s.rollout.results["lab10"].retried
