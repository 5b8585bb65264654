"""The servers' API key (``hostplan/types.py`` ``HostPlan.converged``, ``key_file_current``):
a host whose key file differs from the data's key is not converged, so the deploy rewrites the
file (``entry/steps/credentials.api_key``) and converges (``entry/steps/units.converge`` returns
early only on a converged host). Issue #52 bug 5: with ``and self.key_file_current`` dropped
from ``converged``, such a host counted as converged, the converge step returned early and the
servers kept the old key; ``test_a_host_whose_key_file_differs_is_not_converged`` and
``test_the_deploy_rewrites_the_key_file_and_converges`` failed on that bug (before, only
``key_file_current`` itself and each instance's ``converged`` were asserted)."""

from __future__ import annotations

import hmac
from typing import Any

import pytest
from host_inputs import CREDS, SMI, probe, probed_units

from servefleet.base.remote.layout import API_KEY_FILE
from servefleet.entry.steps import credentials, ensure, units
from servefleet.hostplan.instance_unit import api_key_file
from servefleet.hostplan.plan import plan_host
from servefleet.hostplan.types import HostPlan
from servefleet.settings.table import Settings, load_defaults, settings_from

KEY = "sk-" + "0123456789abcdef" * 3
SECRET = b"k" * 32


def _settings(key: str | None = KEY) -> Settings:
    environ = {**CREDS, **({"SERVEFLEET_API_KEY": key} if key else {})}
    return settings_from(load_defaults().get, environ)


def _key_file(key: str) -> dict[str, str]:
    digest = hmac.new(SECRET, api_key_file(key).encode(), "sha256").hexdigest()
    return {"type": "file", "mode": "600", "user": "root", "group": "root", "sha256": digest}


def _plan(paths: dict[str, Any], key: str | None = KEY) -> HostPlan:
    """A host the data converged with ``KEY`` (driver, release, warm, models, every unit running
    its sha with the key file's key, the good state recorded), its key file as ``paths`` says."""
    s = _settings(key)
    first = plan_host(s, probe(smi=SMI))
    found = {u: dict(e, key_current=True) for u, e in probed_units(first, {}).items()}
    state = probe(smi=SMI, releases=[first.release.id], current=first.release.id,
                  current_pins=dict(first.release.expect),
                  warm=[first.spec.compile_fingerprint],
                  models=list(first.spec.requirements.models), units=found,
                  good=first.release.id, good_shas=[i.sha for i in first.restart_order],
                  paths=paths)  # fmt: skip
    return plan_host(s, state, secret_key=SECRET)


def test_a_host_with_the_datas_key_file_is_converged() -> None:
    done = _plan({API_KEY_FILE: _key_file(KEY)})
    assert done.key_file_current and done.converged


@pytest.mark.parametrize(
    "paths",
    [
        {API_KEY_FILE: _key_file(KEY[:-1] + "X")},  # another key
        {},  # no key file yet
        {API_KEY_FILE: dict(_key_file(KEY), mode="644")},  # the key, readable by all
        {API_KEY_FILE: dict(_key_file(KEY), user="serve")},  # the key, another owner's
    ],
    ids=["another-key", "none", "mode", "owner"],
)
def test_a_host_whose_key_file_differs_is_not_converged(paths: dict[str, Any]) -> None:
    stale = _plan(paths)
    assert all(i.converged and i.written for i in stale.instances)  # the units are as planned
    assert not stale.key_file_current
    assert not stale.converged


def test_no_key_wanted_is_converged_without_a_file() -> None:
    assert _plan({}, key=None).converged


def test_the_deploy_rewrites_the_key_file_and_converges(monkeypatch: pytest.MonkeyPatch) -> None:
    ops: list[str] = []
    monkeypatch.setattr(ensure, "put_secret", lambda **kw: ops.append(f"secret {kw['dest']}"))
    monkeypatch.setattr(units.files, "put", lambda **kw: ops.append(f"put {kw['dest']}"))
    monkeypatch.setattr(units.server, "shell", lambda **kw: ops.append("converge"))
    for plan in (_plan({API_KEY_FILE: _key_file("sk-" + "f" * 48)}), _plan({})):
        ops.clear()
        credentials.api_key(plan)
        units.converge(plan)
        assert ops == [f"secret {API_KEY_FILE}", f"put {plan.state_dir}/desired.json",
                       "converge"], ops  # fmt: skip
    done = _plan({API_KEY_FILE: _key_file(KEY)})
    ops.clear()
    credentials.api_key(done)
    units.converge(done)
    assert ops == []  # a re-run changes nothing
