"""The compile fingerprint's property over vLLM's whole flag table (issue #37): a flag changes
the product's fingerprint exactly when it changes the lab simulator's compile cache key (the
simulated vllm-rbln's, written apart from the fingerprint), for every flag of the table the two
parse with (``base/flags.py``'s dump of vllm-rbln 0.12.0's parser) and two settings of each, both
made from what the table says the flag takes (its choices, its type, and for a JSON config
flag a field of its config class from the configs dump). Nothing here lists flags by hand.

Where the two disagreed the real wheels decided (vLLM 0.30.0's ``VllmConfig.compute_hash`` and
vllm-rbln 0.12.0's ``mega_cache.config_signature``), see docs/testing.md: seven flags changed
the simulator's key and not the fingerprint (``--compilation-config``, ``--hf-overrides``,
``--attention-backend``, ``--disable-sliding-window``, ``--language-model-only``,
``--additional-config``, ``--moe-backend``/``--linear-backend``, ``--mm-encoder-tp-mode``) and
were added to the fingerprint; ``--enable-chunked-prefill`` is in no hash of the real wheels and
left the simulator's key.
"""

from __future__ import annotations

import contextlib
import io
import json
from typing import Any

import pytest
from flag_settings import FLAGS, dump, settings, spelling
from lab_sim_support import load_sim
from rbln_cases import COMPILER

from servefleet.base.vllm_reference import reference
from servefleet.kinds.rbln import compile_table, fingerprint as fpm

BASE = ["vllm", "serve", "m/x"]
ENV = {"RBLN_VISIBLE_DEVICES": "0"}
SIM = load_sim("servefleet_lab_vllm_sim_fingerprint")


CONFIGS = dump(reference().tables["rbln"].configs)


def _field_settings(flag: str) -> list[str]:
    """Two JSON objects for a config flag: one field of its class, from the configs dump, set
    to two values of its type (a boolean, else an enum's first two, else two integers)."""
    props = CONFIGS[flag]["schema"].get("properties", {})
    for kind in ("boolean", "enum", "integer"):
        for name, schema in sorted(props.items()):
            options = schema.get("anyOf", [schema])
            if kind == "boolean" and any(o.get("type") == "boolean" for o in options):
                return [json.dumps({name: True}), json.dumps({name: False})]
            enum = next((o["enum"] for o in options if len(o.get("enum", [])) > 1), None)
            if kind == "enum" and enum:
                return [json.dumps({name: v}) for v in enum[:2]]
            if kind == "integer" and any(o.get("type") == "integer" for o in options):
                return [json.dumps({name: 3}), json.dumps({name: 5})]
    return []


def _json_values(entry: dict[str, Any]) -> list[str]:
    flag = spelling(entry)
    return _field_settings(flag) if flag in CONFIGS else ['{"a": 1}', '{"a": 2}']


def _key(argv: list[str]) -> str | None:
    """The simulator's cache key, or None when its parser refuses the command line."""
    with contextlib.redirect_stderr(io.StringIO()):
        try:
            return str(SIM.cache_key(argv, ENV, "RBLN-CR13", COMPILER))
        except (SystemExit, ValueError):  # argparse's exit, vLLM's own refusals (--config)
            return None


def _fp(argv: list[str]) -> str:
    return fpm.compile_fingerprint(argv, {}, 1, "RBLN-CR13", COMPILER)


def _parsed(entry: dict[str, Any]) -> list[list[str]] | None:
    """The flag's settings the simulator parses (a lone one paired with the base), or None."""
    parsed = [s for s in settings(entry, _json_values) if _key(BASE + s) is not None]
    if not parsed:
        return None
    return [[], parsed[0]] if len(parsed) == 1 else parsed


# the simulator's side, at import (collection needs the flags compared); the fingerprint's is
# computed in each test, so a mutation campaign's mutant of the fingerprint is active there
PARSED = {spelling(e): _parsed(e) for e in FLAGS}
COMPARED = [f for f, p in PARSED.items() if p is not None]
SIM_CHANGES = {f: len({_key(BASE + s) for s in PARSED[f] or ()}) > 1 for f in COMPARED}


def _fp_changes(flag: str) -> bool:
    """Whether the flag's settings give more than one fingerprint."""
    return len({_fp(BASE + s) for s in PARSED[flag] or ()}) > 1


@pytest.mark.parametrize("flag", COMPARED)
def test_a_flag_changes_the_fingerprint_exactly_when_it_changes_the_compile_key(flag: str) -> None:
    sim_changes, fp_changes = SIM_CHANGES[flag], _fp_changes(flag)
    assert fp_changes == sim_changes, (
        f"{flag}: the simulator's key {'changes' if sim_changes else 'stays'}, "
        f"the fingerprint {'changes' if fp_changes else 'stays'}"
    )


def test_the_property_covers_the_table() -> None:
    """Every flag the fingerprint reads is compared, and nearly every flag of the table."""
    counted = {
        "--" + n
        for e in compile_table.COMPILE_INPUTS
        if e.source in ("flag", "json")
        for n in e.names
    }
    counted = {f for f in counted if f in PARSED}
    assert counted <= set(COMPARED), sorted(counted - set(COMPARED))
    assert len(COMPARED) >= 0.95 * len(PARSED), sorted(set(PARSED) - set(COMPARED))
    changing = [f for f in COMPARED if SIM_CHANGES[f] and _fp_changes(f)]
    assert len(changing) > 40 and len(COMPARED) - len(changing) > 200


def test_an_rbln_option_in_additional_config_counts_as_its_flag() -> None:
    """vllm-rbln's --rbln-* flags write into additional_config (RBLNConfig): the key and the
    flag are one input; a key that is no compile input (the sampler) counts for neither."""
    w8a8 = _fp(BASE + ["--rbln-use-w8a8"])
    assert _fp(BASE + ["--additional-config", '{"use_w8a8": true}']) == w8a8 != _fp(BASE)
    assert _fp(BASE + ["--additional-config.use_w8a8", "true"]) == w8a8
    assert _fp(BASE + ["--additional-config", '{"use_custom_sampler": false}']) == _fp(BASE)
    # the flag wins over the key, as in the simulator
    both = BASE + ["--rbln-use-w8a8", "--additional-config", '{"use_w8a8": false}']
    assert _fp(both) == w8a8
    for argv in (BASE + ["--additional-config", '{"use_w8a8": true}'], both):
        assert _key(argv) == _key(BASE + ["--rbln-use-w8a8"])


def test_the_positional_model_wins_over_the_model_flag() -> None:
    """vllm serve sets model from its positional model_tag when given."""
    assert _fp(BASE + ["--model", "other/y"]) == _fp(BASE)
    assert _fp(["vllm", "serve", "--model", "other/y"]) != _fp(BASE)
