"""Who holds the gate's port, ``remote/health.py`` in-process (issue #37's mutation campaign): the
addresses of /proc/net/tcp{,6} (``_proc_address``, ``_unmapped``), a host's addresses
(``_addresses``), the listening sockets a connection to the host reaches (``listening_inodes``
over tables the test writes), the processes holding a socket (``socket_holders``, on this
process's own listener), a process's cgroup as /proc says it (``pid_cgroup`` of files the test
writes: legacy, hybrid and unified set-ups), whether a process is the unit's (``belongs``) and
``owner_problem``'s verdicts and words."""

from __future__ import annotations

import ipaddress
import os
import socket
import sys
from pathlib import Path

import pytest
from repo_paths import REMOTE

sys.path.insert(0, str(REMOTE))
import health  # noqa: E402  (a host program: imported as the host imports it)

UNIT = "servefleet-vllm-0.service"
IP = ipaddress.ip_address


def hex4(addr: str) -> str:
    """An IPv4 address as /proc/net/tcp prints it (host byte order)."""
    return int.from_bytes(IP(addr).packed, sys.byteorder).to_bytes(4, "big").hex().upper()


def hex6(addr: str) -> str:
    """An IPv6 address as /proc/net/tcp6 prints it (four 32-bit words, each in host order)."""
    raw = IP(addr).packed
    return "".join(hex4(str(ipaddress.IPv4Address(raw[i : i + 4]))) for i in range(0, 16, 4))


def test_proc_addresses_read_back() -> None:
    assert health._proc_address(hex4("127.0.0.1")) == IP("127.0.0.1")
    assert health._proc_address(hex4("10.1.2.3")) == IP("10.1.2.3")
    assert health._proc_address(hex6("::1")) == IP("::1")
    assert health._proc_address(hex6("fe80::1:2")) == IP("fe80::1:2")
    assert health._proc_address(hex6("::ffff:10.0.0.7")) == IP("10.0.0.7")  # v4-mapped
    assert health._unmapped(IP("::ffff:1.2.3.4")) == IP("1.2.3.4")
    assert health._unmapped(IP("::1")) == IP("::1")


def test_a_hosts_addresses(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str, object, int]] = []

    def getaddrinfo(host: str, port: object, proto: int = 0) -> list[tuple[object, ...]]:
        seen.append((host, port, proto))
        if host == "nowhere":
            raise socket.gaierror(-2, "Name or service not known")
        return [(socket.AF_INET6, 1, 6, "", ("fe80::1%eth0", 0, 0, 2)),
                (socket.AF_INET, 1, 6, "", ("10.0.0.2", 0)),
                (socket.AF_INET6, 1, 6, "", ("::ffff:10.0.0.3", 0, 0, 0))]  # fmt: skip

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    assert health._addresses("10.0.0.1") == {IP("10.0.0.1")}  # a literal: no resolver asked
    assert health._addresses("::ffff:10.0.0.1") == {IP("10.0.0.1")}
    assert health._addresses("fe80::1%eth0") == {IP("fe80::1")}  # as /proc lists it: no scope
    assert seen == []
    assert health._addresses("gpu1") == {IP("fe80::1"), IP("10.0.0.2"), IP("10.0.0.3")}
    assert health._addresses("nowhere") == set()
    assert seen == [("gpu1", None, socket.IPPROTO_TCP), ("nowhere", None, socket.IPPROTO_TCP)]


def row(local: str, state: str, inode: int) -> str:
    return f"   0: {local} 00000000:0000 {state} 00000000:00000000 00:00000000 00000000     0        0 {inode} 1"


