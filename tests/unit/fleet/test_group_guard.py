"""A serving group's rendezvous answers only the group's hosts (#46 item 7): torch's TCPStore
(``--master-port``, 29501), vLLM's DP handshake (``--data-parallel-rpc-port``, 29550) and the DP
group's store (29500) listen on every interface with no check of who connects. Each rank's unit
loads an nftables table as root before it starts (and removes it after it stops) that resets a
connection to those ports from any address but the group's hosts' and loopback.

The last test loads the rank's own rule into a network namespace of its own with the real
``nft`` and connects to a listener there from a peer's address and from another."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import uuid
from collections.abc import Iterator

import pytest
from group_inputs import fleet, rank_plan

from servefleet.base.errors import DataError
from servefleet.base.remote.layout import GROUP_GUARD_TABLE, NFT
from servefleet.hostplan.ranks import guard_commands
from servefleet.hostplan.types import GroupPlace
from servefleet.kinds.roles import rendezvous_ports


def _guard_lines(text: str) -> tuple[str, str]:
    pre = [line for line in text.splitlines() if line.startswith("ExecStartPre=")]
    post = [line for line in text.splitlines() if line.startswith("ExecStopPost=")]
    assert len(pre) == 1 and len(post) == 1, text
    return pre[0], post[0]


def test_each_ranks_unit_loads_a_guard_of_the_groups_addresses_and_its_ports() -> None:
    f = fleet(("h1", {}), ("h2", {}))
    for name in ("h1", "h2"):
        plan = rank_plan(f, name)
        pre, post = _guard_lines(plan.instances[0].text)
        assert pre.startswith(f'ExecStartPre=+"{NFT}" ') and GROUP_GUARD_TABLE in pre
        assert "tcp dport { 29500, 29501, 29550 } ip saddr { 10.0.0.1, 10.0.0.2 } accept" in pre
        assert "tcp dport 32768-60999 ip saddr { 10.0.0.1, 10.0.0.2 } accept" in pre
        assert "tcp dport 32768-60999 ct state new reject with tcp reset" in pre
        assert pre.rstrip('"').endswith("reject with tcp reset; }; }")
        assert post == f'ExecStopPost=-+"{NFT}" "add table inet {GROUP_GUARD_TABLE}; ' + (
            f'delete table inet {GROUP_GUARD_TABLE}"'
        )


def test_a_host_alone_loads_no_guard() -> None:
    from host_inputs import GPU_DATA, gpu_probe

    from servefleet.hostplan.plan import plan_host
    from servefleet.settings.table import load_defaults, settings_from

    d = load_defaults()
    d.update(GPU_DATA)
    plan = plan_host(settings_from(d.get, {}), gpu_probe())
    assert plan.instances and not any("ExecStartPre" in i.text for i in plan.instances)


def test_the_ports_follow_the_flags_that_move_them() -> None:
    assert rendezvous_ports(["vllm", "serve", "m"]) == (29500, 29501, 29550)
    moved = ["vllm", "serve", "m", "--master-port", "31000", "--data-parallel-rpc-port=32000"]
    assert rendezvous_ports(moved) == (29500, 31000, 32000)
    assert rendezvous_ports(["vllm", "serve", "m", "--master-port", "$PORT"]) == (29500, 29550)


def test_an_ipv6_member_and_a_name_go_to_their_own_sets_and_a_bad_one_is_refused() -> None:
    g = GroupPlace("g1", 0, 3, "fd00::1", "s", ("a", "b", "c"), ("fd00::1", "10.0.0.2", "b.lab"))
    load, _ = guard_commands(g, (29501,))
    assert "ip6 saddr { fd00::1 } accept" in load[1]
    assert "ip saddr { 10.0.0.2, b.lab } accept" in load[1]
    bad = GroupPlace("g1", 0, 2, "10.0.0.1", "s", ("a", "b"), ("10.0.0.1", "x; flush ruleset"))
    with pytest.raises(DataError, match=r"^serve_group 'g1': 'x; flush ruleset' is not an"):
        guard_commands(bad, (29501,))


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@pytest.fixture
def rank_netns() -> Iterator[str]:
    """A network namespace (the rank's host, 10.254.46.1) wired to this one by a veth pair,
    whose end here has a peer's address (10.254.46.2) and a stranger's (10.254.46.3)."""
    if os.geteuid() != 0 or not shutil.which("ip") or not os.path.exists(NFT):
        pytest.skip("needs root, ip and nft")
    tag = uuid.uuid4().hex[:6]
    ns, here, there = f"sfguard{tag}", f"sfg{tag}a", f"sfg{tag}b"
    _ip("netns", "add", ns)
    try:
        _ip("link", "add", here, "type", "veth", "peer", "name", there)
        _ip("link", "set", there, "netns", ns)
        _ip("addr", "add", "10.254.46.2/24", "dev", here)
        _ip("addr", "add", "10.254.46.3/24", "dev", here)
        _ip("link", "set", here, "up")
        _ip("-n", ns, "addr", "add", "10.254.46.1/24", "dev", there)
        _ip("-n", ns, "link", "set", there, "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        yield ns
    finally:
        subprocess.run(["ip", "link", "del", here], capture_output=True)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def _connects(source: str, port: int = 29501) -> bool:
    with socket.socket() as s:
        s.settimeout(5)
        s.bind((source, 0))
        try:
            s.connect(("10.254.46.1", port))
        except ConnectionRefusedError:
            return False
        return True


LISTEN = (  # the rendezvous (29501) and a collective's listener on an ephemeral port (40123)
    "import socket,sys\nfor p in (29501,40123):\n s=socket.socket();"
    "s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1);s.bind(('0.0.0.0',p));s.listen(8);"
    "globals()[f's{p}']=s\nprint('up',flush=True);sys.stdin.read()"
)


def test_the_guard_resets_a_stranger_and_lets_the_groups_hosts_in(rank_netns: str) -> None:
    g = GroupPlace("g1", 0, 2, "10.254.46.1", "s", ("h1", "h2"), ("10.254.46.1", "10.254.46.2"))
    load, drop = guard_commands(g, rendezvous_ports(["vllm", "serve", "m"]))
    listener = subprocess.Popen(["ip", "netns", "exec", rank_netns, "python3", "-c", LISTEN],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert listener.stdout is not None and listener.stdout.readline() == "up\n"
        assert _connects("10.254.46.3")  # without the guard a stranger gets in (the finding)
        assert _connects("10.254.46.3", 40123)  # NCCL's, Gloo's listeners too
        subprocess.run(["ip", "netns", "exec", rank_netns, *load], check=True)
        assert _connects("10.254.46.2") and _connects("10.254.46.2", 40123)  # the group's host
        assert not _connects("10.254.46.3")  # anyone else: reset
        assert not _connects("10.254.46.3", 40123)
        # the rank's own connections out still get their replies (ct state established)
        away = socket.create_server(("10.254.46.3", 40999))
        self_out = subprocess.run(["ip", "netns", "exec", rank_netns, "python3", "-c",
                              "import socket;socket.create_connection(('10.254.46.3', 40999),"
                              "timeout=5).close()"], capture_output=True, text=True)  # fmt: skip
        away.close()
        assert self_out.returncode == 0, self_out.stderr
        subprocess.run(["ip", "netns", "exec", rank_netns, *drop], check=True)
        assert _connects("10.254.46.3")  # the rank stopped: the table is gone
        listed = subprocess.run(["ip", "netns", "exec", rank_netns, NFT, "list", "tables"],
                                capture_output=True, text=True, check=True)  # fmt: skip
        assert GROUP_GUARD_TABLE not in listed.stdout
    finally:
        listener.kill()
        listener.wait()
