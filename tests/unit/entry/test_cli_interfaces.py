"""#32 items 3-5: the CLI's interfaces are even. Exit 3 for what could not be reached (2 only for
refusals), one line for init on a file; ``--json`` on every command that reports (lock,
rollback, wheelhouse, recipes list, keys; recipes show reads as text by default); ``-V``;
``servefleet keys``; ``plan --diff``; progress on stderr; completion of inventory files, recipe
names and ``--limit`` hosts."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import urllib.error
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from fake_pyinfra import INVENTORY, OUTPUT, FakePyinfra, healthy
from host_inputs import converged_probe, probe, probed_units, settings
from repo_paths import REPO

from servefleet.base.download import transient, unreachable
from servefleet.base.errors import DataError
from servefleet.base.remote import retry
from servefleet.entry import cli, cmd_fleet, cmd_recipes, common, pyinfra_run
from servefleet.fleet.fleetview import ReportRequest, plan_diffs, plan_summary, unit_diffs
from servefleet.hostplan.plan import plan_host
from servefleet.settings.table import DEFAULTS, KEYS


def invoke(*args: str, **kw: Any) -> Any:
    return CliRunner().invoke(cli.main, list(args), catch_exceptions=False, **kw)


def one_line(result: Any) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


# ---------------------------------------------------------------------------------------------
# exit codes and one-line errors


@pytest.mark.parametrize("flag", ["-V", "--version"])
def test_version_is_the_package_metadatas(flag: str) -> None:
    result = invoke(flag)
    assert result.exit_code == 0
    assert result.output.split()[-1] == version("servefleet")


def test_init_on_a_file_is_one_line_exit_2_and_changes_nothing(tmp_path: Path) -> None:
    """#32 (3): a traceback (FileExistsError from os.makedirs), exit 1, before."""
    afile = tmp_path / "afile"
    afile.write_text("mine\n")
    result = invoke("init", str(afile))
    assert result.exit_code == 2
    assert one_line(result) == (
        f"servefleet: error: {afile}: not a directory; allowed: a directory (made when missing) "
        "without the scaffold's files (.gitignore, README.md, deploys, group_data, inventories, "
        "locks, monitoring)"
    )
    assert afile.read_text() == "mine\n"
    below = invoke("init", str(afile / "fleet"))
    assert below.exit_code == 2
    assert one_line(below).startswith(f"servefleet: error: {afile}/fleet: cannot be made (")


def test_init_that_cannot_write_is_one_line_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A directory this user cannot write (root writes anywhere: the refusal is stood in for)."""
    real = os.open

    def refusing(path: Any, flags: int, *a: Any, **kw: Any) -> int:
        if flags & os.O_CREAT:
            raise PermissionError(13, "Permission denied", path)
        return real(path, flags, *a, **kw)

    monkeypatch.setattr(os, "open", refusing)
    result = invoke("init", str(tmp_path / "fleet"))
    assert result.exit_code == 2
    assert one_line(result) == (
        f"servefleet: error: {tmp_path}/fleet: cannot be written (Permission denied); allowed: a "
        "directory this user can write, without the scaffold's files (.gitignore, README.md, "
        "deploys, group_data, inventories, locks, monitoring)"
    )


def test_what_could_not_be_reached_exits_3_and_a_refusal_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """#32 (4): Unreachable anywhere under a command is one line and exit 3 (transient, worth a
    retry); a refusal from the same place stays 2."""
    import servefleet.fleet.lockfleet as lockfleet

    refused = urllib.error.URLError(ConnectionRefusedError(111, "Connection refused"))

    def unreachable_index(*_a: Any, **_k: Any) -> Any:
        raise unreachable("https://pypi.example/simple", refused)

    monkeypatch.setattr(lockfleet, "fleet_lock", unreachable_index)
    result = invoke("lock", "inv.py")
    assert result.exit_code == 3
    assert one_line(result) == (
        "servefleet: error: https://pypi.example/simple: could not reach it (Connection "
        "refused); transient: try again later"
    )

    def bad_data(*_a: Any, **_k: Any) -> Any:
        raise DataError("sdk_lock: not set")

    monkeypatch.setattr(lockfleet, "fleet_lock", bad_data)
    result = invoke("lock", "inv.py")
    assert result.exit_code == 2 and one_line(result) == "servefleet: error: sdk_lock: not set"


def test_an_os_error_no_command_caught_is_one_line_2_for_a_path_3_for_the_network(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A traceback before (wheelhouse into a path below a file: NotADirectoryError)."""
    afile = tmp_path / "afile"
    afile.write_text("")
    result = invoke("wheelhouse", str(afile / "wh"), "--lock-dir", str(REPO / "locks" / "lab"))
    assert result.exit_code == 2
    assert one_line(result) == f"servefleet: error: {afile}/wh: Not a directory"
    import servefleet.fleet.lockfleet as lockfleet

    def reset(*_a: Any, **_k: Any) -> Any:
        raise ConnectionResetError(104, "Connection reset by peer")

    monkeypatch.setattr(lockfleet, "fleet_lock", reset)
    result = invoke("lock", "inv.py")
    assert result.exit_code == 3
    assert one_line(result) == ("servefleet: error: could not reach it (Connection reset by peer)")


