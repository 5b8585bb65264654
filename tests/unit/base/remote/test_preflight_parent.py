"""``remote/preflight.py``'s parent side in-process (issue #37's mutation campaign; the program
itself, run as on a host, is test_preflight.py's): the instances JSON checked with each refusal's
words (``load_instances``, ``serve_args``), a unit's environment (``child_env``), one child run
(``run_child``, with subprocess.run the test's: its command, input, environment, directory and
timeout, and what a child that times out, cannot start or dies without results says), the
instances grouped by environment and directory (``preflight``), ``main``'s lines and exit
statuses, and the pure refusal helpers (``one_line``'s cut, ``flag_of``, ``refusal``)."""

from __future__ import annotations

import concurrent.futures
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from servefleet.base.remote import preflight

SERVE = ["/opt/r/bin/vllm", "serve", "m"]


def one(**over: Any) -> dict[str, Any]:
    return {"unit": "u.service", "argv": SERVE, "env": {"A": "1"}} | over


# -- load_instances and serve_args -------------------------------------------------------------


def test_instances_are_read_with_their_defaults() -> None:
    text = json.dumps([one(), one(unit="v", argv=["vllm", "serve"], env={}, cwd="/srv")])
    assert preflight.load_instances(text) == [
        {"unit": "u.service", "args": ["m"], "env": {"A": "1"}, "cwd": "/"},
        {"unit": "v", "args": [], "env": {}, "cwd": "/srv"},
    ]
    assert preflight.load_instances("[]") == []
    xpu = preflight.load_instances(json.dumps([one(unit="XPU-0.service", env={"X_Y": "X=1"})]))
    assert [(i["unit"], i["env"]) for i in xpu] == [("XPU-0.service", {"X_Y": "X=1"})]


@pytest.mark.parametrize(
    ("data", "says"),
    [
        ("{nope", "instances are not JSON: Expecting property name enclosed in double quotes"),
        ('"x"', "instances must be a JSON list, not str"),
        ("[1]", "instance 0 must be an object of unit, argv, env and optional cwd"),
        (json.dumps([one(), {"unit": "a", "env": {}}]),
         "instance 1 must be an object of unit, argv, env and optional cwd"),
        (json.dumps([one(cwd="/", more=1)]), "instance 0 must be an object of unit, argv, env"),
        (json.dumps([one(unit=3)]), "instance 0: unit must be a one-line name, not 3"),
        (json.dumps([one(unit="")]), "instance 0: unit must be a one-line name, not ''"),
        (json.dumps([one(unit="a\rb")]), "instance 0: unit must be a one-line name, not 'a\\rb'"),
        (json.dumps([one(unit="a\0b")]), "instance 0: unit must be a one-line name, not 'a\\x00b'"),
        (json.dumps([one(argv=["vllm", 1])]), "instance 0 (u.service): argv must be a list of strings"),
        (json.dumps([one(argv={"vllm": "serve"})]), "instance 0 (u.service): argv must be a list"),
        (json.dumps([one(env=[])]), "instance 0 (u.service): env must map names to strings"),
        (json.dumps([one(env={"": "1"})]), "instance 0 (u.service): env must map names to strings"),
        (json.dumps([one(env={"A=B": "1"})]), "instance 0 (u.service): env must map names to strings"),
        (json.dumps([one(env={"A": "1", "B": 2})]), "instance 0 (u.service): env must map names"),
        (json.dumps([one(env={"A\0": "1"})]),
         "instance 0 (u.service): argv and env may not hold NUL bytes"),
        (json.dumps([one(env={"A": "1\0"})]), "instance 0 (u.service): argv and env may not"),
        (json.dumps([one(argv=[*SERVE, "x\0"])]), "instance 0 (u.service): argv and env may not"),
        (json.dumps([one(cwd=7)]), "instance 0 (u.service): cwd must be an absolute path"),
        (json.dumps([one(cwd="srv")]), "instance 0 (u.service): cwd must be an absolute path"),
        (json.dumps([one(cwd="/a\0")]), "instance 0 (u.service): cwd must be an absolute path"),
        (json.dumps([one(argv=["/usr/bin/python", "serve"])]),
         "argv ['/usr/bin/python', 'serve'] is not a vllm serve command line (.../vllm serve ...)"),
    ],
)  # fmt: skip
def test_each_bad_instance_is_named_with_what_is_wrong(data: str, says: str) -> None:
    with pytest.raises(preflight.BadInput) as bad:
        preflight.load_instances(data)
    assert str(bad.value).startswith(says), str(bad.value)


