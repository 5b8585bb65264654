"""Two file rules the controller's modules share, written once: a file's sha256 (read in blocks)
and replacing a file whole (a reader sees the old file or the new one, never part of either)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from servefleet.base.remote.layout import sha256_of

__all__ = ["sha256_of", "write_atomic"]


def write_atomic(path: str | Path, text: str) -> None:
    """Replace ``path`` with ``text``: a temporary file in the same directory, written and
    fsynced, renamed over it, and the directory fsynced. It keeps the old file's mode (new:
    0644).

    + path: the file
    + text: its new content
    """
    path = Path(path)
    try:
        mode = path.stat().st_mode & 0o777
    except FileNotFoundError:
        mode = 0o644
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text)
            out.flush()
            os.fchmod(out.fileno(), mode)
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
