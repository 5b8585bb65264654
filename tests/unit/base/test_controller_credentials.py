"""Credentials on the controller (issue #18): every download goes through one opener whose
redirects to another origin carry no Authorization header; an sdist's credentials are chosen by
its URL's origin; the subprocesses that run code from sdists get an allow-listed environment (and
run in the sandbox: tests/unit/release/test_index_code_sandbox.py)."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from servefleet.base.download import credentials_for, origin, same_origin
from servefleet.base.subenv import child_env
from servefleet.fleet import lockfleet
from servefleet.release import builds, owners, sdists
from servefleet.release.stack import basic_auth, stack

SECRET_ENV = {
    "HF_TOKEN": "hf_secret",
    "RBLN_INDEX_USER": "u",
    "RBLN_INDEX_PASSWORD": "index-secret",
    "UV_INDEX_RBLN_PASSWORD": "index-secret",
    "PATH": "/usr/bin:/bin",
    "LANG": "C.UTF-8",
}


class _Recorder(http.server.BaseHTTPRequestHandler):
    seen: list[dict[str, str]] = []
    target = ""

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        if self.path.startswith("/redirect"):
            self.send_response(302)
            self.send_header("Location", self.target + "/landing")
            self.end_headers()
            return
        type(self).seen.append(dict(self.headers))
        body = b"{}"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture()
def two_origins() -> Iterator[tuple[str, list[dict[str, str]]]]:
    """A server on 127.0.0.1 that redirects to another origin (another port), which records
    the headers it is sent."""
    _Recorder.seen = []
    servers = [http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder) for _ in range(2)]
    for s in servers:
        threading.Thread(target=s.serve_forever, daemon=True).start()
    first, other = (f"http://127.0.0.1:{s.server_address[1]}" for s in servers)
    _Recorder.target = other
    try:
        yield first + "/redirect", _Recorder.seen
    finally:
        for s in servers:
            s.shutdown()
            s.server_close()


def auth_stack() -> Any:
    """A stack whose one index, with auth, owns its one package."""
    auth = {"name": "rbln", "url": "https://pypi.example/simple", "packages": ["x"], "auth": True}
    return stack("s", ["x==1"], [], [auth], None, ">=3.10", [])


def test_the_lock_owner_check_drops_basic_auth_on_a_redirect_to_another_origin(
    two_origins: tuple[str, list[dict[str, str]]],
) -> None:
    url, seen = two_origins
    assert owners._get(url, ("u", "index-secret")) == 200
    assert seen and all("Authorization" not in h for h in seen)


def test_the_store_manifest_fetch_drops_the_token_on_a_redirect_to_another_origin(
    two_origins: tuple[str, list[dict[str, str]]],
) -> None:
    url, seen = two_origins
    assert lockfleet._fetch(url, {"Authorization": "Bearer hf_secret"}) == b"{}"
    assert seen and all("Authorization" not in h for h in seen)


def test_an_sdist_download_drops_credentials_on_a_redirect_to_another_origin(
    two_origins: tuple[str, list[dict[str, str]]], tmp_path: Path
) -> None:
    url, seen = two_origins
    sdists.fetch(url, tmp_path / "x.tar.gz", basic_auth("u", "index-secret"))
    assert seen and all("Authorization" not in h for h in seen)


def test_sdist_credentials_follow_the_url_origin_not_the_index_a_lock_names() -> None:
    st = auth_stack()
    own = builds._auth_headers(st, "https://pypi.example/packages/x-1.tar.gz", "u", "p")
    assert own == basic_auth("u", "p")
    # a lock whose URL alone was edited (its entry still names the rbln index) gets none
    assert builds._auth_headers(st, "https://evil.example/x-1.tar.gz", "u", "p") == {}
    assert builds._auth_headers(st, "http://pypi.example/x-1.tar.gz", "u", "p") == {}
    assert origin("https://A.example/x") == origin("https://a.example:443/y")
    assert (
        credentials_for("https://a.example:8443/x", ["https://a.example/simple"], {"k": "v"}) == {}
    )


def test_same_origin_compares_scheme_host_and_port_exactly() -> None:
    """#46 item 3: the one test of where a credential may go."""
    allowed = ["https://Store.example/models", "http://127.0.0.1:8000/simple"]
    assert same_origin("https://store.example:443/org/m.tar.gz", allowed)
    assert same_origin("http://127.0.0.1:8000/files/x.whl", allowed)
    for other in ("http://store.example/models", "https://store.example:8443/models",
                  "https://store.example.evil/models", "https://evil.example/store.example",
                  "http://127.0.0.1:8001/simple", "http://127.0.0.2:8000/simple",
                  "https://store.example:x/models", "file:///models", "/models"):  # fmt: skip
        assert not same_origin(other, allowed), other
    assert not same_origin("file:///a", ["file:///a"])  # no host: no origin
    assert not same_origin("https://store.example/m", [])


