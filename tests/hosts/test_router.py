"""A front door (#21): the real vllm-router in front of each host's instances
(``serve_router = "host"``) on two CR13 hosts. A chat through each router; a second run changes
nothing; then a rolling restart of every instance for a recompiling change while clients send
streaming and non-streaming requests through the routers: every request succeeds, because each
instance leaves the router's rotation before it stops and comes back after its gate. Last,
``serve_router = "none"`` removes the router."""

from __future__ import annotations

import http.client
import json
import secrets
import shlex
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from faults import BARRIERS, hold, release, restart_point, run, run_killed
from labhelpers import on_host, relabbed
from test_endpoints import keyed
from test_plan_status import answers_ssh, cli, host_systemctl, wait_for

HOSTS = ("lab1", "lab2")
ROUTER_PORT = 8080
BACKEND_PORT = 18080  # vllm-router itself, on loopback behind its proxy
ADMIN_PORT = 8079  # serve_router fleet: the worker API through the proxy, with the admin key
MODEL = "openai/gpt-oss-120b"
RATE_FILE = "/etc/rbln-sim/tokens-per-second"
TOKENS = 8  # per request: 0.2 s at the rate below
RATE = 40
CLIENTS = 3  # per host
AFTER = 5  # requests each client sends after the rollout ended
MOST = 4000  # and never more than this many in all (it stops by itself)
ROUTER_UNIT = "servefleet-router.service"


