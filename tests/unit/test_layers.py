"""The flow runs one way: every import statement of every module, function-level ones included,
reaches only its own layer or a lower one, and the modules form no circle.

The layers, written once here (top first; docs/design.md describes them):
the CLI and the deploy steps use the fleet commands, which use the host plan, which uses the
release (locks, builds, wheelhouse), which uses the renderer and the settings; the settings read
the kinds (recipe families and their hosts), which resolve into a ServeSpec; everything stands on
the base (errors, shipped files, the host contract and host programs in ``remote/``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import servefleet

SRC = Path(servefleet.__file__).resolve().parent

# Top first: a module may import its own layer and the ones after it, never one before it.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("entry", ("servefleet", "servefleet.__main__", "servefleet.cli", "servefleet.deploys",
               "servefleet.steps")),
    ("fleet", ("servefleet.rollout", "servefleet.fleetview", "servefleet.lockfleet",
               "servefleet.datadoc", "servefleet.inventory", "servefleet.lab",
               "servefleet.scaffold")),
    ("host plan", ("servefleet.hostplan", "servefleet.router")),
    ("release", ("servefleet.release", "servefleet.glibc", "servefleet.builds",
                 "servefleet.wheelhouse", "servefleet.lock", "servefleet.prewarm_store",
                 "servefleet.uvbin", "servefleet.sdists", "servefleet.simpleindex")),
    ("render", ("servefleet.render", "servefleet.systemd")),
    ("settings", ("servefleet.settings", "servefleet.checks")),
    ("kinds", ("servefleet.kinds",)),
    ("spec", ("servefleet.spec",)),
    ("base", ("servefleet.errors", "servefleet.exitcodes", "servefleet.shipped",
              "servefleet.vllm_args", "servefleet.flags", "servefleet.download",
              "servefleet.subenv", "servefleet.sandbox", "servefleet.version", "servefleet.once",
              "servefleet.remote")),
]  # fmt: skip


def modules() -> dict[str, Path]:
    """Every module of the package by its dotted name (packages by their ``__init__``)."""
    out = {}
    for path in SRC.rglob("*.py"):
        if "_files" in path.relative_to(SRC).parts:
            continue
        parts = ("servefleet", *path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def layer_of(module: str) -> int:
    """The index of the layer a module belongs to: the longest prefix that names it."""
    best, found = -1, None
    for i, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            # the package itself ("servefleet", its __init__) names only itself
            inside = module.startswith(prefix + ".") and prefix != "servefleet"
            if (module == prefix or inside) and len(prefix) > best:
                best, found = len(prefix), i
    assert found is not None, f"{module} is in no layer of LAYERS"
    return found


def imports(path: Path, known: dict[str, Path]) -> set[str]:
    """The servefleet modules a file imports, at any depth of its syntax tree."""
    out: set[str] = set()

    def owner(name: str) -> str:
        while name not in known and "." in name:
            name = name.rpartition(".")[0]
        return name

    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(owner(a.name) for a in node.names if a.name.startswith("servefleet"))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("servefleet"):
            module = str(node.module)
            subs = [f"{module}.{a.name}" for a in node.names if f"{module}.{a.name}" in known]
            out.update(subs)
            if len(subs) < len(node.names):
                out.add(owner(module))
    return out


def graph() -> dict[str, set[str]]:
    known = modules()
    return {m: imports(p, known) - {m} for m, p in known.items()}


def test_every_module_is_in_a_layer() -> None:
    for module in modules():
        layer_of(module)


def test_no_module_imports_a_higher_layer() -> None:
    upward = [
        f"{m} ({LAYERS[layer_of(m)][0]}) imports {t} ({LAYERS[layer_of(t)][0]})"
        for m, targets in sorted(graph().items())
        for t in sorted(targets)
        if layer_of(t) < layer_of(m)
    ]
    assert upward == []


def test_the_modules_form_no_circle() -> None:
    edges = graph()
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        if module in path:
            raise AssertionError(
                "import circle: " + " -> ".join([*path[path.index(module) :], module])
            )
        if module in done:
            return
        for target in sorted(edges.get(module, ())):
            visit(target, [*path, module])
        done.add(module)

    for module in sorted(edges):
        visit(module, [])


def test_host_programs_import_no_controller_module() -> None:
    """``remote/`` runs on the hosts: it imports nothing but itself (the host contract)."""
    for module, targets in graph().items():
        if module.startswith("servefleet.remote"):
            assert all(t.startswith("servefleet.remote") for t in targets), (module, targets)
