"""servefleet's own pyinfra facts and operations: the few things pyinfra's do not do right for us."""

from __future__ import annotations

import hashlib
import json
import shlex
from typing import Any

from pyinfra import host
from pyinfra.api import (
    FactBase,
    HiddenValue,
    QuoteString,
    StringCommand,
    operation,
)
from pyinfra.facts.files import File, Link, Sha256File

from servefleet.hostplan import PROBE


class HostProbe(FactBase):
    """
    Returns what servefleet needs to know of a host, read in one round trip: kernel release,
    ``rbln-smi -j`` (or ``lspci -n`` lines before a driver), complete releases, the ``current``
    release, the last good state's release, our units (active, enabled, the unit sha each main
    process runs, the file's sha256), warm compile fingerprints, complete models, the serve user.
    """

    def command(self, args: str) -> str:
        return f"python3 -c {shlex.quote(PROBE)} {shlex.quote(args)}"

    def process(self, output: list[str]) -> dict[str, Any]:
        return json.loads("\n".join(output))


class InstanceHealth(FactBase):
    """
    Returns port -> "ok" or why not, for each port: ``GET /health`` on 127.0.0.1 from the host.
    """

    def command(self, ports: tuple[int, ...]) -> str:
        return f"python3 -c {shlex.quote(_HEALTH)} " + " ".join(str(p) for p in ports)

    def process(self, output: list[str]) -> dict[str, str]:
        return json.loads("\n".join(output))


_HEALTH = r"""
import json, sys, urllib.request
out = {}
for port in sys.argv[1:]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
            out[port] = "ok" if r.status == 200 else f"/health answered {r.status}"
    except Exception as e:
        out[port] = f"not answering: {getattr(e, 'reason', e)}"
print(json.dumps(out))
"""


@operation()
def secret_file(dest: str, content: HiddenValue, mode: str = "600"):
    """
    Write a secret to a root-only file from this operation's ``_stdin`` (see :func:`put_secret`).
    Unlike ``files.put`` it never shows the content (no ``--diff``, nothing in ``-vvv``), never
    puts it in argv, and works with ``--sudo``: nothing is uploaded as the login user.

    + dest: path on the host, in a 0700 directory
    + content: the secret (compared by sha256 with the file; it is sent on stdin)
    + mode: final file mode
    """
    data = content.unmask().encode()
    info = host.get_fact(File, path=dest)
    if (
        info
        and str(info["mode"]) == mode.lstrip("0")
        and host.get_fact(Sha256File, path=dest) == hashlib.sha256(data).hexdigest()
    ):
        host.noop(f"{dest} is up to date")
        return
    script = 'umask 077; cat > "$1.servefleet-tmp" && chmod "$2" "$1.servefleet-tmp" && mv -f "$1.servefleet-tmp" "$1"'
    yield StringCommand("sh", "-c", QuoteString(script), "sh", QuoteString(dest), mode)


def put_secret(name: str, dest: str, secret: str) -> None:
    """Write ``secret`` to ``dest`` (0600), sent on the remote command's stdin (pyinfra ends
    each stdin line with a newline, so the file holds one at the end)."""
    line = secret if secret.endswith("\n") else secret + "\n"
    secret_file(name=name, dest=dest, content=HiddenValue(line), _stdin=line)


@operation()
def release(plan_file: str, marker: str, installer: str):
    """
    Install a release (one venv) unless its completion marker exists. The installer writes the
    marker only after every pinned version and import checked out, so "installed" never comes
    from pip's freeze output (which misses ``+cpu`` versions).

    + plan_file: the release plan (JSON) on the host
    + marker: the completion marker's path
    + installer: ``install_release.py`` on the host
    """
    if host.get_fact(File, path=marker):
        host.noop(f"release {marker.rsplit('/', 2)[-2]} is installed")
        return
    yield StringCommand("python3", QuoteString(installer), QuoteString(plan_file))


@operation()
def current_link(root: str, release_id: str):
    """
    Point ``<root>/current`` at ``releases/<release_id>`` by rename (never a moment without the
    link). Nothing is removed here: ``remote/instances.py`` removes releases once no unit or kept
    state names them.

    + root: serve_root
    + release_id: the release that serves now
    """
    target = f"releases/{release_id}"
    link = host.get_fact(Link, path=f"{root}/current")
    if link and link.get("link_target") == target:
        host.noop(f"{root}/current is {target}")
        return
    script = 'set -e; cd "$1"; ln -sfn "$2" current.new; mv -T current.new current'
    yield StringCommand(
        "sh", "-c", QuoteString(script), "sh", QuoteString(root), QuoteString(target)
    )
