"""Mutation campaign (not a test, not in CI; issue #37): mutmut over servefleet's core modules,
the unit tests as the test command, the kill rate per module.

mutmut 3.8.1 is a dev extra (pyproject.toml): the project's ``.venv`` holds it. Two ways:

- the whole unit suite, on a copy of a commit's tree (``~/.cache/servefleet/mutation-work``,
  HEAD by default: not the working tree, which others may be editing; the copy's ``setup.cfg``
  holds mutmut's configuration). mutmut runs, for each mutant, only the unit tests that call
  the mutated function (it records them once, unmutated), forked from one process.
- ``--mirror``: each module with its mirror unit tests only (``tests/unit/<package>/
  test_<module>*.py``; the whole ``tests/unit/<package>/`` when no file has the module's name,
  or ``--tests``), one mutmut run per module, in a git worktree of ``--rev`` that it makes and
  removes (or one given with ``--worktree``, kept). Each module's counts, survivors and their
  diffs go to ``--out`` (``results.txt``, ``survivors.diff``: apply one with ``git apply``).

    .venv/bin/python bench/mutation.py [--modules rollout,systemd,...] [--max-children 2]
    .venv/bin/python bench/mutation.py --report        # the table of the last run, as JSON
    .venv/bin/python bench/mutation.py --survivors rollout   # each survivor's diff
    nice -n 19 .venv/bin/python bench/mutation.py --mirror --modules rbln.resolve,checks
    # then only those survivors again, with more of the unit suite as the test command
    .venv/bin/python bench/mutation.py --mirror --modules hostplan --rerun OUT --out OUT2 \
        --tests tests/unit/hostplan --tests tests/unit/kinds/vllm/test_platform_gpu.py

- ``--ast``: the shapes of real bugs mutmut's operators do not make (issue #52: a statement
  dropped, two adjacent statements swapped, an element of a literal dropped, an ``and``/``or``
  operand dropped, a ``sorted`` added or removed), by ``bench/ast_mutation.py`` (its own module
  keys and per-module tests; ``--budget`` seconds per module)::

    nice -n 19 .venv/bin/python bench/mutation.py --ast --modules lock,groups --budget 540

The host programs (``remote/*.py``) are imported by the unit tests as top-level modules
(``import trusted``, next to each other as on a host); the copy's root ``conftest.py`` maps each
such name to its ``servefleet.base.remote`` module, so mutmut's trampolines recognise them. When a test
runs a host program in a subprocess (``python3 -c`` of its inlined source) the mutant is not
active there: such a test can kill a mutant only in-process, so those counts are a floor.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ast_mutation  # noqa: E402  (bench/ is no package)

REPO = Path(__file__).resolve().parents[1]
CACHE = Path.home() / ".cache" / "servefleet"
WORK = CACHE / "mutation-work"
PYTHON = REPO / ".venv" / "bin" / "python"
MUTMUT = str(REPO / ".venv" / "bin" / "mutmut")  # 3.8.1, the dev extra

# the core of issue #37, by module key (what --modules takes) -> path under src/servefleet
CORE = {
    "rbln.resolve": "kinds/rbln/resolve.py",
    "rbln.fingerprint": "kinds/rbln/fingerprint.py",
    "rbln.compile_values": "kinds/rbln/compile_values.py",
    "rbln.compile_table": "kinds/rbln/compile_table.py",
    "rbln.argv_flags": "kinds/rbln/argv_flags.py",
    "rbln.argv_scan": "kinds/rbln/argv_scan.py",
    "vllm.resolve": "kinds/vllm/resolve.py",
    "vllm.layers": "kinds/vllm/layers.py",
    "vllm.sizing": "kinds/vllm/sizing.py",
    "systemd": "render/systemd.py",
    "render": "render/units.py",
    "checks": "settings/checks.py",
    "settings": "settings/table.py",
    "trusted": "base/remote/trusted.py",
    "health": "base/remote/health.py",
    "instances": "base/remote/instances.py",
    "systemd_units": "base/remote/systemd_units.py",
    "restart_gate": "base/remote/restart_gate.py",
    "warm_state": "base/remote/warm_state.py",
    "rotation": "base/remote/rotation.py",
    "state_files": "base/remote/state_files.py",
    "preflight": "base/remote/preflight.py",
    "download": "base/download.py",
    "fetch_model": "base/remote/fetch_model.py",
    "http_client": "base/remote/http_client.py",
    "rollout": "fleet/rollout.py",
    "hostplan": "hostplan/plan.py",
}

# unit tests that need what the copy lacks (the project's installed console scripts, a lab
# fleet's tools) are left out of the campaign, named here with the reason
DESELECT: dict[str, str] = {
    "tests/unit/render/test_systemd.py::test_random_units_verify": "hypothesis: not the same cases twice",
    "tests/unit/project/test_packaging.py": "runs the wheel built from the mutated tree in a venv of its "
    "own, where the stats run's trampolines find no mutmut configuration",
}
SHIM = '''\
"""Written by bench/mutation.py into its copy only: the host programs imported as top-level
modules (``import trusted``) are their ``servefleet.base.remote`` modules, so mutmut's trampolines
(keyed by module name) see the mutant under test."""

import importlib
import importlib.abc
import importlib.util
import sys
from pathlib import Path

_REMOTE = Path(__file__).resolve().parent / "src" / "servefleet" / "base" / "remote"
_NAMES = {p.stem for p in _REMOTE.glob("*.py") if p.stem != "__init__"}


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        if name in _NAMES:
            return importlib.util.spec_from_loader(name, self)
        return None

    def create_module(self, spec):
        return importlib.import_module("servefleet.base.remote." + spec.name)

    def exec_module(self, module):
        pass  # already run, as servefleet.base.remote.<name>


_ALIAS = _Alias()
sys.meta_path.insert(0, _ALIAS)
_from_file = importlib.util.spec_from_file_location


def _spec_from_file(name, location=None, *args, **kw):
    """A test that loads a host program by its path under a private name (``load(HEALTH,
    "servefleet_remote_health")``) gets its ``servefleet.base.remote`` module too."""
    path = Path(location) if location else None
    if path is not None and path.parent.resolve() == _REMOTE.resolve() and path.stem in _NAMES:
        return importlib.util.spec_from_loader(path.stem, _ALIAS)
    return _from_file(name, location, *args, **kw)


importlib.util.spec_from_file_location = _spec_from_file
'''


# A test's subprocess (``servefleet lock`` in a temporary directory) inherits mutmut's
# MUTANT_UNDER_TEST; in the stats run that makes its trampolines read mutmut's configuration
# from the subprocess's directory, which has none. What a subprocess calls is not recorded
# anyway (the parent's tests are), so there it runs unmutated; a mutant under test stays active.
SITECUSTOMIZE = """\
import os

