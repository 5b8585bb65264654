"""The step ``servefleet rollout --analysis`` runs after its canary batch passed its gates:
one canary instance and one instance of a host not yet upgraded, from the status report (each
host's ``address`` and its instances' ports: the instances themselves, never a router in
front), probed side by side (:mod:`.probe`), judged (:mod:`.stats`) and reported
(:mod:`.report`). The rollout goes on only when every measure passed; else it halts and rolls
the canary back (:meth:`servefleet.fleet.rollout.Rollout.analysed`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servefleet.base.errors import ServefleetError
from servefleet.base.files import write_atomic
from servefleet.fleet.analysis import probe, report
from servefleet.fleet.analysis.probe import Load, Side, Target
from servefleet.fleet.analysis.stats import judge

REPORT_JSON, REPORT_SVG = "analysis.json", "analysis.svg"


@dataclass
class Outcome:
    """The analysis' verdict for the rollout.

    + passed: every measure passed
    + why: one line, when it did not: each failed measure with both values, why nothing
      could be measured, or the answer of an instance the probe could not read (its
      :class:`~servefleet.fleet.analysis.probe.OddAnswer`)
    + lines: what the terminal shows (the table, the failed measures, where the report went)
    + host: the canary host that was probed (its result carries ``report``)
    + report: the verdict as a dict (:func:`servefleet.fleet.analysis.report.verdict`)
    """

    passed: bool
    why: str = ""
    lines: list[str] = field(default_factory=list)
    host: str | None = None
    report: dict[str, Any] | None = None


def serving(status: Mapping[str, Any] | None) -> list[int]:
    """The ports of a host's instances that answer healthy and serve (a serving group's other
    ranks have no port that serves)."""
    return [
        int(i["port"])
        for i in (status or {}).get("instances") or ()
        if i.get("health") == "ok" and not i.get("headless") and i.get("port")
    ]


def _unhealthy(hosts: Sequence[str], statuses: Mapping[str, Any]) -> str:
    said = []
    for h in hosts:
        st = statuses.get(h)
        why = "no status" if st is None else st.get("unreachable") or "no instance answers healthy"
        said.append(f"{h}: {why}")
    return "; ".join(said)


@dataclass
class Analysis:
    """The analysis as the rollout runs it.

    + data_of: host -> its ``rollout_analysis`` (the probed canary host's is used)
    + key_of: host -> its servers' API key, or None (each sent to its own host's instance only)
    + report_dir: where ``analysis.json`` and ``analysis.svg`` are written; None: nowhere
    + run_probe: the probe (None: :func:`servefleet.fleet.analysis.probe.run`)
    """

    data_of: Mapping[str, Mapping[str, float]]
    key_of: Mapping[str, str | None] = field(default_factory=dict)
    report_dir: Path | None = None
    run_probe: Callable[[Sequence[Target], Load], tuple[list[Side], float]] | None = None

    def target(self, role: str, hosts: Sequence[str], statuses: Mapping[str, Any]) -> Target | None:
        """The first healthy serving instance of ``hosts``, in their order."""
        for h in hosts:
            ports = serving(statuses.get(h))
            if ports:
                origin = probe.origin_of(statuses[h]["address"], ports[0])
                return Target(role, origin, h, key=self.key_of.get(h))
        return None

    def __call__(
        self, canary: Sequence[str], rest: Sequence[str], statuses: Mapping[str, Any]
    ) -> Outcome:
        """Probe and judge one canary instance against one of ``rest``.

        + canary: the canary batch's hosts that passed their gates
        + rest: the hosts not yet upgraded, in the rollout's order
        + statuses: the status report of both (``servefleet status``'s per-host dicts)
        """
        if not rest:
            return Outcome(False, "analysis: no baseline: the canary is every host")
        c = self.target("canary", canary, statuses)
        if c is None:
            why = _unhealthy(canary, statuses) if canary else "every canary host failed"
            return Outcome(False, f"analysis: no canary instance to probe ({why})")
        b = self.target("baseline", rest, statuses)
        if b is None:
            return Outcome(False, f"analysis: no baseline: no host not yet upgraded serves "
                           f"healthy ({_unhealthy(rest, statuses)})")  # fmt: skip
        data = self.data_of[c.host]
        load = Load.of(data)
        start = [f"analysis: canary {c.host} {c.origin} against baseline {b.host} {b.origin}: "
                 f"{load.requests} requests each, {load.concurrency} at a time"]  # fmt: skip
        try:
            sides, took = (self.run_probe or probe.run)([c, b], load)
        except ServefleetError as e:
            return Outcome(False, str(e), start, c.host)
        verdict = report.verdict(sides, judge(sides[0].samples, sides[1].samples, data), took,
                                 load)  # fmt: skip
        failed = report.failed_lines(verdict)
        lines = [*start, *report.table(verdict).splitlines(), *failed]
        lines += self.write(verdict)
        why = "" if verdict["passed"] else "; ".join(x.removeprefix("analysis: ") for x in failed)
        return Outcome(verdict["passed"], why and f"analysis: {why}", lines, c.host, verdict)

    def write(self, verdict: Mapping[str, Any]) -> list[str]:
        """``analysis.json`` and ``analysis.svg`` in ``report_dir``: the line that says so."""
        if self.report_dir is None:
            return []
        paths = self.report_dir / REPORT_JSON, self.report_dir / REPORT_SVG
        try:
            # strict JSON: a number that is not finite (the probe's deltas are) is a bug
            write_atomic(paths[0], json.dumps(verdict, indent=1, allow_nan=False) + "\n")
            write_atomic(paths[1], report.svg(verdict))
        except OSError as e:
            return [f"analysis: the report was not written to {self.report_dir} ({e.strerror})"]
        return [f"analysis report: {paths[0]}, {paths[1]}"]
