"""Bad deploy data that ``--data key=value`` can express, with the one line it must be refused with.

``BAD_DATA_CASES``: (key, value, a substring of the DataError line). Every value is an int, a
bool, a float or a plain string that pyinfra's ``parse_cli_arg`` gives back unchanged from
``f"{key}={value}"``, or a mapping it gives back from ``f"{key}={json.dumps(value)}"``, so a lab
test can pass each case as ``--data`` (test_data.py checks that).
Each case fails on its own key given the package's defaults or the lab's data.
Misspelled keys are refused only when the deploy passes the host's keys to ``settings_from``.
"""

from __future__ import annotations

from servefleet.settings.table import KEYS

LAB_HTTP = "http://10.213.0.1:8080"  # the lab's file server (pip_trusted_hosts there)
UNTRUSTED = "http://10.9.9.9:8080"
VLLM = {"url": "https://wheels.example/cpu", "packages": ["vllm"], "glibc": "2.39"}
ASSETS = {"url": "https://assets.example/simple", "packages": ["vllm"], "glibc": "2.35"}

# key -> (a value of the wrong type, the substring)
WRONG_TYPE: dict[str, tuple[object, str]] = {
    "driver_version": (3, "driver_version: expected a string, got 3"),
    "driver_runfile_url": (5, "driver_runfile_url: expected a string, got 5"),
    "driver_sha256": ("abc", "driver_sha256: expected a mapping, got 'abc'"),
    "driver_installer_args": ("--silent", "driver_installer_args: expected a list, got '--silent'"),
    "driver_apt_packages": ("dkms", "driver_apt_packages: expected a list, got 'dkms'"),
    "driver_apt_repo": (
        "deb http://10.9.9.9/ ./",
        "driver_apt_repo: expected a mapping, got 'deb http://10.9.9.9/ ./'",
    ),
    "sdk_pins": ("vllm==1.0", "sdk_pins: expected a list of 'name==version' pins, got 'vllm==1.0'"),
    "sdk_extra_packages": ("kv", "sdk_extra_packages: expected a mapping, got 'kv'"),
    "sdk_python": (3, "sdk_python: expected a string, got 3"),
    "sdk_installer": (1, "sdk_installer: 1 is not an installer; allowed: uv or pip"),
    "sdk_lock": (3, "sdk_lock: expected a string, got 3"),
    "sdk_lock_python": (3.1, "sdk_lock_python: expected a string, got 3.1"),
    "sdk_wheel_cache": (1, "sdk_wheel_cache: expected a string, got 1"),
    "sdk_source": (1, "sdk_source: 1 is not a package source; allowed: index or wheelhouse"),
    "sdk_wheelhouse": (4, "sdk_wheelhouse: expected a string, got 4"),
    "pip_indexes": ("https://idx.example/simple", "pip_indexes: expected a mapping, got 'https:"),
    "pip_public_index": (7, "pip_public_index: expected a string, got 7; allowed: an https URL"),
    "pip_trusted_hosts": ("10.213.0.1", "pip_trusted_hosts: expected a list, got '10.213.0.1'"),
    "creds_index_user_env": (1, "creds_index_user_env: expected a string, got 1"),
    "creds_index_password_env": (True, "creds_index_password_env: expected a string, got True"),
    "creds_hf_token_env": (2, "creds_hf_token_env: expected a string, got 2"),
    "creds_api_key_env": (1, "creds_api_key_env: expected a string, got 1"),
    "creds_router_admin_key_env": (3, "creds_router_admin_key_env: expected a string, got 3"),
    "serve_recipe": (42, "serve_recipe: expected a string, got 42"),
    "serve_strategy": (1, "serve_strategy: expected a string, got 1; allowed: a slug of"),
    "serve_target": (1, "serve_target: expected a string, got 1; allowed: Latency, Throughput"),
    "serve_selection": (5, "serve_selection: expected a mapping, got 5"),
    "serve_recommended": (1, "serve_recommended: expected true or false, got 1"),
    "serve_base_port": (
        True,
        "serve_base_port: expected a whole number, got True; allowed: 1-65535",
    ),
    "serve_host": (5, "serve_host: expected a string, got 5"),
    "serve_shutdown_timeout": (
        2.5,
        "serve_shutdown_timeout: expected a whole number, got 2.5; allowed: 0-3600",
    ),
    "serve_roles": ("prefill", "serve_roles: expected a mapping, got 'prefill'"),
    "serve_pd_pairs": ("one", "serve_pd_pairs: expected a whole number, got 'one'"),
    "serve_group": (3, "serve_group: expected a string, got 3"),
    "serve_group_rank": ("first", "serve_group_rank: expected a whole number, got 'first'"),
    "serve_nodes": (2.5, "serve_nodes: expected a whole number, got 2.5"),
    "serve_iface": (0, "serve_iface: expected a string, got 0"),
    "serve_router": (1, "serve_router: 1 is not a router placement; allowed: none, host, fleet"),
    "serve_router_group": (2, "serve_router_group: expected a string, got 2"),
    "serve_router_port": (8.5, "serve_router_port: expected a whole number, got 8.5"),
    "serve_router_metrics_port": (True, "serve_router_metrics_port: expected a whole number"),
    "serve_router_backend_port": ("x", "serve_router_backend_port: expected a whole number"),
    "serve_router_admin_port": (1.5, "serve_router_admin_port: expected a whole number"),
    "serve_router_version": (1, "serve_router_version: expected a string, got 1"),
    "serve_router_user": (2, "serve_router_user: expected a string, got 2"),
    "serve_router_policy": (3, "serve_router_policy: 3 is not a router policy"),
    "serve_router_health_interval": (1.5, "serve_router_health_interval: expected a whole number"),
    "serve_router_health_failures": (
        False,
        "serve_router_health_failures: expected a whole number",
    ),
    "serve_router_health_successes": (
        "two",
        "serve_router_health_successes: expected a whole number",
    ),
    "serve_router_retries": (0.5, "serve_router_retries: expected a whole number"),
    "serve_router_breaker_failures": (
        "x",
        "serve_router_breaker_failures: expected a whole number",
    ),
    "serve_extra_args": (5, "serve_extra_args: expected a list, got 5"),
    "serve_extra_env": (5, "serve_extra_env: expected a mapping, got 5"),
    "serve_override_args": (5, "serve_override_args: expected a list, got 5"),
    "serve_files": (5, "serve_files: expected a mapping, got 5"),
    "serve_files_root": (5, "serve_files_root: expected a string, got 5"),
    "serve_user": (1000, "serve_user: expected a string, got 1000"),
    "serve_root": (1, "serve_root: expected a string, got 1"),
    "serve_home": (False, "serve_home: expected a string, got False"),
    "serve_cache_root": (2, "serve_cache_root: expected a string, got 2"),
    "serve_prewarm_timeout": (1.5, "serve_prewarm_timeout: expected a whole number, got 1.5"),
    "serve_health_timeout": (False, "serve_health_timeout: expected a whole number, got False"),
    "serve_hardware": (200, "serve_hardware: expected a string, got 200"),
    "serve_variant": (1, "serve_variant: expected a string, got 1"),
    "serve_features": (5, "serve_features: expected a mapping, got 5"),
    "serve_instances": ("two", "serve_instances: expected a whole number, got 'two'"),
    "serve_load_timeout": (2.5, "serve_load_timeout: expected a whole number, got 2.5"),
    "serve_prewarm_scope": (
        1,
        "serve_prewarm_scope: 1 is not a pre-warm scope; allowed: host or fleet",
    ),
    "serve_prewarm_host": (5, "serve_prewarm_host: expected a string, got 5"),
    "serve_prewarm_store": (3, "serve_prewarm_store: expected a string, got 3"),
    "models_hf_home": (3, "models_hf_home: expected a string, got 3"),
    "models_store_url": (True, "models_store_url: expected a string, got True"),
    "models_hub_url": (8110, "models_hub_url: expected a string, got 8110"),
    "models_revisions": ("main", "models_revisions: expected a mapping, got 'main'"),
    "models_sha256": ("abc", "models_sha256: expected a mapping, got 'abc'"),
    "models_lock_timeout": ("soon", "models_lock_timeout: expected a whole number, got 'soon'"),
}

