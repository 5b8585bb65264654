"""An example CR13 fleet. Hosts in `cr13` get group_data/cr13.py; each site overrides what differs.

pyinfra inventories/prod.py deploys/serve.py
"""

cr13 = [
    "npu-a1.example.internal",
    "npu-a2.example.internal",
    ("npu-b1.example.internal", {"serve_target": "Throughput"}),
]

canary = ["npu-a1.example.internal"]  # roll out here first: pyinfra ... --limit canary
