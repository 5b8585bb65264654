"""The lab's HTTP servers (stdlib only): a PEP 503 "simple" package index over a flat directory of
wheels and sdists, a plain static file server (apt repository, driver runfiles, model store), or
a Hugging Face hub API over the model store (``hub``, see lab/hub.py).

Run as ``python -m servefleet.fleet.lab.index simple|static|hub ROOT --bind IP --port N [auth]``.
Credentials are read from files (never argv): ``--user-file``/``--password-file`` turn on HTTP
Basic auth for every path; ``--token-file`` with ``--token-path`` requires
``Authorization: Bearer <token>`` under that path (the model store's Hugging Face token; the hub
asks it on every path).

Index layout served: ``/simple/`` (every project, by normalized name), ``/simple/<name>/``
(its files, linked as ``../../files/<file>#sha256=<hex>``) and ``/files/<file>``.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import hmac
import html
import mimetypes
import os
import re
import stat
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import unquote, urlsplit

from servefleet.fleet.lab import httpbase, hub

REALM = "servefleet-lab"
DIST_EXTENSIONS = (".whl", ".tar.gz", ".zip")


def normalize(name: str) -> str:
    """PEP 503 normalized project name.

    + name: a distribution name as written in a file name or a request
    """
    return re.sub(r"[-_.]+", "-", name).lower()


def project_of(filename: str) -> str | None:
    """Normalized project name of a wheel or sdist file name, or None when it is neither.

    + filename: e.g. ``vllm_rbln-0.12.1-py3-none-any.whl`` or ``arctic_inference-0.1.1.tar.gz``
    """
    if filename.endswith(".whl"):
        return normalize(filename.split("-", 1)[0])
    for ext in (".tar.gz", ".zip"):
        if filename.endswith(ext):
            stem = filename[: -len(ext)]
            if "-" in stem:
                return normalize(stem.rsplit("-", 1)[0])
    return None


def scan_index(
    root: Path, known: dict[str, tuple[tuple[int, int, int], str]] | None = None
) -> dict[str, dict[str, str]]:
    """Map each normalized project to ``{filename: sha256 hex}`` for the files directly in root.

    A file is hashed from the descriptor it is read through, so a file renamed over mid-scan
    gives the hash of one whole version of it, never a mix.

    + root: the flat directory of distributions
    + known: filename -> ((inode, size, mtime_ns), sha256) of earlier scans, updated in place;
      a file whose inode, size and mtime are unchanged is not read again
    """
    projects: dict[str, dict[str, str]] = {}
    for path in sorted(root.iterdir()):
        project = project_of(path.name)
        if project is None:
            continue
        try:
            with open(path, "rb") as handle:
                st = os.fstat(handle.fileno())
                if not stat.S_ISREG(st.st_mode):
                    continue
                key = (st.st_ino, st.st_size, st.st_mtime_ns)
                seen = known.get(path.name) if known is not None else None
                if seen is not None and seen[0] == key:
                    digest = seen[1]
                else:
                    digest = hashlib.sha256(handle.read()).hexdigest()
        except (FileNotFoundError, IsADirectoryError):  # removed or renamed away meanwhile
            continue
        if known is not None:
            known[path.name] = (key, digest)
        projects.setdefault(project, {})[path.name] = digest
    if known is not None:
        for gone in set(known) - {fn for files in projects.values() for fn in files}:
            del known[gone]
    return projects


def _page(title: str, links: list[tuple[str, str]]) -> bytes:
    body = "".join(
        f'    <a href="{html.escape(href)}">{html.escape(text)}</a><br/>\n' for href, text in links
    )
    return (
        '<!DOCTYPE html>\n<html>\n  <head><meta name="pypi:repository-version" content="1.0">'
        f"<title>{html.escape(title)}</title></head>\n  <body>\n{body}  </body>\n</html>\n"
    ).encode()


class Config:
    """What one server instance serves and how it authenticates. A ``simple`` index scans root
    at every request for a page, so a file replaced there (``servefleet lab republish``) is
    served with its new hash at once; unchanged files are not hashed again.

    + mode: ``simple`` (PEP 503 index) or ``static`` (files under root)
    + root: the directory served
    + basic: ``(user, password)`` for HTTP Basic auth on every path, or None
    + token: ``(path prefix, token)`` for Bearer auth under that prefix, or None
    """

    def __init__(
        self,
        mode: str,
        root: Path,
        basic: tuple[str, str] | None = None,
        token: tuple[str, str] | None = None,
    ) -> None:
        self.mode = mode
        self.root = root.resolve()
        self.basic = basic
        self.token = token
        self._hashes: dict[str, tuple[tuple[int, int, int], str]] = {}
        self._lock = threading.Lock()
        if mode == "simple":  # hash every file once before serving
            scan_index(self.root, self._hashes)

    @property
    def projects(self) -> dict[str, dict[str, str]]:
        """Normalized project -> ``{filename: sha256}`` of what root holds now."""
        if self.mode != "simple":
            return {}
        with self._lock:
            return scan_index(self.root, self._hashes)


class Handler(httpbase.Handler):
    server_version = "servefleet-lab"
    config: Config  # set on the subclass made by make_server

    # --- auth
    def _authorized(self, path: str) -> bool:
        header = self.headers.get("Authorization", "")
        cfg = self.config
        if cfg.basic is not None:
            expected = base64.b64encode(f"{cfg.basic[0]}:{cfg.basic[1]}".encode()).decode()
            if not hmac.compare_digest(header.encode(), f"Basic {expected}".encode()):
                self._send(
                    401,
                    b"authentication required\n",
                    "text/plain",
                    {"WWW-Authenticate": f'Basic realm="{REALM}"'},
                )
                return False
        if cfg.token is not None and path.startswith(cfg.token[0]):
            if not hmac.compare_digest(header.encode(), f"Bearer {cfg.token[1]}".encode()):
                self._send(
                    401,
                    b"a valid token is required\n",
                    "text/plain",
                    {"WWW-Authenticate": f'Bearer realm="{REALM}"'},
                )
                return False
        return True

    # --- responses
    def _file(self, path: Path, head: bool) -> None:
        root = self.config.root
        try:
            resolved = path.resolve()
            resolved.relative_to(root)
        except (OSError, ValueError):
            self._send(404, b"not found\n", "text/plain", head=head)
            return
        if not resolved.is_file():
            self._send(404, b"not found\n", "text/plain", head=head)
            return
        data = resolved.read_bytes()
        ctype = mimetypes.guess_type(resolved.name)[0] or "application/octet-stream"
        self._send(200, data, ctype, head=head)

    def _serve(self, head: bool) -> None:
        path = unquote(urlsplit(self.path).path)
        if not self._authorized(path):
            return
        if self.config.mode == "static":
            self._file(self.config.root / path.lstrip("/"), head)
            return
        if path in ("/", "/simple"):
            self._send(301, b"", "text/plain", {"Location": "/simple/"}, head)
        elif path == "/simple/":
            links = [(f"{name}/", name) for name in sorted(self.config.projects)]
            self._send(200, _page("Simple index", links), "text/html", head=head)
        elif path.startswith("/simple/"):
            name = path[len("/simple/") :].strip("/")
            if normalize(name) != name or not path.endswith("/"):
                self._send(
                    301, b"", "text/plain", {"Location": f"/simple/{normalize(name)}/"}, head
                )
            elif name in (projects := self.config.projects):
                links = [
                    (f"../../files/{fn}#sha256={sha}", fn) for fn, sha in projects[name].items()
                ]
                self._send(200, _page(f"Links for {name}", links), "text/html", head=head)
            else:
                self._send(404, b"no such project\n", "text/plain", head=head)
        elif path.startswith("/files/") and "/" not in path[len("/files/") :]:
            self._file(self.config.root / path[len("/files/") :], head)
        else:
            self._send(404, b"not found\n", "text/plain", head=head)


def make_server(config: Config, bind: str, port: int) -> httpbase.Server:
    """A threading HTTP server for config on bind:port (not started).

    + config: what to serve
    + bind: the address to listen on
    + port: the TCP port
    """
    handler = type("LabHandler", (Handler,), {"config": config})
    return httpbase.Server((bind, port), handler)


def fetch(
    url: str, headers: dict[str, str] | None = None, timeout: float = 10
) -> tuple[int, dict[str, str], bytes]:
    """GET url without raising on HTTP errors: ``(status, headers, body)``.

    + url: the URL to fetch
    + headers: extra request headers (e.g. Authorization)
    + timeout: seconds before giving up (raises OSError)
    """
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def _read_secret(path: str) -> str:
    return Path(path).read_text().strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m servefleet.fleet.lab.index")
    parser.add_argument("mode", choices=["simple", "static", "hub"])
    parser.add_argument("root", type=Path)
    parser.add_argument("--bind", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--name", default="", help="server name (for logs and clean-up scans)")
    parser.add_argument("--user-file")
    parser.add_argument("--password-file")
    parser.add_argument("--token-file")
    parser.add_argument("--token-path", default="/")
    args = parser.parse_args(argv)
    basic = None
    if args.user_file or args.password_file:
        if not (args.user_file and args.password_file):
            parser.error("--user-file and --password-file go together")
        basic = (_read_secret(args.user_file), _read_secret(args.password_file))
    token = (args.token_path, _read_secret(args.token_file)) if args.token_file else None
    if args.mode == "hub":
        repos = hub.load_store(args.root)
        server = hub.make_server(repos, args.bind, args.port, token[1] if token else None)
    else:
        server = make_server(Config(args.mode, args.root, basic, token), args.bind, args.port)
    print(
        f"{args.name or args.mode} serving {args.root} on http://{args.bind}:{args.port}/",
        flush=True,
    )
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
