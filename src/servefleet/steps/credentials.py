"""The secrets a host gets: the index credentials as a netrc and the Hugging Face token, each a
0600 file in the 0700 ``SECRETS_DIR``; never in a unit, an argument or the output."""

from __future__ import annotations

from urllib.parse import urlsplit

from servefleet.hostplan import HostPlan
from servefleet.remote.layout import SECRETS_DIR
from servefleet.settings import Settings
from servefleet.steps import ensure


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
    if plan.release.netrc or hf_token(plan):
        ensure.directory(plan, SECRETS_DIR, mode="700")
