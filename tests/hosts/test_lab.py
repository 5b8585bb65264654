"""The running lab: hosts reachable by pyinfra over SSH with systemd as PID 1, the package servers
(authenticated index, signed apt repository, file server) and ``servefleet lab env``."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from labhelpers import on_host, servefleet

from servefleet.fleet.lab import layout
from servefleet.fleet.lab.index import fetch as _get


def _secret(state: dict[str, Any], name: str) -> str:
    return Path(state["secrets"][name]).read_text().strip()


def _basic(state: dict[str, Any]) -> dict[str, str]:
    pair = f"{_secret(state, 'RBLN_INDEX_USER')}:{_secret(state, 'RBLN_INDEX_PASSWORD')}"
    return {"Authorization": "Basic " + base64.b64encode(pair.encode()).decode()}


def test_state_lists_the_hosts_and_servers(lab: dict[str, Any]) -> None:
    assert [h["name"] for h in lab["hosts"]] == ["lab1", "lab2", "lab3"]
    assert [h["address"] for h in lab["hosts"]] == ["10.213.0.11", "10.213.0.12", "10.213.0.13"]
    assert all(h["sku"] == "RBLN-CR13" and h["devices"] == 4 for h in lab["hosts"])
    assert set(lab["servers"]) == {
        "index_private",
        "index_vllm",
        "index_torch",
        "index_public",
        "index_assets",
        "apt",
        "files",
        "hub",
    }
    assert all(h["base"] == "bookworm" and h["glibc"] == "2.36" for h in lab["hosts"])
    assert lab["groups"] == {"lab": ["lab1", "lab2", "lab3"], "cr13": ["lab1", "lab2", "lab3"]}
    for path in [
        lab["ssh"]["key"],
        lab["ssh"]["known_hosts"],
        lab["apt"]["key"],
        *lab["secrets"].values(),
    ]:
        assert Path(path).is_file(), path
    for path in lab["secrets"].values():
        assert Path(path).stat().st_mode & 0o777 == 0o600, path


def test_every_host_answers_pyinfra_over_ssh(lab: dict[str, Any], repo_root: Path) -> None:
    pyinfra = Path(sys.executable).parent / "pyinfra"
    proc = subprocess.run(
        [str(pyinfra), "-y", "inventories/lab.py", "exec", "--", "echo host-is-$(hostname)"],
        cwd=repo_root,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout
    for host in lab["hosts"]:
        assert re.search(rf"\[{host['name']}\] host-is-{host['name']}\b", proc.stdout), proc.stdout


def test_hosts_run_systemd_as_pid1_without_route_or_dns(lab: dict[str, Any]) -> None:
    for host in lab["hosts"]:
        out = on_host(
            lab,
            host["name"],
            "systemctl is-system-running; cat /proc/1/comm; "
            "ip route; grep -c nameserver /etc/resolv.conf || true",
        ).stdout.split("\n")
        assert out[0] == "running", out
        assert out[1] == "systemd", out
        assert not any(line.startswith("default") for line in out), out
        assert out[-2] == "0", out  # no nameserver line


def test_a_unit_started_by_systemd_runs(lab: dict[str, Any]) -> None:
    host = lab["hosts"][-1]["name"]
    unit = "[Unit]\nDescription=lab test\n[Service]\nExecStart=/bin/sleep 1000\n"
    try:
        on_host(
            lab,
            host,
            "cat > /etc/systemd/system/sf-lab-test.service && "
            "systemctl daemon-reload && systemctl start sf-lab-test",
            stdin=unit,
        )
        out = on_host(
            lab,
            host,
            "systemctl is-active sf-lab-test; systemctl show -p MainPID --value sf-lab-test",
        ).stdout.split()
        assert out[0] == "active"
        on_host(lab, host, f'test "$(cat /proc/{out[1]}/comm)" = sleep')
    finally:
        on_host(
            lab,
            host,
            "systemctl stop sf-lab-test; rm -f /etc/systemd/system/sf-lab-test.service;"
            " systemctl daemon-reload",
            check=False,
        )


def test_hosts_see_their_simulated_cards(lab: dict[str, Any]) -> None:
    for host in lab["hosts"]:
        hardware = json.loads(on_host(lab, host["name"], "cat /etc/rbln-sim/hardware.json").stdout)
        assert hardware == {"sku": "RBLN-CR13", "pci_device": "2130", "devices": 4}
        lspci = on_host(lab, host["name"], "lspci -n").stdout
        assert "1eff:2130" in lspci
        seconds = on_host(lab, host["name"], "cat /etc/rbln-sim/compile-seconds").stdout
        assert float(seconds) == layout.DEFAULT_COMPILE_SECONDS


def test_private_index_refuses_anonymous_access(lab: dict[str, Any]) -> None:
    url = lab["indexes"]["private"]
    code, headers, _ = _get(url)
    assert code == 401
    assert headers.get("WWW-Authenticate", "").startswith("Basic ")
    wrong = {"Authorization": "Basic " + base64.b64encode(b"lab:wrong").decode()}
    assert _get(url, wrong)[0] == 401
    code, _, body = _get(url, _basic(lab))
    assert code == 200
    assert b'href="rebel-compiler/"' in body


def test_pip_in_a_host_downloads_from_the_private_index_with_credentials(
    lab: dict[str, Any],
) -> None:
    host = lab["hosts"][0]["name"]
    index = lab["indexes"]["private"].replace("http://", "")
    pip = (
        "python3 -m pip download --no-input --no-deps --retries 0 --trusted-host "
        f"{layout.BRIDGE_IP} -d /tmp/sf-dl rebel-compiler"
    )
    anonymous = on_host(lab, host, f"{pip} --index-url http://{index} 2>&1", check=False)
    assert anonymous.returncode != 0
    assert "from versions: none" in anonymous.stdout
    log = Path(lab["servers"]["index_private"]["log"]).read_text()
    assert re.search(r'"GET /simple/rebel-compiler/ HTTP/1.1" 401', log), log[-2000:]
    # credentials on stdin, never in argv (URL-quoted: the lab's password has spaces and quotes)
    user, password = (
        quote(_secret(lab, k), safe="") for k in ("RBLN_INDEX_USER", "RBLN_INDEX_PASSWORD")
    )
    creds = f"{user}\n{password}\n"
    got = on_host(
        lab,
        host,
        f'read -r U; read -r P; PIP_INDEX_URL="http://$U:$P@{index}" '
        f"{pip} 2>&1 && ls /tmp/sf-dl && rm -rf /tmp/sf-dl",
        stdin=creds,
    )
    assert re.search(r"^rebel_compiler-[^ ]+\.whl$", got.stdout, re.MULTILINE), got.stdout


def test_public_indexes_serve_pep503_with_hashes(lab: dict[str, Any]) -> None:
    for name in ("vllm", "torch", "public", "assets"):
        code, _, body = _get(lab["indexes"][name])
        assert code == 200, name
        projects = re.findall(r'href="([^"]+)/"', body.decode())
        assert projects, name
        code, _, page = _get(lab["indexes"][name] + projects[0] + "/")
        links = re.findall(r'href="\.\./\.\./files/([^"#]+)#sha256=([0-9a-f]{64})"', page.decode())
        assert code == 200 and links, name
        filename, digest = links[0]
        code, _, data = _get(lab["indexes"][name].replace("/simple/", "/files/") + filename)
        assert code == 200 and hashlib.sha256(data).hexdigest() == digest


def test_apt_repo_is_signed_and_a_host_installs_dkms(lab: dict[str, Any], tmp_path: Path) -> None:
    code, _, inrelease = _get(lab["apt"]["url"] + "InRelease")
    assert code == 200 and inrelease.startswith(b"-----BEGIN PGP SIGNED MESSAGE-----")
    (tmp_path / "InRelease").write_bytes(inrelease)
    verify = subprocess.run(
        ["gpgv", "--keyring", lab["apt"]["key"], str(tmp_path / "InRelease")],
        capture_output=True,
        text=True,
    )
    assert verify.returncode == 0, verify.stderr
    host = lab["hosts"][-1]["name"]
    key = Path(lab["apt"]["key"]).read_bytes()
    repo = f"{lab['apt']['url']} {lab['apt']['suite']}"
    # a source list of its own, so whatever a deploy configured on this host does not interfere
    apt = "apt-get -o Dir::Etc::SourceList=/etc/apt/sf-test.list -o Dir::Etc::SourceParts=/nonexistent"
    had_dkms = (
        on_host(lab, host, "dpkg-query -W -f '${Status}' dkms", check=False).stdout
        == "install ok installed"
    )
    try:
        on_host(
            lab,
            host,
            "install -d /etc/apt/keyrings && base64 -d > /etc/apt/keyrings/sf-test.gpg",
            stdin=base64.b64encode(key).decode(),
        )
        # unsigned-by (no key): apt refuses the repository
        on_host(lab, host, f"echo 'deb {repo}' > /etc/apt/sf-test.list")
        refused = on_host(lab, host, f"{apt} update 2>&1", check=False).stdout
        assert "NO_PUBKEY" in refused or "not signed" in refused, refused
        on_host(
            lab,
            host,
            f"echo 'deb [signed-by=/etc/apt/keyrings/sf-test.gpg] {repo}' > /etc/apt/sf-test.list",
        )
        on_host(
            lab, host, f"{apt} update -q && DEBIAN_FRONTEND=noninteractive {apt} install -y -q dkms"
        )
        assert (
            on_host(lab, host, "dpkg-query -W -f '${Status}' dkms").stdout == "install ok installed"
        )
    finally:
        purge = "" if had_dkms else "DEBIAN_FRONTEND=noninteractive apt-get purge -y -q dkms; "
        on_host(
            lab,
            host,
            purge + "rm -f /etc/apt/sf-test.list /etc/apt/keyrings/sf-test.gpg",
            check=False,
        )


def test_file_server_serves_driver_runfiles_and_guards_the_model_store(
    lab: dict[str, Any],
) -> None:
    assert lab["driver"], "no driver runfiles in the lab state"
    for version, entry in lab["driver"].items():
        assert entry["file"] == f"rebellions-x86_64-{version}.run"
        code, _, data = _get(entry["url"])
        assert code == 200 and hashlib.sha256(data).hexdigest() == entry["sha256"]
    store = lab["model_store"]["url"]
    path = next(iter(lab["model_store"]["models"].values()))["path"]
    url = layout.url(layout.PORT_FILES, "/" + path)
    assert url.startswith(store)
    assert _get(url)[0] == 401
    assert _get(url, {"Authorization": "Bearer hf_not-the-token"})[0] == 401
    assert _get(url, {"Authorization": f"Bearer {_secret(lab, 'HF_TOKEN')}"})[0] == 200


def test_lab_env_exports_credentials_without_printing_them(lab: dict[str, Any]) -> None:
    out = servefleet("lab", "env").stdout
    names = re.findall(r'^export ([A-Z_]+)="\$\(cat [^)]+\)"$', out, re.MULTILINE)
    assert sorted(names) == [
        "HF_TOKEN", "RBLN_INDEX_PASSWORD", "RBLN_INDEX_USER", "SERVEFLEET_ROUTER_ADMIN_KEY",
    ]  # fmt: skip
    for name in names:
        assert _secret(lab, name) not in out
    shell = subprocess.run(
        [
            "bash",
            "-c",
            'eval "$1"; printf "%s\\n" "$RBLN_INDEX_USER" "$RBLN_INDEX_PASSWORD" "$HF_TOKEN"',
            "_",
            out,
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert shell.stdout.split("\n")[:3] == [
        _secret(lab, n) for n in ("RBLN_INDEX_USER", "RBLN_INDEX_PASSWORD", "HF_TOKEN")
    ]


def test_lab_status_shows_hosts_running_and_servers_up(lab: dict[str, Any]) -> None:
    out = servefleet("lab", "status").stdout
    for host in lab["hosts"]:
        assert re.search(
            rf"^{host['name']}\s+{re.escape(host['address'])}\s.*\srunning$", out, re.MULTILINE
        ), out
    for name in lab["servers"]:
        assert re.search(rf"^{name}\s.*\sup$", out, re.MULTILINE), out


@pytest.mark.parametrize(
    "args",
    [
        ["--hosts", "0"],
        ["--odd-sku", "lab9=RBLN-CA25"],
        ["--odd-sku", "lab1=RBLN-XX99"],
        ["--odd-sku", "lab1"],
    ],
)
def test_bad_lab_settings_are_one_line_errors(lab: dict[str, Any], args: list[str]) -> None:
    proc = servefleet("lab", "up", *args, check=False)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    # the running lab is untouched: settings are checked before anything is cleared
    assert servefleet("lab", "status").stdout.count(" running") == len(lab["hosts"])
