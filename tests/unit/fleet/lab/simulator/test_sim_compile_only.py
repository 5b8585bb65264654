"""The simulated ``vllm serve`` (src/servefleet/fleet/lab/simulator/packages/vllm/) in vllm-rbln's
compile-only mode (``VLLM_RBLN_COMPILE_ONLY=1``: compile and cache on a dummy device, no NPU;
rbln.md §3.5-3.6) and with a corrupt mega-cache bundle (logged, then compiled again). No namespaces: every
simulation path goes under $RBLN_SIM_ROOT, as in test_lab_sim.py (sim_fixtures.py's fixtures)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
from lab_sim_support import free_port, http
from sim_fixtures import MODEL, serve, vllm

BASE = [MODEL, "--max-num-seqs", "2"]
SIG = re.compile(r"signature ([0-9a-f]{16})")


def _fake_smi(bin_dir: Path, devices: list[str] | None, calls: Path | None = None) -> str:
    """A directory with an ``rbln-smi`` that lists ``devices`` (NPU names, by index) or fails
    (None), and appends a line to ``calls`` on every run; returns a PATH holding it."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    record = f"echo run >> {calls}\n" if calls else ""
    if devices is None:
        body = "echo 'rbln-smi: driver not loaded' >&2\nexit 1\n"
    else:
        data = {
            "KMD_version": "3.5.1",
            "devices": [{"npu": i, "name": n} for i, n in enumerate(devices)],
        }
        body = f"echo '{json.dumps(data)}'\n"
    script = bin_dir / "rbln-smi"
    script.write_text("#!/bin/sh\n" + record + body)
    script.chmod(0o755)
    return f"{bin_dir}:/usr/bin:/bin"


def _sim_root(tmp_path: Path) -> Path:
    """An empty simulated host root with instant compiles (no driver, no log dir)."""
    root = tmp_path / "root"
    (root / "etc/rbln-sim").mkdir(parents=True)
    (root / "etc/rbln-sim/compile-seconds").write_text("0\n")
    return root


def _compile_lines(simroot: Path) -> list[str]:
    return (simroot / "var/log/rbln-sim/compile.log").read_text().splitlines()


def _no_driver(env: dict[str, str]) -> dict[str, str]:
    """``env`` with the simulated driver's bin dir (rbln-smi) off PATH."""
    return dict(env, PATH=env["PATH"].split(":", 1)[1])


def _sig(stderr: str) -> str:
    """The one signature a server's log names."""
    sigs = set(SIG.findall(stderr))
    assert len(sigs) == 1, stderr
    return str(sigs.pop())


# ---------------------------------------------------------------------------------------------
# In process: the switch, the target NPU, the key, the bundle


def test_compile_only_is_not_in_the_cache_key(sim: Any) -> None:
    assert sim.COMPILE_ONLY_ENV == "VLLM_RBLN_COMPILE_ONLY"
    assert sim.COMPILE_ONLY_ENV not in sim.COMPILE_ENV
    env = {"RBLN_VISIBLE_DEVICES": "0"}
    key = sim.cache_key(BASE, env, "RBLN-CR13", "0.12.0")
    for extra in (
        {"VLLM_RBLN_COMPILE_ONLY": "1"},
        {"VLLM_RBLN_COMPILE_ONLY": "true"},
        {"VLLM_RBLN_COMPILE_ONLY": "0"},
        # the forced name enters as the NPU name, never as a variable
        {"VLLM_RBLN_COMPILE_ONLY": "1", "RBLN_FORCE_NPU_NAME": "RBLN-CR13"},
        {"RBLN_TARGET_SOC": "RBLN-CA22"},
    ):
        assert sim.cache_key(BASE, {**env, **extra}, "RBLN-CR13", "0.12.0") == key, extra
    assert sim.cache_key(BASE, env, "RBLN-CA22", "0.12.0") != key


