"""``servefleet``: a thin click CLI over the library (recipes, resolve, lab).

User errors (:class:`ServefleetError`, click usage errors) print one line
``servefleet: error: ...`` on stderr and exit 2, never a traceback; something the command could
not reach (:class:`Unreachable`: an index, a host, the hub) the same line and exit 3. Every exit
status is one of :class:`servefleet.base.exitcodes.Exit` (docs/exit-codes.md).

Shell completion is click's (``_SERVEFLEET_COMPLETE=bash_source servefleet``): it completes
commands and options, inventory files, recipe names and ``--limit`` hosts and groups.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import click

from servefleet.base.errors import RecipeError, ServefleetError, Unreachable
from servefleet.base.exitcodes import Exit


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
        except Unreachable as exc:
            _fail(str(exc), Exit.UNREACHABLE)
        except ServefleetError as exc:
            _fail(str(exc), Exit.USAGE)
        except OSError as exc:  # what the system refused, not caught where it happened
            _fail(*_os_error(exc))
        except click.Abort:
            click.echo("Aborted!", err=True)
            sys.exit(Exit.FAILED)
        sys.exit(rv if isinstance(rv, int) else Exit.OK)


def _os_error(exc: OSError) -> tuple[str, Exit]:
    """An ``OSError`` no command caught, as one line and its exit: the network's (a connection
    refused or reset, a timeout, a name that does not resolve) exit 3; a path's (no such file,
    permission denied, not a directory) exit 2, naming the path."""
    from servefleet.remote.retry import reason, transient

    if transient(exc):
        return f"could not reach it ({reason(exc)})", Exit.UNREACHABLE
    where = exc.filename if exc.filename is not None else ""
    also = f" -> {exc.filename2}" if exc.filename2 is not None else ""
    why = exc.strerror or str(exc)
    return (f"{where}{also}: {why}" if where else why), Exit.USAGE


def _fail(message: str, code: int) -> None:
    one_line = " ".join(message.split())
    click.echo(f"servefleet: error: {one_line}", err=True)
    sys.exit(code)


def _echo_json(data: Any, sort_keys: bool = True) -> None:
    """The ``--json`` output of every command: one JSON document on stdout (``keys``: in the
    key table's order)."""
    click.echo(json.dumps(data, indent=1, sort_keys=sort_keys))


# ---------------------------------------------------------------------------------------------
# shell completion (click's): inventory files, recipe names, --limit hosts


def complete_inventory(_ctx: Any, _param: Any, incomplete: str) -> list[Any]:
    """Inventory files for INVENTORY: the ``*.py`` files and the directories that start with
    what is typed (``inventories/`` first, as `servefleet init` makes it)."""
    import glob

    from click.shell_completion import CompletionItem

    folder, sep, stem = incomplete.rpartition("/")
    root = Path(folder + sep or ".")
    try:
        found = sorted(root.glob(f"{glob.escape(stem)}*"))
    except (OSError, ValueError):
        return []
    out = []
    for path in found:
        shown = f"{folder}{sep}{path.name}"
        if path.is_dir() and not path.name.startswith((".", "__")):
            out.append(CompletionItem(f"{shown}/"))
        elif path.suffix == ".py":
            out.append(CompletionItem(shown))
    return out


def complete_recipe(_ctx: Any, _param: Any, incomplete: str) -> list[Any]:
    """Recipe names (``rbln/<name>``, ``vllm/<org>/<name>``) that start with what is typed."""
    from click.shell_completion import CompletionItem

    from servefleet.kinds import list_recipes

    try:
        return [CompletionItem(n) for n in list_recipes(None) if n.startswith(incomplete)]
    except Exception:  # noqa: BLE001 (completion never fails: it offers nothing)
        return []


def complete_limit(ctx: Any, _param: Any, incomplete: str) -> list[Any]:
    """The inventory's groups and host names for ``--limit`` (the INVENTORY already typed,
    read with pyinfra's loader; nothing when it cannot be read)."""
    from click.shell_completion import CompletionItem

    from servefleet.fleet.inventory import read_inventory

    # before the value of an option, click's parse leaves the arguments in ctx.args
    given = [a for a in ctx.args if not a.startswith("-")]
    inventory = ctx.params.get("inventory") or (given[0] if given else None)
    if not inventory:
        return []
    try:
        fleet = read_inventory(inventory)
    except Exception:  # noqa: BLE001 (completion never fails: it offers nothing)
        return []
    names = [*sorted(fleet.groups), *fleet.order]
    return [CompletionItem(n) for n in dict.fromkeys(names) if n.startswith(incomplete)]


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(None, "-V", "--version", package_name="servefleet")
def main() -> None:
    """Recipes to warm, health-checked vllm serve instances on a fleet."""


# ---------------------------------------------------------------------------------------------
# recipes


@main.group("recipes")
def recipes_group() -> None:
    """List and inspect the shipped recipes (rbln/<name>, vllm/<org>/<name>)."""


@recipes_group.command("list")
@click.argument("directory", required=False, type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="A JSON list of the names.")
def recipes_list(directory: Path | None, as_json: bool) -> None:
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
    if as_json:
        _echo_json(names)
        return
    for name in names:
        click.echo(name)


def outline(value: Any, indent: str = "") -> list[str]:
    """A JSON value as indented text for a reader: ``key: value`` lines, a list of plain
    values on one line (``a, b, c``), a list of mappings as ``-`` items.

    + value: what JSON would print
    + indent: the indentation of its lines
    """

    def plain(v: Any) -> bool:
        return not isinstance(v, (dict, list)) or v in ([], {})

    def word(v: Any) -> str:
        return (
            "-" if v is None or v in ([], {}) else str(v).lower() if isinstance(v, bool) else str(v)
        )

    if isinstance(value, dict):
        out = []
        for k, v in value.items():
            if plain(v) or (isinstance(v, list) and all(plain(x) for x in v)):
                shown = ", ".join(map(word, v)) if isinstance(v, list) and v else word(v)
                out.append(f"{indent}{k}: {shown}")
            else:
                out += [f"{indent}{k}:", *outline(v, indent + "  ")]
        return out
    if isinstance(value, list):
        if all(plain(x) for x in value):
            return [f"{indent}{', '.join(map(word, value)) or '-'}"]
        out = []
        for item in value:
            lines = outline(item, indent + "  ")
            out += [f"{indent}- {lines[0].lstrip()}", *lines[1:]] if lines else [f"{indent}-"]
        return out
    return [f"{indent}{word(value)}"]


@recipes_group.command("show")
@click.argument("recipe", shell_complete=complete_recipe)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="text: indented, for reading; json: the same as JSON, for programs.",
)
@click.option("--json", "as_json", is_flag=True, help="The same as --format json.")
def recipes_show(recipe: str, fmt: str, as_json: bool) -> None:
    """Show a recipe's axes with allowed values, defaults, recommended, targets and strategies.

    Example:

        servefleet recipes show rbln/gpt-oss-120b
    """
    from servefleet.kinds import find

    source, path = find(recipe)
    shown = source.show(path, recipe)
    if as_json or fmt == "json":
        click.echo(json.dumps(shown, indent=2, ensure_ascii=False))
    else:
        click.echo("\n".join(outline(shown)))


