"""The RBLN kind's data defaults (:data:`DEFAULTS`): its driver, the RBLN SDK 0.12.0 stack and the
indexes that own its packages (rbln.md §0), the variables its private index's credentials are
read from, and the default recipe (this kind is the default one). A host whose data names an RBLN
recipe, or none, takes these for every key its data does not set; the key table
(:mod:`servefleet.settings.table`) holds none of them."""

# mypy: disable-error-code="var-annotated"

from typing import Any

SDK_PINS = [  # exact pins of every SDK package; only `==` is accepted
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
SDK_EXTRA_PACKAGES = {  # vllm-rbln extra -> what it brings (installed only when the selection needs it)
    "kv-connectors": ["lmcache-rbln", "nixl-rbln"],
}
PIP_INDEXES = {  # index -> url, the packages it owns, the glibc its wheels need
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


DEFAULTS: dict[str, Any] = {  # data key -> this kind's default
    "driver_version": "3.5.1",  # the RBLN driver (KMD) of the SDK 0.12.0, as `rbln-smi -j` reports it
    "driver_installer_args": ["--silent"],  # Rebellions' runfile: an unattended install
    "driver_apt_packages": ["dkms", "linux-headers-{kernel}"],  # what the runfile builds with
    "sdk_pins": SDK_PINS,
    "sdk_extra_packages": SDK_EXTRA_PACKAGES,
    "pip_indexes": PIP_INDEXES,
    "creds_index_user_env": "RBLN_INDEX_USER",  # the RBLN Portal user (the private index)
    "creds_index_password_env": "RBLN_INDEX_PASSWORD",  # and its password
    "serve_recipe": "rbln/gpt-oss-120b",  # the default recipe
}


def default_compiler_version() -> str:
    """The rebel-compiler version the default data pins."""
    return next(p.split("==", 1)[1] for p in SDK_PINS if p.startswith("rebel-compiler=="))
