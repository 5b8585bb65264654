"""`servefleet plan` and `servefleet status`: what a deploy would change on each host, and how
each host runs now, both read from the deploy's own HostPlan (one probe, the same planner).

Pure (no pyinfra import): ``report()`` in :mod:`servefleet.steps.report` writes one summary per
host where the CLI asked (:class:`ReportRequest`), the CLI reads them and prints a table or JSON.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from servefleet.hostplan import HostPlan
from servefleet.prewarm_store import WarmEntry, prewarm_roles

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
        return {REPORT_DIR_ENV: str(self.directory), REPORT_ENV: str(self.kind)}

    def write(self, host: str, summary: Mapping[str, Any]) -> None:
        if self.directory is None:
            raise KeyError(REPORT_DIR_ENV)
        (Path(self.directory) / f"{host}.json").write_text(json.dumps(summary, sort_keys=True))

    def read(self) -> dict[str, Any]:
        """host -> summary, for each host that wrote one."""
        found = Path(self.directory or ".").glob("*.json")
        return {p.stem: json.loads(p.read_text()) for p in found}


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
        )
    return {
        "address": address,
        "refusal": plan.refusal,
        "driver": plan.hardware.driver_version,
        "sku": plan.hardware.sku or ",".join(sorted(set(plan.hardware.skus))),
        "devices": len(plan.hardware.devices),
        "release": plan.current,
        "good_release": plan.good_release,
        "packages": plan.current_pins or {},
        "instances": instances,
        "stale_units": list(plan.stale_units),
        "warm": plan.warm,
        "fingerprint": plan.spec.compile_fingerprint,
    }


def status_problems(host: str, status: Mapping[str, Any]) -> list[str]:
    """One line for each thing wrong on the host (drift, unhealthy, stale units)."""
    out = [f"{host}: {status['refusal']}"] if status.get("refusal") else []
    for inst in status["instances"]:
        if inst["drift"]:
            running = inst["running"] or "nothing of ours"
            out.append(f"{host}: {inst['unit']} drifts: runs {running}, wants {inst['desired']}")
        if inst["health"] != "ok":
            out.append(f"{host}: {inst['unit']} (port {inst['port']}) unhealthy: {inst['health']}")
    out += [f"{host}: {unit} is stale (no device group for it)" for unit in status["stale_units"]]
    return out


def prometheus_targets(statuses: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Prometheus ``file_sd`` target groups: one per host, its instances' ports."""
    groups = []
    for host, st in sorted(statuses.items()):
        targets = [f"{st['address']}:{i['port']}" for i in st["instances"]]
        if targets:
            labels = {"host": host, "release": str(st["release"]), "job": "servefleet-vllm"}
            groups.append({"targets": targets, "labels": labels})
    return groups


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
STATUS_COLUMNS = ("host", "driver", "sku", "devices", "release", "instances", "warm")


def plan_table(plans: Mapping[str, Mapping[str, Any]]) -> str:
    rows: list[list[Any]] = []
    for host, p in sorted(plans.items()):
        if p.get("refusal"):
            rows.append([host, f"refused: {p['refusal']}"] + [None] * (len(PLAN_COLUMNS) - 2))
            continue
        release = p["release"] or ([None, "install"] if p["install_release"] else None)
        if not p.get("locked", True):
            release = f"{_cell(release)} (unlocked)" if release else "unlocked"
        packages = {**p["packages"], **{
            name: f"{c['version']} re-uploaded: installed {c['installed'][0][:12]}, index now "
                  f"{c['served'][0][:12]}"
            for name, c in (p.get("changed_on_index") or {}).items()
        }}  # fmt: skip
        rows.append(
            [host, p["driver"], release, packages, p["models"], p["restarts"], p["remove"],
             "copy" if p.get("prewarm") == "copy" else p["recompile"]]
        )  # fmt: skip
    return table(rows, PLAN_COLUMNS)


def status_table(statuses: Mapping[str, Mapping[str, Any]]) -> str:
    rows = []
    for host, st in sorted(statuses.items()):
        inst = [
            f"{i['port']}:{i['active']}{' drift' if i['drift'] else ''}"
            f"{'' if i['health'] == 'ok' else ' unhealthy'}"
            for i in st["instances"]
        ]
        rows.append([host, st["driver"], st["sku"], st["devices"], st["release"], inst, st["warm"]])
    return table(rows, STATUS_COLUMNS)


def dumps(data: Any) -> str:
    return json.dumps(data, indent=1, sort_keys=True)