# ---------------------------------------------------------------------------------------------
# keys


@main.command("keys")
@click.argument("names", nargs=-1, metavar="[NAME]...")
@click.option("--json", "as_json", is_flag=True, help="JSON: key -> its type, allowed values, "
              "default and meaning.")  # fmt: skip
def keys_cmd(names: tuple[str, ...], as_json: bool) -> None:
    """The data keys, from the installed package's key table (as ``ansible-doc`` does): without
    NAME every key and its meaning; with NAME (a key, or a glob such as 'serve_router*') its
    type, meaning, allowed values and default.

    Example:

        servefleet keys serve_target
    """
    import fnmatch

    from servefleet.fleet.datadoc import key_docs, key_help
    from servefleet.settings.checks import closest

    docs = {doc.name: doc for doc in key_docs()}
    chosen = []
    for name in names:
        found = [k for k in docs if fnmatch.fnmatchcase(k, name)]
        if not found:
            near = closest(name, docs, cutoff=0.7)
            hint = f"did you mean {near}? " if near else ""
            raise ServefleetError(f"{name}: no such data key; {hint}allowed: a key that "
                                  "`servefleet keys` lists, or a glob of them")  # fmt: skip
        chosen += [k for k in found if k not in chosen]
    if as_json:
        _echo_json({k: docs[k].to_json() for k in chosen or docs}, sort_keys=False)
    elif chosen:
        click.echo("\n\n".join(key_help(docs[k]) for k in chosen))
    else:
        width = max(map(len, docs))
        click.echo("\n".join(f"{k.ljust(width)}  {d.meaning}" for k, d in docs.items()))


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
@click.argument("recipe", shell_complete=complete_recipe)
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
    from servefleet.hostplan.plan import NETRC, render_instance
    from servefleet.release.plan import plan_release
    from servefleet.settings.table import default_settings

    settings = default_settings(spec.recipe, compiler_version)
    devices = ",".join(str(d) for d in range(spec.servers[0].npus))
    release = plan_release(settings, spec, NETRC)
    return render_instance(settings, spec, release, 0, devices)[0].rstrip("\n")


# ---------------------------------------------------------------------------------------------
# fleet


def deploy_path(name: str) -> str:
    """The deploy file ``name`` (``serve.py``) the fleet commands run: the fleet repository's own
    (``./deploys``, as `servefleet init` makes it, or this checkout's), else the package's text
    (:func:`servefleet.fleet.scaffold.deploy_file`) written for this process into a temporary
    directory, next to the others (``rollout`` runs ``restore.py`` beside its deploy)."""
    import atexit
    import shutil
    import tempfile

    from servefleet.fleet.scaffold import DEPLOYS, deploy_file

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
    shell_complete=complete_limit,
)
_PYINFRA_ARGS = click.argument("pyinfra_args", nargs=-1, type=click.UNPROCESSED)


def _pyinfra() -> str:
    return str(Path(sys.executable).parent / "pyinfra")


def _fleet(inventory: str, limits: tuple[str, ...], pyinfra_args: tuple[str, ...]) -> Any:
    """The command's hosts, read with pyinfra's loader (:class:`servefleet.fleet.inventory.FleetArgs`);
    a pattern that matches no host is said on stderr, as pyinfra says it."""
    from servefleet.fleet.inventory import FleetArgs

    return FleetArgs.read(
        inventory, limits, pyinfra_args, warn=lambda m: click.echo(f"servefleet: {m}", err=True)
    )


def _run_pyinfra(cmd: list[str], env: dict[str, str]) -> tuple[int, str]:
    """One pyinfra run, its exit status and everything it printed (stdout and stderr, in order)."""
    import subprocess

    proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return proc.returncode, proc.stdout


