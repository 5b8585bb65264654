"""arctic_inference.suffix_decoding: a SIMULATION for the servefleet lab."""


class SuffixDecodingCache:
    """Stand-in for the suffix tree cache vLLM's suffix proposer imports lazily."""

    def __init__(self, max_tree_depth: int = 24, max_cached_requests: int = -1) -> None:
        self.max_tree_depth = max_tree_depth
        self.max_cached_requests = max_cached_requests
