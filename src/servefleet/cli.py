"""``servefleet``: a thin click CLI over the library (recipes, resolve, lab).

User errors (:class:`ServefleetError`, click usage errors) print one line
``servefleet: error: ...`` on stderr and exit 2, never a traceback. Every exit status is one of
:class:`servefleet.exitcodes.Exit` (docs/exit-codes.md).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import click

from servefleet.errors import RecipeError, ServefleetError
from servefleet.exitcodes import Exit


class _Group(click.Group):
    """A click group that turns user errors into one ``servefleet: error:`` line (exit 2)."""

    def main(  # type: ignore[override]
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, False, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, False, **extra)
        except click.ClickException as exc:
            usage = isinstance(exc, click.UsageError)
            _fail(exc.format_message(), Exit.USAGE if usage else exc.exit_code)
        except ServefleetError as exc:
            _fail(str(exc), Exit.USAGE)
        except click.Abort:
            click.echo("Aborted!", err=True)
            sys.exit(Exit.FAILED)
        sys.exit(rv if isinstance(rv, int) else Exit.OK)


def _fail(message: str, code: int) -> None:
    one_line = " ".join(message.split())
    click.echo(f"servefleet: error: {one_line}", err=True)
    sys.exit(code)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="servefleet")
def main() -> None:
    """Recipes to warm, health-checked vllm serve instances on a fleet."""


# ---------------------------------------------------------------------------------------------
# recipes


@main.group("recipes")
def recipes_group() -> None:
    """List and inspect the shipped recipes (rbln/<name>, vllm/<org>/<name>)."""


@recipes_group.command("list")
@click.argument("directory", required=False, type=click.Path(path_type=Path))
def recipes_list(directory: Path | None) -> None:
    """Print the qualified names of the recipes under DIRECTORY (default: the shipped ones, or
    SERVEFLEET_RECIPES). DIRECTORY holds rbln/ and vllm/, or is a checkout of vllm-project/recipes
    (models/, strategies/, taxonomy.yaml at its root); one that holds no recipe is an error.

    Example:

        servefleet recipes list
    """
    from servefleet.kinds import list_recipes

    if directory is not None and not directory.is_dir():
        raise RecipeError(f"{directory}: not a directory")
    names = list_recipes(directory)
    if not names:
        from servefleet.kinds import RECIPES_DIR

        raise RecipeError(
            f"{directory or RECIPES_DIR}: holds no recipe (looked for rbln/<name>.json, "
            "vllm/models/<org>/<name>.yaml, and models/<org>/<name>.yaml as in a checkout of "
            "vllm-project/recipes)"
        )
    for name in names:
        click.echo(name)


@recipes_group.command("show")
@click.argument("recipe")
def recipes_show(recipe: str) -> None:
    """Show a recipe's axes with allowed values, defaults, recommended, targets and strategies.

    Example:

        servefleet recipes show rbln/gpt-oss-120b
    """
    from servefleet.kinds import find

    source, path = find(recipe)
    click.echo(json.dumps(source.show(path, recipe), indent=2, ensure_ascii=False))


# ---------------------------------------------------------------------------------------------
# resolve

_COMMON_OPTIONS = ("--strategy", "--format")


def _given(value: Any) -> bool:
    """Whether the user gave an option: a number (0 too), a set flag, a non-empty value."""
    return (isinstance(value, int) and not isinstance(value, bool)) or bool(value)


def shell_command(server: Any) -> str:
    """One pasteable line: env assignments then the argv, each quoted for a POSIX shell; a
    placeholder (``$PREFILL_NODE_1``) is left for the shell to expand, as the recipes site
    prints it.

    + server: a :class:`servefleet.spec.Server`
    """
    from servefleet.kinds.roles import shell_word

    words = [f"{k}={shell_word(v)}" for k, v in server.env.items()]
    words += [shell_word(a) for a in server.argv]
    return " ".join(words)


def _render(spec: Any, fmt: str, unit: Callable[[], str]) -> str:
    if fmt == "json":
        return json.dumps(spec.to_json(), indent=2, ensure_ascii=False)
    if fmt == "shell":
        if len(spec.servers) == 1 and not spec.router:
            return shell_command(spec.servers[0])
        lines = [f"# role: {s.role}\n{shell_command(s)}" for s in spec.servers]
        if spec.router:
            from servefleet.spec import Server

            lines.append(f"# router\n{shell_command(Server('router', spec.router, {}))}")
        return "\n".join(lines)
    if len(spec.servers) != 1:
        roles = ", ".join(s.role for s in spec.servers)
        raise RecipeError(f"--format unit renders one server; this selection has {roles}")
    return unit()


@main.command("resolve")
@click.argument("recipe")
@click.option("--target", default=None, help="RBLN: Latency (default) or Throughput, any case.")
@click.option("--strategy", default=None, help="Strategy slug (default: the recipe's).")
@click.option("--set", "sets", multiple=True, metavar="AXIS=VALUE", help="RBLN: choose a value.")
@click.option("--recommended", is_flag=True, help="RBLN: start from the recommended values.")
@click.option("--sku", default=None, help="RBLN: NPU SKU (default: the option's first).")
@click.option(
    "--compiler-version",
    default=None,
    metavar="X.Y.Z",
    help="RBLN: rebel-compiler version for the fingerprint (default: the data's pin).",
)
@click.option("--hardware", default=None, help="vLLM: GPU id (h200, mi300x, b200, ...).")
@click.option("--variant", default=None, help="vLLM: recipe variant.")
@click.option("--tp", type=int, default=None, help="vLLM: tensor-parallel size override.")
@click.option(
    "--feature",
    "features",
    multiple=True,
    metavar="NAME[=MODE]",
    help="vLLM: turn a feature on (or pick its mode).",
)
@click.option(
    "--no-feature", "no_features", multiple=True, metavar="NAME", help="vLLM: turn a feature off."
)
@click.option(
    "--kv-offload", default=None, metavar="NAME", help="vLLM: a KV-offload option of the taxonomy."
)
@click.option("--task", default=None, help="vLLM: an omni recipe's task (default: its first).")
@click.option(
    "--pool-parallelism",
    default=None,
    metavar="tp|tep|dep",
    help="vLLM: pd_cluster only: the prefill and decode pools' parallelism (default: the recipe's).",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["json", "shell", "unit"]),
    default="json",
    show_default=True,
    help="Output: JSON spec, a pasteable shell line, a systemd unit: the unit deploys/serve.py "
    "writes for instance 0 under the default data with this recipe as serve_recipe.",
)
def resolve_cmd(recipe: str, strategy: str | None, fmt: str, **options: Any) -> None:
    """Resolve a selection of RECIPE (a path or a name such as rbln/gpt-oss-120b) to the exact
    argv and env of each server.

    Example:

        servefleet resolve rbln/gpt-oss-120b --target throughput --set lmcache=cpu --format shell
    """
    from servefleet.kinds import KINDS, find

    source, path = find(recipe)
    flags = {flag: key for s in KINDS for flag, key in s.options.items()}
    foreign = [f for f, key in flags.items() if f not in source.options and _given(options[key])]
    if foreign:
        raise RecipeError(
            f"{', '.join(foreign)} {'applies' if len(foreign) == 1 else 'apply'} to the other "
            f"kind of recipe only: {recipe} is {source.label} "
            f"(its options: {', '.join((*source.options, *_COMMON_OPTIONS))})"
        )
    own = {key: options[key] for key in source.options.values()}
    spec = source.resolve(path, recipe, strategy, own)
    click.echo(_render(spec, fmt, lambda: _unit(spec, own.get("compiler_version"))))


def _unit(spec: Any, compiler_version: str | None) -> str:
    """The unit ``deploys/serve.py`` writes for instance 0 of this selection (devices
    ``0..n-1``) under the default data with ``serve_recipe`` set to the spec's recipe."""
    from servefleet.hostplan import NETRC, render_instance
    from servefleet.release import plan_release
    from servefleet.settings import default_settings

    settings = default_settings(spec.recipe, compiler_version)
    devices = ",".join(str(d) for d in range(spec.servers[0].npus))
    release = plan_release(settings, spec, NETRC)
    return render_instance(settings, spec, release, 0, devices)[0].rstrip("\n")


