"""An operator's inventory mistakes, each refused in one line by :func:`read_inventory` before
any host is contacted (issue #50): a host list with an empty name (``h1,``), a host name or
address with a character no host name has, an ``ssh_port`` outside 1-65535, an Ansible INI or
YAML inventory, a missing file, and a group data file's own error named as that file's.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from servefleet.base.errors import DataError, ServefleetError
from servefleet.fleet.inventory import (
    check_host_name,
    check_ssh_data,
    pyinfra_cli,
    read_inventory,
)

ALLOWED_FORMS = "allowed: a pyinfra Python inventory file (inventories/prod.py), a host list h1,h2"


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty working directory (no group_data); pyinfra's cache of the code of each file it
    ran (by the name given: inv.py) empty."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(pyinfra_cli().util, "PYTHON_CODES", {})
    return tmp_path


def refusal(inventory: str) -> str:
    with pytest.raises(ServefleetError) as e:
        read_inventory(inventory)
    assert "\n" not in str(e.value)
    return str(e.value)


@pytest.mark.parametrize("inventory", ["npu-a1.example.internal,", "h1,,h2", ",h1"])
def test_a_host_list_with_an_empty_name_is_one_line_naming_the_allowed_forms(
    here: Path, inventory: str
) -> None:
    """pyinfra itself fails on these with an IndexError (``name[0]`` of an empty name)."""
    said = refusal(inventory)
    assert said.startswith(f"{inventory}: an empty host name in the host list; {ALLOWED_FORMS}")


def test_a_host_list_as_pyinfra_takes_it(here: Path) -> None:
    assert read_inventory("npu-a1.example.internal,npu-a2.example.internal").order == [
        "npu-a1.example.internal",
        "npu-a2.example.internal",
    ]


@pytest.mark.parametrize(
    "inventory, name",
    [
        ('cr13 = ["npu a1"]\n', "'npu a1'"),
        ('cr13 = ["npu-a1;reboot"]\n', "'npu-a1;reboot'"),
        ('cr13 = ["h[1]"]\n', "'h[1]'"),
        ('cr13 = ["npu-a1\\n"]\n', "'npu-a1\\n'"),
    ],
)
def test_a_host_name_no_host_has_is_one_line_naming_it_and_the_allowed_characters(
    here: Path, inventory: str, name: str
) -> None:
    (here / "inv.py").write_text(inventory)
    assert refusal("inv.py") == (
        f"host {name}: not a host name or address; allowed characters: letters, digits and "
        ". - _ : (an @connector name also / + @)"
    )


def test_a_host_list_with_a_space_names_the_host(here: Path) -> None:
    assert refusal("h1, h2").startswith("host ' h2': not a host name or address")


@pytest.mark.parametrize(
    "name", ["npu-a1.example.internal", "10.0.0.1", "fe80::1", "npu_a1", "@local", "@docker/d:12"]
)
def test_host_names_and_addresses_pass(name: str) -> None:
    check_host_name(name)


def test_an_ssh_hostname_no_host_has_is_one_line(here: Path) -> None:
    (here / "inv.py").write_text('cr13 = [("npu-a1", {"ssh_hostname": "10.0.0.1 -p 2"})]\n')
    assert refusal("inv.py").startswith("npu-a1: ssh_hostname '10.0.0.1 -p 2': not a host name")


@pytest.mark.parametrize("port", [70000, 0, -1, "22a", True, 2.5])
def test_an_ssh_port_outside_1_to_65535_is_one_line(here: Path, port: object) -> None:
    """pyinfra's socket takes 70000 as port 4464 (70000 - 65536)."""
    (here / "inv.py").write_text(f'cr13 = [("npu-a1", {{"ssh_port": {port!r}}})]\n')
    with pytest.raises(DataError) as e:
        read_inventory("inv.py")
    assert str(e.value) == f"npu-a1: ssh_port {port!r}: not a port; allowed: 1-65535"


def test_ssh_port_over_data_is_checked_too(here: Path) -> None:
    with pytest.raises(DataError, match="h1: ssh_port 70000: not a port; allowed: 1-65535"):
        read_inventory("h1,h2", {"ssh_port": 70000})
    for port in (1, 22, "2222", 65535):
        check_ssh_data({"ssh_port": port})


@pytest.mark.parametrize(
    "name, text",
    [
        ("hosts.ini", "[cr13]\nnpu-a1 ansible_host=10.0.0.1\n"),
        ("hosts.yml", "all:\n  hosts:\n    npu-a1:\n"),
        ("hosts.yaml", "cr13:\n  hosts:\n    npu-a1: {}\n"),
        ("hosts", "[cr13]\nnpu-a1\n"),  # Ansible's default name: no suffix
    ],
)
def test_an_ansible_inventory_is_one_line_saying_it_is_not_supported(
    here: Path, name: str, text: str
) -> None:
    (here / name).write_text(text)
    assert refusal(name).startswith(
        f"{name}: not a pyinfra inventory (an Ansible INI or YAML inventory is not supported); "
        f"{ALLOWED_FORMS}"
    )


def test_a_python_inventory_without_the_py_suffix_is_read(here: Path) -> None:
    (here / "hosts").write_text('cr13 = ["npu-a1"]\n')
    assert read_inventory("hosts").order == ["npu-a1"]


@pytest.mark.parametrize("inventory", ["inventories/prdo.py", "prod.py", "hosts.ini"])
def test_a_missing_inventory_file_says_it_does_not_exist(here: Path, inventory: str) -> None:
    assert refusal(inventory).startswith(f"{inventory}: no such file; {ALLOWED_FORMS}")


@pytest.mark.parametrize(
    "body, line, said",
    [
        ("x = 1\ny = (\n", 2, "SyntaxError: '(' was never closed"),
        ("x = 1\n\ny = undefined\n", 3, "NameError: name 'undefined' is not defined"),
    ],
)
def test_a_group_data_error_names_the_group_data_file_and_line(
    here: Path, body: str, line: int, said: str
) -> None:
    (here / "inv.py").write_text('cr13 = ["npu-a1"]\n')
    (here / "group_data").mkdir()
    (here / "group_data" / "cr13.py").write_text(body)
    want = f"group_data/cr13.py, line {line}: cannot read the group data: {said}"
    assert refusal("inv.py") == want


def test_the_inventory_file_s_own_syntax_error_still_names_the_inventory(here: Path) -> None:
    (here / "inv.py").write_text('cr13 = ["npu-a1"]\ny = (\n')
    assert refusal("inv.py").startswith("inv.py: cannot read the inventory: SyntaxError: ")
