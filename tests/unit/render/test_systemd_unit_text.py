"""``unit_text``'s own lines (render/systemd.py), found unchecked by the mutation campaign (issue
#37, bench/mutation.py): a ``%`` in the description is systemd's specifier character and is
doubled, a description of two lines is refused in one line, ``User=`` is written when given and
not otherwise; an empty ``ExecStart`` is refused."""

from __future__ import annotations

import pytest
from systemd_parse import expand_specifiers

from servefleet.base.errors import ServefleetError
from servefleet.render.systemd import exec_line, unit_text


def test_a_percent_in_the_description_is_doubled_and_the_user_written() -> None:
    text = unit_text(["/usr/bin/vllm", "serve", "m"], {"A": "1"}, description="m 100% up",
                     user="vllm")  # fmt: skip
    lines = text.splitlines()
    assert "Description=m 100%% up" in lines
    assert expand_specifiers("m 100%% up") == "m 100% up"  # what systemd shows
    assert lines.index("User=vllm") == lines.index("Type=simple") + 1


def test_no_user_line_without_a_user() -> None:
    text = unit_text(["/usr/bin/vllm"], {}, description="d")
    assert not any(line.startswith("User=") for line in text.splitlines())
    assert "Description=d" in text.splitlines()


@pytest.mark.parametrize("description", ["two\nlines", "trailing\n"])
def test_a_description_of_two_lines_is_refused_in_one_line(description: str) -> None:
    with pytest.raises(ServefleetError) as err:
        unit_text(["/usr/bin/vllm"], {}, description=description)
    assert str(err.value) == "Description: must be one line"


def test_an_empty_argv_is_refused_in_one_line() -> None:
    with pytest.raises(ServefleetError) as err:
        exec_line([])
    assert str(err.value) == "ExecStart: empty argv"
