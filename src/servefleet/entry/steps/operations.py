"""servefleet's own pyinfra operations: the few things pyinfra's do not do right for us (its
facts are in :mod:`servefleet.entry.steps.facts`)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from pyinfra import host, logger
from pyinfra.api import (
    FileUploadCommand,
    FunctionCommand,
    HiddenValue,
    QuoteString,
    StringCommand,
    operation,
)
from pyinfra.api.arguments import CONNECTOR_ARGUMENT_KEYS
from pyinfra.facts.files import File

from servefleet.base.version import VERSION
from servefleet.release.prewarm_store import Store
from servefleet.release.wheelhouse import Copy


@operation(is_idempotent=False)
def secret_file(dest: str, content: HiddenValue, mode: str = "600"):
    """
    Write a secret to a root-only file from this operation's ``_stdin`` (see :func:`put_secret`).
    Unlike ``files.put`` it never shows the content (no ``--diff``, nothing in ``-vvv``), never
    puts it in argv, and works with ``--sudo``: nothing is uploaded as the login user. One
    command, the only one that gets the secret: it writes a 0600 temporary file and replaces
    ``dest`` only when that differs (content or mode). No fact reads the file, so no output
    carries anything of the old secret (a ``Sha256File`` fact printed its sha256 under
    ``-vvv``); the deploys add this operation only when the probe's keyed digest differs.

    + dest: path on the host, in a 0700 directory
    + content: the secret (sent on stdin, never shown)
    + mode: final file mode
    """
    yield StringCommand("sh", "-c", QuoteString(WRITE_SECRET), "sh", QuoteString(dest), mode)


# $1 the file, $2 its mode; the secret on stdin, read whole (a command that stops reading early
# closes the channel under the controller's write: issue #17)
WRITE_SECRET = (
    'umask 077; cat > "$1.servefleet-tmp" || exit 1; '
    'if [ -f "$1" ] && [ ! -L "$1" ] && [ "$(stat -c %a "$1")" = "$2" ] '
    '&& cmp -s "$1.servefleet-tmp" "$1"; then rm -f "$1.servefleet-tmp"; exit 0; fi; '
    'chmod "$2" "$1.servefleet-tmp" && mv -f "$1.servefleet-tmp" "$1"'
)


class Stdin:
    """A secret as an operation's ``_stdin``: pyinfra writes what :meth:`readlines` gives, and
    every way it prints an operation's arguments (``--debug-operations``, ``--json``, ``-vvv``)
    shows a mask instead (a plain ``str`` there was printed as is)."""

    __slots__ = ("_line",)

    def __init__(self, line: str) -> None:
        self._line = line

    def readlines(self) -> list[str]:
        return [self._line]

    def __iter__(self) -> Iterator[str]:  # pyinfra checks that ``_stdin`` is an Iterable[str]
        return iter(self.readlines())

    def to_json(self) -> str:
        return "***"

    def __repr__(self) -> str:
        return "Stdin(***)"

    __str__ = __repr__


def put_secret(name: str, dest: str, secret: str) -> None:
    """Write ``secret`` to ``dest`` (0600), sent on the remote command's stdin (pyinfra ends
    each stdin line with a newline, so the file holds one at the end)."""
    line = secret if secret.endswith("\n") else secret + "\n"
    secret_file(name=name, dest=dest, content=HiddenValue(line), _stdin=Stdin(line))


@operation()
def release(plan_file: str, marker: str, installer: str, by: str = VERSION, drifted: bool = False):
    """
    Install a release (one venv) unless its completion marker exists. The installer writes the
    marker only after every pinned version and import checked out, so "installed" never comes
    from pip's freeze output (which misses ``+cpu`` versions).

    + plan_file: the release plan (JSON) on the host
    + marker: the completion marker's path
    + installer: ``install_release.py`` on the host
    + by: the servefleet version the marker records
    + drifted: the release differs from its install (the probe's check): the installer sets it
      aside and installs it again, marker or not
    """
    if not drifted and host.get_fact(File, path=marker):
        host.noop(f"release {marker.rsplit('/', 2)[-2]} is installed")
        return
    yield StringCommand("python3", QuoteString(installer), QuoteString(plan_file), QuoteString(by))


# Fleet pre-warm: the copy goes through the controller's store (``serve_prewarm_store``). Both
# operations decide at run time (the compile they copy happens earlier in the same run), and
# neither fails its host: a copy that cannot be made or used only means the host compiles.


def _connector_args(on: Any) -> dict[str, Any]:
    args = on.current_op_global_arguments or {}
    return {k: v for k, v in args.items() if k in CONNECTOR_ARGUMENT_KEYS}


def run_with_doc(on: Any, command: str, doc: dict[str, Any], failed: str) -> bool:
    """Run time, in a FunctionCommand: ``command`` on the host ``on`` with ``doc`` as one JSON
    line on stdin (never shown), over this operation's connection. A failure is logged in one
    line, its stderr or ``failed`` (no traceback), and returned False: the operation fails, and
    with it this host."""
    args = {**_connector_args(on), "_stdin": Stdin(json.dumps(doc) + "\n")}
    ok, out = on.run_shell_command(StringCommand(command), **args)
    if not ok:
        logger.error(f"{on.print_prefix}{out.stderr.strip() or failed}")
    return bool(ok)


def _run(on: Any, *words: str) -> tuple[bool, Any]:
    return on.run_shell_command(
        StringCommand(*(QuoteString(w) for w in words)), **_connector_args(on)
    )


def _pull(
    state: Any, host: Any, fingerprint: str, cache_root: str, lib: str, store: str, copies: str
) -> bool:
    kept = Store(store)
    if kept.has(fingerprint):
        return True
    remote = f"{copies}/{fingerprint}.tar"
    ok, out = _run(host, "python3", f"{lib}/prewarm.py", "pack", cache_root, fingerprint, remote)
    try:
        if not ok:
            why = out.stderr.strip().splitlines()[-1:] or ["pack failed"]
            logger.warning(
                f"{host.print_prefix}fleet pre-warm: no copy of {fingerprint} from here: {why[0]}"
            )
            return True
        tar_part, manifest_part = kept.parts(fingerprint, host.name)
        args = _connector_args(host)
        if not (
            host.get_file(f"{remote}.json", str(manifest_part), **args)
            and host.get_file(remote, str(tar_part), **args)
        ):
            logger.warning(f"{host.print_prefix}fleet pre-warm: downloading {fingerprint} failed")
            return True
        try:
            what = kept.accept(fingerprint, tar_part, manifest_part, host.name)
        except ValueError as e:
            logger.warning(
                f"{host.print_prefix}fleet pre-warm: the copy of {fingerprint} is corrupt: {e}"
            )
            return True
        logger.info(
            f"{host.print_prefix}fleet pre-warm: {fingerprint} kept on the controller ({what})"
        )
        return True
    finally:
        _run(host, "rm", "-rf", copies)


def _push(
    state: Any,
    host: Any,
    fingerprint: str,
    cache_root: str,
    lib: str,
    store: str,
    copies: str,
    user: str,
) -> bool:
    kept = Store(store)
    if not kept.has(fingerprint):
        logger.warning(
            f"{host.print_prefix}fleet pre-warm: no copy of {fingerprint} in {kept.root} "
            "(its compile did not finish); this host compiles it"
        )
        return True
    remote = f"{copies}/{fingerprint}.tar"
    args = _connector_args(host)
    ok = (
        _run(host, "mkdir", "-p", "-m", "700", copies)[0]
        and host.put_file(str(kept.manifest_path(fingerprint)), f"{remote}.json", **args)
        and host.put_file(str(kept.tar(fingerprint)), remote, **args)
    )
    if ok:
        ok, out = _run(
            host, "python3", f"{lib}/prewarm.py", "unpack", cache_root, fingerprint, remote, user
        )
        why = (out.stderr.strip().splitlines() or ["unpack failed"])[-1]
    else:
        why = "the upload failed"
    if not ok:
        _run(host, "rm", "-rf", copies)
        logger.warning(
            f"{host.print_prefix}fleet pre-warm: the copy of {fingerprint} is not usable here "
            f"({why.removeprefix('servefleet: ')}); this host compiles it"
        )
        return True
    logger.info(f"{host.print_prefix}fleet pre-warm: {fingerprint} copied and checked")
    return True


@operation(is_idempotent=False)
def prewarm_pull(fingerprint: str, cache_root: str, lib: str, store: str, copies: str):
    """
    Keep this host's compile cache of ``fingerprint`` in the controller's store (unless it is
    there): packed on the host, downloaded, checked against its size and sha256.

    + fingerprint: the compile fingerprint
    + cache_root: serve_cache_root (VLLM_CACHE_ROOT)
    + lib: the host's servefleet lib directory (``prewarm.py``)
    + store: serve_prewarm_store on the controller
    + copies: where the tar and its manifest wait on the host (root's tree, not the cache root)
    """
    yield FunctionCommand(_pull, (fingerprint, cache_root, lib, store, copies), {})


@operation(is_idempotent=False)
def prewarm_push(fingerprint: str, cache_root: str, lib: str, store: str, copies: str, user: str):
    """
    Copy the controller's kept cache of ``fingerprint`` to this host, checked file by file by
    size and sha256 before it is used; a missing or corrupt copy leaves the host to compile.

    + fingerprint: the compile fingerprint
    + cache_root: serve_cache_root (VLLM_CACHE_ROOT)
    + lib: the host's servefleet lib directory (``prewarm.py``)
    + store: serve_prewarm_store on the controller
    + copies: where the tar and its manifest wait on the host (root's tree, not the cache root)
    + user: serve_user (owns the cache)
    """
    yield FunctionCommand(_push, (fingerprint, cache_root, lib, store, copies, user), {})


# A wheelhouse file lands as <dest>.part, is checked against its sha256 on the host, then is
# renamed into place: a cut copy never passes for a whole one.
_PLACE = 'echo "$3  $1" | sha256sum --check --status --strict || { rm -f "$1"; echo "servefleet: $2: the copy does not have sha256 $3" >&2; exit 1; }; mv -f "$1" "$2"'


@operation(is_idempotent=False)
def wheelhouse_copy(copies: list[Copy]):
    """
    Copy wheelhouse files from the controller to the host, each checked by its sha256 there
    before it takes its place. The deploy passes only the files the host lacks.

    + copies: the files (controller path, host path, sha256)
    """
    for c in copies:
        part = f"{c.dest}.part"
        yield StringCommand("mkdir", "-p", QuoteString(c.dest.rsplit("/", 1)[0]))
        yield FileUploadCommand(c.src, part)
        yield StringCommand(
            "sh",
            "-c",
            QuoteString(_PLACE),
            "sh",
            QuoteString(part),
            QuoteString(c.dest),
            QuoteString(c.sha256),
        )
