"""``servefleet resolve`` of a multi-node strategy (#34): ``--nodes`` sizes the group, the shell
form heads each rank's line with its rank, and ``--format unit`` prints each rank's unit as the
deploy writes it on that rank's host (placeholders left for the deploy to bind)."""

from __future__ import annotations

import json

from click.testing import CliRunner
from systemd_parse import parse_unit

from servefleet.entry.cli import main

DSV32 = ["vllm/deepseek-ai/DeepSeek-V3.2", "--strategy", "multi_node_tp_pp", "--hardware", "h200"]


def resolve(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["resolve", *DSV32, *args])
    return result.exit_code, result.output


def test_nodes_sizes_the_group() -> None:
    code, out = resolve("--nodes", "4")
    assert code == 0
    spec = json.loads(out)
    assert spec["nodes"] == 4 and [s["rank"] for s in spec["servers"]] == [0, 1, 2, 3]
    argv = spec["servers"][3]["argv"]
    assert argv[argv.index("--nnodes") + 1] == "4" and argv[argv.index("--node-rank") + 1] == "3"
    code, out = resolve("--nodes", "1")
    assert code == 2 and out.count("\n") == 1 and "allowed: 2..16" in out


def test_the_shell_form_names_each_rank() -> None:
    code, out = resolve("--format", "shell")
    lines = out.splitlines()
    assert code == 0 and len(lines) == 4
    assert lines[0] == "# rank 0 of 2, one host each (serves an API; the deploy binds $HEAD_IP)"
    assert lines[2] == "# rank 1 of 2, one host each (headless; the deploy binds $HEAD_IP)"
    assert "--node-rank 1 --master-addr $HEAD_IP --headless" in lines[3]


def test_the_unit_form_prints_each_ranks_unit() -> None:
    code, out = resolve("--format", "unit")
    assert code == 0
    _, head, worker = out.split("# rank ")
    for rank, text in ((0, head), (1, worker)):
        unit = text.split("\n", 1)[1]
        argv, env = parse_unit(unit)
        assert argv[argv.index("--node-rank") + 1] == str(rank)
        assert argv[argv.index("--master-addr") + 1] == "$HEAD_IP"  # $$ in the file: no expansion
        assert env["NCCL_SOCKET_IFNAME"] == "$IFACE_NAME" and "Restart=no" in unit
        assert ("--port" in argv) == (rank == 0) and ("--headless" in argv) == (rank == 1)
