"""Code from an index that a host program runs (the release check of ``install_release.py``:
``import vllm, torch, rebel``), run so that it reads none of root's secrets (the netrc, the hub
token, the API key: 0600 root files under /etc/servefleet/secrets) and cannot outlive its run
(#46 item 4). The way the controller runs index code (``servefleet.base.sandbox``, #31 finding 2):

``unshare`` (util-linux) starts it in a new PID namespace with its own ``/proc``, killed with its
parent; when its first process ends the kernel kills the rest, so nothing it started lives on.
``setpriv`` drops it to :data:`USER` (no groups, no capabilities, no new privileges): it reads
none of root's files and writes only its :func:`workspace`. Its environment is
:func:`environment`, never a credential. The caller is root (hosts run their programs as root).

Stdlib only (python3 >= 3.10): hosts get it with the programs in ``<serve_root>/lib``.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import tempfile
from collections.abc import Iterator, Mapping, Sequence

USER = "nobody"  # who runs index code on hosts (base/sandbox.py's build user too)
NOBODY = (65534, 65534)  # its uid and gid where there is no such entry
# what of the caller's environment it gets: locale, time zone, proxies, CA files (no credential)
ALLOWED = frozenset(
    ["LANG", "LANGUAGE", "TZ", "TERM", "SSL_CERT_FILE", "SSL_CERT_DIR"]
    + ["http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY"]
)
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"


def ids() -> tuple[int, int]:
    """The uid and gid index code runs as: :data:`USER`'s."""
    try:
        entry = pwd.getpwnam(USER)
    except KeyError:
        return NOBODY
    return (entry.pw_uid, entry.pw_gid)


def argv(
    cmd: Sequence[str],
    who: tuple[int, int],
) -> list[str]:
    """``cmd`` in a new PID namespace with its own ``/proc``, killed with its parent, as ``who``
    (no groups, no capabilities, no new privileges).

    + cmd: the command (its first word an absolute path ``who`` can run)
    + who: uid and gid from :func:`ids`
    """
    ns = ["--pid", "--fork", "--kill-child", "--mount-proc"]
    uid, gid = who
    drop = [f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--no-new-privs"]
    drop += ["--inh-caps=-all", "--bounding-set=-all"]
    return ["unshare", *ns, "--", "setpriv", *drop, "--", *cmd]


def environment(home: str, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment index code gets on a host: :data:`ALLOWED` of ``environ`` (default this
    process's), the system's PATH, and HOME and TMPDIR in its workspace.

    + home: the workspace (:func:`workspace`)
    + environ: the environment to take from
    """
    source = os.environ if environ is None else environ
    env = {k: v for k, v in source.items() if k in ALLOWED or k.startswith("LC_")}
    env.update(PATH=SYSTEM_PATH, HOME=home, TMPDIR=os.path.join(home, "tmp"))
    return env


@contextlib.contextmanager
def workspace(who: tuple[int, int], prefix: str = "servefleet-") -> Iterator[str]:
    """A new empty directory of ``who``'s (mode 0700, a ``tmp`` in it) in a 0711 directory of
    root's in ``/tmp``, removed afterwards (``shutil.rmtree``: links in it never followed).

    + who: uid and gid from :func:`ids`
    + prefix: the outer directory's name begins so
    """
    top = tempfile.mkdtemp(prefix=prefix, dir="/tmp")
    try:
        os.chmod(top, 0o711)
        path = os.path.join(top, "work")
        for made in (path, os.path.join(path, "tmp")):
            os.mkdir(made, 0o700)
            os.chown(made, *who)
        yield path
    finally:
        shutil.rmtree(top, ignore_errors=True)
