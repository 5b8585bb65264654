"""Fixtures of the unit tests.

``index``: two PEP 503 "simple" indexes (the lab's index server) on 127.0.0.1, no real registry:
``owner`` holds the owned package ``sfowned`` behind HTTP Basic auth (credentials from a
netrc, as on a host); ``public`` holds everything else and a squatter ``sfowned 9.0``.
``reachable``: a directory ``nobody`` can reach, for a release the installer checks as nobody.

The simulator's fixtures (``sim``, ``builder``, ``out``, ``venv``, ``simroot``, ``sim_env``,
``gpu_venv``, ...) are sim_fixtures.py's, and ``fleet`` (an inventory in an empty working
directory) is fake_pyinfra.py's: each is registered here once for every module that uses it. No
test module imports another: what two of them share is a helper module here (not ``test_*``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
from fake_host import serving
from fake_pyinfra import fleet  # noqa: F401 (a fixture: pytest finds it by name here)
from local_indexes import OWNER_LOGIN, PACKAGES
from local_release import reachable_dir
from sim_fixtures import (  # noqa: F401 (fixtures: pytest finds them by name here)
    builder,
    clean_links,
    fakebin,
    gpu_venv,
    hf_home,
    manifest,
    out,
    sim,
    sim_env,
    simroot,
    venv,
)

from servefleet.fleet.lab.index import Config, make_server
from servefleet.fleet.lab.simulator import wheels as lab_wheels


@pytest.fixture(scope="session")
def index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Index name (owner, public, netrc) -> its simple URL (the netrc: its path)."""
    root = tmp_path_factory.mktemp("indexes")
    netrc = root / "netrc"
    netrc.write_text("machine 127.0.0.1 login {} password {}\n".format(*OWNER_LOGIN))
    netrc.chmod(0o600)
    urls = {"netrc": str(netrc)}
    with ExitStack() as stack:
        for name, packages in PACKAGES.items():
            for package, version, files, requires in packages:
                lab_wheels.write_wheel(root / name, package, version, files, requires)
            basic = OWNER_LOGIN if name == "owner" else None
            server = make_server(Config("simple", root / name, basic=basic), "127.0.0.1", 0)
            urls[name] = stack.enter_context(serving(server)) + "/simple/"
        yield urls


@pytest.fixture()
def reachable() -> Iterator[Path]:
    """A new directory ``nobody`` can reach (pytest's own are root's 0700), removed after."""
    with reachable_dir() as path:
        yield path
