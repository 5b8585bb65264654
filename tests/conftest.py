"""Shared test set-up: repository paths, and the `hosts` marker for lab-fleet tests.

Tests under tests/hosts/ run against the lab fleet (real systemd + sshd hosts in network
namespaces). They need root and user/network namespaces; elsewhere they skip with the reason,
except in CI (``CI=true``), where a lab that cannot start is a failure, never a green skip.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import gevent.monkey
import pytest

# Importing pyinfra_cli patches the standard library for gevent (pyinfra_cli/__init__.py). In a
# pytest-xdist worker that stalls execnet's channel thread. The unit tests that import pyinfra_cli
# use only its parsers, and each pyinfra run a test makes is its own process, which patches.
gevent.monkey.patch_all = lambda *args, **kwargs: None  # type: ignore[assignment]

REPO = Path(__file__).resolve().parent.parent


# What needs the real-wheel tier (tests/realvllm/build.py): a run over any of these builds it once
# before the first test, on the controlling process (never in setup.sh: the main job needs none)
REAL_TIER_USERS = (
    REPO / "tests" / "realvllm",
    REPO / "tests" / "unit" / "fleet" / "lab" / "simulator" / "test_sim_multinode.py",
)


def needs_real_tier(args: list[str], here: Path) -> bool:
    """Whether a run over ``args`` (pytest's, relative to ``here``) reaches a test of the tier."""
    for arg in args or ["."]:
        path = (here / arg.split("::", 1)[0]).resolve()
        for user in REAL_TIER_USERS:
            if user.exists() and (user == path or path in user.parents or user in path.parents):
                return True
    return False


def pytest_sessionstart(session: pytest.Session) -> None:
    """Build the real-wheel tier before the first test when the run needs it and it is not built
    (xdist's workers find it built: only the controlling process builds)."""
    config = session.config
    if hasattr(config, "workerinput") or not needs_real_tier(
        config.args, config.invocation_params.dir
    ):
        return
    build = REPO / "tests" / "realvllm" / "build.py"
    if subprocess.run([sys.executable, str(build), "--print"], capture_output=True).returncode == 0:
        return
    print("\nrealvllm: building the real-wheel tier (once, about 2 minutes)", file=sys.stderr)
    proc = subprocess.run([sys.executable, str(build)], capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        pytest.exit("realvllm: the real-wheel tier could not be built: " + " | ".join(tail), 1)


def lab_unavailable_reason() -> str | None:
    """Why the lab fleet cannot run here, or None when it can."""
    if os.geteuid() != 0:
        return "the lab fleet needs root (network namespaces, overlay mounts)"
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return "the lab fleet needs unshare (util-linux) and ip (iproute2)"
    probe = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount", "--net", "true"], capture_output=True
    )
    if probe.returncode != 0:
        return "namespaces are unavailable here: " + probe.stderr.decode(errors="replace").strip()
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = None
    checked = False
    for item in items:
        if "tests/hosts/" in item.nodeid or item.get_closest_marker("hosts"):
            item.add_marker(pytest.mark.hosts)
            if not checked:
                reason, checked = lab_unavailable_reason(), True
            if reason and os.environ.get("CI", "").lower() in ("true", "1"):
                item.stash[LAB_MISSING_IN_CI] = reason
            elif reason:
                item.add_marker(pytest.mark.skip(reason=reason))


LAB_MISSING_IN_CI = pytest.StashKey[str]()


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """One lab, so one worker for every host test, in collection order (one scope); each unit
    test is a scope of its own, spread over the other worker (and this one, once it is free)."""
    from xdist.scheduler import LoadScopeScheduling

    class OneLab(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "lab" if nodeid.startswith("tests/hosts/") else nodeid

    return OneLab(config, log)


def pytest_runtest_setup(item: pytest.Item) -> None:
    reason = item.stash.get(LAB_MISSING_IN_CI, None)
    if reason:
        pytest.fail(f"CI=true: the lab fleet must run here, but {reason}", pytrace=False)


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO
