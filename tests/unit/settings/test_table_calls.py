"""src/servefleet/settings/table.py's functions called at test time (#37): the key table builds
its checks at import (``_url()``, ``_controller_dir()``), before a mutation campaign's mutant is
active, so these tests make them again here: a URL key (optional or not, its placeholder filled
in, http on a trusted host only), a controller directory (optional or not), a mapping over its
defaults; and what the table binds: the defaults copied, the secrets read from the variables
the creds_* keys name (this process's environment by default, an empty one as none), the index
owning a package, serve_router's three readings, and ``default_settings`` with a recipe and the
resolve options its kind reads."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from servefleet.settings import table
from servefleet.settings.check_names import Index
from servefleet.settings.checks import Refused

URL_ALLOWED = "an https URL (http only on a host of pip_trusted_hosts), without user:password@"


def _refusal(check: Any, value: Any) -> str:
    with pytest.raises(Refused) as err:
        check(value)
    return str(err.value.error("key"))


def test_a_url_key_is_optional_unless_said() -> None:
    optional = table._url().make(None)
    assert optional(None) is None
    assert optional("https://h.example/x") == "https://h.example/x"
    assert _refusal(optional, "ftp://h.example/x") == (
        f"key: 'ftp://h.example/x' is not an https URL; allowed: {URL_ALLOWED}, or None"
    )
    required = table._url(optional=False).make(None)
    assert required("https://h.example/x") == "https://h.example/x"
    assert _refusal(required, None) == (f"key: expected a string, got None; allowed: {URL_ALLOWED}")


def test_a_url_keys_placeholder_is_filled_in_later() -> None:
    check = table._url(placeholder="{version}").make(None)
    assert check("https://h.example/{version}/x") == "https://h.example/{version}/x"
    assert _refusal(check, "https://h.example/{other}/x") == (
        "key: 'https://h.example/{other}/x' holds a space, quote, brace or control character; "
        f"allowed: {URL_ALLOWED} ({{version}} is filled in), or None"
    )
    assert _refusal(table._url().make(None), "https://h.example/{version}/x").startswith(
        "key: 'https://h.example/{version}/x' holds a space, quote, brace"
    )


def test_a_url_keys_http_is_for_trusted_hosts() -> None:
    check = table._url().make(frozenset({"10.0.0.1"}))
    assert check("http://10.0.0.1/simple") == "http://10.0.0.1/simple"
    assert _refusal(check, "http://10.0.0.2/simple") == (
        "key: 'http://10.0.0.2/simple' is http on 10.0.0.2, a host not in pip_trusted_hosts; "
        f"allowed: {URL_ALLOWED}, or None"
    )


def test_a_controller_directory_key() -> None:
    required = table._controller_dir()
    assert required("/srv/wheelhouse") == "/srv/wheelhouse"
    assert _refusal(required, "") == (
        "key: '' is not a controller directory; allowed: a directory path on the controller"
    )
    assert _refusal(required, None) == (
        "key: expected a string, got None; allowed: a directory path on the controller"
    )
    optional = table._controller_dir(optional=True)
    assert optional(None) is None and optional("d") == "d"
    assert _refusal(optional, "a\nb") == (
        "key: 'a\\nb' holds a control character; allowed: a directory path on the controller, "
        "or None"
    )


def test_a_mapping_over_its_defaults() -> None:
    over = table._over({"a": 1, "b": 2}, lambda value: {k: v * 10 for k, v in value.items()})
    assert over({"b": 3, "c": 4}) == {"a": 1, "b": 30, "c": 40}
    assert over({}) == {"a": 1, "b": 2}


def test_the_defaults_are_a_copy() -> None:
    first = table.load_defaults()
    assert first == table.DEFAULTS and first is not table.DEFAULTS
    first["pip_indexes"]["rbln"]["packages"].append("mine")
    assert "mine" not in table.DEFAULTS["pip_indexes"]["rbln"]["packages"]


SECRETS = {
    "creds_index_user_env": "index_user",
    "creds_index_password_env": "index_password",
    "creds_hf_token_env": "hf_token",
    "creds_api_key_env": "api_key",
    "creds_router_admin_key_env": "router_admin_key",
}


def test_each_secret_is_read_from_the_variable_its_key_names() -> None:
    data = table.load_defaults()
    environ = {data[key]: f"secret-of-{field}" for key, field in SECRETS.items()}
    settings = table.settings_from(data.get, environ)
    assert {f: getattr(settings, f) for f in SECRETS.values()} == {
        f: f"secret-of-{f}" for f in SECRETS.values()
    }
    index = {data["creds_index_user_env"]: "u", data["creds_index_password_env"]: "p"}
    empty = table.settings_from(data.get, {**dict.fromkeys(environ, ""), **index})
    assert (empty.hf_token, empty.api_key, empty.router_admin_key) == (None, None, None)


def test_secrets_come_from_this_processs_environment_by_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    data = table.load_defaults()
    for key in SECRETS:
        monkeypatch.delenv(data[key], raising=False)
    monkeypatch.setenv(data["creds_index_user_env"], "u")
    monkeypatch.setenv(data["creds_index_password_env"], "p")
    monkeypatch.setenv(data["creds_hf_token_env"], "hf_from_env")
    settings = table.settings_from(data.get)
    assert settings.hf_token == "hf_from_env" and settings.api_key is None


def test_the_index_that_owns_a_package() -> None:
    a = Index("a", "https://a.example/simple", ("rebel-compiler", "torch"))
    b = Index("b", "https://b.example/simple", ("torch", "vllm"))
    settings = dataclasses.replace(table.default_settings(), pip_indexes=(a, b))
    assert settings.owner_of("Rebel_Compiler") is a
    assert settings.owner_of("torch") is a  # the first that lists it
    assert settings.owner_of("vllm") is b
    assert settings.owner_of("numpy") is None


@pytest.mark.parametrize(
    ("router", "want"),
    [
        ("none", (True, False, False)),
        ("host", (False, True, False)),
        ("fleet", (False, False, True)),
    ],
)
def test_serve_router_read_in_one_place(router: str, want: tuple[bool, bool, bool]) -> None:
    settings = dataclasses.replace(table.default_settings(), serve_router=router)
    assert (settings.router_off, settings.router_per_host, settings.router_fleet) == want


def test_default_settings_with_a_recipe_and_its_kinds_options() -> None:
    plain = table.default_settings()
    assert plain.serve_recipe == table.DEFAULTS["serve_recipe"]
    assert (plain.index_user, plain.index_password, plain.hf_token) == ("-", "-", None)
    recipe = table.DEFAULTS["serve_recipe"]
    pinned = table.default_settings(recipe, {"compiler_version": "0.9.9"})
    assert pinned.sdk_pins["rebel-compiler"] == "0.9.9"
    assert {k: v for k, v in pinned.sdk_pins.items() if k != "rebel-compiler"} == {
        k: v for k, v in plain.sdk_pins.items() if k != "rebel-compiler"
    }
    assert table.default_settings(recipe, {}).sdk_pins == plain.sdk_pins
    assert table.default_settings(None, {"compiler_version": None}).sdk_pins == plain.sdk_pins


def test_default_settings_serve_the_recipe_given() -> None:
    other = "vllm/Qwen/Qwen3-0.6B"
    try:
        got = table.default_settings(other)
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"no shipped recipe {other}: {exc}")
    assert got.serve_recipe == other
    assert table.default_settings("").serve_recipe == table.DEFAULTS["serve_recipe"]
