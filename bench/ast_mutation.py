"""The shapes of real bugs that mutmut's operators do not make (issue #52), by a small AST pass:
each mutant is one change to one node of a module, unparsed (``ast.unparse``) into a copy of a
commit's tree in a temporary directory, and the module's unit tests run there (``pytest -x``):
a failure or a timeout kills it, a pass is a survivor. The working tree is never written.

Operators (each mutant is one application of one):

- ``drop``: a statement of a function body left out (``pass`` when it is the body's only one;
  a docstring is not a statement here)
- ``swap``: two adjacent statements of a function body (or two blocks: an ``if``/``for``/
  ``with``/``try`` is one statement) swapped
- ``elt``: one element of a tuple, list or set literal left out (two or more elements; not an
  assignment's target, nor in an annotation)
- ``bool``: one operand of an ``and``/``or`` left out
- ``sorted``: a ``sorted(x)`` made ``x``; a ``for`` loop's or a comprehension's iterable ``y``
  made ``sorted(y)``

Run from ``bench/mutation.py --ast`` (or alone, the same options)::

    nice -n 19 .venv/bin/python bench/mutation.py --ast --modules lock,groups --budget 600
    .venv/bin/python bench/ast_mutation.py --modules lock --list       # the mutants, no run

``--budget`` is per module in seconds: the mutants are run in a fixed shuffled order (seed 0),
so a run stopped by its budget has checked a sample of every operator. Each module's counts
and its survivors (a unified diff each) go to ``--out`` (``<module>.json``, ``<module>.diff``).
"""

from __future__ import annotations

import argparse
import ast
import difflib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PYTHON = REPO / ".venv" / "bin" / "python"
OUT = Path.home() / ".cache" / "servefleet" / "ast-mutation"

# module key -> (path under src/servefleet, the unit tests that run for it, -k expression or
# ""). The tests are those that call the module in-process, with the slow ones (10 s and more
# a test on this machine) left out by -k, so that one mutant takes seconds.
_FLEET_FAST = (
    "not serve_iface_names and not headless_rank and not placeholders_bound"
    " and not multi_node_selection"
)
MODULES: dict[str, tuple[str, tuple[str, ...], str]] = {
    "lock": (
        "release/lock.py",
        (
            "tests/unit/release/test_lock_check_fields.py",
            "tests/unit/release/test_lock_load_refusals.py",
            "tests/unit/release/test_lock.py",
        ),
        "not pip_installs and not driver_runfile_only and not serve_files_file_and_refuses"
        " and not selection_names_the_stack",
    ),
    "groups": (
        "fleet/groups.py",
        (
            "tests/unit/fleet/test_group_rank_order.py",
            "tests/unit/fleet/test_group_same_data.py",
            "tests/unit/fleet/test_serving_groups.py",
            "tests/unit/entry/steps/test_group_failed_rank.py",
        ),
        _FLEET_FAST,
    ),
    "fleetplan": (
        "fleet/fleetplan.py",
        (
            "tests/unit/fleet/test_fleet_plan_run_rules.py",
            "tests/unit/fleet/test_fleet_plan.py",
            "tests/unit/fleet/test_group_rank_order.py",
            "tests/unit/fleet/test_serving_groups.py",
            "tests/unit/entry/steps/test_group_failed_rank.py",
        ),
        _FLEET_FAST,
    ),
    "types": (
        "hostplan/types.py",
        (
            "tests/unit/hostplan/test_key_file_converged.py",
            "tests/unit/hostplan/test_host_state.py",
            "tests/unit/hostplan/test_plan_reads_the_probe.py",
            "tests/unit/hostplan/test_plan_branches.py",
            "tests/unit/hostplan/test_content_drift.py",
            "tests/unit/hostplan/test_plan_converged_fields.py",
            "tests/unit/hostplan/test_plan_type_rules.py",
            "tests/unit/hostplan/test_deploy_plan.py",
            "tests/unit/hostplan/test_pd_placement.py",
            "tests/unit/router/test_router_plan.py",
        ),
        "not probe_reads_the_stand_ins and not probe_mixed and not probe_device_count"
        " and not probe_counts_a_model and not release_id_follows_pins",
    ),
    "rollout": ("fleet/rollout.py", ("tests/unit/fleet",), "rollout"),
    "rbln.resolve": ("kinds/rbln/resolve.py", ("tests/unit/kinds/rbln",), "resolve"),
}


@dataclass(frozen=True)
class Mutant:
    op: str
    line: int
    index: int  # its place in the module's list of mutants of this operator
    source: str  # the module, mutated and unparsed


def _bodies(tree: ast.AST) -> Iterator[list[ast.stmt]]:
    """Every statement list inside a function (its body, and each block's)."""
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(fn):
            for name in ("body", "orelse", "finalbody"):
                body = getattr(node, name, None)
                if isinstance(body, list) and body and isinstance(body[0], ast.stmt):
                    yield body
            if isinstance(node, ast.Try):
                for h in node.handlers:
                    yield h.body


