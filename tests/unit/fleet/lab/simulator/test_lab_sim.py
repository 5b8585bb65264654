"""The simulator's RBLN stack (lab/simulator/): artifacts, wheel metadata, the driver runfile,
rbln-smi/lspci and the simulated ``vllm serve``. Runs on this machine, no namespaces: every
simulation path goes under $RBLN_SIM_ROOT, pip runs isolated against the built directories.
The fixtures are sim_fixtures.py's."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import tarfile
import time
import zipfile
from pathlib import Path
from typing import Any

import pytest
from lab_sim_support import (
    SIMULATOR,
    derived_venv,
    extract_model,
    free_port,
    http,
    metadata,
    pip,
)
from preflight_cases import run_preflight
from sim_fixtures import DRAFT, MODEL, all_prereqs, run_runfile, serve, vllm

from servefleet.base.vllm_reference import reference

LMCACHE = '{"kv_connector": "RBLNLMCacheConnectorV1", "kv_role": "kv_both"}'
SUFFIX = '{"method": "suffix", "num_speculative_tokens": 3}'


# ---------------------------------------------------------------------------------------------
# Artifacts and metadata


def test_build_is_keyed_and_fast_when_unchanged(
    builder: Any, out: Path, manifest: dict[str, Any]
) -> None:
    start = time.monotonic()
    again = builder.build(out)
    assert time.monotonic() - start < 2
    assert again == manifest
    assert manifest["kernel_headers_package"] == f"linux-headers-{os.uname().release}"
    for version in ("3.5.1", "3.6.0"):
        entry = manifest["driver"][version]
        assert entry["path"] == f"driver/rebellions-x86_64-{version}.run"
        data = (out / "files" / entry["path"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == entry["sha256"]
    debs = sorted(p.name for p in (out / "apt").glob("*.deb"))
    assert debs[0].startswith("dkms_") and debs[1].startswith(
        manifest["kernel_headers_package"] + "_"
    )


def test_model_store_covers_recipes_in_hf_layout(
    out: Path, manifest: dict[str, Any], tmp_path: Path
) -> None:
    assert {
        MODEL,
        DRAFT,
        "openai/gpt-oss-20b",
        "zai-org/GLM-5.2",
        "RedHatAI/GLM-5.2-speculator.dspark",
        "meta-llama/Llama-3.3-70B-Instruct",
    } <= set(manifest["models"])
    entry = manifest["models"][DRAFT]
    assert entry["path"] == "models/nvidia/gpt-oss-120b-Eagle3-v3.tar.gz"
    extract_model(out / "files" / entry["path"], tmp_path)
    repo = tmp_path / "hub" / "models--nvidia--gpt-oss-120b-Eagle3-v3"
    assert (repo / "refs" / "main").read_text() == entry["revision"]
    snap = repo / "snapshots" / entry["revision"]
    assert json.loads((snap / "config.json").read_text())["_name_or_path"] == DRAFT
    assert (snap / "model.safetensors").stat().st_size > 0


def _wheel(directory: Path, stem: str) -> Path:
    """The first (by name) wheel of ``stem`` (``dist-version``) in directory, whatever its tag."""
    found = sorted(directory.glob(f"{stem}-*.whl"))
    assert found, f"no {stem} wheel in {directory}"
    return found[0]


def _requires(wheel: Path) -> list[str]:
    return [v for k, v in metadata(wheel) if k == "Requires-Dist"]


@pytest.mark.parametrize(("version", "nxt"), [("0.12.0", "0.12.1"), ("0.12.1", "0.12.2")])
def test_vllm_rbln_metadata(out: Path, version: str, nxt: str) -> None:
    wheel = out / "index/public" / f"vllm_rbln-{version}-py3-none-any.whl"
    meta = metadata(wheel)
    assert ("Name", "vllm-rbln") in meta and ("Version", version) in meta
    rng = f"<{nxt},>={version}"
    assert _requires(wheel) == [
        "vllm==0.30.0+cpu",
        "torch",
        f'torch-rbln{rng}; platform_machine == "x86_64"',
        f"optimum-rbln{rng}",
        f'rebel-compiler{rng}; extra == "runtime"',
        f'nixl-rbln{rng}; extra == "kv-connectors"',
        f'lmcache-rbln{rng}; extra == "kv-connectors"',
    ]
    assert [v for k, v in meta if k == "Provides-Extra"] == ["runtime", "kv-connectors"]


def test_other_wheels_metadata_and_record(out: Path) -> None:
    idx = out / "index"
    for dist in ("optimum_rbln", "torch_rbln"):
        assert _requires(_wheel(idx / "public", f"{dist}-0.12.1"))[0] == "torch==2.13.0+cpu"
    # vllm downloads models: the real huggingface_hub comes with it
    want = ["torch==2.13.0+cpu", "huggingface-hub>=0.33.0"]
    assert _requires(_wheel(idx / "vllm", "vllm-0.30.0+cpu")) == want
    imports = {
        "private/rebel_compiler-0.12.1": "rebel/__init__.py",
        "private/lmcache_rbln-0.12.1": "lmcache_rbln/__init__.py",
        "private/nixl_rbln-0.12.1": "nixl_rbln/__init__.py",
        "public/optimum_rbln-0.12.1": "optimum/rbln/__init__.py",
        "public/torch_rbln-0.12.1": "torch_rbln/__init__.py",
        "public/vllm_rbln-0.12.1": "vllm_rbln/__init__.py",
    }
    for stem, module in imports.items():
        sub, _, dist = stem.partition("/")
        with zipfile.ZipFile(_wheel(idx / sub, dist)) as zf:
            text = zf.read(module).decode()
            assert '__version__ = "0.12.1"' in text and "SIMULATION" in text
            record = zf.read(next(n for n in zf.namelist() if n.endswith("RECORD"))).decode()
            for line in record.splitlines():
                name, digest, size = line.rsplit(",", 2)
                if digest:
                    data = zf.read(name)
                    assert int(size) == len(data)
                    raw = hashlib.sha256(data).digest()
                    import base64

                    assert digest == "sha256=" + base64.urlsafe_b64encode(raw).rstrip(b"=").decode()
    with tarfile.open(idx / "public/arctic_inference-0.1.1.tar.gz") as tar:
        pyproject = tar.extractfile("arctic_inference-0.1.1/pyproject.toml").read().decode()  # type: ignore[union-attr]
        setup = tar.extractfile("arctic_inference-0.1.1/setup.py").read().decode()  # type: ignore[union-attr]
        names = tar.getnames()
    assert 'requires = ["setuptools>=61", "torch"]' in pyproject  # its build imports torch
    assert "import torch" in setup and '"-std=c++20"' in setup  # and compiles C++20
    assert "arctic_inference-0.1.1/csrc/suffix.cpp" in names


def test_vllm_wheel_carries_the_flag_dumps(out: Path) -> None:
    """The simulated vllm carries its version's reference data (servefleet/reference/vllm),
    verbatim, where the simulator reads it (vllm/flags/)."""
    with zipfile.ZipFile(_wheel(out / "index/vllm", "vllm-0.30.0+cpu")) as zf:
        carried = {n: zf.read(n) for n in zf.namelist() if n.startswith("vllm/flags/")}
    assert carried == {f"vllm/flags/{p.name}": p.read_bytes() for p in reference().files()}
    # two flag tables, the env vars, two config schemas, chat templates, the parser registries,
    # the real metrics and routes
    assert len(carried) == 9


def test_squatters_outrank_private_packages(out: Path, venv: Path) -> None:
    idx = out / "index"
    links = [
        a
        for sub in ("private", "public", "vllm", "assets", "torch")
        for a in ("--find-links", str(idx / sub))
    ]
    report = pip(
        venv / "bin/python",
        "install",
        "--dry-run",
        "--ignore-installed",
        "--quiet",
        "--report",
        "-",
        "--no-index",
        *links,
        "vllm-rbln[kv-connectors]==0.12.0",
    )
    chosen = {
        i["metadata"]["name"]: i["metadata"]["version"]
        for i in json.loads(report.stdout)["install"]
    }
    assert chosen["lmcache-rbln"] == "0.12.0.post1"
    assert chosen["nixl-rbln"] == "0.12.0.post1"
    assert chosen["vllm"] == "0.30.0+cpu" and chosen["torch"] == "2.13.0+cpu"


def test_installed_stack_imports(venv: Path) -> None:
    code = (
        "import importlib, json, importlib.metadata as md\n"
        "mods = ['rebel','vllm_rbln','lmcache_rbln','nixl_rbln','optimum.rbln','torch_rbln',"
        "'arctic_inference','arctic_inference.suffix_decoding','torch','vllm']\n"
        "print(json.dumps({m: [getattr(importlib.import_module(m), '__version__', None),"
        " getattr(importlib.import_module(m), '__servefleet_squatter__', False)] for m in mods}))\n"
    )
    proc = subprocess.run([str(venv / "bin/python"), "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got["rebel"] == ["0.12.0", False] and got["lmcache_rbln"] == ["0.12.0", False]
    assert got["arctic_inference"][0] == "0.1.1" and got["vllm"][0] == "0.30.0+cpu"
    assert got["optimum.rbln"][0] == "0.12.0" and got["arctic_inference.suffix_decoding"][0] is None


# ---------------------------------------------------------------------------------------------
# Driver runfile, rbln-smi, lspci


def test_runfile_arguments_and_prerequisites(
    out: Path, manifest: dict[str, Any], fakebin: Path, tmp_path: Path
) -> None:
    runfile = out / "files" / manifest["driver"]["3.6.0"]["path"]
    bad = run_runfile(runfile, tmp_path, fakebin, all_prereqs(), "--silent", "--force")
    assert (
        bad.returncode == 2 and "unknown option: --force" in bad.stderr and "usage:" in bad.stderr
    )
    assert run_runfile(runfile, tmp_path, fakebin, all_prereqs()).returncode == 2
    no_dkms = run_runfile(
        runfile, tmp_path, fakebin, f"linux-headers-{os.uname().release}", "--silent"
    )
    assert no_dkms.returncode == 1 and "package dkms is not installed" in no_dkms.stderr
    no_headers = run_runfile(runfile, tmp_path, fakebin, "dkms", "--silent")
    assert no_headers.returncode == 1 and f"linux-headers-{os.uname().release}" in no_headers.stderr
    assert not (tmp_path / "usr/bin/rbln-smi").exists()


def test_runfile_install_same_and_other_version(
    out: Path, manifest: dict[str, Any], fakebin: Path, tmp_path: Path
) -> None:
    files = out / "files"
    first = run_runfile(
        files / manifest["driver"]["3.5.1"]["path"], tmp_path, fakebin, all_prereqs(), "--silent"
    )
    assert first.returncode == 0, first.stderr
    smi = tmp_path / "usr/bin/rbln-smi"
    assert json.loads((tmp_path / "etc/rbln-sim/driver.json").read_text())["version"] == "3.5.1"
    assert oct((tmp_path / "run/rbln-sim").stat().st_mode & 0o7777) == "0o1777"
    assert oct((tmp_path / "var/log/rbln-sim").stat().st_mode & 0o7777) == "0o1777"
    assert "d /run/rbln-sim 1777" in (tmp_path / "etc/tmpfiles.d/rbln-sim.conf").read_text()
    before = smi.stat().st_mtime_ns
    again = run_runfile(
        files / manifest["driver"]["3.5.1"]["path"], tmp_path, fakebin, all_prereqs(), "--silent"
    )
    assert again.returncode == 0 and "already installed" in again.stdout
    assert smi.stat().st_mtime_ns == before
    other = run_runfile(
        files / manifest["driver"]["3.6.0"]["path"], tmp_path, fakebin, all_prereqs(), "--silent"
    )
    assert other.returncode == 0 and "Replacing RBLN driver 3.5.1 with 3.6.0" in other.stdout
    env = dict(os.environ, RBLN_SIM_ROOT=str(tmp_path))
    proc = subprocess.run([str(smi), "-j"], capture_output=True, text=True, env=env)
    assert json.loads(proc.stdout) == {"KMD_version": "3.6.0", "devices": []}


def test_rbln_smi_json_shape(simroot: Path) -> None:
    env = dict(os.environ, RBLN_SIM_ROOT=str(simroot))
    proc = subprocess.run(
        [str(simroot / "usr/bin/rbln-smi"), "-j"], capture_output=True, text=True, env=env
    )
    data = json.loads(proc.stdout)
    assert data["KMD_version"] == "3.5.1"
    assert [d["device"] for d in data["devices"]] == ["rbln0", "rbln1", "rbln2", "rbln3"]
    dev = data["devices"][1]
    assert dev["npu"] == 1 and dev["name"] == "RBLN-CR13"
    assert dev["pci"]["dev"] == "2130" and dev["pci"]["bus_id"] == "0000:04:00.0"
    assert dev["memory"]["total"] == str(140 * 1024**3) and dev["memory"]["used"] == "0"
    bad = subprocess.run(
        [str(simroot / "usr/bin/rbln-smi"), "-x"], capture_output=True, text=True, env=env
    )
    assert bad.returncode == 2


def test_rbln_smi_answers_from_its_cache_only_while_hardware_json_is_unchanged(
    out: Path, manifest: dict[str, Any], fakebin: Path, tmp_path: Path
) -> None:
    runfile = out / "files" / manifest["driver"]["3.5.1"]["path"]
    assert run_runfile(runfile, tmp_path, fakebin, all_prereqs(), "--silent").returncode == 0
    env = dict(os.environ, RBLN_SIM_ROOT=str(tmp_path))
    hardware = tmp_path / "etc/rbln-sim/hardware.json"

    def npus() -> int:
        proc = subprocess.run([str(tmp_path / "usr/bin/rbln-smi"), "-j"], capture_output=True,
                              text=True, env=env, check=True)  # fmt: skip
        return len(json.loads(proc.stdout)["devices"])

    for count in (2, 2, 3, 1):
        hardware.write_text(
            json.dumps({"sku": "RBLN-CR13", "pci_device": "2130", "devices": count})
        )
        assert npus() == count and npus() == count  # rendered, then from the cache
    assert list((tmp_path / "run/rbln-sim").glob("rbln-smi.json.*"))
    table = subprocess.run([str(tmp_path / "usr/bin/rbln-smi")], capture_output=True, text=True,
                           env=env)  # fmt: skip
    assert table.returncode == 0 and table.stdout.count("RBLN-CR13") == 1


def test_lspci_stand_in(simroot: Path) -> None:
    env = dict(os.environ, RBLN_SIM_ROOT=str(simroot))

    def lspci(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(SIMULATOR / "sim/lspci"), *args], capture_output=True, text=True, env=env
        )

    lines = lspci("-n").stdout.splitlines()
    assert "03:00.0 1200: 1eff:2130" in lines and len(lines) == 5
    assert lspci("-n", "-d", "1eff:").stdout.splitlines() == [
        "03:00.0 1200: 1eff:2130",
        "04:00.0 1200: 1eff:2130",
        "05:00.0 1200: 1eff:2130",
        "06:00.0 1200: 1eff:2130",
    ]
    assert lspci("-nn", "-d1eff:2130").stdout.startswith(
        "03:00.0 Processing accelerators [1200]: Rebellions Inc. Device [1eff:2130]"
    )
    assert lspci("-v").returncode == 2


# ---------------------------------------------------------------------------------------------
# The simulated vllm serve


def test_rejects_unknown_flag_bad_value_and_bad_json(venv: Path, sim_env: dict[str, str]) -> None:
    python = venv / "bin/python"
    unknown = vllm(python, MODEL, "--no-such-flag", env=sim_env)
    assert unknown.returncode == 2 and "unrecognized arguments: --no-such-flag" in unknown.stderr
    bad_int = vllm(python, MODEL, "--max-num-seqs", "eight", env=sim_env)
    assert (
        bad_int.returncode == 2 and "argument --max-num-seqs: invalid int value" in bad_int.stderr
    )
    bad_json = vllm(python, MODEL, "--kv-transfer-config={nope", env=sim_env)
    assert (
        bad_json.returncode == 2
        and "argument --kv-transfer-config: 1 validation error for KVTransferConfig\n  Invalid JSON: "
        in bad_json.stderr
    )
    bad_choice = vllm(python, MODEL, "--dtype", "magic", env=sim_env)
    assert bad_choice.returncode == 2 and "invalid choice: 'magic'" in bad_choice.stderr


def test_platform_file_selects_the_flag_table(
    venv: Path, simroot: Path, sim_env: dict[str, str]
) -> None:
    python = venv / "bin/python"
    # past the parser, the start stops at the model missing from the HF cache (exit 1)
    args = ("openai/gpt-oss-20b", "--rbln-use-w8a8")
    assert vllm(python, *args, env=sim_env).returncode == 1
    (simroot / "etc/rbln-sim/platform").write_text("upstream\n")
    proc = vllm(python, *args, env=sim_env)
    assert proc.returncode == 2 and "unrecognized arguments: --rbln-use-w8a8" in proc.stderr
    (simroot / "etc/rbln-sim/platform").write_text("cuda\n")
    proc = vllm(python, *args, env=sim_env)
    assert proc.returncode == 1 and "names platform 'cuda'" in proc.stderr


def test_unknown_vllm_env_vars(sim: Any) -> None:
    env = {"VLLM_TYPO": "1", "VLLM_CACHE_ROOT": "/c", "VLLM_RBLN_SUB_BLOCK_CACHE": "0", "HOME": "/"}
    assert sim.unknown_env_vars(env, "rbln") == ["VLLM_TYPO"]
    # vLLM itself knows no VLLM_RBLN_* variable: on a GPU host they are typos too
    assert sim.unknown_env_vars(env, "upstream") == ["VLLM_RBLN_SUB_BLOCK_CACHE", "VLLM_TYPO"]


def test_warns_of_an_unknown_vllm_env_var(venv: Path, sim_env: dict[str, str]) -> None:
    env = dict(sim_env, VLLM_TYPO="1", VLLM_ENGINE_READY_TIMEOUT_S="600")
    proc = vllm(venv / "bin/python", "openai/gpt-oss-20b", env=env)
    warnings = [line for line in proc.stderr.splitlines() if "Unknown vLLM environment" in line]
    assert proc.returncode == 1 and len(warnings) == 1
    assert warnings[0].startswith("WARNING ")
    assert warnings[0].endswith("Unknown vLLM environment variable detected: VLLM_TYPO")


def test_preflight_runs_unchanged_under_the_installed_wheel(
    venv: Path, sim_env: dict[str, str]
) -> None:
    """remote/preflight.py under a release's python: the wheel's vLLM entry points, its
    version as the pin, its flag table and checks (tests/unit/base/remote/test_preflight.py: the
    details)."""
    unit_env = {k: sim_env[k] for k in ("RBLN_SIM_ROOT", "HF_HOME", "RBLN_VISIBLE_DEVICES")}
    ok = ["vllm", "serve", MODEL, "--chat-template", "template_chatml.jinja", "-cc.mode", "3"]
    ok += ["--speculative-config.method", "eagle3", "--rbln-use-w8a8"]
    key = ["vllm", "serve", MODEL, "--kv-transfer-config", '{"kv_role": "kv_both", "x": 1}']
    instances = [
        {"unit": "servefleet-vllm-0.service", "argv": ok, "env": unit_env},
        {"unit": "servefleet-vllm-1.service", "argv": key, "env": unit_env},
    ]
    status, (first, second), err = run_preflight(instances, python=str(venv / "bin/python"))
    assert status == 1, err
    assert first == {"unit": "servefleet-vllm-0.service", "ok": True}
    assert second["line"] == (
        "servefleet-vllm-1.service: --kv-transfer-config: argument --kv-transfer-config: 1 "
        "validation error for KVTransferConfig x Unexpected keyword argument "
        "[type=unexpected_keyword_argument, input_value=1, input_type=int]"
    )
    assert second["gap"] == (
        "the recipe needs a newer vLLM than the pin 0.30.0 (key x of --kv-transfer-config is "
        "not in it)"
    )


def test_needs_lmcache_for_lmcache_connector(
    venv: Path, sim_env: dict[str, str], tmp_path: Path
) -> None:
    python = derived_venv(venv, tmp_path / "v", drop=("lmcache_rbln",))
    proc = vllm(python, MODEL, "--kv-transfer-config", LMCACHE, env=sim_env)
    assert proc.returncode == 1
    assert "ImportError: No module named 'lmcache_rbln'" in proc.stderr


def test_needs_arctic_for_suffix_and_rebel_always(
    venv: Path, sim_env: dict[str, str], tmp_path: Path
) -> None:
    python = derived_venv(venv, tmp_path / "v", drop=("arctic_inference", "rebel"))
    proc = vllm(python, MODEL, "--speculative-config", SUFFIX, env=sim_env)
    assert proc.returncode == 1 and "No module named 'rebel'" in proc.stderr
    python = derived_venv(venv, tmp_path / "w", drop=("arctic_inference",))
    proc = vllm(python, MODEL, "--speculative-config", SUFFIX, env=sim_env)
    assert proc.returncode == 1 and "No module named 'arctic_inference'" in proc.stderr


def test_refuses_next_to_a_squatter(
    venv: Path, out: Path, sim_env: dict[str, str], tmp_path: Path
) -> None:
    wheel = out / "index/public/lmcache_rbln-0.12.0.post1-py3-none-any.whl"
    python = derived_venv(venv, tmp_path / "v", drop=("lmcache_rbln",), wheels=(wheel,))
    proc = vllm(python, MODEL, env=sim_env)
    assert proc.returncode == 1
    assert "module lmcache_rbln" in proc.stderr and "squatter" in proc.stderr


def test_refuses_mismatched_rebel(
    venv: Path, out: Path, sim_env: dict[str, str], tmp_path: Path
) -> None:
    wheel = out / "index/private/rebel_compiler-0.12.1-py3-none-any.whl"
    python = derived_venv(venv, tmp_path / "v", drop=("rebel",), wheels=(wheel,))
    # a rebel of another minor (0.13) must be refused
    sp = next((tmp_path / "v/lib").glob("python3*/site-packages"))
    init = sp / "rebel/__init__.py"
    init.write_text(init.read_text().replace('"0.12.1"', '"0.13.0"'))
    proc = vllm(python, MODEL, env=sim_env)
    assert proc.returncode == 1 and "rebel 0.13.0 does not match vllm_rbln 0.12.0" in proc.stderr


def test_refuses_without_model_or_draft(
    venv: Path, sim_env: dict[str, str], tmp_path: Path
) -> None:
    python = venv / "bin/python"
    proc = vllm(python, "openai/gpt-oss-20b", env=sim_env)
    assert (
        proc.returncode == 1
        and "model openai/gpt-oss-20b is not in the Hugging Face cache" in proc.stderr
    )
    spec = '{"method": "eagle3", "model": "nvidia/not-there", "num_speculative_tokens": 3}'
    proc = vllm(python, MODEL, "--speculative-config", spec, env=sim_env)
    assert proc.returncode == 1 and "model nvidia/not-there is not in" in proc.stderr


def test_devices_must_exist_and_be_free(venv: Path, sim_env: dict[str, str]) -> None:
    python = venv / "bin/python"
    proc = vllm(python, MODEL, env=dict(sim_env, RBLN_VISIBLE_DEVICES="7"))
    assert proc.returncode == 1 and "names NPU 7, but rbln-smi lists [0, 1, 2, 3]" in proc.stderr
    no_driver = dict(sim_env, PATH=sim_env["PATH"].split(":", 1)[1])
    proc = vllm(python, MODEL, env=no_driver)
    assert proc.returncode == 1 and "rbln-smi not found" in proc.stderr
    server = serve(venv, dict(sim_env, RBLN_VISIBLE_DEVICES="2"))
    try:
        proc = vllm(
            python, MODEL, "--port", str(free_port()), env=dict(sim_env, RBLN_VISIBLE_DEVICES="3,2")
        )
        assert proc.returncode == 1 and "NPU 2 (rbln2) is held by another server" in proc.stderr
    finally:
        assert server.stop()[0] == 0


def test_compiles_once_then_reuses_and_serves(
    venv: Path, simroot: Path, sim_env: dict[str, str]
) -> None:
    log = simroot / "var/log/rbln-sim/compile.log"
    lines_before = len(log.read_text().splitlines())
    server = serve(venv, sim_env, "--served-model-name", "gpt", "--max-num-seqs", "2")
    try:
        status, body = http(server.port, "/health")
        assert status == 200
        models = json.loads(http(server.port, "/v1/models")[1])
        assert [m["id"] for m in models["data"]] == ["gpt"]
        req = {"model": "gpt", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 5}
        status, body = http(server.port, "/v1/chat/completions", req)
        reply = json.loads(body)
        assert status == 200 and reply["usage"]["completion_tokens"] == 5
        assert len(reply["choices"][0]["message"]["content"].split()) == 5
        assert reply == json.loads(http(server.port, "/v1/chat/completions", req)[1]) | {
            "created": reply["created"]
        }
        assert http(server.port, "/v1/chat/completions", dict(req, model="x"))[0] == 404
        metrics = http(server.port, "/metrics")[1].decode()
        assert (
            'vllm:request_success_total{engine="0",finished_reason="length",model_name="gpt"} 2.0'
            in metrics
        )
        record = json.loads((simroot / f"run/rbln-sim/vllm-{server.port}.json").read_text())
        assert record["argv"][0].endswith("/vllm") and record["argv"][1:3] == ["serve", MODEL]
        assert record["env"]["HF_HUB_OFFLINE"] == "1" and record["env"]["PATH"] == sim_env["PATH"]
    finally:
        code, err = server.stop()
    assert code == 0 and "compiling" in err
    lines = log.read_text().splitlines()[lines_before:]
    assert len(lines) == 1 and f"model={MODEL}" in lines[0] and f"port={server.port}" in lines[0]
    bundles = list(Path(sim_env["VLLM_CACHE_ROOT"]).glob("rbln/*/*/rank0/mega_cache.bin"))
    assert len(bundles) == 1 and bundles[0].parts[-4].startswith("openai_gpt-oss-120b-")
    # a second start with only ports/serving names changed hits the cache
    start = time.monotonic()
    server = serve(venv, sim_env, "--max-num-seqs", "2")
    took = time.monotonic() - start
    code, err = server.stop()
    assert code == 0 and "Loaded rbln mega-cache bundle" in err and took < 5
    assert len(log.read_text().splitlines()) == lines_before + 1


def test_fault_switch_rule(sim: Any, tmp_path: Path) -> None:
    env = {"RBLN_SIM_ROOT": str(tmp_path)}
    argv = ["/v/bin/vllm", "serve", MODEL, "--port", "8001"]
    switch = tmp_path / "etc/rbln-sim/fail-health"
    switch.parent.mkdir(parents=True)
    assert sim.fault_switch(env, "fail-health", argv) is None  # no file
    for text in ("", "\n", "\n\n"):  # no text: every process
        switch.write_text(text)
        assert sim.fault_switch(env, "fail-health", argv) == f"{switch} exists"
    for text, hit in [
        ("--port 8001\n", True),
        ("--port 8002", False),
        ("serve openai/", True),
        ("serve\n--port 8001\n", True),  # every line must be in the command line
        ("serve\n--port 8002\n", False),
    ]:
        switch.write_text(text)
        assert (sim.fault_switch(env, "fail-health", argv) is not None) == hit, text
    switch.write_text("--port  8001")  # argv joined by single spaces
    assert sim.fault_switch(env, "fail-health", argv) is None


def test_fault_switches(venv: Path, simroot: Path, sim_env: dict[str, str]) -> None:
    python = venv / "bin/python"
    fail_start = simroot / "etc/rbln-sim/fail-start"
    fail_start.touch()
    proc = vllm(python, MODEL, env=sim_env)
    assert proc.returncode == 1 and "simulated start failure" in proc.stderr
    fail_start.write_text("--served-model-name doomed\n")  # only the matching command line
    proc = vllm(python, MODEL, "--served-model-name", "doomed", env=sim_env)
    assert proc.returncode == 1 and "simulated start failure" in proc.stderr
    assert "matches '--served-model-name doomed'" in proc.stderr
    with contextlib.ExitStack() as servers:
        first = serve(venv, sim_env)  # does not match: starts
        servers.callback(first.stop)
        second = serve(venv, dict(sim_env, RBLN_VISIBLE_DEVICES="1"))
        servers.callback(second.stop)
        assert http(first.port, "/health")[0] == http(second.port, "/health")[0] == 200
        fail_health = simroot / "etc/rbln-sim/fail-health"
        fail_health.write_text(f"--port {first.port}\n")  # only the server on that port
        assert http(first.port, "/health")[0] == 500
        assert http(second.port, "/health")[0] == 200
        fail_health.write_text("")
        assert http(first.port, "/health")[0] == http(second.port, "/health")[0] == 500


# ---------------------------------------------------------------------------------------------
# The cache key (independent of the product's fingerprint; compared with it elsewhere)


def test_cache_key_inputs(sim: Any) -> None:
    base = [
        "vllm",
        "serve",
        MODEL,
        "--max-model-len",
        "131072",
        "--max-num-seqs",
        "1",
        "--block-size",
        "4096",
        "--no-enable-prefix-caching",
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "openai",
    ]
    env = {"RBLN_VISIBLE_DEVICES": "0"}

    def key(
        argv: list[str] = base,
        e: dict[str, str] = env,
        npu: str = "RBLN-CR13",
        rebel: str = "0.12.0",
    ) -> str:
        return str(sim.cache_key(argv, e, npu, rebel))

    k = key()
    assert len(k) == 16 and int(k, 16) >= 0
    same = [
        key(base + ["--port", "8001", "--host", "127.0.0.1", "--served-model-name", "a"]),
        key([a for a in base if a not in ("--no-enable-prefix-caching",)]),
        key(base[:-3]),  # tool calling off
        key(
            base,
            dict(env, VLLM_RBLN_SUB_BLOCK_CACHE="0", LMCACHE_CHUNK_SIZE="256", PYTHONHASHSEED="42"),
        ),
        key(base + ["--rbln-use-custom-sampler"]),
        key(rebel="0.12.1"),
        key(base[2:]),  # without the launcher
    ]
    assert same == [k] * len(same)
    different = [
        key(base + ["--kv-transfer-config", LMCACHE]),
        key(base + ["--gpu-memory-utilization", "0.8"]),
        key([a if a != "1" else "8" for a in base]),
        key(base + ["--speculative-config", SUFFIX]),
        key(
            base
            + [
                "--speculative-config",
                json.dumps({"method": "eagle3", "model": DRAFT, "num_speculative_tokens": 3}),
            ]
        ),
        key(base, dict(env, RBLN_VISIBLE_DEVICES="0,1")),
        key(base, dict(env, VLLM_RBLN_USE_DEVICE_TENSOR="0")),
        key(base, dict(env, VLLM_RBLN_USE_DYNAMIC_KV_CACHE="0")),
        key(base + ["--no-rbln-use-dynamic-kv-cache"]),
        key(npu="RBLN-CA22"),
        key(rebel="0.13.0"),
        key(["vllm", "serve", "./gpt-oss-120b", *base[3:]]),
        key(base + ["--num-gpu-blocks-override", "100"]),
    ]
    assert k not in different
    assert len(set(different)) == len(different) - 1  # the two dynamic-KV spellings agree
    # the connector's own settings do not count, only its presence
    other_role = '{"kv_connector": "RBLNLMCacheConnectorV1", "kv_role": "kv_producer"}'
    assert key(base + ["--kv-transfer-config", other_role]) == different[0]


def test_cache_key_rejects_bad_argv(sim: Any) -> None:
    with pytest.raises(SystemExit) as exc:
        sim.cache_key(["serve", MODEL, "--bogus"], {}, "RBLN-CR13", "0.12.0")
    assert exc.value.code == 2


def test_bundle_path_layout(sim: Any) -> None:
    path = sim.bundle_path("/c", "openai/gpt-oss-120b", "0123456789abcdef")
    digest = hashlib.sha1(b"openai/gpt-oss-120b").hexdigest()[:8]
    assert path == f"/c/rbln/openai_gpt-oss-120b-{digest}/0123456789abcdef/rank0/mega_cache.bin"
