"""vLLM's ``vllm.utils.argparse_utils``: the parser class and the human-readable integers, from
the simulator's one flag table (:mod:`vllm.flag_table`). A SIMULATION for the servefleet lab."""

from ..flag_table import FlexibleArgumentParser, human_readable_int, human_readable_int_or_auto

__all__ = ["FlexibleArgumentParser", "human_readable_int", "human_readable_int_or_auto"]