def deploy(
    lab: dict[str, Any],
    *data: str,
    router: str = "host",
    hosts: tuple[str, ...] = HOSTS,
    env: dict[str, str] | None = None,
) -> str:
    args = [a for d in (f"serve_router={router}", *data) for a in ("--data", d)]
    proc = run(lab, *(a for h in hosts for a in ("--limit", h)), *args, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    return out


def address(lab: dict[str, Any], name: str) -> str:
    return str(next(h["address"] for h in lab["hosts"] if h["name"] == name))


def request(host: str, stream: bool, model: str = MODEL, key: str | None = None) -> str | None:
    """One chat through the router (with ``Authorization: Bearer key``): None when it succeeded
    whole (every token, and [DONE] for a stream), else what went wrong."""
    body = json.dumps({"model": model, "max_tokens": TOKENS, "stream": stream,
                       "messages": [{"role": "user", "content": "Hello"}]})  # fmt: skip
    conn = http.client.HTTPConnection(host, ROUTER_PORT, timeout=60)
    try:
        headers = {"Content-Type": "application/json"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        conn.request("POST", "/v1/chat/completions", body, headers)
        response = conn.getresponse()
        if response.status != 200:
            return f"HTTP {response.status}: {response.read(300)!r}"
        if not stream:
            reply = json.loads(response.read())
            return None if reply.get("choices") else f"no choices: {reply}"
        tokens, done = 0, False
        for raw in iter(response.readline, b""):
            line = raw.decode().strip()
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                delta = (json.loads(line[6:]).get("choices") or [{}])[0].get("delta", {})
                tokens += bool(delta.get("content"))
        return None if done and tokens == TOKENS else f"stream cut: {tokens} tokens, done={done}"
    except (OSError, http.client.HTTPException, ValueError) as exc:
        return repr(exc)
    finally:
        conn.close()


def worker_api(lab: dict[str, Any], host: str, path: str) -> Any:
    """vllm-router's worker API on ``host``, where only that host reaches it (loopback)."""
    read = (f"import urllib.request; print(urllib.request.urlopen("
            f"'http://127.0.0.1:{BACKEND_PORT}{path}', timeout=10).read().decode())")  # fmt: skip
    return json.loads(on_host(lab, host, f'python3 -c "{read}"').stdout)


def listed(lab: dict[str, Any], host: str) -> list[str]:
    return list(worker_api(lab, host, "/list_workers")["urls"])


def healthy(lab: dict[str, Any], host: str) -> dict[str, bool]:
    """Each worker the router lists, and whether its health checks find it healthy."""
    return {w["url"]: w["is_healthy"] for w in worker_api(lab, host, "/workers")["workers"]}


def attack(lab: dict[str, Any], source: str, target: str, port: int, key: str | None = None,
           verb: str = "add") -> int:  # fmt: skip
    """The finding's attack from host ``source``: put a worker of its own into the router at
    ``target:port`` (or take one out), without a key or with ``key``; the HTTP status."""
    worker = f"http://{address(lab, source)}:9999"
    headers = f"{{'Authorization': 'Bearer {key}'}}" if key else "{}"
    code = (
        "import urllib.request, urllib.error, urllib.parse\n"
        f"url = 'http://{target}:{port}/{verb}_worker?url=' + urllib.parse.quote('{worker}', safe='')\n"
        f"req = urllib.request.Request(url, data=b'', method='POST', headers={headers})\n"
        "try:\n    print(urllib.request.urlopen(req, timeout=10).status)\n"
        "except urllib.error.HTTPError as e:\n    print(e.code)\n"
    )
    out = on_host(lab, source, f"python3 -c {shlex.quote(code)}").stdout
    return int(out.strip().splitlines()[-1])


class Traffic:
    """CLIENTS threads per host, each sending requests through its host's router (streaming and
    not, in turn) until the rollout ended and AFTER more; every outcome is kept."""

    def __init__(self, hosts: list[str]) -> None:
        self.ended = threading.Event()
        self.lock = threading.Lock()
        self.sent = 0
        self.failures: list[str] = []
        self.threads = [threading.Thread(target=self.client, args=(h, k), daemon=True)
                        for h in hosts for k in range(CLIENTS)]  # fmt: skip

    def client(self, host: str, k: int) -> None:
        after, i = 0, k
        while after < AFTER:
            with self.lock:
                if self.sent >= MOST:
                    return
                self.sent += 1
            why = request(host, stream=i % 2 == 0)
            i += 1
            if why:
                with self.lock:
                    self.failures.append(f"{host}: {why}")
            if self.ended.is_set():
                after += 1

    def __enter__(self) -> Traffic:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.ended.set()
        for t in self.threads:
            t.join(120)
        assert not any(t.is_alive() for t in self.threads), "a client never ended"


def unit_shas(lab: dict[str, Any], host: str) -> list[str]:
    out = on_host(lab, host, "grep -h '^Environment=\"SERVEFLEET_UNIT=' "
                  "/etc/systemd/system/servefleet-vllm-*.service").stdout  # fmt: skip
    return out.split()


def test_host_routers_serve_through_a_rolling_restart(lab: dict[str, Any]) -> None:
    for host in HOSTS:
        on_host(lab, host, f"rm -rf /etc/rbln-sim/fail-start /etc/rbln-sim/fail-health {BARRIERS}")
    deploy(lab)
    for host in HOSTS:
        addr = address(lab, host)
        assert sorted(listed(lab, host)) == [f"http://127.0.0.1:{8000 + i}" for i in range(4)]
        assert request(addr, stream=False) is None and request(addr, stream=True) is None
        user = on_host(
            lab, host, f"ps -o user= -p $(systemctl show -p MainPID --value {ROUTER_UNIT})"
        )
        assert user.stdout.strip() == "servefleet-router"
    # #31 finding 1: from the other host, the worker API is not on the router's port
    for verb in ("add", "remove"):
        assert attack(lab, "lab2", address(lab, "lab1"), ROUTER_PORT, verb=verb) == 404
    assert sorted(listed(lab, "lab1")) == [f"http://127.0.0.1:{8000 + i}" for i in range(4)]
    again = deploy(lab)
    assert "Converge the instances" not in again and "router release" not in again, again[-3000:]

    before = {h: unit_shas(lab, h) for h in HOSTS}
    for host in HOSTS:  # the change compiles: no warm marker but the serving one's
        on_host(lab, host, f"echo {RATE} > {RATE_FILE}; "
                "fp=$(sed -n 's/^# compile fingerprint: //p' /etc/systemd/system/servefleet-vllm-0.service); "
                "for m in /var/cache/servefleet/vllm/servefleet-warm/*; do "
                '[ "$(basename $m)" = "$fp" ] || rm -f "$m"; done; true')  # fmt: skip
    try:
        with Traffic([address(lab, h) for h in HOSTS]) as traffic:
            deploy(lab, "serve_target=Throughput")  # --max-num-seqs 1 -> 8: a recompile
    finally:
        for host in HOSTS:
            on_host(lab, host, f"rm -f {RATE_FILE}")
    assert traffic.failures == [], traffic.failures[:10]
    assert traffic.sent > 20 * len(HOSTS) * CLIENTS, traffic.sent
    for host in HOSTS:
        shas = unit_shas(lab, host)
        assert len(shas) == 4 and not set(shas) & set(before[host]), (before[host], shas)
        assert sorted(listed(lab, host)) == [f"http://127.0.0.1:{8000 + i}" for i in range(4)]
        # the router's own log: each instance left its rotation and came back
        log = on_host(lab, host, f"journalctl -u {ROUTER_UNIT} -o cat --no-pager").stdout
        for i in range(4):
            worker = f"http://127.0.0.1:{8000 + i}"
            assert f"Removed worker: {worker}" in log and f"Added worker: {worker}" in log, log[
                -3000:
            ]

    # an API key: the router holds none and passes each client's Authorization on
    key, first = "sk-lab-" + secrets.token_hex(24), HOSTS[0]
    deploy(lab, "serve_target=Throughput", hosts=(first,), env=keyed(lab, key))
    assert request(address(lab, first), stream=False, key=key) is None
    assert request(address(lab, first), stream=True, key=key) is None
    assert (request(address(lab, first), stream=False) or "").startswith("HTTP 401")
    router_unit = on_host(lab, first, f"cat /etc/systemd/system/{ROUTER_UNIT}").stdout
    assert key not in router_unit and "EnvironmentFile" not in router_unit

    deploy(lab, router="none")
    for host in HOSTS:
        gone = on_host(lab, host, f"test -e /etc/systemd/system/{ROUTER_UNIT}", check=False)
        assert gone.returncode != 0
        assert request(address(lab, host), stream=False) is not None  # nothing listens now


def test_a_converge_killed_with_an_instance_out_of_rotation_puts_it_back(
    lab: dict[str, Any],
) -> None:
    """Killed (controller and host program) after instance 1 left the rotation and restarted,
    before its gate: the router still serves through the others, and the next run puts it back."""
    host, unit = "lab1", "servefleet-vllm-1.service"
    on_host(lab, host, f"rm -rf /etc/rbln-sim/fail-start /etc/rbln-sim/fail-health {BARRIERS}")
    deploy(lab, hosts=(host,))
    addr = address(lab, host)
    fp = on_host(lab, host, "sed -n 's/^# compile fingerprint: //p' "
                 f"/etc/systemd/system/{unit}").stdout.strip()  # fmt: skip
    reached = hold(lab, [host], restart_point(unit, fp))
    change = ["--limit", host, "--data", "serve_router=host", "--data", "serve_shutdown_timeout=61"]
    try:
        _, killed = run_killed(lab, *change, at=lambda n, name: "Converge the instances" in name,
                               then=reached)  # fmt: skip
        assert killed
        on_host(lab, host, "pkill -9 -f '[i]nstances.py converge' || true")
    finally:
        release(lab, [host])
    assert "http://127.0.0.1:8001" not in listed(lab, host)
    assert request(addr, stream=False) is None  # the router serves through the other three
    deploy(lab, "serve_shutdown_timeout=61", hosts=(host,))
    assert sorted(listed(lab, host)) == [f"http://127.0.0.1:{8000 + i}" for i in range(4)]
    deploy(lab, router="none", hosts=(host,))


FLEET = ("lab1", "lab2", "lab3")  # lab3 runs the fleet router (the inventory group router)


@pytest.fixture
def fleet_lab(lab: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The session lab re-upped with lab3 in the group router; re-upped as it was after."""
    with relabbed(lab, "--hosts", "3", "--group", "router=lab3") as fleet:
        yield fleet


def test_a_fleet_router_over_two_hosts_through_a_rollout_and_a_stopped_host(
    fleet_lab: dict[str, Any],
) -> None:
    lab = fleet_lab
    deploy(lab, router="fleet", hosts=FLEET)
    front = address(lab, "lab3")
    workers = sorted(
        f"http://{address(lab, h)}:{8000 + i}" for h in ("lab1", "lab2") for i in range(4)
    )
    assert sorted(listed(lab, "lab3")) == workers
    assert request(front, stream=False) is None and request(front, stream=True) is None
    # #31 finding 1, from a serving host (not a router): the worker API is not on the clients'
    # port, and on the admin port only with the routers' admin key, which lab1's serve user
    # cannot read (a 0600 root file)
    assert attack(lab, "lab1", front, ROUTER_PORT) == 404
    assert attack(lab, "lab1", front, ADMIN_PORT) == 401
    assert attack(lab, "lab1", front, ADMIN_PORT, key="guessed-" + secrets.token_hex(12)) == 401
    assert attack(lab, "lab1", front, ADMIN_PORT, verb="remove") == 401
    assert sorted(listed(lab, "lab3")) == workers
    unreadable = on_host(lab, "lab1", "runuser -u servefleet -- cat "
                         "/etc/servefleet/secrets/router-admin-key", check=False)  # fmt: skip
    assert unreadable.returncode != 0
    served = on_host(lab, "lab3", "ls /etc/systemd/system/ | grep -c '^servefleet-vllm-' || true")
    assert served.stdout.strip() == "0"  # the router host serves nothing itself

    # a rolling restart of both hosts' instances: each leaves the fleet router's rotation first
    for host in ("lab1", "lab2"):
        on_host(lab, host, f"echo {RATE} > {RATE_FILE}")
    with Traffic([front]) as traffic:
        deploy(lab, "serve_shutdown_timeout=61", router="fleet", hosts=FLEET)
    assert traffic.failures == [], traffic.failures[:10]
    log = on_host(lab, "lab3", f"journalctl -u {ROUTER_UNIT} -o cat --no-pager").stdout
    assert all(f"Removed worker: {w}" in log and f"Added worker: {w}" in log for w in workers)

    # lab2 stops mid-traffic (its sshd and its servers, killed): what its instances had in
    # flight may fail; everything else the router sends to lab1
    traffic = Traffic([front])
    with traffic:
        deadline = time.monotonic() + 30
        while traffic.sent < 20 and time.monotonic() < deadline:
            time.sleep(0.1)
        host_systemctl(lab, "lab2", "stop", "ssh.service")
        host_systemctl(lab, "lab2", "kill", "--signal=SIGKILL", "servefleet-vllm-*.service")
        host_systemctl(lab, "lab2", "stop", "servefleet-vllm-*.service")
        stopped_at = traffic.sent
        while traffic.sent < stopped_at + 60 and time.monotonic() < deadline + 120:
            time.sleep(0.1)
    dead = [f"http://{address(lab, 'lab2')}:{8000 + i}" for i in range(4)]
    wait_for(
        lambda: all(not healthy(lab, "lab3")[w] for w in dead),
        "the router still finds lab2 healthy",
    )
    try:
        assert len(traffic.failures) <= CLIENTS, traffic.failures  # one in flight per client
        status = cli(lab, "status", "inventories/lab.py", "--data", "serve_router=fleet")
        assert status.returncode == 1
        assert "servefleet: lab2: unreachable" in status.stderr, status.stderr
        assert (
            f"lab3: {ROUTER_UNIT} finds http://{address(lab, 'lab2')}:8000 unhealthy"
            in status.stderr
        )
    finally:
        host_systemctl(lab, "lab2", "start", "ssh.service")
        wait_for(lambda: answers_ssh("lab2"), "lab2's sshd did not come back")
        for host in ("lab1", "lab2"):
            on_host(lab, host, f"rm -f {RATE_FILE}")
    deploy(lab, "serve_shutdown_timeout=61", router="fleet", hosts=FLEET)  # lab2 serves again
    assert request(front, stream=False) is None


PD_CARD = "tests/data/rbln/gpt-oss-120b-pd.json"  # a P/D card made for the tests


def role_counts(lab: dict[str, Any], host: str, port: int) -> dict[str, int]:
    """The simulated server's requests per role (its /metrics), read on the host."""
    read = f"import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:{port}/metrics').read().decode())"
    out = on_host(lab, host, f'python3 -c "{read}"').stdout
    found = {}
    for line in out.splitlines():
        if line.startswith("servefleet_sim_requests_total{"):
            role = line.split('role="', 1)[1].split('"', 1)[0]
            found[role] = int(float(line.rsplit(" ", 1)[1]))
    return found


def started_at(lab: dict[str, Any], host: str, unit: str) -> int:
    out = on_host(lab, host, f"systemctl show -p ActiveEnterTimestampMonotonic --value {unit}")
    return int(out.stdout.strip())


STALE = "/etc/rbln-sim/stale-peer"  # the simulator's switch: NIXL <= 1.3.2's stale peer state


def stale_read(lab: dict[str, Any], host: str, unit: str) -> bool:
    """Whether the unit's server logged a read that failed on a restarted peer's old engine."""
    journal = on_host(lab, host, f"journalctl -u {unit} --no-pager -o cat").stdout
    return "(the lab's stale-peer switch" in journal


def test_prefill_and_decode_on_one_host_behind_its_router(lab: dict[str, Any]) -> None:
    host = "lab1"
    on_host(lab, host, f"rm -rf /etc/rbln-sim/fail-start /etc/rbln-sim/fail-health {BARRIERS}")
    on_host(lab, host, f"echo kv_consumer > {STALE}")  # decodes keep a peer's first engine
    try:
        pd_on_one_host(lab, host)
    finally:
        on_host(lab, host, f"rm -f {STALE}")


def pd_on_one_host(lab: dict[str, Any], host: str) -> None:
    data = (f"serve_recipe={PD_CARD}",)
    deploy(lab, *data, hosts=(host,))
    front = address(lab, host)
    workers = healthy(lab, host)
    assert workers == {"http://127.0.0.1:8000": True, "http://127.0.0.1:8001": True}, workers
    before = (role_counts(lab, host, 8000), role_counts(lab, host, 8001))
    assert request(front, stream=False) is None and request(front, stream=True) is None
    after = (role_counts(lab, host, 8000), role_counts(lab, host, 8001))
    assert after[0]["prefill"] - before[0]["prefill"] == 2  # instance 0 prefills both ...
    assert after[1]["decode"] - before[1]["decode"] == 2  # ... and instance 1 decodes them
    env = on_host(lab, host, "tr '\\0' '\\n' < /proc/$(systemctl show -p MainPID --value "
                  "servefleet-vllm-1.service)/environ").stdout.split()  # fmt: skip
    assert "VLLM_NIXL_SIDE_CHANNEL_HOST=127.0.0.1" in env

    # the prefill killed and kept down: the next deploy starts it (a new NIXL engine), the
    # decode (under the stale-peer switch) fails the re-check, restarts, and then passes
    decoded = started_at(lab, host, "servefleet-vllm-1.service")
    on_host(lab, host, "systemctl kill --signal=SIGKILL servefleet-vllm-0.service; "
            "systemctl stop servefleet-vllm-0.service")  # fmt: skip
    deploy(lab, *data, hosts=(host,))
    assert started_at(lab, host, "servefleet-vllm-1.service") > decoded
    assert stale_read(lab, host, "servefleet-vllm-1.service")
    assert request(front, stream=False) is None

    # an API key is refused in one line, before any change: vllm-router's prefill/decode mode
    # sends its workers its own OPENAI_API_KEY and checks no client's key
    units = {
        u: started_at(lab, host, u)
        for u in ("servefleet-vllm-0.service", "servefleet-vllm-1.service")
    }
    key = "sk-lab-" + secrets.token_hex(24)
    args = [a for d in ("serve_router=host", *data) for a in ("--data", d)]
    refused = run(lab, "--limit", host, *args, env=keyed(lab, key))
    out = refused.stdout + refused.stderr
    assert refused.returncode != 0 and "Traceback" not in out
    assert (
        f"servefleet: {host}: creds_api_key_env: an API key, but the selection has the roles" in out
    ), out
    assert units == {u: started_at(lab, host, u) for u in units}

    # a change that restarts both: decode first, then prefill, then one request through both
    deploy(lab, *data, "serve_shutdown_timeout=61", hosts=(host,))
    decode_start = started_at(lab, host, "servefleet-vllm-1.service")
    prefill_start = started_at(lab, host, "servefleet-vllm-0.service")
    assert decode_start < prefill_start
    assert request(front, stream=False) is None
    deploy(lab, router="none", hosts=(host,))  # the default selection again, no router
    gone = on_host(lab, host, f"test -e /etc/systemd/system/{ROUTER_UNIT}", check=False)
    assert gone.returncode != 0
