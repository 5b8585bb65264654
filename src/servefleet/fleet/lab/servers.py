"""The lab's servers on the bridge (its package indexes, the apt repository, the driver files
and model store, the hub), the credentials they check, and what the running model store
serves."""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from servefleet.fleet.lab import layout
from servefleet.fleet.lab.index import fetch
from servefleet.fleet.lab.state import LabError


def _start_server(name: str, args: list[str], port: int) -> dict[str, Any]:
    log = layout.STATE_LOGS / f"{name}.log"
    pidfile = layout.STATE_RUN / f"{name}.pid"
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                layout.SERVER_MODULE,
                *args,
                "--name",
                name,
                "--bind",
                layout.BRIDGE_IP,
                "--port",
                str(port),
            ],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )
    pidfile.write_text(f"{proc.pid}\n")
    return {"pid_file": str(pidfile), "log": str(log), "port": port, "_proc": proc}


def _wait_port(port: int, proc: subprocess.Popen[bytes], name: str, log: str) -> None:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise LabError(f"lab server {name} exited with {proc.returncode}; see {log}")
        try:
            socket.create_connection((layout.BRIDGE_IP, port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise LabError(f"lab server {name} does not listen on {layout.BRIDGE_IP}:{port}; see {log}")


def start_servers(
    artifacts: Path, secret_files: dict[str, str], indexes: Path | None = None
) -> dict[str, dict[str, Any]]:
    """Start every lab server on the bridge address; return their state entries.

    + artifacts: the built lab artifacts (index/, files/)
    + secret_files: the credential files by variable name
    + indexes: the directory of the index directories served (default: artifacts/index)
    """
    indexes = indexes or artifacts / "index"
    basic = [
        "--user-file",
        secret_files["RBLN_INDEX_USER"],
        "--password-file",
        secret_files["RBLN_INDEX_PASSWORD"],
    ]
    specs: dict[str, tuple[list[str], int, str, str]] = {
        "index_private": (
            ["simple", str(indexes / "private"), *basic],
            layout.PORT_INDEX_PRIVATE,
            "/simple/",
            "basic RBLN_INDEX_USER:RBLN_INDEX_PASSWORD",
        ),
        "index_vllm": (
            ["simple", str(indexes / "vllm")],
            layout.PORT_INDEX_VLLM,
            "/simple/",
            "none",
        ),
        "index_torch": (
            ["simple", str(indexes / "torch")],
            layout.PORT_INDEX_TORCH,
            "/simple/",
            "none",
        ),
        "index_public": (
            ["simple", str(indexes / "public")],
            layout.PORT_INDEX_PUBLIC,
            "/simple/",
            "none",
        ),
        "index_assets": (
            ["simple", str(indexes / "assets")],
            layout.PORT_INDEX_ASSETS,
            "/simple/",
            "none",
        ),
        "apt": (["static", str(layout.STATE_APT)], layout.PORT_APT, "/", "none"),
        "files": (
            [
                "static",
                str(artifacts / "files"),
                "--token-file",
                secret_files["HF_TOKEN"],
                "--token-path",
                "/models/",
            ],
            layout.PORT_FILES,
            "/",
            "bearer HF_TOKEN on /models/",
        ),
        "hub": (
            ["hub", str(artifacts / "files" / "models"), "--token-file", secret_files["HF_TOKEN"]],
            layout.PORT_HUB,
            "",
            "bearer HF_TOKEN (every model gated)",
        ),
    }
    servers = {}
    for name, (args, port, path, auth) in specs.items():
        entry = _start_server(name, args, port)
        entry.update(url=layout.url(port, path), auth=auth)
        servers[name] = entry
    for name, entry in servers.items():
        _wait_port(entry["port"], entry.pop("_proc"), name, entry["log"])
    return servers


def new_secret_files() -> dict[str, str]:
    layout.STATE_SECRETS.mkdir(mode=0o700, parents=True)
    layout.STATE_SECRETS.chmod(0o700)
    values = {
        "RBLN_INDEX_USER": f"lab-{secrets.token_hex(3)}",
        # shell metacharacters and '#': every deploy test proves they survive (whitespace,
        # quotes and backslashes no netrc reads alike: settings refuses them, #18 finding 10)
        "RBLN_INDEX_PASSWORD": secrets.token_urlsafe(18) + "#h$!;&|<>(*)`",
        "HF_TOKEN": "hf_lab" + secrets.token_hex(16),
        # serve_router fleet: the key the serving hosts drain the routers with
        "SERVEFLEET_ROUTER_ADMIN_KEY": "lab-admin-" + secrets.token_hex(16),
    }
    files = {}
    for name, value in values.items():
        path = layout.STATE_SECRETS / name.lower().replace("_", "-")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(value + "\n")
        files[name] = str(path)
    return files


def store_models(state: dict[str, Any]) -> dict[str, dict[str, str]]:
    """What the running lab's model store serves: its manifest's entries (model -> sha256,
    revision, path), fetched as a host fetches them (with the HF token).

    + state: the lab state
    """
    url = state["model_store"]["url"] + "manifest.json"
    token_file = state["secrets"]["HF_TOKEN"]
    try:
        token = Path(token_file).read_text().strip()
        code, _, body = fetch(url, {"Authorization": f"Bearer {token}"}, timeout=10)
    except OSError as exc:
        raise LabError(f"cannot read the model store's manifest {url}: {exc}") from None
    if code in (401, 403):
        raise LabError(f"the model store refused the token in {token_file} ({code})")
    if code != 200:
        raise LabError(f"the model store answered {code} for {url}")
    try:
        models = json.loads(body)["models"]
    except (ValueError, KeyError, TypeError):
        raise LabError(f"{url} is not a model store manifest") from None
    return dict(models)
