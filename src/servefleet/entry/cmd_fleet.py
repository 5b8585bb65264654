"""The fleet commands: ``plan`` and ``status`` (deploys/report.py over the hosts, as tables or
JSON), ``rollout`` (batch by batch, a canary first) and ``rollback``."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from servefleet.base.errors import ServefleetError
from servefleet.base.exitcodes import Exit
from servefleet.entry import common, pyinfra_run as runs

# what follows ``--`` goes to pyinfra; an option before it that the command does not have is
# refused by click (exit 2), and pyinfra's parser checks what follows before any host is asked
_PYINFRA_ARGS = click.argument("pyinfra_args", nargs=-1, type=click.UNPROCESSED)


@click.command("rollback")
@click.argument("inventory", shell_complete=common.complete_inventory)
@common.fleet_options
@click.option(
    "--json", "as_json", is_flag=True,
    help="Per host on stdout: result (ok, failed), the release it rolled back to, why it "
    "failed (pyinfra's output goes to stderr).",
)  # fmt: skip
@_PYINFRA_ARGS
def rollback_cmd(
    inventory: str,
    limits: tuple[str, ...],
    data: tuple[str, ...],
    selection: tuple[str, ...],
    as_json: bool,
    pyinfra_args: tuple[str, ...],
) -> None:
    """Roll hosts back to the state before their last good deploy (units, release, servers),
    through the health gate. The data's keys are checked first (a rollback needs no recipe).
    Arguments after ``--`` go to pyinfra as they are (``-- --sudo``); the exit status is
    pyinfra's."""
    import subprocess

    from servefleet.settings.across import NO_INDEX

    fleet = runs.fleet_args(inventory, limits, pyinfra_args, data, selection)
    # its keys as the deploy reads them, before any host is contacted (the credentials stay
    # the deploy's business: a rollback installs nothing)
    fleet.settings({**os.environ, NO_INDEX: "1"}, recipe=False)
    cmd = [runs.pyinfra_bin(), "-y", *fleet.passed_on(), inventory]
    if not as_json:
        sys.exit(subprocess.run([*cmd, runs.deploy_path("rollback.py")]).returncode)
    code, results, output = runs.run_json(
        [cmd[0], "--json", *cmd[1:], runs.deploy_path("rollback.py")]
    )
    common.echo_json(rollback_results(fleet.hosts, code, results, output))
    sys.exit(code)


def rollback_results(
    hosts: Sequence[str], code: int, results: dict[str, Any] | None, output: str
) -> dict[str, dict[str, Any]]:
    """Each host of a rollback: ``ok`` or ``failed`` (pyinfra's failed hosts; all of them when
    it printed no results), the release its servers were rolled back to (the deploy's
    ``rolled back to`` line; None: not said), why it failed and whether it was unreachable.

    + hosts: the hosts of the run
    + code: pyinfra's exit status
    + results: pyinfra's ``--json`` results
    + output: its stderr
    """
    import re

    from servefleet.fleet.fleetview import failure

    failed = set(hosts) if results is None else set(results.get("failed_hosts") or ())
    if results is None and code == 0:
        failed = set()
    out = {}
    for host in hosts:
        said = re.search(rf"\[{re.escape(host)}\].*rolled back to (\S+)", output)
        unreachable, why = failure(output, host) if host in failed else (False, "")
        out[host] = {
            "result": "failed" if host in failed else "ok",
            "release": said.group(1) if said else None,
            "unreachable": unreachable,
            "why": why,
        }
    return out