def test_status_refuses_a_prometheus_file_it_cannot_write_before_asking_any_host(
    fleet: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakePyinfra({"h1": healthy()}, OUTPUT)
    monkeypatch.setattr(pyinfra_run, "run_pyinfra", fake)
    result = invoke("status", "inv.py", "--prometheus", str(fleet / "no" / "t.json"))
    assert result.exit_code == 2 and fake.runs == []
    assert one_line(result) == (
        f"servefleet: error: Invalid value for '--prometheus': {fleet}/no/t.json: its directory "
        f"{fleet}/no does not exist"
    )
    (fleet / "dir.json").mkdir()
    result = invoke("status", "inv.py", "--prometheus", str(fleet / "dir.json"))
    assert result.exit_code == 2 and fake.runs == []  # click: a directory is no file


def http_error(code: int) -> urllib.error.HTTPError:
    return urllib.error.HTTPError("https://x/", code, "Service Unavailable", {}, None)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("error", "worth_a_retry"),
    [
        (urllib.error.URLError(ConnectionRefusedError(111, "refused")), True),
        (urllib.error.URLError(socket.gaierror(-2, "Name or service not known")), True),
        (TimeoutError("timed out"), True),
        (ConnectionResetError(104, "reset"), True),
        (http_error(503), True),
        (http_error(429), True),
        (http_error(404), False),
        (http_error(401), False),
        (http_error(403), False),
        (ValueError("not a network error"), False),
    ],
)
def test_only_the_network_and_later_statuses_are_transient(
    error: BaseException, worth_a_retry: bool
) -> None:
    assert transient(error) is worth_a_retry


def test_the_unreachable_line_says_why() -> None:
    assert str(unreachable("https://store/x", http_error(503))) == (
        "https://store/x: could not reach it (answered 503 Service Unavailable); transient: "
        "try again later"
    )
    assert "(timed out)" in str(unreachable("https://x", TimeoutError("timed out")))
    assert transient is retry.transient  # the retry rule, written once


def test_every_command_names_its_max_failures_and_json_options() -> None:
    rollout = invoke("rollout", "-h").output
    assert "--max-failures" in rollout and "Failed hosts the rollout tolerates" in rollout
    for command in (["plan"], ["status"], ["rollout"], ["rollback"], ["lock"], ["wheelhouse"],
                    ["recipes", "list"], ["recipes", "show"], ["keys"]):  # fmt: skip
        assert "--json" in invoke(*command, "-h").output, command


# ---------------------------------------------------------------------------------------------
# keys


