"""Deploy data (servefleet.settings.table): every key is refused for a wrong type, a wrong value and a
misspelling, with one line that starts with the key; the defaults and the lab's data validate.

The cases pyinfra's ``--data key=value`` can express live in bad_data_cases.py (a lab test
reuses them); the ones only Python data can express (mappings, lists) are here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from bad_data_cases import BAD_DATA_CASES, MISSPELLED, WRONG_TYPE, WRONG_VALUE
from pyinfra_cli.util import parse_cli_arg

from servefleet.base.errors import DataError
from servefleet.fleet.lab import groupdata, layout
from servefleet.settings.check_names import parse_pins
from servefleet.settings.check_paths import SYSTEM_DIRS
from servefleet.settings.table import KEYS, load_defaults, settings_from

CREDS = {"RBLN_INDEX_USER": "u", "RBLN_INDEX_PASSWORD": "p"}
SHA = "0123456789abcdef" * 4
REV = "0123456789abcdef0123456789abcdef01234567"
PINS = ["rebel-compiler==0.12.0", "vllm-rbln==0.12.0"]
INDEX = {"url": "https://idx.example/simple", "packages": ["torch"]}
LAB_STATE = {  # the parts of a running lab's state group_data/lab.py reads
    "indexes": {
        name: layout.url(port, "/simple/")
        for name, port in [
            ("private", layout.PORT_INDEX_PRIVATE),
            ("vllm", layout.PORT_INDEX_VLLM),
            ("torch", layout.PORT_INDEX_TORCH),
            ("public", layout.PORT_INDEX_PUBLIC),
        ]
    },
    "driver": {"3.5.1": {"sha256": SHA}, "3.6.0": {"sha256": SHA}},
    "apt": {"url": layout.url(layout.PORT_APT), "suite": "./", "key": str(layout.APT_KEY_FILE)},
}


def lab_data() -> dict[str, Any]:
    """The defaults overlaid with group_data/lab.py's values for a running lab."""
    with mock.patch.object(groupdata, "load_state", return_value=LAB_STATE):
        return {**load_defaults(), **groupdata.lab_group_data()}


BASES = {"defaults": load_defaults(), "lab": lab_data()}


def validate(keys: bool = False, base: str = "defaults", **over: Any):  # type: ignore[no-untyped-def]
    data = {**BASES[base], **over}
    return settings_from(data.get, CREDS, keys=data.keys() if keys else None)


def refused(keys: bool = False, base: str = "defaults", **over: Any) -> str:
    """The one line DataError refusing ``over`` on top of ``base``."""
    with pytest.raises(DataError) as e:
        validate(keys, base, **over)
    message = str(e.value)
    assert len(message.splitlines()) == 1, message
    assert "Traceback" not in message and "pydantic" not in message
    return message