@click.command("plan")
@click.argument("inventory", shell_complete=common.complete_inventory)
@common.fleet_options
@click.option("--json", "as_json", is_flag=True, help="JSON instead of a table.")
@click.option(
    "--diff", "diff", is_flag=True,
    help="Also each unit's diff: its file on the host to the one the deploy would write "
    "(unified; a unit to remove, to /dev/null). With --json: each host's \"diffs\".",
)  # fmt: skip
@_PYINFRA_ARGS
def plan_cmd(
    inventory: str,
    limits: tuple[str, ...],
    data: tuple[str, ...],
    selection: tuple[str, ...],
    as_json: bool,
    diff: bool,
    pyinfra_args: tuple[str, ...],
) -> None:
    """What a deploy would change on each host (driver, release and packages, models, restarts,
    recompiles; with --diff each unit file's diff). Changes nothing. Every host is shown; one
    that could not be planned (unreachable, with pyinfra's reason) is named on stderr and the
    exit status is 1. On a terminal, stderr counts the hosts done. Needs no index credentials.
    Arguments after ``--`` go to pyinfra (``-- --sudo``).

    Ansible's --check --diff: this command with --diff (a rollout has no --check)."""
    from servefleet.fleet.fleetview import ReportRequest, dumps, fleet_plan, plan_diffs, plan_table

    fleet = runs.fleet_args(inventory, limits, pyinfra_args, data, selection)
    fleet.settings({**os.environ, **ReportRequest.environ_of("plan")})
    found, missing = runs.report("plan", inventory, fleet.hosts, fleet.passed_on(),
                                 common.shows_progress())  # fmt: skip
    plans = {**fleet_plan(found), **missing}
    if not diff:
        plans = {h: {k: v for k, v in p.items() if k != "diffs"} for h, p in plans.items()}
    if as_json:
        click.echo(dumps(plans))
    else:
        click.echo(plan_table(plans))
        if diff:
            click.echo("\n" + (plan_diffs(plans) or _no_diffs(list(found), list(missing))))
    for host, p in sorted(plans.items()):  # what the table's "reinstall (drifted)" stands for
        for line in [*(p.get("release_drift") or []), *(p.get("model_drift") or []),
                     *(p.get("cache_drift") or [])]:  # fmt: skip
            click.echo(f"servefleet: {host}: {line}", err=True)
    runs.say_missing(missing)
    sys.exit(Exit.FAILED if missing else Exit.OK)


def _no_diffs(planned: list[str], missing: list[str]) -> str:
    """What ``plan --diff`` says when it shows no unit diff: no change on the hosts it planned,
    and the hosts it could not plan (unreachable or failed: named on stderr, exit 1)."""
    if not planned:
        return f"no unit diffs: none of the {len(missing)} host(s) could be planned (see stderr)"
    said = f"no unit changes on the {len(planned)} host(s) planned"
    return said + (f"; {len(missing)} could not be planned (see stderr)" if missing else "")


@click.command("status")
@click.argument("inventory", shell_complete=common.complete_inventory)
@common.fleet_options
@click.option("--json", "as_json", is_flag=True, help="JSON instead of a table.")
@click.option(
    "--prometheus",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Write file_sd targets to this file (atomically): every instance of every host, "
    'unreachable="1" on a host status could not reach.',
)
@click.option(
    "--textfile",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Write drift, reachability, release and gate results as metrics in the Prometheus "
    "text format to this file (atomically), for node_exporter's textfile collector.",
)
@click.option(
    "--verify", is_flag=True,
    help="Read every file of each host's releases, models and sealed compile caches and check "
    "its sha256 against what was installed, fetched or sealed (serve_verify for this run); "
    "says how many files and bytes it read.",
)  # fmt: skip
@_PYINFRA_ARGS
def status_cmd(
    inventory: str,
    limits: tuple[str, ...],
    data: tuple[str, ...],
    selection: tuple[str, ...],
    as_json: bool,
    prometheus: Path | None,
    textfile: Path | None,
    verify: bool,
    pyinfra_args: tuple[str, ...],
) -> None:
    """How each host runs against its data: driver, SKU, release and packages, each instance's
    running vs desired unit and health, and whether each release holds what was installed.
    Every host is shown: one that cannot be reached as unreachable, with pyinfra's reason.
    Exits 1 naming every host that is unreachable, drifts or is unhealthy. On a terminal,
    stderr counts the hosts done."""
    from servefleet.base.files import write_atomic
    from servefleet.fleet.fleetview import ReportRequest, dumps
    from servefleet.fleet.statusview import (
        group_lines,
        group_problems,
        missing_status,
        planned_instances,
        prometheus_targets,
        seen_ports,
        status_problems,
        status_table,
        textfile_metrics,
        verified_lines,
    )

    for path, option in ((prometheus, "--prometheus"), (textfile, "--textfile")):
        if path and not path.parent.is_dir():  # before any host is asked
            raise click.BadParameter(
                f"{path}: its directory {path.parent} does not exist", param_hint=f"'{option}'"
            )
    if verify:  # the probe of every host reads and hashes its releases' files
        data = (*data, "serve_verify=True")
    fleet = runs.fleet_args(inventory, limits, pyinfra_args, data, selection)
    settings = fleet.settings({**os.environ, **ReportRequest.environ_of("status")})
    found, missing = runs.report("status", inventory, fleet.hosts, fleet.passed_on(),
                                 common.shows_progress())  # fmt: skip
    seen = seen_ports(prometheus) if prometheus else {}
    statuses = dict(found)
    for host, why in missing.items():
        instances = planned_instances(settings[host], seen.get(host, ()))
        statuses[host] = missing_status(why, fleet.fleet.host(host).address, instances)
    click.echo(dumps(statuses) if as_json else status_table(statuses))
    if not as_json:
        for line in [*group_lines(statuses), *(verified_lines(statuses) if verify else [])]:
            click.echo(line)
    if prometheus:
        try:
            write_atomic(prometheus, dumps(prometheus_targets(statuses)) + "\n")
        except OSError as e:
            raise ServefleetError(
                f"--prometheus {prometheus}: not written ({e.strerror})"
            ) from None
    if textfile:
        try:
            write_atomic(textfile, textfile_metrics(statuses, time.time()))
        except OSError as e:
            raise ServefleetError(f"--textfile {textfile}: not written ({e.strerror})") from None
    problems = [line for h, st in sorted(statuses.items()) for line in status_problems(h, st)]
    problems += group_problems(statuses)
    for line in problems:
        click.echo(f"servefleet: {line}", err=True)
    sys.exit(Exit.FAILED if problems else Exit.OK)


