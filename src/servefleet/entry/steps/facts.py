"""servefleet's pyinfra facts: each one host program of ``remote/``, sent inline (it must work
on a host that holds nothing of ours yet, and never depends on what an earlier deploy left).
A fact whose program prints one JSON value takes only the shape that program prints; anything
else is a ProbeError in one line, never read as an answer."""

from __future__ import annotations

import json
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


def _json_of(output: list[str], fact: str, allowed: str, shaped: Callable[[Any], bool]) -> Any:
    """The one JSON value a host program printed (on one line or several), or a ProbeError in
    one line naming the fact and what it takes: anything else (nothing, a traceback, a cut or
    misshapen value) is not read as an answer.

    + output: the program's stdout lines
    + fact: the fact's name in the message
    + allowed: the shape it takes, in the message
    + shaped: whether a decoded value has that shape
    """
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
    the device commands its kind declares (``Kind.probe_commands``: ``rbln-smi -j``, or ``lspci
    -n`` lines before a driver, on RBLN; ``nvidia-smi``/``amd-smi`` on GPUs), complete releases, the ``current``
    release, the last good state's release, our units (active, enabled, the unit sha each main
    process runs, the file's sha256), warm compile fingerprints, complete models, the serve user.
    """

    def command(self, args: str) -> str:
        return f"python3 -c {shlex.quote(PROBE)} {shlex.quote(args)}"

    def process(self, output: list[str]) -> dict[str, Any]:
        return _json_of(output, "host probe", "one JSON object", _is_object)


class InstanceHealth(FactBase):
    """
    Returns port -> "ok" or why not: the deploy's own health gate (``remote/health.py``), once
    for each instance: the listener on its port belongs to its unit, it answers ``/health`` and
    one bounded chat completion for the served model. Changes nothing.
    """

    def command(self, checks: str) -> str:
        return f"python3 -c {shlex.quote(STATUS)} status {shlex.quote(checks)}"

    def process(self, output: list[str]) -> dict[str, str]:
        return _json_of(output, "instance health", "one JSON object of port -> why", _of_words)


class WheelhouseFiles(FactBase):
    """
    Returns the paths of ``files`` (JSON: host path -> sha256) that the host holds with that
    sha256 (``sdk_source = "wheelhouse"``: what the copy may skip).
    """

    def command(self, files: str) -> str:
        return f"python3 -c {shlex.quote(HOST_CHECK)} {shlex.quote(files)}"

    def process(self, output: list[str]) -> list[str]:
        return _json_of(output, "wheelhouse files", "one JSON list of paths", _of_paths)


class PreflightRefusal(FactBase):
    """
    Returns the pre-flight's line for the first instance the release's vLLM refuses (``<unit>:
    <flag>: <vLLM's message>``, the version gap after it), or None when every one passes:
    ``remote/preflight.py`` run as the serve user with the release's python. Changes nothing.
    """

    def command(self, run: str) -> str:
        return f"{run} 2>/dev/null || true"

    def process(self, output: list[str]) -> str | None:
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