# ---------------------------------------------------------------------------------------------
# fleet


def deploy_path(name: str) -> str:
    """The deploy file ``name`` (``serve.py``) the fleet commands run: the fleet repository's own
    (``./deploys``, as `servefleet init` makes it, or this checkout's), else the package's text
    (:func:`servefleet.scaffold.deploy_file`) written for this process into a temporary
    directory, next to the others (``rollout`` runs ``restore.py`` beside its deploy)."""
    import atexit
    import shutil
    import tempfile

    from servefleet.scaffold import DEPLOYS, deploy_file

    here = Path("deploys") / name
    if here.is_file():
        return str(here)
    global _SHIPPED
    if _SHIPPED is None:
        _SHIPPED = Path(tempfile.mkdtemp(prefix="servefleet-deploys-"))
        atexit.register(shutil.rmtree, _SHIPPED, True)
        for each in DEPLOYS:
            (_SHIPPED / each).write_text(deploy_file(each))
    return str(_SHIPPED / name)


_SHIPPED: Path | None = None
_FLEET = {"ignore_unknown_options": True}
_LIMIT = click.option(
    "--limit",
    "limits",
    multiple=True,
    metavar="PATTERN",
    help="Only these hosts: a group name, else a glob of host names (repeatable, as pyinfra's "
    "--limit; a --limit after -- counts too).",
)
_PYINFRA_ARGS = click.argument("pyinfra_args", nargs=-1, type=click.UNPROCESSED)


