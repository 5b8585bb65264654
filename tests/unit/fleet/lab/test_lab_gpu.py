"""The lab's simulated NVIDIA GPU hosts: host plans and options (--hardware, --odd-hardware),
hardware.json, the inventory groups, the simulated nvidia-smi and lspci, and the simulated CUDA
build of vLLM (vllm 0.30.0 + torch 2.13.0 on the public index). Runs on this machine, no
namespaces: every simulation path goes under $RBLN_SIM_ROOT, pip runs isolated against the built
directories."""

from __future__ import annotations

import contextlib
import json
import os
import runpy
import subprocess
import time
import zipfile
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from lab_sim_support import (
    REPO,
    SIMULATOR,
    Server,
    derived_venv,
    extract_model,
    free_port,
    http,
    metadata,
    pip,
)
from sim_fixtures import NVIDIA_SMI, gpu_root

from servefleet.fleet.lab import layout
from servefleet.fleet.lab.cli import lab as lab_cli
from servefleet.fleet.lab.hosts import hardware_json
from servefleet.fleet.lab.state import LabError, write_state
from servefleet.fleet.lab.topology import host_groups, plan_hosts

MODEL = "openai/gpt-oss-120b"
DRAFT = "nvidia/gpt-oss-120b-Eagle3-v3"
H200_MIB = 143771


# ---------------------------------------------------------------------------------------------
# Host plans, options, hardware.json, inventory groups


def test_gpu_lab_plan_with_an_odd_host() -> None:
    hosts = plan_hosts(3, 4, {}, "h200", {"lab2": "h100", "lab3": "cr13"})
    assert [(h["name"], h["hardware"], h["sku"], h["pci_device"], h["devices"]) for h in hosts] == [
        ("lab1", "h200", "NVIDIA H200", "2335", 8),
        ("lab2", "h100", "NVIDIA H100 80GB HBM3", "2330", 8),
        ("lab3", "cr13", "RBLN-CR13", "2130", 4),  # --devices is the RBLN hosts' NPU count
    ]
    assert host_groups(hosts) == {"lab": ["lab1", "lab2", "lab3"], "cr13": ["lab3"],
                                  "h100": ["lab2"], "h200": ["lab1"]}  # fmt: skip


def test_default_plan_is_todays_cr13_lab() -> None:
    hosts = plan_hosts(3, 4, {"lab3": "RBLN-CA25"})
    assert {h["hardware"] for h in hosts} == {"cr13"}
    assert [h["sku"] for h in hosts] == ["RBLN-CR13", "RBLN-CR13", "RBLN-CA25"]
    # an odd SKU stays in cr13, as before
    assert host_groups(hosts) == {"lab": ["lab1", "lab2", "lab3"], "cr13": ["lab1", "lab2", "lab3"]}
    mixed = plan_hosts(2, 2, {"lab1": "RBLN-CA22"}, "cr13", {"lab2": "h200"})
    assert [(h["sku"], h["devices"]) for h in mixed] == [("RBLN-CA22", 2), ("NVIDIA H200", 8)]


@pytest.mark.parametrize(("args", "message"), [
    ((2, 4, {}, "h100"), "--hardware h100: unknown hardware; allowed: cr13, h200"),
    ((2, 4, {}, "gpu"), "--hardware gpu: unknown hardware; allowed: cr13, h200"),
    ((2, 4, {}, "h200", {"lab3": "h100"}),
     "--odd-hardware names host 'lab3'; the lab has lab1, lab2"),
    ((2, 4, {}, "cr13", {"lab1": "a100"}),
     "--odd-hardware lab1=a100: unknown hardware; allowed: cr13, h100, h200"),
    ((2, 4, {"lab1": "RBLN-CA25"}, "h200"),
     "--odd-sku lab1=RBLN-CA25: lab1 is a GPU host (h200), not an RBLN one"),
    ((2, 4, {"lab2": "RBLN-CA25"}, "cr13", {"lab2": "h100"}),
     "--odd-sku lab2=RBLN-CA25: lab2 is a GPU host (h100), not an RBLN one"),
])  # fmt: skip
def test_bad_gpu_plans(args: tuple[Any, ...], message: str) -> None:
    with pytest.raises(LabError) as info:
        plan_hosts(*args)
    assert str(info.value) == message


