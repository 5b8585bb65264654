"""The README stays a short way in: at most ~160 lines, its two commands as a fresh machine runs
them, its install commands the ones the wheel's host test runs, a link to every file of docs/
(and every link to docs/ resolving), and every ``servefleet COMMAND [--option]`` that README.md
and docs/*.md show in code is a real command and option of the CLI (click's own command list)."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import click
import pytest
from repo_paths import REPO
from wheel_venv import INSTALL, quick_start, readme_install

from servefleet.entry.cli import main
from servefleet.fleet.scaffold import files as scaffold_files

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

README = REPO / "README.md"
DOCS = sorted((REPO / "docs").glob("*.md"))
MAX_LINES = 160

FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
SPAN = re.compile(r"(`+)(.+?)\1", re.S)
# `servefleet` as a command (after a space, a slash or a line start), then its words
INVOCATION = re.compile(r"(?:^|(?<=[\s/(]))servefleet((?: +[a-z][a-z-]*)+)(.*)$", re.M)
OPTION = re.compile(r"(?<![\w-])(--[a-z][a-z-]*|-h)\b")
LINK = re.compile(r"\]\(([^)#\s]+\.md)(?:#[^)]*)?\)")


def code_of(text: str) -> list[str]:
    """The code a Markdown text shows: its fenced blocks (without comments) and its inline
    spans, one line each."""
    blocks = [re.sub(r"(^|\s)#.*", "", m.group(1)) for m in FENCE.finditer(text)]  # no comments
    prose = FENCE.sub("", text)
    spans = [" ".join(m.group(2).split()) for m in SPAN.finditer(prose)]
    return [line for chunk in (*blocks, *spans) for line in chunk.splitlines()]


def invocations(text: str) -> list[tuple[list[str], list[str]]]:
    """Each ``servefleet ...`` the code shows: its words and the options it gives servefleet
    (up to ``--``, a pipe, ``&&``, ``;`` or a comment: what follows is someone else's)."""
    found = []
    for line in code_of(text):
        for m in INVOCATION.finditer(line):
            rest = re.split(r" -- | --$| \| |&&|;| #|\)", m.group(2) + " ", maxsplit=1)[0]
            found.append((m.group(1).split(), OPTION.findall(rest)))
    return found


def resolve(words: list[str]) -> tuple[click.Command, str]:
    """The command the words name, as click would find it (a group takes its next word when
    that is one of its commands), and its name; an unknown first word fails."""
    command: click.Command = main
    name = "servefleet"
    for word in words:
        if not isinstance(command, click.Group):
            break
        sub = command.commands.get(word)
        if sub is None:
            assert command is not main, f"`servefleet {word}` is not a command of the CLI"
            break
        command, name = sub, f"{name} {word}"
    return command, name


def options_of(command: click.Command) -> set[str]:
    # the CLI's help option names: click keeps the help option a command first makes, so a
    # context without them would leave every later invocation without -h (test_cli's)
    ctx = click.Context(command, info_name=command.name, **main.context_settings)
    return {o for p in command.get_params(ctx) for o in (*p.opts, *p.secondary_opts)}


def test_the_readme_is_short() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_LINES, f"README.md has {len(lines)} lines (at most {MAX_LINES})"


def test_the_two_commands_are_the_ones_a_fresh_machine_runs() -> None:
    """What tests/hosts/test_deploy.py::test_readme_main_command parses (the first sh block)
    and .ci/run's test command (the second)."""
    text = README.read_text()
    assert "\n## The two commands\n" in text
    blocks = re.findall(r"```sh\n(.*?)\n```", text, re.S)
    main_command, test_command = blocks[0], blocks[1]
    assert main_command.startswith("./setup.sh && ") and main_command.endswith("lab chat")
    assert "servefleet lab up" in main_command and "deploys/serve.py" in main_command
    assert test_command == "./setup.sh && .venv/bin/pytest"
    assert test_command in (REPO / ".ci" / "run").read_text().splitlines()


WHEEL_TEST = REPO / "tests" / "hosts" / "test_from_a_wheel.py"


def built_wheel_name() -> str:
    """The file name ``pip wheel .`` gives this tree (PEP 427, from pyproject.toml)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return f"{re.sub(r'[-_.]+', '_', project['name'])}-{project['version']}-py3-none-any.whl"


def recorded(commands: list[list[str]], cwd: Path) -> tuple[Path, list[tuple[Path, list[str]]]]:
    """What :func:`wheel_venv.quick_start` runs of ``commands`` (nothing is run)."""
    ran: list[tuple[Path, list[str]]] = []
    end = quick_start(commands, Path("dist", built_wheel_name()), cwd,
                      lambda where, argv: ran.append((where, argv)))  # fmt: skip
    return end, ran


def test_the_install_commands_are_the_ones_the_wheel_test_runs(tmp_path: Path) -> None:
    """#19, #32: the host test tests/hosts/test_from_a_wheel.py runs the README's "Install a
    controller" block itself (wheel_venv's readme_install and quick_start), each command as it
    is written: here, that the block installs the wheel this tree builds with pyinfra's
    executables beside servefleet's, that every command of it is run, in order, and that they
    work on the files `servefleet init` makes."""
    commands = readme_install()
    assert commands[0] == [*INSTALL, built_wheel_name()]
    fleet, ran = recorded(commands, tmp_path)
    shown = [c for c in commands if c[0] != "cd"]
    assert [argv for _, argv in ran] == shown
    init = shown[1]
    assert init[:2] == ["servefleet", "init"] and ran[1][0] == tmp_path == ran[0][0]
    assert fleet == tmp_path / init[2] and all(where == fleet for where, _ in ran[2:])
    made = scaffold_files()
    named = [arg for c in shown[2:] for arg in c if arg.endswith(".py")]
    assert named and all(arg in made for arg in named), named
    assert ["servefleet", "lab", "up"] in shown and shown[-1][0] == "pyinfra"
    calls = {
        node.func.id
        for node in ast.walk(ast.parse(WHEEL_TEST.read_text()))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
    }
    assert {"quick_start", "readme_install"} <= calls, "the wheel test runs the README's block"


def test_the_install_check_refuses_what_the_wheel_test_cannot_run(tmp_path: Path) -> None:
    """The check above can fail: another wheel's name, an install without pyinfra's
    executables, and a command that is not servefleet, pyinfra or cd, are refused."""
    block = "{install} {wheel}\nservefleet init f && cd f  # scaffold\n{more}\n"
    text = "# x\n\n## Install a controller\n\nSome prose.\n\n```sh\n" + block + "```\n"
    install = " ".join(INSTALL)
    good = readme_install(
        text.format(install=install, wheel=built_wheel_name(), more="pyinfra -y a.py b.py")
    )
    assert good == [[*INSTALL, built_wheel_name()], ["servefleet", "init", "f"],
                    ["cd", "f"], ["pyinfra", "-y", "a.py", "b.py"]]  # fmt: skip
    end, ran = recorded(good, tmp_path)
    assert end == tmp_path / "f" and ran[0] == (tmp_path, good[0])
    old = readme_install(
        text.format(install=install, wheel="servefleet-0.1.0-py3-none-any.whl.old", more="")
    )
    with pytest.raises(AssertionError, match="the wheel built from this tree, pyinfra beside it"):
        recorded(old, tmp_path)
    alone = readme_install(
        text.format(install="uv tool install", wheel=built_wheel_name(), more="")
    )
    with pytest.raises(AssertionError, match=r"README.md installs uv tool install servefleet-"):
        recorded(alone, tmp_path)
    other = readme_install(
        text.format(install=install, wheel=built_wheel_name(), more="export X=1 && ls")
    )
    with pytest.raises(AssertionError, match="runs export X=1: the wheel test runs only"):
        recorded(other, tmp_path)
    with pytest.raises(AssertionError, match="no '## Install a controller' section"):
        readme_install("# x\n")


def test_the_readme_links_every_doc_and_every_link_resolves() -> None:
    text = README.read_text()
    linked = {(README.parent / target).resolve() for target in LINK.findall(text)}
    missing = [d.name for d in DOCS if d.resolve() not in linked]
    assert not missing, f"README.md does not link docs/{', docs/'.join(missing)}"
    for doc in (README, *DOCS):
        for target in LINK.findall(doc.read_text()):
            if "://" not in target:
                assert (doc.parent / target).is_file(), f"{doc.name} links {target}: no such file"


@pytest.mark.parametrize("doc", [README, *DOCS], ids=lambda p: p.name)
def test_every_servefleet_command_shown_is_real(doc: Path) -> None:
    for words, options in invocations(doc.read_text()):
        command, name = resolve(words)
        unknown = sorted(set(options) - options_of(command))
        assert not unknown, f"{doc.name}: `{name}` has no option {', '.join(unknown)}"


def test_the_check_finds_a_command_or_option_that_is_not_there() -> None:
    """The checks above can fail: a made-up command and a made-up option are caught."""
    ((words, options),) = invocations("Run `servefleet rollout inv.py --fast -- --data k=v`.")
    assert words[0] == "rollout" and options == ["--fast"]
    assert "--fast" not in options_of(resolve(words)[0])
    ((words, _),) = invocations("```sh\n.venv/bin/servefleet deploy inv.py\n```\n")
    with pytest.raises(AssertionError, match="servefleet deploy"):
        resolve(words)
    assert resolve(["lab", "up"])[1] == "servefleet lab up"
