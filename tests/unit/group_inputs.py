"""A serving group's inputs for unit tests (#34): DeepSeek-V3.2's ``multi_node_tp_pp`` on H200
hosts of group g1, the fleet plan of named hosts (``10.0.0.<n>``), and a rank's host plan."""

from __future__ import annotations

from typing import Any

from host_inputs import GPU_DATA, gpu_probe

from servefleet.fleet.fleetplan import FleetHost, fleet_of
from servefleet.hostplan.plan import plan_host
from servefleet.settings.table import Settings, load_defaults, settings_from

DSV32 = dict(GPU_DATA, serve_recipe="vllm/deepseek-ai/DeepSeek-V3.2",
             serve_strategy="multi_node_tp_pp", serve_group="g1")  # fmt: skip
ADDRS = {"ib0": ["10.0.0.1/24"], "lo": ["127.0.0.1/8"]}


def data(**over: Any) -> Settings:
    d = load_defaults()
    d.update(DSV32)
    d.update(over)
    return settings_from(d.get, {})


def fleet(*hosts: tuple[str, dict[str, Any]], limit: tuple[str, ...] | None = None):
    return fleet_of([
        FleetHost(name, f"10.0.0.{i + 1}", ("h200",), (lambda o=over: data(**o)),
                  over.get("serve_group", "g1"), limit is None or name in limit)
        for i, (name, over) in enumerate(hosts)
    ])  # fmt: skip


def rank_plan(f: Any, name: str, **over: Any) -> Any:
    s = data(**over)
    i = int(name[-1]) - 1
    probe = gpu_probe(addresses={"ib0": [f"10.0.0.{i + 1}/24"], "lo": ["127.0.0.1/8"]})
    return plan_host(s, probe, place=f.place(name, s))
