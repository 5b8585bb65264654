"""Helpers for the simulator's unit tests (sim_fixtures.py, test_lab_sim.py, ...): load the
simulator's builder and the simulated server's modules from src/servefleet/fleet/lab/simulator/
(sources, not servefleet modules), make throwaway venvs, run the simulation, talk to a simulated
server (one request, a stream read event by event)."""

from __future__ import annotations

import atexit
import contextlib
import functools
import importlib.util
import itertools
import json
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http import client as httpc
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType
from typing import Any

from servefleet.base.vllm_reference import reference

REPO = Path(__file__).resolve().parents[2]
SIMULATOR = REPO / "src" / "servefleet" / "fleet" / "lab" / "simulator"
SQUATTERS = {
    "rebel_compiler-0.12.0-py3-none-any.whl",
    "lmcache_rbln-0.12.0.post1-py3-none-any.whl",
    "nixl_rbln-0.12.0.post1-py3-none-any.whl",
}
PIP_ENV = {"PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


def upstream_root(tmp_path: Path, monkeypatch: Any) -> Path:
    """A simulation root (``$RBLN_SIM_ROOT``) whose platform file says upstream, and the current
    directory ``tmp_path/cwd``; returns the root.

    + tmp_path: the test's directory
    + monkeypatch: the test's ``pytest.MonkeyPatch``
    """
    root = tmp_path / "root"
    (root / "etc/rbln-sim").mkdir(parents=True)
    (root / "etc/rbln-sim/platform").write_text("upstream\n")
    monkeypatch.setenv("RBLN_SIM_ROOT", str(root))
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    return root


def load(path: Path, name: str) -> ModuleType:
    """Import a file of the simulator under a private module name."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@functools.cache
def sim_vllm() -> Path:
    """The simulated vllm package laid out as its wheel has it: the sources of
    ``packages/vllm`` and, in ``flags/``, the reference data the build copies there
    (``servefleet/reference/vllm/<version>``); links, in a directory removed at exit."""
    top = Path(tempfile.mkdtemp(prefix="servefleet-sim-vllm-"))
    atexit.register(shutil.rmtree, top, True)
    package = top / "vllm"
    package.mkdir()
    for entry in sorted((SIMULATOR / "packages" / "vllm").iterdir()):
        if entry.name != "__pycache__":
            (package / entry.name).symlink_to(entry, target_is_directory=entry.is_dir())
    (package / "flags").mkdir()
    for path in reference().files():
        (package / "flags" / path.name).symlink_to(path)
    return package


def load_sim(name: str) -> ModuleType:
    """The simulated server's entry module ``vllm.sim``, its package (the simulated vllm, whose
    modules import each other relatively; :func:`sim_vllm`) imported under the private name
    ``name``."""
    package = sim_vllm()
    spec = importlib.util.spec_from_file_location(
        name, package / "__init__.py", submodule_search_locations=[str(package)]
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return importlib.import_module(f"{name}.sim")


@contextlib.contextmanager
def serve_in_process(handler: type[BaseHTTPRequestHandler]) -> Iterator[int]:
    """``handler`` (the simulated HTTP API's, ``http_api._make_handler``) on a loopback port in
    this process, a thread per connection as the server runs it; yields the port."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield httpd.server_address[1]
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(10)


def metadata(wheel: Path) -> list[tuple[str, str]]:
    """The METADATA headers of a wheel, in order."""
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        text = zf.read(name).decode()
    return [tuple(line.split(": ", 1)) for line in text.splitlines() if ": " in line]  # type: ignore[misc]


def pip(python: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """This interpreter's pip, isolated, acting on the environment of ``python`` (which needs no
    pip of its own: the venvs here are made without one, in a fraction of the time)."""
    env = dict(os.environ, **PIP_ENV)
    cmd = [sys.executable, "-m", "pip", "--isolated", "--python", str(python), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc


def site_packages(venv: Path) -> Path:
    return next((venv / "lib").glob("python3*/site-packages"))


def derived_venv(
    base: Path, dest: Path, drop: tuple[str, ...] = (), wheels: tuple[Path, ...] = ()
) -> Path:
    """A copy of venv ``base`` without the top-level packages ``drop`` and with ``wheels``
    unpacked over it; returns its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(dest)], check=True)
    target = site_packages(dest)
    shutil.rmtree(target)
    shutil.copytree(
        site_packages(base), target, ignore=lambda d, names: [n for n in names if n in drop]
    )
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as zf:
            zf.extractall(target)
    return dest / "bin" / "python"


def extract_model(tgz: Path, hf_home: Path) -> None:
    (hf_home / "hub").mkdir(parents=True, exist_ok=True)
    with tarfile.open(tgz) as tar:
        tar.extractall(hf_home / "hub")


_PORTS = itertools.count()  # this process's next candidate in its own block


def free_port() -> int:
    """A loopback port for a test server to listen on, free now. Not the kernel's port 0: that
    is drawn from the ephemeral range, where the outgoing connections of everything else on the
    machine (a lab's SSH, the other xdist worker's clients) take ports too, so one could take it
    between this check and the server's bind. Each xdist worker has a block of its own below the
    ephemeral range (20000-31999: 12 blocks of 1000), gone through in order."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    block = 20000 + (int(worker) % 12 if worker.isdigit() else 0) * 1000
    for _ in range(1000):
        port = block + next(_PORTS) % 1000
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue  # held by something else: the next one
            return port
    raise RuntimeError(f"no free loopback port in {block}-{block + 999}")


def http(port: int, path: str, body: Any = None) -> tuple[int, bytes]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


class Server:
    """A running simulated ``vllm serve`` (stopped with SIGTERM)."""

    def __init__(self, cmd: list[str], env: dict[str, str], port: int) -> None:
        self.port = port
        self.proc = subprocess.Popen(
            cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )

    def wait_ready(self, timeout: float = 30, path: str = "/v1/models") -> None:
        """Wait until GET ``path`` answers 200 (an API key guards /v1: then ask /health)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                out, err = self.proc.communicate()
                raise AssertionError(f"server exited {self.proc.returncode}:\n{err}")
            try:
                status, _ = http(self.port, path)
                if status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        self.stop()
        raise AssertionError("server did not come up")

    def stop(self) -> tuple[int, str]:
        if self.proc.poll() is None:
            self.proc.terminate()
        _, err = self.proc.communicate(timeout=10)
        return self.proc.returncode, err


# Requests to a simulated server (test_sim_serving.py, test_sim_pd.py)


def request(
    port: int, method: str, path: str, body: Any = None, key: str | None = None
) -> tuple[int, bytes]:
    """One request on its own connection; (status, body)."""
    conn = httpc.HTTPConnection("127.0.0.1", port, timeout=10)
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = key
    try:
        conn.request(method, path, None if body is None else json.dumps(body), headers)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


@dataclass
class Stream:
    """A streamed answer read event by event: the events' JSON, whether ``[DONE]`` came, and
    whether the connection was cut before the body's end."""

    status: int = 0
    events: list[dict[str, Any]] = field(default_factory=list)
    done: bool = False
    cut: bool = False
    first: threading.Event = field(default_factory=threading.Event)  # an event arrived

    def tokens(self) -> list[str]:
        out = []
        for e in self.events:
            for c in e["choices"]:
                out.append(c["delta"].get("content", "") if "delta" in c else c["text"])
        return [t for t in out if t]


def read_stream(port: int, path: str, body: dict[str, Any], into: Stream) -> Stream:
    """POST ``body`` with ``"stream": true`` and read its server-sent events into ``into``."""
    conn = httpc.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("POST", path, json.dumps(dict(body, stream=True)),
                     {"Content-Type": "application/json"})  # fmt: skip
        resp = conn.getresponse()
        into.status = resp.status
        assert resp.getheader("Content-Type", "").startswith("text/event-stream")
        buffer = b""
        while True:  # read1 raises IncompleteRead on a cut chunked body (readline hides it)
            data = resp.read1(65536)
            if not data:
                break
            buffer += data
            while b"\n\n" in buffer:
                event, buffer = buffer.split(b"\n\n", 1)
                assert event.startswith(b"data: "), event
                if event == b"data: [DONE]":
                    into.done = True
                else:
                    into.events.append(json.loads(event[6:]))
                    if into.tokens():
                        into.first.set()
        assert buffer == b"", buffer
    except (httpc.IncompleteRead, ConnectionError):
        into.cut = True
    finally:
        into.first.set()
        conn.close()
    return into


def wait_for(what: str, check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)