def test_serve_args_are_what_follows_vllm_serve() -> None:
    assert preflight.serve_args(["/x/bin/vllm", "serve", "m", "--port", "1"]) == [
        "m",
        "--port",
        "1",
    ]
    assert preflight.serve_args(["serve", "m"]) == ["m"]
    for argv in (["vllm"], [], ["vllm", "run", "serve"], ["/x/vllm2", "serve"]):
        with pytest.raises(preflight.BadInput, match="is not a vllm serve command line"):
            preflight.serve_args(argv)


# -- the refusal helpers -----------------------------------------------------------------------


def test_one_line_joins_drops_the_links_and_cuts_at_the_limit() -> None:
    text = "first  line\n\n  second\tline \nFor further information visit x\nlast"
    assert preflight.one_line(text) == "first line second line last"
    assert preflight.one_line("a\n  For further information b") == "a"
    limit = preflight.MAX_MESSAGE
    assert preflight.one_line("x" * limit) == "x" * limit
    assert preflight.one_line("x" * (limit + 1)) == "x" * (limit - 3) + "..."


@pytest.mark.parametrize(
    ("message", "flag"),
    [
        ("argument --max-model-len/-l: invalid value", "--max-model-len"),
        ("argument -q: expected one argument", "-q"),
        ("unrecognized arguments: --x=1 --y", "--x"),
        ("unrecognized arguments: --x=a=b", "--x"),  # split at the first "=" only
        ("unrecognized arguments: stray", "stray"),
        ("ValueError: the chat template is missing --foo", "--chat-template"),
        ("KeyError: 'invalid tool call parser: x' (--tool-parser-plugin)", "--tool-call-parser"),
        ("KeyError: 'Reasoning parser x not found'", "--reasoning-parser"),
        ("TypeError: invalid reasoning parser: --a", "--reasoning-parser"),
        ("ValueError: use --kv-transfer-config.x_y=1 with --b", "--kv-transfer-config.x_y"),
        ("ValueError: nothing named", "vllm"),
        ("ValueError: set --Xy_z or -q", "--Xy_z"),
    ],
)
def test_flag_of_each_kind_of_message(message: str, flag: str) -> None:
    assert preflight.flag_of(message) == flag


def test_a_refusal_line_carries_flag_key_message_and_gap() -> None:
    message = "argument --attention-config/-ac: 1 error\nuse_x\n  Unexpected keyword argument [t]"
    assert preflight.refusal("u.service", message, "0.30.0") == {
        "unit": "u.service",
        "ok": False,
        "flag": "--attention-config",
        "key": "use_x",
        "message": "argument --attention-config/-ac: 1 error use_x Unexpected keyword argument [t]",
        "line": "u.service: --attention-config: argument --attention-config/-ac: 1 error use_x "
        "Unexpected keyword argument [t]",
        "gap": "the recipe needs a newer vLLM than the pin 0.30.0 (key use_x of "
        "--attention-config is not in it)",
    }
    assert preflight.unknown_key("x\nkey\nUnexpected keyword argument") is None  # not indented
    assert preflight.version_gap("unrecognized arguments: --a=b=c", "1") == (
        "the recipe needs a newer vLLM than the pin 1 (flag --a is not in it)"
    )


# -- the unit's environment and one child ------------------------------------------------------


