"""The host contract: where servefleet keeps things on a host, and what it calls them.

Stdlib only: names, and the few rules both sides apply (model ids, variable names, a file's
sha256: at the end). Both
sides import it: the controller as
``servefleet.base.remote.layout``, the host programs as ``layout`` (the deploy uploads it with them to
``<serve_root>/lib``; a program sent inline carries it, see :func:`servefleet.base.remote.inline`).
Every name a deploy and a host program must agree on is written here, once.
"""

from __future__ import annotations

import hashlib
import os
import re

# Under serve_root.
LIB = "lib"  # the host programs (this file among them) and the uv binary
PLANS = "plans"  # <release id>.json: what install_release.py installs
RELEASES = "releases"  # <release id>/: one venv each
CURRENT = "current"  # -> releases/<id>: the serving release, switched by rename
CURRENT_NEW = "current.new"  # the link that is renamed over CURRENT
STATE = "state"  # the host's states (below)
WHEELHOUSE = "wheelhouse"  # sdk_source = "wheelhouse": the host's copy of the files it needs

# In a release.
RELEASE_MARKER = ".servefleet-release.json"  # written last, after every check passed
LOCKED = "locked.txt"  # what the release was installed from: every file's sha256
RELEASE_FILES = "files"  # serve_files: the files its command lines name (shipped by the deploy)
TAMPERED = ".tampered-"  # <id>.tampered-<UTC time>: a drifted release set aside, never served
TAMPERED_KEEP = 7 * 86400  # seconds a set-aside release is kept for inspection

# In the state directory.
DESIRED = "desired.json"  # what `instances.py converge` brings the host to
PREWARM = "prewarm.json"  # the instance a build host compiles
GOOD = "good.json"  # the last state in which every instance was healthy
PREVIOUS = "previous.json"  # the good state before it (`servefleet rollback`)
KEPT_UNITS = "units"  # <sha>.service: the unit texts of the kept states
STATE_LOCK = ".lock"  # one converge, restore or rollback at a time
PREWARM_COPIES = "prewarm"  # a fleet pre-warm copy's tar and manifest on its way (root's tree)
PREFLIGHT = "preflight"  # <key>: the pre-flights that passed (HostPlan.preflight_key)

# systemd.
UNIT_DIR = "/etc/systemd/system"
UNIT_PREFIX = "servefleet-vllm-"
UNIT_GLOB = f"{UNIT_PREFIX}*.service"
BUILD_UNIT = "servefleet-prewarm.service"  # a fleet pre-warm's compile-only instance
# ... runs as its own user, in its own network namespace, into its own cache (serve_root/...):
# what a fleet copies was never written by a server that took requests (#31 finding 5)
BUILD_USER = "servefleet-build"
BUILD_CACHE = "build-cache"
BUILD_HUB = "build-hub"  # root's copy of the models a build reads, held to its fetch record
COMPILE_ONLY = "compile only"  # the warm marker's source of such a cache (and its copy's origin)
ROUTER_UNIT = "servefleet-router.service"  # serve_router: the vllm-router in front of them
# nginx in front of the router: clients reach only the OpenAI paths (vllm-router's worker API
# is on its port, unguarded); it runs the copies its unit made at its start, in PROXY_RUN
PROXY_UNIT = "servefleet-router-proxy.service"
PROXY_CONF = "/etc/servefleet/router-proxy.conf"
PROXY_RUN = "/run/servefleet-router-proxy"
PROXY_LOADED = f"{PROXY_RUN}/nginx.conf"  # the configuration it runs
PROXY_ADMIN_LOADED = f"{PROXY_RUN}/admin.map"  # the admin key it checks (serve_router fleet)
PROXY_STARTED = f"{PROXY_RUN}/unit"  # the SERVEFLEET_UNIT it was started with (nginx's process
# title overwrites its /proc/PID/environ)
NGINX = "/usr/sbin/nginx"
# vllm-router's worker API on loopback: an nftables table lets only root and the router's user
# (nginx's workers) connect to its port (#46 item 9); the router's unit loads it
NFT = "/usr/sbin/nft"
ROUTER_GUARD_TABLE = "servefleet_router"
# a serving group's rendezvous: an nftables table on each rank's host lets only the group's hosts
# reach the ports its ranks listen on for each other (#46 item 7)
GROUP_GUARD_TABLE = "servefleet_group"
# The servers' path guard (#46 item 1): vLLM's --middleware, a module of its own in lib/<ASGI>/
# (on the servers' PYTHONPATH: that directory holds nothing else), answering only the paths of
# OPEN_PATHS_VAR (serve_open_paths) and 404 to any other before vLLM's app sees it
ASGI = "asgi"
PATH_GUARD_MODULE = "servefleet_paths"
PATH_GUARD = f"{PATH_GUARD_MODULE}.OpenPaths"
OPEN_PATHS_VAR = "SERVEFLEET_OPEN_PATHS"  # the paths, split by spaces
UNIT_SHA_VAR = "SERVEFLEET_UNIT"  # in each unit: a hash of the rest of its text (what runs)
GROUP_SHA_VAR = "SERVEFLEET_GROUP"  # in a serving group's units: the group's hash (every rank's)