def test_keys_lists_every_key_of_the_table_with_its_meaning() -> None:
    result = invoke("keys")
    assert result.exit_code == 0
    names = [line.split()[0] for line in result.output.splitlines()]
    assert names == list(KEYS)
    assert "Latency or Throughput" in result.output


def test_keys_name_prints_type_meaning_allowed_and_default_as_ansible_doc() -> None:
    result = invoke("keys", "serve_target")
    assert result.exit_code == 0
    assert result.output.splitlines() == [
        "serve_target (str)",
        "    Latency or Throughput",
        "    allowed: Latency, Throughput",
        "    default: 'Latency'",
    ]
    kinds = invoke("keys", "sdk_pins").output
    assert "vllm recipes: their own default" in kinds and "'vllm-rbln==" in kinds
    globbed = invoke("keys", "serve_router*").output
    assert "serve_router (str)" in globbed and "serve_router_group (str)" in globbed


def test_keys_json_is_every_key_as_data_gives_it() -> None:
    every = json.loads(invoke("keys", "--json").output)
    assert list(every) == list(KEYS)
    assert {k: v["default"] for k, v in every.items()} == json.loads(json.dumps(DEFAULTS))
    one = json.loads(invoke("keys", "serve_base_port", "--json").output)
    assert list(one) == ["serve_base_port"]
    assert set(one["serve_base_port"]) == {"name", "type", "allowed", "default", "default_from",
                                           "kinds", "meaning"}  # fmt: skip


def fits(value: Any, shown: str) -> bool:
    """``value`` (as data gives it) is of the type ``shown`` (as ``keys`` shows one: ``str``,
    ``int | None``, ``list[str]``, ``dict[str, list[str]]``)."""
    alternatives, depth, start = [], 0, 0
    for i, ch in enumerate(shown + "|"):
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if ch == "|" and depth == 0:
            alternatives.append(shown[start:i].strip())
            start = i + 1
    if len(alternatives) > 1:
        return any(fits(value, one) for one in alternatives)
    name, _, inner = shown.partition("[")
    plain = {"str": str, "bool": bool, "dict": dict, "None": type(None)}
    if name in plain and not inner:
        return isinstance(value, plain[name])
    if name in ("int", "float"):
        return type(value) is int or (name == "float" and type(value) is float)
    args, depth, start = [], 0, 0
    for i, ch in enumerate(inner[:-1] + ","):
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            args.append(inner[start:i].strip())
            start = i + 1
    if name == "list":
        return isinstance(value, list) and all(fits(v, args[0]) for v in value)
    assert name == "dict", shown
    return isinstance(value, dict) and all(
        fits(k, args[0]) and fits(v, args[1]) for k, v in value.items()
    )


def test_keys_shows_each_key_with_the_type_its_default_and_data_have() -> None:
    """#50 (8): the type ``keys``, docs/data.md and group_data/all.py show is the one data
    gives, which every kind's default has (before: sdk_pins showed ``dict[str, str]``, the
    checked value's type, for a list of pins)."""
    from servefleet.fleet.datadoc import key_docs
    from servefleet.kinds import KINDS

    for doc in key_docs():
        assert fits(doc.default, doc.type), (doc.name, doc.type, doc.default)
        for kind in KINDS:
            if doc.name in kind.defaults:
                assert fits(kind.defaults[doc.name], doc.type), (kind.kind, doc.name, doc.type)
    assert invoke("keys", "sdk_pins").output.splitlines()[0] == "sdk_pins (list[str])"
    assert not fits(["a==1"], "dict[str, str]") and not fits({"a": 1}, "dict[str, str]")
    assert fits({"a": [None]}, "dict[str, list[str | None]]") and not fits(True, "int")


def test_an_unknown_key_is_one_line_with_the_nearest_exit_2() -> None:
    result = invoke("keys", "serve_targt")
    assert result.exit_code == 2
    assert one_line(result) == (
        "servefleet: error: serve_targt: no such data key; did you mean serve_target? allowed: "
        "a key that `servefleet keys` lists, or a glob of them"
    )
    assert invoke("keys", "zzz*").exit_code == 2