# (key, a value of the right type that is out of range or malformed, the substring)
WRONG_VALUE: list[tuple[str, object, str]] = [
    ("sdk_installer", "conda", "sdk_installer: 'conda' is not an installer; allowed: uv or pip"),
    ("sdk_lock", "", "sdk_lock: '' is not a controller directory"),
    ("sdk_wheel_cache", "", "sdk_wheel_cache: '' is not a controller directory"),
    ("sdk_lock_python", "py3.10", "sdk_lock_python: 'py3.10' is not a version specifier"),
    ("sdk_lock_python", "<3.14", "sdk_lock_python: '<3.14' has no lower bound"),
    ("sdk_source", "offline", "sdk_source: 'offline' is not a package source; allowed: index or wheelhouse"),
    ("sdk_source", "wheelhouse", "sdk_source: 'wheelhouse' needs sdk_lock and sdk_wheelhouse set"),
    ("sdk_wheelhouse", "", "sdk_wheelhouse: '' is not a controller directory"),
    ("driver_version", "3.x", "driver_version: '3.x' is not a PEP 440 version"),
    ("driver_version", "v3.5.1", "driver_version: 'v3.5.1' is not in normal form (write '3.5.1')"),
    (
        "driver_runfile_url",
        UNTRUSTED + "/driver/r-{version}.run",
        "driver_runfile_url: 'http://10.9.9.9:8080/driver/r-{version}.run' is http on 10.9.9.9, "
        "a host not in pip_trusted_hosts",
    ),
    ("driver_runfile_url", "ftp://10.213.0.1/r.run", "driver_runfile_url: 'ftp://10.213.0.1/r.run' is not an https URL"),
    ("driver_runfile_url", "https://example.com/{ver}.run", "holds a space, quote, brace or control character"),
    ("sdk_python", "python 3", "sdk_python: 'python 3' is not a command name or absolute path"),
    ("sdk_python", "bin/python3", "sdk_python: 'bin/python3' is not a command name or absolute path"),
    ("pip_indexes", {"vllm": {**VLLM, "glibc": "2.39.1"}}, "pip_indexes.vllm.glibc: '2.39.1' is not a glibc version; allowed: the lowest glibc the index's wheels need, as 'MAJOR.MINOR'"),
    ("pip_indexes", {"vllm": {**VLLM, "glibc": 2.39}}, "pip_indexes.vllm.glibc: expected a string, got 2.39"),
    ("pip_indexes", {"vllm": VLLM, "assets": {**ASSETS, "glibc": "2.39"}}, "pip_indexes.assets.glibc: vllm is owned by the vllm index already, for the same glibc 2.39; allowed: each package in one index at most, or in several that each declare a different glibc"),
    ("pip_indexes", {"vllm": {"url": VLLM["url"], "packages": ["vllm"]}, "assets": ASSETS}, "pip_indexes.assets.packages: vllm is owned by the vllm index already; allowed: each package in one index at most, or in several that each declare a different glibc"),
    ("pip_public_index", "http://mirror.invalid/simple", "pip_public_index: 'http://mirror.invalid/simple' is http on mirror.invalid"),
    ("pip_public_index", "https://u:hunter2@mirror.example/simple", "pip_public_index: credentials do not belong in data"),
    ("creds_index_user_env", "RBLN-USER", "creds_index_user_env: 'RBLN-USER' is not an environment variable name"),
    ("creds_index_password_env", "1PASSWORD", "creds_index_password_env: '1PASSWORD' is not an environment variable name"),
    ("creds_hf_token_env", "HF TOKEN", "creds_hf_token_env: 'HF TOKEN' is not an environment variable name"),
    ("serve_recipe", "", "serve_recipe: '' is not a recipe"),
    ("serve_strategy", "Aggregated", "serve_strategy: 'Aggregated' is not a strategy slug"),
    ("serve_target", "Fast", "serve_target: 'Fast' is not a target; allowed: Latency, Throughput"),
    ("serve_selection", "lmcache", "serve_selection: expected AXIS=VALUE pairs separated by commas, got 'lmcache'"),
    ("serve_selection", "lmcache=cpu,lmcache=off", "serve_selection: 'lmcache=cpu,lmcache=off' sets axis 'lmcache' twice"),
    ("serve_selection", "lmcache=50%", "serve_selection.lmcache: '50%' is not an axis value"),
    ("serve_recommended", "maybe", "serve_recommended: expected true or false, got 'maybe'"),
    ("serve_base_port", 99999, "serve_base_port: 99999 is out of range; allowed: 1-65535"),
    ("serve_base_port", 0, "serve_base_port: 0 is out of range; allowed: 1-65535"),
    ("serve_base_port", "eighty", "serve_base_port: expected a whole number, got 'eighty'"),
    ("serve_host", "my_host", "serve_host: 'my_host' is not an IP address or a host name"),
    ("serve_host", "10.0.0.300", "serve_host: '10.0.0.300' is not an IP address or a host name"),
    ("creds_api_key_env", "API KEY", "creds_api_key_env: 'API KEY' is not an environment variable name"),
    ("creds_router_admin_key_env", "A-KEY", "creds_router_admin_key_env: 'A-KEY' is not an environment variable name"),
    ("serve_shutdown_timeout", 3601, "serve_shutdown_timeout: 3601 is out of range; allowed: 0-3600"),
    ("serve_extra_args", "--max-num-seq 8", "serve_extra_args: --max-num-seq is not a flag of vllm serve (vLLM 0.30.0"),
    ("serve_extra_args", "--port 9000", "serve_extra_args: --port is set by the deploy; allowed: set serve_base_port instead"),
    ("serve_extra_args", "--max-num-seqs eight", "serve_extra_args: --max-num-seqs 'eight' is not an int"),
    ("serve_extra_env", "VLLM_LOGING_LEVEL=DEBUG", "serve_extra_env: VLLM_LOGING_LEVEL is not a variable vLLM 0.30.0"),
    ("serve_extra_env", "HF_HOME=/tmp/hf", "serve_extra_env: HF_HOME is set by the deploy; allowed: set models_hf_home instead"),
    ("serve_files", {"t.jinja": "/nonexistent/t.jinja"}, "serve_files.t.jinja: '/nonexistent/t.jinja' is not a readable regular file on the controller"),
    ("serve_files", {"-t": "/etc/hostname"}, "serve_files: '-t' is an option, not a path"),
    ("serve_files", {"tmpl.jinja": "/etc/shadow"}, "serve_files.tmpl.jinja: '/etc/shadow' is outside serve_files_root '.'; allowed: a readable regular file in serve_files_root (the fleet repository by default), not through a link out of it"),
    ("serve_files_root", "", "serve_files_root: '' is not a controller directory"),
    ("serve_override_args", "max num seqs", "serve_override_args: 'max num seqs' is not a flag or a variable name"),
    ("serve_override_args", "--max-num-seq", "serve_override_args: --max-num-seq is not a flag of vllm serve"),
    ("serve_user", "root", "serve_user: 'root' may not run the servers; allowed: a system user name"),
    ("serve_user", "Serve", "serve_user: 'Serve' is not a system user name"),
    ("serve_root", "/opt", "serve_root: '/opt' is a system directory"),
    ("serve_root", "/opt/servefleet/", "serve_root: '/opt/servefleet/' is not normalised (write '/opt/servefleet')"),
    ("serve_home", "var/lib/servefleet", "serve_home: 'var/lib/servefleet' is not absolute"),
    ("serve_home", "/var/lib", "serve_home: '/var/lib' is a system directory"),
    ("serve_cache_root", "/var/cache/../x", "serve_cache_root: '/var/cache/../x' is not normalised (write '/var/x')"),
    ("serve_cache_root", "/usr/local", "serve_cache_root: '/usr/local' is a system directory"),
    ("serve_prewarm_timeout", 0, "serve_prewarm_timeout: 0 is out of range; allowed: a whole number >= 1"),
    ("serve_health_timeout", -5, "serve_health_timeout: -5 is out of range; allowed: a whole number >= 1"),
    ("serve_health_timeout", "soon", "serve_health_timeout: expected a whole number, got 'soon'"),
    ("serve_hardware", "H200", "serve_hardware: 'H200' is not a GPU id"),
    ("serve_variant", "fp 8", "serve_variant: 'fp 8' is not a variant"),
    ("serve_features", "spec_decoding", "serve_features: expected NAME=MODE pairs separated by commas, got 'spec_decoding'"),
    ("serve_instances", 0, "serve_instances: 0 is out of range; allowed: 1-64, or None"),
    ("serve_load_timeout", 0, "serve_load_timeout: 0 is out of range; allowed: a whole number >= 1"),
    ("serve_prewarm_scope", "fleets", "serve_prewarm_scope: 'fleets' is not a pre-warm scope; allowed: host or fleet"),
    ("serve_prewarm_host", "", "serve_prewarm_host: '' is not an inventory host name"),
    ("serve_prewarm_store", "", "serve_prewarm_store: '' is not a controller directory"),
    ("serve_roles", {"prefil": "p"}, "serve_roles: 'prefil' is not a role; allowed: prefill or decode"),
    ("serve_pd_pairs", 0, "serve_pd_pairs: 0 is out of range; allowed: 1-32"),
    ("serve_group", "Group A", "serve_group: 'Group A' is not a serving group"),
    ("serve_group_rank", 64, "serve_group_rank: 64 is out of range; allowed: 0-63, or None"),
    ("serve_nodes", 1, "serve_nodes: 1 is out of range; allowed: 2-16, or None"),
    ("serve_iface", "eth0 down", "serve_iface: 'eth0 down' is not an interface"),
    ("serve_router", "fleets", "serve_router: 'fleets' is not a router placement; allowed: none, host, fleet"),
    ("serve_router_group", "my group", "serve_router_group: 'my group' is not an inventory group"),
    ("serve_router_port", 70000, "serve_router_port: 70000 is out of range; allowed: 1-65535"),
    ("serve_router_metrics_port", 8080, "serve_router_metrics_port: 8080 is serve_router_port too"),
    ("serve_router_backend_port", 8080, "serve_router_backend_port: 8080 is serve_router_port too"),
    ("serve_router_admin_port", 29000, "serve_router_admin_port: 29000 is serve_router_metrics_port too"),
    ("serve_router_version", "latest", "serve_router_version: 'latest' is not"),
    ("serve_router_user", "servefleet", "serve_router_user: 'servefleet' is serve_user too"),
    ("serve_router_policy", "kv_aware", "serve_router_policy: 'kv_aware' is not a router policy; allowed: round_robin"),
    ("serve_router_health_interval", 0, "serve_router_health_interval: 0 is out of range; allowed: 1-3600"),
    ("serve_router_health_failures", 101, "serve_router_health_failures: 101 is out of range; allowed: 1-100"),
    ("serve_router_health_successes", 0, "serve_router_health_successes: 0 is out of range; allowed: 1-100"),
    ("serve_router_retries", 21, "serve_router_retries: 21 is out of range; allowed: 1-20"),
    ("serve_router_breaker_failures", 0, "serve_router_breaker_failures: 0 is out of range; allowed: 1-1000"),
    ("models_hf_home", "/var/lib/servefleet/hf hub", "models_hf_home: '/var/lib/servefleet/hf hub' holds a character outside [A-Za-z0-9._/-]"),
    ("models_hf_home", "/proc/hf", "models_hf_home: '/proc/hf' is on a virtual file system"),
    ("serve_cache_root", "/etc/systemd/system", "serve_cache_root: '/etc/systemd/system' is not below a directory meant for the serve user's trees; allowed: an absolute, normalised path of [A-Za-z0-9._/-], a directory of its own strictly below /var/lib, /var/cache, /srv, /opt, /home (e.g. /var/lib/servefleet)"),
    ("serve_cache_root", "/etc/systemd", "serve_cache_root: '/etc/systemd' is not below a directory meant for the serve user's trees; allowed: an absolute, normalised path of [A-Za-z0-9._/-], a directory of its own strictly below /var/lib, /var/cache, /srv, /opt, /home (e.g. /var/lib/servefleet)"),
    ("serve_cache_root", "/usr/local/bin", "serve_cache_root: '/usr/local/bin' is not below a directory meant for the serve user's trees; allowed: an absolute, normalised path of [A-Za-z0-9._/-], a directory of its own strictly below /var/lib, /var/cache, /srv, /opt, /home (e.g. /var/lib/servefleet)"),
    ("serve_cache_root", "/etc/sudoers.d", "serve_cache_root: '/etc/sudoers.d' is not below a directory meant for the serve user's trees; allowed: an absolute, normalised path of [A-Za-z0-9._/-], a directory of its own strictly below /var/lib, /var/cache, /srv, /opt, /home (e.g. /var/lib/servefleet)"),
    ("models_hf_home", "/etc/cron.d", "models_hf_home: '/etc/cron.d' is not below a directory meant for the serve user's trees; allowed: an absolute, normalised path of [A-Za-z0-9._/-], a directory of its own strictly below /var/lib, /var/cache, /srv, /opt, /home (e.g. /var/lib/servefleet)"),
    ("serve_home", "/root/.ssh", "serve_home: '/root/.ssh' is not below a directory meant for the serve user's trees; allowed: an absolute, normalised path of [A-Za-z0-9._/-], a directory of its own strictly below /var/lib, /var/cache, /srv, /opt, /home (e.g. /var/lib/servefleet)"),
    ("serve_home", "/etc/ssh", "serve_home: '/etc/ssh' is not below a directory meant for the serve user's trees; allowed: an absolute, normalised path of [A-Za-z0-9._/-], a directory of its own strictly below /var/lib, /var/cache, /srv, /opt, /home (e.g. /var/lib/servefleet)"),
    ("serve_home", "/home", "serve_home: '/home' is a system directory; allowed: an absolute, normalised path of [A-Za-z0-9._/-], a directory of its own strictly below"),
    ("serve_cache_root", "/var/cachex/vllm", "serve_cache_root: '/var/cachex/vllm' is not below a directory meant for the serve user's trees"),
    ("models_store_url", UNTRUSTED + "/models", "models_store_url: 'http://10.9.9.9:8080/models' is http on 10.9.9.9"),
    ("models_store_url", "https://store.example:99999/models", "models_store_url: 'https://store.example:99999/models' has an invalid host or port"),
    ("models_hub_url", UNTRUSTED, "models_hub_url: 'http://10.9.9.9:8080' is http on 10.9.9.9"),
    ("models_lock_timeout", 0, "models_lock_timeout: 0 is out of range; allowed: 1-86400"),
]  # fmt: skip


def misspelled(key: str) -> str:
    """``key`` with its last two letters swapped (``serve_target`` -> ``serve_targte``)."""
    return key[:-2] + key[-1] + key[-2]


MISSPELLED: list[tuple[str, object, str]] = [
    (misspelled(key), "x", f"{misspelled(key)}: unknown data key; did you mean {key}?")
    for key in KEYS
]

BAD_DATA_CASES: list[tuple[str, object, str]] = [
    *((key, value, message) for key, (value, message) in WRONG_TYPE.items()),
    *WRONG_VALUE,
    *MISSPELLED,
]
