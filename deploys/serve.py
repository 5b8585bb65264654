"""Fresh hosts to warm, health-checked `vllm serve` instances; a re-run changes nothing.

pyinfra inventories/lab.py deploys/serve.py
"""

try:
    from servefleet.entry.deploys import host_plan, serve
except ModuleNotFoundError as e:  # a pyinfra whose Python has no servefleet
    raise SystemExit(
        f"{__file__}: {e}; run the pyinfra installed with servefleet "
        "(uv tool install --with-executables-from pyinfra servefleet-VERSION-py3-none-any.whl)"
    ) from None

serve(plan=host_plan())
