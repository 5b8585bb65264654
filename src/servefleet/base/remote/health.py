#!/usr/bin/env python3
"""servefleet health gate. Runs ON THE HOST (stdlib only, python3 >= 3.10).

usage: health.py UNIT PORT MODEL TIMEOUT [--host ADDR] [--warm-marker FILE]
       health.py status CHECKS_JSON   # {"model", "host", "instances": [[UNIT, PORT], ...]}

Passes when the instance answers GET /health with 200 and a one-token chat completion within
TIMEOUT seconds (sent with ``Authorization: Bearer KEY`` when the unit gives its server an API
key: the ``VLLM_API_KEY`` of the files its ``EnvironmentFile=`` names, read here as root; the key
is never an argument), and the socket listening on PORT belongs to UNIT (its main process or a
process in its cgroup): an old instance, or anything else, answering on the port never passes.
Fails at once when systemd reports the unit failed, exited (a server must keep running), in an
auto-restart loop, or restarted on failure since this check began, or when another process
holds the port. On failure it prints the reason and the tail of the unit's journal (stderr) and
exits 1. On success it writes the warm marker, if given (the compile cache holds this config now).

``status`` (``servefleet status``; changes nothing) runs the same gate once for each instance,
all at once, each bounded by STATUS_TIMEOUT seconds, and prints ``{port: "ok" or why not}``.
The controller sends it inline.

Importable (``import health``): ``check`` is the gate without output, ``journal_tail`` the
unit's recent log.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if "layout" not in sys.modules:  # a file next to layout.py (sent inline, it comes carried)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import layout  # noqa: E402
import release_check  # noqa: E402  (carried too: the key files are read as systemd reads them)

PROPERTIES = (
    "LoadState",
    "ActiveState",
    "SubState",
    "Result",
    "NRestarts",
    "ExecMainCode",
    "ExecMainStatus",
    "MainPID",
    "ControlGroup",
    "EnvironmentFiles",
)
# the unit whose processes hold another unit's port: the router's is its proxy's (nginx in front
# of vllm-router, which listens on loopback)
PORT_HOLDERS = {layout.ROUTER_UNIT: layout.PROXY_UNIT}
CLD_EXITED = 1  # ExecMainCode of a main process that exited (rather than was killed)
TCP_LISTEN = "0A"
TCP_TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True)
class UnitState:
    """What ``systemctl show`` says about the unit."""

    load: str
    active: str
    sub: str
    result: str
    restarts: int
    main_code: int
    main_status: int
    main_pid: int
    cgroup: str
    env_files: tuple[str, ...] = ()  # the files of the unit's EnvironmentFile=, in order


def _int(text: str | None) -> int:
    try:
        return int(text or 0)
    except ValueError:
        return 0


def unit_state(unit: str) -> UnitState:
    cmd = ["systemctl", "show", *(a for p in PROPERTIES for a in ("-p", p)), unit]
    out = subprocess.run(cmd, capture_output=True, text=True).stdout
    props = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    # one line per file: "EnvironmentFiles=/etc/servefleet/secrets/x.env (ignore_errors=no)"
    files = [
        line.split("=", 1)[1].rsplit(" (ignore_errors=", 1)[0]
        for line in out.splitlines()
        if line.startswith("EnvironmentFiles=") and line != "EnvironmentFiles="
    ]
    return UnitState(
        load=props.get("LoadState", ""),
        active=props.get("ActiveState", "unknown"),
        sub=props.get("SubState", ""),
        result=props.get("Result", ""),
        restarts=_int(props.get("NRestarts")),
        main_code=_int(props.get("ExecMainCode")),
        main_status=_int(props.get("ExecMainStatus")),
        main_pid=_int(props.get("MainPID")),
        cgroup=props.get("ControlGroup", ""),
        env_files=tuple(files),
    )


def api_key(st: UnitState) -> str | None:
    """The API key the unit gives its server: the ``VLLM_API_KEY`` of its environment files as
    systemd reads them (:func:`release_check.env_file_value`: the last assignment wins; a file
    that cannot be read is passed over: systemd fails such a start itself, and the gate says
    why it does not answer), or None (none, or empty: vLLM then asks for no key)."""
    return release_check.env_file_value(st.env_files, layout.API_KEY_VAR) or None


def state_problem(unit: str, st: UnitState, baseline: int) -> str | None:
    """Why the unit's systemd state fails the gate at once, or None while it may still pass."""
    restarts = f"after {st.restarts - baseline} automatic restart(s)"
    if st.load and st.load != "loaded":
        return f"{unit} is not loaded ({st.load})"
    if st.active == "failed":
        return f"{unit} is failed ({st.result}, status {st.main_status}) {restarts}"
    exited_cleanly = st.result == "success" and st.main_code == CLD_EXITED and st.main_status == 0
    if st.active in ("inactive", "deactivating") or exited_cleanly:
        if st.result in ("success", ""):
            return f"{unit} exited cleanly (status {st.main_status}); a server must keep running"
        return f"{unit} is {st.active} ({st.result}, status {st.main_status}) {restarts}"
    if (st.active, st.sub) == ("activating", "auto-restart"):
        return (
            f"{unit} is in an auto-restart loop ({st.result}, status {st.main_status}) {restarts}"
        )
    if st.restarts > baseline:
        return f"{unit} is {st.active} ({st.sub}) {restarts}"
    return None