def unit_name(index: int) -> str:
    """The unit of instance ``index`` (port serve_base_port + index)."""
    return f"{UNIT_PREFIX}{index}.service"


# The serve user's trees (serve_home, serve_cache_root, models_hf_home) are each a directory of
# its own strictly below one of these (``/var/lib/servefleet``, never ``/var/lib``): checked in
# the data and again on the host by ``trees.py``, which makes them (#31 finding 3)
SERVE_TREE_ROOTS = ("/var/lib", "/var/cache", "/srv", "/opt", "/home")

# Under serve_cache_root (VLLM_CACHE_ROOT).
WARM_DIR = "servefleet-warm"  # <fingerprint>: the compile cache holds it (and where)
INCOMING = ".servefleet-incoming"  # root's own (0700): a fleet pre-warm copy being checked
DROPPED = ".servefleet-dropped"  # root's own: a drifted cache moved out of use, then removed

# Under $HF_HOME/hub/models--ORG--NAME.
MODEL_COMPLETE = ".servefleet-complete"  # names the snapshot, written last by fetch_model.py

# Secrets: a 0700 root directory, the only place they live on a host.
SECRETS_DIR = "/etc/servefleet/secrets"
NETRC = f"{SECRETS_DIR}/netrc"  # index credentials (pip and uv read it through $NETRC)
HF_TOKEN_FILE = f"{SECRETS_DIR}/hf_token"  # Hugging Face token (read at fetch time only)
# The servers' API key: the units' EnvironmentFile= (systemd reads it as root); the health gate
# reads the key from the file a unit names, for its Authorization: Bearer header
API_KEY_FILE = f"{SECRETS_DIR}/vllm-api-key.env"
# serve_router fleet: the routers' admin key, as a router host's proxy checks it (an nginx map
# entry) and as a serving host's converge sends it (the bare key)
ROUTER_ADMIN_MAP = f"{SECRETS_DIR}/router-admin.map"
ROUTER_ADMIN_KEY = f"{SECRETS_DIR}/router-admin-key"
API_KEY_VAR = "VLLM_API_KEY"  # its one line: VLLM_API_KEY=<key>

# The RBLN driver.
RUNFILE_DIR = "/var/cache/servefleet/driver"  # runfiles and installer logs


# Rules both sides apply, written once.

# A Hugging Face model id: ORG/NAME of [A-Za-z0-9._-], each part starting with a letter or digit
# (never an option's dash or a dot), no ".." anywhere (never a path out of the hub's tree).
MODEL_ID = re.compile(r"(?!.*\.\.)[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
MODEL_ID_ALLOWED = "ORG/NAME of [A-Za-z0-9._-], each part starting with a letter or digit, no '..'"
# An environment variable name (a unit's Environment=, a card's env, a creds_*_env key).
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
ENV_NAME_ALLOWED = "[A-Za-z_][A-Za-z0-9_]*"


def sha256_of(path: str | os.PathLike[str]) -> str:
    """The sha256 of a file, read in 1 MiB blocks (OSError when it cannot be read).

    + path: the file
    """
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