@pytest.mark.parametrize(("args", "message"), [
    (["--hardware", "h100"], "servefleet lab: --hardware h100: unknown hardware; allowed: cr13, h200\n"),
    (["--odd-hardware", "lab9=h100"],
     "servefleet lab: --odd-hardware names host 'lab9'; the lab has lab1, lab2, lab3\n"),
    (["--odd-hardware", "lab1"], "'lab1' is not HOST=HW (e.g. lab2=h100)"),
])  # fmt: skip
def test_lab_up_refuses_bad_hardware_options(args: list[str], message: str) -> None:
    # refused while planning, before anything on this machine is touched
    result = CliRunner().invoke(lab_cli, ["up", *args])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert message in result.output


def test_hardware_json_of_rbln_and_gpu_hosts() -> None:
    cr13, h200, h100 = plan_hosts(3, 4, {}, "cr13", {"lab2": "h200", "lab3": "h100"})
    assert hardware_json(cr13) == {"sku": "RBLN-CR13", "pci_device": "2130", "devices": 4}
    hw = hardware_json(h200)
    assert set(hw) == {"hardware", "driver_version", "cuda_version", "gpus"}
    assert (hw["hardware"], hw["driver_version"], hw["cuda_version"]) == (
        "h200",
        "570.133.20",
        "12.8",
    )
    assert [g["index"] for g in hw["gpus"]] == list(range(8))
    assert hw["gpus"][1] == {
        "index": 1,
        "name": "NVIDIA H200",
        "uuid": hw["gpus"][1]["uuid"],
        "pci_vendor": "10de",
        "pci_device": "2335",
        "pci_bus_id": "00000000:2a:00.0",
        "pci_name": "GH100 [H200 SXM 141GB]",
        "memory_total_mib": H200_MIB,
        "power_limit_w": 700,
    }
    uuids = [g["uuid"] for g in hw["gpus"] + hardware_json(h100)["gpus"]]
    assert len(set(uuids)) == 16 and all(u.startswith("GPU-") and len(u) == 40 for u in uuids)
    assert hardware_json(h200) == hw  # stable: derived from the host name
    assert {g["memory_total_mib"] for g in hardware_json(h100)["gpus"]} == {81559}


