"""Code run as ``nobody``, the hostile serve user of the unit tests (they run as root)."""

from __future__ import annotations

import os
import pwd
from pathlib import Path


def as_nobody(cwd: Path, code: str) -> int:
    """Run ``code`` (Python, with ``os`` bound) in a forked child that became nobody, in
    ``cwd``: its exit code (0 when it ran through, 1 when it raised)."""
    pid = os.fork()
    if pid == 0:  # the child becomes the hostile serve user
        try:
            nobody = pwd.getpwnam("nobody")
            os.setgroups([])
            os.setgid(nobody.pw_gid)
            os.setuid(nobody.pw_uid)
            os.chdir(cwd)
            exec(code, {"os": os})
            os._exit(0)
        except BaseException:  # noqa: BLE001
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)