def test_a_child_gets_systemds_few_variables_then_the_units(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, value in {"PATH": "/p", "HOME": "/h", "LANG": "C", "LC_ALL": "C.UTF-8",
                        "OTHER": "o"}.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    assert preflight.child_env({"HOME": "/u", "X": "1"}) == {
        "PATH": "/p", "HOME": "/u", "LANG": "C", "LC_ALL": "C.UTF-8", "X": "1"
    }  # fmt: skip
    monkeypatch.delenv("PATH")
    monkeypatch.delenv("LC_ALL")
    assert preflight.child_env({}) == {"PATH": preflight.SYSTEMD_PATH, "HOME": "/h", "LANG": "C"}
    assert preflight.child_env({"PATH": "/own"})["PATH"] == "/own"


@pytest.fixture
def runs(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """subprocess.run as run_child calls it: each call kept in ``calls``; ``results`` (a doc)
    written to the child's results file, or ``raise`` raised, or ``proc`` returned as it is."""
    w: dict[str, Any] = {"calls": [], "results": {"pin": "0.30.0", "messages": [None]},
                         "raise": None, "stdout": "", "stderr": "", "code": 0}  # fmt: skip

    def run(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        w["calls"].append((cmd, kw))
        if w["raise"] is not None:
            raise w["raise"]
        if w["results"] is not None:
            Path(cmd[3]).write_text(json.dumps(w["results"]))
        return subprocess.CompletedProcess(cmd, w["code"], w["stdout"], w["stderr"])

    monkeypatch.setattr(subprocess, "run", run)
    monkeypatch.setenv("PATH", "/p")
    return w


def test_a_child_runs_this_program_on_the_argvs_in_the_units_environment(
    runs: dict[str, Any],
) -> None:
    assert preflight.run_child([["m"], ["n", "--x"]], {"A": "1"}, "/srv") == runs["results"]
    [(cmd, kw)] = runs["calls"]
    assert cmd[:3] == [sys.executable, os.path.abspath(preflight.__file__), "--child"]
    assert os.path.basename(cmd[3]) == "results.json"
    assert os.path.basename(os.path.dirname(cmd[3])).startswith("servefleet-preflight-")
    assert not os.path.exists(os.path.dirname(cmd[3]))  # removed after
    assert kw == {"input": '[["m"], ["n", "--x"]]', "capture_output": True, "text": True,
                  "env": {"PATH": "/p", "A": "1"} | {k: os.environ[k] for k in ("HOME", "LANG",
                  "LC_ALL") if k in os.environ}, "cwd": "/srv", "timeout": 900}  # fmt: skip


def test_a_child_that_gives_no_answer_says_why(runs: dict[str, Any]) -> None:
    runs["raise"] = subprocess.TimeoutExpired(["x"], 900)
    assert preflight.run_child([["m"]], {}, "/") == {
        "error": "vLLM's parser gave no answer within 900 s"
    }
    runs["raise"] = FileNotFoundError(2, "No such file or directory")
    assert preflight.run_child([["m"]], {}, "/gone") == {
        "error": f"cannot run {sys.executable} in /gone: No such file or directory"
    }
    runs["raise"], runs["results"] = None, None
    runs.update(code=-9, stdout="out 1\nout 2\n", stderr="")
    assert preflight.run_child([["m"]], {}, "/") == {
        "error": "vLLM's parser died (status -9): out 2"
    }
    runs.update(code=1, stderr="Traceback\n  File x\nImportError: y\n")
    assert preflight.run_child([["m"]], {}, "/") == {
        "error": "vLLM's parser died (status 1): ImportError: y"
    }
    runs.update(code=1, stdout=" \n", stderr="")
    assert preflight.run_child([["m"]], {}, "/") == {
        "error": "vLLM's parser died (status 1): no output"
    }


def test_a_child_whose_results_are_not_json_died(
    runs: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    def run(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        Path(cmd[3]).write_text("{cut")
        return subprocess.CompletedProcess(cmd, 0, "", "half written\n")

    monkeypatch.setattr(subprocess, "run", run)
    assert preflight.run_child([["m"]], {}, "/") == {
        "error": "vLLM's parser died (status 0): half written"
    }


# -- preflight: one child per environment and directory ----------------------------------------


@pytest.fixture
def children(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """run_child as preflight calls it: each call kept; its answer from ``answer(argvs, env,
    cwd)``; the pool's size kept in ``workers``."""
    w: dict[str, Any] = {"calls": [], "workers": []}

    def run_child(argvs: list[list[str]], env: dict[str, str], cwd: str) -> dict[str, Any]:
        w["calls"].append((argvs, env, cwd))
        return w["answer"](argvs, env, cwd)  # type: ignore[no-any-return]

    real = concurrent.futures.ThreadPoolExecutor

    def pool(max_workers: int) -> concurrent.futures.ThreadPoolExecutor:
        w["workers"].append(max_workers)
        return real(max_workers=max_workers)

    monkeypatch.setattr(preflight, "run_child", run_child)
    monkeypatch.setattr(concurrent.futures, "ThreadPoolExecutor", pool)
    return w


def inst(unit: str, args: list[str], env: dict[str, str], cwd: str = "/") -> dict[str, Any]:
    return {"unit": unit, "args": args, "env": env, "cwd": cwd}


def test_instances_share_a_child_by_environment_and_directory(
    children: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    def answer(argvs: list[list[str]], env: dict[str, str], cwd: str) -> dict[str, Any]:
        if env.get("BROKEN"):
            return {"error": "cannot build vLLM's parser:\nImportError: x"}
        messages = [None if a == ["ok"] else "unrecognized arguments: --new" for a in argvs]
        return {"pin": "0.30.0", "messages": messages}

    children["answer"] = answer
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    instances = [
        inst("a", ["ok"], {"B": "2", "A": "1"}),
        inst("b", ["--new"], {"BROKEN": "1"}),
        inst("c", ["--new"], {"A": "1", "B": "2"}),  # a's environment, in another order
        inst("d", ["ok"], {"A": "1", "B": "2"}, "/srv"),  # another directory
    ]
    results = preflight.preflight(instances)
    assert children["calls"] == [
        ([["ok"], ["--new"]], {"B": "2", "A": "1"}, "/"),
        ([["--new"]], {"BROKEN": "1"}, "/"),
        ([["ok"]], {"A": "1", "B": "2"}, "/srv"),
    ]
    assert children["workers"] == [3]
    gap = "the recipe needs a newer vLLM than the pin 0.30.0 (flag --new is not in it)"
    assert results == [
        {"unit": "a", "ok": True},
        {"unit": "b", "ok": False, "flag": "vllm", "key": None,
         "message": "cannot build vLLM's parser: ImportError: x",
         "line": "b: vllm: cannot build vLLM's parser: ImportError: x", "gap": None},
        {"unit": "c", "ok": False, "flag": "--new", "key": None,
         "message": "unrecognized arguments: --new",
         "line": "c: --new: unrecognized arguments: --new", "gap": gap},
        {"unit": "d", "ok": True},
    ]  # fmt: skip


def test_the_pool_is_bounded_by_the_cpus(
    children: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    children["answer"] = lambda argvs, env, cwd: {"pin": "1", "messages": [None] * len(argvs)}
    many = [inst(f"u{i}", ["ok"], {"N": str(i)}) for i in range(3)]
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert [r["ok"] for r in preflight.preflight(many)] == [True, True, True]
    monkeypatch.setattr(os, "cpu_count", lambda: None)
    preflight.preflight(many)
    assert preflight.preflight([]) == []
    assert children["workers"] == [2, 1, 1]


# -- main ----------------------------------------------------------------------------------------


def test_main_prints_each_result_and_one_line_for_the_operator(
    children: dict[str, Any], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def answer(argvs: list[list[str]], env: dict[str, str], cwd: str) -> dict[str, Any]:
        return {"pin": "0.30.0", "messages": [
            None if a == ["ok"] else f"unrecognized arguments: {a[0]}" for a in argvs]}  # fmt: skip

    children["answer"] = answer
    data = json.dumps([one(argv=["vllm", "serve", "ok"]), one(unit="v", argv=["vllm", "serve", "--a"]),
                       one(unit="w", argv=["vllm", "serve", "b"])])  # fmt: skip
    assert preflight.main(["preflight.py", data]) == 1
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines[0] == '{"ok": true, "unit": "u.service"}'  # sorted keys
    assert [json.loads(line)["unit"] for line in lines] == ["u.service", "v", "w"]
    assert err == (
        "servefleet: pre-flight: v: --a: unrecognized arguments: --a; the recipe needs a newer "
        "vLLM than the pin 0.30.0 (flag --a is not in it) (and 1 more instance(s))\n"
    )
    monkeypatch.setattr(
        sys, "stdin", io.StringIO(json.dumps([one(unit="w", argv=["vllm", "serve", "b"])]))
    )
    assert preflight.main(["preflight.py", "-"]) == 1
    assert capsys.readouterr().err == "servefleet: pre-flight: w: b: unrecognized arguments: b\n"
    assert preflight.main(["preflight.py", json.dumps([one(argv=["vllm", "serve", "ok"])])]) == 0
    assert capsys.readouterr() == ('{"ok": true, "unit": "u.service"}\n', "")


def test_main_refuses_bad_input_and_bad_usage(
    children: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    assert preflight.main(["preflight.py", "[1]"]) == 2
    assert capsys.readouterr() == (
        "",
        "preflight: instance 0 must be an object of unit, argv, env and optional cwd\n",
    )
    usage = "usage: preflight.py INSTANCES_JSON (or - to read it from stdin)\n"
    for argv in (["preflight.py"], ["preflight.py", "a", "b"], ["p", "--child", "a", "b"],
                 ["p", "x", "--child", "y"]):  # fmt: skip
        assert preflight.main(argv) == 2
        assert capsys.readouterr() == ("", usage)
    assert children["calls"] == []


def test_main_runs_the_child_side(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []

    def child(results: str) -> int:
        seen.append(results)
        return 0

    monkeypatch.setattr(preflight, "child", child)
    assert preflight.main(["preflight.py", "--child", "/tmp/r.json"]) == 0
    assert seen == ["/tmp/r.json"]
