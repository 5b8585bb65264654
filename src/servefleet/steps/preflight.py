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

from servefleet.hostplan import HostPlan
from servefleet.remote.layout import PREFLIGHT
from servefleet.steps.facts import preflight_command
from servefleet.steps.operations import Stdin


def check(plan: HostPlan) -> None:
    if not plan.preflight_needed:
        return
    passed = f"{plan.state_dir}/{PREFLIGHT}"
    record = (
        shlex.join(["install", "-d", "-m", "755", passed])
        + " && "
        + shlex.join(["touch", f"{passed}/{plan.preflight_key}"])
    )
    # what it checks goes on stdin (one JSON line): nothing is uploaded or left behind
    server.shell(
        name=f"Pre-flight: vLLM of release {plan.release.id} checks every instance's command line",
        commands=[f"{preflight_command(plan, '-')} > /dev/null && {record}"],
        _stdin=Stdin(json.dumps(plan.preflight_input, sort_keys=True)),
    )
