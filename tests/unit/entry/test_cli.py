"""The CLI: recipes list/show, resolve in every format, one-line errors, vLLM dispatch."""

from __future__ import annotations

import json
import shlex
import sys
import types
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import given, settings, strategies as st
from rbln_cases import COMPILER, DATA, TINY, combinations, seed
from repo_paths import REPO
from systemd_parse import parse_unit

from servefleet.base.errors import RecipeError
from servefleet.entry.cli import main
from servefleet.hostplan.instance_unit import GUARD_ARGS
from servefleet.spec import Requirements, Server, ServeSpec

GOLDEN = DATA / "golden" / "rbln"
SEED_COMBOS = list(combinations(seed()))


def run(*args: str):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


@pytest.mark.parametrize(
    "cmd", [[], ["recipes"], ["recipes", "list"], ["recipes", "show"], ["resolve"]]
)
def test_help(cmd: list[str]) -> None:
    result = run(*cmd, "--help")
    assert result.exit_code == 0 and "Usage:" in result.output


def test_recipes_list_and_show() -> None:
    out = run("recipes", "list").output.splitlines()
    assert out[0] == "rbln/gpt-oss-120b" and "vllm/openai/gpt-oss-120b" in out
    info = json.loads(run("recipes", "show", "rbln/gpt-oss-120b", "--json").output)
    target = info["strategies"][0]["targets"][1]
    assert target["target"] == "Throughput" and target["skus"] == ["RBLN-CR13"]
    assert target["axes"]["spec_decode"] == ["off", "eagle3", "suffix"]
    assert target["defaults"]["tool_calling"] == "on"
    assert target["recommended"]["lmcache"] == "rds"


@pytest.mark.parametrize("case", sorted(p.stem for p in GOLDEN.glob("*.json")))
def test_golden(case: str) -> None:
    """The golden only compares; tests/regen_goldens.py rewrites it after a wanted change."""
    data = json.loads((GOLDEN / f"{case}.json").read_text())
    result = run("resolve", *data["args"])
    assert result.exit_code == 0, result.output
    expected = data["output"]  # text for --format shell/unit, else the JSON
    assert (result.output if isinstance(expected, str) else json.loads(result.output)) == expected


def test_golden_cases_exist() -> None:
    names = {p.stem for p in GOLDEN.glob("*.json")}
    assert {
        "latency-base",
        "latency-recommended",
        "throughput-base",
        "throughput-recommended",
    } <= names


combo_index = st.integers(min_value=0, max_value=len(SEED_COMBOS) - 1)


def _set_args(sel: dict[str, str]) -> list[str]:
    return [a for k, v in sel.items() for a in ("--set", f"{k}={v}")]


@settings(max_examples=40, deadline=None)
@given(combo_index)
def test_shell_format_parses_back(i: int) -> None:
    _, target, sel = SEED_COMBOS[i]
    args = [
        "resolve",
        "rbln/gpt-oss-120b",
        "--target",
        target,
        *_set_args(sel),
        "--compiler-version",
        COMPILER,
    ]
    spec = json.loads(run(*args).output)["servers"][0]
    words = shlex.split(run(*args, "--format", "shell").output)
    n = len(spec["env"])
    assert dict(w.split("=", 1) for w in words[:n]) == spec["env"]
    assert list(dict(w.split("=", 1) for w in words[:n])) == list(spec["env"])
    assert words[n:] == spec["argv"]


