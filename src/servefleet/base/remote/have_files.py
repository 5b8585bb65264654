#!/usr/bin/env python3
"""servefleet: which of these files does the host hold, with that sha256? Runs ON THE HOST
(stdlib only); the controller sends it inline (``sdk_source = "wheelhouse"``: what a copy may
skip, before anything of ours may be on the host).

usage: have_files.py FILES_JSON      # {host path: sha256}

Prints the JSON list of the paths that hold their sha256, sorted.
"""

from __future__ import annotations

import json
import sys

if __package__:  # the controller imports this module (servefleet.base.remote.have_files)
    from servefleet.base.remote import layout
else:  # inline on the host: layout is carried along (servefleet.base.remote.inline)
    import layout  # type: ignore[no-redef]


def sha256_of(path: str) -> str | None:
    """The file's sha256 (layout's rule), None when it cannot be read."""
    try:
        return layout.sha256_of(path)
    except OSError:
        return None


def have(files: dict[str, str]) -> list[str]:
    return sorted(path for path, want in files.items() if sha256_of(path) == want)


if __name__ == "__main__":
    print(json.dumps(have(json.loads(sys.argv[1]))))