# Mappings and lists: what only group_data / inventory data (Python) can express
PYTHON_CASES: list[tuple[str, object, str]] = [
    ("serve_open_paths", ["/v1/", "/v1/../invocations"], "serve_open_paths: '/v1/../invocations' is not an HTTP path; allowed: a path of [A-Za-z0-9._~/-] starting with '/'"),
    ("serve_open_paths", ["invocations"], "serve_open_paths: 'invocations' is not an HTTP path"),
    ("driver_sha256", {"3.5.1": "ABC"}, "driver_sha256.3.5.1: 'ABC' is not a sha256; allowed: 64 lowercase hex digits"),
    ("driver_sha256", {"3.5.1": SHA.upper()}, "driver_sha256.3.5.1: '0123456789ABCDEF"),
    ("driver_sha256", {"3.x": SHA}, "driver_sha256: '3.x' is not a PEP 440 version"),
    ("driver_installer_args", ["--silent", "a\nb"], "driver_installer_args: 'a\\nb' holds a control character"),
    ("driver_installer_args", ["--x", 5], "driver_installer_args: expected a string, got 5"),
    ("driver_apt_packages", ["dkms", "Linux-Headers"], "driver_apt_packages: 'Linux-Headers' is not a Debian package name"),
    ("driver_apt_packages", ["linux-headers-{arch}"], "'linux-headers-{arch}' is not a Debian package name"),
    ("driver_apt_repo", {"src": "deb http://x/ ./", "keys": "/k"}, "driver_apt_repo: 'keys' is not a field (did you mean key?); allowed: src, key"),
    ("driver_apt_repo", {"key": "/k"}, "driver_apt_repo: has no 'src'"),
    ("driver_apt_repo", {"src": "deb http://x/ ./\ndeb http://y/ ./"}, "driver_apt_repo.src: 'deb http://x/ ./\\ndeb http://y/ ./' holds a control character"),
    ("driver_apt_repo", {"src": "rpm http://x/"}, "driver_apt_repo.src: 'rpm http://x/' is not a deb source line"),
    ("driver_apt_repo", {"src": "deb http://u:hunter2@x/ ./"}, "driver_apt_repo.src: credentials do not belong in data"),
    ("driver_apt_repo", {"src": "deb http://x/ ./", "key": "/k"}, "driver_apt_repo: '/k' is given but src has no [signed-by=KEYRING]"),
    ("sdk_pins", ["rebel-compiler>=0.12.0", "vllm-rbln==0.12.0"], "sdk_pins: 'rebel-compiler>=0.12.0' is not an exact pin"),
    ("sdk_pins", ["rebel-compiler==0.12.0"], "sdk_pins: vllm-rbln must be pinned"),
    ("sdk_pins", [*PINS, "Vllm_Rbln==0.12.1"], "sdk_pins: 'Vllm_Rbln==0.12.1' pins vllm-rbln a second time"),
    ("sdk_pins", [*PINS, "torch==2.*"], "sdk_pins: 'torch==2.*' has a bad version: '2.*' is not a PEP 440 version"),
    ("sdk_pins", [*PINS, 5], "sdk_pins: expected a 'name==version' string, got 5"),
    ("sdk_extra_packages", {"kv-connectors": "lmcache-rbln"}, "sdk_extra_packages.kv-connectors: expected a list, got 'lmcache-rbln'"),
    ("sdk_extra_packages", {"kv-connectors": ["left-pad"]}, "sdk_extra_packages.kv-connectors: left-pad has no pin in sdk_pins; allowed: one of"),
    ("sdk_extra_packages", {"kv connectors": []}, "sdk_extra_packages: 'kv connectors' is not a package name"),
    ("sdk_python", "/usr/bin/../python3", "sdk_python: '/usr/bin/../python3' is not normalised"),
    ("pip_indexes", {"rbln": {"url": "https://u:p@idx/simple", "packages": ["rebel-compiler"]}}, "pip_indexes.rbln.url: credentials do not belong in data"),
    ("pip_indexes", {"x": {**INDEX, "packages": ["left-pad"]}}, "pip_indexes.x: left-pad has no pin in sdk_pins"),
    ("pip_indexes", {"x": {**INDEX, "auth": "true"}}, "pip_indexes.x.auth: expected true or false, got 'true'; allowed: True or False"),
    ("pip_indexes", {"x": {"urll": "https://idx/simple", "packages": ["torch"]}}, "pip_indexes.x: 'urll' is not a field (did you mean url?); allowed: url, packages, auth, glibc"),
    ("pip_indexes", {"x": {"url": "https://idx/simple"}}, "pip_indexes.x: has no 'packages'"),
    ("pip_indexes", {"x": {**INDEX, "packages": []}}, "pip_indexes.x.packages: [] is empty"),
    ("pip_indexes", {"a": INDEX, "b": INDEX}, "pip_indexes.b.packages: torch is owned by the a index already"),
    ("pip_indexes", {"my index": INDEX}, "pip_indexes: 'my index' is not an index name"),
    ("pip_indexes", {"x": {**INDEX, "url": "http://idx.example/simple"}}, "pip_indexes.x.url: 'http://idx.example/simple' is http on idx.example"),
    ("pip_trusted_hosts", ["10.213.0.1", "bad host"], "pip_trusted_hosts: 'bad host' is not an IP address or a host name"),
    ("serve_selection", {"lmcache": 1}, "serve_selection.lmcache: expected a string, got 1"),
    ("serve_selection", {"lm cache": "cpu"}, "serve_selection: 'lm cache' is not an axis name"),
    ("serve_selection", {"lmcache": "$HOME"}, "serve_selection.lmcache: '$HOME' is not an axis value"),
    ("models_revisions", {"gpt-oss-120b": REV}, "models_revisions: 'gpt-oss-120b' is not a model id; allowed: model id ORG/NAME"),
    ("models_revisions", {"openai/gpt-oss-120b": "main"}, "models_revisions.openai/gpt-oss-120b: 'main' is not a commit; allowed: 40 lowercase hex digits"),
    ("models_revisions", {"openai/../x": REV}, "models_revisions: 'openai/../x' is not a model id"),
    ("models_sha256", {"openai/gpt-oss-120b": SHA[:-1]}, "models_sha256.openai/gpt-oss-120b: '0123456789abcdef"),
    ("models_sha256", {"../x": SHA}, "models_sha256: '../x' is not a model id"),
    ("serve_features", {"spec_decoding": "maybe please"}, "serve_features.spec_decoding: 'maybe please' is not on, off or a mode"),
    ("serve_extra_args", ["--max-num-seqs", ["8"]], "serve_extra_args: expected a string, got ['8']"),
    ("serve_extra_args", ["--served-model-name", "a\nb"], "serve_extra_args: 'a\\nb' holds a control character"),
    ("serve_extra_args", ["--enable-log-requests", ""], "serve_extra_args: ['--enable-log-requests', ''] holds an empty argument"),
    ("serve_extra_args", "--served-model-name 'a", "serve_extra_args: \"--served-model-name 'a\" cannot be split as a shell would"),
    ("serve_extra_env", {"1X": "v"}, "serve_extra_env: '1X' is not an environment variable name"),
    ("serve_extra_env", {"X": "a\nb"}, "serve_extra_env.X: 'a\\nb' holds a control character"),
    ("serve_extra_env", {"X": None}, "serve_extra_env.X: expected a string, got None"),
    ("serve_override_args", ["--max-num-seqs", 8], "serve_override_args: expected a string, got 8"),
]  # fmt: skip


