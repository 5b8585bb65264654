"""The worker of ``test_fuzz_recipes.py``: one process, its address space capped, that runs the
``servefleet`` commands a user would run on each mutated recipe and says how each ended.

Started as ``python fuzz_worker.py ROOT BUDGET_MIB``: ``ROOT`` is a directory holding the recipe
files (a test writes each mutated file there), ``BUDGET_MIB`` the memory each run may grow the
process by (``RLIMIT_AS`` is set to what the process maps after its imports plus that budget).
Each request is one JSON line on stdin, ``{"file": REL, "text": TEXT, "runs": [[ARG, ...], ...]}``
(``TEXT`` written to ``ROOT/REL`` as UTF-8, lone surrogates kept as bytes that are not UTF-8;
``{file}`` in an argument is that file's path), or ``{"selftest": NAME}`` (:data:`SELFTESTS`);
the answer is one JSON line on the protocol descriptor (the original stdout; the commands' own
output goes to a UTF-8 buffer, as a terminal's would), one entry per run:

+ ``{"out": TEXT, "seconds": S}``: the command printed ``TEXT`` and returned
+ ``{"error": MESSAGE, "type": NAME, "seconds": S}``: a :class:`ServefleetError`
+ ``{"crash": NAME, "where": "file:line in function", "traceback": TEXT, "seconds": S}``:
  anything else (a ``MemoryError`` when the run outgrew its budget)
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import resource
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from servefleet.base.errors import ServefleetError
from servefleet.entry.cli import main as cli


def mapped_bytes() -> int:
    """What this process maps now (``VmSize``)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize in /proc/self/status")


def innermost(tb: Any) -> str:
    """The innermost frame of servefleet's own code in a traceback (else the innermost)."""
    frames = traceback.extract_tb(tb)
    ours = [f for f in frames if "/servefleet/" in f.filename] or frames
    f = ours[-1]
    return f"{f.filename.rpartition('/servefleet/')[2] or f.filename}:{f.lineno} in {f.name}"


def command(args: list[str]) -> Callable[[], None]:
    """One ``servefleet ARGS`` as the CLI runs it."""
    return lambda: cli.main(args, prog_name="servefleet", standalone_mode=False)


# What the test of the harness itself asks for: a crash, a blow-up past the budget, a hang.
SELFTESTS: dict[str, Callable[[], Any]] = {
    "crash": lambda: {}["no such key"],
    "allocate": lambda: bytearray(1 << 40),
    "hang": lambda: time.sleep(3600),
}


def run(call: Callable[[], Any]) -> dict[str, Any]:
    """How one call ended, its output encoded as a terminal's would be."""
    buffer = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="strict")
    start = time.monotonic()
    try:
        with contextlib.redirect_stdout(buffer):
            call()
            buffer.flush()
    except ServefleetError as e:
        return {"error": str(e), "type": type(e).__name__, "seconds": time.monotonic() - start}
    except click.ClickException as e:  # a usage error: the CLI prints it in one line
        return {"error": e.format_message(), "type": type(e).__name__, "seconds": 0.0}
    except BaseException as e:  # noqa: BLE001 - what the fuzz test is looking for
        if isinstance(e, KeyboardInterrupt):
            raise
        return {
            "crash": type(e).__name__,
            "where": innermost(e.__traceback__),
            "traceback": "".join(traceback.format_exception(e))[-1500:],
            "seconds": time.monotonic() - start,
        }
    data = buffer.buffer.getvalue()  # type: ignore[attr-defined]
    return {"out": data.decode("utf-8"), "seconds": time.monotonic() - start}


def serve(root: Path, budget: int, answers: Any) -> None:
    """Answer each request on stdin until it closes."""
    limit = mapped_bytes() + budget
    resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))
    for line in sys.stdin:
        request = json.loads(line)
        if "selftest" in request:
            results = [run(SELFTESTS[request["selftest"]])]
        else:
            path = root / request["file"]
            path.write_bytes(request["text"].encode("utf-8", "surrogatepass"))
            runs = [[a.replace("{file}", str(path)) for a in args] for args in request["runs"]]
            results = [run(command(args)) for args in runs]
        answers.write(json.dumps(results) + "\n")
        answers.flush()


if __name__ == "__main__":
    protocol = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # anything the code under test prints goes to stderr, not the protocol
    sys.stdout = sys.stderr
    serve(Path(sys.argv[1]), int(sys.argv[2]) * 1024 * 1024, protocol)