def test_compile_only_switch_and_its_conflict(sim: Any) -> None:
    assert sim.compile_only({}) is False
    for value, on in [("1", True), ("true", True), ("TRUE", True), ("0", False), ("yes", False)]:
        assert sim.compile_only({"VLLM_RBLN_COMPILE_ONLY": value}) is on, value
    # without compile-only a disabled cache is fine; with it, both disabled values refuse
    assert sim.compile_only({"VLLM_DISABLE_COMPILE_CACHE": "1"}) is False
    on = {"VLLM_RBLN_COMPILE_ONLY": "1", "VLLM_DISABLE_COMPILE_CACHE": "0"}
    assert sim.compile_only(on) is True
    with pytest.raises(sim.SimError) as exc:
        sim.compile_only(dict(on, VLLM_DISABLE_COMPILE_CACHE="1"))
    message = str(exc.value)
    assert "\n" not in message and exc.value.code == 1
    assert "VLLM_RBLN_COMPILE_ONLY=1 is incompatible with VLLM_DISABLE_COMPILE_CACHE=1" in message


def test_compile_only_target_npu(sim: Any, tmp_path: Path) -> None:
    calls = tmp_path / "calls"
    path = _fake_smi(tmp_path / "bin", ["RBLN-CR13", "RBLN-CA22"], calls)
    # a forced name wins and rbln-smi is not run; the legacy name counts when the new one is unset
    assert sim.compile_only_target({"PATH": path, "RBLN_FORCE_NPU_NAME": "RBLN-CA25"}) == (
        "RBLN-CA25",
        "RBLN_FORCE_NPU_NAME",
    )
    both = {"PATH": path, "RBLN_FORCE_NPU_NAME": "RBLN-CA25", "RBLN_TARGET_SOC": "RBLN-CA12"}
    assert sim.compile_only_target(both)[0] == "RBLN-CA25"
    legacy = {"PATH": path, "RBLN_FORCE_NPU_NAME": "", "RBLN_TARGET_SOC": "RBLN-CA12"}
    assert sim.compile_only_target(legacy) == ("RBLN-CA12", "RBLN_TARGET_SOC")
    assert not calls.exists()
    # else rbln-smi's name of the first visible NPU (any listed one when it names none present)
    assert sim.compile_only_target({"PATH": path}) == ("RBLN-CR13", "rbln-smi, NPU 0")
    assert sim.compile_only_target({"PATH": path, "RBLN_VISIBLE_DEVICES": "1,0"})[0] == "RBLN-CA22"
    assert sim.compile_only_target({"PATH": path, "RBLN_VISIBLE_DEVICES": "7"})[0] == "RBLN-CR13"
    assert len(calls.read_text().splitlines()) == 3


@pytest.mark.parametrize(
    ("devices", "why"),
    [
        ("absent", "rbln-smi not found: is the RBLN driver installed?"),
        (None, "rbln-smi -j failed: rbln-smi: driver not loaded"),
        ([], "rbln-smi -j lists no devices"),
    ],
)
def test_compile_only_without_target_fails(
    sim: Any, tmp_path: Path, devices: Any, why: str
) -> None:
    path = str(tmp_path / "empty") if devices == "absent" else _fake_smi(tmp_path / "b", devices)
    with pytest.raises(sim.SimError) as exc:
        sim.compile_only_target({"PATH": path, "RBLN_FORCE_NPU_NAME": " "})
    assert str(exc.value) == (
        f"RuntimeError: VLLM_RBLN_COMPILE_ONLY=1 cannot tell which NPU to compile for: {why}; "
        "set RBLN_FORCE_NPU_NAME (e.g. RBLN-CR13) or the legacy RBLN_TARGET_SOC"
    )


