"""One exception family for user errors: the CLI and the deploys print them as one line."""

from __future__ import annotations


class ServefleetError(ValueError):
    """A user error (bad recipe, selection, data or environment): one line, no traceback."""


class RecipeError(ServefleetError):
    """A recipe that cannot be loaded, or a selection it does not offer."""


class DataError(ServefleetError):
    """Invalid deploy data (group_data / --data), named by its key."""


class DataProblems(DataError):
    """Every problem of a fleet's data at once, one line each (the CLI prints each line on its
    own; ``str()`` joins them with ``; ``).

    + lines: one line per problem
    """

    def __init__(self, lines: list[str]) -> None:
        self.lines = [" ".join(str(line).split()) for line in lines]
        super().__init__("; ".join(self.lines))


class ProbeError(ServefleetError):
    """A host's probe output that a kind cannot read (an odd ``rbln-smi`` or ``amd-smi``)."""


class Unreachable(ServefleetError):
    """Something the command needs could not be reached (an index, a host, the hub): transient,
    worth a retry; the CLI exits with ``Exit.UNREACHABLE`` (3), never with 2."""