def test_shell_and_unit_of_the_fixture_card() -> None:
    args = ["resolve", str(TINY), "--set", "lmcache=cpu", "--compiler-version", COMPILER]
    spec = json.loads(run(*args).output)["servers"][0]
    words = shlex.split(run(*args, "--format", "shell").output)
    assert words == [f"{k}={v}" for k, v in spec["env"].items()] + spec["argv"]
    argv, env = parse_unit(run(*args, "--format", "unit").output)
    assert argv[0].endswith("/bin/vllm")
    assert argv[1:] == [*spec["argv"][1:], "--port", "8000", "--shutdown-timeout", "60",
                        *GUARD_ARGS]  # fmt: skip
    assert {k: env[k] for k in spec["env"]} == spec["env"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["rbln/gpt-oss-120b", "--set", "spec_decode=ngram"], "is shown on the card but"),
        (["rbln/gpt-oss-120b", "--set", "lmcache"], "--set 'lmcache' is not AXIS=VALUE"),
        (["rbln/gpt-oss-120b", "--target", "fast"], "allowed: Latency, Throughput"),
        (["rbln/gpt-oss-120b", "--strategy", "pd"], "allowed: aggregated"),
        (["rbln/gpt-oss-120b", "--compiler-version", "x"], "not a version like 0.12.0"),
        (
            ["rbln/gpt-oss-120b", "--hardware", "h200", "--tp", "2"],
            "--hardware, --tp apply to the other kind of recipe only",
        ),
        (["rbln/nope"], "no recipe 'rbln/nope'"),
        (["rbln/gpt-oss-120b", "--format", "yaml"], "'yaml' is not one of 'json', 'shell', 'unit'"),
        ([str(TINY), "--set", "lmcache=cpu", "--set", "spec_decode=suffix"], "is excluded"),
        ([str(DATA / "rbln" / "broken" / "npus-zero.json")], "npus must be a positive integer"),
    ],
)
def test_user_errors_are_one_line_exit_2(args: list[str], message: str) -> None:
    result = CliRunner().invoke(main, ["resolve", *args])
    assert result.exit_code == 2
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("servefleet: error: ")
    assert message in lines[0]
    assert "Traceback" not in result.output


def test_missing_argument_is_one_line() -> None:
    result = CliRunner().invoke(main, ["resolve"])
    assert result.exit_code == 2
    assert result.stderr == "servefleet: error: Missing argument 'RECIPE'.\n"


@pytest.fixture
def vllm_stub(monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    calls: list[dict] = []
    mod = types.ModuleType("servefleet.kinds.vllm")

    def load_vllm_recipe(path: Path) -> object:
        calls.append({"load": path})
        return "recipe-object"

    def resolve_vllm(recipe: object, **kw: object) -> ServeSpec:
        calls.append({"recipe": recipe, **kw})
        if kw.get("hardware") == "bad":
            raise RecipeError("unknown hardware 'bad' (allowed: h200)")
        return ServeSpec(
            recipe="vllm/openai/gpt-oss-120b",
            kind="vllm",
            selection={"hardware": "h200"},
            servers=[Server("main", ["vllm", "serve", "m", "--x", "a b"], {"E": "1"})],
            requirements=Requirements(),
        )

    def describe_vllm(recipe: object) -> dict:
        return {"hardware": ["h200"]}

    mod.load_vllm_recipe = load_vllm_recipe  # type: ignore[attr-defined]
    mod.resolve_vllm = resolve_vllm  # type: ignore[attr-defined]
    mod.describe_vllm = describe_vllm  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "servefleet.kinds.vllm", mod)
    return calls


def test_vllm_dispatch(vllm_stub: list[dict]) -> None:
    result = run(
        "resolve",
        "vllm/openai/gpt-oss-120b",
        "--hardware",
        "h200",
        "--tp",
        "2",
        "--feature",
        "a=b",
        "--feature",
        "c",
        "--no-feature",
        "d",
        "--strategy",
        "s",
        "--format",
        "shell",
    )
    assert result.output == "E=1 vllm serve m --x 'a b'\n"
    assert vllm_stub[0]["load"].as_posix().endswith("recipes/vllm/models/openai/gpt-oss-120b.yaml")
    assert vllm_stub[1] == {
        "recipe": "recipe-object",
        "hardware": "h200",
        "strategy": "s",
        "variant": None,
        "tp": 2,
        "features": ["a=b", "c"],
        "no_features": ["d"],
        "kv_offload": None,
        "task": None,
        "pool_parallelism": None,
        "nodes": None,  # a multi-node strategy's node count (none given: the recipe's floor)
    }
    shown = json.loads(run("recipes", "show", "vllm/openai/gpt-oss-120b", "--json").output)
    assert shown == {"recipe": "vllm/openai/gpt-oss-120b", "kind": "vllm", "hardware": ["h200"]}


