"""servefleet's own pyinfra facts and operations: the few things pyinfra's do not do right for us."""

from __future__ import annotations

import hashlib
import json
import shlex
from io import BytesIO
from typing import Any

from pyinfra import host
from pyinfra.api import (
    FactBase,
    FileUploadCommand,
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
    release, our units and whether each is active, warm compile fingerprints, models present.
    """

    def command(
        self, root: str, hf_home: str, cache_root: str, models: tuple[str, ...] = ()
    ) -> str:
        args = " ".join(shlex.quote(a) for a in (root, hf_home, cache_root, *models))
        return f"python3 -c {shlex.quote(PROBE)} {args}"

    def process(self, output: list[str]) -> dict[str, Any]:
        return json.loads("\n".join(output))


@operation()
def secret_file(dest: str, content: HiddenValue, mode: str = "600"):
    """
    Upload a secret to a root-only file. Unlike ``files.put`` it never shows the content:
    no ``--diff``, nothing in ``-vvv`` output, and it passes only through ``dest``'s directory,
    which must be 0700.

    + dest: path on the host
    + content: the secret, wrapped so that pyinfra prints it masked
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
    tmp = f"{dest}.servefleet-tmp"
    yield FileUploadCommand(BytesIO(data), tmp, remote_temp_filename=tmp)
    yield StringCommand(
        "chmod", mode, QuoteString(tmp), "&&", "mv", "-f", QuoteString(tmp), QuoteString(dest)
    )


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
    link), keep the release it pointed at before for rollback, and remove older ones.

    + root: serve_root
    + release_id: the release that serves now
    """
    target = f"releases/{release_id}"
    link = host.get_fact(Link, path=f"{root}/current")
    if link and link.get("link_target") == target:
        host.noop(f"{root}/current is {target}")
        return
    script = (
        'set -e; cd "$1"; old=$(readlink current || true); '
        'ln -sfn "$2" current.new; mv -T current.new current; '
        'for r in releases/*; do [ "$r" = "$2" ] || [ "$r" = "$old" ] || rm -rf "$r"; done'
    )
    yield StringCommand(
        "sh", "-c", QuoteString(script), "sh", QuoteString(root), QuoteString(target)
    )
