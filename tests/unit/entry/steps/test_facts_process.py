"""servefleet's pyinfra facts (steps/facts.py) as pyinfra's own facts are tested: each case is an
argument, the command the fact runs for it, the output the host gave and the fact ``process()``
makes of it. The outputs are real: each fact's command is also run here as pyinfra runs it (one
``sh -c``, stdout as lines) against a host built in a temporary directory, and the recorded
samples are such runs' outputs. ``PreflightRefusal``'s host is the simulator's vllm package as
vLLM 0.30.0 (as in tests/unit/base/remote/test_preflight.py), run by the fact's own command.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from fake_host import FakeSystemd, Stub, running
from lab_sim_support import sim_vllm
from preflight_cases import PREFLIGHT, fixture_command
from repo_paths import REPO

from servefleet.base.errors import ProbeError
from servefleet.base.remote import layout
from servefleet.entry.steps.facts import (
    DEADLINE,
    HOST_CHECK,
    PROBE,
    READ_DEADLINE,
    STATUS,
    HostProbe,
    InstanceHealth,
    PreflightRefusal,
    WheelhouseFiles,
)
from servefleet.platforms.rbln import PLATFORM as RBLN


def run_fact(command: str, env: dict[str, str] | None = None, stdin: str = "") -> list[str]:
    """The fact's command as pyinfra runs it on a host: one shell, stdout split in lines."""
    proc = subprocess.run(["sh", "-c", command], capture_output=True, text=True, env=env,
                          input=stdin, timeout=60)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


def program_of(command: str) -> tuple[int, list[str]]:
    """A fact's command (``facts.within``) as its deadline and the program it runs under it."""
    found = re.fullmatch(r"timeout -k 10 (\d+) (.*); rc=\$\?; if \[ \$rc -eq 124 \]; then "
                         r"echo servefleet-deadline \1; exit 0; fi; exit \$rc", command, re.S)  # fmt: skip
    assert found, command[-200:]
    return int(found[1]), shlex.split(found[2])


# ---------------------------------------------------------------------------------------------
# WheelhouseFiles: host path -> sha256 in, the paths the host holds with that sha256 out


def test_wheelhouse_files_command() -> None:
    files = json.dumps({"/opt/servefleet/wheelhouse/a b.whl": "0" * 64})
    command = WheelhouseFiles().command(files=files)
    assert program_of(command) == (READ_DEADLINE, ["python3", "-c", HOST_CHECK, files])


WHEELHOUSE_SAMPLES: list[tuple[list[str], list[str]]] = [
    # recorded: two of three files held with their sha256
    (
        [
            '["/opt/servefleet/wheelhouse/driver/rbln-driver-3.5.1.run", '
            '"/opt/servefleet/wheelhouse/pip/vllm_rbln-0.12.0-py3-none-any.whl"]'
        ],
        [
            "/opt/servefleet/wheelhouse/driver/rbln-driver-3.5.1.run",
            "/opt/servefleet/wheelhouse/pip/vllm_rbln-0.12.0-py3-none-any.whl",
        ],
    ),  # fmt: skip
    (["[]"], []),  # recorded: a fresh host holds none of them
]


@pytest.mark.parametrize(("output", "fact"), WHEELHOUSE_SAMPLES)
def test_wheelhouse_files_process(output: list[str], fact: list[str]) -> None:
    assert WheelhouseFiles().process(output) == fact