def test_inventory_exposes_a_group_per_hardware(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hosts = plan_hosts(3, 4, {}, "h200", {"lab3": "h100"})
    state = {
        "hosts": hosts,
        "groups": host_groups(hosts),
        "ssh": {"user": "root", "key": "/k", "known_hosts": "/kh"},
    }
    write_state(state, tmp_path / "state.json")
    monkeypatch.setattr(layout, "STATE_FILE", tmp_path / "state.json")
    inv = runpy.run_path(str(REPO / "inventories" / "lab.py"))
    assert [name for name, _ in inv["lab"]] == ["lab1", "lab2", "lab3"]
    assert (inv["cr13"], inv["h200"], inv["h100"]) == ([], ["lab1", "lab2"], ["lab3"])
    state["hosts"] = hosts = plan_hosts(2, 4, {})
    state["groups"] = host_groups(hosts)  # a cr13 lab has no h200/h100 group in its state
    write_state(state, tmp_path / "state.json")
    inv = runpy.run_path(str(REPO / "inventories" / "lab.py"))
    assert (inv["cr13"], inv["h200"], inv["h100"]) == (["lab1", "lab2"], [], [])


# ---------------------------------------------------------------------------------------------
# nvidia-smi and lspci


def smi(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, RBLN_SIM_ROOT=str(root))
    return subprocess.run([str(NVIDIA_SMI), *args], capture_output=True, text=True, env=env)


def test_nvidia_smi_queries(tmp_path: Path) -> None:
    root = gpu_root(tmp_path)
    proc = smi(root, "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader")
    assert proc.returncode == 0 and proc.stdout == "NVIDIA H200, 143771 MiB, 570.133.20\n" * 8
    proc = smi(root, "--query-gpu=index,memory.used,memory.total", "--format=csv,nounits")
    lines = proc.stdout.splitlines()
    assert lines[0] == "index, memory.used [MiB], memory.total [MiB]"
    assert lines[1:] == [f"{i}, 0, {H200_MIB}" for i in range(8)]
    proc = smi(root, "--query-gpu=count,uuid,pci.bus_id", "--format=csv")
    hw = json.loads((root / "etc/rbln-sim/hardware.json").read_text())
    assert proc.stdout.splitlines() == ["count, uuid, pci.bus_id"] + [
        f"8, {g['uuid']}, {g['pci_bus_id']}" for g in hw["gpus"]
    ]
    assert smi(root, "-L").stdout.splitlines()[7] == (
        f"GPU 7: NVIDIA H200 (UUID: {hw['gpus'][7]['uuid']})"
    )
    one = smi(root, "-i", "3", "--query-gpu=index,gpu_name", "--format=csv,noheader")
    assert one.stdout == "3, NVIDIA H200\n"
    h100 = gpu_root(tmp_path / "h100", "h100")
    proc = smi(h100, "--query-gpu=name,memory.total", "--format=csv,noheader,nounits")
    assert proc.stdout.splitlines()[0] == "NVIDIA H100 80GB HBM3, 81559"


def test_nvidia_smi_table(tmp_path: Path) -> None:
    out = smi(gpu_root(tmp_path)).stdout.splitlines()
    assert "NVIDIA-SMI 570.133.20" in out[2] and "CUDA Version: 12.8" in out[2]
    rows = [line for line in out if "NVIDIA H200" in line]
    assert len(rows) == 8 and "00000000:18:00.0" in rows[0]
    assert sum("0MiB / 143771MiB" in line for line in out) == 8
    assert "No running processes found" in "\n".join(out)
    assert {len(line) for line in out[1:] if line} == {91}


@pytest.mark.parametrize(("args", "code", "message"), [
    (["--query-gpu=name,memory.totl", "--format=csv"], 2,
     'Field "memory.totl" is not a valid field to query.'),
    (["--query-gpu=name"], 2, "Invalid combination of input arguments."),
    (["--query-gpu=name", "--format=json"], 2, "Invalid combination of input arguments."),
    (["--bogus"], 2, "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help."),
    (["-q", "-d", "MEMORY"], 2, "Invalid combination of input arguments."),
    (["-i", "8", "-L"], 6, "No devices were found"),
])  # fmt: skip
def test_nvidia_smi_refuses_like_the_real_one(
    tmp_path: Path, args: list[str], code: int, message: str
) -> None:
    proc = smi(gpu_root(tmp_path), *args)
    assert proc.returncode == code and proc.stdout.startswith(message), proc.stdout


def test_nvidia_smi_without_a_gpu_description(tmp_path: Path) -> None:
    (tmp_path / "etc/rbln-sim").mkdir(parents=True)
    (tmp_path / "etc/rbln-sim/hardware.json").write_text(json.dumps(hardware_json(
        plan_hosts(1, 4, {})[0])))  # fmt: skip
    proc = smi(tmp_path, "-L")
    assert proc.returncode == 9 and "couldn't communicate with the NVIDIA driver" in proc.stdout


def test_lspci_lists_the_gpus(tmp_path: Path) -> None:
    env = dict(os.environ, RBLN_SIM_ROOT=str(gpu_root(tmp_path)))

    def lspci(*args: str) -> list[str]:
        proc = subprocess.run([str(SIMULATOR / "sim/lspci"), *args], capture_output=True, text=True,
                              env=env, check=True)  # fmt: skip
        return proc.stdout.splitlines()

    assert lspci("-n", "-d", "10de:")[:2] == ["18:00.0 0302: 10de:2335", "2a:00.0 0302: 10de:2335"]
    assert len(lspci("-n", "-d", "10de:2335")) == 8 and lspci("-d", "1eff:") == []
    assert lspci("-nn")[1] == (
        "18:00.0 3D controller [0302]: NVIDIA Corporation GH100 [H200 SXM 141GB] [10de:2335]"
    )
    assert lspci()[1] == "18:00.0 3D controller: NVIDIA Corporation GH100 [H200 SXM 141GB]"


# ---------------------------------------------------------------------------------------------
# The CUDA build's wheels


@pytest.fixture(scope="session")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from servefleet.fleet.lab.simulator import build

    path = tmp_path_factory.mktemp("labgpu") / "out"
    build.build(path)
    return path


@pytest.fixture(scope="session")
def hf_home(out: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("hf")
    manifest = json.loads((out / "manifest.json").read_text())
    for model in (MODEL, DRAFT):
        extract_model(out / "files" / manifest["models"][model]["path"], home)
    return home


def _build_json(wheel: Path) -> dict[str, str]:
    with zipfile.ZipFile(wheel) as zf:
        data: dict[str, str] = json.loads(zf.read("vllm/build.json"))
    return data


def test_public_index_has_the_cuda_builds(out: Path) -> None:
    public = out / "index/public"
    wheel = public / "vllm-0.30.0-py3-none-any.whl"
    meta = metadata(wheel)
    assert ("Version", "0.30.0") in meta and ("Requires-Dist", "torch==2.13.0") in meta
    assert _build_json(wheel) == {"version": "0.30.0", "device": "cuda", "torch": "2.13.0"}
    assert ("Version", "2.13.0") in metadata(public / "torch-2.13.0-py3-none-any.whl")
    cpu = out / "index/vllm/vllm-0.30.0+cpu-cp38-abi3-manylinux_2_39_x86_64.whl"
    assert _build_json(cpu) == {"version": "0.30.0+cpu", "device": "cpu"}
    # the CPU indexes are untouched: the CUDA builds are only on the public index
    assert sorted(p.name for p in (out / "index/vllm").iterdir()) == [cpu.name]
    assert sorted(p.name for p in (out / "index/torch").iterdir()) == [
        "torch-2.13.0+cpu-py3-none-any.whl"
    ]


def test_gpu_venv_has_the_cuda_builds(gpu_venv: Path) -> None:
    code = "import vllm, torch; print(vllm.__version__, torch.__version__)"
    proc = subprocess.run([str(gpu_venv / "bin/python"), "-c", code], capture_output=True,
                          text=True, check=True)  # fmt: skip
    assert proc.stdout.split() == ["0.30.0", "2.13.0"]
    version = subprocess.run([str(gpu_venv / "bin/vllm"), "--version"], capture_output=True,
                             text=True)  # fmt: skip
    assert version.stdout == "0.30.0\n"
    listed = pip(gpu_venv / "bin/python", "list", "--format=json").stdout
    assert not {p["name"] for p in json.loads(listed)} & {"vllm-rbln", "rebel-compiler"}


# ---------------------------------------------------------------------------------------------
# The simulated CUDA vllm serve


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = gpu_root(tmp_path / "root")
    (path / "etc/rbln-sim/load-seconds").write_text("0.2\n")
    return path


@pytest.fixture
def env(root: Path, hf_home: Path, gpu_venv: Path, tmp_path: Path) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "RBLN_", "HF_"))}
    base.pop("CUDA_VISIBLE_DEVICES", None)
    return dict(base, RBLN_SIM_ROOT=str(root), PATH=f"{root}/usr/bin:{gpu_venv}/bin:/usr/bin:/bin",
                HF_HOME=str(hf_home), HF_HUB_OFFLINE="1",
                VLLM_CACHE_ROOT=str(tmp_path / "vllm-cache"))  # fmt: skip


