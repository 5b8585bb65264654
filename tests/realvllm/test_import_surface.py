"""The simulated vllm stands in for the real one only at paths and names vLLM 0.30.0 has (issue
#30): every module of the simulator's ``vllm`` package is either the simulation's own (listed
below) or a module the real wheel has, and each public name it defines there, each method of
its classes and each function's parameters, are the real wheel's, on both platforms. The
parser registries it answers from are the real ones (gen_registries.py --check)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
PACKAGE = REPO / "src" / "servefleet" / "fleet" / "lab" / "simulator" / "packages" / "vllm"
sys.path.insert(0, str(HERE))
import build  # noqa: E402

# the simulation's own modules: no real vLLM module of that name is stood in for
SIM_ONLY = {
    "vllm.__main__",  # `python -m vllm` is the sim's entry for its host scripts
    "vllm.checks",
    "vllm.common",
    "vllm.compile_cache",
    "vllm.config_schemas",
    "vllm.cuda",
    "vllm.flag_table",
    "vllm.generation",
    "vllm.group_head",
    "vllm.http_api",
    "vllm.kv_transfer",
    "vllm.lifecycle",
    "vllm.middleware",  # --middleware as vLLM's register.py applies it, around the sim's routes
    "vllm.parallel_plan",
    "vllm.registries",
    "vllm.rendezvous",
    "vllm.serve_args",
    "vllm.serving_metrics",
    "vllm.sim",
}


def _module(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _params(node: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    a = node.args
    names = [x.arg for x in [*a.posonlyargs, *a.args]]
    names += [a.vararg.arg] if a.vararg else []
    names += [x.arg for x in a.kwonlyargs]
    names += [a.kwarg.arg] if a.kwarg else []
    return [n for n in names if n not in ("self", "cls")]


def _public(name: str) -> bool:
    return not name.startswith("_") or name in ("__init__", "__version__", "__call__")


def simulated() -> dict[str, dict[str, Any]]:
    """module -> {name: description} of what each stand-in module defines, from its source."""
    out: dict[str, dict[str, Any]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = _module(path)
        if module in SIM_ONLY:
            continue
        names: dict[str, Any] = {}
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef) and _public(node.name):
                methods = {
                    m.name: _params(m)
                    for m in node.body
                    if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)) and _public(m.name)
                }
                names[node.name] = {"kind": "class", "methods": methods}
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _public(node.name):
                names[node.name] = {"kind": "function", "parameters": _params(node)}
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    if isinstance(t, ast.Name) and _public(t.id) and t.id != "__all__":
                        names[t.id] = {"kind": "value"}
                    if isinstance(t, ast.Name) and t.id == "__all__":
                        for n in ast.literal_eval(node.value):  # type: ignore[arg-type]
                            names.setdefault(n, {"kind": "exported"})
        out[module] = names
    return out


def _real(platform: str, wanted: dict[str, list[str]]) -> dict[str, Any]:
    if not build.is_built():
        pytest.fail(
            f"the real-wheel tier is not built ({build.built()}): run tests/realvllm/build.py",
            pytrace=False,
        )
    proc = subprocess.run(
        [build.python(platform), str(HERE / "surface_probe.py")],
        input=json.dumps(wanted), capture_output=True, text=True, timeout=300,
        env={"VLLM_CONFIGURE_LOGGING": "0", "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def _differences(sim: dict[str, dict[str, Any]], real: dict[str, Any]) -> list[str]:
    out = []
    for module, names in sim.items():
        got = real[module]
        if isinstance(got, str):
            out.append(f"{module}: not a module of the real wheel ({got})")
            continue
        for name, want in names.items():
            have = got[name]
            where = f"{module}.{name}"
            if have is None:
                out.append(f"{where}: not in the real wheel")
            elif want["kind"] in ("value", "exported"):
                continue
            elif want["kind"] != have["kind"]:
                out.append(f"{where}: a {want['kind']} here, a {have['kind']} in vLLM")
            elif want["kind"] == "function" and want["parameters"] != have["parameters"]:
                out.append(
                    f"{where}{tuple(want['parameters'])}: vLLM's {tuple(have['parameters'])}"
                )
            elif want["kind"] == "class":
                for method, params in want["methods"].items():
                    real_params = have["methods"].get(method, "missing")
                    if real_params == "missing":
                        out.append(f"{where}.{method}: not in vLLM's class")
                    elif params != real_params:
                        out.append(f"{where}.{method}{tuple(params)}: vLLM's {tuple(real_params)}")
    return out


@pytest.mark.parametrize("platform", ["upstream", "rbln"])
def test_every_stand_in_name_is_the_real_wheels(platform: str) -> None:
    sim = simulated()
    assert "vllm.entrypoints.cli.serve" in sim and "vllm.utils.argparse_utils" in sim
    real = _real(platform, {m: sorted(n) for m, n in sim.items()})
    differences = _differences(sim, real)
    names = sum(len(n) for n in sim.values())
    print(f"{platform}: {len(sim)} stand-in modules, {names} names, {len(differences)} differ")
    assert not differences, "\n".join(differences)


PREFLIGHT = REPO / "src" / "servefleet" / "base" / "remote" / "preflight.py"


def preflight_names() -> dict[str, dict[str, list[str]]]:
    """What the host's pre-flight takes from the installed vLLM, read from its syntax tree:
    ``ServeCli.SERVE_MODULE``, each ``_named(serve | launcher, "NAME", ...)`` (``launcher``:
    the module of ``serve.setup_server``), and the manager methods it calls by name."""
    tree = ast.parse(PREFLIGHT.read_text())
    serve = next(
        ast.literal_eval(n.value)
        for n in ast.walk(tree)
        if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "SERVE_MODULE"
    )
    where = {"serve": serve, "launcher": f"@{serve}.setup_server"}
    names: dict[str, list[str]] = {serve: [], where["launcher"]: []}
    for n in ast.walk(tree):
        if isinstance(n, ast.Call) and ast.unparse(n.func) == "_named" and len(n.args) >= 2:
            owner, name = ast.unparse(n.args[0]), ast.literal_eval(n.args[1])
            if owner in where:
                names[where[owner]].append(name)
    methods: dict[str, list[str]] = {"ToolParserManager": [], "ReasoningParserManager": []}
    for n in ast.walk(tree):  # ("tool_parser_plugin", self.tools, "import_tool_parser"), ...
        if isinstance(n, ast.Tuple) and len(n.elts) == 3 and isinstance(n.elts[2], ast.Constant):
            manager = {
                "self.tools": "ToolParserManager",
                "self.reasoning": "ReasoningParserManager",
            }
            methods[manager[ast.unparse(n.elts[1])]].append(n.elts[2].value)
        if isinstance(n, ast.Attribute) and ast.unparse(n.value) == "self.reasoning":
            methods["ReasoningParserManager"].append(n.attr)
    return {"modules": names, "methods": methods}


@pytest.mark.parametrize("platform", ["upstream", "rbln"])
def test_what_the_preflight_takes_is_in_the_real_wheel(platform: str) -> None:
    wanted = preflight_names()
    modules, methods = wanted["modules"], wanted["methods"]
    assert len(sum(modules.values(), [])) >= 6 and all(methods.values()), wanted
    real = _real(platform, {m: sorted(set(n)) for m, n in modules.items()})
    missing = [f"{m}.{n}" for m, names in modules.items() for n in names
               if isinstance(real[m], str) or real[m][n] is None]  # fmt: skip
    assert not missing, (missing, real)
    launcher = real[f"@{next(iter(modules))}.setup_server"]
    for manager, names in methods.items():
        have = launcher[manager]["methods"]
        assert {n for n in names if n not in have} == set(), (manager, sorted(have))


def test_the_simulated_registries_are_the_real_ones() -> None:
    if not build.is_built():
        pytest.fail(
            f"the real-wheel tier is not built ({build.built()}): run tests/realvllm/build.py",
            pytrace=False,
        )
    proc = subprocess.run(
        [sys.executable, str(HERE / "gen_registries.py"), "--check"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