# ---------------------------------------------------------------------------------------------
# recipes


def test_recipes_list_json_is_the_same_names() -> None:
    names = invoke("recipes", "list").output.split()
    assert json.loads(invoke("recipes", "list", "--json").output) == names


def test_recipes_show_reads_as_text_and_json_stays_available() -> None:
    text = invoke("recipes", "show", "rbln/gpt-oss-120b").output
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)
    lines = text.splitlines()
    assert lines[:3] == ["recipe: rbln/gpt-oss-120b", "kind: rbln", "model: openai/gpt-oss-120b"]
    assert "  - slug: aggregated" in lines and "      - target: Latency" in lines
    as_json = json.loads(invoke("recipes", "show", "rbln/gpt-oss-120b", "--json").output)
    assert as_json == json.loads(
        invoke("recipes", "show", "rbln/gpt-oss-120b", "--format", "json").output
    )
    assert as_json["recipe"] == "rbln/gpt-oss-120b"


def test_outline_of_nested_values() -> None:
    shown = {"a": 1, "b": ["x", "y"], "c": {"d": None, "e": True}, "f": [{"g": 1}, {"g": 2}]}
    assert cmd_recipes.outline(shown) == [
        "a: 1", "b: x, y", "c:", "  d: -", "  e: true", "f:", "  - g: 1", "  - g: 2",
    ]  # fmt: skip


# ---------------------------------------------------------------------------------------------
# --json: lock, wheelhouse, rollback


class _FleetLock:
    def __init__(self, lock_dir: Path) -> None:
        self.lock_dir, self.stacks = lock_dir, {"a": None, "b": None}


def test_lock_json_is_what_the_lock_holds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import servefleet.fleet.lockfleet as lockfleet

    lock = tmp_path / "locks" / "lab"
    shutil.copytree(REPO / "locks" / "lab", lock)
    monkeypatch.setattr(lockfleet, "fleet_lock", lambda *_a: _FleetLock(lock))
    monkeypatch.setattr(
        lockfleet, "make_lock", lambda fl, echo, move_uv, progress: echo(f"wrote {fl.lock_dir}")
    )
    result = invoke("lock", "inv.py", "--json")
    assert result.exit_code == 0, result.output
    assert result.stderr == f"wrote {lock}\n"  # progress lines leave stdout to the JSON
    doc = json.loads(result.stdout)
    written = json.loads((lock / "servefleet.lock.json").read_text())
    assert doc["lock_dir"] == str(lock)
    assert sorted(doc["stacks"]) == sorted(written["stacks"])
    for name, st in doc["stacks"].items():
        assert st["release"] == written["stacks"][name]["release"]
        assert st["packages"]["vllm-rbln"]
    monkeypatch.setattr(lockfleet, "check_lock", lambda fl: ["stack a: pins differ"])
    checked = invoke("lock", "inv.py", "--check", "--json")
    assert checked.exit_code == 1
    assert json.loads(checked.stdout) == {"lock_dir": str(lock), "matches": False, "stacks": 2,
                                          "differences": ["stack a: pins differ"]}  # fmt: skip
    monkeypatch.setattr(lockfleet, "check_lock", lambda fl: [])
    assert json.loads(invoke("lock", "inv.py", "--check", "--json").stdout)["matches"] is True


