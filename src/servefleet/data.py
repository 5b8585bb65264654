"""Deploy data: read ``group_data/all.py`` defaults and validate a host's data into Settings.

Pure Python (no pyinfra import): the deploy files call :func:`settings_from` on ``host.data`` at
the top, before any operation is added, so bad data stops the run with one line naming the key
and no host changes.
"""

from __future__ import annotations

import os
import re
import runpy
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servefleet.errors import DataError

REPO = Path(__file__).resolve().parents[2]
GROUP_DATA_ALL = REPO / "group_data" / "all.py"

_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9.+!_-]+)$")
TARGETS = ("Latency", "Throughput")


def canonical_name(name: str) -> str:
    """PEP 503 normalised distribution name (``Rebel_Compiler`` -> ``rebel-compiler``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def load_defaults(path: Path = GROUP_DATA_ALL) -> dict[str, Any]:
    """The keys of ``group_data/all.py`` with their default values."""
    return {k: v for k, v in runpy.run_path(str(path)).items() if not k.startswith("__")}


def parse_pins(pins: Any, key: str = "sdk_pins") -> dict[str, str]:
    """``["name==1.0", ...]`` -> ``{canonical name: version}``; anything but ``==`` is refused."""
    if not isinstance(pins, (list, tuple)):
        raise DataError(f"{key}: expected a list of 'name==version' pins, got {pins!r}")
    out: dict[str, str] = {}
    for pin in pins:
        m = _PIN.match(str(pin).strip())
        if not m:
            raise DataError(f"{key}: {pin!r} is not an exact pin; write it as 'name==version'")
        out[canonical_name(m.group(1))] = m.group(2)
    return out


def default_compiler_version() -> str:
    """The rebel-compiler version the deploy's data pins (``group_data/all.py``)."""
    return parse_pins(load_defaults()["sdk_pins"])["rebel-compiler"]


@dataclass(frozen=True)
class Index:
    """One package index and the distributions it owns."""

    name: str
    url: str
    packages: tuple[str, ...]
    auth: bool = False


@dataclass(frozen=True)
class Settings:
    """Validated deploy data for one host (see group_data/all.py for each key's meaning)."""

    driver_version: str
    driver_runfile_url: str | None
    driver_sha256: dict[str, str]
    driver_installer_args: tuple[str, ...]
    driver_apt_packages: tuple[str, ...]
    driver_apt_repo: dict[str, str] | None
    pins: dict[str, str]
    extra_packages: dict[str, tuple[str, ...]]
    sdk_python: str
    indexes: tuple[Index, ...]
    public_index: str | None
    trusted_hosts: tuple[str, ...]
    index_user: str | None
    index_password: str | None
    hf_token: str | None
    recipe: str
    strategy: str | None
    target: str
    selection: dict[str, str]
    recommended: bool
    base_port: int
    host: str | None
    user: str
    root: str
    home: str
    cache_root: str
    prewarm_timeout: int
    health_timeout: int
    hf_home: str
    models_store_url: str | None

    def owner_of(self, package: str) -> Index | None:
        """The index that owns ``package``, or None for the public index."""
        name = canonical_name(package)
        return next((i for i in self.indexes if name in i.packages), None)


def _str(get: Callable[[str], Any], key: str, *, optional: bool = False) -> Any:
    value = get(key)
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value:
        allowed = "a non-empty string" + (" or None" if optional else "")
        raise DataError(f"{key}: expected {allowed}, got {value!r}")
    return value


def _int(get: Callable[[str], Any], key: str, minimum: int = 1) -> int:
    value = get(key)
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise DataError(f"{key}: expected a whole number >= {minimum}, got {value!r}") from None
    if number < minimum:
        raise DataError(f"{key}: expected a whole number >= {minimum}, got {value!r}")
    return number


def _bool(get: Callable[[str], Any], key: str) -> bool:
    value = get(key)
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
        return value.lower() in ("true", "1", "yes")
    raise DataError(f"{key}: expected true or false, got {value!r}")


def _strings(get: Callable[[str], Any], key: str) -> tuple[str, ...]:
    value = get(key)
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise DataError(f"{key}: expected a list of strings, got {value!r}")
    return tuple(value)


def _mapping(get: Callable[[str], Any], key: str) -> dict[str, Any]:
    value = get(key)
    if isinstance(value, str):  # --data serve_selection=lmcache=cpu,spec_decode=suffix
        pairs = [p for p in value.split(",") if p]
        if not all("=" in p for p in pairs):
            raise DataError(f"{key}: expected AXIS=VALUE pairs separated by commas, got {value!r}")
        return dict(p.split("=", 1) for p in pairs)
    if not isinstance(value, Mapping):
        raise DataError(f"{key}: expected a mapping, got {value!r}")
    return dict(value)


def _secret(env_key: str, get: Callable[[str], Any], environ: Mapping[str, str]) -> str | None:
    name = _str(get, env_key)
    return environ.get(name) or None


