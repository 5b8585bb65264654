"""Back to each host's last good state (used by `servefleet rollout` for failed hosts)."""

try:
    from servefleet.entry.deploys import host_settings, rollback
except ModuleNotFoundError as e:  # a pyinfra whose Python has no servefleet
    raise SystemExit(
        f"{__file__}: {e}; run the pyinfra installed with servefleet "
        "(uv tool install --with-executables-from pyinfra servefleet-VERSION-py3-none-any.whl)"
    ) from None

rollback(settings=host_settings(), to="good")
