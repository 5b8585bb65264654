"""servefleet's pyinfra facts: each one host program of ``remote/``, sent inline (it must work
on a host that holds nothing of ours yet, and never depends on what an earlier deploy left).
A fact whose program prints one JSON value takes only the shape that program prints; anything
else is a ProbeError in one line, never read as an answer.

Every fact's program runs under ``timeout`` on the host (#46 item 5: a probe that waited on a fifo
the serve user planted hung plan, status, deploy and rollout): past its deadline its process group
is ended and the fact is a ProbeError in one line naming the deadline, which fails that host
alone, named (``servefleet: <host>: ...``, or its row of ``plan`` and ``status``)."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable
from typing import Any

from pyinfra.api import FactBase

from servefleet.base.errors import ProbeError
from servefleet.base.remote import inline
from servefleet.hostplan.types import HostPlan

PROBE = inline("probe.py")  # what plan_host needs to know of a host, in one round trip
HOST_CHECK = inline("have_files.py")  # which files the host holds with their sha256
STATUS = inline("health.py")  # the deploy's health gate, once per instance (`status`)

DEADLINE = 600  # seconds a fact's program may run on the host: a look (probe, health, pre-flight)
READ_DEADLINE = 4 * 3600  # one that reads files whole (serve_verify, the wheelhouse's sha256s)
KILL_AFTER = 10  # seconds after the deadline's TERM that `timeout` sends KILL
PAST = re.compile(r"servefleet-deadline (\d+)")  # the line a fact prints when `timeout` ended it


def within(command: str, seconds: int) -> str:
    """``command`` (a program and its quoted arguments) run on the host under ``timeout``: past
    ``seconds`` its process group gets TERM (KILL :data:`KILL_AFTER` s later) and the command
    prints ``servefleet-deadline <seconds>`` (:data:`PAST`) and exits 0, for ``process()`` to
    turn into one line (:func:`past`); otherwise the program's own output and exit status."""
    return (f"timeout -k {KILL_AFTER} {seconds} {command}; rc=$?; "
            f"if [ $rc -eq 124 ]; then echo servefleet-deadline {seconds}; exit 0; fi; exit $rc")  # fmt: skip


def past(output: list[str], fact: str) -> str | None:
    """The one line for output that says the fact's deadline passed (:func:`within`), else None."""
    found = PAST.fullmatch(output[-1].strip()) if output else None
    if found is None:
        return None
    return f"{fact}: no answer within {found[1]} s (its deadline; `timeout` ended it on the host)"


def _json_of(output: list[str], fact: str, allowed: str, shaped: Callable[[Any], bool]) -> Any:
    """The one JSON value a host program printed (on one line or several), or a ProbeError in
    one line naming the fact and what it takes: anything else (nothing, a traceback, a cut or
    misshapen value) is not read as an answer.

    + output: the program's stdout lines
    + fact: the fact's name in the message
    + allowed: the shape it takes, in the message
    + shaped: whether a decoded value has that shape
    """
    deadline = past(output, fact)
    if deadline:
        raise ProbeError(deadline)
    text = "\n".join(output)
    try:
        found = json.loads(text)
    except (ValueError, RecursionError):
        found = None
    if not shaped(found):  # what cannot be decoded is None: no shape
        raise ProbeError(f"{fact}: unexpected output {text[:80]!r}; allowed: {allowed}")
    return found


def _is_object(found: Any) -> bool:
    return isinstance(found, dict)


def _of_words(found: Any) -> bool:
    """A JSON object of strings to strings (port -> "ok" or why not)."""
    return isinstance(found, dict) and all(isinstance(v, str) for v in found.values())


def _of_paths(found: Any) -> bool:
    """A JSON list of strings (the paths held)."""
    return isinstance(found, list) and all(isinstance(p, str) for p in found)


class HostProbe(FactBase):
    """
    Returns what servefleet needs to know of a host, read in one round trip: kernel release,
    the device commands its recipe family's platforms declare (``Platform.probe_commands``:
    ``rbln-smi -j``, or ``lspci -n`` lines before a driver, on RBLN; ``nvidia-smi``, then
    ``amd-smi`` when it lists none, on GPUs), complete releases, the ``current``
    release, the last good state's release, our units (active, enabled, the unit sha each main
    process runs, the file's sha256), warm compile fingerprints, complete models, the serve user.
    """

    def command(self, args: str) -> str:
        verify = json.loads(args).get("verify")  # it reads every file of releases, models, caches
        program = f"python3 -c {shlex.quote(PROBE)} {shlex.quote(args)}"
        return within(program, READ_DEADLINE if verify else DEADLINE)

    def process(self, output: list[str]) -> dict[str, Any]:
        return _json_of(output, "host probe", "one JSON object", _is_object)


class InstanceHealth(FactBase):
    """
    Returns port -> "ok" or why not: the deploy's own health gate (``remote/health.py``), once
    for each instance: the listener on its port belongs to its unit, it answers ``/health`` and
    one bounded chat completion for the served model. Changes nothing.
    """

    def command(self, checks: str) -> str:
        return within(f"python3 -c {shlex.quote(STATUS)} status {shlex.quote(checks)}", DEADLINE)

    def process(self, output: list[str]) -> dict[str, str]:
        return _json_of(output, "instance health", "one JSON object of port -> why", _of_words)


class WheelhouseFiles(FactBase):
    """
    Returns the paths of ``files`` (JSON: host path -> sha256) that the host holds with that
    sha256 (``sdk_source = "wheelhouse"``: what the copy may skip).
    """

    def command(self, files: str) -> str:
        return within(f"python3 -c {shlex.quote(HOST_CHECK)} {shlex.quote(files)}", READ_DEADLINE)

    def process(self, output: list[str]) -> list[str]:
        return _json_of(output, "wheelhouse files", "one JSON list of paths", _of_paths)


class PreflightRefusal(FactBase):
    """
    Returns the pre-flight's line for the first instance the release's vLLM refuses (``<unit>:
    <flag>: <vLLM's message>``, the version gap after it), or None when every one passes:
    ``remote/preflight.py`` run as the serve user with the release's python. Changes nothing.
    """

    def command(self, run: str) -> str:
        return f"({within(f'sh -c {shlex.quote(run)} 2>/dev/null', DEADLINE)}) || true"

    def process(self, output: list[str]) -> str | None:
        deadline = past(output, "pre-flight")
        if deadline:
            return deadline
        for line in output:
            try:
                result = json.loads(line)
            except ValueError:
                continue
            if isinstance(result, dict) and result.get("ok") is False:
                gap = f"; {result['gap']}" if result.get("gap") else ""
                return f"pre-flight: {result.get('line')}{gap}"
        return None


def preflight_command(plan: HostPlan, instances: str) -> str:
    """The shell command that runs ``remote/preflight.py`` as the serve user with the release's
    python (``instances``: the JSON, or ``-`` for stdin), from ``/``."""
    run = shlex.join(["runuser", "-u", plan.settings.serve_user, "--",
                      f"{plan.release.path}/bin/python", f"{plan.lib}/preflight.py", instances])  # fmt: skip
    return f"cd / && {run}"
