"""What the fuzz campaigns share (``kinds/test_fuzz_recipes.py``, ``fleet/analysis/
test_fuzz_probe.py``): their hypothesis settings, deterministic and as long as
``SERVEFLEET_FUZZ_EXAMPLES`` asks, and the locations of a document's nodes."""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

from hypothesis import HealthCheck, settings

# SERVEFLEET_FUZZ_EXAMPLES=N: a longer campaign of N inputs per test (the first examples are the
# same as the suite's: the examples are derived, not random)
LONGER = int(os.environ.get("SERVEFLEET_FUZZ_EXAMPLES") or 0)

Loc = tuple[Any, ...]


def campaign(examples: int) -> Any:
    """The settings of a fuzz test of ``examples`` inputs in the suite (or ``LONGER``)."""
    return settings(
        max_examples=LONGER or examples,
        derandomize=True,
        database=None,
        deadline=timedelta(seconds=10),
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


def locations(doc: Any, here: Loc = ()) -> list[Loc]:
    """The location of every node of a document, the root first."""
    out = [here]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += locations(v, (*here, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += locations(v, (*here, i))
    return out
