"""The deploys' data check (``host_settings``, run by ``pyinfra INVENTORY deploys/serve.py``)
refuses what the fleet commands' inventory check refuses of a host, in one line: a name no
host has, an ``ssh_hostname`` no host has, an ``ssh_port`` outside 1-65535 (issue #50).

pyinfra connects before it runs the deploy file, so here the line comes after the connection
attempt; the fleet commands say it before any host is contacted (fleet/test_inventory_input.py).
"""

from __future__ import annotations

from typing import Any

import pytest
from host_inputs import CREDS
from pyinfra.api import Inventory, State
from pyinfra.api.exceptions import PyinfraError
from pyinfra.context import ctx_host, ctx_inventory, ctx_state

from servefleet.entry.steps.plan import host_settings


def settings_of(name: str, data: dict[str, Any]) -> Any:
    inventory = Inventory(([(name, data)], {}))
    state = State(inventory=inventory, check_for_changes=False)
    host = inventory.get_host(name)
    with ctx_state.use(state), ctx_inventory.use(inventory), ctx_host.use(host):
        return host_settings()


@pytest.mark.parametrize(
    "name, data, line",
    [
        ("npu-a1", {"ssh_port": 70000}, "npu-a1: ssh_port 70000: not a port; allowed: 1-65535"),
        ("npu a1", {}, "npu a1: host 'npu a1': not a host name or address; allowed characters"),
        ("npu-a1", {"ssh_hostname": "a b"}, "npu-a1: ssh_hostname 'a b': not a host name"),
    ],
)
def test_the_deploy_refuses_a_bad_host_name_or_port_in_one_line(
    name: str, data: dict[str, Any], line: str
) -> None:
    with pytest.raises(PyinfraError) as e:
        settings_of(name, data)
    assert str(e.value).startswith(f"servefleet: {line}") and "\n" not in str(e.value)


def test_a_good_host_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in CREDS.items():
        monkeypatch.setenv(key, value)
    assert settings_of("npu-a1", {"ssh_port": 2222}).serve_base_port == 8000