def _is_doc(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)


def _sites(tree: ast.AST, op: str) -> list[tuple[int, object]]:
    """The places ``op`` applies in ``tree``: (line, a key :func:`_apply` takes)."""
    out: list[tuple[int, object]] = []
    if op in ("drop", "swap"):
        seen: set[int] = set()
        for body in _bodies(tree):
            if id(body) in seen:
                continue
            seen.add(id(body))
            for i, stmt in enumerate(body):
                if _is_doc(stmt):
                    continue
                if op == "drop":
                    out.append((stmt.lineno, (id(body), i)))
                elif i + 1 < len(body) and not _is_doc(body[i + 1]):
                    out.append((stmt.lineno, (id(body), i)))
    elif op == "elt":
        stores = {id(n) for n in ast.walk(tree) if isinstance(getattr(n, "ctx", None), ast.Store)}
        # annotations are never evaluated here (``from __future__ import annotations``)
        notes = [getattr(n, a, None) for n in ast.walk(tree) for a in ("annotation", "returns")]
        stores |= {id(x) for note in notes if note is not None for x in ast.walk(note)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Tuple | ast.List | ast.Set) and len(node.elts) >= 2:
                if id(node) in stores:
                    continue
                out += [(node.lineno, (id(node), i)) for i in range(len(node.elts))]
    elif op == "bool":
        for node in ast.walk(tree):
            if isinstance(node, ast.BoolOp):
                out += [(node.lineno, (id(node), i)) for i in range(len(node.values))]
    elif op == "sorted":
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id == "sorted" and len(node.args) == 1):  # fmt: skip
                out.append((node.lineno, ("unsort", id(node))))
            elif isinstance(node, ast.For | ast.comprehension):
                it = node.iter
                if not (isinstance(it, ast.Call) and isinstance(it.func, ast.Name)
                        and it.func.id in ("sorted", "range", "enumerate", "zip")):  # fmt: skip
                    out.append((getattr(node, "lineno", it.lineno), ("sort", id(node))))
    return out


class _Apply(ast.NodeTransformer):
    def __init__(self, op: str, key: object) -> None:
        self.op, self.key = op, key

    def generic_visit(self, node: ast.AST) -> ast.AST:
        super().generic_visit(node)
        op, key = self.op, self.key
        if op == "elt" and isinstance(node, ast.Tuple | ast.List | ast.Set):
            nid, i = key  # type: ignore[misc]
            if id(node) == nid:
                node.elts = node.elts[:i] + node.elts[i + 1 :]
        elif op == "bool" and isinstance(node, ast.BoolOp):
            nid, i = key  # type: ignore[misc]
            if id(node) == nid:
                rest = node.values[:i] + node.values[i + 1 :]
                return rest[0] if len(rest) == 1 else ast.BoolOp(op=node.op, values=rest)
        elif op == "sorted":
            how, nid = key  # type: ignore[misc]
            if how == "unsort" and isinstance(node, ast.Call) and id(node) == nid:
                return node.args[0]
            if how == "sort" and isinstance(node, ast.For | ast.comprehension) and id(node) == nid:
                node.iter = ast.Call(ast.Name("sorted", ast.Load()), [node.iter], [])
        return node


def _apply(tree: ast.Module, op: str, key: object) -> None:
    if op in ("drop", "swap"):
        bid, i = key  # type: ignore[misc]
        for body in _bodies(tree):
            if id(body) == bid:
                if op == "drop":
                    body[i : i + 1] = [] if len(body) > 1 else [ast.Pass()]
                else:
                    body[i], body[i + 1] = body[i + 1], body[i]
                return
    else:
        _Apply(op, key).visit(tree)


OPS = ("drop", "swap", "elt", "bool", "sorted")


def mutants(source: str) -> list[Mutant]:
    """Every mutant of a module's source (those that unparse to the module itself left out)."""
    base = ast.unparse(ast.parse(source))
    out: list[Mutant] = []
    for op in OPS:
        for n, (line, _key) in enumerate(_sites(ast.parse(source), op)):
            tree = ast.parse(source)  # a fresh tree: keys are ids of its nodes, found again
            key = _sites(tree, op)[n][1]
            _apply(tree, op, key)
            ast.fix_missing_locations(tree)
            try:
                text = ast.unparse(tree)
                compile(text, "<mutant>", "exec")
            except (SyntaxError, ValueError, TypeError):
                continue
            if text != base:
                out.append(Mutant(op, line, n, text))
    return out


def copy_tree(rev: str) -> Path:
    """A copy of ``rev``'s src/ and tests/ (and what the tests read) in a temporary directory."""
    root = Path(tempfile.mkdtemp(prefix="servefleet-ast-mutation-")) / "repo"
    root.mkdir()
    archive = subprocess.run(["git", "archive", rev], cwd=REPO, capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(root)], input=archive.stdout, check=True)
    shared = REPO.parent / "shared"
    if shared.is_dir():
        (root.parent / "shared").symlink_to(shared)
    return root