# --- who holds the port -------------------------------------------------------------------


def _proc_address(hexaddr: str) -> Address:
    """An address as /proc/net/tcp{,6} prints it: 32-bit words in host byte order."""
    raw = b"".join(
        int(hexaddr[i : i + 8], 16).to_bytes(4, sys.byteorder) for i in range(0, len(hexaddr), 8)
    )
    return _unmapped(ipaddress.ip_address(raw))


def _unmapped(addr: Address) -> Address:
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped:
        return addr.ipv4_mapped
    return addr


def _addresses(host: str) -> set[Address]:
    try:  # a link-local literal's scope (fe80::1%eth0): /proc's addresses carry none
        return {_unmapped(ipaddress.ip_address(host.split("%")[0]))}
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except OSError:
        return set()
    return {_unmapped(ipaddress.ip_address(str(info[4][0]).split("%")[0])) for info in infos}


def listening_inodes(port: int, host: str) -> set[int]:
    """Inodes of the sockets listening on ``port`` that a connection to ``host`` can reach:
    bound to the any-address (0.0.0.0, ::) or to ``host`` itself."""
    wanted = _addresses(host)
    inodes = set()
    for table in TCP_TABLES:
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) < 10 or fields[3] != TCP_LISTEN:
                continue
            addr, _, hexport = fields[1].partition(":")
            if int(hexport, 16) != port:
                continue
            local = _proc_address(addr)
            if local.is_unspecified or local in wanted:
                inodes.add(int(fields[9]))
    return inodes


def socket_holders(inodes: set[int]) -> dict[int, list[int]]:
    """inode -> pids holding it (every pid this process may look into)."""
    links = {f"socket:[{inode}]": inode for inode in inodes}
    held: dict[int, list[int]] = {inode: [] for inode in inodes}
    for entry in sorted(os.listdir("/proc"), key=lambda n: (len(n), n)):
        if not entry.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{entry}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                inode = links.get(os.readlink(f"/proc/{entry}/fd/{fd}"))
            except OSError:
                continue
            if inode is not None and int(entry) not in held[inode]:
                held[inode].append(int(entry))
    return held


def pid_cgroup(pid: int | str) -> str | None:
    """The cgroup systemd tracks ``pid`` in: the ``name=systemd`` hierarchy on legacy and
    hybrid set-ups, else the unified one (``0::``). None when the process is gone."""
    try:
        text = Path(f"/proc/{pid}/cgroup").read_text()
    except OSError:
        return None
    unified = None
    for line in text.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if controllers == "name=systemd":
            return path
        if hierarchy == "0" and not controllers:
            unified = path
    return unified


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "gone"


def belongs(st: UnitState, pid: int) -> bool:
    """Whether ``pid`` is the unit's main process or in the unit's cgroup."""
    if st.main_pid > 0 and pid == st.main_pid:
        return True
    cgroup = pid_cgroup(pid)
    if not st.cgroup or cgroup is None:
        return False
    return cgroup == st.cgroup or cgroup.startswith(st.cgroup.rstrip("/") + "/")


def owner_problem(unit: str, port: int, host: str, st: UnitState, answered: bool) -> str | None:
    """Why the port's listener is not the unit's, or None.

    Before an answer (``answered`` false) only a listener proved foreign is a problem; after
    one, the listener must be found and every process holding it must be the unit's."""
    inodes = listening_inodes(port, host)
    if not inodes:
        if answered:
            return f"port {port} answered, but no socket listens on it in {' or '.join(TCP_TABLES)}"
        return None
    for inode, pids in sorted(socket_holders(inodes).items()):
        for pid in pids:
            if not belongs(st, pid):
                return f"port {port} is held by pid {pid} ({_comm(pid)}), not by {unit}"
        if not pids and answered:
            return f"port {port} is held by a process not visible here (socket inode {inode}), not by {unit}"
    return None


# --- the gate -------------------------------------------------------------------------------


