"""#32, #50: every ``servefleet ...`` and ``pyinfra ...`` command that README.md, docs/*.md
and the files `servefleet init` writes show is run against the installed package (an editable
install here): to the end where it needs no host (``resolve``, ``recipes``, ``keys``, ``init``,
``-h``/``-V``), else through click's own parser, every option and argument converted as the
command would get it (``--canary canary`` fails there: "not a valid integer range"), and what
it passes on to pyinfra after ``--`` through pyinfra's own parser. A bare mention of a command
(``servefleet plan`` in prose) must at least take ``--help``.

Commands are found in the code a Markdown text shows (fenced blocks without their comments,
inline spans) and in a Python file's docstrings and comments (inline spans, and lines that
start with the command); a shell line is cut into commands at ``&&``, ``||``, ``;``, ``|``,
``$(`` and ``)``, and a synopsis's ``[...]`` brackets are dropped.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from pyinfra_cli.main import cli as pyinfra_cli
from repo_paths import REPO

from servefleet.entry.cli import main
from servefleet.fleet.scaffold import files as scaffold_files

DOCS = {"README.md": (REPO / "README.md").read_text(),
        **{f"docs/{p.name}": p.read_text() for p in sorted((REPO / "docs").glob("*.md"))}}  # fmt: skip
SCAFFOLD = {f"init: {rel}": text for rel, text in scaffold_files().items()}

FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
SPAN = re.compile(r"(`+)(.+?)\1", re.S)
CUT = re.compile(r"&&|\|\||;|\||\$\(|\)|\(|\s{3,}")
PROGRAMS = ("servefleet", "pyinfra")
# what runs to the end with no host and no network (the rest is parsed only)
OFFLINE = ("resolve", "recipes", "keys", "docs", "init", "-h", "--help", "-V", "--version")


def _markdown_code(text: str) -> Iterator[str]:
    for block in FENCE.finditer(text):
        joined = re.sub(r"\\\n\s*", " ", block.group(1))  # continuation lines
        for line in joined.splitlines():
            yield re.sub(r"(^|\s)#.*", "", line)
    for span in SPAN.finditer(FENCE.sub("", text)):
        yield " ".join(span.group(2).split())


def _python_code(text: str) -> Iterator[str]:
    for span in SPAN.finditer(text):
        yield " ".join(span.group(2).split())
    for line in SPAN.sub("", text).splitlines():
        line = line.strip().lstrip("#").strip().strip('"')
        if line.split(" ", 1)[0] in PROGRAMS:
            yield re.sub(r"\s#.*", "", line)  # a comment after the command


def commands(text: str, python: bool = False) -> list[list[str]]:
    """Each ``servefleet``/``pyinfra`` command the text shows, as its argv (the program's own
    name first, a path to it such as ``.venv/bin/`` dropped)."""
    found = []
    for line in _python_code(text) if python else _markdown_code(text):
        for part in CUT.split(line.replace("[", "").replace("]", "")):
            words = part.split()
            while words and re.fullmatch(r"[A-Za-z_]\w*=\S*", words[0]):
                words.pop(0)  # VAR=value before the command
            if not words or words[0].rsplit("/", 1)[-1] not in PROGRAMS:
                continue
            try:
                argv = shlex.split(" ".join(words))
            except ValueError:
                argv = words
            argv = [a for a in argv if not re.match(r"\d*>", a) and a != "..."]  # redirections
            if any(w.endswith(":") for w in argv[:2]):  # a line servefleet prints, not a command
                continue
            found.append([argv[0].rsplit("/", 1)[-1], *argv[1:]])
    return found


def _servefleet_command(args: list[str]) -> tuple[click.Command, list[str], list[str]]:
    """The command the leading words name (a group takes its next word when it is one of its
    commands), those words, and the rest of the arguments."""
    command: click.Command = main
    words: list[str] = []
    rest = list(args)
    while isinstance(command, click.Group) and rest and rest[0] in command.commands:
        command = command.commands[rest[0]]
        words.append(rest.pop(0))
    if isinstance(command, click.Group) and rest and not rest[0].startswith("-"):
        raise AssertionError(
            f"`servefleet {' '.join([*words, rest[0]])}` is not a command of the CLI"
        )
    return command, words, rest


def _context(words: list[str], rest: list[str]) -> click.Context:
    """Parse ``rest`` as click does for the command ``words`` names, through the contexts of
    the groups above it (their settings, ``-h`` among them), without invoking anything."""
    ctx = main.make_context("servefleet", words[:1]) if words else None
    command: click.Command = main
    for i, word in enumerate(words):
        assert isinstance(command, click.Group)
        command = command.commands[word]
        if i < len(words) - 1:
            ctx = command.make_context(word, words[i + 1 : i + 2], parent=ctx)
    return command.make_context(words[-1] if words else "servefleet", rest, parent=ctx)


def _expand(argv: list[str]) -> list[list[str]]:
    """``servefleet COMMAND -h`` (a placeholder for the command) as each top-level command."""
    if argv[0] == "servefleet" and len(argv) > 1 and argv[1] == "COMMAND":
        return [["servefleet", name, *argv[2:]] for name in sorted(main.commands)]
    return [argv]


def check(argv: list[str]) -> str:
    """Run or parse one documented command (in the working directory); what was done ("ran",
    "parsed", "help"). A command that does not parse raises (click's own error, which names
    the problem)."""
    program, args = argv[0], argv[1:]
    if program == "pyinfra":
        if not args or args == ["--help"]:
            _help(pyinfra_cli, [])
            return "help"
        pyinfra_cli.make_context("pyinfra", args)
        return "parsed"
    command, words, rest = _servefleet_command(args)
    needs = any(p.required for p in command.params if isinstance(p, click.Argument))
    if not rest and (needs or not words or words[0] not in OFFLINE):
        _help(main, words)  # a mention of the command: it exists and takes --help
        return "help"
    if rest and all(a.startswith("-") for a in rest) and needs:
        # a mention of its options (`servefleet resolve --set`): they exist, it takes --help
        known = {o for p in command.params for o in (*p.opts, *p.secondary_opts)} | {"-h", "--help"}
        unknown = [a for a in rest if a.split("=", 1)[0] not in known]
        if unknown:
            raise click.NoSuchOption(unknown[0])
        _help(main, words)
        return "help"
    placeholder = any(re.fullmatch(r"[A-Z][A-Z_]+", a) for a in rest)  # a synopsis's NAME
    if args[0] in OFFLINE and not placeholder and not {"-h", "--help"} & set(rest):
        result = CliRunner().invoke(main, args, catch_exceptions=False)
        assert result.exit_code == 0, f"`{shlex.join(argv)}` exited {result.exit_code}: " + (
            result.output
        )
        return "ran"
    ctx = _context(words, list(rest))
    passed = ctx.params.get("pyinfra_args") or ()
    if passed:  # what it gives pyinfra after --: pyinfra's own options
        pyinfra_cli.make_context("pyinfra", [*passed, "INVENTORY", "deploys/serve.py"])
    return "parsed"


def _help(program: click.Command, words: list[str]) -> None:
    result = CliRunner().invoke(program, [*words, "--help"], catch_exceptions=False)
    assert result.exit_code == 0 and result.output.startswith("Usage: "), result.output


def help_examples() -> dict[str, str]:
    """Each command's ``-h`` text (its docstring), the lines that are commands as a code block."""
    out: dict[str, str] = {}

    def walk(command: click.Command, path: list[str]) -> None:
        lines = [x.strip() for x in (command.help or "").splitlines()]
        shown = [x for x in lines if x.split(" ", 1)[0] in PROGRAMS]
        if shown:
            out[f"-h: {' '.join(path)}"] = "```\n" + "\n".join(shown) + "\n```\n"
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, [*path, name])

    walk(main, ["servefleet"])
    return out


