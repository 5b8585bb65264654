#!/usr/bin/env python3
"""servefleet: which of these files does the host hold, with that sha256? Runs ON THE HOST
(stdlib only); the controller sends it inline (``sdk_source = "wheelhouse"``: what a copy may
skip, before anything of ours may be on the host).

usage: have_files.py FILES_JSON      # {host path: sha256}

Prints the JSON list of the paths that hold their sha256, sorted.
"""

from __future__ import annotations

import hashlib
import json
import sys


def sha256_of(path: str) -> str | None:
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
    except OSError:
        return None
    return digest.hexdigest()


def have(files: dict[str, str]) -> list[str]:
    return sorted(path for path, want in files.items() if sha256_of(path) == want)


if __name__ == "__main__":
    print(json.dumps(have(json.loads(sys.argv[1]))))
