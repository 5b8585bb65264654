"""A PEP 751 lock text (``pylock.toml``) read: its packages, each one's files, and the release id
of the locked set.

Controller-side; imports no pyinfra.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Mapping
from typing import Any

from servefleet.release.stack import LockError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def packages(pylock: str) -> list[dict[str, Any]]:
    """The ``[[packages]]`` of a pylock text.

    + pylock: PEP 751 text
    """
    try:
        return list(tomllib.loads(pylock).get("packages", []))
    except tomllib.TOMLDecodeError as e:
        raise LockError(f"not a valid pylock file: {e}") from None


def files_of(package: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every file (wheels and sdist) of a pylock package: ``{"url", "sha256"}``.

    + package: one ``[[packages]]`` entry
    """
    found = [*package.get("wheels", []), *([package["sdist"]] if "sdist" in package else [])]
    return [{"url": f["url"], "sha256": f["hashes"]["sha256"]} for f in found]


def release_id(pylock: str) -> str:
    """The release id of a locked stack: the hash of its locked set (names, versions, indexes,
    file URLs and hashes), independent of the lock file's layout. A URL edited after locking
    changes it, so the lock is refused rather than credentials sent to a new origin (#18
    finding 7).

    + pylock: PEP 751 text
    """
    locked = sorted(
        (p["name"], p["version"], p.get("index", ""),
         sorted((f["url"], f["sha256"]) for f in files_of(p)))
        for p in packages(pylock)
    )  # fmt: skip
    return hashlib.sha256(json.dumps(locked).encode()).hexdigest()[:16]