def test_keys_are_group_data_all_in_its_order() -> None:
    assert KEYS == tuple(load_defaults())


def test_every_key_has_a_wrong_type_a_wrong_value_and_a_misspelling() -> None:
    assert set(WRONG_TYPE) == set(KEYS)
    assert {key for key, _, _ in WRONG_VALUE + PYTHON_CASES} == set(KEYS)
    assert len({key for key, _, _ in MISSPELLED} - set(KEYS)) == len(KEYS)


def _case_id(case: tuple[str, object, str]) -> str:
    return f"{case[0]}={case[1]!r}"


@pytest.mark.parametrize("base", sorted(BASES))
@pytest.mark.parametrize(
    ("key", "value", "expected"), BAD_DATA_CASES, ids=map(_case_id, BAD_DATA_CASES)
)
def test_command_line_bad_data_is_one_line_naming_the_key(
    base: str, key: str, value: object, expected: str
) -> None:
    text = json.dumps(value) if isinstance(value, dict) else str(value)
    given = parse_cli_arg(f"{key}={text}".split("=", 1)[1])  # as `--data key=value` gives it
    assert (type(given), given) == (type(value), value), "not expressible on the command line"
    message = refused(keys=True, base=base, **{key: given})
    assert message.startswith((f"{key}:", f"{key}.")), message
    assert expected in message


@pytest.mark.parametrize(
    ("key", "value", "expected"), PYTHON_CASES, ids=map(_case_id, PYTHON_CASES)
)
def test_python_bad_data_is_one_line_naming_the_key(key: str, value: object, expected: str) -> None:
    message = refused(**{key: value})
    assert message.startswith((f"{key}:", f"{key}.")), message
    assert expected in message


def test_defaults_validate() -> None:
    s = validate(keys=True)
    assert (s.serve_base_port, s.serve_target, s.serve_recommended, s.driver_apt_repo) == (
        8000,
        "Latency",
        False,
        None,
    )
    assert s.sdk_pins["rebel-compiler"] == "0.12.0" and s.owner_of("Rebel_Compiler").name == "rbln"
    assert (s.models_revisions, s.models_sha256) == ({}, {})


