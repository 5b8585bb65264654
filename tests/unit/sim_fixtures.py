"""The simulator's fixtures and helpers, shared by the unit tests that run it on this machine
(test_lab_sim.py, test_sim_serving.py, test_sim_compile_only.py, ...): the built lab artifacts, a
venv with the simulated RBLN stack, a simulated host root, a model hub, the environment of a
simulated server; a simulated GPU host root and a venv with the simulated CUDA build of vLLM.
tests/unit/conftest.py registers the fixtures for every unit test module."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lab_sim_support import (
    SIMULATOR,
    SQUATTERS,
    Server,
    extract_model,
    free_port,
    load_sim,
    pip,
)

from servefleet.fleet.lab.hosts import hardware_json
from servefleet.fleet.lab.topology import plan_hosts

MODEL = "openai/gpt-oss-120b"
DRAFT = "nvidia/gpt-oss-120b-Eagle3-v3"
NVIDIA_SMI = SIMULATOR / "sim" / "nvidia-smi"


@pytest.fixture(scope="session")
def builder() -> Any:
    from servefleet.fleet.lab.simulator import build

    return build


@pytest.fixture(scope="session")
def sim() -> Any:
    return load_sim("servefleet_lab_vllm_sim")


@pytest.fixture(scope="session")
def out(builder: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("lab") / "out"
    builder.build(path)
    return path


@pytest.fixture(scope="session")
def manifest(out: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((out / "manifest.json").read_text())
    return data


@pytest.fixture(scope="session")
def clean_links(out: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every built wheel and sdist except the squatters, in one find-links dir."""
    links = tmp_path_factory.mktemp("links")
    for sub in ("private", "public", "vllm", "assets", "torch"):
        for f in (out / "index" / sub).iterdir():
            if not (sub == "public" and f.name in SQUATTERS):
                shutil.copy2(f, links)
    return links


@pytest.fixture(scope="session")
def venv(out: Path, clean_links: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv with the RBLN stack 0.12.0 and arctic-inference (built from its sdist)."""
    path = tmp_path_factory.mktemp("venv") / "v"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    python = path / "bin" / "python"
    pip(
        python,
        "install",
        "--no-index",
        "--find-links",
        str(clean_links),
        "rebel-compiler==0.12.0",
        "vllm-rbln[kv-connectors,runtime]==0.12.0",
    )
    # the sdist builds with the backend served next to it on the public index only
    pip(
        python,
        "install",
        "--no-index",
        "--find-links",
        str(out / "index" / "public"),
        "arctic-inference==0.1.1",
    )
    return path


@pytest.fixture(scope="session")
def fakebin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A dpkg-query answering from $FAKE_DPKG_INSTALLED (space-separated package names)."""
    path = tmp_path_factory.mktemp("fakebin")
    script = path / "dpkg-query"
    script.write_text(
        "#!/bin/sh\nfor p; do :; done\n"
        'case " $FAKE_DPKG_INSTALLED " in *" $p "*) printf "install ok installed";; '
        '*) echo "dpkg-query: no packages found matching $p" >&2; exit 1;; esac\n'
    )
    script.chmod(0o755)
    return path


def run_runfile(
    runfile: Path, root: Path, fakebin: Path, installed: str, *args: str
) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, RBLN_SIM_ROOT=str(root), FAKE_DPKG_INSTALLED=installed)
    env["PATH"] = f"{fakebin}:{env['PATH']}"
    return subprocess.run(["sh", str(runfile), *args], capture_output=True, text=True, env=env)


def all_prereqs() -> str:
    return f"dkms linux-headers-{os.uname().release}"


@pytest.fixture(scope="session")
def simroot(
    out: Path, manifest: dict[str, Any], fakebin: Path, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """A simulated host root: hardware.json (4 x CR13), driver 3.5.1 installed."""
    root = tmp_path_factory.mktemp("simroot")
    (root / "etc/rbln-sim").mkdir(parents=True)
    hw = {"sku": "RBLN-CR13", "pci_device": "2130", "devices": 4}
    (root / "etc/rbln-sim/hardware.json").write_text(json.dumps(hw))
    (root / "etc/rbln-sim/compile-seconds").write_text("0.5\n")
    runfile = out / "files" / manifest["driver"]["3.5.1"]["path"]
    proc = run_runfile(runfile, root, fakebin, all_prereqs(), "--silent")
    assert proc.returncode == 0, proc.stderr
    return root


@pytest.fixture(scope="session")
def hf_home(out: Path, manifest: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("hf")
    for model in (MODEL, DRAFT):
        extract_model(out / "files" / manifest["models"][model]["path"], home)
    return home


@pytest.fixture
def sim_env(simroot: Path, hf_home: Path, venv: Path, tmp_path: Path) -> Iterator[dict[str, str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "RBLN_", "HF_"))}
    env.update(
        RBLN_SIM_ROOT=str(simroot),
        PATH=f"{simroot}/usr/bin:{venv}/bin:/usr/bin:/bin",
        HF_HOME=str(hf_home),
        HF_HUB_OFFLINE="1",
        VLLM_CACHE_ROOT=str(tmp_path / "vllm-cache"),
        RBLN_VISIBLE_DEVICES="0",
    )
    yield env
    for switch in ("fail-start", "fail-health", "stale-peer", "platform"):
        (simroot / "etc/rbln-sim" / switch).unlink(missing_ok=True)


def vllm(python: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    cmd = [str(python), "-m", "vllm", "serve", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)


def serve(venv: Path, env: dict[str, str], *args: str) -> Server:
    port = free_port()
    server = Server(
        [
            str(venv / "bin" / "vllm"),
            "serve",
            MODEL,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            *args,
        ],
        env,
        port,
    )
    server.wait_ready()
    return server


# A simulated NVIDIA GPU host (test_lab_gpu.py, test_sim_pd.py, test_sim_multinode.py)


def gpu_root(path: Path, hardware: str = "h200") -> Path:
    """A simulated GPU host root: hardware.json, nvidia-smi, platform ``upstream``."""
    host = plan_hosts(1, 4, {}, "cr13", {"lab1": hardware})[0]
    (path / "etc/rbln-sim").mkdir(parents=True)
    (path / "etc/rbln-sim/hardware.json").write_text(json.dumps(hardware_json(host)))
    (path / "etc/rbln-sim/platform").write_text("upstream\n")
    (path / "usr/bin").mkdir(parents=True)
    shutil.copy2(NVIDIA_SMI, path / "usr/bin/nvidia-smi")
    return path


@pytest.fixture(scope="session")
def gpu_venv(out: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """vllm 0.30.0 installed as a GPU host installs it: from the public index alone."""
    path = tmp_path_factory.mktemp("gpuvenv") / "v"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    pip(path / "bin/python", "install", "--no-index", "--find-links", str(out / "index/public"),
        "vllm==0.30.0", "arctic-inference==0.1.1")  # fmt: skip
    return path