def test_wheelhouse_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import servefleet.release.wheelhouse as wheelhouse

    def fill(directory: str, files: Any, creds: Any, echo: Any, progress: Any = None) -> Any:
        echo("packages/a.whl: 3 bytes, sha256 ... checked")
        return wheelhouse.Filled(
            ["packages/a.whl"], ["driver/r.run"], ["models/x: answered 404"], 3
        )

    monkeypatch.setattr(wheelhouse, "fill", fill)
    monkeypatch.setattr(wheelhouse, "lock_files", lambda lock: ([], ["acme/hub-model"]))
    lock = tmp_path / "lock"
    shutil.copytree(REPO / "locks" / "lab", lock)
    result = invoke("wheelhouse", str(tmp_path / "wh"), "--lock-dir", str(lock), "--json")
    assert result.exit_code == 1
    assert json.loads(result.stdout) == {
        "directory": str(tmp_path / "wh"), "downloaded": ["packages/a.whl"],
        "present": ["driver/r.run"], "failed": ["models/x: answered 404"], "bytes": 3,
        "not_included": ["acme/hub-model"],
    }  # fmt: skip
    assert "servefleet: wheelhouse: models/x: answered 404" in result.stderr
    assert "packages/a.whl: 3 bytes" in result.stderr and "model acme/hub-model" in result.stderr
    afile = tmp_path / "afile"
    afile.write_text("")
    refused = invoke("wheelhouse", str(afile), "--lock-dir", str(lock))
    assert refused.exit_code == 2 and one_line(refused).startswith("servefleet: error: ")


ROLLBACK_ERR = (
    "--> Connecting to hosts...\n    [h1] Connected\n"
    "    [h2] Could not connect ([Errno None] Unable to connect to port 22 on 10.0.0.2)\n"
    "    [h3] Connected\n"
    "--> Beginning operation run...\n"
    "    [h1] servefleet: rolled back to 0123456789abcdef\n"
    "    [h3] servefleet: h3: no previous state to roll back to\n"
)


def test_rollback_json_names_each_hosts_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "inv.py").write_text(INVENTORY)
    ran: list[list[str]] = []

    def run_json(cmd: list[str]) -> tuple[int, dict[str, Any], str]:
        ran.append(cmd)
        return 1, {"failed_hosts": ["h2", "h3"]}, ROLLBACK_ERR

    monkeypatch.setattr(pyinfra_run, "run_json", run_json)
    result = invoke("rollback", "inv.py", "--json")
    assert result.exit_code == 1
    assert ran[0][1] == "--json" and ran[0][-1].endswith("rollback.py")
    assert json.loads(result.stdout) == {
        "h1": {"result": "ok", "release": "0123456789abcdef", "unreachable": False, "why": ""},
        "h2": {"result": "failed", "release": None, "unreachable": True,
               "why": "Could not connect ([Errno None] Unable to connect to port 22 on 10.0.0.2)"},
        "h3": {"result": "failed", "release": None, "unreachable": False,
               "why": "h3: no previous state to roll back to"},
    }  # fmt: skip
    # pyinfra printed no results: every host failed, unless it exited 0
    results = cmd_fleet.rollback_results(["h1"], 1, None, "")
    assert {r["result"] for r in results.values()} == {"failed"}
    assert cmd_fleet.rollback_results(["h1"], 0, None, "")["h1"]["result"] == "ok"


def test_run_json_passes_stderr_on_and_reads_the_results(capfd: pytest.CaptureFixture) -> None:
    script = (
        "import json, sys; print('[h1] working', file=sys.stderr); "
        "print(json.dumps({'results': {'failed_hosts': ['h1']}})); sys.exit(1)"
    )
    code, results, err = pyinfra_run.run_json([sys.executable, "-c", script])
    assert (code, results, err) == (1, {"failed_hosts": ["h1"]}, "[h1] working\n")
    assert "[h1] working" in capfd.readouterr().err


# ---------------------------------------------------------------------------------------------
# plan --diff


def drifted() -> Any:
    """A host whose unit 0 on disk is an older text (the probe of ``plan`` reports it)."""
    first = plan_host(settings(), probe())
    units = probed_units(first, {})
    old = first.instances[0].text.replace("Restart=on-failure", "Restart=always")
    assert old != first.instances[0].text
    unit = first.instances[0].unit
    units[unit] = {**units[unit], "file": hashlib.sha256(old.encode()).hexdigest(), "text": old}
    units["servefleet-vllm-9.service"] = {"active": "active", "running": "x", "file": "f",
                                          "reload": False, "text": "[Unit]\nDescription=old\n"}  # fmt: skip
    return plan_host(settings(), converged_probe(units=units)), old


