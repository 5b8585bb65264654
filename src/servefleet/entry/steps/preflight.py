"""Pre-flight: before any unit is written or any server stopped, the release's own vLLM parses
and validates every instance's command line and environment (``remote/preflight.py``: what
``vllm serve`` does before it loads a model; no GPU, no model), as the serve user. A refusal
fails this host alone, in one line (the instance, the flag and vLLM's own message), and nothing
that serves changes. A pass is recorded by root under its key (the release and every command
line), so the same check never runs twice and a no-op run costs nothing."""

from __future__ import annotations

import json
import shlex

from pyinfra.operations import server

from servefleet.base.remote.layout import PREFLIGHT
from servefleet.entry.steps.facts import preflight_command
from servefleet.entry.steps.operations import Stdin
from servefleet.hostplan.types import HostPlan


def command(plan: HostPlan) -> tuple[str, str] | None:
    """The pre-flight's shell command on the host and what goes on its stdin (the instances,
    one JSON line), or None when the host needs none (its key passed). The pass marker is
    written only after the pre-flight passed, as the command's last step: a run that dies before
    it runs the pre-flight again, and one that dies after it does not.

    + plan: the host's plan
    """
    if not plan.preflight_needed:
        return None
    passed = f"{plan.state_dir}/{PREFLIGHT}"
    record = (
        shlex.join(["install", "-d", "-m", "755", passed])
        + " && "
        + shlex.join(["touch", f"{passed}/{plan.preflight_key}"])
    )
    stdin = json.dumps(plan.preflight_input, sort_keys=True)
    return f"{preflight_command(plan, '-')} > /dev/null && {record}", stdin


def check(plan: HostPlan) -> None:
    found = command(plan)
    if found is None:
        return
    run, stdin = found
    # what it checks goes on stdin (one JSON line): nothing is uploaded or left behind
    server.shell(
        name=f"Pre-flight: vLLM of release {plan.release.id} checks every instance's command line",
        commands=[run],
        _stdin=Stdin(stdin),
    )
