"""The checks of hosts and URLs in deploy data: IP addresses and host names, URLs (https, or
http on a host of pip_trusted_hosts; never credentials, nor shown), apt sources. Pure Python.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any
from urllib.parse import urlsplit

from servefleet.settings.checks import (
    Check,
    Refused,
    bad,
    listed,
    one_line,
    optional,
    record,
    typed,
)

_HOSTNAME = re.compile(r"(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*")  # fmt: skip
_NOT_IN_URL = re.compile(r"[\s\"'`\\<>{}|^\x00-\x1f\x7f-\x9f]")
_DEB_LINE = re.compile(r"deb (\[[^\]]+\] )?(?P<url>\S+) \S+( \S+)*")

_URL_ALLOWED = "an https URL (http only on a host of pip_trusted_hosts), without user:password@"
_CREDS_ALLOWED = "a URL without user:password@ (creds_*_env name the variables holding secrets)"
_HOST_ALLOWED = "an IP address or a host name of [A-Za-z0-9.-]"
_DEB_ALLOWED = "one line 'deb [signed-by=KEYRING] URL SUITE [COMPONENT...]', no user:password@"
_REPO_ALLOWED = "{'src': deb source line, 'key': local key file (optional)}"


def is_host(text: str) -> bool:
    """An IP address, or a host name of dot-separated [A-Za-z0-9-] labels (the last one not all
    digits: ``10.0.0.300`` is a bad address, not a name)."""
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return bool(_HOSTNAME.fullmatch(text)) and not text.rsplit(".", 1)[-1].isdigit()
    return True


def host_name(value: Any) -> str:
    text = typed(value, str, "a string", _HOST_ALLOWED)
    if not is_host(text):
        raise bad(text, "is not an IP address or a host name", _HOST_ALLOWED)
    return text


def authority(url: str) -> str:
    """What stands between a URL's scheme and its path (``user:password@host:port``)."""
    rest = url.split(":", 1)[-1].lstrip("/")
    return re.split(r"[/?#]", rest, maxsplit=1)[0]


def url_check(trusted: frozenset[str] | None, placeholder: str = "") -> Check:
    """An https URL, or http on a ``trusted`` host (any host when None: pip_trusted_hosts is
    bad, and refused in its turn); never with credentials (nor shows them)."""
    allowed = _URL_ALLOWED + (f" ({placeholder} is filled in)" if placeholder else "")

    def check(value: Any) -> str:
        url = typed(value, str, "a string", allowed)
        if "@" in authority(url):  # before any message that would show the password
            raise Refused("credentials do not belong in data", _CREDS_ALLOWED)
        if _NOT_IN_URL.search(url.replace(placeholder, "") if placeholder else url):
            raise bad(url, "holds a space, quote, brace or control character", allowed)
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError:
            raise bad(url, "has an invalid host or port", allowed) from None
        host = parts.hostname or ""
        if parts.scheme not in ("http", "https"):
            raise bad(url, "is not an https URL", allowed)
        if not is_host(host) or port == 0:
            raise bad(url, "has no valid host and port", allowed)
        if parts.scheme == "http" and trusted is not None and host not in trusted:
            raise bad(url, f"is http on {host}, a host not in pip_trusted_hosts", allowed)
        return url

    return check


trusted_hosts = listed(host_name, "a list of IP addresses or host names")


def trusted_of(value: Any) -> frozenset[str] | None:
    """pip_trusted_hosts as the URL checks see it, None when it is bad."""
    try:
        return frozenset(host.lower() for host in trusted_hosts(value))
    except Refused:
        return None


def _deb_source(value: Any) -> str:
    line = one_line("a deb source line", _DEB_ALLOWED)(value)
    found = _DEB_LINE.fullmatch(line)
    if not found:
        raise bad(line, "is not a deb source line", _DEB_ALLOWED)
    if "@" in authority(found["url"]):
        raise Refused("credentials do not belong in data", _CREDS_ALLOWED)
    if not found["url"].startswith(("http://", "https://", "file:/")):
        raise bad(line, "has no http, https or file URL", _DEB_ALLOWED)
    return line


def apt_repo(value: Any) -> dict[str, str]:
    key = optional(one_line("a file path", "a local file path (the repository's key)"))
    repo = record({"src": _deb_source, "key": key}, ("src",), _REPO_ALLOWED)(value)
    if repo.get("key") and "signed-by=" not in repo["src"]:
        raise bad(repo["key"], "is given but src has no [signed-by=KEYRING]", _REPO_ALLOWED)
    return {k: v for k, v in repo.items() if v is not None}
