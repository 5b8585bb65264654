"""A hostile serve user (issue #18): before each flow, the serve user plants links (and moves
root's own directories aside) at every path root reads or writes in the trees it owns, each
pointing at a sentinel: a root-only file, a root-only directory and ``/root/.ssh/authorized_keys``.
After each flow the sentinels keep their owner, mode and content, and the run either converged
or failed that host in one line.

Flows, on two hosts of a new lab: a fresh deploy onto hosts where the serve user and its trees
already exist (as a host re-provisioned with its /var kept has them), planted; a deploy that
fetches the model again from the store and, its warm markers gone, recompiles through a fleet
pre-warm of two hosts; the same with the model fetched from the lab's Hugging Face hub by the
release's real huggingface_hub; then a recompiling change with the compile cache itself linked
away (the servers cannot compile there: the hosts fail, in one line each, and keep serving);
then, the links removed, the next run converges.

And (#31 findings 3 and 7), on one host: the serve user's link in the path of one of its trees
is refused on the host before anything is chowned, and its flock held on its hub fails the model
fetch in one line within the fetch's deadline.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from faults import run
from labhelpers import on_host, relabbed

HOSTS = ["lab1", "lab2"]
LIMIT = ["--limit", "lab1", "--limit", "lab2"]
USER = "servefleet"
CACHE = "/var/cache/servefleet/vllm"
HUB = "/var/lib/servefleet/hf/hub"
MODEL = "models--openai--gpt-oss-120b"
SENTINELS = ["/root/sf-sentinel-file", "/root/sf-sentinel-dir", "/root/.ssh/authorized_keys"]
CHANGE = ["--data", "serve_target=Throughput"]  # compile-affecting (--max-num-seqs)
FROM_HUB = ["--data", "models_store_url=null"]  # models_hub_url: the lab's hub (group_data)

# as the serve user: root's directories in its cache moved aside and linked to the sentinel
# directory; the model's hub directory, its .locks entry and a staging name likewise
PLANT = f"""
set -e
for t in servefleet-warm .servefleet-incoming .servefleet-outgoing; do
  if [ -e {CACHE}/$t ] || [ -L {CACHE}/$t ]; then mv {CACHE}/$t {CACHE}/$t.moved-$$; fi
  ln -s /root/sf-sentinel-dir {CACHE}/$t
