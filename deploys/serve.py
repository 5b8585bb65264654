"""Fresh hosts to warm, health-checked `vllm serve` instances; a re-run changes nothing.

pyinfra inventories/lab.py deploys/serve.py
"""

from servefleet.deploys import host_plan, serve

serve(plan=host_plan())
