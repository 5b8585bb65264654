"""src/servefleet/base/remote/fetch_model.py's command line and token file, in-process (#37: a
mutant of the host program is active only in the test's own process): each option's default,
the one source it wants, every refusal's exact line and exit 2, the bounds of each number
(either side), the first problem named when there are several, the store and hub URL rules
(http or https with a host, no query, no credentials), and the token file (only its owner may
read it, one token, stripped)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from fetch_stubs import MODEL, TOKEN, write_token
from repo_paths import REMOTE

sys.path.insert(0, str(REMOTE))
import fetch_model  # noqa: E402
import refusal  # noqa: E402
import retry  # noqa: E402

STORE = ["--store", "http://store.invalid/m"]


def args(*more: str, model: str = MODEL, home: str = "/hf") -> list[str]:
    """A command line as the deploy gives it: options, then ``--`` and the positionals."""
    return [*more, "--", model, home, "nobody"]


def refusal_of(argv: list[str]) -> str:
    """The line parse_args refuses argv with (exit 2), without the ``fetch_model.py: `` prefix."""
    with pytest.raises(refusal.Refusal) as got:
        fetch_model.parse_args(argv)
    assert got.value.code == 2, got.value.code
    line = str(got.value)
    assert line.startswith("fetch_model.py: "), line
    return line[len("fetch_model.py: ") :]


def test_the_defaults() -> None:
    a = fetch_model.parse_args(args(*STORE))
    assert (a.model, a.hf_home, a.owner) == (MODEL, Path("/hf"), "nobody")
    assert isinstance(a.hf_home, Path)
    assert (a.store, a.hub, a.archive, a.endpoint) == ("http://store.invalid/m", None, None, None)
    assert (a.token_file, a.token_env, a.revision, a.sha256) == (None, None, None, None)
    assert (a.timeout, a.lock_timeout) == (60.0, 600.0)
    assert (a.tries, a.retry_wait) == (retry.TRIES, retry.FIRST_WAIT) == (5, 1.0)


def test_every_option_is_read() -> None:
    a = fetch_model.parse_args(
        args("--hub", "/venv/bin/python", "--endpoint", "https://hub.invalid", "--token-file",
             "/t", "--token-env", "HF_TOKEN", "--revision", "a" * 40, "--sha256", "B" * 64,
             "--timeout", "2.5", "--lock-timeout", "7", "--tries", "3", "--retry-wait", "0.5")
    )  # fmt: skip
    assert (a.hub, a.endpoint, a.token_file, a.token_env) == (
        "/venv/bin/python", "https://hub.invalid", "/t", "HF_TOKEN"
    )  # fmt: skip
    assert (a.revision, a.sha256) == ("a" * 40, "b" * 64)  # the sha256 lowercased
    assert (a.timeout, a.lock_timeout, a.tries, a.retry_wait) == (2.5, 7.0, 3, 0.5)
    assert fetch_model.parse_args(args("--archive", "/a.tgz", "--sha256", "c" * 64)).archive == (
        "/a.tgz"
    )


def test_one_source_and_only_one() -> None:
    assert refusal_of(args()) == "one of the arguments --store --hub --archive is required"
    assert refusal_of(args(*STORE, "--hub", "/p")) == (
        "argument --hub: not allowed with argument --store"
    )
    assert refusal_of(args(*STORE, "--archive", "/a")) == (
        "argument --archive: not allowed with argument --store"
    )


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (args(*STORE, model="acme"), "'acme' is not a model id ORG/NAME of [A-Za-z0-9._-] (no '..')"),
        (args(*STORE, home="hf"), "HF_HOME must be an absolute path, not hf"),
        (args(*STORE, "--revision", "A" * 40), f"--revision {'A' * 40!r} is not a commit hash (40 lowercase hex digits)"),
        (args(*STORE, "--sha256", "abc"), "--sha256 'abc' is not 64 hex digits"),
        (args("--archive", "/a.tgz"), "--archive needs --sha256"),
        (args(*STORE, "--timeout", "0"), "--timeout must be above 0, not 0"),
        (args(*STORE, "--timeout", "-1.5"), "--timeout must be above 0, not -1.5"),
        (args(*STORE, "--lock-timeout", "0"), "--lock-timeout must be above 0, not 0"),
        (args(*STORE, "--tries", "0"), "--tries must be 1 to 20, not 0"),
        (args(*STORE, "--tries", "21"), "--tries must be 1 to 20, not 21"),
        (args(*STORE, "--retry-wait", "-0.5"), "--retry-wait must be 0 to 60 seconds, not -0.5"),
        (args(*STORE, "--retry-wait", "60.5"), "--retry-wait must be 0 to 60 seconds, not 60.5"),
        (args(*STORE, "--token-env", "HF-TOKEN"), "--token-env 'HF-TOKEN' is not a variable name"),
        (args(*STORE, "--endpoint", "http://h.invalid"), "--endpoint goes with --hub"),
        (args("--store", "ftp://s.invalid/m"), "--store 'ftp://s.invalid/m' is not an http(s) URL"),
        (args("--store", "http:///m"), "--store 'http:///m' is not an http(s) URL"),
        (args("--store", "http://s.invalid/m?k=v"), "--store 'http://s.invalid/m?k=v' is not an http(s) URL"),
        (args("--store", "http://u@s.invalid/m"), "--store must not carry credentials; give --token-file"),
        (args("--store", "http://:p@s.invalid/m"), "--store must not carry credentials; give --token-file"),
        (args("--hub", "/p", "--endpoint", "hub.invalid"), "--endpoint 'hub.invalid' is not an http(s) URL"),
        (args("--hub", "/p", "--endpoint", "https://u:p@h.invalid"), "--endpoint must not carry credentials; give --token-file"),
    ],
)  # fmt: skip
def test_each_refusal_is_its_line_and_exit_2(argv: list[str], line: str) -> None:
    assert refusal_of(argv) == line


def test_an_unknown_option_is_refused_with_exit_2() -> None:
    assert refusal_of(["--mirror", *args(*STORE)]) == "unrecognized arguments: --mirror"


@pytest.mark.parametrize(
    "more",
    [
        ["--timeout", "0.001"],
        ["--lock-timeout", "0.001"],
        ["--tries", "1"],
        ["--tries", "20"],
        ["--retry-wait", "0"],
        ["--retry-wait", "60"],
        ["--token-env", "_HF_TOKEN_2"],
        ["--revision", "0123456789abcdef0123456789abcdef01234567"],
        ["--sha256", "0123456789ABCDEF" * 4],
    ],
)
def test_the_bounds_are_taken(more: list[str]) -> None:
    fetch_model.parse_args(args(*STORE, *more))


@pytest.mark.parametrize(
    "url", ["http://s.invalid/m", "https://s.invalid/m", "HTTPS://S.invalid:8443/m"]
)
def test_http_and_https_stores_and_endpoints_are_taken(url: str) -> None:
    assert fetch_model.parse_args(args("--store", url)).store == url
    assert fetch_model.parse_args(args("--hub", "/p", "--endpoint", url)).endpoint == url


def test_the_first_problem_is_the_one_named() -> None:
    """With every argument wrong, the line names the model; with all but it wrong, HF_HOME, and
    so on down: each check runs only while nothing is wrong yet."""
    wrong = [
        ("model", "acme"),
        ("home", "hf"),
        ("--revision", "main"),
        ("--sha256", "abc"),
        ("--timeout", "0"),
        ("--lock-timeout", "0"),
        ("--tries", "0"),
        ("--retry-wait", "-1"),
        ("--token-env", "A B"),
        ("--endpoint", "ftp://h.invalid"),
    ]
    lines = []
    for first in range(len(wrong)):
        kw = {k: v for k, v in wrong[first:] if k in ("model", "home")}
        options = [x for k, v in wrong[first:] if k.startswith("--") for x in (k, v)]
        lines.append(refusal_of(args("--hub", "/p", *options, **kw)).split(" ")[0])
    assert lines == [
        "'acme'", "HF_HOME", "--revision", "--sha256", "--timeout", "--lock-timeout", "--tries",
        "--retry-wait", "--token-env", "--endpoint",
    ]  # fmt: skip
    # --archive without --sha256 comes after the sha256's own check and before the timeout's
    assert refusal_of(args("--archive", "/a", "--timeout", "0")) == "--archive needs --sha256"
    # an endpoint without --hub is named before either URL
    assert refusal_of(args("--store", "ftp://s", "--endpoint", "ftp://h")).startswith(
        "--endpoint goes"
    )
    assert (
        refusal_of(args("--hub", "/p", "--endpoint", "http://u@h.invalid", "--timeout", "0"))
        == "--timeout must be above 0, not 0"
    )


def test_a_bad_model_id_names_it_and_a_good_one_is_none() -> None:
    assert fetch_model.bad_model_id(MODEL) is None
    assert fetch_model.bad_model_id("acme/../x") == (
        "'acme/../x' is not a model id ORG/NAME of [A-Za-z0-9._-] (no '..')"
    )


# --- the token file ------------------------------------------------------------------------------
def test_the_token_is_read_stripped_from_a_file_only_its_owner_reads(tmp_path: Path) -> None:
    path = write_token(tmp_path / "t", "  " + TOKEN + "\n\n")
    assert fetch_model.read_token(str(path)) == TOKEN
    path.chmod(0o400)
    assert fetch_model.read_token(str(path)) == TOKEN


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o610, 0o601, 0o620, 0o602])
def test_a_token_file_open_to_others_is_refused(tmp_path: Path, mode: int) -> None:
    path = write_token(tmp_path / "t")
    path.chmod(mode)
    with pytest.raises(refusal.Refusal) as got:
        fetch_model.read_token(str(path))
    assert str(got.value) == f"the token file {path} is open to others (mode {mode:o}); chmod 600"
    assert got.value.code == 1


@pytest.mark.parametrize("text", ["", "\n", "two words\n", "tab\there", "caf\u00e9"])
def test_a_token_file_without_one_token_is_refused(tmp_path: Path, text: str) -> None:
    path = write_token(tmp_path / "t", text)
    with pytest.raises(refusal.Refusal) as got:
        fetch_model.read_token(str(path))
    assert str(got.value) == f"the token file {path} does not hold one token"


def test_a_token_file_that_cannot_be_read_is_refused(tmp_path: Path) -> None:
    missing = tmp_path / "none"
    with pytest.raises(refusal.Refusal) as got:
        fetch_model.read_token(str(missing))
    assert str(got.value) == (
        f"cannot read the token file {missing}: [Errno 2] No such file or directory: '{missing}'"
    )
    binary = tmp_path / "binary"
    binary.write_bytes(b"\xff\xfe")
    binary.chmod(0o600)
    with pytest.raises(refusal.Refusal) as got:
        fetch_model.read_token(str(binary))
    assert str(got.value).startswith(f"cannot read the token file {binary}: 'utf-8' codec")


HELP = """\
usage: fetch_model.py [-h] (--store URL | --hub PYTHON | --archive FILE) [--endpoint URL]
                      [--token-file FILE] [--token-env NAME] [--revision REV] [--sha256 HEX]
                      [--timeout SECONDS] [--lock-timeout SECONDS] [--tries N]
                      [--retry-wait SECONDS]
                      model hf_home owner

Fetch a model into $HF_HOME/hub.

positional arguments:
  model                 ORG/NAME
  hf_home               absolute path of HF_HOME
  owner                 the user (and its primary group) to own the files

options:
  -h, --help            show this help message and exit
  --store URL           a model store (http or https)
  --hub PYTHON          a python with huggingface_hub
  --archive FILE        a local archive (needs --sha256)
  --endpoint URL        the hub's address (HF_ENDPOINT), with --hub
  --token-file FILE     the token (a 0600 file)
  --token-env NAME      the controller's variable of the token
  --revision REV        pin this commit (40 hex digits)
  --sha256 HEX          the store archive's sha256
  --timeout SECONDS
  --lock-timeout SECONDS
  --tries N             the most tries of a request that fails transiently
  --retry-wait SECONDS  seconds before the second try, doubled before each next one
"""


def test_the_help_an_operator_reads_on_the_host(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``fetch_model.py -h``: each option's metavar and help as the module's usage line says."""
    monkeypatch.setenv("COLUMNS", "100")
    with pytest.raises(SystemExit) as done:
        fetch_model.parse_args(["-h"])
    assert done.value.code == 0
    assert capsys.readouterr().out == HELP
