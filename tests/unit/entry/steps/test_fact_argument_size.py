"""The largest single argument a deploy sends (#47): each fact's program goes inline, so the
command string the host's shell gets (``sshd`` runs it as one ``sh -c`` argument, sudo's quoting
around it when the inventory uses ``_sudo``) must stay under Linux's limit for one argument
(``MAX_ARG_STRLEN``, 128 KiB): past it the fact fails on every host with E2BIG. Measured with a
plan's own probe arguments (a router, serve_files, a serving fleet's watched paths), held at
three quarters of the limit so that growth is seen before it breaks a fleet; the sizes are
printed (docs/benchmarks.md)."""

from __future__ import annotations

import json

import pytest
from host_inputs import settings
from pyinfra.api.command import StringCommand
from pyinfra.connectors.util import make_unix_command

from servefleet.entry.steps.facts import HostProbe, InstanceHealth, WheelhouseFiles
from servefleet.hostplan.extras import resolve_for
from servefleet.hostplan.probe_input import probe_args

MAX_ARG_STRLEN = 32 * 4096  # linux/binfmts.h: PAGE_SIZE * 32
HELD_AT = 0.75  # the share of it a fact may take


def sent(command: str, sudo: bool) -> int:
    """The bytes of the one argument the host's shell is given for ``command``."""
    return len(str(make_unix_command(StringCommand(command), _sudo=sudo).get_raw_value()).encode())


def commands() -> dict[str, str]:
    s = settings(serve_router="host")
    args = probe_args(s, resolve_for(s), files=True, keyed=True)
    checks = json.dumps(
        [{"unit": f"servefleet-vllm-{i}.service", "port": 8000 + i} for i in range(8)]
    )
    files = json.dumps([f"/opt/servefleet/wheelhouse/pkg-{i}.whl" for i in range(200)])
    return {
        "probe": HostProbe().command(args),
        "status": InstanceHealth().command(checks),
        "wheelhouse": WheelhouseFiles().command(files),
    }


@pytest.mark.parametrize("sudo", [False, True], ids=["root", "sudo"])
def test_every_fact_fits_in_one_argument_with_room_to_grow(sudo: bool) -> None:
    sizes = {name: sent(command, sudo) for name, command in commands().items()}
    print({name: f"{size} B ({size / MAX_ARG_STRLEN:.0%})" for name, size in sizes.items()})
    over = {n: s for n, s in sizes.items() if s > HELD_AT * MAX_ARG_STRLEN}
    assert not over, f"past {HELD_AT:.0%} of MAX_ARG_STRLEN ({MAX_ARG_STRLEN} B): {over}"