HELP = help_examples()
SOURCES = {**DOCS, **SCAFFOLD, **HELP}


def shown(source: str) -> list[list[str]]:
    text = SOURCES[source]
    python = source.endswith(".py")
    return [each for argv in commands(text, python) for each in _expand(argv)]


@pytest.mark.parametrize("source", sorted(SOURCES))
def test_every_documented_command_parses_and_the_offline_ones_run(
    source: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # `servefleet init fleet` and the like write here
    for argv in shown(source):
        try:
            check(argv)
        except click.exceptions.Exit as done:  # an eager option (-V) ended the parse
            assert done.exit_code == 0, shlex.join(argv)
        except click.ClickException as e:
            pytest.fail(f"{source}: `{shlex.join(argv)}`: {e.format_message()}")


def test_the_documents_show_the_commands_an_operator_runs() -> None:
    """The check sees what matters: the README's lab command, the walkthrough's lock, rollout
    and pyinfra deploy, and the scaffold's own lock and rollout lines."""
    readme = shown("README.md")
    assert ["pyinfra", "-y", "inventories/lab.py", "deploys/serve.py"] in readme
    assert ["servefleet", "init", "fleet"] in readme
    walk = shown("docs/real-fleet.md")
    assert ["servefleet", "lock", "inventories/prod.py", "--check"] in walk
    assert ["pyinfra", "inventories/prod.py", "deploys/serve.py", "--limit", "canary"] in walk
    assert any(a[:3] == ["servefleet", "rollout", "inventories/prod.py"] and "--" in a
               for a in walk)  # fmt: skip
    assert ["servefleet", "plan", "--help"] in readme or ["servefleet", "plan"] in readme
    scaffold = [a for s in SCAFFOLD for a in shown(s)]
    assert ["servefleet", "lock", "inventories/prod.py", "--lock-dir", "locks/prod"] in scaffold
    assert ["servefleet", "rollout", "inventories/prod.py", "--canary", "1"] in scaffold
    assert sum(1 for s in SOURCES for _ in shown(s)) > 60
    assert ["servefleet", "docs", "real-fleet"] in shown("-h: servefleet docs")  # -h examples


@pytest.mark.parametrize(
    ("doc", "said"),
    [
        ("- `servefleet lock --inventory inventories/prod.py --lock-dir locks/prod`",
         "No such option '--inventory'"),
        ("```sh\nservefleet rollout inventories/prod.py --canary canary\n```\n",
         "'canary' is not a valid integer range"),
        ("Run `servefleet deploy inventories/prod.py`.", "`servefleet deploy` is not a command"),
        ("```sh\nservefleet plan inv.py -- --no-such-pyinfra-option\n```\n",
         "No such option '--no-such-pyinfra-option'"),
        ("`pyinfra inventories/prod.py deploys/serve.py --limitt canary`", "No such option"),
        ("```sh\nservefleet resolve rbln/no-such-recipe\n```\n", "exited 2"),
    ],
)  # fmt: skip
def test_the_check_fails_on_a_command_that_does_not_parse(
    doc: str, said: str, tmp_path: Path
) -> None:
    """What the scaffold said before #32 (its README's lock line, prod.py's --canary), a
    made-up command, an option pyinfra does not take, and an offline command that fails."""
    (argv,) = commands(doc)
    with pytest.raises((click.ClickException, AssertionError), match=re.escape(said)):
        check(argv)