def test_wheelhouse_files_on_a_host(tmp_path: Path) -> None:
    """The copy skips exactly the files the host holds with their sha256: the fact is the list
    of their paths, not the program's output (else every file is copied again every run)."""
    held = tmp_path / "wheel house" / "vllm_rbln-0.12.0-py3-none-any.whl"
    held.parent.mkdir()
    held.write_bytes(b"wheel")
    other = tmp_path / "rebel_compiler-0.12.0-py3-none-any.whl"
    other.write_bytes(b"a changed wheel")
    odd = tmp_path / "ünïcode.tar"
    odd.write_bytes(b"tar")
    files = {
        str(held): hashlib.sha256(b"wheel").hexdigest(),
        str(other): hashlib.sha256(b"the wheel it should be").hexdigest(),
        str(tmp_path / "missing.whl"): hashlib.sha256(b"").hexdigest(),
        str(odd): hashlib.sha256(b"tar").hexdigest(),
    }
    fact = WheelhouseFiles()
    output = run_fact(fact.command(files=json.dumps(files, sort_keys=True)))
    found = fact.process(output)
    assert found == sorted([str(held), str(odd)])
    assert all(isinstance(p, str) for p in found)
    assert set(found) & set(files) == set(found)  # what steps/wheelhouse.py skips


def test_wheelhouse_files_of_nothing_held_or_asked(tmp_path: Path) -> None:
    """have_files.py's own output when nothing is asked, and when a wanted path is a directory
    or a dangling link: nothing held (each copied)."""
    fact = WheelhouseFiles()
    assert run_fact(fact.command(files="{}")) == ["[]"]
    (tmp_path / "a.whl").mkdir()
    (tmp_path / "b.whl").symlink_to(tmp_path / "gone")
    files = {str(tmp_path / n): hashlib.sha256(b"").hexdigest() for n in ("a.whl", "b.whl")}
    output = run_fact(fact.command(files=json.dumps(files)))
    assert output == ["[]"] and fact.process(output) == []


# Outputs that are no list of paths: each refused in one line, never read as the paths held (a
# JSON object's keys would be every path asked: every copy skipped)
ODD_WHEELHOUSE: list[list[str]] = [
    [],  # the program printed nothing
    ["Traceback (most recent call last):", '  File "<string>", line 1, in <module>'],
    ['{"/opt/servefleet/wheelhouse/pip/a.whl": "' + "0" * 64 + '"}'],  # an object
    ['["/opt/servefleet/wheelhouse/pip/a.whl", 1]'],  # not every item a path
    ["null"],
    ['"/opt/servefleet/wheelhouse/pip/a.whl"'],  # one path, not a list
    ['["/opt/servefleet/wheelhouse/pip/a.whl"'],  # cut off
    ["[]", "[]"],  # two values
]


@pytest.mark.parametrize("output", ODD_WHEELHOUSE, ids=range(len(ODD_WHEELHOUSE)))
def test_wheelhouse_files_refuses_anything_but_a_list_of_paths(output: list[str]) -> None:
    with pytest.raises(ProbeError) as err:
        WheelhouseFiles().process(output)
    _one_line_refusal(str(err.value), "wheelhouse files", "one JSON list of paths")


def _one_line_refusal(msg: str, fact: str, allowed: str) -> None:
    """The fact's refusal of its output: one short line naming the fact and what it takes."""
    assert msg.startswith(f"{fact}: unexpected output ") and "\n" not in msg
    assert msg.endswith(f"; allowed: {allowed}") and len(msg) < 200


# ---------------------------------------------------------------------------------------------
# InstanceHealth: port (a string) -> "ok" or why not, the deploy's gate once per instance


def test_instance_health_command() -> None:
    checks = json.dumps({"model": "m", "host": None, "instances": [["u", 8000]]})
    assert program_of(InstanceHealth().command(checks=checks)) == (
        DEADLINE, ["python3", "-c", STATUS, "status", checks],
    )  # fmt: skip