def test_listening_inodes_reachable_at_the_host(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    port = 8000
    p = f"{port:04X}"
    tcp, tcp6 = tmp_path / "tcp", tmp_path / "tcp6"
    head = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode"
    tcp.write_text("\n".join([
        head,
        row(f"{hex4('0.0.0.0')}:{p}", "0A", 11),  # any address
        row(f"{hex4('127.0.0.1')}:{p}", "0A", 12),  # the host itself
        row(f"{hex4('10.9.9.9')}:{p}", "0A", 13),  # another address
        row(f"{hex4('127.0.0.1')}:{p}", "01", 14),  # a connection, not a listener
        row(f"{hex4('127.0.0.1')}:{port + 1:04X}", "0A", 15),  # another port
        row(f"{hex4('0.0.0.0')}:{p}", "0A", 16),  # after those
        f"   8: {hex4('0.0.0.0')}:{p} 00000000:0000 0A 00000000:00000000 00:00000000 00000000 0 0 17",
        f"   9: {hex4('127.0.0.1')}:{p} 00000000:0000 0A 00000000:00000000",  # cut short
    ]) + "\n")  # fmt: skip
    tcp6.write_text("\n".join([
        head,
        row(f"{hex6('::')}:{p}", "0A", 21),
        row(f"{hex6('::ffff:127.0.0.1')}:{p}", "0A", 22),
        row(f"{hex6('::1')}:{p}", "0A", 23),
    ]) + "\n")  # fmt: skip
    monkeypatch.setattr(health, "TCP_TABLES", (str(tcp), str(tmp_path / "none"), str(tcp6)))
    assert health.listening_inodes(port, "127.0.0.1") == {11, 12, 16, 17, 21, 22}
    assert health.listening_inodes(port, "::1") == {11, 16, 17, 21, 23}
    assert health.listening_inodes(port, "10.9.9.9") == {11, 13, 16, 17, 21}
    assert health.listening_inodes(port + 2, "127.0.0.1") == set()
    assert health.TCP_LISTEN == "0A"


def test_socket_holders_finds_this_process_once() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        inode = os.fstat(listener.fileno()).st_ino
        second = os.dup(listener.fileno())  # the same socket on two descriptors
        try:
            assert health.socket_holders({inode, 1}) == {inode: [os.getpid()], 1: []}
        finally:
            os.close(second)
    assert health.socket_holders(set()) == {}


def test_socket_holders_in_pid_order_past_what_cannot_be_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """/proc as the test lists it: pids in numeric order (9 before 10 before 100), a process
    whose descriptors cannot be listed and a descriptor gone before its readlink passed over."""
    fds = {"/proc/9/fd": ["1", "2"], "/proc/10/fd": ["5"], "/proc/100/fd": ["3"]}
    links = {"/proc/9/fd/2": "socket:[77]", "/proc/10/fd/5": "socket:[77]",
             "/proc/100/fd/3": "socket:[77]"}  # fmt: skip

    def listdir(path: str) -> list[str]:
        if path == "/proc":
            return ["100", "9", "self", "8", "10", "net"]
        if path not in fds:
            raise PermissionError(13, "Permission denied", path)
        return fds[path]

    def readlink(path: str) -> str:
        if path not in links:
            raise FileNotFoundError(2, "No such file or directory", path)
        return links[path]

    monkeypatch.setattr(os, "listdir", listdir)
    monkeypatch.setattr(os, "readlink", readlink)
    assert health.socket_holders({77, 78}) == {77: [9, 10, 100], 78: []}


def through_proc(tmp_path: Path, text: str | None) -> str:
    """A ``pid`` that makes ``/proc/{pid}/cgroup`` a file under tmp_path holding ``text``."""
    here = tmp_path / "p"
    here.mkdir(parents=True, exist_ok=True)
    if text is not None:
        (here / "cgroup").write_text(text)
        (here / "comm").write_text("vllm-serve\n")
    return f"../{here}"


@pytest.mark.parametrize(
    ("text", "cgroup"),
    [
        ("12:cpu,cpuacct:/x\n1:name=systemd:/system.slice/a.service\n0::/u\n", "/system.slice/a.service"),
        ("0::/user.slice/u\n1:name=systemd:/system.slice/b.service\n", "/system.slice/b.service"),
        ("0::/system.slice/c.service\n", "/system.slice/c.service"),
        ("0::/kubepods.slice/p.slice/cri-containerd:abc\n", "/kubepods.slice/p.slice/cri-containerd:abc"),
        ("0:cpu:/not-unified\n3:memory:/m\n", None),
        ("", None),
        (None, None),
    ],
    ids=["legacy", "hybrid", "unified", "colons", "none", "empty", "gone"],
)  # fmt: skip
def test_pid_cgroup_of_each_set_up(tmp_path: Path, text: str | None, cgroup: str | None) -> None:
    assert health.pid_cgroup(through_proc(tmp_path, text)) == cgroup


def test_comm_of_a_process_and_of_none(tmp_path: Path) -> None:
    assert health._comm(through_proc(tmp_path, "")) == "vllm-serve"  # type: ignore[arg-type]
    assert health._comm(through_proc(tmp_path / "x", None)) == "gone"  # type: ignore[arg-type]
    assert health._comm(os.getpid()) == Path("/proc/self/comm").read_text().strip()


def unit_st(main_pid: int = 0, cgroup: str = "") -> health.UnitState:
    return health.UnitState("loaded", "active", "running", "", 0, 0, 0, main_pid, cgroup)


def test_belongs_by_main_pid_or_cgroup(monkeypatch: pytest.MonkeyPatch) -> None:
    cgroups = {5: "/system.slice/a.service", 6: "/system.slice/a.service/sub", 7: "/system.slice/a.services",
               8: "/system.slice", 0: "/system.slice/a.service"}  # fmt: skip
    monkeypatch.setattr(health, "pid_cgroup", cgroups.get)
    assert health.belongs(unit_st(main_pid=9), 9)
    assert not health.belongs(unit_st(main_pid=0), 0)  # no main process: pid 0 is none
    assert not health.belongs(unit_st(main_pid=9), 4)  # no cgroup known for either
    a = "/system.slice/a.service"
    assert [health.belongs(unit_st(cgroup=a), pid) for pid in (5, 6, 7, 8, 4)] == [
        True, True, False, False, False
    ]  # fmt: skip
    assert health.belongs(unit_st(cgroup=a + "/"), 6)
    monkeypatch.setattr(health, "pid_cgroup", {3: "/s/svc/sub"}.get)
    assert not health.belongs(unit_st(cgroup="/s/svcX"), 3)  # only "/" is stripped
    assert not health.belongs(unit_st(cgroup=""), 5)


def test_owner_problem_verdicts(monkeypatch: pytest.MonkeyPatch) -> None:
    inodes: dict[int, list[int]] = {}
    asked: list[tuple[int, str]] = []

    def listening(port: int, host: str) -> set[int]:
        asked.append((port, host))
        return set(inodes)

    monkeypatch.setattr(health, "listening_inodes", listening)
    monkeypatch.setattr(health, "socket_holders", lambda found: {i: inodes[i] for i in found})
    monkeypatch.setattr(health, "_comm", lambda pid: f"comm{pid}")
    st = unit_st(main_pid=10)
    assert health.owner_problem(UNIT, 8000, "::1", st, False) is None
    assert asked == [(8000, "::1")]
    assert health.owner_problem(UNIT, 8000, "h", st, True) == (
        "port 8000 answered, but no socket listens on it in /proc/net/tcp or /proc/net/tcp6"
    )
    inodes.update({31: [10], 30: []})
    assert health.owner_problem(UNIT, 8000, "h", st, False) is None  # unseen: not yet proved
    assert health.owner_problem(UNIT, 8000, "h", st, True) == (
        f"port 8000 is held by a process not visible here (socket inode 30), not by {UNIT}"
    )
    inodes.update({30: [10, 12], 29: [10, 13]})
    assert health.owner_problem(UNIT, 8000, "h", st, False) == (
        f"port 8000 is held by pid 13 (comm13), not by {UNIT}"  # the first inode first
    )
    inodes.clear()
    inodes.update({31: [10], 32: [10]})
    assert health.owner_problem(UNIT, 8000, "h", st, True) is None
