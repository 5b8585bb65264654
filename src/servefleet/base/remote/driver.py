#!/usr/bin/env python3
"""servefleet driver step helpers. Run ON THE HOST, as root, with the system python3 (stdlib
only), from ``<serve_root>/lib``.

usage: driver.py fetch URL DEST                # download the installer (the step checks its sha256)
       driver.py check VERSION KEY ARGV...     # exit 1 unless ARGV's JSON names VERSION under KEY
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import retry  # noqa: E402  (next to this file on the host)

TIMEOUT = 60.0  # seconds a connect or one read of the runfile download may take
MAX_BYTES = 8 << 30  # a runfile larger than this is not one


def fetch(url: str, dest: str, timeout: float = TIMEOUT, tries: int = retry.TRIES) -> None:
    """``url`` into ``dest``, tried again after a transient failure (``retry``'s rule); a
    refusal, a server that sends too much, or one that stays unreachable fails in one line
    (exit 3 for "could not reach")."""

    def once() -> None:
        size = 0
        with urllib.request.urlopen(url, timeout=timeout) as r, open(dest, "wb") as out:
            for chunk in iter(lambda: r.read(1 << 20), b""):
                size += len(chunk)
                if size > MAX_BYTES:
                    sys.exit(f"servefleet: {url}: larger than {MAX_BYTES} bytes; not a runfile")
                out.write(chunk)
            retry.check_whole(r)

    try:
        retry.attempts(once, tries)
    except retry.GaveUp as e:
        print(f"servefleet: {url}: could not reach it ({e}); try again later", file=sys.stderr)
        sys.exit(retry.UNREACHABLE_EXIT)
    except (OSError, ValueError) as e:  # a refusal (HTTP 4xx), a certificate, a local error
        sys.exit(f"servefleet: {url}: cannot download the runfile ({retry.reason(e)})")


def check(version: str, key: str, argv: list[str]) -> None:
    """Exit 1 unless the JSON object ``argv`` prints names ``version`` under ``key`` (the
    driver's kind says which command reports its version: RBLN's ``rbln-smi -j``, its
    ``KMD_version``)."""
    out = subprocess.run(argv, check=True, capture_output=True, text=True)
    found = json.loads(out.stdout).get(key)
    if found != version:
        sys.exit(f"servefleet: {argv[0]} reports driver {found}, wanted {version}")


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[0] == "fetch":
        fetch(argv[1], argv[2])
        return 0
    if len(argv) >= 4 and argv[0] == "check":
        check(argv[1], argv[2], argv[3:])
        return 0
    print(__doc__.split("\n\n")[1], file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
