"""`pyinfra inventories/lab.py deploys/serve.py` on the lab fleet, with the real pyinfra CLI.

Bad data (nothing may change), fresh hosts to serving, a second run that changes nothing, --dry,
selection changes, an SDK upgrade, a driver upgrade and a host of another SKU. Each test sets up
the state it starts from (fresh hosts: ``fresh``; the default data converged: ``deployed``), in
any order; in file order those set-ups change nothing. Every assertion reads state back from the
hosts (over ssh, or from each host's overlay upper dir on this machine).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from faults import DRAIN, argv_watch, make_change_cold, pyinfra, resolved, secrets
from labhelpers import lab_up, on_host

from servefleet.fleet.lab import layout
from servefleet.fleet.lab.chat import chat_once

REPO = Path(__file__).resolve().parents[2]
PYINFRA = str(Path(sys.executable).parent / "pyinfra")
HOSTS = ("lab1", "lab2", "lab3")
UNITS = [f"servefleet-vllm-{i}.service" for i in range(4)]
PORTS = [8000 + i for i in range(4)]
# variables systemd itself gives every service (User= adds USER/LOGNAME/SHELL; HOME is ours)
SYSTEMD_ENV = {
    "PATH",
    "LANG",
    "INVOCATION_ID",
    "JOURNAL_STREAM",
    "SYSTEMD_EXEC_PID",
    "USER",
    "LOGNAME",
    "SHELL",
}
EXTRA_ENV = {"VLLM_CACHE_ROOT", "HOME", "HF_HOME", "HF_HUB_OFFLINE", "RBLN_VISIBLE_DEVICES"}


def deploy(
    state: dict[str, Any],
    *args: str,
    env: dict[str, str] | None = None,
    group_data: str | None = None,
    tmp: Path | None = None,
    deploy_file: str = "deploys/serve.py",
) -> subprocess.CompletedProcess[str]:
    """Run the real pyinfra CLI from the repo root, credentials in the environment."""
    run_env = {**os.environ, **secrets(state), "PYINFRA_PROGRESS": "off"} if env is None else env
    extra = []
    if group_data is not None:
        assert tmp is not None
        gd = tmp / "gd"
        gd.mkdir(exist_ok=True)
        (gd / "lab.py").write_text(group_data)
        extra = ["--group-data", str(gd)]
    return pyinfra(["-y", *extra, *args, "inventories/lab.py", deploy_file], run_env)


def ok(proc: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert proc.returncode == 0, (
        f"pyinfra exited {proc.returncode}:\n{proc.stdout[-6000:]}\n{proc.stderr[-6000:]}"
    )
    return proc


def json_run(state: dict[str, Any], *args: str, **kw: Any) -> dict[str, Any]:
    proc = ok(deploy(state, "--json", *args, **kw))
    return json.loads(proc.stdout)


def upper_snapshot() -> dict[str, list[tuple[str, float, int]]]:
    """Every file each host changed (its overlay upper dir), minus logs and temp files."""
    out = {}
    for host in HOSTS:
        upper = layout.STATE_HOSTS / host / "upper"
        entries = []
        for path in sorted(upper.rglob("*")):
            rel = str(path.relative_to(upper))
            if rel.startswith(("var/log", "tmp", "var/tmp", "root/.cache")):
                continue
            st = path.lstat()
            entries.append((rel, st.st_mtime, st.st_mode))
        out[host] = entries
    return out


def chat(address: str, port: int) -> str:
    return chat_once(address, port, "openai/gpt-oss-120b", "Hello", max_tokens=8)


def unit_starts(state: dict[str, Any], host: str) -> list[int]:
    out = on_host(
        state, host, "systemctl show -p ActiveEnterTimestampMonotonic --value " + " ".join(UNITS)
    ).stdout
    return [int(x) for x in out.split()]


def compiles(state: dict[str, Any], host: str) -> int:
    out = on_host(state, host, "cat /var/log/rbln-sim/compile.log 2>/dev/null || true").stdout
    return len(out.splitlines())


def assert_records(state: dict[str, Any], spec: dict[str, Any]) -> None:
    """What the simulated vLLM received is the resolved argv + --port, env + our variables."""
    server = spec["servers"][0]
    for host in HOSTS:
        for i, port in enumerate(PORTS):
            rec = json.loads(on_host(state, host, f"cat /run/rbln-sim/vllm-{port}.json").stdout)
            assert Path(rec["argv"][0]).name == "vllm"
            assert rec["argv"][0].startswith("/opt/servefleet/releases/")
            assert rec["argv"][1:] == server["argv"][1:] + ["--port", str(port), *DRAIN]
            env = {k: v for k, v in rec["env"].items() if k not in SYSTEMD_ENV}
            unit = on_host(
                state, host, f"cat /etc/systemd/system/servefleet-vllm-{i}.service"
            ).stdout
            assert f'Environment="SERVEFLEET_UNIT={env.pop("SERVEFLEET_UNIT")}"' in unit
            assert env == {
                **server["env"],
                "PYTHONPATH": "/opt/servefleet/lib/asgi",  # the path guard's, root's (#46)
                "SERVEFLEET_OPEN_PATHS": "/v1/ /health /metrics /version",
                "RBLN_VISIBLE_DEVICES": str(i),
                "VLLM_CACHE_ROOT": "/var/cache/servefleet/vllm",
                "HOME": "/var/lib/servefleet",
                "HF_HOME": "/var/lib/servefleet/hf",
                "HF_HUB_OFFLINE": "1",
            }


@pytest.fixture
def fresh(lab: dict[str, Any]) -> dict[str, Any]:
    """Hosts no deploy has touched: the session lab when none has, else a new lab (in place)."""
    touched = [h for h in HOSTS if on_host(lab, h, "test -e /opt/servefleet", check=False)
               .returncode == 0]  # fmt: skip
    if touched:
        lab.clear()
        lab.update(lab_up())
    return lab


@pytest.fixture
def deployed(lab: dict[str, Any]) -> dict[str, Any]:
    """The default data converged on every host (driver included), no fault switch set."""
    for host in HOSTS:
        on_host(lab, host, "rm -f /etc/rbln-sim/fail-start /etc/rbln-sim/fail-health")
    ok(deploy(lab))
    return lab


@pytest.mark.parametrize(
    ("args", "group_data", "drop_env", "message"),
    [
        (
            ["--data", "serve_target=Fast"],
            None,
            None,
            "serve_target: 'Fast' is not a target; allowed: Latency, Throughput",
        ),
        (["--data", "serve_selection=turbo=on"], None, None, "axis 'turbo'"),
        (["--data", "serve_recipe=rbln/nope"], None, None, "rbln/nope"),
        (
            [],
            'sdk_pins = ["rebel-compiler>=0.12.0", "vllm-rbln==0.12.0"]\n',
            None,
            "sdk_pins: 'rebel-compiler>=0.12.0' is not an exact pin",
        ),
        (
            [],
            None,
            "RBLN_INDEX_PASSWORD",
            "creds_index_password_env: environment variable RBLN_INDEX_PASSWORD is not set",
        ),
    ],
)
def test_bad_data_changes_nothing_on_any_host(
    lab: dict[str, Any],
    tmp_path: Path,
    args: list[str],
    group_data: str | None,
    drop_env: str | None,
    message: str,
) -> None:
    before = upper_snapshot()
    env = None
    if drop_env:
        env = {k: v for k, v in {**os.environ, **secrets(lab)}.items() if k != drop_env}
    proc = deploy(lab, *args, env=env, group_data=group_data, tmp=tmp_path)
    assert proc.returncode != 0
    errors = [line for line in (proc.stdout + proc.stderr).splitlines() if "servefleet:" in line]
    assert len(errors) == 1 and message in errors[0], proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert upper_snapshot() == before


def test_fresh_hosts_to_serving_without_leaking_secrets(fresh: dict[str, Any]) -> None:
    lab = fresh
    secret_values = [v.encode() for v in secrets(lab).values()]
    with argv_watch(*secret_values) as seen:
        proc = ok(deploy(lab, "-vvv", "--diff"))
    assert not seen, f"a secret was in a process's command line: {seen[:3]}"
    output = (proc.stdout + proc.stderr).encode()
    assert not [s for s in secret_values if s in output], "a secret is in pyinfra's output"

    for host in lab["hosts"]:
        replies = {chat(host["address"], port) for port in PORTS}
        assert all(replies), f"{host['name']}: empty chat reply"
    for host in HOSTS:
        assert compiles(lab, host) == 1, (
            f"{host}: the first instance compiles alone, the others hit the cache"
        )
        out = on_host(
            lab,
            host,
            "stat -c '%a %U' /etc/servefleet/secrets/netrc; cat /etc/systemd/system/servefleet-vllm-*.service",
        ).stdout
        assert out.startswith("600 root\n")
        assert not [s for s in secret_values if s in out.encode()]
        # squatters: rebel came from the private index, no kv-connectors without KV offload
        check = on_host(
            lab,
            host,
            "/opt/servefleet/current/bin/python -c 'import rebel, json, importlib.metadata as m; "
            'print(json.dumps([getattr(rebel, "__servefleet_squatter__", False), '
            '[d.metadata["Name"] for d in m.distributions()]]))\'',
        ).stdout
        squatter, dists = json.loads(check)
        assert squatter is False
        assert not {"lmcache-rbln", "nixl-rbln", "lmcache_rbln", "nixl_rbln"} & set(dists)
    # no world-readable file on any host holds a secret
    for host in HOSTS:
        upper = layout.STATE_HOSTS / host / "upper"
        for path in upper.rglob("*"):
            if (
                path.is_file()
                and not path.is_symlink()
                and path.stat().st_mode & 0o004
                and path.stat().st_size < 5_000_000
            ):
                data = path.read_bytes()
                assert not [s for s in secret_values if s in data], (
                    f"{host}: secret in world-readable {path}"
                )
    assert_records(lab, resolved())


def test_second_run_changes_nothing(deployed: dict[str, Any]) -> None:
    lab = deployed
    starts = {h: unit_starts(lab, h) for h in HOSTS}
    result = json_run(lab)
    assert result["results"]["totals"]["success"] == 0, [
        (o["name"], o["success"]) for o in result["results"]["operations"] if o["success"]
    ]
    assert result["results"]["totals"]["error"] == 0
    assert {h: unit_starts(lab, h) for h in HOSTS} == starts


def test_dry_shows_changes_and_changes_nothing(deployed: dict[str, Any]) -> None:
    lab = deployed
    before = upper_snapshot()
    proc = subprocess.run(
        [
            PYINFRA,
            "--dry",
            "--data",
            "serve_target=Throughput",
            "inventories/lab.py",
            "deploys/serve.py",
        ],
        cwd=REPO,
        env={**os.environ, **secrets(lab)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    ok(proc)
    assert "Converge the instances through the health gate: servefleet-vllm-0.service" in (
        proc.stdout + proc.stderr
    )
    assert upper_snapshot() == before


def test_compile_affecting_change_compiles_once_per_host(deployed: dict[str, Any]) -> None:
    lab = deployed
    make_change_cold(lab, list(HOSTS))  # Throughput compiles again
    before = {h: compiles(lab, h) for h in HOSTS}
    ok(deploy(lab, "--data", "serve_target=Throughput"))  # --max-num-seqs 1 -> 8
    assert {h: compiles(lab, h) - before[h] for h in HOSTS} == {h: 1 for h in HOSTS}
    assert_records(lab, resolved("--target", "throughput"))
    assert json_run(lab, "--data", "serve_target=Throughput")["results"]["totals"]["success"] == 0


def test_port_change_does_not_recompile(lab: dict[str, Any]) -> None:
    ok(deploy(lab, "--data", "serve_target=Throughput"))  # warm, on the base port
    before = {h: compiles(lab, h) for h in HOSTS}
    ok(deploy(lab, "--data", "serve_target=Throughput", "--data", "serve_base_port=8100"))
    assert {h: compiles(lab, h) for h in HOSTS} == before
    for host in lab["hosts"]:
        assert chat(host["address"], 8103)


def test_suffix_decoding_builds_arctic_inference_once_and_no_host_compiles(
    lab: dict[str, Any], tmp_path: Path
) -> None:
    """arctic-inference 0.1.1 is an sdist whose build compiles C++20: the controller builds it
    once for the fleet (a fresh wheel cache), every host installs that wheel, none has a
    compiler, and the servers run suffix decoding with its compiled extension."""
    wheels = tmp_path / "wheels"
    proc = ok(deploy(lab, "--data", "serve_selection=spec_decode=suffix",
                     "--data", f"sdk_wheel_cache={wheels}"))  # fmt: skip
    said = [line for line in (proc.stdout + proc.stderr).splitlines()
            if "arctic-inference==0.1.1 for Python 3." in line]  # fmt: skip
    assert len(said) == len(HOSTS)
    assert sum(line.endswith("(built on the controller)") for line in said) == 1, said
    (built,) = wheels.glob("*/py*/arctic_inference-0.1.1-*.whl")
    tag = built.name.split("-", 2)[2].removesuffix(".whl")
    probe = (
        "import importlib.metadata as m; from arctic_inference.suffix_decoding import _C; "
        "print(m.version('arctic-inference'), _C.max_tree_depth(), "
        "[l for l in m.distribution('arctic-inference').read_text('WHEEL').splitlines() "
        "if l.startswith('Tag')][0])"
    )
    for host in HOSTS:
        out = on_host(lab, host, f"/opt/servefleet/current/bin/python -c {shlex.quote(probe)}")
        assert out.stdout.split() == ["0.1.1", "24", "Tag:", tag]
        tools = on_host(lab, host, "command -v c++ g++ gcc cc cmake", check=False)
        assert tools.stdout == "", f"{host} has {tools.stdout}"
    for host in lab["hosts"]:
        assert all(chat(host["address"], p) for p in PORTS)
    assert_records(lab, resolved("--set", "spec_decode=suffix"))


@pytest.mark.parametrize("target", ["Latency", "Throughput"])
def test_recommended_selection_offloads_kv_with_the_private_packages(
    lab: dict[str, Any], target: str
) -> None:
    ok(deploy(lab, "--data", "serve_recommended=true", "--data", f"serve_target={target}"))
    assert_records(lab, resolved("--recommended", "--target", target.lower()))
    probe = (
        "import json, lmcache_rbln, nixl_rbln, importlib.metadata as m; print(json.dumps(["
        "getattr(lmcache_rbln, '__servefleet_squatter__', False), getattr(nixl_rbln, '__servefleet_squatter__', False), "
        "m.version('lmcache-rbln'), m.version('nixl-rbln')]))"
    )
    for host in HOSTS:
        out = on_host(lab, host, f'/opt/servefleet/current/bin/python -c "{probe}"').stdout
        assert json.loads(out) == [False, False, "0.12.0", "0.12.0"], (
            f"{host}: kv-connectors from the wrong index"
        )
        on_host(
            lab,
            host,
            "test -f /var/lib/servefleet/hf/hub/models--nvidia--gpt-oss-120b-Eagle3-v3/refs/main",
        )
    for host in lab["hosts"]:
        assert all(chat(host["address"], p) for p in PORTS)


def test_sdk_upgrade_restarts_one_by_one_without_recompiling(
    lab: dict[str, Any], tmp_path: Path
) -> None:
    ok(deploy(lab))  # back to the base selection on 0.12.0
    old = on_host(lab, "lab1", "readlink /opt/servefleet/current").stdout.strip()
    before = {h: compiles(lab, h) for h in HOSTS}
    starts = {h: unit_starts(lab, h) for h in HOSTS}
    from servefleet.settings.table import load_defaults

    pins = [p.replace("==0.12.0", "==0.12.1") for p in load_defaults()["sdk_pins"]]
    gd = f"sdk_pins = {pins!r}\n"
    ok(deploy(lab, group_data=gd, tmp=tmp_path))
    for host in HOSTS:
        new = on_host(lab, host, "readlink /opt/servefleet/current").stdout.strip()
        assert new != old
        on_host(
            lab, host, f"test -f /opt/servefleet/{old}/.servefleet-release.json"
        )  # kept for rollback
        out = on_host(
            lab,
            host,
            '/opt/servefleet/current/bin/python -c \'import importlib.metadata as m; print(m.version("vllm-rbln"), m.version("rebel-compiler"))\'',
        ).stdout
        assert out.split() == ["0.12.1", "0.12.1"]
        now = unit_starts(lab, host)
        assert all(n > s for n, s in zip(now, starts[host], strict=True)), "every server restarted"
        assert now == sorted(now) and len(set(now)) == 4, "one at a time, in order"
    assert {h: compiles(lab, h) for h in HOSTS} == before, "a patch upgrade keeps the compile cache"
    assert json_run(lab, group_data=gd, tmp=tmp_path)["results"]["totals"]["success"] == 0


def test_driver_upgrade(lab: dict[str, Any]) -> None:
    ok(deploy(lab))  # settle on the default data first: only the driver changes below
    starts = {h: unit_starts(lab, h) for h in HOSTS}
    ok(deploy(lab, "--data", "driver_version=3.6.0"))
    for host in HOSTS:
        smi = json.loads(on_host(lab, host, "rbln-smi -j").stdout)
        assert smi["KMD_version"] == "3.6.0"
        now = unit_starts(lab, host)
        assert all(n > s for n, s in zip(now, starts[host], strict=True)), (
            "servers came back after the driver"
        )
    for host in lab["hosts"]:
        assert all(chat(host["address"], p) for p in PORTS)
    assert json_run(lab, "--data", "driver_version=3.6.0")["results"]["totals"]["success"] == 0


@pytest.mark.parametrize("switch", ["fail-health", "fail-start"])
def test_health_gate_fails_the_host_with_its_journal(lab: dict[str, Any], switch: str) -> None:
    ok(deploy(lab))  # settle on the default data (driver included): only the port changes below
    port = 8200 if switch == "fail-health" else 8300  # a change: every instance restarts
    # on lab2 the servers on the new ports fail (the switch holds their text); the old ones run
    on_host(lab, "lab2", f"echo '--port {port}' > /etc/rbln-sim/{switch}")
    try:
        proc = deploy(lab, "--data", f"serve_base_port={port}", "--data", "serve_health_timeout=8")
        out = proc.stdout + proc.stderr
        assert proc.returncode != 0
        assert "servefleet: health gate: servefleet-vllm-0.service" in out
        assert "--- journal tail of servefleet-vllm-0.service ---" in out
        assert ("/health answered 500" if switch == "fail-health" else "restart(s)") in out
        assert "servefleet: rolled back to " in out
        for host in lab["hosts"]:  # the other hosts went on and serve on the new port
            if host["name"] != "lab2":
                assert chat(host["address"], port + 3)
        # lab2 is back on its old units, every instance serving on its old port
        lab2 = next(h["address"] for h in lab["hosts"] if h["name"] == "lab2")
        assert all(chat(lab2, p) for p in PORTS)
    finally:
        on_host(lab, "lab2", f"rm -f /etc/rbln-sim/{switch}")
    ok(deploy(lab))


def test_host_of_another_sku_fails_before_any_change(lab: dict[str, Any]) -> None:
    hw = "/etc/rbln-sim/hardware.json"
    saved = on_host(lab, "lab3", f"cat {hw}").stdout
    other = json.dumps({**json.loads(saved), "sku": "RBLN-CA25", "pci_device": "1250"})
    on_host(lab, "lab3", f"cat > {hw}", stdin=other)
    try:
        before = upper_snapshot()["lab3"]
        proc = deploy(lab, "--limit", "lab3", "--data", "serve_target=Throughput")
        assert proc.returncode != 0
        assert (
            "host SKU RBLN-CA25 is not one rbln/gpt-oss-120b is verified on (RBLN-CR13)"
            in proc.stdout + proc.stderr
        )
        assert upper_snapshot()["lab3"] == before
    finally:
        on_host(lab, "lab3", f"cat > {hw}", stdin=saved)


@pytest.mark.lab_destructive
def test_readme_main_command(lab: dict[str, Any]) -> None:
    """The README's first command: set up, bring up a 3-host lab, deploy, a chat from each host."""
    readme = (REPO / "README.md").read_text()
    command = readme.split("```sh\n", 1)[1].split("\n```", 1)[0]
    assert (
        command.startswith("./setup.sh && ")
        and "lab up" in command
        and command.endswith("lab chat")
    )
    proc = subprocess.run(
        ["bash", "-c", command],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1800,
        env={k: v for k, v in os.environ.items() if not k.startswith(("RBLN_", "HF_"))},
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    replies = [line for line in proc.stdout.splitlines() if ":8000): " in line]
    assert [r.split(" ", 1)[0] for r in replies] == list(HOSTS)
    from servefleet.fleet.lab.state import load_state

    lab.clear()
    lab.update(load_state())