def test_forced_name_is_ignored_next_to_an_npu(sim: Any) -> None:
    assert sim.ignored_npu_name({}, "RBLN-CR13") is None
    assert sim.ignored_npu_name({"RBLN_FORCE_NPU_NAME": "RBLN-CR13"}, "RBLN-CR13") is None
    assert (
        sim.ignored_npu_name({"RBLN_TARGET_SOC": "RBLN-CA22"}, "RBLN-CR13")
        == "RBLN_TARGET_SOC=RBLN-CA22 ignored: the runtime uses the mounted NPU, RBLN-CR13"
    )


def test_bundle_is_deterministic_and_every_flipped_byte_is_caught(sim: Any, tmp_path: Path) -> None:
    sig = "0123456789abcdef"
    data = sim.bundle_bytes(MODEL, sig)
    assert data == sim.bundle_bytes(MODEL, sig)  # two hosts, one signature: the same bytes
    assert data != sim.bundle_bytes(MODEL, "fedcba9876543210")
    assert data != sim.bundle_bytes("./gpt-oss-120b", sig)
    doc = json.loads(data)
    assert doc["simulated"] is True and doc["sig"] == sig and doc["model"] == MODEL
    assert len(bytes.fromhex(doc["payload"])) == 4096
    path = tmp_path / "mega_cache.bin"
    path.write_bytes(data)
    assert sim.bundle_fault(str(path), MODEL, sig) is None
    assert "signature" in sim.bundle_fault(str(path), MODEL, "fedcba9876543210")
    assert "model" in sim.bundle_fault(str(path), "./gpt-oss-120b", sig)
    old = json.dumps({"simulated": True, "model": MODEL, "sig": sig}).encode()  # older sim
    for bad in (b"", data[:-1], old, b"\xff" + data[1:], b"[]"):
        path.write_bytes(bad)
        assert sim.bundle_fault(str(path), MODEL, sig), bad[:40]
    path.write_bytes(data)
    with path.open("r+b", buffering=0) as fh:  # each byte flipped in place, then put back
        for mask in (0x01, 0x20, 0x80):
            for i in range(len(data)):
                os.pwrite(fh.fileno(), bytes([data[i] ^ mask]), i)
                assert sim.bundle_fault(str(path), MODEL, sig), (i, mask)
                os.pwrite(fh.fileno(), data[i : i + 1], i)
    assert path.read_bytes() == data
    path.unlink()
    path.mkdir()
    assert sim.bundle_fault(str(path), MODEL, sig).startswith("cannot read it")


def test_warm_up_recompiles_a_corrupt_bundle(sim: Any, tmp_path: Path) -> None:
    root = _sim_root(tmp_path)
    env = {"RBLN_SIM_ROOT": str(root), "VLLM_CACHE_ROOT": str(tmp_path / "cache")}
    ns = sim.parse_serve_args([*BASE, "--port", "8001"], "rbln")
    sig = "0123456789abcdef"
    logged: list[tuple[str, str]] = []

    def log(message: str, level: str = "INFO") -> None:
        logged.append((level, message))

    def warm() -> tuple[str, bool]:
        logged.clear()
        result: tuple[str, bool] = sim.warm_up(
            ns, env, sig, log, npu="RBLN-CR13", compile_only=True
        )
        return result

    bundle, compiled = warm()  # no log dir yet: a host without the driver
    assert compiled and logged[-1] == ("INFO", f"Saved rbln mega-cache bundle to {bundle}")
    assert Path(bundle).read_bytes() == sim.bundle_bytes(MODEL, sig)
    (line,) = _compile_lines(root)
    assert re.fullmatch(
        rf"\S+ model={MODEL} sig={sig} port=8001 compile_only=1 npu=RBLN-CR13 read=-", line
    )
    assert warm() == (bundle, False)  # a sound bundle: loaded, no compile
    assert logged == [("INFO", f"Loaded rbln mega-cache bundle from {bundle}")]
    assert len(_compile_lines(root)) == 1
    data = bytearray(Path(bundle).read_bytes())
    data[data.index(b'"payload":"') + 20] ^= 0x01  # one byte of the payload
    Path(bundle).write_bytes(data)
    assert warm() == (bundle, True)
    level, message = logged[0]
    assert level == "WARNING" and "\n" not in message
    assert message.startswith(
        f"failed to load rbln mega-cache bundle from {bundle}: payload sha256 "
    )
    assert message.endswith("; recompiling")
    assert len(_compile_lines(root)) == 2
    assert Path(bundle).read_bytes() == sim.bundle_bytes(MODEL, sig)  # overwritten
    assert warm() == (bundle, False)