HEALTH_SAMPLES: list[tuple[list[str], dict[str, str]]] = [
    # recorded: nothing listens on the instance's port (the status gate's 30 s)
    (
        [
            '{"18999": "not healthy within 30s: not answering: <urlopen error [Errno 111] '
            'Connection refused>"}'
        ],
        {
            "18999": "not healthy within 30s: not answering: <urlopen error [Errno 111] "
            "Connection refused>"
        },
    ),  # fmt: skip
    # recorded: two instances answering their gate's /health and chat
    (['{"43851": "ok", "42327": "ok"}'], {"43851": "ok", "42327": "ok"}),
    # recorded: an instance whose unit is not there
    (
        ['{"1": "servefleet-vllm-0.service is not loaded (not-found)"}'],
        {"1": "servefleet-vllm-0.service is not loaded (not-found)"},
    ),
    (["{}"], {}),  # recorded: no instances
]


@pytest.mark.parametrize(("output", "fact"), HEALTH_SAMPLES)
def test_instance_health_process(output: list[str], fact: dict[str, str]) -> None:
    assert InstanceHealth().process(output) == fact


def test_instance_health_on_a_host(tmp_path: Path) -> None:
    systemd = FakeSystemd(tmp_path / "host")
    unit = layout.unit_name(0)
    systemd.show(running(MainPID=os.getpid(), ControlGroup=f"/system.slice/{unit}"))
    fact = InstanceHealth()
    with Stub() as ours:
        checks = json.dumps({"model": "m/x", "host": None, "instances": [[unit, ours.port]]})
        found = fact.process(run_fact(fact.command(checks=checks), env=systemd.env()))
    assert found == {str(ours.port): "ok"}
    systemd.show(running(LoadState="not-found", ActiveState="inactive"))
    checks = json.dumps({"model": "m/x", "host": None, "instances": [[unit, 1]]})
    found = fact.process(run_fact(fact.command(checks=checks), env=systemd.env()))
    assert found == {"1": f"{unit} is not loaded (not-found)"}


def test_instance_health_of_headless_ranks_on_a_host(tmp_path: Path) -> None:
    """A serving group's headless rank (its port only its name): its unit runs, or why not."""
    systemd = FakeSystemd(tmp_path / "host")
    head, rank = layout.unit_name(0), layout.unit_name(1)
    systemd.show(running(MainPID=os.getpid(), ControlGroup=f"/system.slice/{head}"))
    fact = InstanceHealth()
    with Stub() as ours:
        checks = json.dumps({"model": "m/x", "host": None, "instances": [[head, ours.port]],
                             "headless": [[rank, 8001]]})  # fmt: skip
        found = fact.process(run_fact(fact.command(checks=checks), env=systemd.env()))
    assert found == {str(ours.port): "ok", "8001": "ok"}
    systemd.show(running(ActiveState="failed", SubState="failed", Result="exit-code",
                         ExecMainStatus=1))  # fmt: skip
    checks = json.dumps({"model": "m/x", "host": None, "instances": [], "headless": [[rank, 8001]]})
    output = run_fact(fact.command(checks=checks), env=systemd.env())
    assert output == [HEADLESS_FAILED]
    assert fact.process(output) == json.loads(HEADLESS_FAILED)


# recorded: a headless rank whose unit failed, as health.py printed it
HEADLESS_FAILED = (
    '{"8001": "servefleet-vllm-1.service is failed (exit-code, status 1) after 0 automatic '
    'restart(s)"}'
)

# Outputs that are no object of port -> why: refused in one line, never a port's health
ODD_HEALTH: list[list[str]] = [
    [],  # the program printed nothing
    ["Traceback (most recent call last):", "KeyError: 'instances'"],
    ["[]"],  # a list
    ['{"8000": null}'],  # a port without its why
    ['{"8000": 500}'],
    ['{"8000": "ok"'],  # cut off
    ['{"8000": "ok"}', "servefleet-vllm-0.service: healthy on port 8000"],  # a stray line
]


@pytest.mark.parametrize("output", ODD_HEALTH, ids=range(len(ODD_HEALTH)))
def test_instance_health_refuses_anything_but_an_object_of_words(output: list[str]) -> None:
    with pytest.raises(ProbeError) as err:
        InstanceHealth().process(output)
    _one_line_refusal(str(err.value), "instance health", "one JSON object of port -> why")


