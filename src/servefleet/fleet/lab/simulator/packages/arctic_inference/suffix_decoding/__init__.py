"""arctic_inference.suffix_decoding: a SIMULATION for the servefleet lab.

Its ``_C`` is a real C++20 extension, compiled when the sdist is built (as the real one)."""

from arctic_inference.suffix_decoding import _C


class SuffixDecodingCache:
    """Stand-in for the suffix tree cache vLLM's suffix proposer imports lazily."""

    def __init__(
        self, max_tree_depth: int = _C.max_tree_depth(), max_cached_requests: int = -1
    ) -> None:
        self.max_tree_depth = max_tree_depth
        self.max_cached_requests = max_cached_requests
