"""servefleet's units on a host and what their processes run. Runs ON THE HOST, as root, with
the system python3 (stdlib only), next to ``instances.py``.

``systemctl`` and ``systemctl show``, the unit files written from their texts, and what each
unit's main process runs, read from ``/proc`` (its environment's ``SERVEFLEET_UNIT`` and API
key, its ``--port``). ``Failed`` is how a step here and in its neighbours fails.

Importable (``import systemd_units``): its neighbours call it through the module
(``systemd_units.systemctl``), so a test replaces a name here for every caller.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import layout  # noqa: E402  (next to this file on the host)
import release_check  # noqa: E402

UNIT_DIR = Path(layout.UNIT_DIR)
UNIT_GLOB = layout.UNIT_GLOB
SHA_VAR = layout.UNIT_SHA_VAR


class Failed(Exception):
    """A gate failed; the message is the one line to print (journal tail apart)."""

    def __init__(self, message: str, journal: str = "") -> None:
        super().__init__(message)
        self.journal = journal


def log(message: str) -> None:
    print(message, flush=True)


def systemctl(*args: str, check: bool = True) -> str:
    done = subprocess.run(["systemctl", *args], capture_output=True, text=True)
    if check and done.returncode != 0:
        raise Failed(f"systemctl {' '.join(args)}: {done.stderr.strip() or done.returncode}")
    return done.stdout


def show(units: list[str], *props: str) -> list[dict[str, str]]:
    """``systemctl show`` of several units, one dict each (in order)."""
    if not units:
        return []
    args = [a for p in ("Id", *props) for a in ("-p", p)]
    out = systemctl("show", *args, *units, check=False)
    blocks = [b for b in out.split("\n\n") if b.strip()]
    by_id = {}
    for block in blocks:
        props_ = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
        by_id[props_.get("Id", "")] = props_
    return [by_id.get(u, {}) for u in units]


def daemon_reload_if_needed(units: list[str]) -> None:
    props = show(units, "NeedDaemonReload")
    if any(p.get("NeedDaemonReload") == "yes" for p in props):
        systemctl("daemon-reload")


def process_env(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def process_port(pid: int) -> int | None:
    """The port the process serves on: its last ``--port`` (argparse's rule: a recipe's own
    ``--port`` comes before the one the deploy adds), or None."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return None
    port = None
    for i, arg in enumerate(argv):
        value = argv[i + 1] if arg == "--port" and i + 1 < len(argv) else None
        if arg.startswith("--port="):
            value = arg.split("=", 1)[1]
        if value and value.isdigit():
            port = int(value)
    return port


def live(devices_env: str) -> dict[str, dict[str, Any]]:
    """Every unit of ours on this host: what its main process runs, now."""
    units = sorted(p.name for p in UNIT_DIR.glob(UNIT_GLOB))
    out = {}
    for unit, props in zip(units, show(units, "ActiveState", "SubState", "MainPID"), strict=True):
        pid = int(props.get("MainPID") or 0)
        env = process_env(pid) if pid else {}
        out[unit] = {
            "active": props.get("ActiveState", "unknown"),
            "pid": pid,
            "sha": env.get(SHA_VAR),
            "key": env.get(layout.API_KEY_VAR),
            "port": process_port(pid) if pid else None,
            "devices": set(filter(None, env.get(devices_env, "").split(","))),
            "older_than_release": release_check.older_than_release(
                pid, _text(UNIT_DIR / unit), layout.RELEASE_MARKER
            ),  # started before its release was (re)installed: restart it onto the new files
        }
    return out


def _text(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def file_key() -> str | None:
    """The servers' API key as their EnvironmentFile holds it now, read as systemd reads it
    (:func:`release_check.env_file_value`: its last assignment; None: the file assigns none)."""
    return release_check.env_file_value([layout.API_KEY_FILE], layout.API_KEY_VAR)


def running_desired(now: dict[str, Any] | None, sha: str, key: str | None = None) -> bool:
    """Its main process runs ``sha`` with the key file's ``key`` (the unit's hash carries no
    digest of the key: a new key is seen here)."""
    return (
        now is not None and now["active"] == "active" and now["sha"] == sha
        and now.get("key") == key
    )  # fmt: skip


def unit_sha(text: str) -> str | None:
    m = re.search(rf'^Environment="{SHA_VAR}=([0-9a-f]+)"$', text, re.M)
    return m.group(1) if m else None


def write_atomic(path: Path, text: str, mode: int = 0o644) -> None:
    """``path`` holds ``text`` with ``mode``, whole: a reader (systemd, the next run) sees the old
    file or the new one, never part of either. The text goes to a new temporary file beside it,
    of a name no other file has (:func:`_new_temporary`: a link or a file planted at any name
    is never followed nor reused), is fsynced and renamed over ``path``, then the directory is
    fsynced; on any failure the temporary file is removed (the old file stays as it was)."""
    directory = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        tmp, f = _new_temporary(directory, path.name, mode)
        try:
            try:
                data = memoryview(text.encode())
                while data:
                    data = data[os.write(f, data) :]
                os.fchmod(f, mode)  # exactly: the umask may have taken bits of it away
                os.fsync(f)
            finally:
                os.close(f)
            os.replace(tmp, path.name, src_dir_fd=directory, dst_dir_fd=directory)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=directory)
            raise
        os.fsync(directory)  # the rename itself survives a crash
    finally:
        os.close(directory)


TEMPORARY_TRIES = 16  # names a write tries before it gives up (each a new random one)


def _new_temporary(directory: int, name: str, mode: int) -> tuple[str, int]:
    """A new file in ``directory`` for ``name``'s next text, and its descriptor: ``.NAME.<random>.tmp``
    (a dot first: no unit glob, nor :func:`trusted.names`, sees it), made with ``O_EXCL`` and
    ``O_NOFOLLOW`` (whatever is at that name already, a link above all, fails the open and the
    next name is tried) and with ``mode`` from the start (never more open than that)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    for _ in range(TEMPORARY_TRIES):
        tmp = f".{name}.{os.urandom(8).hex()}.tmp"
        try:
            return tmp, os.open(tmp, flags, mode, dir_fd=directory)
        except FileExistsError:
            continue
    raise FileExistsError(f"{name}: no new temporary name after {TEMPORARY_TRIES} tries")


def write_units(state: dict[str, Any]) -> None:
    """Each instance's unit file as its text says (atomically, only where it differs)."""
    for inst in state["instances"]:
        path = UNIT_DIR / inst["unit"]
        if unit_sha(inst["text"]) != inst["sha"]:
            raise Failed(f"{inst['unit']}: its text does not carry sha {inst['sha']}")
        if not path.exists() or path.read_text() != inst["text"]:
            write_atomic(path, inst["text"])
            log(f"{inst['unit']}: written (sha {inst['sha']})")
