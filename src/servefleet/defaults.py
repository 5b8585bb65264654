"""servefleet defaults: every setting the deploys read, with its default and a one-line comment.

The deploys get them as ``@deploy(data_defaults=DEFAULTS)``: pyinfra puts every other data over
them. Override a key per group (group_data/<group>.py, group_data/all.py for the whole fleet), per
host (inventory host tuples) or per run (`pyinfra ... --data serve_target=Throughput`). The
README's data table lists these keys; a test keeps the two in step. Secrets are never data: data
names the environment variables that hold them.
"""

# mypy: disable-error-code="var-annotated"

# --- driver: the RBLN kernel driver (KMD), from Rebellions' runfile (RBLN Portal download)
driver_version = "3.5.1"  # wanted driver version, as `rbln-smi -j` reports it (KMD_version)
driver_runfile_url = None  # URL of rebellions-x86_64-{version}.run ({version} is filled in)
driver_sha256 = {}  # driver version -> sha256 of its runfile; a runfile that differs is refused
driver_installer_args = ["--silent"]  # arguments for the runfile: unattended install
driver_apt_packages = ["dkms", "linux-headers-{kernel}"]  # prerequisites; {kernel} = `uname -r`
driver_apt_repo = None  # extra apt source for them: {"src": "deb [signed-by=KEYRING] URL SUITE", "key": local key file}

# --- sdk: the RBLN SDK 0.12.0 stack (rbln.md §0)
sdk_pins = [  # exact pins of every SDK package; only `==` is accepted
    "rebel-compiler==0.12.0",  # compiler and runtime (`import rebel`), private RBLN index
    "vllm-rbln==0.12.0",  # the vLLM platform plugin
    "optimum-rbln==0.12.0",  # required by vllm-rbln
    "torch-rbln==0.12.0",  # required by vllm-rbln (x86_64)
    "lmcache-rbln==0.12.0",  # kv-connectors extra (KV offload), private RBLN index
    "nixl-rbln==0.12.0",  # kv-connectors extra, private RBLN index
    "vllm==0.30.0+cpu",  # pinned by vllm-rbln, vLLM CPU wheels index
    "torch==2.13.0+cpu",  # pinned by optimum-rbln and torch-rbln, torch CPU index
    "torchvision==0.28.0+cpu",  # pinned by optimum-rbln, torch CPU index
    "torchaudio==2.11.0+cpu",  # pinned by optimum-rbln, torch CPU index
    "torchcodec==0.16.0+cpu",  # pinned by optimum-rbln, torch CPU index
    "transformers==5.15.1",  # pinned by optimum-rbln
    "arctic-inference==0.1.1",  # suffix decoding only; an sdist, built once on the controller
]
sdk_extra_packages = {  # vllm-rbln extra -> what it brings (installed only when the selection needs it)
    "kv-connectors": ["lmcache-rbln", "nixl-rbln"],
}
sdk_python = "python3"  # interpreter the release venvs are made with
sdk_installer = "uv"  # uv (its binary shipped from the controller) or pip (where uv cannot run)
sdk_lock = None  # lock directory `servefleet lock` writes (locks/prod); None = unlocked releases
sdk_lock_python = ">=3.10"  # Python versions a lock resolves for (the hosts' sdk_python among them)
sdk_wheel_cache = "~/.cache/servefleet/wheels"  # wheels built once from sdists; hosts never build
sdk_source = "index"  # index: hosts fetch packages, models, driver themselves; wheelhouse: copied from sdk_wheelhouse (needs sdk_lock)
sdk_wheelhouse = None  # controller directory `servefleet wheelhouse DIR` filled from the lock (sdk_source = "wheelhouse")

