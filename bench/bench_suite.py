"""Bench (not a test): what the host tests pay again and again, before and after issue #16's cuts,
on a 3-host lab: a run refused for bad data (the real pyinfra CLI, exec'd vs forked from a process
that imported it once: ``tests/hosts/forked_pyinfra.py``), a command on a host over ssh (OpenSSH's
default key exchange vs the lab's curve25519 vs one shared connection), a command over the
deploy's own paramiko connection (as paramiko leaves it vs with TCP_NODELAY) and enabling a unit
(with the daemon-reload ``systemctl enable`` does vs ``--no-reload``) and a host's cold install of
huggingface-hub with its 14 dependencies from the lab's public index (served with the stdlib's
listen backlog of 5 vs the lab servers' 128). Each row: wall time and
this machine's CPU time (the runs' and their children's) per call, and the ratio to the first
row of its group. Needs root; brings a lab up and leaves the machine with the lab down.

    .venv/bin/python bench/bench_suite.py [--runs 20]
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import paramiko
from labbench import REPO, lab, lab_env

PYINFRA = str(Path(sys.executable).parent / "pyinfra")
BAD = ["-y", "inventories/lab.py", "deploys/serve.py", "--data", "serve_target=1"]


def cpu() -> float:
    """CPU seconds of this process and its children so far."""
    return sum(
        u.ru_utime + u.ru_stime
        for u in (
            resource.getrusage(resource.RUSAGE_CHILDREN),
            resource.getrusage(resource.RUSAGE_SELF),
        )
    )


def per_call(runs: int, calls: Callable[[int], None]) -> tuple[float, float]:
    """(wall, CPU) seconds per call of ``calls(runs)``, which makes ``runs`` calls."""
    start, used = time.monotonic(), cpu()
    calls(runs)
    return (time.monotonic() - start) / runs, (cpu() - used) / runs


def each(cmd: list[str], code: int = 0, **kwargs: object) -> Callable[[int], None]:
    """``n`` runs of ``cmd``, each exiting ``code``."""
    return lambda n: [check(cmd, code, **kwargs) for _ in range(n)] and None


def check(cmd: list[str], code: int = 0, **kwargs: object) -> None:
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, **kwargs)  # type: ignore[call-overload]
    if proc.returncode != code:
        raise SystemExit(f"{' '.join(cmd)[:200]} exited {proc.returncode}:\n{proc.stderr[-2000:]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20, help="calls per row")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO / "tests" / "hosts"))
    from faults import Forks
    from labhelpers import shared_connection

    from servefleet.entry.steps import connection
    from servefleet.fleet.lab import httpbase, index, layout
    from servefleet.fleet.lab.hosts import ssh_command
    from servefleet.fleet.lab.state import load_state
    from servefleet.release.uvbin import uv_version
    from servefleet.settings.table import load_defaults

    groups: list[tuple[str, list[tuple[str, tuple[float, float]]]]] = []
    try:
        lab("up", "--hosts", "3")
        env = lab_env()
        state = load_state()

        def forked(n: int) -> None:
            forks = Forks()
            assert all(forks.run(BAD, env, 600).returncode == 1 for _ in range(n))
            forks.close()  # its CPU time and its runs' counted

        refused = [
            ("pyinfra, exec'd", per_call(args.runs, each([PYINFRA, *BAD], 1, env=env))),
            ("pyinfra, forked", per_call(args.runs, forked)),
        ]
        groups.append(("a run refused for bad data (3 hosts)", refused))

        ssh, *rest = ssh_command(state, "lab1", ["true"])
        i = rest.index("KexAlgorithms=curve25519-sha256")
        default = [ssh, *rest[: i - 1], *rest[i + 1 :]]
        calls = [
            ("OpenSSH's default key exchange", per_call(args.runs, each(default))),
            ("curve25519 (the lab's)", per_call(args.runs, each([ssh, *rest]))),
        ]
        shared = [ssh, *shared_connection(state), *rest]
        check(shared)  # the master
        calls.append(("one shared connection", per_call(args.runs, each(shared))))
        groups.append(("`true` on a host over ssh", calls))

        client = paramiko.SSHClient()
        client.load_host_keys(state["ssh"]["known_hosts"])
        address = next(h["address"] for h in state["hosts"] if h["name"] == "lab1")
        client.connect(address, username=state["ssh"]["user"], key_filename=state["ssh"]["key"],
                       look_for_keys=False, allow_agent=False)  # fmt: skip

        def commands(n: int) -> None:  # as pyinfra runs each of its commands
            for _ in range(n):
                _, out, _ = client.exec_command("sh -c true")
                assert out.channel.recv_exit_status() == 0

        nagle = per_call(args.runs, commands)
        connection.tune(client.get_transport())
        tuned = per_call(args.runs, commands)
        client.close()
        groups.append(("a command over the deploy's connection (paramiko, one per host)",
                       [("paramiko's default (Nagle's algorithm on)", nagle),
                        ("with TCP_NODELAY (steps/connection.tune)", tuned)]))  # fmt: skip

        unit = "servefleet-bench.service"
        make = (f"printf '[Service]\\nExecStart=/bin/sleep 1000\\n[Install]\\n"
                f"WantedBy=multi-user.target\\n' > /etc/systemd/system/{unit}; "
                "systemctl daemon-reload")  # fmt: skip
        check(ssh_command(state, "lab1", [make]))

        def enables(option: str) -> Callable[[int], None]:  # n of them in one ssh call
            loop = f"for i in $(seq {{}}); do systemctl enable --quiet {option} {unit}; done"
            return lambda n: check([*shared[:-1], loop.format(n)])  # "true" replaced

        enable = [
            (f"systemctl enable {unit}", per_call(args.runs, enables(""))),
            ("with --no-reload", per_call(args.runs, enables("--no-reload"))),
        ]
        groups.append(("enabling an enabled unit (a loop on the host)", enable))

        check(
            [PYINFRA, "-y", "inventories/lab.py", "deploys/stack.py", "--limit", "lab1"], env=env
        )  # fmt: skip  (the host's uv)
        uv = f"{load_defaults()['serve_root']}/lib/uv-{uv_version()}"
        public = Path(state["index_roots"]["public"])
        installs = []
        for name, backlog in (("the stdlib's listen backlog (5)", 5),
                              ("the lab servers' (128, httpbase.Server)", 128)):  # fmt: skip
            server_class = type("Bench", (httpbase.Server,), {"request_queue_size": backlog})
            handler = type(
                "BenchIndex", (index.Handler,), {"config": index.Config("simple", public)}
            )
            server = server_class((layout.BRIDGE_IP, 0), handler)
            threading.Thread(target=server.serve_forever, daemon=True).start()
            url = f"http://{layout.BRIDGE_IP}:{server.server_address[1]}/simple"
            cold = (f"rm -rf /root/.cache/uv /tmp/bench-venv && {uv} venv -q /tmp/bench-venv && "
                    f"UV_NO_CONFIG=1 {uv} pip install -q --python /tmp/bench-venv/bin/python "
                    f"--default-index {url} --allow-insecure-host {layout.BRIDGE_IP} huggingface-hub")  # fmt: skip

            def installs_of(n: int, cmd: str = cold) -> None:
                for _ in range(n):
                    check([*shared[:-1], cmd])

            installs.append((name, per_call(max(3, args.runs // 4), installs_of)))
            server.shutdown()
            server.server_close()
        groups.append(("a cold install of huggingface-hub and its 14 dependencies on a host (uv)",
                       installs))  # fmt: skip
    finally:
        lab("down")
    print("| what | per call (s) | CPU per call (s) | vs first |")
    print("|---|---|---|---|")
    for title, rows in groups:
        print(f"| **{title}** | | | |")
        base = rows[0][1][0]
        for name, (wall, used) in rows:
            print(f"| {name} | {wall:.3f} | {used:.3f} | {wall / base:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