def test_lab_data_validates_with_http_on_its_trusted_host() -> None:
    s = validate(keys=True, base="lab")
    assert s.pip_trusted_hosts == ("10.213.0.1",)
    assert s.driver_runfile_url == "http://10.213.0.1:8080/driver/rebellions-x86_64-{version}.run"
    assert s.models_store_url == "http://10.213.0.1:8080/models"
    assert [i.url for i in s.pip_indexes][0] == "http://10.213.0.1:8101/simple"
    assert s.driver_apt_repo == {
        "src": "deb [signed-by=/etc/apt/keyrings/servefleet-lab.gpg] http://10.213.0.1:8090/ ./",
        "key": str(layout.APT_KEY_FILE),
    }
    assert "http on 10.213.0.1" in refused(base="lab", pip_trusted_hosts=[])


def test_bool_is_not_an_int_and_an_int_is_not_a_bool() -> None:
    assert "expected a whole number, got True" in refused(serve_base_port=True)
    assert "expected a whole number, got False" in refused(serve_prewarm_timeout=False)
    assert "expected true or false, got 1" in refused(serve_recommended=1)
    assert "expected true or false, got 0" in refused(serve_recommended=0)
    assert validate(serve_base_port="8100").serve_base_port == 8100  # a string of digits
    assert "expected a whole number, got ' 8100'" in refused(serve_base_port=" 8100")
    for text, flag in [("yes", True), ("TRUE", True), ("1", True), ("no", False), ("0", False)]:
        assert validate(serve_recommended=text).serve_recommended is flag


@pytest.mark.parametrize(
    ("url", "trusted"),
    [
        ("https://store.example/models", []),
        ("https://10.0.0.5:8443/models", []),
        ("https://[::1]:8443/models", []),
        ("http://10.213.0.1:8080/models", ["10.213.0.1"]),
        ("http://Mirror.LAN/simple", ["mirror.lan"]),
    ],
)
def test_urls_accepted(url: str, trusted: list[str]) -> None:
    s = validate(models_store_url=url, pip_public_index=url, pip_trusted_hosts=trusted)
    assert s.models_store_url == s.pip_public_index == url


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("http://10.213.0.1/models", "is http on 10.213.0.1, a host not in pip_trusted_hosts"),
        ("ftp://store.example/models", "is not an https URL"),
        ("file:///srv/models", "is not an https URL"),
        ("https:///models", "has no valid host and port"),
        ("https://store_1.example/models", "has no valid host and port"),
        ("https://store.example:0/models", "has no valid host and port"),
        ("https://store.example/my models", "holds a space, quote, brace or control character"),
        ("https://store.example/m'odels", "holds a space, quote, brace or control character"),
        ('https://store.example/m"odels', "holds a space, quote, brace or control character"),
        ("https://store.example/m`id`", "holds a space, quote, brace or control character"),
        ("https://store.example/m\x1b", "holds a space, quote, brace or control character"),
        ("https://store.example/{version}", "holds a space, quote, brace or control character"),
        ("https://store.example\n/models", "holds a space, quote, brace or control character"),
    ],
)
def test_urls_refused(url: str, problem: str) -> None:
    message = refused(models_store_url=url)
    assert message.startswith(f"models_store_url: {url!r} {problem}; allowed: an https URL")


def test_version_placeholder_only_in_the_runfile_url() -> None:
    url = "https://files.example/rebellions-x86_64-{version}.run"
    assert validate(driver_runfile_url=url).driver_runfile_url == url
    assert "brace" in refused(driver_runfile_url=url.replace("{version}", "{kernel}"))


@pytest.mark.parametrize(
    "url",
    [
        "https://user:hunter2@store.example/models",
        "https://hunter2@store.example/models",
        "https:user:hunter2@store.example/models",
        "https://user:hunter2@store.example/my models",
        "http://user:hunter2@10.213.0.1/models",
    ],
)
def test_credentials_in_urls_are_refused_without_being_shown(url: str) -> None:
    for key in ("driver_runfile_url", "pip_public_index", "models_store_url"):
        message = refused(**{key: url})
        assert message.startswith(f"{key}: credentials do not belong in data"), message
        assert "hunter2" not in message
    index = {"rbln": {"url": url, "packages": ["rebel-compiler"], "auth": "maybe"}}
    assert "hunter2" not in refused(pip_indexes=index)
    assert "hunter2" not in refused(pip_indexes=[url])


