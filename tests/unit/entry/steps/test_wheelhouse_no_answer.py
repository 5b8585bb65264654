"""Which wheelhouse files a host lacks (steps/wheelhouse.py, #37), read by ``WheelhouseFiles``
on pyinfra's ``@fake`` hosts, whose answers are scripted. When ``remote/have_files.py`` fails
(pyinfra returns no fact) or prints nothing, the host's plan fails in one line (a ProbeError:
this host alone), not ``unexpected TypeError ... (a bug in servefleet ...)`` from ``set(None)``.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from host_inputs import converged_probe, settings
from pyinfra.api import Config, Inventory, State
from pyinfra.api.connect import connect_all
from pyinfra.context import ctx_host, ctx_state

from servefleet.base.errors import ProbeError
from servefleet.entry.steps import wheelhouse
from servefleet.hostplan.plan import plan_host
from servefleet.release.wheelhouse import Copy

HAVE_FILES = re.compile("which of these files does the host hold")  # have_files.py, inline
COPIES = [
    Copy("release", "a-1.0-py3-none-any.whl", "/wh/a.whl", "/opt/wh/a.whl", "a" * 64, 10),
    Copy("driver", "3.5.1", "/wh/d.run", "/opt/wh/d.run", "d" * 64, 20),
]
NO_ANSWER = "wheelhouse files: no answer (remote/have_files.py failed or printed nothing)"


def with_wheelhouse(answer: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """``with_wheelhouse`` of a converged host's plan that needs ``COPIES``, on a fake host whose
    have_files.py answers ``answer`` (another host in the run: pyinfra stops a run whose every
    host failed with "No hosts remaining!")."""
    monkeypatch.setattr(wheelhouse, "wheelhouse_copies", lambda plan: COPIES)
    data = {"fake_responses": {HAVE_FILES: answer}, "fake_delay": 0, "fake_delay_jitter": 0}
    state = State(Inventory(([("@fake/h", data), ("@fake/other", {})], {})), Config())
    connect_all(state)
    plan = plan_host(settings(), converged_probe())
    with ctx_state.use(state), ctx_host.use(state.inventory.get_host("@fake/h")):
        return wheelhouse.with_wheelhouse(plan)


def test_the_files_held_are_not_copied_again(monkeypatch: pytest.MonkeyPatch) -> None:
    plan = with_wheelhouse(json.dumps(["/opt/wh/a.whl"]), monkeypatch)
    assert plan.wheelhouse == tuple(COPIES)
    assert plan.wheelhouse_missing == {"/opt/wh/d.run"}


@pytest.mark.parametrize(
    "answer",
    [{"success": False, "stderr": "python3: not found"}, {"stdout": []}],
    ids=["failed", "silent"],
)
def test_no_answer_fails_the_host_in_one_line(answer: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ProbeError) as err:
        with_wheelhouse(answer, monkeypatch)
    assert str(err.value) == NO_ANSWER