class Progress:
    """``plan: 3/10 hosts`` on stderr while a report runs, redrawn in place when a host is done:
    its summary written, or pyinfra said it could not connect to it (stderr a terminal only).

    + kind: "plan" or "status"
    + hosts: the hosts of the run
    + directory: where the summaries are written (:class:`servefleet.fleet.fleetview.ReportRequest`)
    + write: where the line goes (stderr)
    """

    def __init__(
        self, kind: str, hosts: Sequence[str], directory: str, write: Callable[[str], Any]
    ) -> None:
        import threading

        self.kind, self.hosts, self.directory, self.write = kind, list(hosts), directory, write
        self.output: list[str] = []
        self.shown = -1
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def done(self) -> int:
        """Hosts done so far: a summary written, or a connection that failed."""
        from servefleet.fleet.fleetview import connection_errors

        written = sum(1 for _ in Path(self.directory).glob("*.json"))
        return min(
            len(self.hosts), written + len(connection_errors("".join(self.output), self.hosts))
        )

    def draw(self) -> None:
        now = self.done()
        if now != self.shown:
            self.shown = now
            self.write(f"\r{self.kind}: {now}/{len(self.hosts)} hosts")

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self.draw()

    def __enter__(self) -> Progress:
        self.draw()
        self._thread.start()
        return self

    def __exit__(self, *_exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self.draw()
        self.write("\n")


def _run_watched(cmd: list[str], env: dict[str, str], progress: Progress) -> tuple[int, str]:
    """:func:`_run_pyinfra` that hands each line of pyinfra's output to ``progress`` as it comes."""
    import subprocess

    with subprocess.Popen(
        cmd, env={**env, "PYTHONUNBUFFERED": "1"}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
    ) as proc:  # fmt: skip
        assert proc.stdout is not None
        for line in proc.stdout:
            progress.output.append(line)
    return proc.returncode, "".join(progress.output)


def _report(
    kind: str,
    inventory: str,
    hosts: Sequence[str],
    pyinfra_args: Sequence[str],
    progress: bool = False,
) -> tuple[dict[str, Any], dict[str, dict[str, str]]]:
    """Run deploys/report.py over ``hosts`` (the deploy's probe and planner, no operation):
    each host's summary, and each host that wrote none, ``unreachable`` (pyinfra's reason) or
    ``failed`` (why). pyinfra refusing to start is one line (exit 2).

    + kind: "plan" or "status"
    + inventory: as pyinfra takes it
    + hosts: the hosts of the run
    + pyinfra_args: what else pyinfra gets (``--limit`` options that pick ``hosts`` first)
    + progress: show hosts done of all on stderr (:class:`Progress`) while it runs
    """
    import tempfile

    from servefleet.fleet.fleetview import ReportRequest, missing_hosts, pyinfra_refusal

    with tempfile.TemporaryDirectory(prefix="servefleet-report-") as tmp:
        request = ReportRequest(kind, tmp)
        cmd = [_pyinfra(), "-y", *pyinfra_args, inventory, deploy_path("report.py")]
        env = {**os.environ, **request.env()}
        if progress:
            with Progress(kind, hosts, tmp, lambda m: click.echo(m, err=True, nl=False)) as shown:
                code, output = _run_watched(cmd, env, shown)
        else:
            code, output = _run_pyinfra(cmd, env)
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
@click.argument("inventory", shell_complete=complete_inventory)
@_LIMIT
@click.option(
    "--json", "as_json", is_flag=True,
    help="Per host on stdout: result (ok, failed), the release it rolled back to, why it "
    "failed (pyinfra's output goes to stderr).",
)  # fmt: skip
@_PYINFRA_ARGS
def rollback_cmd(
    inventory: str, limits: tuple[str, ...], as_json: bool, pyinfra_args: tuple[str, ...]
) -> None:
    """Roll hosts back to the state before their last good deploy (units, release, servers),
    through the health gate. Arguments after ``--`` go to pyinfra as they are; the exit status
    is pyinfra's."""
    import subprocess

    fleet = _fleet(inventory, limits, pyinfra_args)
    cmd = [_pyinfra(), "-y", *fleet.limit_args(), *pyinfra_args, inventory]
    if not as_json:
        sys.exit(subprocess.run([*cmd, deploy_path("rollback.py")]).returncode)
    code, results, output = _run_json([cmd[0], "--json", *cmd[1:], deploy_path("rollback.py")])
    _echo_json(rollback_results(fleet.hosts, code, results, output))
    sys.exit(code)


def _run_json(cmd: list[str]) -> tuple[int, dict[str, Any] | None, str]:
    """A pyinfra run with ``--json``: its exit status, its results (None: it printed none) and
    its stderr, which is passed on to ours as it comes."""
    import subprocess
    import tempfile

    lines = []
    with tempfile.TemporaryFile("w+") as out:
        with subprocess.Popen(cmd, stdout=out, stderr=subprocess.PIPE, text=True) as proc:
            assert proc.stderr is not None
            for line in proc.stderr:
                lines.append(line)
                click.echo(line, err=True, nl=False)
        out.seek(0)
        try:
            results = json.loads(out.read())["results"]
        except (ValueError, KeyError, TypeError):
            results = None
    return proc.returncode, results, "".join(lines)


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


@main.command("plan", context_settings=_FLEET)
@click.argument("inventory", shell_complete=complete_inventory)
@_LIMIT
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
    as_json: bool,
    diff: bool,
    pyinfra_args: tuple[str, ...],
) -> None:
    """What a deploy would change on each host (driver, release and packages, models, restarts,
    recompiles; with --diff each unit file's diff). Changes nothing. Every host is shown; one
    that could not be planned (unreachable, with pyinfra's reason) is named on stderr and the
    exit status is 1. On a terminal, stderr counts the hosts done. Arguments after ``--`` go to
    pyinfra (``--data``)."""
    from servefleet.fleet.fleetview import dumps, fleet_plan, plan_diffs, plan_table

    fleet = _fleet(inventory, limits, pyinfra_args)
    fleet.settings()
    found, missing = _report("plan", inventory, fleet.hosts,
                             (*fleet.limit_args(), *pyinfra_args), _shows_progress())  # fmt: skip
    plans = {**fleet_plan(found), **missing}
    if not diff:
        plans = {h: {k: v for k, v in p.items() if k != "diffs"} for h, p in plans.items()}
    if as_json:
        click.echo(dumps(plans))
    else:
        click.echo(plan_table(plans))
        if diff:
            click.echo("\n" + (plan_diffs(plans) or "no unit changes"))
    _say_missing(missing)
    sys.exit(Exit.FAILED if missing else Exit.OK)


