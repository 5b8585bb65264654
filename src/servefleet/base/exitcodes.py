"""The exit codes of every ``servefleet`` command, written once; ``docs/exit-codes.md`` holds the
table :func:`exit_code_table` makes (a unit test checks it).

    python -m servefleet.base.exitcodes        # print the table
"""

from __future__ import annotations

from enum import IntEnum


class Exit(IntEnum):
    """What a ``servefleet`` command's exit status means."""

    OK = 0
    FAILED = 1
    USAGE = 2
    UNREACHABLE = 3


MEANING: dict[Exit, str] = {
    Exit.OK: "Done. `status`: every host was reached, runs what its data asks for and answers "
    "healthy. `plan`: every host was planned. `rollout`: no more hosts failed than "
    "`--max-failures` and `--fail-percent` allow (with `--analysis`: and the canary passed every "
    "measure).",
    Exit.FAILED: "Something on a host or in a file is not as it should be, and is named on stderr, "
    "one line each: `status` names every host that is unreachable, drifts or is unhealthy; `plan` "
    "every host it could not plan (`--diff`: the hosts it could not plan, instead of a diff); "
    "`rollout` stopped (more failed hosts than `--max-failures` or `--fail-percent` allow, or its "
    "canary analysis failed a measure: `servefleet: rollout stopped ...` or `... halted ...` "
    "says why); "
    "`lock --check` what no longer matches the data; `wheelhouse` a file that failed; `lab chat` "
    "a host that did not answer. Also: declined at a prompt (`Aborted!`).",
    Exit.USAGE: "Bad input, refused before any host is contacted: a usage error (an option the "
    "command does not have), bad data, recipe, strategy, selection or inventory (every problem "
    "of the data one line, each host that shares it named), a pattern that matches no host, "
    "arguments after `--` that pyinfra would refuse, "
    "`rollout` without `--yes` when stdin is not a terminal, a path the system refuses (`init` "
    "on a file, a directory that cannot be made or written). One line: "
    "`servefleet: error: ...` (`servefleet lab: ...` for the lab).",
    Exit.UNREACHABLE: "Could not reach something the command needs (an index, a host, the hub), "
    "named in one line: transient, worth a retry later; nothing was refused. `status` and `plan` "
    "report an unreachable host with 1 instead (the host is named: the fleet's state is what "
    "they report).",
}

PASSED_THROUGH = (
    "`servefleet rollback` exits with pyinfra's own status, which means the same: 0 done, "
    "1 a host failed, 2 pyinfra refused its arguments."
)

BEGIN = "<!-- exit-codes: begin (python -m servefleet.base.exitcodes) -->"
END = "<!-- exit-codes: end -->"


def exit_code_table() -> str:
    """A Markdown table: one row per exit code, then the command that passes pyinfra's."""
    rows = ["| code | meaning |", "| --- | --- |"]
    rows += [f"| {int(code)} | {MEANING[code]} |" for code in Exit]
    return "\n".join(rows) + "\n\n" + PASSED_THROUGH + "\n"


if __name__ == "__main__":
    print(exit_code_table(), end="")
