"""What the canary analysis' tests share: the per-request samples the probe recorded
(tests/data/analysis_samples.json: ``equal``, ``slower_30``, ``noisy``; test_stats.py says how
they were recorded), as Samples and as the Sides a probe returns, and a stand-in probe that
returns them and keeps the targets it was given."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field

from repo_paths import DATA

from servefleet.fleet.analysis.probe import Load, Side, Target
from servefleet.fleet.analysis.stats import Samples

RECORDED = json.loads((DATA / "analysis_samples.json").read_text())


def recorded(case: str) -> tuple[Samples, Samples]:
    """The canary's and the baseline's samples of ``case``."""
    sides = RECORDED[case]
    return Samples(**sides["canary"]), Samples(**sides["baseline"])


@dataclass
class RecordedProbe:
    """A probe that answers ``case``'s samples (and, on each side, ``metrics``)."""

    case: str
    calls: list[tuple[list[Target], Load]] = field(default_factory=list)

    def __call__(self, targets: Sequence[Target], load: Load) -> tuple[list[Side], float]:
        self.calls.append((list(targets), load))
        canary, baseline = recorded(self.case)
        metrics = {"vllm:generation_tokens_total": {"type": "counter", "delta": 480.0}}
        sides = [Side(t, "openai/gpt-oss-120b", s, metrics=dict(metrics))
                 for t, s in zip(targets, (canary, baseline), strict=True)]  # fmt: skip
        return sides, 1.5
