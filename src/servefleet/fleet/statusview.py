"""`servefleet status`: how each host runs now against what its data asks for, from the
deploy's own HostPlan (:mod:`servefleet.fleet.fleetview` has what ``plan`` and ``status`` share).
A host of the run that wrote no summary gets the instances the controller plans for it
(:func:`planned_instances`), so its Prometheus targets stay, labelled ``unreachable="1"``. The
monitoring outputs: Prometheus ``file_sd`` targets and ``--textfile`` metrics for
node_exporter's textfile collector; each serving group as one.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from servefleet.base.remote.layout import unit_name
from servefleet.fleet.fleetview import missing_cell, table
from servefleet.hostplan.exposure import exposes
from servefleet.hostplan.types import HostPlan
from servefleet.router.plan import fleet_order
from servefleet.settings.table import Settings


def status_summary(plan: HostPlan, health: Mapping[str, str], address: str) -> dict[str, Any]:
    """How this host runs now against what its data asks for.

    + health: port (as a string) -> "ok" or why not: the deploy's health gate, run on the host
    + address: where the instances are reached from outside (Prometheus targets)
    """
    instances = []
    for inst in () if plan.builder else plan.instances:
        state = plan.units.get(inst.unit, {})
        instances.append(
            {
                "unit": inst.unit,
                "port": inst.port,
                "active": state.get("active", "absent"),
                "running": state.get("running"),
                "desired": inst.sha,
                "drift": not (inst.converged and inst.written),
                "health": health.get(str(inst.port), "not checked"),
            }
            | ({} if inst.serves else {"headless": True})  # a group's rank: no port serves
            | ({"group_running": state.get("group")} if plan.group else {})  # its hash now
        )
    return {
        "address": address,
        "refusal": plan.refusal,
        "driver": plan.hardware.driver_version,
        "sku": plan.hardware.sku or ",".join(sorted(set(plan.hardware.skus))),
        "devices": len(plan.hardware.devices),
        "release": plan.current,
        "release_drift": list(plan.release_drift),
        "model_drift": list(plan.model_drift),  # status --verify: files that differ (#36)
        "cache_drift": list(plan.cache_drift),
        "verified": dict(plan.release_verified),  # status --verify: files and bytes hashed
        "good_release": plan.good_release,
        "servefleet": plan.good_servefleet,  # the servefleet that last converged the host
        "packages": plan.current_pins or {},
        "instances": instances,
        "stale_units": list(plan.stale_units),
        "warm": plan.warm,
        "fingerprint": plan.spec.compile_fingerprint,
        "router": router_status(plan, health),
        "exposes": exposes(plan),  # what listens where, to whom (#46)
        "group": (
            {
                "name": plan.group.name,
                "rank": plan.group.rank,
                "hosts": list(plan.group.hosts),
                "sha": plan.group.sha,
            }  # fmt: skip
            if plan.group
            else None
        ),
    }


def router_status(plan: HostPlan, health: Mapping[str, str]) -> dict[str, Any] | None:
    """The host's router: its unit, the deploy's gate through it, and each instance as the
    router sees it (``healthy``, ``unhealthy`` by its checks, or ``out of rotation``)."""
    r = plan.router
    if r is None:
        return None
    if plan.router_host:  # the fleet it routes to is the run's: judge it by what it lists
        listed = fleet_order(r.listed or ())
        roles = [r.types.get(w, "") for w in listed]
        pd = any(x in ("prefill", "decode") for x in roles)
        r = r.over(plan.settings, listed, roles if pd else ())
    seen = r.healthy or {}
    wanted = r.workers or r.listed or ()  # a fleet router's: as it lists them
    workers = {
        w: ("out of rotation" if w not in seen else "healthy" if seen[w] else "unhealthy")
        for w in wanted
    }
    return {
        "unit": r.unit,
        "port": r.port,
        "metrics_port": plan.settings.serve_router_metrics_port,
        "active": r.active,
        "drift": not (r.running and r.written),
        "health": health.get(str(r.port), "not checked"),
        "workers": workers if r.healthy is not None else dict.fromkeys(wanted, "unknown"),
    }


def planned_instances(settings: Settings, seen: Sequence[int] = ()) -> list[tuple[str | None, int]]:
    """The instances (unit, port) the controller plans for a host it has no probe of: the ports
    its targets had in the last Prometheus file (``seen``), else ``serve_instances`` (default 1)
    from ``serve_base_port`` (the device count that splits a host comes from its probe).

    + settings: the host's validated data
    + seen: the ports of its targets in the last Prometheus file
    """
    base = settings.serve_base_port
    ports = list(seen) or [base + i for i in range(settings.serve_instances or 1)]
    return [(unit_name(p - base) if p >= base else None, p) for p in ports]


def missing_status(
    why: Mapping[str, str], address: str, instances: Sequence[tuple[str | None, int]]
) -> dict[str, Any]:
    """The status of a host that wrote none: the keys of :func:`status_summary` (nothing known),
    its ``unreachable`` or ``failed`` reason, and the instances the controller plans for it.

    + why: ``{"unreachable": reason}`` or ``{"failed": reason}`` (:func:`missing_hosts`)
    + address: where its instances are reached from outside
    + instances: (unit, port) of each (:func:`planned_instances`)
    """
    health = "unreachable" if "unreachable" in why else "unknown"
    return {
        **dict(why),
        "address": address,
        "refusal": None,
        "driver": None,
        "sku": None,
        "devices": None,
        "release": None,
        "release_drift": [],
        "model_drift": [],
        "cache_drift": [],
        "verified": {},
        "good_release": None,
        "servefleet": None,
        "packages": {},
        "instances": [
            {
                "unit": unit,
                "port": port,
                "active": "unknown",
                "running": None,
                "desired": None,
                "drift": None,
                "health": health,
            }
            for unit, port in instances
        ],  # fmt: skip
        "stale_units": [],
        "warm": None,
        "fingerprint": None,
        "router": None,
        "exposes": None,  # not known without its probe
        "group": None,  # not known: the group's other ranks name it (group_problems)
    }


def status_problems(host: str, status: Mapping[str, Any]) -> list[str]:
    """One line for each thing wrong on the host (unreachable, failed, drift, unhealthy,
    stale units)."""
    if status.get("unreachable"):
        return [f"{host}: unreachable: {status['unreachable']}"]
    if status.get("failed"):
        return [f"{host}: failed: {status['failed']}"]
    out = [f"{host}: {status['refusal']}"] if status.get("refusal") else []
    out += [f"{host}: {line}" for line in status.get("release_drift") or []]
    out += [f"{host}: {line}" for key in ("model_drift", "cache_drift")
            for line in status.get(key) or []]  # fmt: skip
    for inst in status["instances"]:
        if inst["drift"]:
            running = inst["running"] or "nothing of ours"
            out.append(f"{host}: {inst['unit']} drifts: runs {running}, wants {inst['desired']}")
        where = "a headless rank" if inst.get("headless") else f"port {inst['port']}"
        if inst["health"] != "ok":
            out.append(f"{host}: {inst['unit']} ({where}) unhealthy: {inst['health']}")
    out += [f"{host}: {unit} is stale (no device group for it)" for unit in status["stale_units"]]
    router = status.get("router")
    if router:
        if router["drift"]:
            out.append(f"{host}: {router['unit']} drifts (not running its unit)")
        if router["health"] != "ok":
            out.append(
                f"{host}: {router['unit']} (port {router['port']}) unhealthy: {router['health']}"
            )
        out += [f"{host}: {router['unit']} finds {worker} {seen}"
                for worker, seen in router["workers"].items() if seen != "healthy"]  # fmt: skip
    return out


def group_lines(statuses: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """``status``: each serving group, a line: each rank, the host that holds it, whether it
    runs the group's hash, and its gate (rank 0's: a chat; a headless rank's: its unit)."""
    groups: dict[str, dict[str, Any]] = {}
    for st in statuses.values():
        if st.get("group"):
            groups.setdefault(st["group"]["name"], st["group"])
    out = []
    for name, g in sorted(groups.items()):
        ranks = []
        for rank, host in enumerate(g["hosts"]):
            insts = (statuses.get(host) or {}).get("instances") or []
            if not insts or (statuses.get(host) or {}).get("unreachable"):
                ranks.append(f"rank {rank} {host}: not reached")
                continue
            i = insts[0]
            runs = "runs the group's hash" if i.get("group_running") == g["sha"] else (
                f"runs {i.get('group_running') or 'no group hash'}")  # fmt: skip
            what = "headless" if i.get("headless") else f"port {i['port']}"
            ranks.append(f"rank {rank} {host} ({what}): {runs}, {i['health']}")
        out.append(f"group {name} ({g['sha']}): " + "; ".join(ranks))
    return out


