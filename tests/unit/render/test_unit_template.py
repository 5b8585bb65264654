"""The units the deploy writes (templates/vllm.service.j2 via render_unit), for every selection
of the seed card: systemd-analyze verify accepts them, and systemd's rules read back the argv and
env exactly; values that would add unit lines are refused."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from rbln_cases import COMPILER, combinations, seed
from systemd_parse import parse_unit
from systemd_verify import needs_analyze, verify

from servefleet.base.errors import RecipeError, ServefleetError
from servefleet.kinds.rbln.resolve import resolve_rbln
from servefleet.render.units import render_unit


def _unit(argv: list[str], env: dict[str, str], **over: object) -> str:
    fields: dict[str, object] = dict(
        recipe="rbln/gpt-oss-120b",
        selection={"target": "Latency"},
        fingerprint="f" * 64,
        index=0,
        port=8000,
        devices="0",
        user="servefleet",
    )
    fields.update(over)
    return render_unit(exec_argv=argv, env=env, **fields)  # type: ignore[arg-type]


@needs_analyze
def test_every_seed_selection_renders_a_unit_systemd_accepts(tmp_path: Path) -> None:
    exe = tmp_path / "bin" / "vllm"
    exe.parent.mkdir()
    exe.write_text("#!/bin/sh\nexit 0\n")
    exe.chmod(0o755)
    card = seed()
    units, expected = {}, {}
    for i, (strategy, target, sel) in enumerate(combinations(card)):
        try:
            spec = resolve_rbln(
                card, strategy=strategy, target=target, sets=sel, compiler_version=COMPILER
            )
        except ServefleetError:
            continue
        server = spec.servers[0]
        argv = [str(exe), *server.argv[1:], "--port", str(8000 + i % 4)]
        env = {**server.env, "RBLN_VISIBLE_DEVICES": "0", "SERVEFLEET_UNIT": "0" * 16}
        body = render_unit(
            exec_argv=argv,
            env=env,
            recipe=spec.recipe,
            selection=spec.selection,
            fingerprint=spec.compile_fingerprint,
            index=i % 4,
            port=8000 + i % 4,
            devices="0",
            user="root",  # systemd-analyze checks that the user exists
        )
        assert parse_unit(body) == (argv, env)
        units[f"sf-{i}.service"] = body
        expected[f"sf-{i}.service"] = (argv, env)
    assert len(units) == 108
    names = list(units)
    for start in range(0, len(names), 40):
        result = verify({n: units[n] for n in names[start : start + 40]}, tmp_path)
        assert result.returncode == 0, result.stderr
        assert result.stderr == "", result.stderr


def test_description_escapes_specifiers() -> None:
    body = _unit(["/bin/vllm"], {}, recipe="cards/100%-mine")
    line = next(x for x in body.splitlines() if x.startswith("Description="))
    assert "100%%-mine" in line


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("recipe", "rbln/x\nExecStartPre=+/bin/sh -c id"),
        ("selection", {"strategy": "a\nExecStartPre=+/bin/true"}),
        ("devices", "0\r1"),
    ],
)
def test_values_that_would_add_unit_lines_are_refused(field: str, value: object) -> None:
    with pytest.raises(RecipeError, match="control character"):
        _unit(["/bin/vllm"], {}, **{field: value})


def test_no_rendered_line_starts_a_directive_from_a_value() -> None:
    body = _unit(["/bin/vllm", "a\nExecStartPre=+/bin/id"], {"X": "1\n[Service]"})
    directives = [ln for ln in body.splitlines() if re.match(r"^[A-Za-z]+=", ln)]
    assert not [d for d in directives if d.startswith("ExecStartPre")]
    assert parse_unit(body) == (["/bin/vllm", "a\nExecStartPre=+/bin/id"], {"X": "1\n[Service]"})


def _hostile(tmp_path: Path, mutate) -> Path:  # type: ignore[no-untyped-def]
    import json

    from rbln_cases import TINY

    card = json.loads(TINY.read_text())
    mutate(card)
    path = tmp_path / "hostile.json"
    path.write_text(json.dumps(card))
    return path


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda c: c["strategies"][0].update(slug="tp2\nExecStartPre=+/bin/id"), "slug"),
        (lambda c: c["strategies"][0].update(slug="tp%n"), "slug"),
        (lambda c: c.update(model="acme/$HOME"), "model"),
        (lambda c: c["strategies"][0]["options"][0].update(target="Lat\nency"), "target"),
        (lambda c: c["strategies"][0]["options"][0].update(skus=["RBLN-CR13%i"]), "SKU"),
        (
            lambda c: c["strategies"][0]["options"][0]["grid"]["options"].update(
                sampler=["on", "of\nf"]
            ),
            "value",
        ),
    ],
)
def test_hostile_card_fields_that_reach_a_unit_are_refused(
    tmp_path: Path, mutate: object, message: str
) -> None:
    from servefleet.kinds.rbln.card import load_card

    with pytest.raises(RecipeError, match=message) as e:
        load_card(_hostile(tmp_path, mutate), name="hostile")
    assert "outside" in str(e.value)
