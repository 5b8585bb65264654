"""The host plan's own rules (``hostplan/types.py``): the serve user's account as a deploy
makes it, when the pre-flight runs, and which wheelhouse copy a step takes. Issue #52:
survivors of ``bench/ast_mutation.py`` on ``types.py``, each killed here: ``account_ok``
without ``self.group_exists and`` (``bool``, ``drop``: no group created) or with
``self.account`` for ``self.account or {}`` (a host without the user: a traceback);
``preflight_needed`` without ``bool(self.instances)`` (a host with no server ran a pre-flight);
``from_wheelhouse`` matching ``(kind,)`` or ``(name,)`` alone (``elt``), or over
``sorted(self.wheelhouse)`` (``sorted``: copies do not order); ``desired_state`` without each
instance's fingerprint; ``preflight_key``'s, ``state_dir``'s, ``lib``'s and ``digest``'s
return and ``group_json``'s first statement dropped (``drop``)."""

from __future__ import annotations

import dataclasses
import hashlib
import hmac

import pytest
from host_inputs import converged_probe, probe, settings

from servefleet.hostplan.plan import plan_host
from servefleet.hostplan.types import NOLOGIN, GroupPlace, HostPlan
from servefleet.release.wheelhouse import Copy


def _plan() -> HostPlan:
    return plan_host(settings(), probe())


def _made(p: HostPlan) -> dict[str, object]:
    s = p.settings
    return {"uid": 998, "shell": NOLOGIN, "home": s.serve_home, "group": s.serve_user}


def test_the_account_is_ok_only_as_a_deploy_makes_it() -> None:
    p = _plan()
    assert dataclasses.replace(p, account=_made(p), group_exists=True).account_ok
    assert not dataclasses.replace(p, account=_made(p), group_exists=False).account_ok
    assert not dataclasses.replace(p, account=None, group_exists=True).account_ok
    assert not dataclasses.replace(p, account=None, group_exists=False).account_ok


@pytest.mark.parametrize(("key", "value"), [("shell", "/bin/bash"), ("home", "/home/x"),
                                            ("group", "users")])  # fmt: skip
def test_an_account_made_otherwise_is_not_ok(key: str, value: str) -> None:
    p = _plan()
    assert not dataclasses.replace(
        p, account={**_made(p), key: value}, group_exists=True
    ).account_ok


def test_the_preflight_runs_only_for_servers_that_restart_on_a_new_command_line() -> None:
    fresh = _plan()
    assert fresh.instances and not fresh.converged
    assert fresh.preflight_needed
    assert not dataclasses.replace(
        fresh, preflights=frozenset({fresh.preflight_key})
    ).preflight_needed
    assert not dataclasses.replace(fresh, instances=()).preflight_needed  # nothing to check
    done = plan_host(settings(), converged_probe())
    assert done.converged and not done.preflight_needed


def test_a_wheelhouse_copy_is_found_by_its_step_and_its_name() -> None:
    def copy(kind: str, name: str) -> Copy:
        return Copy(kind, name, f"/w/{kind}-{name}", f"/opt/w/{kind}-{name}", "0" * 64, 1)

    held = (copy("driver", "3.5.1"), copy("models", "3.5.1"), copy("models", "org/m"))
    p = dataclasses.replace(_plan(), wheelhouse=held)
    assert p.from_wheelhouse("models", "3.5.1") is held[1]
    assert p.from_wheelhouse("driver", "3.5.1") is held[0]
    assert p.from_wheelhouse("models", "org/m") is held[2]
    assert p.from_wheelhouse("driver", "org/m") is None
    assert p.from_wheelhouse("release", "3.5.1") is None


def test_the_desired_state_gives_each_instance_the_compile_fingerprint() -> None:
    """``self.spec.compile_fingerprint or "-"`` made ``"-"`` (``bool``) survived: the converge
    would mark and look up the warm cache under ``-`` for every selection."""
    p = _plan()
    fp = p.spec.compile_fingerprint
    assert fp and len(fp) == 64
    assert [i["fingerprint"] for i in p.desired_state()["instances"]] == [fp] * len(p.instances)
    assert p.desired_state()["root"] == p.settings.serve_root
    assert p.state_dir == f"{p.settings.serve_root}/state"


def test_the_preflight_key_follows_the_release_and_each_command_line() -> None:
    p = _plan()
    key = p.preflight_key
    assert isinstance(key, str) and len(key) == 16
    moved = dataclasses.replace(p, instances=p.instances[:1])
    assert moved.preflight_key != key


def test_a_files_digest_is_its_sha256_and_a_secrets_its_hmac() -> None:
    """``digest``'s ``return hashlib.sha256(data).hexdigest()`` dropped (``drop``) survived:
    every file but a secret would differ from the probe's, and be written on every run."""
    p = dataclasses.replace(_plan(), secret_key=b"k" * 32)
    assert p.digest("/opt/servefleet/lib/x.py", b"abc") == hashlib.sha256(b"abc").hexdigest()
    secret = p.digest("/etc/servefleet/secrets/netrc", b"abc")
    assert secret == hmac.new(b"k" * 32, b"abc", "sha256").hexdigest()
    assert p.lib == f"{p.settings.serve_root}/lib"


def test_the_group_json_is_the_ranks_place() -> None:
    """``group_json``'s ``g = self.group`` dropped (``drop``) survived: the converge of every
    serving group's rank would fail on it."""
    place = GroupPlace(name="g1", rank=1, nodes=2, head="10.0.0.1", sha="0" * 16,
                       hosts=("h1", "h2"), addresses=("10.0.0.1", "10.0.0.2"))  # fmt: skip
    p = dataclasses.replace(_plan(), group=place)
    assert p.group_json() == {"name": "g1", "rank": 1, "sha": "0" * 16, "hosts": ["h1", "h2"]}
    assert p.desired_state()["group"] == p.group_json()
