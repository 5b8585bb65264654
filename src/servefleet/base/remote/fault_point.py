"""The host programs' test barrier: a fault point a test can hold a host program at (then kill
it there, and prove the next run converges). Stdlib only, imports nothing of its neighbours, so
every host program can carry it (``fault_point.barrier("<point>")``).
"""

from __future__ import annotations

import os
import time

TEST_BARRIERS = "/run/servefleet-test"


def barrier(point: str, deadline: float = 600) -> None:
    """Test hook, off unless a test made root's own /run/servefleet-test (a real directory owned
    by root, writable by root alone): while ``hold-<point>`` is there, write ``reached-<point>``
    and wait (at most ``deadline`` s) until the test removes the hold. Nothing there is followed
    through a link (lstat/fstat, O_NOFOLLOW, paths relative to the directory's own fd)."""
    try:
        fd = os.open(TEST_BARRIERS, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return
    try:
        st = os.fstat(fd)
        named = all(c.isascii() and (c.isalnum() or c in "-._") for c in point)
        if st.st_uid != 0 or st.st_mode & 0o022 or not named:
            return
        hold, end = f"hold-{point}", time.monotonic() + deadline
        try:
            os.stat(hold, dir_fd=fd, follow_symlinks=False)
            flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
            os.close(os.open(f"reached-{point}", flags, 0o600, dir_fd=fd))
        except OSError:
            return
        while time.monotonic() < end:
            try:
                os.stat(hold, dir_fd=fd, follow_symlinks=False)
            except OSError:
                return
            time.sleep(0.1)
    finally:
        os.close(fd)
