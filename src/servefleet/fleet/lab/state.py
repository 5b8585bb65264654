"""The lab state written by ``servefleet lab up`` (``STATE_DIR/state.json``) and read by
``inventories/lab.py``, the lab tests and ``servefleet lab env``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from servefleet.base.errors import ServefleetError
from servefleet.fleet.lab import layout


class LabError(ServefleetError):
    """The lab cannot be brought up, used or torn down here (one line, no traceback)."""


def load_state(path: Path | None = None) -> dict[str, Any]:
    """The state of the running lab.

    + path: the state file (default ``layout.STATE_FILE``)
    """
    path = path or layout.STATE_FILE
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise LabError(
            f"the lab is not up (no {path}); start it with `servefleet lab up` (as root)"
        ) from None
    except OSError as exc:
        raise LabError(f"cannot read the lab state {path}: {exc.strerror}") from None
    try:
        state = json.loads(text)
    except ValueError as exc:
        raise LabError(
            f"the lab state {path} is not valid JSON ({exc}); run `servefleet lab up`"
        ) from None
    if not isinstance(state, dict) or "hosts" not in state:
        raise LabError(f"the lab state {path} has no hosts; run `servefleet lab up`")
    return state


def write_state(state: dict[str, Any], path: Path | None = None) -> None:
    """Write the state atomically (0644: it holds paths to secrets, never a secret).

    + state: the lab state
    + path: the state file (default ``layout.STATE_FILE``)
    """
    path = path or layout.STATE_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2, sort_keys=True) + "\n")
    tmp.chmod(0o644)
    tmp.replace(path)


def env_lines(state: dict[str, Any]) -> list[str]:
    """Shell lines exporting the lab's credentials, each read from its file when evaluated.

    + state: the lab state
    """
    import shlex

    return [
        f'export {name}="$(cat {shlex.quote(path)})"'
        for name, path in sorted(state["secrets"].items())
    ]