def test_unit_diffs_are_unified_from_the_host_to_the_rendered_unit() -> None:
    plan, old = drifted()
    diffs = unit_diffs(plan)
    zero = plan.instances[0].unit
    assert sorted(diffs) == [zero, "servefleet-vllm-9.service"]
    assert diffs[zero].startswith(
        f"--- /etc/systemd/system/{zero}\n+++ /etc/systemd/system/{zero}\n"
    )
    assert {"-Restart=always", "+Restart=on-failure"} <= set(diffs[zero].splitlines())
    assert diffs["servefleet-vllm-9.service"].splitlines()[:2] == [
        "--- /etc/systemd/system/servefleet-vllm-9.service", "+++ /dev/null",
    ]  # fmt: skip
    assert unit_diffs(plan_host(settings(), converged_probe())) == {}  # nothing to write
    fresh = unit_diffs(plan_host(settings(), probe()))  # no unit yet: from /dev/null
    assert all(d.startswith("--- /dev/null\n") for d in fresh.values()) and len(fresh) == 4


def test_a_probe_without_the_text_is_said_not_guessed() -> None:
    plan, _ = drifted()
    zero = plan.instances[0].unit
    del plan.units[zero]["text"]
    assert (
        unit_diffs(plan)[zero] == f"(the probe did not report /etc/systemd/system/{zero}'s text)\n"
    )


