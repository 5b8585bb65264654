"""render/systemd.py's refusals name what they refuse (the mutation campaign, #37, found their
messages unread): an ``ExecStart`` argument by its value, an ``Environment`` line by its
variable, each for a NUL byte (systemd cannot pass one) and for text that is not UTF-8 (a lone
surrogate, as ``os.fsdecode`` makes of undecodable bytes)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from servefleet.base.errors import ServefleetError
from servefleet.render.systemd import environment_line, exec_arg, exec_line

NUL = "contains a NUL byte, which systemd cannot pass"


@pytest.mark.parametrize(
    ("refused", "line"),
    [
        (lambda: exec_arg("a\0b"), f"argument 'a\\x00b': {NUL}"),
        (lambda: exec_line(["/bin/x", "a\0b"]), f"argument 'a\\x00b': {NUL}"),
        (lambda: exec_arg("caf\udce9"), "argument 'caf\\udce9': not valid UTF-8"),
        (lambda: environment_line("A", "x\0"), f"Environment A: {NUL}"),
        (lambda: environment_line("LANG", "caf\udce9"), "Environment LANG: not valid UTF-8"),
    ],
    ids=["arg-nul", "argv-nul", "arg-utf8", "env-nul", "env-utf8"],
)
def test_a_refusal_names_the_argument_or_variable(refused: Callable[[], str], line: str) -> None:
    with pytest.raises(ServefleetError) as err:
        refused()
    assert str(err.value) == line
