"""The testkind's data defaults: its serving package's pin, no index of its own, and its driver."""

from typing import Any

DEFAULTS: dict[str, Any] = {
    "sdk_pins": ["testbox-serve==1.0"],  # the serving package (never installed by the tests)
    "sdk_extra_packages": {},  # no extras
    "pip_indexes": {},  # nothing owned by a private index: no credentials
    "driver_version": "1.0",  # the driver its hosts need (written by its driver step)
}
