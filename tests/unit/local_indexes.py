"""The unit tests' local package indexes (served by the ``index`` fixture of conftest.py):
``owner`` holds the owned package ``sfowned`` behind HTTP Basic auth; ``public`` holds
everything else and a squatter ``sfowned 9.0``."""

from __future__ import annotations

PACKAGES: dict[str, list[tuple[str, str, dict[str, str], list[str]]]] = {
    "owner": [("sfowned", "1.0", {"sfowned/__init__.py": "ORIGIN = 'owner'\n"}, ["sfdep"])],
    "public": [
        ("sfowned", "9.0", {"sfowned/__init__.py": "ORIGIN = 'squatter'\n"}, []),
        ("sfdep", "1.0", {"sfdep/__init__.py": ""}, []),
        ("sfdep", "2.0", {"sfdep/__init__.py": ""}, []),
        ("sfpub", "1.0", {"sfpub/__init__.py": ""}, []),
        ("sfbroken", "1.0", {"sfbroken/__init__.py": "raise RuntimeError('no NPU here')\n"}, []),
    ],
}
OWNER_LOGIN = ("sf-user", "sf-pass#h$!;&|<>(*)`")  # bare netrc tokens: uv and pip read them