PATH_KEYS = ("serve_root", "serve_home", "serve_cache_root", "models_hf_home")


@pytest.mark.parametrize("key", PATH_KEYS)
def test_paths_accepted(key: str) -> None:
    # a serve-user tree may not overlap serve_root (#18): move serve_root out of these paths' way
    apart = {} if key == "serve_root" else {"serve_root": "/srv/servefleet-root"}
    paths = ["/opt/servefleet", "/srv/models", "/var/lib/sf-1/h_f.d", "/home/sf", "/var/cache/x"]
    if key == "serve_root":  # root's tree: any non-system directory (#31 (3) is the serve user's)
        paths.append("/usr/local/servefleet")
    for path in paths:
        assert getattr(validate(**{key: path}, **apart), key) == path


@pytest.mark.parametrize("key", PATH_KEYS[1:])
@pytest.mark.parametrize(
    "path",
    ["/etc/systemd/system", "/etc/systemd", "/usr/local/bin", "/etc/sudoers.d", "/etc/cron.d",
     "/root/.ssh", "/etc/ssh", "/usr/local/servefleet", "/var/cachex/vllm", "/optx/a"],
)  # fmt: skip
def test_serve_user_trees_only_below_the_roots_meant_for_them(key: str, path: str) -> None:
    """#31 (3): the serve user's trees (chowned to it on the host) are each a directory of its
    own strictly below /var/lib, /var/cache, /srv, /opt or /home, never any other directory."""
    assert refused(**{key: path}) == (
        f"{key}: {path!r} is not below a directory meant for the serve user's trees; allowed: an "
        "absolute, normalised path of [A-Za-z0-9._/-], a directory of its own strictly below "
        "/var/lib, /var/cache, /srv, /opt, /home (e.g. /var/lib/servefleet)"
    )


@pytest.mark.parametrize("key", PATH_KEYS)
@pytest.mark.parametrize(
    ("path", "problem"),
    [
        *((d, "is a system directory") for d in sorted(SYSTEM_DIRS)),
        ("/usr/lib", "is a system directory"),
        ("/dev/shm/servefleet", "is on a virtual file system"),
        ("/sys/servefleet", "is on a virtual file system"),
        ("servefleet", "is not absolute"),
        ("", "is not absolute"),
        ("~/servefleet", "is not absolute"),
        ("/opt/servefleet/", "is not normalised (write '/opt/servefleet')"),
        ("/opt//servefleet", "is not normalised (write '/opt/servefleet')"),
        ("//opt/servefleet", "is not normalised (write '/opt/servefleet')"),
        ("/opt/./servefleet", "is not normalised (write '/opt/servefleet')"),
        ("/opt/servefleet/../..", "is not normalised (write '/')"),
        ("/opt/serve fleet", "holds a character outside [A-Za-z0-9._/-]"),
        ("/opt/$USER", "holds a character outside [A-Za-z0-9._/-]"),
        ("/opt/servefleet\n", "holds a character outside [A-Za-z0-9._/-]"),
    ],
)
def test_paths_refused(key: str, path: str, problem: str) -> None:
    assert refused(**{key: path}).startswith(f"{key}: {path!r} {problem}; allowed:")


@pytest.mark.parametrize("host", [None, "127.0.0.1", "::1", "api.internal", "node-1"])
def test_serve_host_accepted(host: str | None) -> None:
    assert validate(serve_host=host).serve_host == host


@pytest.mark.parametrize("host", ["my_host", "10.0.0.300", "-node", "a..b", "", "host:8000"])
def test_serve_host_refused(host: str) -> None:
    assert refused(serve_host=host).startswith(f"serve_host: {host!r} is not an IP address")


@pytest.mark.parametrize(
    ("router", "host", "listens"),
    [
        ("host", None, "127.0.0.1"),  # #46 item 1: only the proxy faces the network
        ("host", "10.1.2.3", "10.1.2.3"),
        ("host", "::1", "::1"),
        ("none", None, None),  # every address: the clients reach the servers
        ("fleet", None, None),  # every address: the router on another host reaches them
        ("fleet", "10.1.2.3", "10.1.2.3"),
    ],
)
def test_where_the_servers_listen(router: str, host: str | None, listens: str | None) -> None:
    assert validate(serve_router=router, serve_host=host).instance_host == listens


