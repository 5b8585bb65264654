"""The checks of paths in deploy data: directories on the hosts (absolute, normalised, never a
system directory), the serve user's trees (below the roots meant for them), commands, and the
controller files serve_files ships (inside serve_files_root, never through a link out of it).
Pure Python.
"""

from __future__ import annotations

import os
import posixpath
import re
from typing import Any

from servefleet.base.errors import DataError
from servefleet.base.remote.layout import SERVE_TREE_ROOTS
from servefleet.settings.check_words import word
from servefleet.settings.checks import Refused, bad, entries, matching, typed

# Directories a serve_*/models_* path may be below but never be (any /usr/<dir> too)
SYSTEM_DIRS = frozenset(
    ["/", "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib32", "/lib64", "/libx32"]
    + ["/media", "/mnt", "/opt", "/proc", "/root", "/run", "/sbin", "/snap", "/srv", "/sys"]
    + ["/tmp", "/usr", "/var", "/var/backups", "/var/cache", "/var/lib", "/var/local"]
    + ["/var/lock", "/var/log", "/var/mail", "/var/opt", "/var/run", "/var/spool", "/var/tmp"]
)
VIRTUAL_DIRS = ("/dev/", "/proc/", "/sys/")

_PATH = re.compile(r"[A-Za-z0-9._/-]+")
_COMMAND = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*|(/[A-Za-z0-9._-]+)+")

_DIR_ALLOWED = "an absolute, normalised path of [A-Za-z0-9._/-] below a system directory"
_TREE_ALLOWED = (
    "an absolute, normalised path of [A-Za-z0-9._/-], a directory of its own strictly below "
    f"{', '.join(SERVE_TREE_ROOTS)} (e.g. /var/lib/servefleet)"
)
_COMMAND_ALLOWED = "a command name or an absolute path, of [A-Za-z0-9._/-]"


def directory(value: Any) -> str:
    """An absolute, normalised path of safe characters that is not a system directory."""
    path = typed(value, str, "a string", _DIR_ALLOWED)
    if not path.startswith("/"):
        raise bad(path, "is not absolute", _DIR_ALLOWED)
    if not _PATH.fullmatch(path):
        raise bad(path, "holds a character outside [A-Za-z0-9._/-]", _DIR_ALLOWED)
    normal = "/" + posixpath.normpath(path).lstrip("/")
    if path != normal:
        raise bad(path, f"is not normalised (write {normal!r})", _DIR_ALLOWED)
    if path in SYSTEM_DIRS or posixpath.dirname(path) == "/usr":
        raise bad(path, "is a system directory", _DIR_ALLOWED)
    if path.startswith(VIRTUAL_DIRS):
        raise bad(path, "is on a virtual file system", _DIR_ALLOWED)
    return path


def serve_tree(value: Any) -> str:
    """A :func:`directory` the serve user gets: strictly below one of the roots meant for it
    (``layout.SERVE_TREE_ROOTS``), never a system directory nor the root itself."""
    try:
        path = directory(value)
    except Refused as e:
        raise Refused(e.head, _TREE_ALLOWED) from None
    if not any(path.startswith(root + "/") for root in SERVE_TREE_ROOTS):
        raise bad(path, "is not below a directory meant for the serve user's trees", _TREE_ALLOWED)
    return path


def command(value: Any) -> str:
    command = matching(_COMMAND, "a command name or absolute path", _COMMAND_ALLOWED)(value)
    if command.startswith("/") and posixpath.normpath(command) != command:
        raise bad(command, "is not normalised", _COMMAND_ALLOWED)
    return command


_FILES_ALLOWED = (
    "a mapping: the path a command line names (a chat template, a plugin, a config file) -> a "
    "readable regular file on the controller"
)


def serve_files(value: Any) -> dict[str, str]:
    """Files a command line names, shipped with the release: argv path -> controller file."""

    def controller_file(v: Any) -> str:
        path = word(v, _FILES_ALLOWED)
        if not os.path.isfile(path) or not os.access(path, os.R_OK):
            raise bad(path, "is not a readable regular file on the controller", _FILES_ALLOWED)
        return path

    def argv_path(v: Any) -> str:
        path = word(v, _FILES_ALLOWED)
        if path.startswith("-"):
            raise bad(path, "is an option, not a path", _FILES_ALLOWED)
        return path

    result: dict[str, str] = entries(argv_path, controller_file, _FILES_ALLOWED)(value)
    return result


def serve_file(root_given: str, argv: str, source: str) -> str:
    """The real path of a serve_files file, when it is in serve_files_root, resolved (no link
    out of it): the deploy ships it 0644 into the release, where the serve user reads it (#31
    finding 8). Checked with the data, and again where the file is read.

    + root_given: serve_files_root as the data gives it
    + argv: the serve_files key (for the message)
    + source: the controller path
    """
    root = os.path.realpath(os.path.expanduser(root_given))
    real = os.path.realpath(source)
    if real != root and not real.startswith(root.rstrip("/") + "/"):
        link = f" (a link to {real!r})" if real != os.path.abspath(source) else ""
        raise DataError(
            f"serve_files.{argv}: {source!r}{link} is outside serve_files_root {root_given!r}; "
            "allowed: a readable regular file in serve_files_root (the fleet repository by "
            "default), not through a link out of it"
        )
    return real