# ---------------------------------------------------------------------------------------------
# HostProbe: one JSON object, or the project's error in one line


def _probe_args(root: Path) -> str:
    return json.dumps(
        {
            "root": str(root / "opt"),
            "hf_home": str(root / "hf"),
            "cache_root": str(root / "cache"),
            "user": "nobody",
            "accelerators": [list(c) for c in RBLN.probe_commands],
            "models": {"acme/m": None},
            "paths": [],
            "files": False,
            "keyed": False,
            "python": "python3",
            "router": {"unit": layout.ROUTER_UNIT, "url": "http://127.0.0.1:9"},
        },
        sort_keys=True,
    )


def test_host_probe_command(tmp_path: Path) -> None:
    args = _probe_args(tmp_path)
    assert program_of(HostProbe().command(args=args)) == (DEADLINE, ["python3", "-c", PROBE, args])
    verify = json.dumps({**json.loads(args), "verify": True})  # it reads every file: hours
    assert program_of(HostProbe().command(args=verify)) == (
        READ_DEADLINE, ["python3", "-c", PROBE, verify],
    )  # fmt: skip


# recorded: a fresh host (no driver, no release, nothing of ours), as probe.py printed it
FRESH = (
    '{"kernel": "6.18.44-fc-v1045", "python": "3.11", "libc": "glibc 2.36", "smi": null, '
    '"pci": [], "releases": [], "current": null, "current_pins": null, "current_files": {}, '
    '"good": null, "good_shas": [], "units": {}, "router": {"active": "unknown", "running": '
    'null, "enabled": null, "reload": false, "file": null, "workers": null, "healthy": null}, '
    '"warm": [], "preflight": [], "models": [], "user": {"uid": 65534, "shell": '
    '"/usr/sbin/nologin", "home": "/nonexistent", "group": "nogroup"}, "group": false, '
    '"paths": {}}'
)


def test_host_probe_process_of_a_recorded_fresh_host() -> None:
    found = HostProbe().process([FRESH])
    assert found == json.loads(FRESH)
    assert found["releases"] == [] and found["smi"] is None and found["user"]["uid"] == 65534


def test_host_probe_on_a_host(tmp_path: Path) -> None:
    fact = HostProbe()
    found = fact.process(run_fact(fact.command(args=_probe_args(tmp_path))))
    assert isinstance(found, dict)
    assert found["releases"] == [] and found["current"] is None and found["units"] == {}
    assert found["user"]["uid"] == 65534 and found["warm"] == [] and found["models"] == []
    assert re.fullmatch(r"3\.\d+", found["python"])  # the host's python3
    assert set(found) >= set(json.loads(FRESH))


def test_host_probe_output_on_several_lines_is_one_object() -> None:
    assert HostProbe().process(json.dumps(json.loads(FRESH), indent=1).splitlines()) == (
        json.loads(FRESH)
    )


ODD_PROBE: list[list[str]] = [
    [],  # the program printed nothing
    ["[]"],  # JSON, not an object
    ["null"],
    ['"a string"'],
    ["Traceback (most recent call last):", '  File "<string>", line 6, in <module>'],
    ['{"kernel": "6.1"'],  # cut off
    ["[" * 100_000 + "]" * 100_000],  # deeper than the decoder goes
]


@pytest.mark.parametrize("output", ODD_PROBE, ids=range(len(ODD_PROBE)))
def test_host_probe_refuses_anything_but_one_object_in_one_line(output: list[str]) -> None:
    with pytest.raises(ProbeError) as err:
        HostProbe().process(output)
    _one_line_refusal(str(err.value), "host probe", "one JSON object")


