"""The product's compile fingerprint and the lab simulator's cache key are written independently
(the simulator from rbln.md §3.5 alone). Across every selection of the seed card and across
compiler versions, they must split the selections the same way:
two selections share a fingerprint exactly when they share the simulator's cache key."""

from __future__ import annotations

import pytest
from lab_sim_support import load_sim
from rbln_cases import combinations, seed

from servefleet.kinds.rbln.resolve import resolve_rbln


def _sim():
    return load_sim("servefleet_lab_vllm_sim_fingerprint")


@pytest.mark.parametrize("compilers", [("0.12.0",), ("0.12.0", "0.12.1", "0.13.0")])
def test_fingerprint_changes_exactly_when_the_simulator_key_does(
    compilers: tuple[str, ...],
) -> None:
    sim = _sim()
    card = seed()
    pairs = []
    for strategy, target, selection in combinations(card):
        for compiler in compilers:
            spec = resolve_rbln(
                card, target=target, strategy=strategy, sets=selection, compiler_version=compiler
            )
            server = spec.servers[0]
            key = sim.cache_key(
                server.argv, {**server.env, "RBLN_VISIBLE_DEVICES": "0"}, "RBLN-CR13", compiler
            )
            pairs.append((spec.compile_fingerprint, key))
    assert len(pairs) == 108 * len(compilers)
    by_print: dict[str, set[str]] = {}
    by_key: dict[str, set[str]] = {}
    for fp, key in pairs:
        by_print.setdefault(fp, set()).add(key)
        by_key.setdefault(key, set()).add(fp)
    assert all(len(v) == 1 for v in by_print.values()), "one fingerprint, several simulator keys"
    assert all(len(v) == 1 for v in by_key.values()), "one simulator key, several fingerprints"
    assert len(by_print) > 1  # the selections do differ in compile inputs