# The gate talks to this host's own servers: never through a proxy (a host whose environment
# sets http_proxy would otherwise ask the proxy for 127.0.0.1, and every gate would fail)
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
MAX_REPLY = 1 << 20  # bytes of a chat reply the gate reads (a one-token reply is far smaller)
UNAUTHORIZED = "answered 401 Unauthorized"  # the server wants another key: waiting cannot help
PING = [{"role": "user", "content": "ping"}]  # the gate's one-token chat


# What vllm-router sends a prefill (src/routers/http/vllm_pd_router.rs, as vLLM's toy proxy):
# the prefill's answer carries the kv_transfer_params its decode then reads the KV blocks with
TO_PREFILL = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}


class BadReply(ValueError):
    """A chat completion answered 200 with no completion in it."""


def _chat(base: str, body: dict[str, Any], key: str | None, limit: float) -> dict[str, Any]:
    """POST a chat completion to ``base``; its reply (HTTPError, OSError, BadReply or another
    ValueError else)."""
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    data = json.dumps(body).encode()
    req = urllib.request.Request(base + "/v1/chat/completions", data=data, headers=headers)
    with _OPENER.open(req, timeout=min(30.0, limit)) as r:
        raw = r.read(MAX_REPLY + 1)
    if len(raw) > MAX_REPLY:
        raise BadReply(f"chat completion reply is larger than {MAX_REPLY} bytes")
    reply = json.loads(raw)
    if not isinstance(reply, dict) or not reply.get("choices"):
        raise BadReply("chat completion had no choices")
    return reply


def _why(e: Exception, key: str | None) -> str:
    if isinstance(e, urllib.error.HTTPError):
        if e.code == 401:
            sent = "with the unit's API key" if key else "without an API key (the unit has none)"
            return f"{e.url} {UNAUTHORIZED} {sent}"
        return f"{e.url} answered {e.code}"
    return str(e) if isinstance(e, BadReply) else f"not answering: {e}"


def probe(
    base: str, model: str, limit: float, key: str | None = None, path: str = "/health"
) -> str | None:
    """None when healthy, else why not (each request waits at most ``limit`` seconds; the chat
    carries ``Authorization: Bearer key`` when there is a key: /health is open in vLLM).

    + path: what answers 200 when it serves (a router's ``/readiness``: one healthy worker)"""
    try:
        with _OPENER.open(base + path, timeout=min(5.0, limit)) as r:
            if r.status != 200:
                return f"{path} answered {r.status}"
        _chat(base, {"model": model, "max_tokens": 1, "messages": PING}, key, limit)
        return None
    except (OSError, ValueError) as e:  # HTTPError is an OSError
        return _why(e, key)


def pd_probe(
    prefill: str, decode: str, model: str, limit: float, key: str | None = None
) -> str | None:
    """None when one request goes through ``prefill`` and then ``decode`` as vllm-router sends
    it (the decode reads the prefill's KV blocks over NIXL), else why not.

    + prefill, decode: the servers' base URLs"""
    body = {"model": model, "messages": PING}
    try:
        params = _chat(prefill, dict(body, max_tokens=1, kv_transfer_params=TO_PREFILL), key, limit)
    except (OSError, ValueError) as e:
        return f"prefill {prefill}: {_why(e, key)}"
    kv = params.get("kv_transfer_params")
    if not isinstance(kv, dict):
        return f"prefill {prefill}: its answer carries no kv_transfer_params"
    try:
        _chat(decode, dict(body, max_tokens=1, kv_transfer_params=kv), key, limit)
    except (OSError, ValueError) as e:
        return f"decode {decode} after prefill {prefill}: {_why(e, key)}"
    return None


# A start within QUICK_START seconds is seen within QUICK_POLL (a warm restart: each instance of a
# rollout waits for it); after that the pause doubles up to SLOW_POLL (a compile of hours).
QUICK_START, QUICK_POLL, SLOW_POLL = 5.0, 0.1, 1.0


