"""Rollout planning (pure): inventory order, --limit, canary and batches; the inventory read by
pyinfra's own loader (servefleet.fleet.inventory), with pyinfra's group and --limit semantics."""

from __future__ import annotations

from pathlib import Path

import pytest

from servefleet.base.errors import ServefleetError
from servefleet.fleet.inventory import (
    Fleet,
    FleetArgs,
    InventoryHost,
    limit_pattern,
    read_inventory,
)
from servefleet.fleet.rollout import batches

INVENTORY = """
web = [("h3", {"x": 1}), "h1"]
npu = (["h2", "h1", "h4"], {"serve_target": "Throughput"})
canary = ["h2"]
_private = ["nope"]
not_hosts = 3
"""


@pytest.fixture
def inventory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """INVENTORY as inv.py, read from a working directory with no group_data."""
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "inv.py"
    path.write_text(INVENTORY)
    return str(path)


def test_inventory_order_is_first_appearance(inventory: str) -> None:
    fleet = read_inventory(inventory)
    assert fleet.order == ["h3", "h1", "h2", "h4"]
    groups = {g: list(fleet.groups[g]) for g in ("web", "npu", "canary")}
    assert groups == {"web": ["h3", "h1"], "npu": ["h1", "h2", "h4"], "canary": ["h2"]}
    assert "_private" not in fleet.groups and "not_hosts" not in fleet.groups
    assert fleet.select(["npu"]) == ["h1", "h2", "h4"]
    assert fleet.select(["h4", "canary"]) == ["h2", "h4"]
    assert fleet.select(["h[34]"]) == ["h3", "h4"]
    with pytest.raises(ServefleetError, match="matches no host"):
        fleet.select(["zz"])


def test_pyinfra_groups_data_and_exclude(inventory: str) -> None:
    fleet = read_inventory(inventory, {"serve_instances": 2})
    assert fleet.select(["inv"]) == fleet.order  # pyinfra's group named after the file
    assert fleet.select([], ["canary"]) == ["h3", "h1", "h4"]
    assert fleet.host("h3").data["x"] == 1 and "x" not in fleet.host("h1").data
    assert fleet.host("h4").data["serve_target"] == "Throughput"
    assert fleet.host("h2").data["serve_instances"] == 2  # --data over everything
    warned: list[str] = []
    assert fleet.select(["canary", "zz"], warn=warned.append) == ["h2"]
    assert warned == ["--limit zz matches no host of the inventory"]
    with pytest.raises(ServefleetError, match="--exclude inv leaves no host"):
        fleet.select(["npu"], ["inv"])


def test_a_host_list_and_limits_after_double_dash(inventory: str) -> None:
    assert read_inventory("h1,h2,h3").order == ["h1", "h2", "h3"]
    args = FleetArgs.read(
        inventory, ["web"], ["--limit", "canary", "--exclude=h1", "--data", "x=[1, 2]", "-v"]
    )
    assert args.hosts == ["h3", "h2"]
    assert args.options.rest == ("--data", "x=[1, 2]", "-v")  # what each rollout batch gets
    assert args.fleet.host("h2").data["x"] == [1, 2]  # as pyinfra parses --data
    assert args.limit_args() == ["--limit", "web"]


def test_a_limit_pattern_names_one_host_whole() -> None:
    # read_inventory refuses such names (test_inventory_input.py): the pattern stays exact
    fleet = Fleet(tuple(InventoryHost(h, {}) for h in ("h[1]", "h1", "web*", "web1")), {})
    assert fleet.matching(limit_pattern("h[1]")) == ["h[1]"]
    assert fleet.matching(limit_pattern("web*")) == ["web*"]
    assert fleet.matching("web*") == ["web*", "web1"]


def test_no_hosts_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty.py").write_text("nothing = []\n")
    with pytest.raises(ServefleetError) as e:
        read_inventory("empty.py")
    assert str(e.value).startswith("empty.py: no hosts (an inventory is a file")


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
        read_inventory(str(path))


@pytest.mark.parametrize("body", ["hosts = [undefined_name]\n", "1/0\n", "def (:\n"])
def test_an_inventory_that_raises_gives_one_line_to_rollout_and_lock(
    tmp_path: Path, body: str
) -> None:
    from servefleet.fleet.lockfleet import fleet_lock

    path = tmp_path / "inv.py"
    path.write_text(body)
    for read in (lambda: read_inventory(str(path)), lambda: fleet_lock(str(path), {})):
        with pytest.raises(ServefleetError) as e:
            read()
        assert str(e.value).startswith(f"{path}: cannot read the inventory: ")
        assert "\n" not in str(e.value)


class _Scripted:
    """A Rollout whose pyinfra runs answer from a script: hosts -> (failed hosts, stderr)."""

    def __init__(self, answers: list[tuple[set[str], str]]) -> None:
        from servefleet.fleet.rollout import Rollout

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


def test_a_host_pyinfra_cannot_connect_to_is_named_with_its_reason_and_not_retried() -> None:
    refused = (
        "--> Connecting to hosts...\n"
        "    [lab1]  Connected\n"
        "    [lab10] Could not connect ([Errno None] Unable to connect to port 22 on 10.0.0.10)\n"
        "--> Preparing operations...\n"
    )
    s = _Scripted([({"lab10"}, refused)])
    assert not s.rollout.run([["lab1", "lab10"]], max_failures=0)
    assert s.runs == [["lab1", "lab10"]]  # not a lost connection: no second run
    r = s.rollout.results["lab10"]
    assert (r.result, r.retried) == ("failed", False)
    assert (
        r.why
        == "unreachable: Could not connect ([Errno None] Unable to connect to port 22 on 10.0.0.10)"
    )
    assert s.rollout.results["lab1"].result == "ok"
