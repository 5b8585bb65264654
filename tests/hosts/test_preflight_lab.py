"""The pre-flight on the lab (issue #22): a selection whose command line the pinned vLLM would
refuse (a config key vLLM 0.30.0's config class forbids) stops the host before any unit is
written or any server stopped, in one line naming the instance, the flag and vLLM's message,
with the RBLN platform's parser; `servefleet plan` says the same; the host keeps serving."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from faults import BARRIERS, REPO, run, secrets, totals
from labhelpers import on_host

BAD_KEY = ["--attention-config", json.dumps({"use_fp4_indexer_cache": True})]
BAD = ["--data", f"serve_extra_args={json.dumps(BAD_KEY)}"]
LIMIT = ["--limit", "lab1"]


def serving(lab: dict[str, Any]) -> str:
    """Every unit file's bytes and each server's main process (a restart changes it)."""
    return on_host(lab, "lab1", "cat /etc/systemd/system/servefleet-vllm-*.service; "
                   "for u in $(systemctl list-units --plain --no-legend 'servefleet-vllm-*' | "
                   "cut -d' ' -f1); do systemctl show -p MainPID $u; done").stdout  # fmt: skip


def test_a_config_key_the_pinned_vllm_forbids_stops_the_host_before_any_change(
    lab: dict[str, Any],
) -> None:
    on_host(lab, "lab1", f"rm -rf /etc/rbln-sim/fail-start /etc/rbln-sim/fail-health {BARRIERS}")
    settled = run(lab, *LIMIT)
    assert settled.returncode == 0, settled.stdout[-3000:] + settled.stderr[-3000:]
    before = serving(lab)
    proc = run(lab, *LIMIT, *BAD)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Traceback" not in out, out[-3000:]
    lines = {x.strip() for x in out.splitlines() if "servefleet: pre-flight:" in x}
    assert len(lines) == 1, out[-3000:]
    line = lines.pop()
    assert "servefleet-vllm-0.service: --attention-config:" in line
    assert "AttentionConfig" in line and "use_fp4_indexer_cache" in line
    assert "Unexpected keyword argument" in line and "newer vLLM than the pin" in line
    assert "Converge the instances" not in out  # nothing that serves was touched
    assert serving(lab) == before
    # plan says the same, now that the release is on the host; a default run changes nothing
    plan = subprocess.run(
        [str(Path(sys.executable).parent / "servefleet"), "plan", "inventories/lab.py", *LIMIT,
         "--json", "--", *BAD], cwd=REPO, env={**os.environ, **secrets(lab)},
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert "use_fp4_indexer_cache" in plan.stdout + plan.stderr, plan.stdout + plan.stderr
    again = run(lab, *LIMIT, "--json")
    assert again.returncode == 0 and totals(again)["success"] == 0
    assert serving(lab) == before
