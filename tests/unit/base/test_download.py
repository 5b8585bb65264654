"""``download.unreachable``: the one line of a download the network failed (#37: no unit test
called it, so its two mutants had no test)."""

from __future__ import annotations

import urllib.error

from servefleet.base.download import unreachable
from servefleet.base.errors import Unreachable


def test_unreachable_names_what_and_why_in_one_line() -> None:
    err = unreachable("https://idx.test/simple/", ConnectionRefusedError(111, "Connection refused"))
    assert isinstance(err, Unreachable)
    assert str(err) == (
        "https://idx.test/simple/: could not reach it (Connection refused); "
        "transient: try again later"
    )
    late = unreachable("the store manifest", urllib.error.URLError(TimeoutError("timed out")))
    assert (
        str(late)
        == "the store manifest: could not reach it (timed out); transient: try again later"
    )