# --- pip: where packages come from
pip_indexes = {  # index -> url, the packages it owns, the glibc its wheels need; each package comes only from its owner
    "rbln": {  # private RBLN index: needs the RBLN Portal credentials (creds_index_*)
        "url": "https://pypi.rbln.ai/simple",
        "packages": ["rebel-compiler", "lmcache-rbln", "nixl-rbln"],
        "auth": True,
    },
    # vLLM CPU wheels: manylinux_2_39 only. For hosts with an older glibc (Ubuntu 22.04: 2.35,
    # EL9: 2.34) add a second owner of vllm that serves a wheel for it, with its own "glibc"
    # (RBLN's workaround: vllm-rbln's release assets); each host takes the one that fits.
    "vllm": {"url": "https://wheels.vllm.ai/0.30.0/cpu", "packages": ["vllm"], "glibc": "2.39"},
    "torch": {  # torch CPU wheels: torch and its companions
        "url": "https://download.pytorch.org/whl/cpu",
        "packages": ["torch", "torchvision", "torchaudio", "torchcodec"],
    },
}
pip_public_index = None  # index for every other package; None = the host's own pip configuration
pip_trusted_hosts = []  # hosts reached over plain http (pip, driver runfile, model store): the lab's servers

# --- creds: names of the controller's environment variables holding secrets (never the values)
creds_index_user_env = "RBLN_INDEX_USER"  # user name for indexes with "auth": True
creds_index_password_env = "RBLN_INDEX_PASSWORD"  # password for indexes with "auth": True
creds_hf_token_env = "HF_TOKEN"  # Hugging Face token for gated models (optional)

# --- serve: what to serve, and where it lives on the host
serve_recipe = "rbln/gpt-oss-120b"  # recipe name under recipes/ or a path to a recipe file
serve_strategy = None  # strategy slug; None = the recipe's first
serve_target = "Latency"  # Latency or Throughput
serve_selection = {}  # axis -> value, over the defaults (like `servefleet resolve --set`)
serve_recommended = False  # start from the recipe's recommended selection instead of its base
serve_base_port = 8000  # instance i listens on serve_base_port + i
serve_host = None  # address for `--host`; None = vLLM's default (all addresses)
serve_user = "servefleet"  # system user the servers run as
serve_root = "/opt/servefleet"  # releases/<id> (one venv each), current -> the serving release
serve_home = "/var/lib/servefleet"  # HOME of serve_user
serve_cache_root = "/var/cache/servefleet/vllm"  # VLLM_CACHE_ROOT, shared by every release
serve_prewarm_timeout = 14400  # seconds a cold first start (it compiles) may take to get healthy
serve_health_timeout = 300  # seconds a warm (re)start may take to answer /health and a chat
serve_hardware = None  # vLLM recipes: the hosts' GPU id (h200, mi300x, ...); None = the default
serve_variant = None  # vLLM recipes: variant (default, fp8, ...); None = the recipe's choice
serve_features = {}  # vLLM recipes: feature -> on, off or a mode (opt-in features are off unless named)
serve_instances = None  # servers per host; None = RBLN: as many as the NPUs hold, GPU: one
serve_load_timeout = 1800  # GPU: seconds a start may take to load the model and capture CUDA graphs
serve_prewarm_scope = "host"  # host: each host compiles; fleet: one compiles, the rest copy it
serve_prewarm_host = None  # fleet scope: a host without NPUs that compiles (compile only) instead
serve_prewarm_store = "~/.cache/servefleet/prewarm"  # fleet scope: the copies, on the controller

# --- models: weights fetched before serving; servers run with HF_HUB_OFFLINE=1
models_hf_home = "/var/lib/servefleet/hf"  # HF_HOME of the servers (models in $HF_HOME/hub)
models_store_url = None  # None = the Hugging Face hub; else a store serving <org>/<name>.tar.gz
models_revisions = {}  # model id -> 40-hex commit it is pinned to; none = the hub's main / the store's manifest
models_sha256 = {}  # model id -> sha256 of its store archive; none = the store's manifest

# Every key above, in its order (a key is a name with one of these prefixes, one per area)
PREFIXES = ("driver_", "sdk_", "pip_", "creds_", "serve_", "models_")
DEFAULTS = {key: value for key, value in dict(globals()).items() if key.startswith(PREFIXES)}