def test_vllm_refuses_rbln_options_and_reports_errors(vllm_stub: list[dict]) -> None:
    result = CliRunner().invoke(
        main, ["resolve", "vllm/openai/gpt-oss-120b", "--recommended", "--sku", "X"]
    )
    assert result.exit_code == 2
    assert "--recommended, --sku apply to the other kind of recipe only" in result.stderr
    assert "its options: --hardware" in result.stderr
    result = CliRunner().invoke(main, ["resolve", "vllm/openai/gpt-oss-120b", "--hardware", "bad"])
    assert result.exit_code == 2
    assert result.stderr == "servefleet: error: unknown hardware 'bad' (allowed: h200)\n"


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["resolve"],
        ["recipes", "show"],
        ["lab", "up"],
        ["plan"],
        ["status"],
        ["rollout"],
        ["lock"],
    ],
)
def test_dash_h_is_help_everywhere(args: list[str]) -> None:
    result = CliRunner().invoke(main, [*args, "-h"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("Usage: ")


def _commands(group: Any = main, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], bool]]:
    """Every command's path under ``servefleet`` and whether it is a group."""
    import click

    out = [(path, isinstance(group, click.Group))]
    if isinstance(group, click.Group):
        for name, sub in sorted(group.commands.items()):
            out += _commands(sub, (*path, name))
    return out


COMMANDS = _commands()


def test_the_command_list_is_whole() -> None:
    names = {" ".join(p) for p, _ in COMMANDS}
    assert {"plan", "status", "rollout", "rollback", "lock", "wheelhouse", "lab up"} <= names


@pytest.mark.parametrize("flag", ["-h", "--help"])
@pytest.mark.parametrize(
    ("path", "group"), COMMANDS, ids=[" ".join(p) or "servefleet" for p, _ in COMMANDS]
)
def test_help_works_on_every_command(path: tuple[str, ...], group: bool, flag: str) -> None:
    """Alone and, for a command, after an argument (an option after INVENTORY is rollback's own,
    not pyinfra's)."""
    for args in [[*path, flag]] + ([] if group else [[*path, "inventories/prod.py", flag]]):
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 0, (args, result.output)
        assert result.output.startswith("Usage: "), (args, result.output)
        assert f"{' '.join(path)} [OPTIONS]" in result.output.splitlines()[0]


def test_the_exit_code_table_is_the_one_in_the_docs() -> None:
    from servefleet.base.exitcodes import BEGIN, END, exit_code_table

    doc = (REPO / "docs" / "exit-codes.md").read_text()
    table = doc.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n") + "\n"
    assert table == exit_code_table(), (
        "docs/exit-codes.md is stale: python -m servefleet.base.exitcodes"
    )


def test_every_exit_status_of_the_cli_is_from_the_table() -> None:
    """No command exits with a number of its own: each sys.exit gets an Exit member, a name
    bound to one, or (rollback) pyinfra's own status."""
    import ast

    import servefleet

    root = Path(servefleet.__file__).resolve().parent
    literal = []
    for path in [root / "entry" / "cli.py", *sorted((root / "fleet" / "lab").glob("*.py"))]:
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and ast.unparse(node.func) in ("sys.exit", "exit", "ctx.exit")
                and any(isinstance(n, ast.Constant) and isinstance(n.value, int)
                        for a in node.args for n in ast.walk(a))
            ):  # fmt: skip
                literal.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    assert literal == []