def _indexes(get: Callable[[str], Any]) -> tuple[Index, ...]:
    value = get("pip_indexes")
    if not isinstance(value, Mapping):
        raise DataError(
            f"pip_indexes: expected a mapping of name -> {{url, packages}}, got {value!r}"
        )
    out = []
    for name, spec in value.items():
        if not isinstance(spec, Mapping) or not isinstance(spec.get("url"), str):
            raise DataError(f"pip_indexes.{name}: expected {{'url': ..., 'packages': [...]}}")
        packages = spec.get("packages")
        if not isinstance(packages, (list, tuple)) or not packages:
            raise DataError(f"pip_indexes.{name}.packages: expected a non-empty list of names")
        unknown = set(spec) - {"url", "packages", "auth"}
        if unknown:
            raise DataError(
                f"pip_indexes.{name}: unknown keys {sorted(unknown)}; allowed: url, packages, auth"
            )
        if "@" in spec["url"].split("//", 1)[-1].split("/", 1)[0]:
            raise DataError(
                f"pip_indexes.{name}.url: credentials do not belong in data; "
                "set creds_index_user_env / creds_index_password_env"
            )
        out.append(
            Index(
                name=str(name),
                url=spec["url"].rstrip("/"),
                packages=tuple(canonical_name(p) for p in packages),
                auth=bool(spec.get("auth", False)),
            )
        )
    return tuple(out)


def settings_from(get: Callable[[str], Any], environ: Mapping[str, str] | None = None) -> Settings:
    """Validate a host's data (``host.data.get``) into Settings; DataError names the bad key.

    + get: returns the value of a data key (None when unset)
    + environ: where credential variables are read from (default: this process's environment)
    """
    environ = os.environ if environ is None else environ
    target = _str(get, "serve_target")
    canonical_target = {t.lower(): t for t in TARGETS}.get(target.lower())
    if canonical_target is None:
        raise DataError(f"serve_target: {target!r} is not a target; allowed: {', '.join(TARGETS)}")
    pins = parse_pins(get("sdk_pins"))
    extras = {
        k: tuple(canonical_name(p) for p in v)
        for k, v in _mapping(get, "sdk_extra_packages").items()
    }
    indexes = _indexes(get)
    sha = _mapping(get, "driver_sha256")
    repo = get("driver_apt_repo")
    if repo is not None and (not isinstance(repo, Mapping) or "src" not in repo):
        raise DataError(
            f"driver_apt_repo: expected None or {{'src': ..., 'key': ...}}, got {repo!r}"
        )
    settings = Settings(
        driver_version=_str(get, "driver_version"),
        driver_runfile_url=_str(get, "driver_runfile_url", optional=True),
        driver_sha256={str(k): str(v).lower() for k, v in sha.items()},
        driver_installer_args=_strings(get, "driver_installer_args"),
        driver_apt_packages=_strings(get, "driver_apt_packages"),
        driver_apt_repo=dict(repo) if repo is not None else None,
        pins=pins,
        extra_packages=extras,
        sdk_python=_str(get, "sdk_python"),
        indexes=indexes,
        public_index=_str(get, "pip_public_index", optional=True),
        trusted_hosts=_strings(get, "pip_trusted_hosts"),
        index_user=_secret("creds_index_user_env", get, environ),
        index_password=_secret("creds_index_password_env", get, environ),
        hf_token=_secret("creds_hf_token_env", get, environ),
        recipe=_str(get, "serve_recipe"),
        strategy=_str(get, "serve_strategy", optional=True),
        target=canonical_target,
        selection={str(k): str(v) for k, v in _mapping(get, "serve_selection").items()},
        recommended=_bool(get, "serve_recommended"),
        base_port=_int(get, "serve_base_port"),
        host=_str(get, "serve_host", optional=True),
        user=_str(get, "serve_user"),
        root=_str(get, "serve_root"),
        home=_str(get, "serve_home"),
        cache_root=_str(get, "serve_cache_root"),
        prewarm_timeout=_int(get, "serve_prewarm_timeout"),
        health_timeout=_int(get, "serve_health_timeout"),
        hf_home=_str(get, "models_hf_home"),
        models_store_url=_str(get, "models_store_url", optional=True),
    )
    for index in indexes:
        for package in index.packages:
            if package not in pins:
                raise DataError(
                    f"pip_indexes.{index.name}: {package} has no pin in sdk_pins; "
                    f"pinned: {', '.join(sorted(pins))}"
                )
        if index.auth:
            for key, value in (
                ("creds_index_user_env", settings.index_user),
                ("creds_index_password_env", settings.index_password),
            ):
                if not value:
                    raise DataError(
                        f"{key}: environment variable {get(key)} is not set "
                        f"(needed for the {index.name} index)"
                    )
    for required in ("rebel-compiler", "vllm-rbln"):
        if required not in pins:
            raise DataError(f"sdk_pins: {required} must be pinned")
    return settings
