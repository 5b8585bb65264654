"""vLLM's ``vllm.entrypoints.cli``: the ``vllm`` command's parser (:mod:`.main`) and its
``serve`` subcommand (:mod:`.serve`). A SIMULATION for the servefleet lab."""
