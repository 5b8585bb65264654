"""The vLLM kind's data defaults, over the key table's (GPU hosts): upstream vLLM and its torch
from the public index, no vllm-rbln extras, no index owning a package. A host whose data names a
vLLM recipe takes these for every key its data does not set."""

# upstream vLLM (CUDA build), its torch, and NIXL (for a prefill/decode selection's NixlConnector)
SDK_PINS = ["vllm==0.30.0", "torch==2.13.0", "nixl==1.5.1"]
SDK_EXTRA_PACKAGES: dict[str, list[str]] = {}  # no vllm-rbln extras on GPU hosts
PIP_INDEXES: dict[str, dict[str, object]] = {}  # nothing is owned by a private index

DEFAULTS = {
    "sdk_pins": SDK_PINS,
    "sdk_extra_packages": SDK_EXTRA_PACKAGES,
    "pip_indexes": PIP_INDEXES,
}