def _pyinfra() -> str:
    return str(Path(sys.executable).parent / "pyinfra")


def _fleet(inventory: str, limits: tuple[str, ...], pyinfra_args: tuple[str, ...]) -> Any:
    """The command's hosts, read with pyinfra's loader (:class:`servefleet.inventory.FleetArgs`);
    a pattern that matches no host is said on stderr, as pyinfra says it."""
    from servefleet.inventory import FleetArgs

    return FleetArgs.read(
        inventory, limits, pyinfra_args, warn=lambda m: click.echo(f"servefleet: {m}", err=True)
    )


def _run_pyinfra(cmd: list[str], env: dict[str, str]) -> tuple[int, str]:
    """One pyinfra run, its exit status and everything it printed (stdout and stderr, in order)."""
    import subprocess

    proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return proc.returncode, proc.stdout


def _report(
    kind: str, inventory: str, hosts: Sequence[str], pyinfra_args: Sequence[str]
) -> tuple[dict[str, Any], dict[str, dict[str, str]]]:
    """Run deploys/report.py over ``hosts`` (the deploy's probe and planner, no operation):
    each host's summary, and each host that wrote none, ``unreachable`` (pyinfra's reason) or
    ``failed`` (why). pyinfra refusing to start is one line (exit 2).

    + kind: "plan" or "status"
    + inventory: as pyinfra takes it
    + hosts: the hosts of the run
    + pyinfra_args: what else pyinfra gets (``--limit`` options that pick ``hosts`` first)
    """
    import tempfile

    from servefleet.fleetview import ReportRequest, missing_hosts, pyinfra_refusal

    with tempfile.TemporaryDirectory(prefix="servefleet-report-") as tmp:
        request = ReportRequest(kind, tmp)
        cmd = [_pyinfra(), "-y", *pyinfra_args, inventory, deploy_path("report.py")]
        code, output = _run_pyinfra(cmd, {**os.environ, **request.env()})
        found = request.read()
    refusal = None if found else pyinfra_refusal(output, code)
    if refusal:
        raise ServefleetError(f"pyinfra: {refusal}")
    return found, missing_hosts(hosts, found, output)


def _say_missing(missing: dict[str, dict[str, str]]) -> None:
    """One line for each host a run left without a summary: unreachable or failed, and why."""
    for host, why in missing.items():
        for state, reason in why.items():
            click.echo(f"servefleet: {host}: {state}: {reason}", err=True)


