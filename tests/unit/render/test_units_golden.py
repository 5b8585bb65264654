"""src/servefleet/render/units.py (#37): the exact unit text ``render_unit`` gives, byte for byte
(every field where the template puts it: the header's recipe and selection, the fingerprint or
``-``, the description of a port or a rank and its devices, the user, each Environment= line in
order, EnvironmentFile=, ExecStart=, Restart= ``on-failure`` or ``no`` for a rank, a stop
timeout of 0 too; no blank line left by a block, the last newline kept, ``<`` and ``&`` as
written), each refusal's line (a control character in the recipe, a selection or the
description; an EnvironmentFile= that is not a plain absolute path), and the Jinja environment:
one per template directory, refusing an undefined name."""

from __future__ import annotations

from pathlib import Path

import jinja2
import pytest

from servefleet.base.errors import RecipeError
from servefleet.render import units
from servefleet.render.units import render_unit

HEAD = "# Managed by servefleet; changes here are overwritten by the next deploy.\n"
NET = "After=network-online.target\nWants=network-online.target\n"
TAIL = "\n[Install]\nWantedBy=multi-user.target\n"


def test_an_instance_on_its_port() -> None:
    text = render_unit(
        exec_argv=["/opt/sf/bin/vllm", "serve", "a b", "--port", "8000"],
        env={"A": "1", "B": 'x<y & "z"'},
        recipe="rbln/m",
        selection={"target": "Latency", "tp": "2"},
        fingerprint=None,
        index=1,
        port=8001,
        devices="0,1",
        user="svc",
    )
    assert text == (
        HEAD + "# recipe: rbln/m | target=Latency tp=2\n# compile fingerprint: -\n"
        "[Unit]\nDescription=servefleet vLLM rbln/m instance 1 (port 8001, NPUs 0,1)\n" + NET + "\n"
        "[Service]\nType=simple\nUser=svc\nGroup=svc\n"
        'Environment="A=1"\nEnvironment="B=x<y & \\"z\\""\n'
        'ExecStart="/opt/sf/bin/vllm" "serve" "a b" "--port" "8000"\n'
        "Restart=on-failure\nRestartSec=5\n" + TAIL
    )


def test_a_rank_with_its_key_file_and_stop_timeout() -> None:
    text = render_unit(
        exec_argv=["/x"],
        env={},
        recipe="r",
        selection={},
        fingerprint="ab",
        index=0,
        port=8000,
        devices="2",
        user="u",
        device_word="GPUs",
        stop_timeout=0,
        environment_file="/etc/servefleet/secrets/k.env",
        rank="rank 1 of group g1, headless",
    )
    assert text == (
        HEAD + "# recipe: r | \n# compile fingerprint: ab\n"
        "[Unit]\nDescription=servefleet vLLM r instance 0 (rank 1 of group g1, headless, GPUs 2)\n"
        + NET
        + "\n[Service]\nType=simple\nUser=u\nGroup=u\n"
        "EnvironmentFile=/etc/servefleet/secrets/k.env\n"
        'ExecStart="/x"\nRestart=no\nRestartSec=5\nTimeoutStopSec=0\n' + TAIL
    )


def test_a_percent_in_the_description_is_systemds_literal_percent() -> None:
    text = render_unit(exec_argv=["/x"], env={}, recipe="r%n", selection={"s": "50%"},
                       fingerprint=None, index=0, port=1, devices="0", user="u")  # fmt: skip
    assert "\nDescription=servefleet vLLM r%%n instance 0 (port 1, NPUs 0)\n" in text
    assert "\n# recipe: r%n | s=50%\n" in text  # comments are not read for specifiers


@pytest.mark.parametrize(
    ("over", "line"),
    [
        ({"recipe": "r\nX=1"}, "recipe: 'r\\nX=1' holds a control character (a newline would add unit lines)"),
        ({"selection": {"t": "a\x7f"}}, "selection t: 't=a\\x7f' holds a control character (a newline would add unit lines)"),
        ({"devices": "0\r1"}, "Description: 'servefleet vLLM r instance 0 (port 1, NPUs 0\\r1)' holds a control character (a newline would add unit lines)"),
        ({"rank": "rank\t1"}, "Description: 'servefleet vLLM r instance 0 (rank\\t1, NPUs 0)' holds a control character (a newline would add unit lines)"),
        ({"environment_file": "/etc/a b.env"}, "EnvironmentFile: '/etc/a b.env' is not an absolute path of [A-Za-z0-9._/-]"),
        ({"environment_file": "etc/k.env"}, "EnvironmentFile: 'etc/k.env' is not an absolute path of [A-Za-z0-9._/-]"),
        ({"environment_file": "/etc/%k"}, "EnvironmentFile: '/etc/%k' is not an absolute path of [A-Za-z0-9._/-]"),
    ],
)  # fmt: skip
def test_each_refusal_names_its_field(over: dict[str, object], line: str) -> None:
    fields: dict[str, object] = dict(exec_argv=["/x"], env={}, recipe="r", selection={},
                                     fingerprint=None, index=0, port=1, devices="0", user="u")  # fmt: skip
    fields.update(over)
    with pytest.raises(RecipeError) as got:
        render_unit(**fields)  # type: ignore[arg-type]
    assert str(got.value) == line


@pytest.mark.parametrize("path", ["/k", "/etc/servefleet/secrets/vllm-api-key.env", "/a/B_1-2.x"])
def test_plain_paths_are_taken(path: str) -> None:
    assert units.plain_path("EnvironmentFile", path) == path


@pytest.mark.parametrize("value", ["", "plain text: 50% é", "tab-free ~!@#$^&*()"])
def test_one_line_values_are_taken(value: str) -> None:
    assert units.one_line("x", value) == value


def test_one_jinja_environment_per_template_directory(tmp_path: Path) -> None:
    assert units.environment() is units.environment()
    assert units.environment(tmp_path) is not units.environment()
    (tmp_path / "t.j2").write_text("  {% if a %}\n{{ a }}\n  {% endif %}\n{{ b }}")
    env = units.environment(tmp_path)
    assert env.get_template("t.j2").render(a="<&>", b=1) == "<&>\n1"
    with pytest.raises(jinja2.UndefinedError):
        env.get_template("t.j2").render(a="x")
    (tmp_path / "n.j2").write_text("end\n")
    assert env.get_template("n.j2").render() == "end\n"  # the last newline kept


def test_a_template_of_another_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another template (``template=``) gets the instance's own fields too: its index, port,
    devices and user, besides the lines the shipped one uses."""
    (tmp_path / "other.j2").write_text(
        "{{ description }}|{{ restart }}|{{ environment_file }}|{{ index }}|{{ port }}|"
        "{{ devices }}|{{ user }}\n"
    )
    monkeypatch.setattr(units, "environment", lambda: units.jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(tmp_path)), keep_trailing_newline=True))  # fmt: skip
    text = render_unit(exec_argv=["/x"], env={}, recipe="r", selection={}, fingerprint=None,
                       index=2, port=9, devices="1", user="u", template="other.j2")  # fmt: skip
    assert text == "servefleet vLLM r instance 2 (port 9, NPUs 1)|on-failure|None|2|9|1|u\n"
