#!/usr/bin/env python3
"""servefleet driver step helpers. Run ON THE HOST, as root, with the system python3 (stdlib
only), from ``<serve_root>/lib``.

usage: driver.py fetch URL DEST     # download the runfile (the step checks its sha256)
       driver.py check VERSION      # exit 1 unless rbln-smi reports driver VERSION
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request


def fetch(url: str, dest: str) -> None:
    urllib.request.urlretrieve(url, dest)


def check(version: str) -> None:
    smi = subprocess.run(["rbln-smi", "-j"], check=True, capture_output=True, text=True)
    found = json.loads(smi.stdout).get("KMD_version")
    if found != version:
        sys.exit(f"servefleet: rbln-smi reports driver {found}, wanted {version}")


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[0] == "fetch":
        fetch(argv[1], argv[2])
        return 0
    if len(argv) == 2 and argv[0] == "check":
        check(argv[1])
        return 0
    print(__doc__.split("\n\n")[1], file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