def test_plan_diff_shows_each_units_diff_and_json_carries_them_only_with_diff(
    fleet: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan, _ = drifted()
    summary = plan_summary(plan)
    monkeypatch.setattr(pyinfra_run, "run_pyinfra", FakePyinfra({"h1": summary}, OUTPUT))
    result = invoke("plan", "inv.py", "--diff")
    assert result.exit_code == 1  # h2 unreachable, h3 failed
    assert plan_diffs({"h1": summary}) in result.stdout
    assert f"== h1: {plan.instances[0].unit}" in result.stdout
    assert "+++ /dev/null" in result.stdout
    assert "diffs" not in json.loads(invoke("plan", "inv.py", "--json").stdout)["h1"]
    with_diff = json.loads(invoke("plan", "inv.py", "--json", "--diff").stdout)
    assert with_diff["h1"]["diffs"] == summary["diffs"]
    monkeypatch.setattr(pyinfra_run, "run_pyinfra", FakePyinfra({"h1": plan_summary(
        plan_host(settings(), converged_probe()))}, OUTPUT))  # fmt: skip
    assert "no unit changes" in invoke("plan", "inv.py", "--diff").stdout


# ---------------------------------------------------------------------------------------------
# progress on stderr


def test_progress_counts_written_summaries_and_failed_connections(tmp_path: Path) -> None:
    shown: list[str] = []
    progress = pyinfra_run.Progress("status", ["h1", "h2", "h3"], str(tmp_path), shown.append)
    with progress:
        (tmp_path / "a.json").write_text("{}")
        progress.output.append("--> Connecting to hosts...\n    [h2] Could not connect (x)\n")
    assert shown[0] == "\rstatus: 0/3 hosts"
    assert shown[-2:] == ["\rstatus: 2/3 hosts", "\n"]
    assert len(set(shown)) == len(shown)  # drawn again only when the count moves


def test_run_watched_hands_each_line_to_the_progress(tmp_path: Path) -> None:
    shown: list[str] = []
    progress = pyinfra_run.Progress("plan", ["h1", "h2"], str(tmp_path), shown.append)
    script = (
        f"import pathlib; pathlib.Path({str(tmp_path)!r}, 'x.json').write_text('{{}}'); "
        "print('--> Connecting to hosts...'); print('    [h2] Could not connect (refused)')"
    )
    with progress:
        code, output = pyinfra_run.run_watched(
            [sys.executable, "-c", script], dict(os.environ), progress
        )
    assert code == 0 and "[h2] Could not connect (refused)" in output
    assert shown[-2:] == ["\rplan: 2/2 hosts", "\n"]


def test_plan_and_status_show_progress_on_a_terminal_only(
    fleet: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    summaries = {
        "status": healthy(),
        "plan": plan_summary(plan_host(settings(), converged_probe())),
    }

    def fake(cmd: list[str], env: dict[str, str]) -> tuple[int, str]:
        kind = ReportRequest.from_env(env).kind
        return FakePyinfra({"h1": summaries[str(kind)]}, OUTPUT)(cmd, env)

    def watched(cmd: list[str], env: dict[str, str], progress: Any) -> tuple[int, str]:
        progress.output.append(OUTPUT)
        return fake(cmd, env)

    monkeypatch.setattr(pyinfra_run, "run_pyinfra", fake)
    monkeypatch.setattr(pyinfra_run, "run_watched", watched)
    assert "hosts" not in invoke("status", "inv.py").stderr  # not a terminal
    monkeypatch.setattr(common, "shows_progress", lambda: True)
    for command in ("status", "plan"):
        err = invoke(command, "inv.py").stderr
        assert err.startswith(f"\r{command}: 0/3 hosts"), err
        assert f"\r{command}: 2/3 hosts\n" in err  # h1 written, h2 could not connect; h3 failed


# ---------------------------------------------------------------------------------------------
# shell completion


def complete(words: str, env: dict[str, str] | None = None) -> list[str]:
    """What click's bash completion offers for the last of ``words`` (``servefleet`` first)."""
    argv = words.split()
    cword = len(argv) - (0 if words.endswith(" ") else 1)
    result = CliRunner().invoke(
        cli.main,
        [],
        prog_name="servefleet",
        env={"_SERVEFLEET_COMPLETE": "bash_complete", "COMP_WORDS": words,
             "COMP_CWORD": str(cword), **(env or {})},
    )  # fmt: skip
    return [line.split(",", 1)[1] for line in result.output.splitlines() if line]


def test_completion_of_inventory_files_recipes_and_limit_hosts(
    fleet: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (fleet / "inventories").mkdir()
    (fleet / "inventories" / "prod.py").write_text(INVENTORY)
    (fleet / "inventories" / "notes.txt").write_text("")
    assert complete("servefleet plan inv") == ["inv.py", "inventories/"]
    assert complete("servefleet status inventories/") == ["inventories/prod.py"]
    assert complete(f"servefleet plan {fleet}/inventories/p") == [f"{fleet}/inventories/prod.py"]
    assert complete("servefleet resolve rbln/") == ["rbln/gpt-oss-120b"]
    assert "vllm/openai/gpt-oss-120b" in complete("servefleet recipes show vllm/openai/")
    assert complete("servefleet plan inv.py --limit ") == [
        "canary",
        "cr13",
        "inv",
        "h1",
        "h2",
        "h3",
    ]
    assert complete("servefleet rollout inventories/prod.py --limit h") == ["h1", "h2", "h3"]
    assert complete("servefleet lock inv.py --") and "--json" in complete(
        "servefleet lock inv.py --"
    )
    (fleet / "broken.py").write_text("raise SystemExit('the lab is not up')\n")
    assert complete("servefleet plan broken.py --limit ") == []  # nothing, and no traceback


def test_completion_is_documented() -> None:
    doc = (REPO / "docs" / "real-fleet.md").read_text()
    assert "_SERVEFLEET_COMPLETE=bash_source servefleet" in doc
    assert "_SERVEFLEET_COMPLETE=zsh_source servefleet" in doc


def test_a_real_shell_completion_script_loads(tmp_path: Path) -> None:
    """The script the docs tell bash to source is click's, from the installed command."""
    exe = Path(sys.executable).parent / "servefleet"
    proc = subprocess.run([str(exe)], env={**os.environ, "_SERVEFLEET_COMPLETE": "bash_source"},
                          capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == 0 and "complete -o nosort -F" in proc.stdout, proc.stderr
