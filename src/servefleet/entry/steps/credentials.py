"""The secrets a host gets: the index credentials as a netrc, the Hugging Face token and the
servers' API key (their EnvironmentFile), each a 0600 root file in the 0700 ``SECRETS_DIR``,
sent on the command's stdin; never in a unit, an argument or the output."""

from __future__ import annotations

from urllib.parse import urlsplit

from servefleet.base.remote.layout import API_KEY_FILE, ROUTER_ADMIN_KEY, SECRETS_DIR
from servefleet.entry.steps import ensure
from servefleet.hostplan.instance_unit import api_key_file
from servefleet.hostplan.types import HostPlan
from servefleet.settings.table import Settings


def netrc(s: Settings) -> str:
    """The netrc of the index credentials: one line for each host of an index that needs them,
    its tokens bare (settings refuses a credential a bare token cannot carry)."""
    hosts = sorted({urlsplit(i.url).hostname or "" for i in s.pip_indexes if i.auth})
    user, password = s.index_user or "", s.index_password or ""
    return "".join(f"machine {h} login {user} password {password}\n" for h in hosts)


def hf_token(plan: HostPlan) -> str | None:
    """The token hosts fetch models with (none from a wheelhouse: the copy is local)."""
    s = plan.settings
    return s.hf_token if s.sdk_source != "wheelhouse" else None


def secrets_dir(plan: HostPlan) -> None:
    """The 0700 directory secrets pass through and live in, when this host gets any."""
    if plan.release.netrc or hf_token(plan) or plan.settings.api_key or _router_admin(plan):
        ensure.directory(plan, SECRETS_DIR, mode="700")


def _router_admin(plan: HostPlan) -> str | None:
    """The routers' admin key a serving host drains with, behind fleet routers."""
    s = plan.settings
    return s.router_admin_key if s.router_fleet and not plan.router_host else None


def router_admin_key(plan: HostPlan) -> None:
    """With ``serve_router = "fleet"``: the key a serving host's converge sends the routers'
    worker API (their proxies pass it only with this key), a 0600 root file."""
    key = _router_admin(plan)
    if key:
        ensure.secret(plan, "Write the routers' admin key (0600)", ROUTER_ADMIN_KEY, key)


def api_key(plan: HostPlan) -> None:
    """The servers' API key, as the EnvironmentFile their units name (systemd reads it as root
    and gives the server VLLM_API_KEY; the gate reads it from there). Written before the
    converge: a new key is a new unit sha, so every server restarts through the gate with it."""
    key = plan.settings.api_key
    if key:
        ensure.secret(plan, "Write the servers' API key (0600)", API_KEY_FILE, api_key_file(key))
