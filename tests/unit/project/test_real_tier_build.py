"""#50: the README's main job does not wait for the real-wheel tier (about 2 minutes and 2 GB of
venvs only the tests use): ``setup.sh`` no longer builds it, and pytest builds it before the
first test of a run that reaches one of its users (tests/conftest.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[3]


def conftest() -> Any:
    spec = importlib.util.spec_from_file_location("top_conftest", REPO / "tests" / "conftest.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_setup_sh_does_not_build_the_tier() -> None:
    commands = [line for line in (REPO / "setup.sh").read_text().splitlines()
                if line.strip() and not line.lstrip().startswith("#")]  # fmt: skip
    assert not [line for line in commands if "realvllm" in line], commands


@pytest.mark.parametrize(
    ("args", "needs"),
    [([], True), (["tests"], True), (["tests/realvllm/test_trusted.py::test_x"], True),
     (["tests/unit/fleet/lab/simulator/test_sim_multinode.py"], True), (["tests/unit"], True),
     (["tests/hosts"], False), (["tests/unit/base", "tests/unit/entry"], False)],
)  # fmt: skip
def test_a_run_builds_the_tier_only_when_it_reaches_a_test_of_it(
    args: list[str], needs: bool
) -> None:
    assert conftest().needs_real_tier(args, REPO) is needs
