"""How the fleet commands run pyinfra: the deploy files they run, the hosts of a command (with
``--limit``), one run's output and exit status (watched for a progress line, or with
``--json``), and deploys/report.py's summaries of each host with the hosts it left out."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import click

from servefleet.base.errors import ServefleetError


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


def pyinfra_bin() -> str:
    return str(Path(sys.executable).parent / "pyinfra")


def fleet_args(
    inventory: str,
    limits: tuple[str, ...],
    pyinfra_args: tuple[str, ...],
    data: tuple[str, ...] = (),
    selection: tuple[str, ...] = (),
) -> Any:
    """The command's hosts, read with pyinfra's loader (:class:`servefleet.fleet.inventory.FleetArgs`),
    with the command's ``--data`` and ``--selection``; arguments after ``--`` that pyinfra would
    refuse are one line (exit 2) before any host is contacted; a pattern that matches no host is
    said on stderr, as pyinfra says it."""
    from servefleet.fleet.inventory import FleetArgs

    return FleetArgs.read(
        inventory, limits, pyinfra_args, warn=lambda m: click.echo(f"servefleet: {m}", err=True),
        data=data, selection=selection,
    )  # fmt: skip


def run_pyinfra(cmd: list[str], env: dict[str, str]) -> tuple[int, str]:
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


def run_watched(cmd: list[str], env: dict[str, str], progress: Progress) -> tuple[int, str]:
    """:func:`run_pyinfra` that hands each line of pyinfra's output to ``progress`` as it comes."""
    import subprocess

    with subprocess.Popen(
        cmd, env={**env, "PYTHONUNBUFFERED": "1"}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
    ) as proc:  # fmt: skip
        assert proc.stdout is not None
        for line in proc.stdout:
            progress.output.append(line)
    return proc.returncode, "".join(progress.output)


def report(
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
        cmd = [pyinfra_bin(), "-y", *pyinfra_args, inventory, deploy_path("report.py")]
        env = {**os.environ, **request.env()}
        if progress:
            with Progress(kind, hosts, tmp, lambda m: click.echo(m, err=True, nl=False)) as shown:
                code, output = run_watched(cmd, env, shown)
        else:
            code, output = run_pyinfra(cmd, env)
        found = request.read()
    refusal = None if found else pyinfra_refusal(output, code)
    if refusal:
        raise ServefleetError(f"pyinfra: {refusal}")
    return found, missing_hosts(hosts, found, output)


def say_missing(missing: dict[str, dict[str, str]]) -> None:
    """One line for each host a run left without a summary: unreachable or failed, and why."""
    for host, why in missing.items():
        for state, reason in why.items():
            click.echo(f"servefleet: {host}: {state}: {reason}", err=True)


def run_json(cmd: list[str]) -> tuple[int, dict[str, Any] | None, str]:
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
