"""Hosts with 8 NVIDIA H200 GPUs, serving vLLM's own recipe for gpt-oss-120b (upstream vLLM,
CUDA build). The NVIDIA driver is the hosts' own: a deploy checks it and the GPUs, and refuses
a host whose GPUs are not H200s or have too little memory for the variant. The release (upstream
vllm and torch from the public index) is the vLLM kind's default (kinds/vllm/defaults.py)."""

serve_recipe = "vllm/openai/gpt-oss-120b"  # vLLM's recipe (strategies, variants, features)
serve_hardware = "h200"  # the recipe's GPU id: its overrides and parallel size for H200
serve_features = {}  # e.g. {"spec_decoding": "on"} for EAGLE-3 (opt-in; fetches the draft model)
pip_indexes = {}  # nothing is owned by a private index (over group data that names some, as the lab's)
