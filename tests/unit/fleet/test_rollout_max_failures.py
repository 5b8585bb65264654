"""``--max-failures`` counts every failed host of the rollout, not of one batch: failures spread
over several batches (``Rollout.run`` with a scripted pyinfra, no real one). Issue #37's hole 7
(shown failing with the failures counted per batch)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from servefleet.fleet.rollout import Rollout


class _Scripted(Rollout):
    """A Rollout whose pyinfra runs fail the hosts of ``fail`` (no real pyinfra)."""

    def __init__(self, fail: set[str]) -> None:
        self.fail, self.runs, self.lines = fail, list[list[str]](), list[str]()
        super().__init__(inventory="inv.py", deploy="serve.py", pyinfra_args=[],
                         report=lambda kind, hosts: {}, echo=self.lines.append)  # fmt: skip

    def pyinfra(
        self, hosts: list[str], deploy: str, compiling: Sequence[str] = ()
    ) -> tuple[int, dict[str, Any] | None, str]:
        self.runs.append(list(hosts))
        failed = sorted(set(hosts) & self.fail)
        err = "".join(f"[{h}] servefleet: {h}: the gate failed: instance 0 answered 500\n"
                      for h in failed)  # fmt: skip
        return (1 if failed else 0), {"failed_hosts": failed}, err


def test_max_failures_counts_failures_over_every_batch() -> None:
    plan = [["h1"], ["h2", "h3"], ["h4", "h5"], ["h6"]]
    r = _Scripted({"h1", "h3"})  # one failed host in each of the first two batches
    assert not r.run(plan, max_failures=1)
    assert r.runs == [["h1"], ["h2", "h3"]]  # stopped after the second failure
    results = {h: x.result for h, x in r.results.items()}
    assert results == {"h1": "failed", "h2": "ok", "h3": "failed", "h4": "not reached",
                       "h5": "not reached", "h6": "not reached"}  # fmt: skip
    # the same failures within the limit: every batch runs
    r = _Scripted({"h1", "h3"})
    assert r.run(plan, max_failures=2)
    assert r.runs == plan