@main.command("rollback", context_settings=_FLEET)
@click.argument("inventory")
@_LIMIT
@_PYINFRA_ARGS
def rollback_cmd(inventory: str, limits: tuple[str, ...], pyinfra_args: tuple[str, ...]) -> None:
    """Roll hosts back to the state before their last good deploy (units, release, servers),
    through the health gate. Arguments after ``--`` go to pyinfra as they are; the exit status
    is pyinfra's."""
    import subprocess

    fleet = _fleet(inventory, limits, pyinfra_args)
    cmd = [_pyinfra(), "-y", *fleet.limit_args(), *pyinfra_args, inventory]
    sys.exit(subprocess.run([*cmd, deploy_path("rollback.py")]).returncode)


@main.command("plan", context_settings=_FLEET)
@click.argument("inventory")
@_LIMIT
@click.option("--json", "as_json", is_flag=True, help="JSON instead of a table.")
@_PYINFRA_ARGS
def plan_cmd(
    inventory: str, limits: tuple[str, ...], as_json: bool, pyinfra_args: tuple[str, ...]
) -> None:
    """What a deploy would change on each host (driver, release and packages, models, restarts,
    recompiles). Changes nothing. Every host is shown; one that could not be planned
    (unreachable, with pyinfra's reason) is named on stderr and the exit status is 1. Arguments
    after ``--`` go to pyinfra (``--data``)."""
    from servefleet.fleetview import dumps, fleet_plan, plan_table

    fleet = _fleet(inventory, limits, pyinfra_args)
    fleet.settings()
    found, missing = _report("plan", inventory, fleet.hosts, (*fleet.limit_args(), *pyinfra_args))
    plans = {**fleet_plan(found), **missing}
    click.echo(dumps(plans) if as_json else plan_table(plans))
    _say_missing(missing)
    sys.exit(Exit.FAILED if missing else Exit.OK)


@main.command("status", context_settings=_FLEET)
@click.argument("inventory")
@_LIMIT
@click.option("--json", "as_json", is_flag=True, help="JSON instead of a table.")
@click.option(
    "--prometheus",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Write file_sd targets to this file (atomically): every instance of every host, "
    'unreachable="1" on a host status could not reach.',
)
@_PYINFRA_ARGS
def status_cmd(
    inventory: str,
    limits: tuple[str, ...],
    as_json: bool,
    prometheus: Path | None,
    pyinfra_args: tuple[str, ...],
) -> None:
    """How each host runs against its data: driver, SKU, release and packages, each instance's
    running vs desired unit and health. Every host is shown: one that cannot be reached as
    unreachable, with pyinfra's reason. Exits 1 naming every host that is unreachable, drifts
    or is unhealthy."""
    from servefleet.fleetview import (
        dumps,
        missing_status,
        planned_instances,
        prometheus_targets,
        seen_ports,
        status_problems,
        status_table,
        write_atomic,
    )

    fleet = _fleet(inventory, limits, pyinfra_args)
    settings = fleet.settings()
    found, missing = _report("status", inventory, fleet.hosts, (*fleet.limit_args(), *pyinfra_args))
    seen = seen_ports(prometheus) if prometheus else {}
    statuses = dict(found)
    for host, why in missing.items():
        instances = planned_instances(settings[host], seen.get(host, ()))
        statuses[host] = missing_status(why, fleet.fleet.host(host).address, instances)
    click.echo(dumps(statuses) if as_json else status_table(statuses))
    if prometheus:
        write_atomic(prometheus, dumps(prometheus_targets(statuses)) + "\n")
    problems = [line for h, st in sorted(statuses.items()) for line in status_problems(h, st)]
    for line in problems:
        click.echo(f"servefleet: {line}", err=True)
    sys.exit(Exit.FAILED if problems else Exit.OK)


def _interactive() -> bool:
    """Whether a prompt can be answered: stdin is a terminal."""
    return sys.stdin.isatty()


def _shows_progress() -> bool:
    """Whether a progress bar is drawn: stderr is a terminal (a log gets the lines only)."""
    return sys.stderr.isatty()


