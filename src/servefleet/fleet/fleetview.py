"""`servefleet plan` and `servefleet status`: what a deploy would change on each host, and how
each host runs now, both read from the deploy's own HostPlan (one probe, the same planner).

Pure (no pyinfra import): ``report()`` in :mod:`servefleet.entry.steps.report` writes one summary per
host where the CLI asked (:class:`ReportRequest`), the CLI reads them and prints a table or JSON.
A host of the run that wrote none is still reported: ``unreachable`` with pyinfra's reason it
could not connect (or the deploy's ``connection lost``), else ``failed`` with the line that says
why (:func:`missing_hosts`); ``status`` gives it the instances the controller plans for it
(:func:`planned_instances`), so its Prometheus targets stay, labelled ``unreachable="1"``.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from servefleet.base.remote.layout import UNIT_DIR, unit_name
from servefleet.hostplan.types import HostPlan
from servefleet.release.prewarm_store import WarmEntry, prewarm_roles
from servefleet.router.plan import fleet_order
from servefleet.settings.across import NO_INDEX
from servefleet.settings.table import Settings

REPORT_DIR_ENV = "SERVEFLEET_REPORT_DIR"  # where each host's summary goes: <host>.json
REPORT_ENV = "SERVEFLEET_REPORT"  # which summary: "plan" or "status"


@dataclass(frozen=True)
class ReportRequest:
    """What the CLI asks of ``deploys/report.py``, passed through its environment.

    + kind: "plan" or "status"
    + directory: where each host's summary is written, ``<host>.json``
    """

    kind: str | None
    directory: str | None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ReportRequest:
        env = os.environ if environ is None else environ
        return cls(env.get(REPORT_ENV), env.get(REPORT_DIR_ENV))

    def env(self) -> dict[str, str]:
        """The variables that pass this request to a pyinfra run."""
        return {REPORT_DIR_ENV: str(self.directory), REPORT_ENV: str(self.kind),
                **self.environ_of(str(self.kind))}  # fmt: skip

    @staticmethod
    def environ_of(kind: str) -> dict[str, str]:
        """What a report of ``kind`` sets for its settings: ``status`` reaches no index, so it
        needs no index credentials (monitoring and CI need not hold them)."""
        return {NO_INDEX: "1"} if kind == "status" else {}

    def write(self, host: str, summary: Mapping[str, Any]) -> None:
        """Write one host's summary (a file named by a hash of the host's name: a name such as
        ``@docker/x`` or ``../x`` is no path)."""
        if self.directory is None:
            raise KeyError(REPORT_DIR_ENV)
        name = hashlib.sha256(host.encode()).hexdigest()[:32]
        text = json.dumps({"host": host, "summary": summary}, sort_keys=True)
        (Path(self.directory) / f"{name}.json").write_text(text)

    def read(self) -> dict[str, Any]:
        """host -> summary, for each host that wrote one."""
        found = [json.loads(p.read_text()) for p in Path(self.directory or ".").glob("*.json")]
        return {doc["host"]: doc["summary"] for doc in found}


# ---------------------------------------------------------------------------------------------
# hosts a run left without a summary

LOST = "connection lost"  # what the deploy says of a host whose connection dropped
_CONNECT_STAGE = "--> Connecting to hosts"  # pyinfra's stage line before it connects
# the reasons pyinfra's connectors give when a host cannot be connected (pyinfra/connectors)
CONNECT_ERRORS = (
    "Could not resolve hostname",
    "Could not connect",
    "SSH error",
    "EOF error",
    "Authentication error",
    "SSH host key error",
    "Unable to establish SFTP",
)
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _lines(output: str) -> list[str]:
    return [_ANSI.sub("", x).rstrip() for x in re.split(r"[\r\n]+", output)]


def connection_errors(output: str, hosts: Iterable[str]) -> dict[str, str]:
    """host -> the reason pyinfra printed for not connecting to it: its ``[host] ...`` line
    while pyinfra connects (anything but ``Connected``), or anywhere one of the connectors'
    reasons (:data:`CONNECT_ERRORS`).

    + output: what the pyinfra run printed (stdout and stderr)
    + hosts: the hosts of the run (``lab1`` is not ``lab10``: a name is matched whole)
    """
    names = sorted(set(hosts), key=len, reverse=True)
    found: dict[str, str] = {}
    connecting = False
    for line in _lines(output):
        if line.startswith("-->"):
            connecting = line.startswith(_CONNECT_STAGE)
            continue
        text = line.strip()
        host = next((h for h in names if text.startswith(f"[{h}]")), None)
        if host is None or host in found:
            continue
        said = text[len(host) + 2 :].strip()
        if (connecting and not said.startswith("Connected")) or said.startswith(CONNECT_ERRORS):
            found[host] = " ".join(said.split())
    return found


def failure(output: str, host: str) -> tuple[bool, str]:
    """Why a pyinfra run failed on ``host``, from what it printed: (unreachable, reason).
    Unreachable: pyinfra could not connect (its reason), or the deploy says ``connection lost``;
    else the first ``servefleet:`` line naming the host, else a pyinfra error that stopped the
    whole run (``not run: ...``, naming another host), else ``failed``.

    + output: what the run printed
    + host: one host of the run
    """
    named = re.compile(rf"(?<![\w.-]){re.escape(host)}(?![\w.-])")  # lab1, not lab10
    mine = [x for x in _lines(output) if named.search(x) and "servefleet:" in x]
    mine = [x for x in mine if LOST in x] or mine  # a lost connection first
    why = mine[0].split("servefleet:", 1)[1].strip() if mine else ""
    if why.startswith(LOST):
        return True, why
    connect = connection_errors(output, [host]).get(host)
    if connect:
        return True, connect
    if not why:  # an error that stopped the whole run before any change names another host
        stopped = [x for x in _lines(output) if "pyinfra error" in x and "servefleet:" in x]
        if stopped:
            why = f"not run: {stopped[0].split('servefleet:', 1)[1].strip()}"
    return False, why or "failed"


def missing_hosts(
    hosts: Iterable[str], found: Mapping[str, Any], output: str
) -> dict[str, dict[str, str]]:
    """The hosts of a report run that wrote no summary: host -> ``{"unreachable": reason}`` or
    ``{"failed": reason}``.

    + hosts: the run's hosts
    + found: the summaries read (:meth:`ReportRequest.read`)
    + output: what the run printed
    """
    out = {}
    for host in hosts:
        if host not in found:
            unreachable, why = failure(output, host)
            out[host] = {"unreachable" if unreachable else "failed": why}
    return out


def pyinfra_refusal(output: str, code: int) -> str | None:
    """pyinfra's own error when a run never got to connect (bad arguments, no deploy file):
    its last error line; None when it connected.

    + output: what the run printed
    + code: its exit status
    """
    lines = _lines(output)
    if any(x.startswith(_CONNECT_STAGE) for x in lines):
        return None
    said = [x.strip() for x in lines if "error" in x.lower() and x.strip()]
    return said[-1] if said else f"pyinfra exited {code} before it connected to any host"


def plan_summary(
    plan: HostPlan,
    entry: WarmEntry | None = None,
    order: int = 0,
    changed_on_index: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """What a deploy would change on this host (nothing is changed to find out).

    + entry: the host as fleet pre-warm sees it (:func:`fleet_plan` decides who recompiles)
    + order: the host's place in the inventory
    + changed_on_index: unlocked releases: packages the indexes now serve with other bytes
    """
    s, rel = plan.settings, plan.release
    have = plan.current_pins or {}
    want = rel.expect
    packages = {
        name: [have.get(name), want.get(name)]
        for name in sorted(set(have) | set(want))
        if have.get(name) != want.get(name)
    }
    serving = () if plan.builder else plan.instances  # a build host serves nothing
    restarts = [i.unit for i in serving if not (i.converged and i.written)]
    return {
        "refusal": plan.refusal,
        "driver": [plan.hardware.driver_version, s.driver_version] if plan.driver_needed else None,
        "release": [plan.current, rel.id] if plan.current != rel.id else None,
        "install_release": not plan.release_complete,
        "release_drift": list(plan.release_drift),
        "model_drift": list(plan.model_drift),  # serve_verify: each fetched again (#36)
        "cache_drift": list(plan.cache_drift),  # ... dropped and warmed again
        "locked": rel.locked,
        "changed_on_index": dict(changed_on_index or {}),
        "packages": packages if plan.current != rel.id else {},
        "models": list(plan.missing_models),
        "restarts": restarts,
        "remove": list(plan.stale_units),
        "recompile": not plan.warm,
        "prewarm": "warm" if plan.warm else "host",
        "warm_entry": asdict(entry) if entry else None,
        "order": order,
        "fingerprint": plan.spec.compile_fingerprint,
        "diffs": unit_diffs(plan),
        "changes": not plan.refusal
        and bool(
            plan.driver_needed
            or plan.current != rel.id
            or not plan.release_complete
            or plan.missing_models
            or (not plan.converged and not plan.builder)
            or (plan.builder and not plan.warm)
        ),
    }


def unit_diffs(plan: HostPlan) -> dict[str, str]:
    """unit -> a unified diff of its file on the host (``plan``'s probe reads the text) to the
    one the deploy would write, for each unit the deploy would write or remove (none when the
    file is the rendered text already). A file whose text the probe did not report (a probe
    without it) is said in one line instead.

    + plan: the host's plan
    """
    out = {}
    changed = [] if plan.builder else [(i.unit, i.text) for i in plan.instances if not i.written]
    for unit, new in [*changed, *((u, None) for u in plan.stale_units)]:
        on_host = plan.units.get(unit, {})
        old = on_host.get("text")
        if old is None and on_host.get("file") is not None:
            out[unit] = f"(the probe did not report {UNIT_DIR}/{unit}'s text)\n"
            continue
        out[unit] = "".join(
            difflib.unified_diff(
                (old or "").splitlines(True),
                (new or "").splitlines(True),
                f"{UNIT_DIR}/{unit}" if old is not None else "/dev/null",
                f"{UNIT_DIR}/{unit}" if new is not None else "/dev/null",
            )
        )
    return out


def plan_diffs(plans: Mapping[str, Mapping[str, Any]]) -> str:
    """Each host's unit diffs (:func:`unit_diffs`) under a line naming the host and unit, in
    host order; a host with none is left out."""
    out = []
    for host, p in sorted(plans.items()):
        for unit, diff in sorted((p.get("diffs") or {}).items()):
            out += [f"== {host}: {unit}", diff.rstrip("\n")]
    return "\n".join(out)


def fleet_plan(plans: Mapping[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The hosts' plans with each one's pre-warm role across the run (fleet scope: only the
    seed or build host recompiles, the others get its copy)."""
    hosts = sorted((p for p in plans.values() if p.get("warm_entry")), key=lambda p: p["order"])
    roles = prewarm_roles([WarmEntry(**p["warm_entry"]) for p in hosts])
    out = {}
    for name, p in plans.items():
        role = roles.get(name, p.get("prewarm", "host"))
        out[name] = {
            **p,
            "prewarm": role,
            "recompile": role in ("host", "seed", "build") and p["recompile"],
        }
    return out


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


def _cell(value: Any) -> str:
    if value is None or value == [] or value == {}:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list) and len(value) == 2 and not isinstance(value[0], (list, dict)):
        return f"{value[0] or '-'} -> {value[1]}"
    if isinstance(value, list):
        return ", ".join(map(str, value))
    if isinstance(value, dict):
        return ", ".join(f"{k} {_cell(v)}" for k, v in value.items())
    return str(value)


