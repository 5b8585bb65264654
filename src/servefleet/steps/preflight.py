"""Pre-flight: before any unit is written or any server stopped, the release's own vLLM parses
and validates every instance's command line and environment (``remote/preflight.py``: what
``vllm serve`` does before it loads a model; no GPU, no model), as the serve user. A refusal
fails this host alone, in one line (the instance, the flag and vLLM's own message), and nothing
that serves changes. A pass is recorded by root under its key (the release and every command
line), so the same check never runs twice and a no-op run costs nothing."""

from __future__ import annotations

import json
import shlex
from io import StringIO

from pyinfra.operations import files, server

from servefleet.hostplan import HostPlan
from servefleet.remote.layout import PREFLIGHT, PREFLIGHT_INPUT


def check(plan: HostPlan) -> None:
    if not plan.preflight_needed:
        return
    s = plan.settings
    dest = f"{plan.state_dir}/{PREFLIGHT_INPUT}"
    files.put(
        name="Upload what the pre-flight checks",
        src=StringIO(json.dumps(plan.preflight_input, indent=1, sort_keys=True) + "\n"),
        dest=dest,
        mode="644",
    )
    python = f"{plan.release.path}/bin/python"
    run = shlex.join(["runuser", "-u", s.serve_user, "--", python, f"{plan.lib}/preflight.py", "-"])
    passed = f"{plan.state_dir}/{PREFLIGHT}"
    record = (
        shlex.join(["install", "-d", "-m", "755", passed])
        + " && "
        + shlex.join(["touch", f"{passed}/{plan.preflight_key}"])
    )
    server.shell(
        name=f"Pre-flight: vLLM of release {plan.release.id} checks every instance's command line",
        commands=[f"cd / && {run} < {shlex.quote(dest)} > /dev/null && {record}"],
    )
