"""The compile-input table's RBLN options (``compile_table.py``'s ``_rbln``), built at test time:
the table is built at import, before a mutation campaign (#37) makes a mutant of ``_rbln``
active, so its entries are held here by calling ``_rbln`` again: an option's key, its
``--rbln-*`` flag, parser, default, env fallbacks in order and reason, and every ``rbln.*`` entry
of :data:`COMPILE_INPUTS` as ``_rbln`` builds it.
"""

from __future__ import annotations

from servefleet.kinds.rbln.compile_table import COMPILE_INPUTS, RBLN_KEYS, CompileInput, _rbln
from servefleet.kinds.rbln.compile_values import parse_bool, parse_int

REASON = "RBLN compile option: RBLNConfig fields key the cache via the config hash (§3.3, §3.5)"


def test_an_rbln_option_is_a_flag_with_its_env_fallbacks() -> None:
    entry = _rbln("num_devices_per_local_rank", parse_int, 1, "FIRST_ENV", "SECOND_ENV")
    assert entry == CompileInput(
        key="rbln.num_devices_per_local_rank",
        source="flag",
        names=("rbln-num-devices-per-local-rank",),
        parse=parse_int,
        default=1,
        reason=REASON,
        env=("FIRST_ENV", "SECOND_ENV"),
    )
    bare = _rbln("use_w8a8", parse_bool, False)
    assert bare.env == () and bare.names == ("rbln-use-w8a8",) and bare.default is False


def test_every_rbln_entry_of_the_table_is_as_rbln_builds_it() -> None:
    rbln = [e for e in COMPILE_INPUTS if e.key.startswith("rbln.")]
    assert {e.key for e in rbln} == RBLN_KEYS and len(rbln) == 17
    for e in rbln:
        assert _rbln(e.key[len("rbln.") :], e.parse, e.default, *e.env) == e