@main.command("rollout", context_settings=_FLEET)
@click.argument("inventory")
@click.argument("deploy", required=False)
@click.option("--canary", type=click.IntRange(min=0), default=0, help="The first K hosts alone.")
@click.option("--batch-size", type=click.IntRange(min=1), default=None, help="Hosts a batch.")
@click.option(
    "--batch-percent", type=click.FloatRange(0, 100, min_open=True), default=None,
    help="Hosts a batch, as a percentage of the hosts.",
)  # fmt: skip
@click.option("--max-failures", type=click.IntRange(min=0), default=0, show_default=True)
@_LIMIT
@click.option("--json", "as_json", is_flag=True, help="Per host: releases, result, rolled back.")
@click.option(
    "--yes", is_flag=True, help="Do not ask before starting (needed when stdin is no terminal)."
)
@_PYINFRA_ARGS
def rollout_cmd(
    inventory: str,
    deploy: str | None,
    canary: int,
    batch_size: int | None,
    batch_percent: float | None,
    max_failures: int,
    limits: tuple[str, ...],
    as_json: bool,
    yes: bool,
    pyinfra_args: tuple[str, ...],
) -> None:
    """Deploy batch by batch in inventory order, a canary first; stop (exit 1) when a batch
    fails more hosts than --max-failures: failed hosts are back on what they served, hosts not
    reached are untouched. Arguments after ``--`` go to pyinfra (e.g. ``--data k=v``)."""
    from servefleet.fleetview import dumps, table
    from servefleet.rollout import Rollout, batches, summary_rows

    if batch_size and batch_percent:
        raise click.UsageError("--batch-size and --batch-percent: give one of them")
    if not yes and not _interactive():
        raise click.UsageError(
            "rollout asks before it starts and stdin is not a terminal: pass --yes"
        )
    if deploy and deploy.startswith("-"):
        pyinfra_args, deploy = (deploy, *pyinfra_args), None
    fleet = _fleet(inventory, limits, pyinfra_args)
    fleet.settings()
    hosts = fleet.hosts
    passed_on = list(fleet.options.rest)  # each batch is limited to its own hosts
    plan = batches(hosts, canary, batch_size, batch_percent)
    echo = (lambda _m: None) if as_json else click.echo
    line = (f"rollout of {len(hosts)} host(s) in {len(plan)} batch(es): "
            + " | ".join(", ".join(b) for b in plan))  # fmt: skip
    echo(line)
    if not yes:
        if as_json:
            click.echo(line, err=True)
        click.confirm("Start?", abort=True, err=as_json)

    def report(kind: str, some: list[str]) -> dict[str, Any]:
        from servefleet.inventory import limit_pattern

        limit = [a for h in some for a in ("--limit", limit_pattern(h))]
        try:
            return _report(kind, inventory, some, (*limit, *passed_on))[0]
        except ServefleetError:
            return {}

    rollout = Rollout(
        inventory=inventory,
        deploy=deploy or deploy_path("serve.py"),
        pyinfra_args=passed_on,
        report=report,
        echo=lambda m: echo(m),
    )
    ok = rollout.run(plan, max_failures)
    if as_json:
        click.echo(dumps({h: vars(r) for h, r in rollout.results.items()}))
    else:
        header = ("host", "before", "after", "result", "rolled back", "why")
        click.echo(table(summary_rows(rollout.results), header))
    sys.exit(Exit.OK if ok else Exit.FAILED)


@main.command("init")
@click.argument("directory")
def init(directory: str) -> None:
    """A new fleet repository in DIRECTORY that depends on this package: inventories (prod with a
    canary, lab), group_data (every key a site usually sets, commented with its default), thin
    deploys/*.py, locks/. Refuses, changing nothing, when any of its files exists.

    Example:

        servefleet init fleet && cd fleet && servefleet lab up && pyinfra -y inventories/lab.py deploys/serve.py
    """
    from servefleet.scaffold import init as scaffold

    for rel in scaffold(directory):
        click.echo(f"{directory.rstrip('/')}/{rel}")