def group_problems(statuses: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """One line for each serving group that does not serve as one: the group's ranks (by the
    hosts its reachable members report) that are unreachable, failed, drift or are unhealthy.
    A group serves only while every rank does (vLLM is fail-stop)."""
    groups = {st["group"]["name"]: st["group"]["hosts"]
              for st in statuses.values() if st.get("group")}  # fmt: skip
    out = []
    for name, hosts in sorted(groups.items()):
        bad = [f"{h} (rank {r})" for r, h in enumerate(hosts)
               if h not in statuses or status_problems(h, statuses[h])]  # fmt: skip
        if bad:
            out.append(f"group {name} ({', '.join(hosts)}) does not serve: {', '.join(bad)}")
    return out


def _label(value: Any) -> str:
    """A label value as the Prometheus text format writes it (backslash, quote, newline)."""
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


TEXTFILE_METRICS = {  # name -> (type, help): what status --textfile writes, each once
    "servefleet_host_reachable": ("gauge", "1 when status reached the host"),
    "servefleet_host_drift": ("gauge", "1 when the host does not run what its data asks for"),
    "servefleet_host_release_drift": ("gauge", "differences between a release and its install"),
    "servefleet_host_release_info": ("gauge", "1, labelled with the release the host serves"),
    "servefleet_instance_healthy": ("gauge", "1 when the instance passed the deploy's gate"),
    "servefleet_instance_drift": ("gauge", "1 when the instance does not run its desired unit"),
    "servefleet_group_serving": ("gauge", "1 when every rank of the serving group serves"),
    "servefleet_status_timestamp_seconds": ("gauge", "when status wrote this file"),
}


def textfile_metrics(statuses: Mapping[str, Mapping[str, Any]], now: float) -> str:
    """``status --textfile``: drift, reachability, release and gate results in the Prometheus
    text format, for node_exporter's textfile collector (the rules alert on them)."""
    samples: dict[str, list[str]] = {name: [] for name in TEXTFILE_METRICS}

    def add(name: str, value: float, **labels: Any) -> None:
        shown = ",".join(f'{k}="{_label(v)}"' for k, v in sorted(labels.items()))
        number = str(int(value)) if float(value).is_integer() else repr(float(value))
        samples[name].append(f"{name}{{{shown}}} {number}" if shown else f"{name} {number}")

    for host, st in sorted(statuses.items()):
        reached = not st.get("unreachable")
        add("servefleet_host_reachable", int(reached), host=host)
        if not reached:
            continue
        add("servefleet_host_drift", int(bool(status_problems(host, st))), host=host)
        add("servefleet_host_release_drift", len(st.get("release_drift") or []), host=host)
        if st.get("release"):
            add("servefleet_host_release_info", 1, host=host, release=st["release"])
        for i in st.get("instances") or []:
            add("servefleet_instance_healthy", int(i["health"] == "ok"), host=host,
                unit=i["unit"])  # fmt: skip
            add("servefleet_instance_drift", int(bool(i["drift"])), host=host, unit=i["unit"])
    failing = {line.split(" ", 2)[1] for line in group_problems(statuses)}
    groups = {st["group"]["name"] for st in statuses.values() if st.get("group")}
    for name in sorted(groups):
        add("servefleet_group_serving", int(name not in failing), group=name)
    add("servefleet_status_timestamp_seconds", round(now))
    out = []
    for name, (kind, text) in TEXTFILE_METRICS.items():
        out += [f"# HELP {name} {text}", f"# TYPE {name} {kind}", *samples[name]]
    return "\n".join(out) + "\n"


def prometheus_targets(statuses: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Prometheus ``file_sd`` target groups: one per host, its instances' ports, labelled
    ``unreachable="1"`` when status could not reach the host (its instances are the ones
    planned for it: Prometheus keeps scraping them, so ``up == 0`` fires)."""
    groups = []
    for host, st in sorted(statuses.items()):
        targets = [f"{st['address']}:{i['port']}" for i in st["instances"]
                   if not i.get("headless")]  # fmt: skip
        if targets:
            labels = {"host": host, "job": "servefleet-vllm"}
            if st.get("release"):  # an unreachable host's is not known: no label, not "None"
                labels["release"] = str(st["release"])
            if st.get("unreachable"):
                labels["unreachable"] = "1"
            groups.append({"targets": targets, "labels": labels})
        router = st.get("router")
        if router:  # the router's own metrics (its --prometheus-port)
            labels = {"host": host, "job": "servefleet-router"}
            if st.get("unreachable"):
                labels["unreachable"] = "1"
            groups.append(
                {"targets": [f"{st['address']}:{router['metrics_port']}"], "labels": labels}
            )
    return groups


def seen_ports(path: Path) -> dict[str, list[int]]:
    """host -> the ports of its targets in an earlier Prometheus file of ours (none when the
    file is missing or not one: it is about to be replaced).

    + path: the ``--prometheus`` file
    """
    try:
        groups = json.loads(path.read_text())
        out: dict[str, list[int]] = {}
        for g in groups:
            ports = [int(str(t).rsplit(":", 1)[1]) for t in g["targets"]]
            out[str(g["labels"]["host"])] = sorted(p for p in ports if 0 < p < 65536)
        return out
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError):
        return {}


STATUS_COLUMNS = ("host", "driver", "sku", "devices", "release", "instances", "warm", "servefleet")


def verified_lines(statuses: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """``status --verify``: what each host's probe read and hashed, a line a release, a model
    (``model <id>``) and a warm cache (``cache <fingerprint>``), with what it had nothing to
    hold to."""
    out = []
    for host, st in sorted(statuses.items()):
        order = {"model": 1, "cache": 2}  # the releases first, then the models, the caches
        for rid, v in sorted((st.get("verified") or {}).items(),
                             key=lambda kv: (order.get(kv[0].split(" ")[0], 0), kv[0])):  # fmt: skip
            what = rid if rid.split(" ")[0] in order else f"release {rid}"
            line = f"{host}: {what}: {v['files']} files, {v['bytes'] / 1e6:.1f} MB read and hashed"
            if v.get("unchecked"):
                line += f"; {v['unchecked']} file(s) with nothing recorded to hold them to"
            if v.get("unsealed"):
                line += "; its warm marker has no seal to hold it to"
            out.append(line)
    return out


def status_table(statuses: Mapping[str, Mapping[str, Any]]) -> str:
    rows = []
    for host, st in sorted(statuses.items()):
        missing = missing_cell(st)
        if missing:
            inst = [f"{i['port']}:{i['health']}" for i in st["instances"]]
            rows.append([host, missing, None, None, None, inst, None, None])
            continue
        inst = [
            f"{'headless' if i.get('headless') else i['port']}:{i['active']}"
            f"{' drift' if i['drift'] else ''}"
            f"{'' if i['health'] == 'ok' else ' unhealthy'}"
            for i in st["instances"]
        ]
        rows.append([host, st["driver"], st["sku"], st["devices"], st["release"], inst, st["warm"],
                     st.get("servefleet")])  # fmt: skip
    return table(rows, STATUS_COLUMNS)
