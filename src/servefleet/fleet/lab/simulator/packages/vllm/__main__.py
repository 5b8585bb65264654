"""``python -m vllm``: the simulated CLI (a SIMULATION for the servefleet lab)."""

import sys

from vllm.sim import main

sys.exit(main())