def test_serve_user() -> None:
    for name in ("servefleet", "_svc", "sf-2", "a" * 32):
        assert validate(serve_user=name).serve_user == name
    for name in ("a" * 33, "1sf", "sf.user", "Servefleet", "root"):
        assert refused(serve_user=name).startswith(f"serve_user: {name!r} ")


def test_versions_pins_and_digests_are_kept() -> None:
    s = validate(
        driver_version="3.6.0rc1",
        driver_sha256={"3.6.0rc1": SHA},
        models_revisions={"openai/gpt-oss-120b": REV},
        models_sha256={"openai/gpt-oss-120b": SHA},
        sdk_pins=[p.replace("torch==", "Torch==") for p in load_defaults()["sdk_pins"]],
    )
    assert (s.driver_version, s.driver_sha256) == ("3.6.0rc1", {"3.6.0rc1": SHA})
    assert s.models_revisions == {"openai/gpt-oss-120b": REV}
    assert s.models_sha256 == {"openai/gpt-oss-120b": SHA}
    assert s.sdk_pins["torch"] == "2.13.0+cpu"
    assert parse_pins(["A_B.c==1.0"]) == {"a-b-c": "1.0"}
    with pytest.raises(DataError, match=r"^pins: expected a list"):
        parse_pins("a==1", key="pins")


def test_selection_from_the_command_line_or_a_mapping() -> None:
    expected = {"lmcache": "cpu", "spec_decode": "suffix"}
    assert validate(serve_selection="lmcache=cpu,spec_decode=suffix").serve_selection == expected
    assert validate(serve_selection=expected).serve_selection == expected
    assert validate(serve_selection="").serve_selection == {}


def test_unknown_keys_with_our_prefixes_are_refused_with_did_you_mean() -> None:
    assert (
        refused(keys=True, serve_targte="Throughput")
        == "serve_targte: unknown data key; did you mean serve_target?"
    )
    assert refused(keys=True, models_revision={}).endswith("did you mean models_revisions?")
    assert refused(keys=True, serve_frobnicate_quux=1) == (
        "serve_frobnicate_quux: unknown data key; allowed: the keys of servefleet/settings/table.py"
    )
    validate(keys=True, ssh_user="root", _sudo=True, app_port=1, servers=[])  # not ours
    validate(serve_targte="Throughput")  # keys not given: not checked


def test_the_first_bad_key_in_group_data_order_is_reported() -> None:
    bad = {"serve_base_port": 0, "models_sha256": "x", "serve_user": "root", "sdk_python": ""}
    assert refused(**bad).startswith("sdk_python:")
    bad.pop("sdk_python")
    assert refused(**bad).startswith("serve_base_port:")
    # across keys: a package no pin covers is reported at its index, before later keys
    index = {"x": {**INDEX, "packages": ["left-pad"]}}
    assert refused(pip_indexes=index, serve_user="root").startswith("pip_indexes.x:")


def test_missing_credential_variables_are_named() -> None:
    data = load_defaults()
    with pytest.raises(DataError, match=r"^creds_index_password_env: environment variable "):
        settings_from(data.get, {"RBLN_INDEX_USER": "u"})
    no_auth = {name: {**index, "auth": False} for name, index in data["pip_indexes"].items()}
    assert validate(pip_indexes=no_auth).index_user == "u"
    settings_from({**data, "pip_indexes": no_auth}.get, {})


@pytest.mark.parametrize(
    ("key", "close"),
    [("sevre_target", "serve_target"), ("sdk_pin", "sdk_pins"), ("serve_tagret", "serve_target")],
)
def test_a_misspelt_prefix_is_refused_with_a_did_you_mean(key: str, close: str) -> None:
    with pytest.raises(DataError, match=f"^{key}: unknown data key; did you mean {close}\\?$"):
        settings_from({key: "x"}.get, keys=[key])


