"""How the model fetcher fails: :class:`Refusal`, one line for stderr and an exit code (the
host program ``fetch_model.py`` prints it; every part of the fetch raises it), and the line for
a source every try failed to reach (exit 3, ``retry.py``'s rule). Stdlib only, on the host.
"""

from __future__ import annotations

if __package__:  # the controller imports this module (servefleet.base.remote.refusal)
    from servefleet.base.remote import retry
else:  # on the host, next to retry.py
    import retry  # type: ignore[no-redef]


class Refusal(Exception):
    """One line for stderr (without the ``servefleet: `` prefix) and the exit code."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def could_not_reach(what: str, why: str, gave_up: retry.GaveUp) -> Refusal:
    """The line (exit 3) for ``what`` that every try failed to reach, ``why`` the last time.

    + what: a URL, the hub
    + why: the last failure, in a few words
    + gave_up: the tries
    """
    return Refusal(
        f"could not reach {what}: {why} ({retry.tried(gave_up.tries, gave_up.seconds)}); "
        "worth a re-run later",
        code=retry.UNREACHABLE_EXIT,
    )
