"""The fault harness: run the real pyinfra CLI against the lab and SIGKILL the controller right
after the N-th operation starts (or once a condition read from a host holds, e.g. every host
waits at a barrier: :func:`hold`), then check that the next run converges to what the data asks
for, judged from what runs on the hosts.

Used by tests/hosts/test_faults.py (one N per phase) and by ``tests/fault_sweep.py`` (every N).
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from labhelpers import on_host

REPO = Path(__file__).resolve().parents[2]
PYINFRA = str(Path(sys.executable).parent / "pyinfra")
ANSI = re.compile(r"\x1b\[[0-9;]*m")
STARTING = re.compile(r"--> Starting (?:[a-z ,]+ )?operation: (.*)$")
PORTS = [8000 + i for i in range(4)]
# what the deploy adds after --port: serve_shutdown_timeout, and the path guard (#46)
DRAIN = ["--shutdown-timeout", "60", "--middleware", "servefleet_paths.OpenPaths"]

# The recompiling change the fault tests make, from the default data: every phase runs
# (driver, release, models, units, pre-warm, restarts).
CHANGE = [
    "--data", "driver_version=3.6.0",
    "--data", "serve_target=Throughput",
    "--data", "serve_selection=spec_decode=eagle3,lmcache=cpu",
]  # fmt: skip
CHANGE_RESOLVE = ["--target", "throughput", "--set", "spec_decode=eagle3", "--set", "lmcache=cpu"]
DRAFT = "nvidia/gpt-oss-120b-Eagle3-v3"


def secrets(state: dict[str, Any]) -> dict[str, str]:
    return {name: Path(path).read_text().strip() for name, path in state["secrets"].items()}


@contextmanager
def argv_watch(*needles: bytes | str) -> Iterator[list[str]]:
    """Every process command line on this machine (the lab hosts' included) that holds one of
    ``needles``, sampled every 50 ms while the ``with`` runs (a secret there is a leak)."""
    wanted = [n.encode() if isinstance(n, str) else n for n in needles]
    seen: list[str] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
                try:
                    data = cmdline.read_bytes()
                except OSError:
                    continue
                if any(n in data for n in wanted):
                    seen.append(data.replace(b"\0", b" ").decode(errors="replace")[:200])
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield seen
    finally:
        stop.set()
        sampler.join()


def pyinfra_cmd(*args: str, deploy_file: str = "deploys/serve.py") -> list[str]:
    return [PYINFRA, "-y", *args, "inventories/lab.py", deploy_file]


def run(
    state: dict[str, Any],
    *args: str,
    deploy_file: str = "deploys/serve.py",
    env: dict[str, str] | None = None,
    timeout: float = 1800,
) -> subprocess.CompletedProcess[str]:
    """The real pyinfra CLI from the repo root, credentials in the environment."""
    run_env = env or {**os.environ, **secrets(state), "PYINFRA_PROGRESS": "off"}
    return pyinfra(pyinfra_cmd(*args, deploy_file=deploy_file)[1:], run_env, timeout)


def run_many(
    state: dict[str, Any], runs: list[list[str]], parallel: int = 4
) -> list[subprocess.CompletedProcess[str]]:
    """:func:`run` of each argv in ``runs``, ``parallel`` at a time; the results in order."""
    with ThreadPoolExecutor(parallel) as pool:
        return list(pool.map(lambda args: run(state, *args), runs))


FORKED = Path(__file__).with_name("forked_pyinfra.py")
IMPORT_ENV = ("SERVEFLEET_RECIPES", "SERVEFLEET_TEMPLATES")  # read as servefleet is imported


def pyinfra(
    args: list[str], env: dict[str, str], timeout: float = 1800
) -> subprocess.CompletedProcess[str]:
    """``pyinfra ARGS`` from the repository's root with ``env``: the real CLI in a process of its
    own, forked from one that imported pyinfra and servefleet once (:class:`Forks`), or exec'd
    when ``env`` differs from that one's where an import or Python's start reads it."""
    forks = Forks.get()
    if forks.takes(env):
        return forks.run(args, env, timeout)
    cmd = [PYINFRA, *args]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


class Forks:
    """``forked_pyinfra.py``, started on first use and left running for the session (it ends
    when this process does): each run is a child it forks."""

    _one: Forks | None = None
    _lock = threading.Lock()

    @classmethod
    def get(cls) -> Forks:
        with cls._lock:
            if cls._one is None or cls._one.proc.poll() is not None:
                cls._one = cls()
            return cls._one

    def __init__(self) -> None:
        self.path = os.path.join(tempfile.mkdtemp(prefix="servefleet-forks-"), "socket")
        self.env = {**os.environ, "PYINFRA_PROGRESS": "off"}
        cmd = [sys.executable, str(FORKED), self.path]
        pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE}
        self.proc = subprocess.Popen(cmd, cwd=REPO, env=self.env, text=True, **pipes)
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline() == "ready\n", "forked_pyinfra.py did not start"
        atexit.register(shutil.rmtree, os.path.dirname(self.path), True)

    def close(self) -> None:
        """End it once its runs have (their CPU time is then this process's children's)."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait()

    def takes(self, env: dict[str, str]) -> bool:
        """Whether a run with ``env`` can be forked from this one: the same values where an
        import (or Python's start) reads the environment."""
        read = [
            k for k in {*env, *self.env} if k in IMPORT_ENV or k.startswith(("PYTHON", "GEVENT"))
        ]
        return all(env.get(k) == self.env.get(k) for k in read)

    def run(
        self, args: list[str], env: dict[str, str], timeout: float
    ) -> subprocess.CompletedProcess[str]:
        cmd = [PYINFRA, *args]
        request = json.dumps({"argv": args, "env": env, "cwd": str(REPO)}).encode()
        said: dict[str, int] = {}
        with (
            tempfile.TemporaryFile() as out,
            tempfile.TemporaryFile() as err,
            socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as conn,
        ):
            conn.connect(self.path)
            socket.send_fds(conn, [request], [out.fileno(), err.fileno()])
            deadline = time.monotonic() + timeout
            while "returncode" not in said:
                conn.settimeout(max(0.01, deadline - time.monotonic()))
                try:
                    message = conn.recv(1 << 16)
                except TimeoutError:
                    if "pid" in said:
                        os.killpg(said["pid"], signal.SIGKILL)
                    raise subprocess.TimeoutExpired(cmd, timeout) from None
                if not message:  # killed: it said no exit code
                    said["returncode"] = -signal.SIGKILL
                    break
                said.update(json.loads(message))
            text = []
            for f in (out, err):  # as subprocess.run(text=True) reads them
                f.seek(0)
                text.append(
                    f.read().decode(errors="replace").replace("\r\n", "\n").replace("\r", "\n")
                )
        return subprocess.CompletedProcess(cmd, said["returncode"], text[0], text[1])


# The host programs' test barriers (``remote/health.py`` ``barrier``): while this root-only
# directory on a host holds ``hold-<point>``, the host program writes ``reached-<point>`` there
# when it gets to that point and waits until the hold is removed.
BARRIERS = "/run/servefleet-test"


def restart_point(unit: str, fingerprint: str) -> str:
    """The barrier right after ``instances.py`` restarted ``unit`` on a state of that compile
    fingerprint, before its health gate."""
    return f"restarted-{unit}-{fingerprint}"


def hold(state: dict[str, Any], hosts: list[str], point: str) -> Callable[[], bool]:
    """Make the host program of each host wait at ``point``; returns ``reached()``: every host
    waits there now. :func:`release` lets them go."""
    for host in hosts:
        on_host(state, host, f"rm -rf {BARRIERS} && install -d -m 700 -o root -g root {BARRIERS}"
                f" && touch {BARRIERS}/hold-{point}")  # fmt: skip

    def reached() -> bool:
        test = f"test -e {BARRIERS}/reached-{point}"
        return all(on_host(state, h, test, check=False).returncode == 0 for h in hosts)

    return reached


def release(state: dict[str, Any], hosts: list[str]) -> None:
    """Remove every barrier (the waiting host programs go on)."""
    for host in hosts:
        on_host(state, host, f"rm -rf {BARRIERS}")


def run_killed(
    state: dict[str, Any],
    *args: str,
    at: Callable[[int, str], bool],
    then: Callable[[], bool] | None = None,
    timeout: float = 600,
) -> tuple[list[str], bool]:
    """Run pyinfra and SIGKILL it once ``at(n, name)`` holds for the n-th operation start (1-based)
    and then ``then()`` (polled, up to ``timeout`` s from the start) holds. Returns the operations
    started and whether it was killed (False: the run ended before the fault point). A ``then``
    that does not hold in time fails."""
    env = {**os.environ, **secrets(state), "PYINFRA_PROGRESS": "off"}
    proc = subprocess.Popen(
        pyinfra_cmd(*args),
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
    )
    started: list[str] = []
    deadline = time.monotonic() + timeout
    assert proc.stdout is not None
    try:
        for raw in proc.stdout:
            m = STARTING.search(ANSI.sub("", raw.rstrip("\n")))
            if not m:
                continue
            started.append(m.group(1).strip())
            if at(len(started), started[-1]):
                while then is not None and not then():
                    if proc.poll() is not None:
                        break
                    assert time.monotonic() < deadline, f"the fault point took {timeout} s"
                    time.sleep(0.1)
                if proc.poll() is None:
                    proc.send_signal(signal.SIGKILL)
                    proc.wait()
                    return started, True
        proc.wait()
        return started, False
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def op_names(state: dict[str, Any], *args: str) -> list[str]:
    """The operations a run would start, in order (the table of a real --dry run)."""
    env = {**os.environ, **secrets(state), "PYINFRA_PROGRESS": "off"}
    out = pyinfra(["--dry", *args, "inventories/lab.py", "deploys/serve.py"], env, 600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    text = ANSI.sub("", out.stdout + out.stderr)
    table = text.split("--> Detected changes:", 1)[1].split("\n\n", 1)[0].splitlines()[2:]
    return [re.split(r"\s{2,}", row.strip())[0] for row in table if row.strip()]


def resolved(*extra: str) -> dict[str, Any]:
    """``servefleet resolve rbln/gpt-oss-120b EXTRA...`` (the shipped card) as JSON, a new copy
    each call; the CLI runs once for each ``extra``."""
    return json.loads(_resolve(extra))


@functools.cache
def _resolve(extra: tuple[str, ...]) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "servefleet", "resolve", "rbln/gpt-oss-120b", *extra],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout


def record(state: dict[str, Any], host: str, port: int) -> dict[str, Any] | None:
    out = on_host(state, host, f"cat /run/rbln-sim/vllm-{port}.json 2>/dev/null || true").stdout
    return json.loads(out) if out.strip() else None


def runs_argv(state: dict[str, Any], host: str, port: int, argv: list[str]) -> bool:
    """The server recorded on ``port`` got ``argv`` + --port, and is alive now."""
    rec = record(state, host, port)
    if not rec or rec["argv"][1:] != argv[1:] + ["--port", str(port), *DRAIN]:
        return False
    return on_host(state, host, f"kill -0 {rec['pid']}", check=False).returncode == 0


def compile_log(state: dict[str, Any], host: str) -> list[str]:
    return on_host(
        state, host, "cat /var/log/rbln-sim/compile.log 2>/dev/null || true"
    ).stdout.splitlines()


def running_sig(state: dict[str, Any], host: str) -> str:
    journal = on_host(
        state, host, "journalctl -u servefleet-vllm-0.service -o cat --no-pager"
    ).stdout
    sigs = re.findall(r"signature ([0-9a-f]{16})", journal)
    assert sigs, f"{host}: no signature in the journal of instance 0"
    return sigs[-1]


def totals(proc: subprocess.CompletedProcess[str]) -> dict[str, int]:
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return json.loads(proc.stdout)["results"]["totals"]


def changed_ops(proc: subprocess.CompletedProcess[str]) -> list[str]:
    data = json.loads(proc.stdout)
    return [o["name"] for o in data["results"]["operations"] if o["success"]]


def make_change_cold(state: dict[str, Any], hosts: list[str]) -> None:
    """Undo what the change, or any other selection an earlier run served, left on the hosts, so
    that the change runs every phase again: every compile bundle but the one instance 0 runs now
    and every warm marker but its fingerprint's, the draft model, and every release but the
    serving one."""
    for host in hosts:
        sig = running_sig(state, host)
        script = (
            f"rm -rf /var/lib/servefleet/hf/hub/models--{DRAFT.replace('/', '--')}; "
            "for b in /var/cache/servefleet/vllm/rbln/*/*; do "
            f'[ "$(basename $b)" = "{sig}" ] || rm -rf "$b"; done; '
            "cur=$(readlink /opt/servefleet/current | xargs basename); "
            'for r in /opt/servefleet/releases/*; do [ "$(basename $r)" = "$cur" ] || rm -rf "$r"; done; '
            "fp=$(sed -n 's/^# compile fingerprint: //p' /etc/systemd/system/servefleet-vllm-0.service); "
            "for m in /var/cache/servefleet/vllm/servefleet-warm/*; do "
            '[ "$(basename $m)" = "$fp" ] || rm -f "$m"; done; true'
        )
        on_host(state, host, script)


def check_converged(
    state: dict[str, Any], hosts: list[str], before: dict[str, int], limit: list[str]
) -> None:
    """After a fault and one clean run: every instance runs the change, one compile per host
    for it, and a third run changes nothing."""
    argv = resolved(*CHANGE_RESOLVE)["servers"][0]["argv"]
    for host in hosts:
        for port in PORTS:
            assert runs_argv(state, host, port, argv), f"{host}:{port} does not run the change"
        new = compile_log(state, host)[before[host] :]
        sig = running_sig(state, host)
        assert [line for line in new if f"sig={sig}" in line] and len(new) == 1, (
            f"{host}: compiles during the change: {new} (want exactly one, of sig {sig})"
        )
    third = run(state, "--json", *limit, *CHANGE)
    assert totals(third)["success"] == 0, changed_ops(third)