@main.command("status", context_settings=_FLEET)
@click.argument("inventory", shell_complete=complete_inventory)
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
    or is unhealthy. On a terminal, stderr counts the hosts done."""
    from servefleet.fleet.fleetview import (
        dumps,
        missing_status,
        planned_instances,
        prometheus_targets,
        seen_ports,
        status_problems,
        status_table,
        write_atomic,
    )

    if prometheus and not prometheus.parent.is_dir():  # before any host is asked
        raise click.BadParameter(
            f"{prometheus}: its directory {prometheus.parent} does not exist",
            param_hint="'--prometheus'",
        )
    fleet = _fleet(inventory, limits, pyinfra_args)
    settings = fleet.settings()
    found, missing = _report("status", inventory, fleet.hosts,
                             (*fleet.limit_args(), *pyinfra_args), _shows_progress())  # fmt: skip
    seen = seen_ports(prometheus) if prometheus else {}
    statuses = dict(found)
    for host, why in missing.items():
        instances = planned_instances(settings[host], seen.get(host, ()))
        statuses[host] = missing_status(why, fleet.fleet.host(host).address, instances)
    click.echo(dumps(statuses) if as_json else status_table(statuses))
    if prometheus:
        try:
            write_atomic(prometheus, dumps(prometheus_targets(statuses)) + "\n")
        except OSError as e:
            raise ServefleetError(
                f"--prometheus {prometheus}: not written ({e.strerror})"
            ) from None
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
@click.argument("inventory", shell_complete=complete_inventory)
@click.argument("deploy", required=False, shell_complete=complete_inventory)
@click.option("--canary", type=click.IntRange(min=0), default=0, help="The first K hosts alone.")
@click.option("--batch-size", type=click.IntRange(min=1), default=None, help="Hosts a batch.")
@click.option(
    "--batch-percent", type=click.FloatRange(0, 100, min_open=True), default=None,
    help="Hosts a batch, as a percentage of the hosts.",
)  # fmt: skip
@click.option(
    "--max-failures", type=click.IntRange(min=0), default=0, show_default=True,
    help="Failed hosts the rollout tolerates, over all batches so far; one more stops it (the "
    "failed hosts back on what they served, the rest untouched) and it exits 1.",
)  # fmt: skip
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
    from servefleet.fleet.fleetview import dumps, table
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
        from servefleet.fleet.inventory import limit_pattern

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
    from servefleet.fleet.scaffold import init as scaffold

    for rel in scaffold(directory):
        click.echo(f"{directory.rstrip('/')}/{rel}")


@main.command("lock")
@click.argument("inventory", shell_complete=complete_inventory)
@click.option("--check", is_flag=True, help="Only compare the lock with the data (offline).")
@click.option("--lock-dir", default=None, help="The lock directory (default: the data's sdk_lock).")
@click.option(
    "--data", "data", multiple=True, metavar="KEY=VALUE", help="Data over all (as pyinfra)."
)
@click.option(
    "--selection", "selection", multiple=True, metavar="AXIS=VALUE",
    help="Lock this selection on every host (over the data's serve_selection).",
)  # fmt: skip
@click.option(
    "--json", "as_json", is_flag=True,
    help="On stdout: the lock directory, each stack's release and packages, the models, the "
    "files (with --check: whether it matches, and what differs).",
)  # fmt: skip
def lock_cmd(
    inventory: str, check: bool, lock_dir: str | None, data: tuple[str, ...],
    selection: tuple[str, ...], as_json: bool,
) -> None:  # fmt: skip
    """Resolve every stack the inventory's data selects (every package with its version, index
    and file sha256s; the driver runfile; the models' revisions) into the lock directory.
    With --check, exit 1 naming what no longer matches the data.

    Example:

        servefleet lock inventories/prod.py && git diff locks/
    """
    from servefleet.fleet.lockfleet import check_lock, fleet_lock, make_lock

    overrides = _overrides(data)
    if selection:
        chosen = _overrides(selection, "--selection", parse=False)
        overrides["serve_selection"] = {**(overrides.get("serve_selection") or {}), **chosen}
    fl = fleet_lock(inventory, overrides, lock_dir)
    if not check:
        make_lock(fl, (lambda m: click.echo(m, err=True)) if as_json else click.echo)
        if as_json:
            _echo_json(lock_summary(fl.lock_dir))
        return
    problems = check_lock(fl)
    for line in problems:
        click.echo(f"servefleet: lock: {line}", err=True)
    if as_json:
        _echo_json({"lock_dir": str(fl.lock_dir), "matches": not problems,
                    "stacks": len(fl.stacks), "differences": problems})  # fmt: skip
    if problems:
        sys.exit(Exit.FAILED)
    if not as_json:
        click.echo(f"{fl.lock_dir}: matches the data ({len(fl.stacks)} stack(s))")


def lock_summary(lock_dir: str | Path) -> dict[str, Any]:
    """What ``lock --json`` prints of a lock directory just written: each stack's release id,
    pylock file and packages (name -> version), the driver runfiles, the models and the files.

    + lock_dir: the lock directory
    """
    from servefleet.release.lock import load_lock, packages

    lock = load_lock(lock_dir)
    stacks = {
        name: {
            "release": st.release,
            "pylock": st.pylock_file,
            "packages": {p["name"]: p["version"] for p in packages(st.pylock)},
        }
        for name, st in sorted(lock.stacks.items())
    }
    return {"lock_dir": str(lock.path), "stacks": stacks, "driver": lock.driver,
            "models": lock.models, "files": lock.files}  # fmt: skip


def _overrides(data: tuple[str, ...], option: str = "--data", parse: bool = True) -> dict[str, Any]:
    """``KEY=VALUE`` options as a dict: ``--data`` values as pyinfra reads them (``parse``),
    ``--selection`` values as strings."""
    from servefleet.fleet.inventory import data_overrides

    return data_overrides(data, option, parse)


@main.command("wheelhouse")
@click.argument("directory", type=click.Path(file_okay=False))
@click.option(
    "--inventory",
    default=None,
    help="Take sdk_lock and the credentials' variable names from this inventory's data.",
    shell_complete=complete_inventory,
)
@click.option("--lock-dir", default=None, help="The lock directory (default: the data's sdk_lock).")
@click.option(
    "--data", "data", multiple=True, metavar="KEY=VALUE", help="Data over all (as pyinfra)."
)
@click.option(
    "--json", "as_json", is_flag=True,
    help="On stdout: the files downloaded, already there and failed, the bytes, the models "
    "left out.",
)  # fmt: skip
def wheelhouse_cmd(
    directory: str,
    inventory: str | None,
    lock_dir: str | None,
    data: tuple[str, ...],
    as_json: bool,
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
    from servefleet.release.lock import load_lock
    from servefleet.release.wheelhouse import Credentials, fill, lock_files
    from servefleet.settings.table import DEFAULTS

    if inventory:
        from servefleet.fleet.lockfleet import lock_settings

        where, s = lock_settings(inventory, _overrides(data), lock_dir)
        creds = Credentials(s.index_user, s.index_password, s.hf_token)
    elif lock_dir:
        where = Path(lock_dir)
        keys = ("creds_index_user_env", "creds_index_password_env", "creds_hf_token_env")
        creds = Credentials(*(os.environ.get(str(DEFAULTS[k])) or None for k in keys))
    else:
        raise click.UsageError("give --inventory (its data's sdk_lock) or --lock-dir")
    files, hub = lock_files(load_lock(where))
    say = (lambda m: click.echo(m, err=True)) if as_json else click.echo
    for model in hub:
        say(f"model {model}: from the hub in the lock (no store archive); not included")

    def bar(count: int) -> Any:
        return click.progressbar(
            length=count, label=f"downloading {count} file(s)", file=sys.stderr
        )

    done = fill(directory, files, creds, say, progress=bar if _shows_progress() else None)
    for line in done.failed:
        click.echo(f"servefleet: wheelhouse: {line}", err=True)
    if as_json:
        _echo_json({"directory": directory, "downloaded": done.downloaded,
                    "present": done.present, "failed": done.failed, "bytes": done.bytes,
                    "not_included": list(hub)})  # fmt: skip
    else:
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
