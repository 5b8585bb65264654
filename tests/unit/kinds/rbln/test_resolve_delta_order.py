"""The order an RBLN grid's deltas apply in (``kinds/rbln/resolve.py``'s step 4): within a
role, the deltas of the grid's modes, then of its options, so an option's delta wins over a
mode's on the same key and deletes what a mode's added. Issue #37's hole 1: the shipped card's
modes and options never touch the same key, so nothing else tells the order (shown failing
with the options' deltas applied first)."""

from __future__ import annotations

import json
from pathlib import Path

from rbln_cases import COMPILER, TINY

from servefleet.kinds.rbln.card import load_card
from servefleet.kinds.rbln.resolve import resolve_rbln


def _tiny_with_option_delta(tmp_path: Path) -> Path:
    """tiny-moe with a ``sampler=on`` delta (an option) touching what ``lmcache=cpu`` (a mode)
    adds (``--max-num-seqs``, ``LMCACHE_CHUNK_SIZE``) and deleting what ``spec_decode=eagle3``
    (a mode) adds (``--speculative-config``)."""
    card = json.loads(TINY.read_text())
    grid = card["strategies"][0]["options"][0]["grid"]
    grid["deltas"]["sampler=on"] = {
        "main": {
            "add_args": {"--max-num-seqs": "--max-num-seqs 3"},
            "add_envs": {"LMCACHE_CHUNK_SIZE": "LMCACHE_CHUNK_SIZE=512"},
            "del_args": ["--speculative-config"],
            "del_envs": [],
        }
    }
    path = tmp_path / "both-touch.json"
    path.write_text(json.dumps(card))
    return path


def test_an_option_delta_applies_after_a_mode_delta_on_the_same_key(tmp_path: Path) -> None:
    card = load_card(_tiny_with_option_delta(tmp_path), name="rbln/both-touch")
    spec = resolve_rbln(card, sets={"lmcache": "cpu", "sampler": "on"}, compiler_version=COMPILER)
    main = spec.servers[0]
    # the mode's value first (2, 256), then the option's over it, in the key's base place
    assert main.argv[3:5] == ["--max-num-seqs", "3"], main.argv
    assert main.argv.count("--max-num-seqs") == 1
    assert main.env["LMCACHE_CHUNK_SIZE"] == "512"
    # without the option's delta the mode's value stands
    alone = resolve_rbln(card, sets={"lmcache": "cpu", "sampler": "off"}).servers[0]
    assert alone.argv[3:5] == ["--max-num-seqs", "2"] and alone.env["LMCACHE_CHUNK_SIZE"] == "256"


def test_an_option_delta_deletes_what_a_mode_delta_added(tmp_path: Path) -> None:
    card = load_card(_tiny_with_option_delta(tmp_path), name="rbln/both-touch")
    kept = resolve_rbln(card, sets={"spec_decode": "eagle3", "sampler": "off"}).servers[0]
    assert any(w.startswith("--speculative-config") for w in kept.argv)
    gone = resolve_rbln(card, sets={"spec_decode": "eagle3", "sampler": "on"})
    assert not any(w.startswith("--speculative-config") for w in gone.servers[0].argv)
    assert gone.requirements.models == ["acme/tiny-moe"]  # no draft model to fetch