# ---------------------------------------------------------------------------------------------
# The server (subprocesses of the test venv)


def test_compile_only_serves_without_an_npu_and_the_npu_host_hits_its_bundle(
    venv: Path, simroot: Path, sim_env: dict[str, str]
) -> None:
    before = len(_compile_lines(simroot))
    env = dict(_no_driver(sim_env), VLLM_RBLN_COMPILE_ONLY="1", RBLN_FORCE_NPU_NAME="RBLN-CR13")
    env.pop("RBLN_VISIBLE_DEVICES")  # one device in the key, as on the NPU host below
    server = serve(venv, env, *BASE[1:])
    try:
        assert http(server.port, "/health")[0] == 200
    finally:
        code, err = server.stop()
    assert code == 0, err
    sig = _sig(err)
    lines = err.splitlines()
    assert any(
        line.endswith(
            f"compile-only target RBLN-CR13 (RBLN_FORCE_NPU_NAME), no NPU claimed, "
            f"rebel 0.12.0, signature {sig}"
        )
        for line in lines
    )
    assert any("Saved rbln mega-cache bundle to " in line for line in lines)
    assert any(
        line.endswith(
            "compile-only mode (VLLM_RBLN_COMPILE_ONLY=1): running on a dummy device for RBLN-CR13"
        )
        for line in lines
    )
    assert "Unknown vLLM environment variable" not in err and "NPUs [" not in err
    (new,) = _compile_lines(simroot)[before:]
    assert re.fullmatch(
        rf"\S+ model={MODEL} sig={sig} port={server.port} compile_only=1 npu=RBLN-CR13 read=\S+",
        new,
    )
    # the NPU host, without compile-only, computes the same key and loads the bundle
    server = serve(venv, sim_env, *BASE[1:])
    code, err = server.stop()
    assert code == 0 and _sig(err) == sig and "Loaded rbln mega-cache bundle from" in err
    assert len(_compile_lines(simroot)) == before + 1


def test_compile_only_claims_and_checks_no_npu(
    venv: Path, simroot: Path, sim_env: dict[str, str], sim: Any
) -> None:
    holder = serve(venv, sim_env)  # holds NPU 0
    try:
        # NPU 0 is held and NPU 7 absent: compile-only neither claims nor checks them
        env = dict(sim_env, VLLM_RBLN_COMPILE_ONLY="1", RBLN_VISIBLE_DEVICES="0,7")
        server = serve(venv, env, *BASE[1:])
        assert http(server.port, "/health")[0] == 200
        code, err = server.stop()
    finally:
        holder.stop()
    assert code == 0, err
    assert "compile-only target RBLN-CR13 (rbln-smi, NPU 0), no NPU claimed" in err
    env = dict(sim_env, RBLN_VISIBLE_DEVICES="0,7")
    assert _sig(err) == sim.cache_key(["serve", *BASE], env, "RBLN-CR13", "0.12.0")
    (new,) = [line for line in _compile_lines(simroot) if f"sig={_sig(err)}" in line]
    assert re.search(r" compile_only=1 npu=RBLN-CR13 read=[0-9a-f]{16}$", new)