@main.command("lock")
@click.argument("inventory")
@click.option("--check", is_flag=True, help="Only compare the lock with the data (offline).")
@click.option("--lock-dir", default=None, help="The lock directory (default: the data's sdk_lock).")
@click.option(
    "--data", "data", multiple=True, metavar="KEY=VALUE", help="Data over all (as pyinfra)."
)
@click.option(
    "--selection", "selection", multiple=True, metavar="AXIS=VALUE",
    help="Lock this selection on every host (over the data's serve_selection).",
)  # fmt: skip
def lock_cmd(
    inventory: str, check: bool, lock_dir: str | None, data: tuple[str, ...],
    selection: tuple[str, ...],
) -> None:  # fmt: skip
    """Resolve every stack the inventory's data selects (every package with its version, index
    and file sha256s; the driver runfile; the models' revisions) into the lock directory.
    With --check, exit 1 naming what no longer matches the data.

    Example:

        servefleet lock inventories/prod.py && git diff locks/
    """
    from servefleet.lockfleet import check_lock, fleet_lock, make_lock

    overrides = _overrides(data)
    if selection:
        chosen = _overrides(selection, "--selection", parse=False)
        overrides["serve_selection"] = {**(overrides.get("serve_selection") or {}), **chosen}
    fl = fleet_lock(inventory, overrides, lock_dir)
    if not check:
        make_lock(fl, click.echo)
        return
    problems = check_lock(fl)
    for line in problems:
        click.echo(f"servefleet: lock: {line}", err=True)
    if problems:
        sys.exit(Exit.FAILED)
    click.echo(f"{fl.lock_dir}: matches the data ({len(fl.stacks)} stack(s))")


def _overrides(data: tuple[str, ...], option: str = "--data", parse: bool = True) -> dict[str, Any]:
    """``KEY=VALUE`` options as a dict: ``--data`` values as pyinfra reads them (``parse``),
    ``--selection`` values as strings."""
    from servefleet.inventory import data_overrides

    return data_overrides(data, option, parse)


@main.command("wheelhouse")
@click.argument("directory")
@click.option(
    "--inventory",
    default=None,
    help="Take sdk_lock and the credentials' variable names from this inventory's data.",
)
@click.option("--lock-dir", default=None, help="The lock directory (default: the data's sdk_lock).")
@click.option(
    "--data", "data", multiple=True, metavar="KEY=VALUE", help="Data over all (as pyinfra)."
)
def wheelhouse_cmd(
    directory: str, inventory: str | None, lock_dir: str | None, data: tuple[str, ...]
) -> None:
    """Download every file of a lock into DIRECTORY: each stack's wheels and sdists, the driver
    runfiles, the model archives, each checked against the lock's sha256 (a file that differs
    is named with both hashes and not kept; exit 1). Files already there with the right sha256
    are not downloaded again; on a terminal a progress bar counts the files as they arrive.
    Deploy from it with sdk_source=wheelhouse, sdk_wheelhouse=DIRECTORY.

    Credentials come from the variables the data's creds_*_env name (the defaults' without
    --inventory), the index's only to an index that needs them, the token only to the store.

    Example:

        servefleet wheelhouse /srv/wheelhouse --inventory inventories/prod.py
    """
    from servefleet.lock import load_lock
    from servefleet.settings import DEFAULTS
    from servefleet.wheelhouse import Credentials, fill, lock_files

    if inventory:
        from servefleet.lockfleet import lock_settings

        where, s = lock_settings(inventory, _overrides(data), lock_dir)
        creds = Credentials(s.index_user, s.index_password, s.hf_token)
    elif lock_dir:
        where = Path(lock_dir)
        keys = ("creds_index_user_env", "creds_index_password_env", "creds_hf_token_env")
        creds = Credentials(*(os.environ.get(str(DEFAULTS[k])) or None for k in keys))
    else:
        raise click.UsageError("give --inventory (its data's sdk_lock) or --lock-dir")
    files, hub = lock_files(load_lock(where))
    for model in hub:
        click.echo(f"model {model}: from the hub in the lock (no store archive); not included")

    def bar(count: int) -> Any:
        return click.progressbar(
            length=count, label=f"downloading {count} file(s)", file=sys.stderr
        )

    done = fill(directory, files, creds, click.echo, progress=bar if _shows_progress() else None)
    for line in done.failed:
        click.echo(f"servefleet: wheelhouse: {line}", err=True)
    click.echo(
        f"{directory}: {len(done.downloaded)} downloaded ({done.bytes} bytes), "
        f"{len(done.present)} already there, {len(done.failed)} failed"
    )
    if done.failed:
        sys.exit(Exit.FAILED)


def _register() -> None:
    from servefleet.lab.chat import chat
    from servefleet.lab.cli import lab

    lab.add_command(chat)
    main.add_command(lab)


_register()