def table(rows: Iterable[Sequence[Any]], header: Sequence[str]) -> str:
    """A plain text table (columns padded, '-' for nothing)."""
    cells = [list(header)] + [[_cell(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells
    )


PLAN_COLUMNS = (
    "host",
    "driver",
    "release",
    "packages",
    "models",
    "restarts",
    "remove",
    "recompile",
)
STATUS_COLUMNS = ("host", "driver", "sku", "devices", "release", "instances", "warm", "servefleet")


def _missing_cell(st: Mapping[str, Any]) -> str | None:
    if st.get("unreachable"):
        return f"unreachable: {st['unreachable']}"
    return f"failed: {st['failed']}" if st.get("failed") else None


def plan_table(plans: Mapping[str, Mapping[str, Any]]) -> str:
    rows: list[list[Any]] = []
    for host, p in sorted(plans.items()):
        missing = _missing_cell(p)
        if missing or p.get("refusal"):
            first = missing or f"refused: {p['refusal']}"
            rows.append([host, first] + [None] * (len(PLAN_COLUMNS) - 2))
            continue
        release = p["release"] or ([None, "install"] if p["install_release"] else None)
        if p.get("release_drift"):  # the same id, installed again beside the drifted one
            release = f"{_cell(p['release']) + ' ' if p['release'] else ''}reinstall (drifted)"
        if not p.get("locked", True):
            release = f"{_cell(release)} (unlocked)" if release else "unlocked"
        packages = {**p["packages"], **{
            name: f"{c['version']} re-uploaded: installed {c['installed'][0][:12]}, index now "
                  f"{c['served'][0][:12]}"
            for name, c in (p.get("changed_on_index") or {}).items()
        }}  # fmt: skip
        models, recompile = p["models"], "copy" if p.get("prewarm") == "copy" else p["recompile"]
        drifted = {line.split(": ", 1)[0][len("model ") :] for line in p.get("model_drift") or []}
        if drifted:  # fetched again: the models that differ from their fetch (#36)
            models = ", ".join(f"{m} (drifted)" if m in drifted else m for m in models)
        if p.get("cache_drift"):  # dropped and warmed again: it differs from its seal
            recompile = f"{_cell(recompile)} (drifted)"
        rows.append([host, p["driver"], release, packages, models, p["restarts"], p["remove"],
                     recompile])  # fmt: skip
    return table(rows, PLAN_COLUMNS)


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
        missing = _missing_cell(st)
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


def dumps(data: Any) -> str:
    return json.dumps(data, indent=1, sort_keys=True)