def test_compile_only_refusals(venv: Path, simroot: Path, sim_env: dict[str, str]) -> None:
    python = venv / "bin/python"
    before = len(_compile_lines(simroot))
    env = dict(_no_driver(sim_env), VLLM_RBLN_COMPILE_ONLY="1")
    proc = vllm(python, *BASE, "--port", str(free_port()), env=env)
    (error,) = [line for line in proc.stderr.splitlines() if line.startswith("ERROR ")]
    assert proc.returncode == 1 and error.endswith(
        "RuntimeError: VLLM_RBLN_COMPILE_ONLY=1 cannot tell which NPU to compile for: "
        "rbln-smi not found: is the RBLN driver installed?; set RBLN_FORCE_NPU_NAME "
        "(e.g. RBLN-CR13) or the legacy RBLN_TARGET_SOC"
    )
    env = dict(env, RBLN_TARGET_SOC="RBLN-CR13", VLLM_DISABLE_COMPILE_CACHE="1")
    proc = vllm(python, *BASE, "--port", str(free_port()), env=env)
    (error,) = [line for line in proc.stderr.splitlines() if line.startswith("ERROR ")]
    assert proc.returncode == 1
    assert "VLLM_RBLN_COMPILE_ONLY=1 is incompatible with VLLM_DISABLE_COMPILE_CACHE=1" in error
    assert len(_compile_lines(simroot)) == before


def test_forced_name_without_compile_only_uses_the_mounted_npu(
    venv: Path, simroot: Path, sim_env: dict[str, str], sim: Any
) -> None:
    server = serve(venv, dict(sim_env, RBLN_FORCE_NPU_NAME="RBLN-CA22"), *BASE[1:])
    code, err = server.stop()
    assert code == 0, err
    warnings = [line for line in err.splitlines() if line.startswith("WARNING ")]
    assert len(warnings) == 1 and warnings[0].endswith(
        "RBLN_FORCE_NPU_NAME=RBLN-CA22 ignored: the runtime uses the mounted NPU, RBLN-CR13"
    )
    assert _sig(err) == sim.cache_key(["serve", *BASE], sim_env, "RBLN-CR13", "0.12.0")
    server = serve(venv, dict(sim_env, RBLN_FORCE_NPU_NAME="RBLN-CR13"), *BASE[1:])
    code, err = server.stop()
    assert code == 0 and "WARNING " not in err


def test_server_recompiles_a_flipped_bundle_and_loads_a_sound_one(
    venv: Path, simroot: Path, sim_env: dict[str, str]
) -> None:
    before = len(_compile_lines(simroot))
    server = serve(venv, sim_env, *BASE[1:])
    code, err = server.stop()
    assert code == 0 and "Saved rbln mega-cache bundle to" in err
    (new,) = _compile_lines(simroot)[before:]
    assert re.search(r" compile_only=0 npu=RBLN-CR13 read=[0-9a-f]{16}$", new)
    (bundle,) = Path(sim_env["VLLM_CACHE_ROOT"]).glob("rbln/*/*/rank0/mega_cache.bin")
    good = bundle.read_bytes()
    # a sound bundle: loaded, no compile
    server = serve(venv, sim_env, *BASE[1:])
    code, err = server.stop()
    assert code == 0 and f"Loaded rbln mega-cache bundle from {bundle}" in err
    assert len(_compile_lines(simroot)) == before + 1
    # one flipped byte: a warning, a compile, the bundle saved again
    flipped = bytearray(good)
    flipped[len(good) // 2] ^= 0x01
    bundle.write_bytes(flipped)
    server = serve(venv, sim_env, *BASE[1:])
    code, err = server.stop()
    (warning,) = [line for line in err.splitlines() if "failed to load" in line]
    assert code == 0 and warning.startswith("WARNING ")
    assert f"failed to load rbln mega-cache bundle from {bundle}: " in warning
    assert warning.endswith("; recompiling") and "Loaded rbln" not in err
    assert f"Saved rbln mega-cache bundle to {bundle}" in err
    assert len(_compile_lines(simroot)) == before + 2
    assert bundle.read_bytes() == good
