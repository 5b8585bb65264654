"""The flow runs one way: every import statement of every module, function-level ones included,
reaches only its own layer or a lower one, and the modules form no circle.

The layers, written once in layer_table.py (top first; docs/design.md describes them):
the CLI and the deploy steps use the fleet commands, which use the host plan, which uses the
release (locks, builds, wheelhouse), which uses the renderer and the settings; the settings read
the kinds (recipe families and their hosts), which resolve into a ServeSpec; everything stands on
the base (errors, shipped files, the host contract and host programs in ``remote/``). A
component that spans layers (``router/``: its plan, renderer, templates and deploy step in one
place) is a package of its own, and each of its modules sits in the layer of its role.
"""

from __future__ import annotations

import ast
from pathlib import Path

from layer_table import COMPONENTS, LAYERS, PLACED, ROOT, SRC


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
    """The index of the layer a module belongs to: its package under ``servefleet``."""
    if module in ROOT:
        return 0
    for prefix, layer in PLACED.items():
        if module == prefix or module.startswith(prefix + "."):
            return LAYERS.index(layer)
    parts = module.split(".")
    top = parts[1]
    if top in COMPONENTS:
        roles, role = COMPONENTS[top], parts[2] if len(parts) > 2 else "__init__"
        assert role in roles, f"{module} has no role in component {top} ({', '.join(roles)})"
        return LAYERS.index(roles[role])
    assert top in LAYERS, f"{module} sits in no layer's package ({', '.join(LAYERS)})"
    return LAYERS.index(top)


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


def test_each_role_of_a_component_is_a_layer() -> None:
    for component, roles in COMPONENTS.items():
        assert component not in LAYERS and (SRC / component / "__init__.py").is_file(), component
        assert "__init__" in roles and set(roles.values()) <= set(LAYERS), (component, roles)


def test_no_module_imports_a_higher_layer() -> None:
    upward = [
        f"{m} ({LAYERS[layer_of(m)]}) imports {t} ({LAYERS[layer_of(t)]})"
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
        if module.startswith("servefleet.base.remote"):
            assert all(t.startswith("servefleet.base.remote") for t in targets), (module, targets)


# The built-in hardware platforms' names (``servefleet.platforms``): only that package compares a
# string to one. Everywhere else a platform is an object asked through its interface, so a new
# platform is one module there plus data (#47). ``rbln`` is also the RBLN recipe family's name:
# a family is compared as the object it is, never by that string either.
PLATFORM_NAMES = {"rbln", "gpu", "nvidia", "amd"}
# the lab's simulator stands in for the hardware and its vendor's software on a lab host (the
# fake vllm-rbln): it is not the product, and #47 moves it out of the package
NOT_THE_PRODUCT = ("fleet/lab/simulator/",)


def _strings(node: ast.AST) -> list[str]:
    """The string constants a comparison operand is, or holds (a tuple, list or set of them)."""
    items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return [n.value for n in items if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def test_no_module_outside_the_platforms_compares_a_string_to_a_platform_name() -> None:
    found = []
    for module, path in sorted(modules().items()):
        rel = path.relative_to(SRC).as_posix()
        if module.startswith("servefleet.platforms") or rel.startswith(NOT_THE_PRODUCT):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            operands = [node.left, *node.comparators] if isinstance(node, ast.Compare) else []
            if isinstance(node, ast.MatchValue):
                operands = [node.value]
            named = [s for n in operands for s in _strings(n) if s.lower() in PLATFORM_NAMES]
            line = getattr(node, "lineno", 0)
            found += [f"{rel}:{line}: compares {s!r}" for s in named]
    assert found == []


def tree_of(layer: str) -> list[str]:
    """What sits in a layer, as docs/design.md's table names it: the layer package's modules and
    packages (``release/lock.py``, ``kinds/rbln/``), the packages PLACED in it (``steps/``) and
    the modules of components whose role is in it (``router/plan.py``; a component's
    ``__init__``, like a layer package's, is not named)."""
    found: set[str] = set()
    for module in modules():
        if module in ROOT or LAYERS[layer_of(module)] != layer:
            continue
        if module.removeprefix("servefleet.") in COMPONENTS:  # a component's __init__
            continue
        parts = module.split(".")[1:]
        placed = next((p for p in PLACED if module == p or module.startswith(p + ".")), None)
        if placed is not None:
            name = placed.split(".")[1]
            found.add(f"{name}.py" if (SRC / f"{name}.py").is_file() else f"{name}/")
        elif len(parts) == 1:  # the layer package itself, or a one-module layer
            found.add(f"{parts[0]}.py" if (SRC / f"{parts[0]}.py").is_file() else f"{parts[0]}/")
        else:
            child = parts[1]
            is_pkg = (SRC / parts[0] / child).is_dir()
            found.add(f"{parts[0]}/{child}/" if is_pkg else f"{parts[0]}/{child}.py")
    found.discard(f"{layer}/")
    return sorted(found)


def test_the_design_table_is_the_tree() -> None:
    """docs/design.md's layer table lists what each layer holds, exactly as the tree has it."""
    text = (SRC.parents[1] / "docs" / "design.md").read_text()
    rows = {}
    for line in text.split("| layer (top first) |", 1)[1].split("\n\n", 1)[0].splitlines()[2:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        rows[cells[0]] = sorted(c.strip(" `") for c in cells[1].split(","))
    want = {layer: tree_of(layer) for layer in LAYERS}
    assert rows == want, "\n".join(
        f"| {layer} | {', '.join(f'`{m}`' for m in mods)} |" for layer, mods in want.items()
    )