def test_every_fact_is_covered() -> None:
    """The facts this file covers are every pyinfra fact of servefleet: every class under src/
    deriving from pyinfra's FactBase or ShortFactBase (read from the source, so a fact in a
    module no test imports counts too)."""
    from pyinfra.api import FactBase

    import servefleet.entry.steps.facts as facts

    found = {
        name
        for name, value in vars(facts).items()
        if isinstance(value, type) and issubclass(value, FactBase) and value is not FactBase
    }
    assert found == {"HostProbe", "InstanceHealth", "PreflightRefusal", "WheelhouseFiles"}
    anywhere = {
        f"{path.relative_to(REPO / 'src')}:{node.name}"
        for path in sorted((REPO / "src").rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.ClassDef)
        and any(ast.unparse(b).split(".")[-1] in ("FactBase", "ShortFactBase") for b in node.bases)
    }
    assert anywhere == {f"servefleet/entry/steps/facts.py:{name}" for name in found}


# ---------------------------------------------------------------------------------------------
# PreflightRefusal: remote/preflight.py's JSON lines (one per instance) in, the first refused
# instance's line (with its version gap) out, or None when every instance passes

PASS_LINE = '{"ok": true, "unit": "servefleet-vllm-0.service"}'
# a refusal as remote/preflight.py printed it under the simulated vLLM 0.30.0 (recorded)
REFUSED = {
    "flag": "--attention-config",
    "gap": "the recipe needs a newer vLLM than the pin 0.30.0 (key use_fp4_indexer_cache of "
    "--attention-config is not in it)",
    "key": "use_fp4_indexer_cache",
    "line": "servefleet-vllm-1.service: --attention-config: argument --attention-config/-ac: "
    "1 validation error for AttentionConfig use_fp4_indexer_cache Unexpected keyword argument "
    "[type=unexpected_keyword_argument, input_value=True, input_type=bool]",
    "message": "argument --attention-config/-ac: 1 validation error for AttentionConfig "
    "use_fp4_indexer_cache Unexpected keyword argument [type=unexpected_keyword_argument, "
    "input_value=True, input_type=bool]",
    "ok": False,
    "unit": "servefleet-vllm-1.service",
}
REFUSED_LINE = json.dumps(REFUSED, sort_keys=True)
NO_GAP_LINE = json.dumps({**REFUSED, "gap": None, "key": None}, sort_keys=True)


def test_preflight_refusal_command() -> None:
    run = "cd / && runuser -u vllm -- /opt/servefleet/releases/r1/bin/python /x/preflight.py -"
    command = PreflightRefusal().command(run)
    assert command.startswith("(") and command.endswith(") || true")  # never fails the fact
    assert program_of(command[1 : -len(") || true")]) == (
        DEADLINE, ["sh", "-c", run, "2>/dev/null"],
    )  # fmt: skip


@pytest.mark.parametrize(
    ("output", "fact"),
    [
        ([], None),  # the program printed nothing (it could not run): not a refusal
        ([PASS_LINE], None),
        ([PASS_LINE, PASS_LINE.replace("-0", "-2")], None),
        ([PASS_LINE, REFUSED_LINE], f"pre-flight: {REFUSED['line']}; {REFUSED['gap']}"),
        ([NO_GAP_LINE], f"pre-flight: {REFUSED['line']}"),
        ([NO_GAP_LINE, REFUSED_LINE], f"pre-flight: {REFUSED['line']}"),  # the first refusal
        (["Traceback (most recent call last):", "[1, 2]", '"text"', PASS_LINE], None),
        (["noise", REFUSED_LINE], f"pre-flight: {REFUSED['line']}; {REFUSED['gap']}"),
    ],
    ids=["empty", "pass", "passes", "refused", "no-gap", "first", "not-objects", "noise"],
)
def test_preflight_refusal_process(output: list[str], fact: str | None) -> None:
    assert PreflightRefusal().process(output) == fact


