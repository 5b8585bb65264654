"""`servefleet rollout`: the real pyinfra deploy, batch by batch in inventory order (a canary
first), each host through its health gates; stop when a batch fails more hosts than allowed.

pyinfra has no batches (``--serial`` takes hosts in random order), so each batch is one run of
the pyinfra CLI limited to its hosts. A host whose gate fails is rolled back by the deploy itself
(``remote/instances.py``); a failed host that does not serve afterwards is restored to its last
good state here; hosts not yet reached are never touched. A host whose SSH connection was lost
mid-run (the deploy says ``servefleet: connection lost during '<operation>'``) is run again once,
alone, on a new connection, before it counts as failed: every step converges from wherever a run
stopped.

With ``--analysis`` (:mod:`servefleet.fleet.analysis`), the canary batch that passed its gates is
probed against a host not yet upgraded before any other batch starts: the rollout goes on only
when every measure passed; else it halts and rolls the canary back as ``servefleet rollback``
does, whatever ``--max-failures`` allows.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servefleet.fleet.analysis.canary import Outcome
from servefleet.fleet.fleetview import LOST, failure
from servefleet.fleet.inventory import limit_pattern

TICK = 15.0  # seconds between the live lines of a running batch
CANDIDATES = 4  # hosts not yet upgraded the canary analysis asks the status of, in order


def units(hosts: Sequence[str], group_of: Mapping[str, str | None]) -> list[list[str]]:
    """The hosts as the rollout counts them: each serving group (``serve_group``) one unit, at
    its first host's place, every other host a unit of its own.

    + hosts: inventory order
    + group_of: host -> its serving group, or None
    """
    out: list[list[str]] = []
    at: dict[str, list[str]] = {}
    for h in hosts:
        g = group_of.get(h)
        if g is None:
            out.append([h])
        elif g in at:
            at[g].append(h)
        else:
            at[g] = [h]
            out.append(at[g])
    return out


Step = tuple[float, bool]  # a batch's size: (hosts, False) or (percent of all the hosts, True)
BATCH_SIZES = (
    "N (hosts), P% (of all the hosts), or a comma list of them that grows, the last repeated "
    "(1,5,20%)"
)
_STEP = re.compile(r"(?:(\d+)|(\d+(?:\.\d+)?)%)")


def batch_sizes(text: str) -> list[Step]:
    """``--batch-size``: N hosts, P% of all the hosts, or a comma list of them whose last one
    repeats (``1,5,20%``, as Ansible's ``serial: [1, 5, "20%"]``). ValueError says what is wrong
    and what is allowed, in one line.

    + text: the option's value
    """
    out: list[Step] = []
    for word in str(text).split(","):
        m = _STEP.fullmatch(word.strip())
        if m and m.group(1) is not None and int(m.group(1)) >= 1:
            out.append((int(m.group(1)), False))
        elif m and m.group(2) is not None and 0 < float(m.group(2)) <= 100:
            out.append((float(m.group(2)), True))
        else:
            raise ValueError(f"{word.strip()!r} is not a batch size; allowed: {BATCH_SIZES}")
    return out


def batches(
    hosts: list[str],
    canary: int,
    size: int | Sequence[Step] | None,
    percent: float | None,
    group_of: Mapping[str, str | None] | None = None,
) -> list[list[str]]:
    """The canary alone, then the rest in batches of ``size`` (or ``percent`` of all), counted
    in units: a serving group is one (a batch never splits it, a canary is a whole group).

    + size: hosts a batch, or the steps of :func:`batch_sizes` (a batch each, the last repeated
      until every host has had its batch; a percentage is of all the hosts, rounded up)
    + group_of: host -> its serving group, or None (default: no groups)
    """
    every = units(hosts, group_of or {})
    first, rest = every[:canary], every[canary:]
    if isinstance(size, int):
        steps: list[Step] = [(size, False)]
    elif size:
        steps = list(size)
    else:
        steps = [(percent, True)] if percent else [(len(rest) or 1, False)]
    out = [first] if first else []
    at = 0
    while at < len(rest):
        value, share = steps[min(len(out) - bool(first), len(steps) - 1)]
        step = max(1, math.ceil(len(every) * value / 100)) if share else int(value)
        out.append(rest[at : at + step])
        at += step
    return [[h for unit in batch for h in unit] for batch in out]


@dataclass
class HostResult:
    release_before: str | None = None
    release_after: str | None = None
    result: str = "not reached"  # ok, failed, not reached
    rolled_back: bool = False
    why: str = ""
    retried: bool = False  # its connection was lost, and it ran once more
    analysis: dict[str, Any] | None = None  # the canary analysis' report, on the probed host


@dataclass
class Rollout:
    inventory: str
    deploy: str
    pyinfra_args: list[str]
    report: Callable[[str, list[str]], dict[str, Any]]  # kind, hosts -> host summaries
    echo: Callable[[str], None]
    group_of: Mapping[str, str | None] = field(default_factory=dict)  # host -> serving group
    results: dict[str, HostResult] = field(default_factory=dict)
    stopped: str = ""  # why the rollout stopped or halted, in one line ("": it did not)
    # the canary analysis (canary hosts that passed, hosts not yet upgraded, their statuses)
    analyse: Callable[[list[str], list[str], dict[str, Any]], Outcome] | None = None

    def pyinfra(
        self, hosts: list[str], deploy: str, compiling: Sequence[str] = ()
    ) -> tuple[int, dict[str, Any] | None, str]:
        """One real pyinfra run limited to ``hosts``: (exit code, its --json results, stderr).
        While it runs, a line every TICK seconds names the hosts that pre-warm."""
        exe = str(Path(sys.executable).parent / "pyinfra")
        limits = [a for h in hosts for a in ("--limit", limit_pattern(h))]
        cmd = [exe, "-y", "--json", *limits, *self.pyinfra_args, self.inventory, deploy]
        done = threading.Event()
        t0 = time.monotonic()

        def tick() -> None:
            while not done.wait(TICK):
                what = f"{', '.join(compiling)}: pre-warm" if compiling else "running"
                self.echo(f"  {what} for {time.monotonic() - t0:.0f} s")

        ticker = threading.Thread(target=tick, daemon=True)
        ticker.start()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True)
        finally:
            done.set()
            ticker.join()
        try:
            results = json.loads(proc.stdout)["results"]
        except (ValueError, KeyError, TypeError):
            results = None
        return proc.returncode, results, proc.stderr

    def releases(self, hosts: list[str]) -> dict[str, str | None]:
        found = self.report("status", hosts)
        return {h: (found.get(h) or {}).get("release") for h in hosts}

    def run(
        self, plan: list[list[str]], max_failures: int | None = 0, fail_percent: float | None = None
    ) -> bool:
        """Every batch of ``plan`` in turn; False when it stopped (:attr:`stopped` says why).

        + max_failures: failed hosts tolerated over all batches so far (a serving group counts
          once); None: no such limit
        + fail_percent: failed hosts tolerated as a percentage of the hosts run so far (as
          pyinfra's ``--fail-percent``, Ansible's ``max_fail_percentage``); None: no such limit
        """
        hosts = [h for batch in plan for h in batch]
        # one status of every host at the start: its release, and whether the change's compile
        # is warm there (a host cold at the start pre-warms in its batch: compiles, or copies)
        start = self.report("status", hosts)
        cold = {h for h in hosts if (start.get(h) or {}).get("warm") is False}
        # a host the opening status could not reach is failed in its batch without a run (each
        # would wait out its connection timeouts again: 11-20 s for two dead hosts), as Ansible
        # fails an unreachable host; it counts against the limits like any failed host
        dead = {
            h: str(start[h]["unreachable"])
            for h in hosts
            if (start.get(h) or {}).get("unreachable")
        }
        for host in hosts:
            self.results[host] = HostResult(release_before=(start.get(host) or {}).get("release"))
        failures: list[str] = []
        run_so_far = 0  # hosts run so far, a serving group counted once
        halted = over = False
        for n, batch in enumerate(plan, 1):
            t0 = time.monotonic()
            self.echo(f"batch {n}/{len(plan)}: {', '.join(batch)}")
            live = [h for h in batch if h not in dead]
            compiling = [h for h in live if h in cold]
            failed: set[str] = set()
            if live:
                _, results, err = self.pyinfra(live, self.deploy, compiling)
                failed = set(live) if results is None else set(results["failed_hosts"]) & set(live)
                self.judge(live, failed, err)
            for host in batch:
                if host in dead:
                    self.results[host].result = "failed"
                    self.results[host].why = f"unreachable at the start (not run): {dead[host]}"
                    failed.add(host)
            lost = sorted(h for h in failed if self.results[h].why.startswith(LOST))
            if lost:
                self.echo(f"batch {n}/{len(plan)}: {LOST} on {', '.join(lost)}: once more")
                _, again, err = self.pyinfra(lost, self.deploy, [h for h in compiling if h in lost])
                still = set(lost) if again is None else set(again["failed_hosts"]) & set(lost)
                self.judge(lost, still, err)
                for host in lost:
                    self.results[host].retried = True
                failed = (failed - set(lost)) | still
            # a serving group counts once, however many of its hosts failed
            failures += sorted({self.group_of.get(h) or h for h in failed})
            run_so_far += len({self.group_of.get(h) or h for h in batch})
            took = time.monotonic() - t0
            verdict = f"{len(batch) - len(failed)} ok, {len(failed)} failed"
            self.echo(f"batch {n}/{len(plan)}: {verdict} ({took:.0f} s)")
            limits = _over(len(failures), run_so_far, max_failures, fail_percent)
            if limits:
                over = True
                groups = any(self.group_of.values())
                what = "failed host(s) or group(s)" if groups else "failed host(s)"
                self.echo(f"stopping: {len(failures)} {what}, {limits}")
                first = next(h for h in [*batch, *hosts] if h in failed or h in failures)
                why = self.results[first].why if first in self.results else ""
                if why and not why.startswith(f"{first}: "):  # the deploy's lines name the host
                    why = f"{first}: {why}"
                self.stopped = (f"stopped after batch {n}/{len(plan)}: {len(failures)} {what} "
                                f"({', '.join(failures)}), more than {limits} allows"
                                + (f"; {why}" if why else ""))  # fmt: skip
                self.settle(sorted(failed - set(dead)))
                break
            if n == 1 and self.analyse is not None:
                if not self.analysed(batch, failed, plan[1:], start):
                    halted = True
                    break
        reached = [
            h for h, r in self.results.items() if r.result != "not reached" and h not in dead
        ]
        for host, release in self.releases(reached).items():
            self.results[host].release_after = release
        return not over and not halted

    def analysed(
        self,
        batch: list[str],
        failed: set[str],
        later: list[list[str]],
        start: Mapping[str, Any],
    ) -> bool:
        """The canary analysis after the canary batch: True to go on. Else the rollout halts:
        each canary host that passed its gates counts as failed and, when the batch changed
        what it runs, is rolled back as ``servefleet rollback`` does (``rollback.py`` beside the
        deploy: the state before its last good one, through the gate); the others stay as
        they are.

        + batch: the canary batch; failed: its hosts that failed their gates
        + later: the batches not yet run (their first CANDIDATES hosts are the baseline's
          candidates: one status of a few hosts, however large the fleet)
        + start: the status of every host at the rollout's start
        """
        assert self.analyse is not None
        ok = [h for h in batch if h not in failed]
        rest = [h for b in later for h in b][:CANDIDATES]
        statuses = self.report("status", ok + rest) if ok or rest else {}
        outcome = self.analyse(ok, rest, statuses)
        for line in outcome.lines:
            self.echo(line)
        if outcome.host in self.results:
            self.results[outcome.host].analysis = outcome.report
        if outcome.passed:
            self.echo("analysis passed: the rollout goes on")
            return True
        self.echo(outcome.why)
        self.stopped = f"halted after the canary batch: {outcome.why}"
        changed = [h for h in ok if h not in statuses or _runs(start.get(h)) != _runs(statuses[h])]
        back: set[str] = set()
        err = ""
        if changed:
            self.echo(f"halting: rolling the canary back on {', '.join(changed)}")
            rollback = str(Path(self.deploy).resolve().parent / "rollback.py")
            _, results, err = self.pyinfra(changed, rollback)
            not_back = set(changed) if results is None else set(results["failed_hosts"])
            back = set(changed) - not_back
        same = [h for h in ok if h not in changed]
        if same:
            self.echo(f"halting: {', '.join(same)} already ran this before: nothing to roll back")
        for host in ok:
            r = self.results[host]
            r.result, r.why, r.rolled_back = "failed", outcome.why, host in back
            if host in changed and host not in back:
                r.why += f"; its rollback failed: {failure(err, host)[1]}"
        return False

    def judge(self, hosts: Sequence[str], failed: set[str], err: str) -> None:
        """Each host's result from one pyinfra run: its exit, rollback and why it failed (its
        first servefleet line, a lost connection first, or pyinfra's connection error)."""
        for host in hosts:
            r = self.results[host]
            r.result = "failed" if host in failed else "ok"
            r.rolled_back = bool(re.search(rf"\[{re.escape(host)}\].*rolled back to ", err))
            r.why = ""
            if host in failed:
                unreachable, why = failure(err, host)
                r.why = f"unreachable: {why}" if unreachable and not why.startswith(LOST) else why

    def settle(self, failed: list[str]) -> None:
        """Failed hosts serve what they served before: the deploy rolled back those whose gate
        failed; any other that does not answer healthy is restored to its last good state."""
        statuses = self.report("status", failed) if failed else {}
        unhealthy = [
            h for h in failed
            if h in statuses and any(i["health"] != "ok" for i in statuses[h]["instances"])
        ]  # fmt: skip
        if unhealthy:
            self.echo(f"restoring the last good state on {', '.join(unhealthy)}")
            restore = str(Path(self.deploy).resolve().parent / "restore.py")
            self.pyinfra(unhealthy, restore)
            for host in unhealthy:
                self.results[host].rolled_back = True


def _over(failures: int, run: int, max_failures: int | None, fail_percent: float | None) -> str:
    """The limits ``failures`` of ``run`` hosts exceed, in words ("": none)."""
    out = []
    if max_failures is not None and failures > max_failures:
        out.append(f"--max-failures {max_failures}")
    if fail_percent is not None and run and 100 * failures / run > fail_percent:
        out.append(f"--fail-percent {fail_percent:g} ({100 * failures / run:.0f}% of {run} run)")
    return " and ".join(out)


def _runs(status: Mapping[str, Any] | None) -> tuple[Any, ...]:
    """What a host runs, as its status says: its release and each instance's running unit."""
    st = status or {}
    return st.get("release"), [(i.get("unit"), i.get("running")) for i in st.get("instances") or ()]


def summary_rows(results: dict[str, HostResult]) -> list[list[Any]]:
    return [
        [h, r.release_before, r.release_after, r.result, r.rolled_back, r.why]
        for h, r in results.items()
    ]
