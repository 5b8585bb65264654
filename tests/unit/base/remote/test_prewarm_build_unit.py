"""#47: ``remote/prewarm.py build`` takes the compile-only variables from the state the
controller uploads (``compile_only``, the host's platform's), not from its own code: an RBLN
plan's build unit carries ``VLLM_RBLN_COMPILE_ONLY=1`` and ``RBLN_FORCE_NPU_NAME`` for the SKU,
in that order, before its ``ExecStart=``; a GPU plan's state names none."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from host_inputs import gpu_probe, gpu_settings, probe, settings
from repo_paths import REMOTE

from servefleet.hostplan.plan import plan_host

sys.path.insert(0, str(REMOTE))
import prewarm  # noqa: E402


def test_the_build_unit_takes_the_platforms_compile_only_variables_from_the_state() -> None:
    state = json.loads(json.dumps(plan_host(settings(), probe()).desired_state(), sort_keys=True))
    assert state["compile_only"] == [
        ["VLLM_RBLN_COMPILE_ONLY", "1"],
        ["RBLN_FORCE_NPU_NAME", "{sku}"],
    ]
    text = prewarm.build_unit(state, "RBLN-CR13", Path("/b"), Path("/hub")).splitlines()
    at = next(i for i, line in enumerate(text) if line.startswith("ExecStart="))
    assert text[at - 3 : at] == [
        'Environment="VLLM_RBLN_COMPILE_ONLY=1"',
        'Environment="RBLN_FORCE_NPU_NAME=RBLN-CR13"',
        "PrivateNetwork=yes",
    ]


def test_a_platform_that_does_not_compile_names_no_compile_only_variable() -> None:
    assert "compile_only" not in plan_host(gpu_settings(), gpu_probe()).desired_state()