if os.environ.get("MUTANT_UNDER_TEST") == "stats":
    os.environ["MUTANT_UNDER_TEST"] = ""
"""


# ``mutmut show`` of many mutants in one process (one each takes a second to start)
SHOW = """\
import sys
from mutmut.mutation.diff_apply import find_mutant, get_diff_for_mutant

for name in sys.argv[1:]:
    print(f"# {name}: survived")
    print(get_diff_for_mutant(name, path=find_mutant(name).path))
"""


def _run(cmd: list[str], **kw: object) -> None:
    print("+", " ".join(cmd), file=sys.stderr)
    subprocess.run(cmd, check=True, **kw)  # type: ignore[call-overload]


def write_config(root: Path, modules: list[str], tests: list[str], deselect: list[str]) -> None:
    """
    Write mutmut's configuration (``setup.cfg``) and the host programs' ``conftest.py`` in ``root``.

    + root: a copy or worktree of the project
    + modules: keys of ``CORE`` to mutate
    + tests: the test command's files or directories
    + deselect: more unit tests to leave out (``--deselect``), besides ``DESELECT``
    """
    (root / "conftest.py").write_text(SHIM)
    only = "\n    ".join(f"src/servefleet/{CORE[m]}" for m in modules)
    # mutmut copies src/ and tests/; the tests read the rest (README, docs/, deploys/, ...)
    skip = ("src", "tests", "bench", "mutants", "setup.cfg", ".git", "shared")
    also = "\n    ".join(sorted(p.name for p in root.iterdir() if p.name not in skip))
    left_out = "".join(f"\n    --deselect\n    {t}" for t in [*DESELECT, *deselect])
    (root / "setup.cfg").write_text(
        "[mutmut]\n"
        "source_paths = src\n"
        f"only_mutate =\n    {only}\n"
        f"also_copy =\n    {also}\n"
        "pytest_add_cli_args_test_selection =\n    " + "\n    ".join(tests) + "\n"
        "pytest_add_cli_args =\n    -n\n    0\n    -p\n    no:cacheprovider\n"
        f"    -o\n    addopts=\n    -q{left_out}\n"
        "timeout_multiplier = 5.0\n"
        "timeout_constant = 20.0\n"
        "use_git_change_detection = false\n"
    )


def copy_tree(modules: list[str], deselect: list[str], rev: str) -> None:
    """
    Copy the commit ``rev``'s tree into ``WORK`` (a commit, not the working tree others are
    editing: its unit suite must pass as it is) and write mutmut's configuration there.

    + modules: keys of ``CORE`` to mutate
    + deselect: more unit tests to leave out (``--deselect``), besides ``DESELECT``
    + rev: the commit to copy
    """
    keep = WORK / "mutants"
    if WORK.exists():
        for child in WORK.iterdir():
            if child == keep:
                continue
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()
    WORK.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "archive", "--format=tar", rev], cwd=REPO, check=True,
                             capture_output=True).stdout  # fmt: skip
    subprocess.run(["tar", "-x", "-C", str(WORK)], input=archive, check=True)
    shutil.rmtree(WORK / "bench", ignore_errors=True)
    write_config(WORK, modules, ["tests/unit"], deselect)


def _env(src: Path) -> dict[str, str]:
    env = dict(os.environ)
    # host programs run as ``python3 -c`` import mutmut's trampolines from the mutated source,
    # and a test's ``python -m servefleet`` runs the mutated tree (the mutant active there too);
    # first on the path, before the .venv's editable install of /work/main/src
    shim = CACHE / "mutation-shim"
    shim.mkdir(parents=True, exist_ok=True)
    (shim / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env["PYTHONPATH"] = f"{shim}:{src}"
    env.pop("VIRTUAL_ENV", None)
    return env


def red_tests(workers: int) -> list[str]:
    """
    The unit tests that fail on the copy unmutated (a commit of a tree others are editing may
    hold one): they can kill no mutant, and mutmut wants a green suite, so they are left out.

    + workers: pytest-xdist workers
    + returns: their node ids
    """
    print(f"the unit suite, unmutated, on {WORK} ...", file=sys.stderr)
    proc = subprocess.run([str(PYTHON), "-m", "pytest", "tests/unit", "-q", "-rfE", "-n",
                           str(workers), "-p", "no:cacheprovider", "-o", "addopts=",
                           *[a for t in DESELECT for a in ("--deselect", t)]],
                          cwd=WORK, env=_env(WORK / "src"), capture_output=True, text=True)  # fmt: skip
    red = sorted({m.group(1) for m in re.finditer(r"^(?:FAILED|ERROR) (\S+)", proc.stdout, re.M)})
    print(f"unmutated: {len(red)} red unit test(s), left out: {red}", file=sys.stderr)
    (WORK / "red-tests.json").write_text(json.dumps(red))
    return red


def campaign(root: Path, max_children: int, names: list[str] | None = None) -> int:
    """
    Run ``mutmut run`` in ``root``.

    + root: the copy or worktree holding ``setup.cfg``
    + max_children: mutants tested at once
    + names: only these mutants (a rerun of an earlier run's survivors), else every one
    + returns: mutmut's exit status
    """
    # mutmut 3.8.1 puts mutants/src on the path only when it is there as it starts
    (root / "mutants" / "src").mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    code = subprocess.run([MUTMUT, "run", "--max-children", str(max_children), *(names or [])],
                          cwd=root, env=_env(root / "mutants" / "src")).returncode  # fmt: skip
    print(f"mutmut run: exit {code} in {time.monotonic() - start:.0f} s", file=sys.stderr)
    return code


def results(root: Path = WORK) -> dict[str, dict[str, int]]:
    """
    The last run's counts, per module: every status mutmut gives (killed, survived, no tests,
    timeout, suspicious, ...) and the total.

    + root: where mutmut ran
    + returns: module path -> status -> count
    """
    out = subprocess.run([MUTMUT, "results", "--all", "true"], cwd=root,
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    table: dict[str, dict[str, int]] = {}
    for line in out.splitlines():
        m = re.match(r"\s*(\S+)__mutmut_\d+: (.+)$", line)
        if not m:
            continue
        module = m.group(1).rsplit(".", 1)[0]
        row = table.setdefault(module, {"total": 0})
        row[m.group(2)] = row.get(m.group(2), 0) + 1
        row["total"] += 1
    return table


def survivors(module: str, root: Path = WORK) -> list[str]:
    """
    The names of ``module``'s surviving mutants (``servefleet.fleet.rollout`` or a ``CORE`` key).

    + module: the dotted module or a key of ``CORE``
    + root: where mutmut ran
    + returns: mutant names
    """
    if module in CORE:
        module = "servefleet." + CORE[module][: -len(".py")].replace("/", ".")
    out = subprocess.run([MUTMUT, "results", "--all", "true"], cwd=root,
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    names = []
    for line in out.splitlines():
        name, _, status = line.strip().partition(": ")
        if name.startswith(module + ".") and status == "survived":
            names.append(name)
    return names


def survivors_listed(results_txt: Path) -> list[str]:
    """
    The surviving mutants an earlier run's ``results.txt`` (``mutmut results --all true``) names.

    + results_txt: the file
    + returns: mutant names
    """
    return re.findall(r"^\s*(\S+): survived$", results_txt.read_text(), re.M)


def mirror_tests(module: str, root: Path) -> list[str]:
    """
    A module's mirror unit tests: ``tests/unit/<package>/test_<module>*.py``, or the package's
    whole ``tests/unit/<package>/`` when no file has the module's name.

    + module: a key of ``CORE``
    + root: the worktree
    + returns: paths relative to it
    """
    package, _, name = CORE[module].rpartition("/")
    found = sorted((root / "tests" / "unit" / package).glob(f"test_{name[: -len('.py')]}*.py"))
    return [str(f.relative_to(root)) for f in found] or [f"tests/unit/{package}"]


def mirror(modules: list[str], tests: list[str], args: argparse.Namespace) -> int:
    """
    Run mutmut on each module with its mirror tests (or ``tests``), one run per module, in a
    worktree of ``args.rev`` (made here and removed, unless ``args.worktree`` names one).

    + modules: keys of ``CORE``
    + tests: the test command's files instead of the mirror tests, if any
    + args: the command line (``rev``, ``worktree``, ``out``, ``max_children``, ``deselect``)
    + returns: 0, or the first failing mutmut run's exit status
    """
    made = not args.worktree
    root = Path(args.worktree or tempfile.mkdtemp(prefix="servefleet-mutation-")).resolve()
    if made:
        _run(["git", "worktree", "add", "--detach", str(root), args.rev], cwd=REPO)
    # the tests read the reference copies beside the repository (``../shared``) when present,
    # beside ``mutants/`` there
    beside, link = REPO.parent / "shared", root / "shared"
    if beside.is_dir() and not link.exists():
        link.symlink_to(beside)
    code = 0
    try:
        for module in modules:
            shutil.rmtree(root / "mutants", ignore_errors=True)
            write_config(root, [module], tests or mirror_tests(module, root), args.deselect)
            names = None
            if args.rerun:  # an earlier run's survivors of this module, from its results.txt
                names = survivors_listed(Path(args.rerun) / module / "results.txt")
            code = campaign(root, args.max_children, names) or code
            out = Path(args.out) / module
            out.mkdir(parents=True, exist_ok=True)
            listing = subprocess.run([MUTMUT, "results", "--all", "true"], cwd=root,
                                     capture_output=True, text=True).stdout  # fmt: skip
            (out / "results.txt").write_text(listing)
            with open(out / "survivors.diff", "w") as diff:
                left = survivors(module, root)
                subprocess.run([str(PYTHON), "-c", SHOW, *left], cwd=root, stdout=diff, check=True)
            print(json.dumps({module: results(root)}, sort_keys=True))
    finally:
        if made:
            _run(["git", "worktree", "remove", "--force", str(root)], cwd=REPO)
    return code


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modules", default=",".join(CORE),
                        help=f"comma-separated, of: {', '.join(CORE)}")  # fmt: skip
    parser.add_argument("--max-children", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--report", action="store_true", help="print the last run's table")
    parser.add_argument("--survivors", metavar="MODULE", help="print a module's survivors' diffs")
    parser.add_argument("--deselect", action="append", default=[], metavar="TEST",
                        help="a unit test to leave out (one that fails on this tree as it is)")  # fmt: skip
    parser.add_argument("--rev", default="HEAD", help="the commit to mutate (default HEAD)")
    parser.add_argument("--keep", action="store_true",
                        help="reuse the copy and mutmut's results (resume a run)")  # fmt: skip
    parser.add_argument("--mirror", action="store_true",
                        help="each module with its mirror unit tests, in a worktree")  # fmt: skip
    parser.add_argument("--tests", action="append", default=[], metavar="PATH",
                        help="with --mirror: a test file to run instead of the mirror tests")  # fmt: skip
    parser.add_argument(
        "--worktree", help="with --mirror: a worktree to use (kept) instead of a new one"
    )
    parser.add_argument("--rerun", metavar="OUT",
                        help="with --mirror: run only the survivors of an earlier --out (with "
                        "a wider --tests: what the rest of the unit suite kills)")  # fmt: skip
    parser.add_argument("--out", default=str(CACHE / "mutation-mirror"),
                        help="with --mirror: where each module's results and survivors go")  # fmt: skip
    parser.add_argument("--ast", action="store_true",
                        help="bench/ast_mutation.py's operators instead of mutmut's")  # fmt: skip
    ast_mutation.add_options(parser, modules=False)
    args = parser.parse_args()
    if args.ast:
        if args.modules == ",".join(CORE):
            args.modules = ",".join(ast_mutation.MODULES)
        return ast_mutation.run(args)
    if args.report:
        print(json.dumps(results(), indent=1, sort_keys=True))
        return 0
    if args.survivors:
        for name in survivors(args.survivors):
            subprocess.run([MUTMUT, "show", name], cwd=WORK, check=True)
        return 0
    modules = [m for m in args.modules.split(",") if m]
    unknown = [m for m in modules if m not in CORE]
    if unknown:
        parser.error(f"unknown module {unknown[0]!r}; allowed: {', '.join(CORE)}")
    if args.mirror:
        return mirror(modules, args.tests, args)
    if not args.keep:
        shutil.rmtree(WORK / "mutants", ignore_errors=True)
        copy_tree(modules, args.deselect, args.rev)
        red = red_tests(args.max_children)
        copy_tree(modules, [*args.deselect, *red], args.rev)
    code = campaign(WORK, args.max_children)
    print(json.dumps(results(), indent=1, sort_keys=True))
    return code


if __name__ == "__main__":
    sys.exit(main())
