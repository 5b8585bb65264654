"""Helpers for the pre-flight tests (test_preflight.py, test_sim_configs.py, test_lab_sim.py):
the recipe fixtures in tests/unit/recipes/preflight rendered for an H200, and a run of the host
program remote/preflight.py under a given python."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from servefleet.base.remote import REMOTE
from servefleet.kinds.vllm import load_vllm_recipe, resolve_vllm

PREFLIGHT = REMOTE / "preflight.py"
FIXTURES = Path(__file__).resolve().parent / "recipes" / "preflight"


def fixture_command(recipe: str, feature: str) -> list[str]:
    """The command line (``vllm serve MODEL ...``) that a fixture recipe renders on an H200 with
    one feature on.

    + recipe: ``too-new`` or ``fits-the-pin``
    + feature: one of its features
    """
    spec = resolve_vllm(
        load_vllm_recipe(FIXTURES / f"{recipe}.yaml"),
        hardware="h200",
        strategy="single_node_tp",
        variant="default",
        features=[feature],
    )
    argv: list[str] = spec.servers[0].argv
    assert argv[:2] == ["vllm", "serve"]
    return argv


def run_preflight(
    data: Any, python: str = sys.executable, stdin: bool = False
) -> tuple[int, list[dict[str, Any]], str]:
    """Run remote/preflight.py under ``python``: (exit status, result lines, stderr).

    + data: the instances (JSON text as given, anything else dumped)
    + stdin: pass them on stdin (argument ``-``) rather than as the argument
    """
    text = data if isinstance(data, str) else json.dumps(data)
    proc = subprocess.run(
        [python, str(PREFLIGHT), "-" if stdin else text],
        input=text if stdin else None,
        capture_output=True,
        text=True,
        timeout=300,
    )
    results = [json.loads(line) for line in proc.stdout.splitlines()]
    return proc.returncode, results, proc.stderr