def _pytest(root: Path, tests: tuple[str, ...], k: str, timeout: float) -> tuple[str, float]:
    """``killed``/``survived``/``timeout`` (killed too) and the seconds it took."""
    cmd = [str(PYTHON), "-m", "pytest", "-x", "-q", "-n", "0", "-p", "no:cacheprovider",
           "-p", "no:randomly", *tests, *(["-k", k] if k else [])]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(root / "src"), PYTHONHASHSEED="0")
    t = time.monotonic()
    try:
        proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True,
                              timeout=timeout)  # fmt: skip
    except subprocess.TimeoutExpired:
        return "timeout", time.monotonic() - t
    took = time.monotonic() - t
    if proc.returncode == 0:
        return "survived", took
    if proc.returncode in (1, 3):  # a test failed, or an error while collecting (import)
        return "killed", took
    return f"error {proc.returncode}: {proc.stdout[-400:]}", took


def run_module(key: str, root: Path, budget: float, out: Path) -> dict[str, object]:
    path, tests, k = MODULES[key]
    target = root / "src" / "servefleet" / path
    original = target.read_text()
    found = mutants(original)
    random.Random(0).shuffle(found)
    cache = target.parent / "__pycache__"
    target.write_text(ast.unparse(ast.parse(original)) + "\n")  # the baseline: unparsed, green
    shutil.rmtree(cache, ignore_errors=True)
    verdict, base = _pytest(root, tests, k, 1800)
    if verdict != "survived":
        target.write_text(original)
        raise SystemExit(f"{key}: the tests fail on the unmutated module ({verdict})")
    counts = {op: {"mutants": 0, "killed": 0, "survived": 0} for op in OPS}
    survivors: list[str] = []
    start, checked = time.monotonic(), 0
    try:
        for m in found:
            if time.monotonic() - start > budget:
                break
            target.write_text(m.source + "\n")
            shutil.rmtree(cache, ignore_errors=True)
            verdict, _ = _pytest(root, tests, k, max(3 * base, base + 30))
            checked += 1
            print(f"{key}: {checked}/{len(found)} {m.op} line {m.line}: {verdict}", file=sys.stderr,
                  flush=True)  # fmt: skip
            c = counts[m.op]
            c["mutants"] += 1
            if verdict == "survived":
                c["survived"] += 1
                diff = difflib.unified_diff(
                    ast.unparse(ast.parse(original)).splitlines(), m.source.splitlines(),
                    f"a/src/servefleet/{path}", f"b/src/servefleet/{path} ({m.op} #{m.index}, line {m.line})",
                    lineterm="", n=2,
                )  # fmt: skip
                survivors.append("\n".join(diff))
            else:
                c["killed"] += 1
    finally:
        target.write_text(original)
        shutil.rmtree(cache, ignore_errors=True)
    killed = sum(c["killed"] for c in counts.values())
    result = {
        "module": path,
        "tests": list(tests),
        "k": k,
        "mutants": len(found),
        "checked": checked,
        "killed": killed,
        "survived": checked - killed,
        "kill_rate": round(100 * killed / checked, 1) if checked else None,
        "seconds": round(time.monotonic() - start),
        "baseline_seconds": round(base, 1),
        "by_operator": counts,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{key}.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / f"{key}.diff").write_text("\n\n".join(survivors) + "\n")
    return result


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_options(p)
    p.add_argument("--list", action="store_true", help="count each module's mutants, no run")
    return p


def add_options(p: argparse.ArgumentParser, modules: bool = True) -> None:
    if modules:
        p.add_argument("--modules", default=",".join(MODULES),
                       help=f"comma-separated, of: {', '.join(MODULES)}")  # fmt: skip
        p.add_argument("--rev", default="HEAD", help="the commit to mutate (default HEAD)")
    p.add_argument("--budget", type=float, default=900, help="seconds per module (default 900)")
    p.add_argument("--ast-out", default=str(OUT), help="where each module's results go")


def run(args: argparse.Namespace) -> int:
    keys = [m for m in args.modules.split(",") if m]
    unknown = [m for m in keys if m not in MODULES]
    if unknown:
        raise SystemExit(f"unknown module {unknown[0]!r}; allowed: {', '.join(MODULES)}")
    if getattr(args, "list", False):
        for key in keys:
            found = mutants((REPO / "src" / "servefleet" / MODULES[key][0]).read_text())
            by = {op: sum(m.op == op for m in found) for op in OPS}
            print(json.dumps({key: {"mutants": len(found), **by}}))
        return 0
    root = copy_tree(args.rev)
    try:
        for key in keys:
            print(json.dumps({key: run_module(key, root, args.budget, Path(args.ast_out))}),
                  flush=True)  # fmt: skip
    finally:
        shutil.rmtree(root.parent, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(run(parser().parse_args()))