def _interactive() -> bool:
    """Whether a prompt can be answered: stdin is a terminal."""
    return sys.stdin.isatty()


class _BatchSizes(click.ParamType):
    """``--batch-size``: N, P% or a growing comma list (:func:`servefleet.fleet.rollout.batch_sizes`)."""

    name = "N|P%|N,N,P%"

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        from servefleet.fleet.rollout import batch_sizes

        if isinstance(value, list):
            return value
        try:
            return batch_sizes(value)
        except ValueError as e:
            self.fail(str(e), param, ctx)


def _report_dir(path: Path) -> Path:
    """``--analysis-report DIR``: made when missing (its parents too), before any host is
    contacted; a path that exists and is no directory, or that cannot be made, is one line."""
    hint = "'--analysis-report'"
    if path.exists() and not path.is_dir():
        raise click.BadParameter(
            f"{path}: exists and is not a directory; allowed: a directory, or a path to make one",
            param_hint=hint,
        )
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise click.BadParameter(
            f"{path}: cannot make the directory ({e.strerror})", param_hint=hint
        ) from None
    return path


@click.command("rollout")
@click.argument("inventory", shell_complete=common.complete_inventory)
@click.argument("deploy", required=False, shell_complete=common.complete_inventory)
@click.option(
    "--canary",
    type=click.IntRange(min=0),
    default=0,
    help="The first K hosts alone (a serving group counts as one).",
)
@click.option(
    "--batch-size", type=_BatchSizes(), default=None,
    help="Hosts a batch: N, P% of all the hosts, or batches that grow, the last size repeated "
    '(1,5,20%: as Ansible\'s serial: [1, 5, "20%"]). A serving group counts as one.',
)  # fmt: skip
@click.option(
    "--batch-percent", type=click.FloatRange(0, 100, min_open=True), default=None,
    help="Hosts a batch, as a percentage of the hosts (the same as --batch-size P%).",
)  # fmt: skip
@click.option(
    "--max-failures", type=click.IntRange(min=0), default=None,
    help="Failed hosts the rollout tolerates (a serving group counts once), over all batches so "
    "far; one more stops it (the failed hosts back on what they served, the rest untouched) and "
    "it exits 1, saying why on stderr. Default: 0 (without --fail-percent).",
)  # fmt: skip
@click.option(
    "--fail-percent", type=click.FloatRange(0, 100), default=None, metavar="P",
    help="Failed hosts the rollout tolerates as a percentage of the hosts run so far (as "
    "pyinfra's --fail-percent, Ansible's max_fail_percentage); more stops it as --max-failures "
    "does. With both, the first limit exceeded stops it.",
)  # fmt: skip
@click.option(
    "--analysis", is_flag=True,
    help="After the canary batch passes its gates, probe one canary instance and one of a host "
    "not yet upgraded side by side (rollout_analysis: the load and each measure's threshold); "
    "go on only when every measure passes, else roll the canary back and exit 1.",
)  # fmt: skip
@click.option(
    "--analysis-report",
    type=click.Path(path_type=Path),
    metavar="DIR",
    help="Write the analysis' report there (the directory is made when missing): "
    "analysis.json and analysis.svg (the canary's and the baseline's latency distributions).",
)
@common.fleet_options
@click.option("--json", "as_json", is_flag=True, help="Per host: releases, result, rolled back.")
@click.option(
    "--yes", is_flag=True, help="Do not ask before starting (needed when stdin is no terminal)."
)
@click.option(
    "--check", "check", is_flag=True, hidden=True,
    help="Not a rollout option: `servefleet plan INVENTORY --diff` is Ansible's --check --diff.",
)  # fmt: skip
@_PYINFRA_ARGS
def rollout_cmd(
    inventory: str,
    deploy: str | None,
    canary: int,
    batch_size: list[tuple[float, bool]] | None,
    batch_percent: float | None,
    max_failures: int | None,
    fail_percent: float | None,
    analysis: bool,
    analysis_report: Path | None,
    limits: tuple[str, ...],
    data: tuple[str, ...],
    selection: tuple[str, ...],
    as_json: bool,
    yes: bool,
    check: bool,
    pyinfra_args: tuple[str, ...],
) -> None:
    """Deploy batch by batch in inventory order, a canary first; stop (exit 1, why on stderr)
    when more hosts fail than --max-failures or --fail-percent allow: failed hosts are back on
    what they served, hosts not reached are untouched. With --analysis the canary is promoted
    only when it serves as well as a host not yet upgraded. The data is checked whole before
    any host is contacted. Arguments after ``--`` go to pyinfra (``-- --sudo``).

    No --check: ``servefleet plan INVENTORY --diff`` shows what a rollout would change (each
    unit file's diff), changing nothing, as Ansible's --check --diff.

    Example:

    \b
        servefleet rollout inventories/prod.py --canary 1 --batch-size 1,5,20% --data serve_target=Throughput
    """
    from servefleet.fleet.analysis.canary import Analysis
    from servefleet.fleet.fleetview import dumps, table
    from servefleet.fleet.rollout import Rollout, batches, summary_rows

    if check:
        raise click.UsageError(
            "rollout has no --check; allowed: `servefleet plan INVENTORY --diff` shows what a "
            "rollout would change, changing nothing (Ansible's --check --diff)"
        )
    if batch_size and batch_percent:
        raise click.UsageError("--batch-size and --batch-percent: give one of them")
    if analysis_report and not analysis:
        raise click.UsageError("--analysis-report: give --analysis too")
    if analysis and not canary:
        raise click.UsageError("--analysis needs --canary K: the hosts it compares with the rest")
    if not yes and not _interactive():
        raise click.UsageError(
            "rollout asks before it starts and stdin is not a terminal: pass --yes"
        )
    if deploy and deploy.startswith("-"):
        pyinfra_args, deploy = (deploy, *pyinfra_args), None
    if deploy and not Path(deploy).is_file():
        raise click.BadParameter(
            f"{deploy}: no such file; allowed: a deploy file (default: deploys/serve.py)",
            param_hint="'DEPLOY'",
        )
    fleet = runs.fleet_args(inventory, limits, pyinfra_args, data, selection)
    settings = fleet.settings()
    group_of = {h: s.serve_group for h, s in settings.items()}
    hosts = fleet.hosts
    passed_on = [*fleet.options.rest, *fleet.data]  # each batch is limited to its own hosts
    plan = batches(hosts, canary, batch_size, batch_percent, group_of)
    if analysis and len(plan) < 2:
        raise click.UsageError(
            "--analysis: the canary is every host, so no host is left to compare it with; "
            "allowed: a --canary that leaves hosts out"
        )
    if analysis_report:
        _report_dir(analysis_report)
    echo = (lambda _m: None) if as_json else click.echo
    line = (f"rollout of {len(hosts)} host(s) in {len(plan)} batch(es): "
            + " | ".join(", ".join(b) for b in plan))  # fmt: skip
    echo(line)
    if not yes:
        if as_json:
            click.echo(line, err=True)
        click.confirm("Start?", abort=True, err=as_json)

    def report(kind: str, some: list[str]) -> dict[str, Any]:
        from servefleet.fleet.inventory import limit_pattern

        limit = [a for h in some for a in ("--limit", limit_pattern(h))]
        try:
            return runs.report(kind, inventory, some, (*limit, *passed_on))[0]
        except ServefleetError:
            return {}

    rollout = Rollout(
        inventory=inventory,
        deploy=deploy or runs.deploy_path("serve.py"),
        pyinfra_args=passed_on,
        report=report,
        echo=lambda m: echo(m),
        group_of=group_of,
        analyse=Analysis(
            data_of={h: s.rollout_analysis for h, s in settings.items()},
            key_of={h: s.api_key for h, s in settings.items()},
            report_dir=analysis_report,
        )
        if analysis
        else None,
    )
    if max_failures is None and fail_percent is None:
        max_failures = 0
    ok = rollout.run(plan, max_failures, fail_percent)
    if as_json:
        click.echo(dumps({h: vars(r) for h, r in rollout.results.items()}))
    else:
        header = ("host", "before", "after", "result", "rolled back", "why")
        click.echo(table(summary_rows(rollout.results), header))
    if not ok:  # exit-codes.md: a non-zero exit says why on stderr
        click.echo(f"servefleet: rollout {rollout.stopped or 'stopped'}", err=True)
    sys.exit(Exit.OK if ok else Exit.FAILED)