done
if [ -e {HUB}/{MODEL} ] || [ -L {HUB}/{MODEL} ]; then mv {HUB}/{MODEL} {HUB}/{MODEL}.moved-$$; fi
ln -s /root/sf-sentinel-dir {HUB}/{MODEL}
mkdir -p {HUB}/.locks
rm -rf {HUB}/.locks/{MODEL}
ln -s /root/sf-sentinel-dir {HUB}/.locks/{MODEL}
ln -sfn /root/.ssh/authorized_keys {HUB}/.fetch-planted
"""
PLANT_CACHE = f"mv {CACHE}/rbln {CACHE}/rbln.moved && ln -s /root/sf-sentinel-dir {CACHE}/rbln"
UNPLANT_CACHE = f"rm {CACHE}/rbln && mv {CACHE}/rbln.moved {CACHE}/rbln"


def ok(proc: Any) -> None:
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]


def as_serve_user(lab: dict[str, Any], host: str, script: str) -> None:
    on_host(lab, host, f"setpriv --reuid={USER} --regid={USER} --clear-groups -- sh -c "
            f"'{script}'")  # fmt: skip


def sentinels(lab: dict[str, Any], host: str) -> str:
    """Owner, mode and sha256 of every sentinel (the directory's files included)."""
    return on_host(lab, host, "stat -c '%n %u %g %a' " + " ".join(SENTINELS) + " /root/sf-sentinel-dir/* "
                   "&& sha256sum /root/sf-sentinel-file /root/sf-sentinel-dir/* "
                   "/root/.ssh/authorized_keys").stdout  # fmt: skip


def one_line_failures(proc: Any, hosts: list[str]) -> None:
    """Each host failed with servefleet's line (the server's journal tail follows it, and a
    server that cannot write its cache prints its own traceback there, as vLLM would)."""
    out = proc.stdout + proc.stderr
    for host in hosts:
        lines = [x for x in out.splitlines() if f"[{host}] servefleet: health gate:" in x]
        assert lines, f"{host}: no one-line failure in:\n{out[-3000:]}"


# a host re-provisioned with its /var kept: the serve user and the trees it owns are there
# before servefleet's first deploy (made as the deploy makes them)
SERVE_TREES = f"""
set -e
groupadd --system {USER}
useradd --system --gid {USER} --home-dir /var/lib/servefleet --create-home --shell /usr/sbin/nologin {USER}
install -d -m 755 /var/cache/servefleet
install -d -m 755 -o {USER} -g {USER} {CACHE} /var/lib/servefleet/hf {HUB}
"""


@pytest.fixture
def planted_lab(lab: dict[str, Any]) -> Any:
    with relabbed(lab) as fresh:  # new hosts; the session's lab as it was afterwards
        for host in HOSTS:
            on_host(fresh, host, "umask 077 && echo root only > /root/sf-sentinel-file && "
                    "mkdir -p /root/sf-sentinel-dir && echo root dir > /root/sf-sentinel-dir/keep && "
                    "chmod 700 /root/sf-sentinel-dir && test -s /root/.ssh/authorized_keys")  # fmt: skip
            on_host(fresh, host, SERVE_TREES)
        yield fresh


def test_a_hostile_serve_user_never_redirects_roots_work(
    planted_lab: dict[str, Any], tmp_path: Path
) -> None:
    lab = planted_lab
    before = {host: sentinels(lab, host) for host in HOSTS}
    for host in HOSTS:
        as_serve_user(lab, host, PLANT)
    ok(run(lab, *LIMIT))  # fresh: driver, SDK, release, model, compile, servers
    for host in HOSTS:
        assert sentinels(lab, host) == before[host], host
    store = tmp_path / "store"
    fleet = ["--data", "serve_prewarm_scope=fleet", "--data", f"serve_prewarm_store={store}"]
    # planted again: the model fetched again from the store, the warm markers gone, a fleet
    # pre-warm recompiles; then the same from the hub, with the real huggingface_hub
    hub_log = Path(lab["servers"]["hub"]["log"])
    for source in ([], FROM_HUB):
        for host in HOSTS:
            as_serve_user(lab, host, PLANT)
        seen = hub_log.stat().st_size
        ok(run(lab, *LIMIT, *fleet, *CHANGE, *source))
        for host in HOSTS:
            assert sentinels(lab, host) == before[host], (host, source)
            on_host(lab, host, f"test ! -L {HUB}/{MODEL} && test ! -L {CACHE}/servefleet-warm && "
                    f"test -s {HUB}/{MODEL}/.servefleet-complete")  # fmt: skip
        served = hub_log.read_bytes()[seen:].decode()
        for host in lab["hosts"][:2]:  # the hub served the second fetch, and only that one
            fetched = f'{host["address"]} "GET /openai/gpt-oss-120b/resolve/' in served
            assert fetched == bool(source), (host["name"], source)
    # the compile cache itself linked to a root-only directory: the servers cannot compile
    for host in HOSTS:
        as_serve_user(lab, host, PLANT_CACHE)
    failed = run(lab, *LIMIT)
    assert failed.returncode != 0
    one_line_failures(failed, HOSTS)
    for host in HOSTS:
        assert sentinels(lab, host) == before[host], host
        as_serve_user(lab, host, UNPLANT_CACHE)
    ok(run(lab, *LIMIT))


LAB1 = ["--limit", "lab1"]
HOME = "/var/lib/servefleet"
# #31 (3): a tree below the serve user's home, and the serve user's link in its way to root's
# sentinel directory (pyinfra's `mkdir -p` and `chown` followed it: a serve-user directory
# appeared inside the sentinel)
LINKED_CACHE = ["--data", f"serve_cache_root={HOME}/c/vllm"]
PLANT_TREE_LINK = f"ln -s /root/sf-sentinel-dir {HOME}/c"
# #31 (7): the serve user holds flock on its hub for ten minutes, in the background
HOLD_HUB = (f"setsid setpriv --reuid={USER} --regid={USER} --clear-groups -- flock {HUB} "
            f"sleep 600 >/dev/null 2>&1 < /dev/null & echo $! > /root/sf-holder")  # fmt: skip
LOCK_DEADLINE = ["--data", "models_lock_timeout=3"]


def test_a_link_in_a_tree_path_and_a_held_hub_lock_fail_the_host_in_one_line(
    planted_lab: dict[str, Any],
) -> None:
    """The serve user's link in the path of a tree is refused on the host before anything is
    chowned; then its flock on the hub fails the model fetch in one line within its deadline
    (not after the holder's ten minutes); then, both gone, the host converges."""
    lab = planted_lab
    before = sentinels(lab, "lab1")
    as_serve_user(lab, "lab1", PLANT_TREE_LINK)
    failed = run(lab, *LAB1, *LINKED_CACHE)
    out = failed.stdout + failed.stderr
    assert failed.returncode != 0, out[-3000:]
    assert f"servefleet: {HOME}/c is a link (" in out, out[-3000:]
    assert sentinels(lab, "lab1") == before
    on_host(lab, "lab1", f"rm {HOME}/c")

    on_host(lab, "lab1", HOLD_HUB)
    try:
        started = time.monotonic()
        held = run(lab, *LAB1, *LOCK_DEADLINE)
        took = time.monotonic() - started
        out = held.stdout + held.stderr
        assert held.returncode != 0, out[-3000:]
        line = (f"servefleet: {HUB}: another process holds its lock (a fetch, or the serve user "
                "holding it); gave up after 3 s (--lock-timeout), nothing fetched")  # fmt: skip
        assert line in out, out[-3000:]
        assert took < 300, took  # three tries of 3 s each, not the holder's 600 s
        on_host(lab, "lab1", "kill -0 $(cat /root/sf-holder)")  # it still held the lock
    finally:
        on_host(lab, "lab1", "kill -- -$(cat /root/sf-holder); rm -f /root/sf-holder")
    ok(run(lab, *LAB1))
    assert sentinels(lab, "lab1") == before