@pytest.fixture(scope="module")
def vllm_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A release's site: the simulator's vllm package as vllm 0.30.0+cpu, on the upstream
    table (an H200's)."""
    root = tmp_path_factory.mktemp("site")
    (root / "vllm").symlink_to(sim_vllm(), target_is_directory=True)
    info = root / "vllm-0.30.0+cpu.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.30.0+cpu\n")
    (root / "etc/rbln-sim").mkdir(parents=True)
    (root / "etc/rbln-sim/platform").write_text("upstream\n")
    return root


def test_preflight_refusal_on_a_host(vllm_site: Path) -> None:
    """The fact's command on a host whose release takes the first instance and refuses the
    second: its process() gives the refused instance's line and gap, as the program's own
    one line for the operator says it; with the refused instance gone, None."""
    env = {"PYTHONPATH": str(vllm_site), "PYTHONDONTWRITEBYTECODE": "1",
           "RBLN_SIM_ROOT": str(vllm_site)}  # fmt: skip
    vllm = "/opt/servefleet/releases/r1/bin/vllm"
    fits = [vllm, *fixture_command("fits-the-pin", "attention")[1:]]
    new = [vllm, *fixture_command("too-new", "unknown_key")[1:]]
    instances = [{"unit": "servefleet-vllm-0.service", "argv": fits, "env": env},
                 {"unit": "servefleet-vllm-1.service", "argv": new, "env": env}]  # fmt: skip
    run = shlex.join([sys.executable, str(PREFLIGHT), json.dumps(instances)])
    output = run_fact(PreflightRefusal().command(run))
    assert [json.loads(line)["ok"] for line in output] == [True, False]
    fact = PreflightRefusal().process(output)
    said = subprocess.run(["sh", "-c", run], capture_output=True, text=True, timeout=300).stderr
    assert said.strip() == f"servefleet: {fact}"
    assert fact == f"pre-flight: {REFUSED['line']}; {REFUSED['gap']}"
    passing = shlex.join([sys.executable, str(PREFLIGHT), json.dumps(instances[:1])])
    assert PreflightRefusal().process(run_fact(PreflightRefusal().command(passing))) is None


# recorded: remote/preflight.py under a release whose vllm cannot be imported (a CUDA build
# on a host without CUDA's libraries)
BROKEN = "libcudart.so.12: cannot open shared object file: No such file or directory"
UNBUILT = {
    "flag": "vllm",
    "gap": None,
    "key": None,
    "line": f"servefleet-vllm-0.service: vllm: cannot build vLLM's parser: ImportError: {BROKEN}",
    "message": f"cannot build vLLM's parser: ImportError: {BROKEN}",
    "ok": False,
    "unit": "servefleet-vllm-0.service",
}


def test_preflight_refusal_of_a_release_whose_vllm_cannot_load(tmp_path: Path) -> None:
    """A release whose vllm fails to import: every instance refused with that line (the fact's
    command hides the program's stderr); bad input prints nothing: no refusal (the program ran
    nothing, and said so on stderr with exit 2)."""
    site = tmp_path / "site"
    (site / "vllm").mkdir(parents=True)
    (site / "vllm" / "__init__.py").write_text(f"raise ImportError({BROKEN!r})\n")
    env = {"PATH": os.environ["PATH"], "PYTHONDONTWRITEBYTECODE": "1"}
    vllm = "/opt/servefleet/releases/r1/bin/vllm"
    instances = [{"unit": "servefleet-vllm-0.service", "argv": [vllm, "serve", "m/x"],
                  "env": {"PYTHONPATH": str(site)}}]  # fmt: skip
    run = shlex.join([sys.executable, str(PREFLIGHT), json.dumps(instances)])
    output = run_fact(PreflightRefusal().command(run), env)
    assert [json.loads(line) for line in output] == [UNBUILT]
    assert PreflightRefusal().process(output) == f"pre-flight: {UNBUILT['line']}"
    bad = shlex.join([sys.executable, str(PREFLIGHT), '{"not": "a list"}'])
    output = run_fact(PreflightRefusal().command(bad), env)
    assert output == [] and PreflightRefusal().process(output) is None
