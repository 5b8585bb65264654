"""nftables commands for the guards servefleet's units load as root (pure): one transaction that
(re)makes a table of servefleet's own with one filter chain, and one that removes it. The
router's worker API (``router/plan.py``) and a serving group's rendezvous (``hostplan/ranks.py``)
each have one."""

from __future__ import annotations

from collections.abc import Sequence

from servefleet.base.remote.layout import NFT


def load_table(name: str, hook: str, rules: Sequence[str]) -> list[str]:
    """The ``nft`` command that makes table ``inet NAME`` anew (added, deleted and made again in
    one transaction, so a table left by an earlier start is replaced whole) with one filter
    chain on ``hook`` whose policy accepts and whose ``rules`` come in order.

    + name: the table (``layout.ROUTER_GUARD_TABLE``, ``layout.GROUP_GUARD_TABLE``)
    + hook: ``input`` or ``output``
    + rules: nft rule texts
    """
    t = f"inet {name}"
    chain = (
        f"chain {hook} {{ type filter hook {hook} priority 0; policy accept; {'; '.join(rules)}; }}"
    )
    return [NFT, f"add table {t}; delete table {t}; table {t} {{ {chain}; }}"]


def drop_table(name: str) -> list[str]:
    """The ``nft`` command that removes table ``inet NAME`` (and does nothing when it is gone)."""
    t = f"inet {name}"
    return [NFT, f"add table {t}; delete table {t}"]
