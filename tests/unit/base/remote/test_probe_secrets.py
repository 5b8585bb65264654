"""The probe never puts a plain digest of a secret into pyinfra's fact output (issue #18 finding
15): with ``-vvv`` or ``--debug-facts`` that output is logged, and a sha256 of a password lets
anyone holding the log test guesses offline. The probe gets a per-run key on stdin and reports a
secret's digest as an HMAC under it; the planner compares with the same HMAC."""

from __future__ import annotations

import hashlib
import hmac
import json
import posixpath
import subprocess
import sys
from pathlib import Path

from host_inputs import probe, settings

from servefleet.base.remote import REMOTE
from servefleet.base.remote.layout import HF_TOKEN_FILE
from servefleet.hostplan.plan import plan_host

# runs the probe's stat with the secrets directory moved to a scratch one (argv[1])
STAT = """
import json, sys
sys.path.insert(0, sys.argv[3])
import layout
layout.SECRETS_DIR = sys.argv[1]
import probe
a = json.loads(sys.argv[2])
key = bytes.fromhex(sys.stdin.readline().strip()) if a["keyed"] else None
print(json.dumps({p: probe.stat(p, key) for p in a["paths"]}))
"""


def _stat(secrets: Path, paths: list[Path], key: str | None) -> dict[str, dict[str, str]]:
    args = json.dumps({"keyed": key is not None, "paths": [str(p) for p in paths]})
    proc = subprocess.run(
        [sys.executable, "-c", STAT, str(secrets), args, str(REMOTE)],
        input=(key or "") + "\n", capture_output=True, text=True, check=True,
    )  # fmt: skip
    return json.loads(proc.stdout)


def test_a_secret_is_reported_as_an_hmac_under_the_runs_key(tmp_path: Path) -> None:
    secrets = tmp_path / "secrets"
    secrets.mkdir(mode=0o700)
    netrc, other = secrets / "netrc", tmp_path / "plain"
    line = b"machine idx login u password weak-pw\n"
    netrc.write_bytes(line)
    other.write_bytes(b"not secret\n")
    key = bytes(range(32))
    found = _stat(secrets, [netrc, other], key.hex())
    plain = hashlib.sha256(line).hexdigest()
    assert plain not in json.dumps(found)
    assert found[str(netrc)]["sha256"] == hmac.new(key, line, "sha256").hexdigest()
    assert found[str(other)]["sha256"] == hashlib.sha256(b"not secret\n").hexdigest()
    # without a key, no digest of a secret at all
    assert "sha256" not in _stat(secrets, [netrc], None)[str(netrc)]


def test_the_planner_compares_a_secret_by_the_same_hmac(tmp_path: Path) -> None:
    """A real host plan (plan_host, with the key the probe was given) digests a secret as the
    probe reports it, and any other file by its plain sha256."""
    key = b"k" * 32
    plan = plan_host(settings(), probe(), secret_key=key)
    secrets = tmp_path / "secrets"
    secrets.mkdir(mode=0o700)
    token = secrets / posixpath.basename(HF_TOKEN_FILE)
    token.write_bytes(b"t\n")
    reported = _stat(secrets, [token], key.hex())[str(token)]["sha256"]
    assert plan.digest(HF_TOKEN_FILE, b"t\n") == reported
    assert reported == hmac.new(key, b"t\n", "sha256").hexdigest()
    assert plan.digest("/opt/servefleet/lib/probe.py", b"x") == hashlib.sha256(b"x").hexdigest()
    other = plan_host(settings(), probe(), secret_key=b"o" * 32)  # another run's key
    assert other.digest(HF_TOKEN_FILE, b"t\n") != reported
