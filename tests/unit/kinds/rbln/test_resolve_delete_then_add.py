"""Within one delta of an RBLN grid, deletions come before additions (``kinds/rbln/resolve.py``
``build_servers``, step 4): a delta that deletes a key and adds it again replaces it, never
loses it. Issue #52 bug 1: with the additions applied first (the ``add_args``/``add_envs``
loops moved above the ``del_args``/``del_envs`` loops) a delta that deletes and re-adds
``--max-num-seqs`` dropped the flag; these tests failed on that bug (the flag and the variable
gone) and pass on the code as it is."""

from __future__ import annotations

import json
from pathlib import Path

from rbln_cases import COMPILER, TINY

from servefleet.kinds.rbln.card import load_card
from servefleet.kinds.rbln.resolve import resolve_rbln


def _card_with_replacing_delta(tmp_path: Path) -> Path:
    """tiny-moe whose ``sampler=on`` delta deletes ``--max-num-seqs`` and
    ``VLLM_RBLN_USE_DEVICE_TENSOR`` (both in the base) and adds them again with other values."""
    card = json.loads(TINY.read_text())
    grid = card["strategies"][0]["options"][0]["grid"]
    grid["deltas"]["sampler=on"] = {
        "main": {
            "add_args": {"--max-num-seqs": "--max-num-seqs 7"},
            "add_envs": {"VLLM_RBLN_USE_DEVICE_TENSOR": "VLLM_RBLN_USE_DEVICE_TENSOR=0"},
            "del_args": ["--max-num-seqs"],
            "del_envs": ["VLLM_RBLN_USE_DEVICE_TENSOR"],
        }
    }
    path = tmp_path / "replace.json"
    path.write_text(json.dumps(card))
    return path


def test_a_delta_that_deletes_and_adds_a_flag_replaces_it(tmp_path: Path) -> None:
    card = load_card(_card_with_replacing_delta(tmp_path), name="rbln/replace")
    main = resolve_rbln(card, sets={"sampler": "on"}, compiler_version=COMPILER).servers[0]
    assert main.argv.count("--max-num-seqs") == 1, main.argv
    i = main.argv.index("--max-num-seqs")
    assert main.argv[i + 1] == "7"
    # deleted, then added: a new key, so it goes to the end
    assert main.argv[-2:] == ["--max-num-seqs", "7"], main.argv


def test_a_delta_that_deletes_and_adds_a_variable_replaces_it(tmp_path: Path) -> None:
    card = load_card(_card_with_replacing_delta(tmp_path), name="rbln/replace")
    main = resolve_rbln(card, sets={"sampler": "on"}, compiler_version=COMPILER).servers[0]
    assert main.env.get("VLLM_RBLN_USE_DEVICE_TENSOR") == "0", main.env
    off = resolve_rbln(card, sets={"sampler": "off"}, compiler_version=COMPILER).servers[0]
    assert "VLLM_RBLN_USE_DEVICE_TENSOR" not in off.env  # sampler=off's delta deletes it