def test_the_build_environment_is_an_allow_list_without_secrets() -> None:
    env = child_env({"UV_NO_PROGRESS": "1"}, secrets=["LANG"], environ=SECRET_ENV)
    assert env == {"PATH": "/usr/bin:/bin", "UV_NO_PROGRESS": "1"}


def _netrc_py310(text: str) -> dict[str, tuple[str, str]]:
    """The machines of a netrc as Python 3.10's ``netrc`` module reads it: shlex, every
    punctuation character a word character (quotes and backslashes stay part of a word)."""
    import shlex

    lexer = shlex.shlex(text)
    lexer.wordchars += r"""!"#$%&'()*+,-./:;<=>?@[\]^_`{|}~"""
    lexer.commenters = lexer.commenters.replace("#", "")
    words = list(iter(lexer.get_token, lexer.eof))
    machines = {}
    for i in range(0, len(words), 6):
        machine, host, login, user, password, secret = words[i : i + 6]
        assert (machine, login, password) == ("machine", "login", "password")
        machines[host] = (user, secret)
    return machines


def _data(password: str) -> tuple[Any, dict[str, str]]:
    from servefleet.settings.table import load_defaults

    data = load_defaults()
    env = {"RBLN_INDEX_USER": "lab-u1", "RBLN_INDEX_PASSWORD": password}
    return data, env


@pytest.mark.parametrize("password", ["pw", "x#h$!;&|<>(*)`-_=+%@", "#lead"])
def test_the_netrc_holds_bare_tokens_every_netrc_lexer_reads_alike(
    tmp_path: Path, password: str
) -> None:
    import netrc

    from servefleet.entry.steps.credentials import netrc as netrc_text
    from servefleet.settings.table import settings_from

    data, env = _data(password)
    text = netrc_text(settings_from(data.get, env))
    assert text and '"' not in text
    path = tmp_path / "netrc"
    path.write_text(text)
    path.chmod(0o600)
    new = netrc.netrc(str(path)).hosts  # this Python's lexer (3.11+: unquotes, unescapes)
    old = _netrc_py310(text)
    assert {h: (login, pw) for h, (login, _, pw) in new.items()} == old
    assert set(old.values()) == {("lab-u1", password)}


@pytest.mark.parametrize(
    "password", ["with space", 'q"uote', "q'uote", "back\\slash", "tab\t", "é"]
)
def test_a_credential_a_bare_netrc_token_cannot_carry_is_refused_in_one_line(
    password: str,
) -> None:
    from servefleet.base.errors import DataError
    from servefleet.settings.table import settings_from

    data, env = _data(password)
    with pytest.raises(DataError) as e:
        settings_from(data.get, env)
    line = str(e.value)
    assert "\n" not in line and line.startswith("creds_index_password_env: ")
    assert "RBLN_INDEX_PASSWORD" in line and "allowed: printable ASCII" in line
    assert password not in line