def check(
    unit: str,
    port: int,
    model: str,
    timeout: float,
    host: str = "127.0.0.1",
    answered_timeout: float | None = None,
    key_unit: str | None = None,
    path: str = "/health",
    keyless: bool = False,
) -> str | None:
    """Wait up to ``timeout`` seconds for ``unit`` to serve ``model`` on ``host``:``port``.

    + unit: the systemd unit just (re)started
    + host: the address the gate connects to; an any-address (0.0.0.0, ::, "") means 127.0.0.1
    + answered_timeout: once the server answers HTTP at all (its compile is over), at most this
      many seconds more (a pre-warm gets ``timeout`` to compile, not to stay unhealthy)
    + key_unit: the unit whose API key the chat carries (the router's gate: a server's, which
      the router passes on); default: ``unit``'s own
    + path: the readiness path (:func:`probe`)
    + keyless: the servers behind need an API key this host does not hold (a fleet router's
      host): their 401 through the router counts as an answer
    Returns None when healthy, else the reason in one line (no journal)."""
    host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    base = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
    began = time.monotonic()
    deadline = began + timeout
    answered = False
    st = unit_state(unit)
    baseline = st.restarts  # NRestarts survives a manual restart: count from here
    pause = QUICK_POLL
    holder = PORT_HOLDERS.get(unit, unit)

    def owner(answered: bool) -> str | None:
        return owner_problem(holder, port, host, st if holder == unit else unit_state(holder),
                             answered)  # fmt: skip

    while True:
        fatal = state_problem(unit, st, baseline) or owner(False)
        if fatal:
            return fatal
        key = api_key(unit_state(key_unit) if key_unit else st)
        why = probe(base, model, max(1.0, deadline - time.monotonic()), key, path)
        if keyless and why is not None and UNAUTHORIZED in why:
            why = None  # the servers answered, behind the router: the key is theirs
        if why is None or UNAUTHORIZED in why:
            st = unit_state(unit)
            return state_problem(unit, st, baseline) or owner(True) or why
        if answered_timeout is not None and not answered and not why.startswith("not answering"):
            answered = True
            if time.monotonic() + answered_timeout < deadline:
                deadline, timeout = time.monotonic() + answered_timeout, answered_timeout
        left = deadline - time.monotonic()
        if left <= 0:
            return f"not healthy within {timeout:g}s: {why}"
        time.sleep(min(pause, left))
        if time.monotonic() - began >= QUICK_START:
            pause = min(SLOW_POLL, pause * 2)
        st = unit_state(unit)


def journal_tail(unit: str, lines: int = 25) -> str:
    """The last ``lines`` lines of the unit's journal (message text only)."""
    cmd = ["journalctl", "-u", unit, "-n", str(lines), "--no-pager", "-o", "cat"]
    try:
        return subprocess.run(cmd, capture_output=True, text=True).stdout
    except OSError as e:
        return f"(no journal: {e})\n"


ROUTER_READY = "/readiness"  # vllm-router: 200 while one worker is healthy (its /health: all)
STATUS_TIMEOUT = 30.0  # a status check of one instance: as long as the gate's one chat


def status(checks: dict[str, Any]) -> dict[str, str]:
    """port (as a string) -> "ok" or why not: the gate, once, for each ``[unit, port]`` (or
    ``[unit, port, key_unit, True]``: a router's, with the API key of the server unit
    ``key_unit``, or none when it is ""; then the servers' 401 counts as an answer) of
    ``checks["instances"]``, serving ``checks["model"]`` on ``checks["host"]``; and for each
    ``[unit, port]`` of ``checks["headless"]`` (a headless rank of a serving group: its port is
    only its name, nothing listens) whether its unit runs (its group's API is rank 0's)."""
    host = checks.get("host") or "127.0.0.1"

    def one(entry: list[Any]) -> str:
        unit, port, key_unit, router = (*entry, None, False)[:4]
        path = ROUTER_READY if router else "/health"
        return check(unit, int(port), checks["model"], STATUS_TIMEOUT, host, key_unit=key_unit
                     or None, path=path, keyless=bool(router and not key_unit)) or "ok"  # fmt: skip

    def headless(entry: list[Any]) -> str:
        st = unit_state(entry[0])  # a headless rank serves no port: its unit must be running
        return state_problem(entry[0], st, st.restarts) or "ok"

    instances, ranks = checks["instances"], checks.get("headless", [])
    with ThreadPoolExecutor(max_workers=max(1, len(instances))) as pool:
        found = list(pool.map(one, instances))
    return {str(entry[1]): why for entry, why in zip(instances, found, strict=True)} | {
        str(entry[1]): headless(entry) for entry in ranks
    }


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["status"] and len(args) == 2:
        print(json.dumps(status(json.loads(args[1]))))
        return
    ap = argparse.ArgumentParser(prog="health.py")
    ap.add_argument("unit")
    ap.add_argument("port", type=int)
    ap.add_argument("model")
    ap.add_argument("timeout", type=float)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--warm-marker")
    a = ap.parse_args(args)
    why = check(a.unit, a.port, a.model, a.timeout, a.host)
    if why is not None:
        sys.stderr.write(
            f"servefleet: health gate: {a.unit}: {why}\n"
            f"--- journal tail of {a.unit} ---\n{journal_tail(a.unit)}"
        )
        sys.exit(1)
    if a.warm_marker:
        Path(a.warm_marker).parent.mkdir(parents=True, exist_ok=True)
        Path(a.warm_marker).write_text(time.strftime("%Y-%m-%dT%H:%M:%S\n"))
    print(f"{a.unit}: healthy on port {a.port}")


if __name__ == "__main__":
    main()