def test_pyinfra_keys_are_not_taken_for_misspelt_ones() -> None:
    keys = ["ssh_user", "ssh_key", "ssh_hostname", "ssh_port", "_sudo", "ssh_known_hosts_file"]
    settings_from(
        {k: None for k in keys}.get, {"RBLN_INDEX_USER": "u", "RBLN_INDEX_PASSWORD": "p"}, keys
    )


@pytest.mark.parametrize(
    ("over", "key"),
    [
        ({"serve_root": "/var/lib/servefleet/opt"}, "serve_home"),  # root's lib/ in serve's home
        ({"serve_cache_root": "/opt/servefleet"}, "serve_cache_root"),  # the cache is serve_root
        ({"models_hf_home": "/opt/servefleet/lib"}, "models_hf_home"),  # models over lib/*.py
        ({"serve_home": "/opt/servefleet/home"}, "serve_home"),  # serve's home in serve_root
        ({"serve_cache_root": "/var/cache/servefleet"}, "serve_cache_root"),  # the runfiles
        ({"serve_root": "/srv/data/sf", "models_hf_home": "/srv/data"}, "models_hf_home"),
    ],
)
def test_a_root_tree_inside_a_serve_user_tree_is_refused(over: dict[str, str], key: str) -> None:
    message = refused(**over)
    assert message.startswith(f"{key}:") and "overlap" in message and "separate trees" in message
    assert "\n" not in message


def test_separate_trees_are_fine() -> None:
    s = validate(serve_root="/srv/servefleet", serve_home="/home/servefleet",
                 serve_cache_root="/srv/cache/vllm", models_hf_home="/home/servefleet/hf")  # fmt: skip
    assert s.serve_root == "/srv/servefleet"


def test_serve_files_only_from_serve_files_root_never_through_a_link_out_of_it(
    tmp_path: Path,
) -> None:
    """#31 (8): a file anywhere the controller can read (``/etc/shadow``) was shipped 0644 to the
    serve user; now only a file in serve_files_root, resolved, passes."""
    fleet = tmp_path / "fleet"
    (fleet / "templates").mkdir(parents=True)
    (fleet / "templates" / "chat.jinja").write_text("{{ messages }}\n")
    (fleet / "templates" / "out.jinja").symlink_to("/etc/hostname")
    root = {"serve_files_root": str(fleet)}
    ok = validate(serve_files={"t.jinja": str(fleet / "templates" / "chat.jinja")}, **root)
    assert ok.serve_files == {"t.jinja": str(fleet / "templates" / "chat.jinja")}
    assert refused(serve_files={"t.jinja": str(fleet / "templates" / "out.jinja")}, **root) == (
        f"serve_files.t.jinja: '{fleet}/templates/out.jinja' (a link to '/etc/hostname') is "
        f"outside serve_files_root '{fleet}'; allowed: a readable regular file in "
        "serve_files_root (the fleet repository by default), not through a link out of it"
    )
    assert refused(serve_files={"t.jinja": "/etc/hostname"}, **root).startswith(
        f"serve_files.t.jinja: '/etc/hostname' is outside serve_files_root '{fleet}'; allowed:"
    )


def test_a_serve_files_link_moved_out_after_the_data_was_checked_is_not_read(
    tmp_path: Path,
) -> None:
    """The release reads each file again when it ships it: a link inside serve_files_root that
    pointed at a file in it when the data was checked, and at ``/etc/hostname`` by then, is
    refused where it is read, not shipped."""
    from servefleet.base.errors import DataError
    from servefleet.release.plan import shipped_files

    fleet = tmp_path / "fleet"
    fleet.mkdir()
    (fleet / "chat.jinja").write_text("{{ messages }}\n")
    (fleet / "t.jinja").symlink_to(fleet / "chat.jinja")
    s = validate(serve_files={"t.jinja": str(fleet / "t.jinja")}, serve_files_root=str(fleet))
    (shipped,) = shipped_files(s)
    assert shipped.data == b"{{ messages }}\n"
    (fleet / "t.jinja").unlink()
    (fleet / "t.jinja").symlink_to("/etc/hostname")
    with pytest.raises(
        DataError, match=r"\(a link to '/etc/hostname'\) is outside serve_files_root"
    ):
        shipped_files(s)