def vllm(venv: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    cmd = [str(venv / "bin/vllm"), "serve", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)


def serve(venv: Path, env: dict[str, str], *args: str) -> Server:
    port = free_port()
    cmd = [str(venv / "bin/vllm"), "serve", MODEL, "--host", "127.0.0.1", "--port", str(port)]
    server = Server([*cmd, *args], env, port)
    server.wait_ready()
    return server


def used_mib(root: Path) -> list[int]:
    proc = smi(root, "--query-gpu=memory.used", "--format=csv,noheader,nounits")
    return [int(x) for x in proc.stdout.split()]


def test_serves_on_gpu0_without_compiling(gpu_venv: Path, root: Path, env: dict[str, str]) -> None:
    (root / "etc/rbln-sim/load-seconds").write_text("1.0\n")
    start = time.monotonic()
    server = serve(gpu_venv, dict(env, VLLM_RBLN_COMPILE_ONLY="1"), "--served-model-name", "gpt")
    took = time.monotonic() - start
    try:
        assert took >= 1.0
        assert http(server.port, "/health")[0] == 200
        assert json.loads(http(server.port, "/version")[1]) == {"version": "0.30.0"}
        assert [m["id"] for m in json.loads(http(server.port, "/v1/models")[1])["data"]] == ["gpt"]
        req = {"model": "gpt", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}
        status, body = http(server.port, "/v1/chat/completions", req)
        assert status == 200 and json.loads(body)["usage"]["completion_tokens"] == 3
        metrics = http(server.port, "/metrics")[1].decode()
        assert 'vllm_sim:compiled_at_start{model_name="gpt"} 0' in metrics
        # one GPU (tp 1): GPU 0, 0.92 (the default) of its memory, as nvidia-smi shows
        assert used_mib(root) == [int(H200_MIB * 0.92)] + [0] * 7
        table = smi(root).stdout
        assert f"{server.proc.pid:>11}      C   " in table
        record = json.loads((root / f"run/rbln-sim/vllm-{server.port}.json").read_text())
        assert record["argv"][0].endswith("/vllm") and record["argv"][1:3] == ["serve", MODEL]
        assert record["env"]["HF_HUB_OFFLINE"] == "1" and record["pid"] == server.proc.pid
    finally:
        code, err = server.stop()
    assert code == 0, err
    assert "vLLM API server version 0.30.0" in err and "Loading weights took 1.00 seconds" in err
    assert "Unknown vLLM environment variable detected: VLLM_RBLN_COMPILE_ONLY" in err
    assert "compiling" not in err and "mega-cache" not in err
    assert not (root / "var/log/rbln-sim/compile.log").exists()
    assert not Path(env["VLLM_CACHE_ROOT"]).exists()
    assert used_mib(root) == [0] * 8  # released with the process


def test_a_gpu_holds_one_default_server(gpu_venv: Path, root: Path, env: dict[str, str]) -> None:
    first = serve(gpu_venv, env)
    try:
        proc = vllm(gpu_venv, MODEL, "--port", str(free_port()), env=env)
        assert proc.returncode == 1
        assert (
            "ValueError: Free memory on device cuda:0 (11.23/140.4 GiB) on startup is less "
            "than desired GPU memory utilization (0.92, 129.17 GiB). Decrease GPU memory "
            "utilization or reduce GPU memory used by other processes."
        ) in proc.stderr
        assert f"held by pid {first.proc.pid} (vllm on port {first.port})" in proc.stderr
        # another GPU is free
        other = serve(gpu_venv, dict(env, CUDA_VISIBLE_DEVICES="1"))
        assert used_mib(root)[:3] == [int(H200_MIB * 0.92)] * 2 + [0]
        assert other.stop()[0] == 0
    finally:
        assert first.stop()[0] == 0
    # a killed server's claim is dead: the GPU is free again
    killed = serve(gpu_venv, env)
    killed.proc.kill()
    killed.proc.wait()
    assert used_mib(root)[0] == 0
    assert serve(gpu_venv, env).stop()[0] == 0


def test_two_servers_share_a_gpu_by_memory(gpu_venv: Path, root: Path, env: dict[str, str]) -> None:
    with contextlib.ExitStack() as stack:
        for _ in range(2):
            server = serve(gpu_venv, env, "--gpu-memory-utilization", "0.45")
            stack.callback(server.stop)
        assert used_mib(root)[0] == 2 * int(H200_MIB * 0.45)
        proc = vllm(gpu_venv, MODEL, "--port", str(free_port()), "--gpu-memory-utilization",
                    "0.2", env=env)  # fmt: skip
        assert proc.returncode == 1 and "Free memory on device cuda:0 (14.04/140.4 GiB)" in (
            proc.stderr
        )
    bad = vllm(gpu_venv, MODEL, "--gpu-memory-utilization", "1.5", env=env)
    assert bad.returncode == 1 and "gpu_memory_utilization Input should be" in bad.stderr


def test_cuda_visible_devices_and_parallel_sizes(
    gpu_venv: Path, root: Path, env: dict[str, str]
) -> None:
    server = serve(gpu_venv, dict(env, CUDA_VISIBLE_DEVICES="6,3,5"), "-tp", "2")
    try:  # the first two visible GPUs, in CUDA_VISIBLE_DEVICES' order
        assert [i for i, mib in enumerate(used_mib(root)) if mib] == [3, 6]
    finally:
        assert server.stop()[0] == 0
    server = serve(gpu_venv, env, "-tp", "2", "-pp", "2", "-dp", "2")
    try:
        assert all(used_mib(root))
    finally:
        assert server.stop()[0] == 0
    uuid = json.loads((root / "etc/rbln-sim/hardware.json").read_text())["gpus"][4]["uuid"]
    server = serve(gpu_venv, dict(env, CUDA_VISIBLE_DEVICES=uuid[:12]))
    try:
        assert [i for i, mib in enumerate(used_mib(root)) if mib] == [4]
    finally:
        assert server.stop()[0] == 0


@pytest.mark.parametrize(("extra_env", "args", "message"), [
    ({"CUDA_VISIBLE_DEVICES": ""}, [],
     "RuntimeError: No CUDA GPUs are available (CUDA_VISIBLE_DEVICES is set and empty"),
    ({"CUDA_VISIBLE_DEVICES": "9"}, [],
     "RuntimeError: No CUDA GPUs are available (CUDA_VISIBLE_DEVICES='9': entry '9' names no GPU "
     "of this host; nvidia-smi lists GPUs 0, 1, 2, 3, 4, 5, 6, 7"),
    ({"CUDA_VISIBLE_DEVICES": "0,9"}, [],
     "RuntimeError: CUDA_VISIBLE_DEVICES (CUDA_VISIBLE_DEVICES='0,9': entry '9' names no GPU"),
    ({"CUDA_VISIBLE_DEVICES": "1,1"}, [], "entry '1' names it twice"),
    ({}, ["-tp", "16"],
     "Value error, World size (16) is larger than the number of available GPUs (8) in this node."),
    ({"CUDA_VISIBLE_DEVICES": "0"}, ["--tensor-parallel-size", "2"],
     "World size (2) is larger than the number of available GPUs (1) in this node."),
    ({}, ["-tp", "4", "-pp", "4"], "World size (16) is larger than the number of available GPUs (8)"),
    ({"CUDA_VISIBLE_DEVICES": "0,1,2,3"}, ["-tp", "4", "-dp", "2"],
     'Exception: Error setting CUDA_VISIBLE_DEVICES: local range: [4, 8) base value: "0,1,2,3"'),
    ({}, ["-tp", "4", "-dp", "3"],
     'Error setting CUDA_VISIBLE_DEVICES: local range: [8, 12) base value: "None"'),
    ({}, ["--distributed-executor-backend", "ray"],
     "ValueError: Failed to import Ray: No module named 'ray'"),
    ({}, ["--kv-transfer-config", '{"kv_connector": "RBLNLMCacheConnectorV1", "kv_role": "kv_both"}'],
     "ValueError: Unsupported connector type: RBLNLMCacheConnectorV1"),
    ({}, ["--kv-transfer-config", '{"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}'],
     "ImportError: No module named 'lmcache'"),
    ({}, ["--speculative-config", '{"method": "eagle3", "model": "nvidia/not-there"}'],
     "model nvidia/not-there is not in the Hugging Face cache"),
])  # fmt: skip
def test_refuses_to_start(
    gpu_venv: Path, env: dict[str, str], extra_env: dict[str, str], args: list[str], message: str
) -> None:
    proc = vllm(gpu_venv, MODEL, *args, env=dict(env, **extra_env))
    assert proc.returncode == 1 and message in proc.stderr, proc.stderr


def test_refuses_without_gpu_or_model(gpu_venv: Path, root: Path, env: dict[str, str]) -> None:
    # an RBLN host (or a GPU host without its driver): no nvidia-smi
    no_driver = dict(env, PATH=env["PATH"].split(":", 1)[1])
    proc = vllm(gpu_venv, MODEL, env=no_driver)
    assert (
        proc.returncode == 1
        and (
            "RuntimeError: No CUDA GPUs are available (nvidia-smi not found: is the NVIDIA driver "
            "installed?)"
        )
        in proc.stderr
    )
    # the GPU check comes before the model's, as vLLM's platform detection does
    proc = vllm(gpu_venv, "openai/gpt-oss-20b", env=no_driver)
    assert proc.returncode == 1 and "No CUDA GPUs are available" in proc.stderr
    (root / "etc/rbln-sim/hardware.json").write_text('{"sku": "RBLN-CR13", "devices": 4}')
    proc = vllm(gpu_venv, MODEL, env=env)  # nvidia-smi there, but no GPU description
    assert (
        proc.returncode == 1
        and "No CUDA GPUs are available (nvidia-smi exited 9: NVIDIA-SMI" in (proc.stderr)
    )


def test_refuses_a_missing_model_and_rbln_flags(gpu_venv: Path, env: dict[str, str]) -> None:
    proc = vllm(gpu_venv, "openai/gpt-oss-20b", env=env)
    assert proc.returncode == 1 and "model openai/gpt-oss-20b is not in the Hugging Face cache" in (
        proc.stderr
    )
    # the CUDA build parses with upstream vLLM's table, whatever /etc/rbln-sim/platform says
    for platform in ("upstream", "rbln"):
        (Path(env["RBLN_SIM_ROOT"]) / "etc/rbln-sim/platform").write_text(platform)
        proc = vllm(gpu_venv, MODEL, "--rbln-use-w8a8", env=env)
        assert proc.returncode == 2 and "unrecognized arguments: --rbln-use-w8a8" in proc.stderr


def test_refuses_a_cpu_or_other_torch(
    gpu_venv: Path, out: Path, env: dict[str, str], tmp_path: Path
) -> None:
    for name, wheel in [("cpu", out / "index/torch/torch-2.13.0+cpu-py3-none-any.whl"),
                        ("other", None)]:  # fmt: skip
        python = derived_venv(gpu_venv, tmp_path / name, drop=("torch",) if wheel else (),
                              wheels=(wheel,) if wheel else ())  # fmt: skip
        if wheel is None:  # torch 2.12.0 in place of 2.13.0
            init = (
                next((tmp_path / name / "lib").glob("python3*/site-packages")) / "torch/__init__.py"
            )
            init.write_text(init.read_text().replace('"2.13.0"', '"2.12.0"'))
        cmd = [str(python), "-m", "vllm", "serve", MODEL]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)
        found = "2.13.0+cpu" if wheel else "2.12.0"
        assert proc.returncode == 1 and "_C.abi3.so: undefined symbol" in proc.stderr
        assert f"vllm 0.30.0 is built against torch 2.13.0 with CUDA; this is torch {found}" in (
            proc.stderr
        )


def test_fault_switches_and_suffix(gpu_venv: Path, root: Path, env: dict[str, str]) -> None:
    (root / "etc/rbln-sim/fail-start").write_text("--served-model-name doomed\n")
    proc = vllm(gpu_venv, MODEL, "--served-model-name", "doomed", env=env)
    assert proc.returncode == 1 and "simulated start failure" in proc.stderr
    assert used_mib(root) == [0] * 8  # failed before claiming
    suffix = '{"method": "suffix", "num_speculative_tokens": 3}'
    server = serve(gpu_venv, env, "--speculative-config", suffix)
    try:
        assert http(server.port, "/health")[0] == 200
        (root / "etc/rbln-sim/fail-health").write_text("")
        assert http(server.port, "/health")[0] == 500
    finally:
        assert server.stop()[0] == 0
