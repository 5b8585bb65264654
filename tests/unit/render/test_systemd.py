"""systemd escaping: ExecStart=/Environment= read back by systemd's rules and by systemd-analyze."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from rbln_cases import COMPILER, TINY, combinations, seed
from systemd_parse import ParseError, parse_environment, parse_exec, parse_unit
from systemd_verify import needs_analyze, verify

from servefleet.base.errors import ServefleetError
from servefleet.kinds.rbln.card import load_card
from servefleet.kinds.rbln.resolve import resolve_rbln
from servefleet.render.systemd import environment_line, exec_arg, exec_line, unit_text

text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"))


def test_exec_arg_examples() -> None:
    assert exec_arg("plain") == '"plain"'
    assert exec_arg('a%b$c"d\\e\nf') == '"a%%b$$c\\"d\\\\e\\nf"'
    assert exec_arg(";") == '";"'
    assert exec_arg("") == '""'


def test_environment_line_examples() -> None:
    # $ has no meaning in Environment=: it is not doubled; % is a specifier: doubled
    assert environment_line("A", "x=$HOME 5%\n") == '"A=x=$HOME 5%%\\n"'
    with pytest.raises(ServefleetError, match="not a valid variable name"):
        environment_line("1A", "x")


def test_refusals() -> None:
    with pytest.raises(ServefleetError, match="NUL"):
        exec_line(["/bin/x", "a\0b"])
    with pytest.raises(ServefleetError, match="prefixes"):
        exec_line(["-/bin/x"])
    with pytest.raises(ServefleetError, match="empty argv"):
        exec_line([])


def test_parser_is_strict_about_what_we_must_escape() -> None:
    with pytest.raises(ParseError):
        parse_exec('"/bin/x" "$HOME"')
    with pytest.raises(ParseError):
        parse_exec('"/bin/x" "%n"')
    with pytest.raises(ParseError):
        parse_exec('"/bin/x" ; "/bin/y"')
    assert parse_exec('"/bin/x" \\; a\\x41"b c"') == ["/bin/x", ";", "aAb c"]


@settings(max_examples=300, deadline=None)
@given(st.lists(text, max_size=8))
def test_exec_line_reads_back_exactly(args: list[str]) -> None:
    argv = ["/usr/bin/vllm", *args]
    assert parse_exec(exec_line(argv)) == argv


@settings(max_examples=300, deadline=None)
@given(st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,10}", fullmatch=True), text)
def test_environment_line_reads_back_exactly(name: str, value: str) -> None:
    assert parse_environment(environment_line(name, value)) == {name: value}


# -- every combination as a unit: systemd-analyze verify + read back ---------------------------


def _all_specs():  # type: ignore[no-untyped-def]
    tiny = load_card(TINY, name="tiny")
    for card in (seed(), tiny):
        for strategy, target, sel in combinations(card):
            try:
                yield resolve_rbln(
                    card, strategy=strategy, target=target, sets=sel, compiler_version=COMPILER
                )
            except ServefleetError:
                continue  # excluded combinations of the fixture card


@pytest.fixture
def placeholder(tmp_path: Path) -> Path:
    exe = tmp_path / "bin" / "vllm"
    exe.parent.mkdir()
    exe.write_text("#!/bin/sh\nexit 0\n")
    exe.chmod(0o755)
    return exe


@needs_analyze
def test_every_combination_unit_verifies_and_reads_back(tmp_path: Path, placeholder: Path) -> None:
    specs = list(_all_specs())
    assert len(specs) >= 108
    units: dict[str, str] = {}
    expected = {}
    for i, spec in enumerate(specs):
        server = spec.servers[0]
        argv = [str(placeholder), *server.argv[1:]]
        body = unit_text(argv, server.env, description=f"{spec.recipe} 100% {i}")
        assert parse_unit(body) == (argv, server.env)
        units[f"sf-{i}.service"] = body
        expected[f"sf-{i}.service"] = (argv, server.env)
    names = list(units)
    for start in range(0, len(names), 40):
        batch = {n: units[n] for n in names[start : start + 40]}
        result = verify(batch, tmp_path)
        assert result.returncode == 0, result.stderr
        assert result.stderr == "", result.stderr


@needs_analyze
@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(text, max_size=5),
    st.dictionaries(st.from_regex(r"[A-Z_][A-Z0-9_]{0,6}", fullmatch=True), text, max_size=3),
)
def test_random_units_verify(
    tmp_path: Path, placeholder: Path, args: list[str], env: dict[str, str]
) -> None:
    argv = [str(placeholder), *args]
    body = unit_text(argv, env, description="random")
    assert parse_unit(body) == (argv, env)
    result = verify({"rand.service": body}, tmp_path)
    assert result.returncode == 0 and result.stderr == "", result.stderr
