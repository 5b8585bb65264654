"""`servefleet plan` and what `plan` and `status` share: what a deploy would change on each host,
read from the deploy's own HostPlan (one probe, the same planner); how each host runs now is
:mod:`servefleet.fleet.statusview`.

Pure (no pyinfra import): ``report()`` in :mod:`servefleet.entry.steps.report` writes one summary per
host where the CLI asked (:class:`ReportRequest`), the CLI reads them and prints a table or JSON.
A host of the run that wrote none is still reported: ``unreachable`` with pyinfra's reason it
could not connect (or the deploy's ``connection lost``), else ``failed`` with the line that says
why (:func:`missing_hosts`).
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

from servefleet.base.remote.layout import UNIT_DIR
from servefleet.hostplan.types import HostPlan
from servefleet.release.prewarm_store import WarmEntry, prewarm_roles
from servefleet.settings.across import NO_INDEX

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
        """What a report of ``kind`` sets for its settings: it changes nothing, so it needs no
        index credentials (monitoring and CI need not hold them). ``status`` reaches no index;
        ``plan`` compares a serving unlocked release with the indexes only when the credentials
        are set."""
        return {NO_INDEX: "1"} if kind in ("status", "plan") else {}

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


def missing_cell(st: Mapping[str, Any]) -> str | None:
    if st.get("unreachable"):
        return f"unreachable: {st['unreachable']}"
    return f"failed: {st['failed']}" if st.get("failed") else None


def plan_table(plans: Mapping[str, Mapping[str, Any]]) -> str:
    rows: list[list[Any]] = []
    for host, p in sorted(plans.items()):
        missing = missing_cell(p)
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


def dumps(data: Any) -> str:
    return json.dumps(data, indent=1, sort_keys=True)
